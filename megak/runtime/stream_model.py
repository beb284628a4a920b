"""The weight stream's two synchronisation protocols, stated in Python and run through
interleavings: the ring of pages inside one block (megak/device/stream.cuh: mk_streamer in
megakernel.cu, the loader's stream positions, the streamed GEMM of ops/gemm_stream.cuh) and
the cross-SM combine of a column band whose k range is split into parts.

As in resident_model.py, each actor is a generator whose every step is one shared-memory
action (a read, a write, an mbarrier operation, an atomic), and a scheduler interleaves the
steps of all actors.

The weight ring (RingModel), one block, invocations one after another (the resident kernel
serves many requests; each invocation has its own queue and ring size R = stream_pages):

  mbarrier  a phase completes when its expected arrivals have arrived and its expected
            transaction bytes have completed; `phase` counts completed phases. try_wait with
            parity P succeeds iff the current (incomplete) phase's parity differs from P,
            i.e. the phase of parity P is the one that completed last (a fresh barrier reads
            as if a phase of parity 1 had just completed).
  slots     R pages; slot i has full[i] (1 arrival: the streamer's arrive.expect_tx, plus the
            copy's bytes) and empty[i] (READERS = 2 arrivals: each of a stage's two readers
            arrives once, a stage's only reader arrives with a count of 2).
  stages    the streamed instructions of the queue in order (the predicate: MK_FLAG_STREAM in
            the record and ready[B] in the table), each with `stages` boxes; position pos
            counts them from 0 in each invocation; stage pos lives in slot pos % R.
  streamer  for each stage: if pos >= R, wait empty[slot] with parity (pos // R - 1) & 1,
            polling ring_stop between tries (set: stop issuing); issued[slot] = pos;
            arrive.expect_tx(full[slot], page bytes); issue the copy. Then, before leaving,
            wait until every copy it issued has landed: the full phases of the last
            min(pos, R) stages, parity (p // R) & 1.
  copy      lands at a later step of its own: writes the page (stage data: invocation,
            instruction, stage), then completes its bytes on full[slot].
  warp w    8 of them; runs the queue in order; stage k of a streamed instruction whose
            record has `readers` r (1 or 2: its m16 tiles) is read by the r warps
            k % (8 / r) + j 8 / r (the GEMM's warps take an instruction's stages in turn, r
            warps to a stage, each its share of the stage's k-rows): for each of its own,
            wait until issued[slot] == pos, then full[slot] with parity (pos // R) & 1,
            polling ring_stop between tries (set: leave); read the page; arrive on
            empty[slot] with a count of READERS / r; the others' it passes by (pos still
            counts them). With `lanes` L > 1 (the build with the packed stream, whose 32
            lanes each hand the page back: stream.cuh, MK_RING_LANE_ARRIVALS) each of the
            warp's L lanes reads its share of the page and then arrives itself, and empty[i]
            expects READERS x L arrivals; with L = 1 the warp's read is one step and its
            lane 0 arrives for it (the build without it: __syncwarp, then lane 0). The
            issued word is what makes the parity wait exact: a parity tells apart two phases
            only, and the warp has not read pos - R itself. Injected failures, at the start
            of an instruction: one warp sets ring_stop and leaves, or the whole compute role
            stops there (every warp leaves, warp 0's thread 0 sets ring_stop), as when the
            loader reports an error for the instruction.
  hold      (stream.cuh, "The hold") a record with `hold` (every streamed one): once every warp is
            done with its stages (the op's barrier), thread 0 raises stream_hold; after the
            instruction's signal fence it lowers it. The streamer, after its empty wait and
            before each copy, polls the word while it is raised, at most HOLD_POLLS times
            (the device's MK_STREAM_HOLD_NS) and not past ring_stop. A failure of the whole
            role injected at a holding instruction stops in its tail, with the hold raised
            (the device's op that gives up after its k loop).
  block     thread 0: before each invocation, once every role of the previous one has
            passed the join barrier, invalidates the ring barriers the previous set-up
            initialised, initialises this invocation's R pairs, sets every issued word to
            "none" and clears ring_stop. The copy engine is not a role that meets there,
            hence the streamer's drain.

The cross-SM combine (CombineModel), runs of one program, counters never reset between
successful runs:

  part p    of band b, one per SM, parts = bands[b]: writes its fp32 partial to scratch[b][p],
            fence (release), atomic add on the band's combine counter returning old; it is
            the last iff old + 1 == (epoch + 1) * parts (u32). The last: fence (acquire),
            sums scratch[0] + scratch[1] + ... in the fixed order p = 0 .. parts - 1 (its own
            partial from its own register copy, the same bits), applies the epilogue, writes
            the output. Every part then adds 1 to the band's op counter.
  reader    the output's consumer: waits until the op counter reaches (epoch + 1) * parts
            (the device's signed u32 test), then reads the output; a run that failed raises
            abort, and a reader polling abort between tries leaves.
  finish    after every block of the run has left: a failed run zeroes every counter and
            restarts at epoch 0; a good one moves to epoch + 1, zeroing the counters first
            where the next epoch's targets, (epoch + 2) * max_target, would pass the wrap
            limit (2^31 on the device, the signed wait test's range).

Beside the shared memory the models keep what they know to be true (`RingTruth`,
`CombineTruth`) and check every actor's reads against it. The rules, numbered as
`ProtocolViolation.rule` reports them:

  1  a warp reads exactly the stage it expects: no stale page (not yet landed, or another
     invocation's), no page overwritten before it read it;
  2  the streamer never issues into a slot whose previous stage one of its readers has yet
     to read;
  3  no copy lands after its block has left the invocation, or on barriers initialised again
     since it was issued;
  4  no deadlock (a state where no actor can move and not all are done) and no hang, for any
     R, with or without a warp failing;
  5  the streamer and every warp agree on the stage sequence: what the streamer issues at pos
     is the stage its warp takes from pos, and with no failure all of it is issued and each
     stage read by its warp;
  6  each band has exactly one last part per run in which all its parts added (none where
     some did not);
  7  the last reads every other partial of this run: never a previous run's, never one not
     yet written;
  8  the output is bitwise the fixed-order sum (with the epilogue), whatever the interleaving;
  9  a reader that sees every part's signal reads this run's final output;
 10  the hold is raised only once every stage of its instruction was read (it never holds
     back a copy that the instruction itself still waits for).

Misuse switches (RingModel / CombineModel keywords), each changing one step, so that the
tests can show the checks catch it:
  RingModel
    skip_empty_wait          the streamer issues without waiting on empty;
    arrive_before_read       a warp arrives on empty, then reads the page;
    full_parity_off_by_one   the warps wait full with parity (pos // R + 1) & 1;
    empty_parity_off_by_one  the streamer waits empty with parity (pos // R) & 1;
    no_reinit                the ring barriers are initialised once, never again (harmless
                             only while every invocation runs to its end with the same R
                             and a multiple of 2 R stages: then every barrier ends at an
                             even phase, with no arrival pending);
    no_drain                 the streamer leaves with copies in flight;
    streamer_ignores_ready   the streamer's predicate is MK_FLAG_STREAM alone (the loader's
                             also asks the table's ready[B]);
    silent_failure           a failure leaves without setting ring_stop;
    empty_count_per_warp     empty[i] expects one arrival per warp (8), as if every warp read
                             every stage, while only the stage's readers arrive;
    reader_arrives_for_all   each reader of a two-reader stage arrives with the count of a
                             stage's only reader (2), as if it read the page alone;
    lane_count_for_warp      with lanes > 1, empty[i] expects READERS arrivals (one a warp,
                             as in the build where lane 0 hands the page back) while every
                             lane arrives;
    no_issued_word           the warps wait on full's parity alone, as when every warp read
                             every stage;
    hold_at_entry            the hold is raised as the instruction starts, before its stages
                             are read;
    hold_unbounded           the streamer waits for the hold to be lowered with no deadline
                             and without looking at ring_stop.
  CombineModel
    last_without_epoch       the last test is old + 1 == parts;
    partial_after_atomic     a part writes its partial after its atomic add;
    no_fence                 the partial's write becomes visible at a later step of its own
                             (no release fence before the add);
    arrival_order            the last sums the partials in the order the adds arrived (as
                             if each part logged its index at its ticket);
    keep_counters_after_failure  the end of a failed run restarts at epoch 0 without zeroing;
    signal_before_output     the last signals the op counter before writing the output.

Not modelled: the deadlines of the device's ring waits (a warp's poll of ring_stop stands
for the op that gives up at its deadline and raises ring_stop; an interleaving only delays
actors), the bytes of a page (a stage's data is its name), the proxy fences (generic writes
before the first copy, the mbarrier init's fence: the model's memory is sequentially
consistent apart from the no_fence switch), the counter waits of the streamed GEMM's other
operands, and counters near the u32 wrap (the wrap limit keeps targets in range; a small one
is enough to exercise the zeroing).
"""
from __future__ import annotations

import fnmatch
import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .. import abi
from .resident_model import PROGRESS, Actor, ModelViolation, RoundRobin, interleave

WARPS = abi.THREADS // 32
PAGE_BYTES = abi.PAGE_BYTES
MAX_RING = abi.OP_SHAPES["MK_STREAM_MAX_RING"]
READERS = abi.OP_SHAPES["MK_STREAM_READERS"]
U32 = 0xFFFFFFFF
WRAP_LIMIT = 2 ** 31

RULES = {
    1: "a warp reads exactly the stage it expects",
    2: "the streamer issues into a slot only once its previous stage was read",
    3: "no copy lands after its block left or its barriers were initialised again",
    4: "no deadlock, no hang",
    5: "streamer and warps agree on the stage sequence",
    6: "exactly one last part per band and run",
    7: "the last reads every partial of this run",
    8: "the output is the fixed-order sum, bit for bit",
    9: "a reader that saw every signal reads the final output",
    10: "the hold is raised only once its instruction's stages were read",
}
HOLD_POLLS = 4     # the streamer's polls of a raised hold before it issues anyway

__all__ = ["CombineModel", "CombineOutcome", "CombineRun", "Invocation", "MBarrier",
           "Priority", "ProtocolViolation", "RandomScheduler", "Record", "RingModel",
           "RingOutcome", "RoundRobin", "boxes_of", "epilogue", "fixed_order_sum", "owners",
           "holds", "readers_of", "streamed"]


class ProtocolViolation(ModelViolation):
    """A check failed; `rule` is its number in the module docstring."""
    rules = RULES


def _require(ok: bool, rule: int, message: str) -> None:
    if not ok:
        raise ProtocolViolation(rule, message)


class RandomScheduler:
    """Picks the next actor at random, each with its own speed: a weight drawn once per name
    (actors of one role share their name across invocations and runs, so a slow warp or a
    slow copy engine stays slow)."""

    def __init__(self, seed: int, spread: float = 1.5):
        self._rng = random.Random(seed)
        self._spread = spread
        self._weight: dict[str, float] = {}

    def pick(self, actors: list[Actor]) -> Actor:
        weights = []
        for a in actors:
            w = self._weight.get(a.name)
            if w is None:
                w = self._weight[a.name] = self._rng.lognormvariate(0.0, self._spread)
            weights.append(w)
        return self._rng.choices(actors, weights)[0]


class Priority:
    """A hand-written schedule: always the ready actor whose name matches the earliest of
    `patterns` (fnmatch), then the rest in the order they were created. An actor that only
    polls is set aside until something changes, so a waiting favourite lets the others run."""

    def __init__(self, *patterns: str):
        self._patterns = patterns

    def pick(self, actors: list[Actor]) -> Actor:
        def rank(actor: Actor) -> int:
            for i, pattern in enumerate(self._patterns):
                if fnmatch.fnmatchcase(actor.name, pattern):
                    return i
            return len(self._patterns)
        return min(actors, key=rank)     # min keeps the first of equal ranks


def _interleave(model, scheduler, max_steps: int) -> int:
    """resident_model.interleave with this model's deadlock rule (4)."""
    return interleave(model, scheduler, max_steps, lambda message: ProtocolViolation(4, message))


# -- the weight ring --------------------------------------------------------------------------
@dataclass
class MBarrier:
    """A shared-memory mbarrier: `count` arrivals and the expected transaction bytes complete
    a phase; `phase` counts the completed ones."""
    count: int = 0
    pending: int = 0
    tx: int = 0
    phase: int = 0
    valid: bool = False

    def init(self, count: int) -> None:
        self.count = self.pending = count
        self.tx = self.phase = 0
        self.valid = True

    def inval(self) -> None:
        self.valid = False

    def arrive(self, expect_tx: int = 0, count: int = 1) -> None:
        """mbarrier.arrive of `count` arrivals (.expect_tx: raises the phase's expected bytes
        first)."""
        self.tx += expect_tx
        self.pending -= count
        self._complete()

    def complete_tx(self, nbytes: int) -> None:
        """What a bulk copy does once its bytes are written."""
        self.tx -= nbytes
        self._complete()

    def _complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def try_wait(self, parity: int) -> bool:
        """mbarrier.try_wait.parity: the phase of this parity is the one completed last."""
        return (self.phase & 1) != (parity & 1)


@dataclass(frozen=True)
class Record:
    """One instruction of a block's queue as the stream sees it: MK_FLAG_STREAM, which tensor
    of the table is its B, its stage count (boxes of B), and how many warps read each of its
    stages (its m16 tiles), and whether it holds the streamer through its tail (`holds`)."""
    stream: bool = False
    b: int = 0
    stages: int = 1
    readers: int = 1
    hold: bool = False


def holds(flags: int) -> bool:
    """Whether a record with these flags raises the streamer's hold from its k loop's end to
    its signal (ops/gemm_stream.cuh: every instruction that reads the ring)."""
    return bool(int(flags) & abi.FLAG_STREAM)


def boxes_of(flags: int) -> int:
    """Boxes of 128 k-rows in a ring stage of a record with these flags: two stacked in k for
    a narrow band (MK_FLAG_STREAM_NARROW: boxes of 32 columns, two to a page), else one."""
    return 2 if int(flags) & abi.FLAG_STREAM_NARROW else 1


def readers_of(rows: int, flags: int = 0) -> int:
    """How many warps read each stage of a streamed instruction of `rows` rows: one per box of
    a narrow band's stage (its one m16 tile each), two for an fp32 band (each half the box's
    k-rows: ops/gemm_stream_f32.cuh), else one per m16 tile (ops/gemm_stream.cuh's
    mk_gemm_stream_run; a stage has at most READERS)."""
    if int(flags) & abi.FLAG_STREAM_NARROW:
        return boxes_of(flags)
    if int(flags) & abi.FLAG_STREAM_F32:
        return READERS
    return min(READERS, max(1, -(-rows // 16)))


def owners(record: Record, k: int) -> tuple[int, ...]:
    """The compute warps that read stage k of `record`: the instruction's stages in turn,
    `readers` warps to a stage (warp w takes stages w % (8 / r) + j 8 / r ... , its share
    w // (8 / r) of their k-rows)."""
    step = WARPS // record.readers
    return tuple(k % step + j * step for j in range(record.readers))


def streamed(record: Record, ready: tuple[bool, ...]) -> bool:
    """The predicate the streamer and the loader share: flagged, and the table carries B's
    tensor map (otherwise the GEMM loads B itself)."""
    return record.stream and ready[record.b]


@dataclass(frozen=True)
class Invocation:
    """One invocation of a block: its queue, the table's ready[] flags, the ring size R, and
    an injected failure or None: (w, i) warp w fails at instruction i, (None, i) the whole
    compute role stops there."""
    queue: tuple[Record, ...]
    ring: int
    ready: tuple[bool, ...] = (True,) * abi.MAX_TENSORS
    fail: tuple[int | None, int] | None = None

    def sequence(self) -> list[tuple[int, int]]:
        """The stages in stream order: (instruction index, stage)."""
        return [(i, k) for i, record in enumerate(self.queue) if streamed(record, self.ready)
                for k in range(record.stages)]


@dataclass(frozen=True)
class Page:
    """A page's content: which stage of which invocation the copy wrote."""
    invocation: int
    instr: int
    stage: int


@dataclass
class RingTruth:
    """What the model knows to be so, beside the shared memory: the checks compare against
    it, no actor reads it."""
    sequence: dict = field(default_factory=dict)    # invocation -> [(instr, stage)]
    issued: dict = field(default_factory=dict)      # invocation -> [(instr, stage)] issued
    consumed: dict = field(default_factory=dict)    # (invocation, warp) -> [(instr, stage)]
    reads: dict = field(default_factory=dict)       # (invocation, pos) -> warps that read it
    gone: dict = field(default_factory=dict)        # invocation -> warps that left early
    in_flight: set = field(default_factory=set)     # (invocation, pos) of copies not landed
    left: set = field(default_factory=set)          # invocations the block has left
    held: int = 0                                   # the streamer's polls of a raised hold


@dataclass
class RingOutcome:
    """What one run did: steps; per invocation, stages issued, stages read (by every one of
    their readers), and whether the stop path ran."""
    steps: int
    issued: list
    read: list
    stopped: list


class RingModel:
    """One block's streamer, copies, 8 compute warps and thread 0 over `invocations` in a
    row, sharing the ring's pages, barriers and ring_stop."""

    def __init__(self, invocations, *, skip_empty_wait: bool = False,
                 arrive_before_read: bool = False, full_parity_off_by_one: bool = False,
                 empty_parity_off_by_one: bool = False, no_reinit: bool = False,
                 no_drain: bool = False, streamer_ignores_ready: bool = False,
                 silent_failure: bool = False, empty_count_per_warp: bool = False,
                 no_issued_word: bool = False, reader_arrives_for_all: bool = False,
                 hold_at_entry: bool = False, hold_unbounded: bool = False,
                 lanes: int = 1, lane_count_for_warp: bool = False):
        self.invocations = list(invocations)
        if lanes < 1:
            raise ValueError(f"a reader warp has at least one lane, got {lanes}")
        for inv in self.invocations:
            if not 0 <= inv.ring <= MAX_RING:
                raise ValueError(f"ring of {inv.ring} pages: 0..{MAX_RING}")
            if inv.ring == 0 and inv.sequence():
                raise ValueError("a program that streams needs ring pages")
            if any(r.stages < 1 for r in inv.queue):
                raise ValueError("every instruction has at least one stage")
            if any(r.readers not in (1, READERS) for r in inv.queue):
                raise ValueError(f"a stage has 1 or {READERS} readers")
        self.skip_empty_wait = skip_empty_wait
        self.arrive_before_read = arrive_before_read
        self.full_parity_off_by_one = full_parity_off_by_one
        self.empty_parity_off_by_one = empty_parity_off_by_one
        self.no_reinit = no_reinit
        self.no_drain = no_drain
        self.streamer_ignores_ready = streamer_ignores_ready
        self.silent_failure = silent_failure
        self.lanes = lanes   # arrivals a reader warp makes on empty, one a lane (1: lane 0's)
        self.empty_count = (WARPS if empty_count_per_warp else READERS) * \
            (1 if lane_count_for_warp else lanes)
        self.no_issued_word = no_issued_word
        self.reader_arrives_for_all = reader_arrives_for_all
        self.hold_at_entry = hold_at_entry
        self.hold_unbounded = hold_unbounded
        # shared memory
        self.pages: list[Page | None] = [None] * MAX_RING
        self.full = [MBarrier() for _ in range(MAX_RING)]
        self.empty = [MBarrier() for _ in range(MAX_RING)]
        self.issued: list[int | None] = [None] * MAX_RING   # ring_issued: None for ~0
        self.ring_stop = False
        self.hold = False          # ctl.stream_hold
        self._arrived: dict = {}   # (invocation, instr, "entry" | "tail") -> warps arrived
        self.inited = 0            # ctl.ring_inited: barriers the last set-up initialised
        self.generation = 0        # set-ups that initialised the barriers (for rule 3)
        self.truth = RingTruth()
        self.actors: list[Actor] = []

    def run(self, scheduler, max_steps: int = 200_000) -> RingOutcome:
        """Interleave every actor's steps as `scheduler` picks until all are done; raises
        ProtocolViolation when a check fails."""
        self.actors = [Actor("block", self._block())]
        steps = _interleave(self, scheduler, max_steps)
        t = self.truth
        return RingOutcome(
            steps=steps,
            issued=[len(t.issued[n]) for n in range(len(self.invocations))],
            read=[self._read_through(n, inv) for n, inv in enumerate(self.invocations)],
            stopped=[bool(t.gone[n]) for n in range(len(self.invocations))])

    def _read_through(self, n: int, inv: Invocation) -> int:
        """Positions of invocation n that every reader of their stage read."""
        reads = self.truth.reads
        return sum(set(owners(inv.queue[i], k)) <= reads.get((n, pos), set())
                   for pos, (i, k) in enumerate(self.truth.sequence.get(n, [])))

    # -- thread 0 and the join barrier ------------------------------------------------------
    def _block(self):
        for n, inv in enumerate(self.invocations):
            self._set_up(n, inv)
            yield PROGRESS
            roles = [Actor("streamer", self._streamer(n, inv))]
            roles += [Actor(f"warp{w}", self._warp(n, inv, w)) for w in range(WARPS)]
            self.actors += roles
            yield PROGRESS
            while not all(a.done for a in roles):
                yield f"the roles of invocation {n}"
            self._leave(n, inv)
            yield PROGRESS

    def _set_up(self, n: int, inv: Invocation) -> None:
        """mk_ring_init: invalidate the barriers the previous set-up initialised, initialise
        this invocation's R pairs, clear ring_stop."""
        _require(not self.truth.in_flight, 3, f"thread 0 initialises the ring barriers for "
                                              f"invocation {n} with copies "
                                              f"{sorted(self.truth.in_flight)} in flight")
        if self.no_reinit and n > 0:
            for i in range(inv.ring):        # the ones never initialised before
                if not self.full[i].valid:
                    self.full[i].init(1)
                    self.empty[i].init(self.empty_count)
        else:
            for i in range(self.inited):
                self.full[i].inval()
                self.empty[i].inval()
            for i in range(inv.ring):
                self.full[i].init(1)
                self.empty[i].init(self.empty_count)
            self.inited = inv.ring
            self.generation += 1
        for i in range(inv.ring):
            self.issued[i] = None
        self.ring_stop = False
        self.hold = False
        t = self.truth
        t.sequence[n] = inv.sequence()
        t.issued[n] = []
        t.gone[n] = set()
        for w in range(WARPS):
            t.consumed[n, w] = []

    def _leave(self, n: int, inv: Invocation) -> None:
        """The block leaves invocation n; rule 5 for a run without a failure."""
        t = self.truth
        t.left.add(n)
        if inv.fail is None:
            _require(t.issued[n] == t.sequence[n], 5,
                     f"invocation {n}: the streamer issued {t.issued[n]}, the loader's "
                     f"sequence is {t.sequence[n]}")
            for w in range(WARPS):
                mine = [stage for stage in t.sequence[n] if w in owners(inv.queue[stage[0]],
                                                                        stage[1])]
                _require(t.consumed[n, w] == mine, 5,
                         f"invocation {n}: warp {w} read {t.consumed[n, w]} of its {mine}")

    # -- the streamer -----------------------------------------------------------------------
    def _streamer(self, n: int, inv: Invocation):
        R = inv.ring
        mine = (lambda record: record.stream) if self.streamer_ignores_ready \
            else (lambda record: streamed(record, inv.ready))
        stages = [(i, k) for i, record in enumerate(inv.queue) if mine(record)
                  for k in range(record.stages)]
        pos = 0
        for stage in stages:
            slot = pos % R
            if pos >= R and not self.skip_empty_wait:
                parity = (pos // R) & 1 if self.empty_parity_off_by_one \
                    else ((pos // R) - 1) & 1
                stop = yield from self._wait(self.empty[slot], parity,
                                             f"empty[{slot}] parity {parity}")
                if stop:
                    break
            yield from self._wait_hold()
            self._check_issue(n, inv, pos, stage)
            self.issued[slot] = pos
            yield PROGRESS
            self.full[slot].arrive(expect_tx=PAGE_BYTES)
            yield PROGRESS
            self.truth.issued[n].append(stage)
            self.truth.in_flight.add((n, pos))
            self.actors.append(Actor(f"copy{slot}",
                                     self._copy(n, pos, slot, Page(n, *stage), self.generation)))
            yield PROGRESS
            pos += 1
        if self.no_drain:
            return
        for p in range(max(0, pos - R), pos):
            slot, parity = p % R, (p // R) & 1
            while not self.full[slot].try_wait(parity):
                yield f"full[{slot}] parity {parity} (drain)"
            yield PROGRESS

    def _wait(self, bar: MBarrier, parity: int, what: str):
        """try_wait until the phase completes (returns False) or ring_stop is seen (True)."""
        while True:
            if bar.try_wait(parity):
                yield PROGRESS
                return False
            yield what
            if self.ring_stop:
                yield PROGRESS
                return True
            yield "ring_stop"

    def _wait_hold(self):
        """mk_stream_hold_wait: poll the hold while it is raised, at most HOLD_POLLS times
        (each poll a step of its own: time passes), not past ring_stop."""
        polls = 0
        while self.hold:
            if self.hold_unbounded:
                yield "the hold lowered"
                continue
            if polls == HOLD_POLLS or self.ring_stop:
                break
            polls += 1
            self.truth.held += 1
            yield f"the hold lowered (poll {polls})"
        yield PROGRESS

    def _raise_hold(self, n: int, inv: Invocation, i: int) -> None:
        """Thread 0 raises the hold for instruction i; rule 10."""
        t = self.truth
        for pos, (j, k) in enumerate(t.sequence[n]):
            if j == i:
                unread = set(owners(inv.queue[i], k)) - t.reads.get((n, pos), set())
                _require(not unread, 10, f"invocation {n}: the hold is raised for instruction "
                                         f"{i} while warps {sorted(unread)} have yet to read "
                                         f"its stage {k} (position {pos})")
        self.hold = True

    def _arrive(self, n: int, i: int, where: str) -> int:
        """A warp at instruction i's entry or past its k loop: how many have arrived."""
        key = (n, i, where)
        self._arrived[key] = self._arrived.get(key, 0) + 1
        return self._arrived[key]

    def _wait_issued(self, slot: int, pos: int):
        """Poll issued[slot] until it is pos (returns False) or ring_stop is seen (True)."""
        while True:
            if self.issued[slot] == pos:
                yield PROGRESS
                return False
            yield f"issued[{slot}] == {pos}"
            if self.ring_stop:
                yield PROGRESS
                return True
            yield "ring_stop"

    def _check_issue(self, n: int, inv: Invocation, pos: int, stage: tuple[int, int]) -> None:
        """Rules 5 and 2 when the streamer issues `stage` at pos."""
        sequence = self.truth.sequence[n]
        expected = sequence[pos] if pos < len(sequence) else None
        _require(stage == expected, 5, f"invocation {n}: the streamer issues {stage} at "
                                       f"position {pos}, the warps take {expected} from it")
        before = pos - inv.ring
        if before >= 0:
            read = self.truth.reads.get((n, before), set())
            i, k = sequence[before]
            for w in owners(inv.queue[i], k):
                unread = w not in read and w not in self.truth.gone[n]
                _require(not unread, 2, f"invocation {n}: the streamer issues position {pos} "
                                        f"into slot {pos % inv.ring} while warp {w} has not "
                                        f"read position {before}")

    # -- a copy -----------------------------------------------------------------------------
    def _copy(self, n: int, pos: int, slot: int, page: Page, generation: int):
        self._check_landing(n, pos, generation)
        self.pages[slot] = page
        yield PROGRESS
        self._check_landing(n, pos, generation)
        self.full[slot].complete_tx(PAGE_BYTES)
        self.truth.in_flight.discard((n, pos))
        yield PROGRESS

    def _check_landing(self, n: int, pos: int, generation: int) -> None:
        _require(n not in self.truth.left, 3, f"the copy of position {pos} lands after the "
                                              f"block left invocation {n}")
        _require(generation == self.generation, 3,
                 f"the copy of position {pos} of invocation {n} lands on ring barriers "
                 f"initialised again since it was issued")

    # -- a compute warp ---------------------------------------------------------------------
    def _warp(self, n: int, inv: Invocation, w: int):
        R = inv.ring
        pos = 0
        for i, record in enumerate(inv.queue):
            tail_failure = record.hold and inv.fail == (None, i)   # stops in the tail
            if inv.fail is not None and inv.fail[1] == i and inv.fail[0] in (None, w) and \
                    not tail_failure:
                raiser = 0 if inv.fail[0] is None else inv.fail[0]   # thread 0 for the role
                if w == raiser and not self.silent_failure:
                    self.ring_stop = True
                    yield PROGRESS
                self.truth.gone[n].add(w)
                yield PROGRESS
                return
            if not streamed(record, inv.ready):
                yield PROGRESS            # the instruction's own work
                continue
            if record.hold and self.hold_at_entry and self._arrive(n, i, "entry") == 1:
                self._raise_hold(n, inv, i)
                yield PROGRESS
            arrivals = READERS if self.reader_arrives_for_all else READERS // record.readers
            for k in range(record.stages):
                if w not in owners(record, k):
                    pos += 1                  # another warp's stage
                    continue
                slot = pos % R
                parity = ((pos // R) + 1) & 1 if self.full_parity_off_by_one else (pos // R) & 1
                stop = False if self.no_issued_word else \
                    (yield from self._wait_issued(slot, pos))
                if not stop:
                    stop = yield from self._wait(self.full[slot], parity,
                                                 f"full[{slot}] parity {parity}")
                if stop:
                    self.truth.gone[n].add(w)
                    return
                for lane in range(self.lanes):   # each lane its share, then its own arrive
                    if self.arrive_before_read:
                        self.empty[slot].arrive(count=arrivals)
                        yield PROGRESS
                    self._read(n, w, pos, slot, (i, k), record, lane == self.lanes - 1)
                    yield PROGRESS
                    if not self.arrive_before_read:
                        self.empty[slot].arrive(count=arrivals)
                        yield PROGRESS
                pos += 1
            arrived = self._arrive(n, i, "tail") if record.hold else 0
            if tail_failure and arrived < WARPS:
                # past the op's barrier the role gives up as one: no warp goes on to the next
                # instruction (the last one below stands for thread 0)
                self.truth.gone[n].add(w)
                yield PROGRESS
                return
            if record.hold and arrived == WARPS:
                # the last warp past the op's barrier stands for thread 0: it raises the hold,
                # the tail runs (reduce, epilogue, the signal's fence), it lowers the hold
                if not self.hold_at_entry:
                    self._raise_hold(n, inv, i)
                yield PROGRESS
                if tail_failure:          # the op gave up in its tail: the hold stays raised
                    if not self.silent_failure:
                        self.ring_stop = True
                    self.truth.gone[n].update(range(WARPS))
                    yield PROGRESS
                    return
                yield PROGRESS
                self.hold = False
                yield PROGRESS

    def _read(self, n: int, w: int, pos: int, slot: int, stage: tuple[int, int],
              record: Record, whole: bool = True) -> None:
        """Rules 5 and 1: the stage warp w (one of its lanes) takes from pos, and the page it
        finds there; `whole`: the warp's last lane, after which the warp has read the stage."""
        t = self.truth
        sequence = t.sequence[n]
        _require(pos < len(sequence) and sequence[pos] == stage and
                 w in owners(record, stage[1]), 5,
                 f"invocation {n}: warp {w} takes {stage} from position {pos}")
        page = self.pages[slot]
        _require(page == Page(n, *stage), 1, f"invocation {n}: warp {w} reads position {pos} "
                                             f"{stage} from slot {slot} and finds {page}")
        if not whole:
            return
        t.consumed[n, w].append(stage)
        t.reads.setdefault((n, pos), set()).add(w)


# -- the cross-SM combine ---------------------------------------------------------------------
EPILOGUE_SCALE = np.float32(0.75)
EPILOGUE_BIAS = np.float32(0.5)


def epilogue(x: np.float32) -> np.float32:
    """A stand-in for the GEMM epilogue: fp32 scale and bias, applied once, by the last."""
    return np.float32(np.float32(x * EPILOGUE_SCALE) + EPILOGUE_BIAS)


def fixed_order_sum(values) -> np.float32:
    """scratch[0] + scratch[1] + ... in fp32, left to right."""
    total = None
    for v in values:
        total = np.float32(v) if total is None else np.float32(total + np.float32(v))
    return total


def _bits(x: np.float32) -> int:
    return int(np.float32(x).view(np.uint32))


def _reached(value: int, target: int) -> bool:
    """The device's signed u32 wait test."""
    return ((value - target) & U32) < 0x80000000


@dataclass(frozen=True)
class CombineRun:
    """One run of the program: the parts that fail, as (band, part, step) where step is the
    one they never reach: "write" (the partial), "add" (the combine counter) or "signal" (the
    op counter)."""
    fails: tuple[tuple[int, int, str], ...] = ()

    def fail_at(self, band: int, part: int) -> str | None:
        for b, p, step in self.fails:
            if (b, p) == (band, part):
                return step
        return None


@dataclass(frozen=True)
class Partial:
    """A scratch entry: which run wrote it, and its fp32 value."""
    run: int
    value: np.float32


@dataclass(frozen=True)
class Output:
    """A band's output: which run's last wrote it, and the bits."""
    run: int
    bits: int


@dataclass
class CombineTruth:
    """What the model knows to be so, beside the shared memory: the checks compare against
    it, no actor reads it."""
    partials: dict = field(default_factory=dict)    # (run, band, part) -> np.float32
    expected: dict = field(default_factory=dict)    # (run, band) -> output bits
    epochs: list = field(default_factory=list)      # run -> its epoch
    adds: Counter = field(default_factory=Counter)  # (run, band) -> adds on the combine counter
    lasts: Counter = field(default_factory=Counter)  # (run, band) -> parts that were last
    outputs: dict = field(default_factory=dict)     # (run, band) -> bits the last wrote
    seen: dict = field(default_factory=dict)        # (run, band) -> bits the reader read
    zeroed: int = 0                                  # times the counters were zeroed


@dataclass
class CombineOutcome:
    """What one run did: steps; per run, its epoch and each band's output bits (None where
    no last wrote one); how often the counters were zeroed."""
    steps: int
    epochs: list
    outputs: list
    zeroed: int


class CombineModel:
    """`bands[b]` parts per column band, run `runs` times (CombineRun each) without resetting
    the counters between good runs. Partial values come from `seed`, or from `values`
    ((run, band, part) -> float) where given."""

    def __init__(self, bands, runs, *, seed: int = 0, values: dict | None = None,
                 wrap_limit: int = WRAP_LIMIT, last_without_epoch: bool = False,
                 partial_after_atomic: bool = False, no_fence: bool = False,
                 arrival_order: bool = False, keep_counters_after_failure: bool = False,
                 signal_before_output: bool = False):
        self.bands = tuple(bands)
        if not self.bands or any(parts < 1 for parts in self.bands):
            raise ValueError("every band needs at least one part")
        self.runs = list(runs)
        self.max_target = max(self.bands)
        if 2 * self.max_target > wrap_limit:
            raise ValueError("the wrap limit must leave room for two runs")
        self.wrap_limit = wrap_limit
        self.last_without_epoch = last_without_epoch
        self.partial_after_atomic = partial_after_atomic
        self.no_fence = no_fence
        self.arrival_order = arrival_order
        self.keep_counters_after_failure = keep_counters_after_failure
        self.signal_before_output = signal_before_output
        # shared memory: band b's combine counter is 2 b, its op counter 2 b + 1
        self.counters = [0] * (2 * len(self.bands))
        self.scratch: list[list[Partial | None]] = [[None] * parts for parts in self.bands]
        self.output: list[Output | None] = [None] * len(self.bands)
        self.arrivals: list[list[int]] = [[] for _ in self.bands]
        self.abort = False
        self.epoch = 0
        self._blocks: list[Actor] = []      # the current run's actors
        self.truth = CombineTruth()
        rng = random.Random(seed)
        for r in range(len(self.runs)):
            for b, parts in enumerate(self.bands):
                for p in range(parts):
                    if values is not None and (r, b, p) in values:
                        v = np.float32(values[r, b, p])
                    else:   # magnitudes far apart: fp32 sums depend on the order
                        v = np.float32(rng.choice((-1, 1)) * rng.uniform(1, 2)
                                       * 2.0 ** rng.randint(-12, 24))
                    self.truth.partials[r, b, p] = v
                self.truth.expected[r, b] = _bits(epilogue(fixed_order_sum(
                    self.truth.partials[r, b, p] for p in range(parts))))
        self.actors: list[Actor] = []

    def run(self, scheduler, max_steps: int = 200_000) -> CombineOutcome:
        """Interleave every actor's steps as `scheduler` picks until all are done; raises
        ProtocolViolation when a check fails."""
        self.actors = [Actor("finish", self._finish())]
        steps = _interleave(self, scheduler, max_steps)
        t = self.truth
        return CombineOutcome(
            steps=steps, epochs=list(t.epochs),
            outputs=[[t.outputs.get((r, b)) for b in range(len(self.bands))]
                     for r in range(len(self.runs))],
            zeroed=t.zeroed)

    # -- one run after another, and its end -------------------------------------------------
    def _finish(self):
        for r, run in enumerate(self.runs):
            epoch = self.epoch
            self.truth.epochs.append(epoch)
            self.abort = False
            self.arrivals = [[] for _ in self.bands]
            blocks = []
            for b, parts in enumerate(self.bands):
                blocks += [Actor(f"b{b}.p{p}", self._part(r, run, epoch, b, p))
                           for p in range(parts)]
                blocks.append(Actor(f"b{b}.reader", self._reader(r, epoch, b)))
            self._blocks = blocks
            self.actors += blocks
            yield PROGRESS
            while not all(a.done for a in self._blocks):
                yield f"the blocks of run {r}"
            self._check_run(r)
            if run.fails:
                if not self.keep_counters_after_failure:
                    self._zero()
                self.epoch = 0
            else:
                self.epoch = epoch + 1
                if (self.epoch + 1) * self.max_target > self.wrap_limit:
                    self._zero()
                    self.epoch = 0
            yield PROGRESS

    def _zero(self) -> None:
        self.counters = [0] * len(self.counters)
        self.truth.zeroed += 1

    def _check_run(self, r: int) -> None:
        """Rule 6 at the end of run r: one last where every part added, none elsewhere."""
        t = self.truth
        for b, parts in enumerate(self.bands):
            want = 1 if t.adds[r, b] == parts else 0
            _require(t.lasts[r, b] == want, 6,
                     f"run {r} (epoch {t.epochs[r]}), band {b}: {t.adds[r, b]} of {parts} "
                     f"parts added, {t.lasts[r, b]} were last")

    # -- a part -----------------------------------------------------------------------------
    def _part(self, r: int, run: CombineRun, epoch: int, b: int, p: int):
        parts = self.bands[b]
        value = self.truth.partials[r, b, p]
        fail_at = run.fail_at(b, p)
        if fail_at == "write":
            yield from self._fail()
            return
        if not self.partial_after_atomic:
            yield from self._write_partial(r, b, p, value)
        if fail_at == "add":
            yield from self._fail()
            return
        old = self.counters[2 * b]
        self.counters[2 * b] = (old + 1) & U32
        self.arrivals[b].append(p)
        target = parts if self.last_without_epoch else (epoch + 1) * parts
        last = ((old + 1) & U32) == (target & U32)
        self._check_last(r, b, p, last)
        yield PROGRESS
        if self.partial_after_atomic:
            yield from self._write_partial(r, b, p, value)
        if last:
            signalled = yield from self._combine(r, b, p, value)
            if signalled:
                return
        if fail_at == "signal":
            yield from self._fail()
            return
        yield from self._signal(b)

    def _signal(self, b: int):
        """The op counter's add (after a release fence: the output is written before)."""
        self.counters[2 * b + 1] = (self.counters[2 * b + 1] + 1) & U32
        yield PROGRESS

    def _check_last(self, r: int, b: int, p: int, last: bool) -> None:
        """Rule 6 as each part decides: no second last, and the part that adds last of all
        leaves the band with one."""
        t = self.truth
        t.adds[r, b] += 1
        t.lasts[r, b] += last
        _require(t.lasts[r, b] <= 1, 6, f"run {r}, band {b}: part {p} is a second last")
        _require(t.adds[r, b] < self.bands[b] or t.lasts[r, b] == 1, 6,
                 f"run {r} (epoch {t.epochs[r]}), band {b}: every part added, none was last "
                 f"(part {p}'s add read {(self.counters[2 * b] - 1) & U32})")

    def _write_partial(self, r: int, b: int, p: int, value: np.float32):
        if not self.no_fence:
            self.scratch[b][p] = Partial(r, value)
            yield PROGRESS
            return

        def store():
            self.scratch[b][p] = Partial(r, value)
            yield PROGRESS
        actor = Actor(f"b{b}.p{p}.store", store())
        self._blocks.append(actor)
        self.actors.append(actor)
        yield PROGRESS

    def _fail(self):
        """The block's error: abort raised, the part stops."""
        self.abort = True
        yield PROGRESS

    def _combine(self, r: int, b: int, p: int, value: np.float32):
        """The last part: the partials in the fixed order, the epilogue, the output."""
        parts = self.bands[b]
        order = list(range(parts))
        if self.arrival_order:
            order = list(self.arrivals[b])
            yield PROGRESS
        total = None
        for q in order:
            if q == p:
                v = value
            else:
                entry = self.scratch[b][q]
                _require(entry is not None and entry.run == r, 7,
                         f"run {r}, band {b}: the last (part {p}) reads part {q}'s partial "
                         f"and finds {'nothing' if entry is None else f'run {entry.run}s'}")
                v = entry.value
                yield PROGRESS
            total = v if total is None else np.float32(total + v)
        bits = _bits(epilogue(total))
        expected = self.truth.expected[r, b]
        _require(bits == expected, 8, f"run {r}, band {b}: the output is {bits:#010x}, the "
                                      f"fixed-order sum gives {expected:#010x}")
        if self.signal_before_output:
            yield from self._signal(b)
        self.output[b] = Output(r, bits)
        self.truth.outputs[r, b] = bits
        yield PROGRESS
        return self.signal_before_output

    # -- the output's reader ----------------------------------------------------------------
    def _reader(self, r: int, epoch: int, b: int):
        target = ((epoch + 1) * self.bands[b]) & U32
        while True:
            if _reached(self.counters[2 * b + 1], target):
                yield PROGRESS
                break
            yield f"op counter {2 * b + 1} >= {target}"
            if self.abort:
                yield PROGRESS
                return
            yield "abort"
        out = self.output[b]
        _require(out == Output(r, self.truth.expected[r, b]), 9,
                 f"run {r}, band {b}: the reader saw every signal and reads {out}")
        self.truth.seen[r, b] = out.bits
        yield PROGRESS
