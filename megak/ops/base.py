"""The op contract: everything one op is, declared in one place, ``megak/ops/<op>.py``.

Each op module holds one ``OpDef`` subclass instance, ``OP``, and the registry
(``megak/ops/__init__.py``) lists them. Nothing else in megak names an op: the graph, the
scheduler, the simulator, the page plans and the test references loop over the registry::

    who calls         contract member      what it declares
    ---------------   ------------------   ------------------------------------------------
    megak.Graph       build                the Graph method: checks, output shape and dtype
    scheduler         fuse                 optional: fold this op into its producer's epilogue
                      expand               a graph op -> lowering units (default: itself)
                      count                instructions `lower` will make (size cap, cheap)
                      lower                a unit -> records (regions, reads, cost)
                      early_operand        the input the loader may fetch before the waits
                      flag_io              reads and writes flagged tensors (device/flag.cuh)
    runtime           bodies               the device bodies its records run (the build)
    sim, page_plan    page_plan            the pages the loader fills, phases, releases
    sim               check_record         record-only limits; simulate: run one record
                      reads                flag_io ops: the regions simulate will read
    tests             reference            float64 value and an elementwise error bound
    device (instr.h)  opcode, pages,       MK_OP_<NAME>, MK_<NAME>_PAGES,
                      operand_mask         MK_<NAME>_OPERANDS

The device side of the same op is ``megak/device/ops/<op>.cuh`` (mk_<op>_check,
mk_<op>_check_operands, mk_<op>_run, optionally mk_<op>_preload_stages / mk_<op>_preload) and
one line of MK_FOR_EACH_OP in megakernel.cu. tests/test_op_contract.py checks that the
registry, instr.h's opcodes and masks, and that dispatch list agree.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .. import abi
from ..pages import DEFAULT_PAGES


@dataclass(frozen=True)
class PagePlan:
    """Which of its pages an instruction's loader fills, and when its compute role gives
    them back; positions 0 .. rec["pages"]-1 of the instruction's own page table
    (acquisition order), never physical page numbers (megak/page_plan.py has the rules).

    preload_early: pages the loader writes BEFORE the dependency wait (operands with no
        producer only: MK_FLAG_B_READY);
    preload_late: pages it writes after the wait, before it marks the slot ready;
    phases: the op's compute phases in order, each (pages used, pages released after it);
    early_reads: operand regions the early preloads read, (operand position, r0, r1, c0, c1):
        they must be complete before the wait (the simulator checks it).
    """
    preload_early: tuple[int, ...] = ()
    preload_late: tuple[int, ...] = ()
    phases: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (((), ()),)
    early_reads: tuple[tuple[int, int, int, int, int], ...] = ()


# ops that stream through registers: one phase touching no page; the final release frees
# whatever the record asked for
NO_PAGES = PagePlan()


@dataclass(frozen=True, eq=False)
class Hidden:
    """A tensor the lowering adds (split-K partials): a slot after the graph's tensors."""
    index: int
    shape: tuple[int, int]
    dtype: str
    name: str
    producer: int = -1   # never None: it is always written by a unit

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[1]


@dataclass(frozen=True, eq=False)
class Unit:
    """What one lowering produces instructions for: a graph op, a part of one, or several
    graph ops fused into one. ``index`` is set by the scheduler once all units are known."""
    kind: str
    inputs: tuple
    output: object
    attrs: dict
    label: str
    index: int = -1

    @classmethod
    def of(cls, op) -> "Unit":
        return cls(op.kind, tuple(op.inputs), op.output, dict(op.attrs), op.label)

    def with_(self, **changes) -> "Unit":
        return replace(self, **changes)


@dataclass
class ExpandContext:
    """What `expand` may use: the SM count and pages per SM it lowers for, whether weights
    may stream (compile's weight_stream), how many live graph ops read each tensor (by
    index), and new hidden tensors."""
    n_sm: int
    first_hidden: int
    hidden: list[Hidden] = field(default_factory=list)
    n_pages: int = DEFAULT_PAGES
    weight_stream: bool = True
    readers: dict[int, int] = field(default_factory=dict)

    def new_tensor(self, shape: tuple[int, int], dtype: str, name: str) -> Hidden:
        t = Hidden(self.first_hidden + len(self.hidden), tuple(int(s) for s in shape), dtype,
                   name)
        self.hidden.append(t)
        return t


class OpDef:
    """One op's contract; subclasses override what differs from the defaults below."""

    name: str = ""                 # graph kind, Graph method, and instr.h MK_OP_<NAME>
    internal: bool = False         # made by another op's expand only: no Graph method
    operands: tuple[int, ...] = ()  # mk_instr.tensor[] position of each unit input, in order
    early_operand: int | None = None  # input the loader may fetch before the waits (when it
                                      # has no producer): the record gets MK_FLAG_B_READY
    flag_io: bool = False          # its device op reads and writes any fp32 operand in the
                                   # flagged form (MK_DTYPE_F32_FLAG, device/flag.cuh): the
                                   # scheduler may give such tensors that form when the
                                   # producer and every reader have it; then `reads` is needed

    # -- from instr.h, never restated ---------------------------------------------------------
    @property
    def opcode(self) -> int:
        return abi.OPCODES[f"MK_OP_{self.name.upper()}"]

    @property
    def pages(self) -> int:
        return abi.OP_SHAPES[f"MK_{self.name.upper()}_PAGES"]

    @property
    def operand_mask(self) -> int:
        """Operand positions the device prefetches and validates for this opcode."""
        return abi.OPERAND_MASKS[f"MK_{self.name.upper()}_OPERANDS"]

    # -- graph ----------------------------------------------------------------------------------
    # `build` is the Graph method itself (self is the Graph): a module-level function assigned
    # as a staticmethod, so help(megak.Graph) shows its signature and docstring.
    build = None

    # -- scheduler ------------------------------------------------------------------------------
    def fuse(self, op, producer: Unit, position: int) -> Unit | None:
        """Fold graph op `op` into `producer`, the unit writing op.inputs[position], which
        nothing else reads: return the producer unit rewritten to write op.output, or None."""
        return None

    def expand(self, unit: Unit, ctx: ExpandContext) -> list[Unit]:
        """The units `unit` is lowered as (split-K partials + a reduce, bands, ...)."""
        return [unit]

    def count(self, unit: Unit) -> int:
        """How many instructions lower(unit) makes, without making them."""
        raise NotImplementedError(self.name)

    def lower(self, unit: Unit):
        """unit -> megak.ops._lowering.Lowered."""
        raise NotImplementedError(self.name)

    # -- runtime --------------------------------------------------------------------------------
    def bodies(self, recs: np.ndarray) -> int:
        """The MK_BODIES bits (instr.h, enum mk_bodies) the kernel needs to run `recs`, this
        op's records (a non-empty array): its opcode's bit, and the paths an op with several
        device bodies takes."""
        return 1 << self.opcode

    # -- pages, simulator -----------------------------------------------------------------------
    def page_plan(self, rec, dtype_a: str) -> PagePlan:
        """The page plan of one decoded record; dtype_a names tensor[MK_ARG_A]'s dtype."""
        return NO_PAGES

    def check_record(self, rec) -> bool:
        """Record-only limits beyond the operand slots (the device's mk_<op>_check)."""
        return True

    def min_pages(self, rec) -> int:
        """The fewest pages a record of this op may ask for (the device's mk_validate)."""
        return self.pages

    def simulate(self, rec, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
        """Execute one record on numpy tensors as the device does; return the regions read,
        (operand position, r0, r1, c0, c1) each."""
        raise NotImplementedError(self.name)

    def reads(self, rec, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
        """The regions `simulate` will read, (operand position, r0, r1, c0, c1) each, known
        before it runs: the simulator polls flagged words there first (flag_io ops)."""
        raise NotImplementedError(self.name)

    def written(self, rec) -> tuple[int, int, int, int]:
        """The output region one record writes, (r0, r1, c0, c1)."""
        r0, c0 = int(rec["out_row0"]), int(rec["col0"])
        return r0, r0 + int(rec["rows"]), c0, c0 + int(rec["cols"])

    # -- tests ----------------------------------------------------------------------------------
    def reference(self, op, args: list[tuple[np.ndarray, np.ndarray]]):
        """float64 (value, bound) of graph op `op` from its inputs' (value, bound) pairs:
        bound is an elementwise limit on |megak's result - value|."""
        raise NotImplementedError(self.name)

    def __repr__(self) -> str:
        return f"<op {self.name} (opcode {self.opcode})>"


def region(rec) -> tuple[int, int, int, int]:
    """(row0, col0, rows, cols) of a decoded record, as ints."""
    return int(rec["row0"]), int(rec["col0"]), int(rec["rows"]), int(rec["cols"])


def f32_param(rec) -> np.float32:
    """The record's fp32 scalar (softmax scale, norm epsilon), from its bits."""
    return np.array([int(rec["param"])], dtype=np.uint32).view(np.float32)[0]


def param_bits(value: float) -> int:
    """An fp32 scalar as the u32 bits the record's `param` field carries."""
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])
