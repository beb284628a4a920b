"""The user's graph: tensors, ops and validation. Nothing here knows about tiles or SMs, and
nothing here names an op: each op's Graph method (``g.gemm``, ``g.add``, ...) is its
``build`` in megak/ops/<op>.py, installed on Graph by the op registry."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dtypes import SUPPORTED as SUPPORTED_DTYPES
from .dtypes import name_of
from .errors import GraphError
from .reserved import RESERVED_NAMES


@dataclass(frozen=True, eq=False)
class Tensor:
    """A handle to a tensor of one graph: a graph input or the result of an op.

    Tensors are 2-D, or 1-D (n,) for vectors such as a GEMM bias, held as one row (1, n)."""
    graph: "Graph" = field(repr=False)
    index: int
    shape: tuple[int, ...]
    dtype: str
    producer: int | None  # op index, None for graph inputs
    name: str | None = None

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def __repr__(self) -> str:
        if self.producer is not None:
            origin = f"op #{self.producer}"
        elif self.index in self.graph.constant_values:
            origin = f"constant {self.name!r}"
        else:
            origin = f"input {self.name!r}"
        return f"Tensor(t{self.index}, shape={self.shape}, dtype={self.dtype}, {origin})"


@dataclass(frozen=True, eq=False)
class Op:
    index: int
    kind: str
    inputs: tuple[Tensor, ...]
    output: Tensor
    attrs: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        args = ", ".join(f"t{t.index}" for t in self.inputs)
        return f"{self.kind} #{self.index} ({args} -> t{self.output.index})"


class Graph:
    """A graph of tensor operations, run as one megakernel by :func:`megak.compile`.

    >>> g = Graph()
    >>> a = g.input("a", (64, 32), "float32"); b = g.input("b", (32, 16), "float32")
    >>> g.output(g.transpose(g.gemm(a, b)), "y")

    ``inputs``, ``constants`` and ``outputs`` map names to tensors; ``ops`` lists the ops in
    the order they were added (a topological order).
    """

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.inputs: dict[str, Tensor] = {}
        self.constants: dict[str, Tensor] = {}
        self.constant_values: dict[int, np.ndarray] = {}   # tensor index -> its host copy
        self.outputs: dict[str, Tensor] = {}

    # -- building ---------------------------------------------------------------------------
    def input(self, name: str, shape, dtype: str = "float32") -> Tensor:
        """A graph input: ``name`` becomes a keyword of ``run()`` (so not one of run()'s own:
        out, trace, stream, self); ``shape`` 2-D ``(rows, cols)`` or 1-D ``(n,)`` (a vector,
        such as a bias, held as one row); ``dtype`` "float32" (the default) or "bfloat16"."""
        self._check_name(name, "input")
        shape = _check_shape(shape, f"input {name!r}")
        dtype = check_dtype(dtype, f"input {name!r}")
        t = self._new_tensor(shape, dtype, None, name)
        self.inputs[name] = t
        return t

    def constant(self, name: str, value) -> Tensor:
        """A tensor whose value is part of the graph (weights): ``value`` is copied now (a
        numpy array, a torch or cupy tensor, on the host or the GPU; 2-D, or 1-D held as one
        row; float32 or bfloat16, its dtype kept: megak never casts), and every run of the
        compiled program reads that copy: it is not a keyword of ``run()``, and changing
        ``value`` afterwards changes nothing (compile the graph again, or use an input).
        On the GPU a constant that is the B of streamed GEMMs (bf16, batch <= 32) is also
        kept in the weight stream's page order, one bulk copy per page (README "Constant
        weights"): twice its bytes of GPU memory."""
        self._check_name(name, "constant")
        host = _host_copy(value, f"constant {name!r}")
        shape = _check_shape(host.shape, f"constant {name!r}")
        dtype = check_dtype(host.dtype, f"constant {name!r}")
        t = self._new_tensor(shape, dtype, None, name)
        self.constants[name] = t
        self.constant_values[t.index] = host.reshape(t.rows, t.cols)
        return t

    def output(self, x: Tensor, name: str) -> Tensor:
        """Declare ``x`` an output: ``run()`` returns it under ``name``. Ops no output depends
        on are not run (``prog.stats["dropped_ops"]`` lists them)."""
        self.check_operand(x, "output", "x")
        self._check_name(name, "output")
        if x.index in self.constant_values:
            raise GraphError(f"output {name!r}: {x!r} is a constant, whose value the caller "
                             f"already has; an output is computed by an op")
        self.outputs[name] = x
        return x

    # -- helpers ----------------------------------------------------------------------------
    def _new_tensor(self, shape, dtype, producer, name=None) -> Tensor:
        t = Tensor(self, len(self.tensors), shape, dtype, producer, name)
        self.tensors.append(t)
        return t

    def append_op(self, kind: str, inputs: tuple[Tensor, ...], shape, dtype, **attrs) -> Tensor:
        """Append an op (called by the ops' build methods, after their checks)."""
        index = len(self.ops)
        out = self._new_tensor(tuple(int(s) for s in shape), dtype, index)
        self.ops.append(Op(index, kind, inputs, out, attrs))
        return out

    def check_operand(self, t, op: str, arg: str) -> None:
        """``t`` is a Tensor of this graph (every op's build checks each operand)."""
        if not isinstance(t, Tensor):
            raise GraphError(f"{op}: {arg} must be a megak Tensor of this graph, "
                             f"got {type(t).__name__}")
        if t.graph is not self:
            raise GraphError(f"{op}: {arg} ({t!r}) belongs to another Graph")

    def _check_name(self, name, what: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"{what} name must be a Python identifier (it becomes a keyword "
                             f"of run()), got {name!r}")
        if name in self.inputs or name in self.outputs or name in self.constants:
            raise GraphError(f"duplicate name {name!r}: input, constant and output names must "
                             f"be unique")
        if what == "input" and name in RESERVED_NAMES:
            raise GraphError(f"input name {name!r} is reserved for run()'s own keywords "
                             f"({', '.join(sorted(RESERVED_NAMES))}): choose another")

    def validate(self) -> None:
        """Whole-graph checks made by compile()."""
        if not self.outputs:
            raise GraphError("the graph declares no outputs: call g.output(tensor, name)")


def check_float32_only(x: Tensor, op: str) -> None:
    """For ops whose device code moves 4-byte elements only."""
    if x.dtype != "float32":
        raise GraphError(f"{op}: dtype {x.dtype!r} is not supported by {op} yet; allowed: "
                         f"float32")


def check_2d(x: Tensor, op: str, arg: str) -> None:
    if len(x.shape) != 2:
        raise GraphError(f"{op}: {arg} must be 2-D, got shape {x.shape}")


def check_row_vector(v: Tensor, n: int, op: str, arg: str) -> None:
    """``v`` is (n,) or (1, n): one value per column, broadcast over rows."""
    if v.shape not in ((n,), (1, n)):
        raise GraphError(f"{op}: {arg} must have shape ({n},) or (1, {n}), got {v.shape}")


def check_positive_number(value, op: str, arg: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value == float("inf"):
        raise GraphError(f"{op}: {arg} must be a positive finite number, got {value!r}")
    return float(value)


def _check_shape(shape, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise GraphError(f"{what}: shape must be a tuple of 1 or 2 positive ints, "
                         f"got {shape!r}") from None
    if len(dims) not in (1, 2):
        raise GraphError(f"{what}: megak tensors are 2-D (or 1-D vectors), got shape {dims!r}")
    out = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise GraphError(f"{what}: shape must hold ints, got {dims!r}")
        d = int(d)
        if d <= 0:
            raise GraphError(f"{what}: dimensions must be positive (no empty tensors), "
                             f"got {dims!r}")
        if d >= 2**31:
            raise GraphError(f"{what}: dimension {d} does not fit the 32-bit tile coordinates")
        out.append(d)
    return tuple(out)


def _host_copy(value, what: str) -> np.ndarray:
    """A contiguous numpy copy of an array megak accepts as data (numpy, or a torch / cupy
    tensor wherever it lives)."""
    from . import interop
    try:
        desc = interop.describe(value)
        if isinstance(desc, interop.DeviceArray):
            desc = interop.to_host(desc)
    except GraphError as exc:
        raise GraphError(f"{what}: {exc}") from None
    return np.array(desc, copy=True, order="C")


def check_dtype(dtype, what: str) -> str:
    name = name_of(dtype)
    if name not in SUPPORTED_DTYPES:
        raise GraphError(f"{what}: dtype {name!r} is not supported; allowed: "
                         f"{', '.join(SUPPORTED_DTYPES)}")
    return name


from . import ops as _ops  # noqa: E402,F401  (installs each op's Graph method)
