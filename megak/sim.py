"""The CPU simulator: the living definition of every opcode and of the scheduling protocol.

It executes the *encoded* per-SM queues (the bytes the GPU gets). Each SM has the device's
two roles over its ``SLOTS`` instruction slots, and every role is an actor that makes at
most one transition per scheduling round, actors interleaved round-robin or in a seeded
random order::

    loader  (up to SLOTS - 1 ahead)          compute (queue order)
    -------------------------------          ---------------------
    1. fetch q into a free slot               waits for slot q ready
       (compute has finished q - SLOTS)       phase 0: the op reads its operands
    2. acquire rec.pages pages, lowest        ... after each phase: release that
       free first; wait while too few           phase's pages (page_plan.py)
    3. early preloads (operands with no       after the last: outputs written,
       producer: MK_FLAG_B_READY)               signals, release the rest, free
    4. wait for the counters                    the slot
    5. late preloads, slot ready

So the loader of a later instruction takes pages while q still computes, but only pages no
earlier instruction holds. Counters persist across runs with epochs, like the device's. When no
actor can move, that is a hang: MegakernelHang carries the record the GPU writes (SM, queue
index, opcode, counter, expected, observed); a loader starved of pages nobody will release is a
page leak. It also checks what the GPU cannot cheaply check: every region read was completely
written first (a missing dependency is an error here, not a flaky result), every page is held
by one instruction at a time, written and used only while its instruction holds it, and
released exactly once by the instruction that acquired it.

Data that is its own flag (device/flag.cuh): a flagged tensor keeps its values and a stamp
per element across runs, as the device's words do. A run's stamp is the last one + 1 (never
0, never reset, even when a run fails); a compute role whose instruction reads flagged words
polls them (it does not move) until every word it will read carries this run's stamp, and
the op stamps what it writes. Reading a word of another stamp is a race, writing one twice in
a run is a race, and a poll nobody will satisfy is a hang naming the tensor slot.

Logical time: one tick per actor per round (``2 * n_sm`` ticks a round), so every
transition has its own time and a consumer's wait always ends after its producer's store.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from . import abi
from . import page_plan as _page_plan
from .dtypes import numpy_dtype
from .errors import MegakernelError, raise_for_status
from .ops import BY_OPCODE
from .pages import SLOTS
from .plan import Plan
from .runtime import packed_weights
from .runtime.flag_model import next_stamp

_OK = abi.ERRORS["MK_OK"]
_TIMEOUT = abi.ERRORS["MK_ERR_TIMEOUT"]
_ABORTED = abi.ERRORS["MK_ERR_ABORTED"]
_LEAK = abi.ERRORS["MK_ERR_PAGE_LEAK"]

_LOADER, _COMPUTE = 0, 1


class _Instr:
    """One instruction between its fetch and the end of its compute."""
    __slots__ = ("q", "rec", "plan", "stage", "pages", "released", "keep", "wait_k", "ready",
                 "phase", "intervals")

    def __init__(self, q, rec, plan):
        self.q = q
        self.rec = rec
        self.plan = plan
        self.stage = "acquire"   # loader: -> "early" -> "wait" -> "late" -> done (ready)
        self.pages: list[int] = []          # physical pages, acquisition order
        self.released: list[bool] = []
        # test hook: the last acquired page is never given back, by a phase or at the end
        n = int(rec["pages"])
        self.keep = n - 1 if int(rec["flags"]) & abi.FLAG_DEBUG_LEAK_PAGE and n > 0 else -1
        self.wait_k = 0
        self.ready = False
        self.phase = -1          # compute: -1 not started, p in phase p, len(phases) done
        self.intervals: list[list] = []


class _Stop(Exception):
    def __init__(self, code, sm, q, instr, counter=0, expected=0, observed=0):
        super().__init__(code)
        self.fields = dict(error=code, sm=sm, queue_index=q,
                           opcode=int(instr["opcode"]) if instr is not None else 0,
                           op_index=int(instr["op_index"]) if instr is not None else 0,
                           counter=counter, expected=expected, observed=observed)


# Queues whose weight stream is at most this many stages in all get the ring protocol run
# through the model (runtime/stream_model.py) at each simulated run; larger ones would make
# the simulator slow, and the model's own tests cover the protocol.
STREAM_MODEL_MAX_STAGES = 512


def check_stream_queues(plan: Plan, queues) -> None:
    """Run each SM's weight stream (the streamed GEMMs of its queue, in order, on a ring of
    plan.stream_pages pages) through the ring protocol's model, one seeded interleaving: the
    streamer, the copies and the 8 warps must finish with every stage read as issued."""
    if plan.stream_pages == 0:
        return
    from .runtime import stream_model as sm
    box_rows = abi.OP_SHAPES["MK_STREAM_BOX_ROWS"]
    invocations = []
    for queue in queues:
        flags = queue["flags"].astype(np.int64)
        if not (flags & abi.FLAG_STREAM).any():
            continue
        records = tuple(sm.Record(stream=bool(f & abi.FLAG_STREAM), b=0,
                                  stages=max(1, -(-int(k) // (box_rows * sm.boxes_of(f)))),
                                  readers=sm.readers_of(int(r), f), hold=sm.holds(f))
                        for f, k, r in zip(flags, queue["klen"], queue["rows"]))
        invocations.append(sm.Invocation(records, plan.stream_pages, ready=(True,)))
    total = sum(len(inv.sequence()) for inv in invocations)
    if not invocations or total > STREAM_MODEL_MAX_STAGES:
        return
    try:
        sm.RingModel(invocations).run(sm.RandomScheduler(seed=total))
    except sm.ProtocolViolation as exc:
        raise MegakernelError(f"sim: weight stream protocol broken: {exc}") from None


class SimExecutor:
    """Runs a Plan on the CPU. ``order``: "round_robin" or "random" (seeded by ``seed``).

    After a run: ``last_peak_pages[sm]`` is the most pages held at once on each SM, and
    ``last_page_intervals[sm]`` lists ``(queue index, physical page, acquire time, release
    time)`` for every page acquired (release time None for a page never given back)."""

    def __init__(self, plan: Plan, *, order: str = "round_robin", seed: int | None = None,
                 debug: bool = True):
        if order not in ("round_robin", "random"):
            raise ValueError(f"order must be 'round_robin' or 'random', got {order!r}")
        self.plan = plan
        self.order = order
        self.rng = np.random.default_rng(seed)
        self.debug = debug
        self.counters = np.zeros(max(plan.n_counters, 1), dtype=np.uint32)
        self.epoch = 0
        self.stamp = 0       # the running (else the last) run's stamp: never reset
        # flagged tensors live across runs, as on the device: slot -> (values, stamps)
        self._flag_words = {t.slot: (np.zeros(t.shape, dtype=np.float32),
                                     np.zeros(t.shape, dtype=np.uint32))
                            for t in plan.tensors if t.flagged}
        self._run_bytes = self._stream_checked = None   # the queues the ring model last ran
        self._constants = self._constant_images(plan)
        self.last_peak_pages: list[int] = []
        self.last_page_intervals: list[list[tuple]] = []
        self.closed = False
        # one run at a time: the counters, stamps and flagged tensors are the run's state,
        # as the GPU's are (its executor serialises launches the same way); re-entrant so a
        # caller can hold it across run() and its reading of last_trace_events
        self.lock = threading.RLock()

    @staticmethod
    def _constant_images(plan: Plan) -> dict[int, np.ndarray]:
        """slot -> each constant as the device reads it: a B packed for the weight stream
        (runtime/packed_weights.py) read back from its packed image, so that a packing that
        does not invert shows in the results. Read-only views: every run reads them as they
        are (no copy per run), and an op that wrote one would fail."""
        forms = packed_weights.packed_forms(plan.instrs, plan.constant_values)
        images = {}
        for slot, value in plan.constant_values.items():
            if slot in forms:
                rows, cols = value.shape
                bits = packed_weights.unpack(packed_weights.pack(value, forms[slot]), rows,
                                             cols, forms[slot])
                value = bits.view(value.dtype)
            image = value.view()
            image.flags.writeable = False
            images[slot] = image
        return images

    def _reset_counters(self) -> None:
        # a failed run leaves counters part-way: start the next one from zero, as the GPU does
        self.counters[:] = 0
        self.epoch = 0

    def reload_queues(self) -> None:
        """Nothing to upload on the CPU: the plan's records are read at each run."""

    def close(self) -> None:
        """Nothing to free on the CPU, but a closed program refuses to run, as on the GPU."""
        self.closed = True

    def check_open(self) -> None:
        if self.closed:
            raise MegakernelError("this SimExecutor is closed")

    # -- one run ----------------------------------------------------------------------------
    def run(self, inputs: dict[int, np.ndarray], outputs: list[int],
            trace: bool = False) -> dict[int, np.ndarray]:
        """Execute the plan; with ``trace``, ``self.last_trace_events`` holds one
        abi.TRACE_DTYPE record per instruction (queue order), in logical steps."""
        with self.lock:
            return self._run(inputs, outputs, trace)

    def _run(self, inputs: dict[int, np.ndarray], outputs: list[int],
             trace: bool) -> dict[int, np.ndarray]:
        self.check_open()
        plan = self.plan
        data = abi.encode(plan.instrs)          # execute the bytes, not the Python objects
        self._run_bytes = data
        instrs = abi.decode(data)
        tensors = []
        written = []
        for slot in plan.tensors:
            dtype = numpy_dtype(slot.dtype)
            if slot.flagged:                # values and stamps persist; stamps say what is valid
                tensors.append(self._flag_words[slot.slot][0])
                written.append(None)
            elif slot.slot in inputs:
                tensors.append(np.array(inputs[slot.slot], dtype=dtype, copy=True)
                               .reshape(slot.shape))
                written.append(None)
            elif slot.slot in self._constants:
                tensors.append(self._constants[slot.slot])
                written.append(None)
            elif slot.kind == "unused":     # nothing reads or writes it: no memory
                tensors.append(np.empty((0, 0), dtype=dtype))
                written.append(None)
            else:
                tensors.append(np.full(slot.shape, np.nan, dtype=dtype))  # poison
                written.append(np.zeros(slot.shape, dtype=bool))
        self._events = np.zeros(len(instrs), dtype=abi.TRACE_DTYPE) if trace else None
        # this run's stamp, spent whatever the outcome (a failed run's words must never pass
        # for a later run's)
        self.stamp = next_stamp(self.stamp)
        try:
            self._execute(instrs, tensors, written)
        except _Stop as stop:
            self._reset_counters()
            raise_for_status(stop.fields, stop.states, plan.op_labels, plan.instrs,
                             plan.queue_start, backend="sim")
        except BaseException:        # a failure, or an interrupt part-way (Ctrl-C)
            self._reset_counters()
            raise
        self.epoch += 1
        self.last_trace_events = self._events
        return {s: tensors[s].copy() for s in outputs}

    def _execute(self, instrs, tensors, written) -> None:
        plan = self.plan
        n_sm = plan.n_sm
        # the weight ring's pages are never the allocator's (device/stream.cuh)
        n_pages = plan.n_pages - plan.stream_pages
        qs = plan.queue_start.astype(np.int64)
        queues = [instrs[qs[s]:qs[s + 1]] for s in range(n_sm)]
        ld_next = [0] * n_sm                        # next queue index the loader fetches
        loading: list[_Instr | None] = [None] * n_sm
        slots: list[deque[_Instr]] = [deque() for _ in range(n_sm)]   # fetched, not finished
        owner: list[list[_Instr | None]] = [[None] * n_pages for _ in range(n_sm)]
        peak = [0] * n_sm
        intervals: list[list[list]] = [[] for _ in range(n_sm)]
        self.last_peak_pages = peak
        self.last_page_intervals = intervals
        done = [len(queues[s]) == 0 for s in range(n_sm)]
        polling: list[tuple | None] = [None] * n_sm   # compute: (instr, slot, stamp seen)
        epoch = self.epoch
        self._epoch = epoch
        if self._stream_checked != self._run_bytes:   # once per set of queues, not per run
            check_stream_queues(plan, queues)
            self._stream_checked = self._run_bytes
        counters = self.counters
        states = [dict(queue_index=0, opcode=0, op_index=0, counter=0, expected=0,
                       observed=0, error=_OK, pad=0) for _ in range(n_sm)]

        def stop(exc: _Stop):
            for s in range(n_sm):
                if not done[s]:
                    states[s].update(queue_index=slots[s][0].q if slots[s] else ld_next[s],
                                     error=_ABORTED)
            states[exc.fields["sm"]].update(
                {k: exc.fields[k] for k in ("queue_index", "opcode", "op_index", "counter",
                                            "expected", "observed", "error")})
            exc.states = states
            exc.fields["abort"] = 1
            exc.fields["finished_blocks"] = sum(done)
            raise exc

        clock = [0]
        events = self._events
        phase = abi.TRACE_PHASES

        def mark(s: int, cur: _Instr, which: str) -> None:
            if events is not None:
                events[qs[s] + cur.q]["t"][phase[which]] = clock[0]

        def fail(s: int, cur: _Instr, what: str) -> None:
            rec = cur.rec
            raise MegakernelError(
                f"sim: page protocol broken on SM {s}, queue index {cur.q} "
                f"({self._label(rec)}): {what}")

        def check_held(s: int, cur: _Instr, idx, why: str) -> None:
            """Page positions ``idx`` of cur's table are cur's alone right now."""
            for j in idx:
                if j >= len(cur.pages):
                    fail(s, cur, f"{why} page {j} of its table, but it holds only "
                                 f"{len(cur.pages)} pages")
                p = cur.pages[j]
                if cur.released[j] or owner[s][p] is not cur:
                    other = owner[s][p]
                    held = (f"queue index {other.q} holds it now" if other is not None
                            else "it is free")
                    fail(s, cur, f"{why} page {j} (physical page {p}) after releasing it; "
                                 f"{held}")

        def release(s: int, cur: _Instr, idx, why: str) -> None:
            for j in idx:
                if j == cur.keep:
                    continue
                if j >= len(cur.pages):
                    fail(s, cur, f"{why} releases page {j} of its table, but it holds only "
                                 f"{len(cur.pages)} pages")
                p = cur.pages[j]
                if cur.released[j]:
                    fail(s, cur, f"{why} releases page {j} (physical page {p}) a second time")
                if owner[s][p] is not cur:
                    fail(s, cur, f"{why} releases page {j} (physical page {p}), which it "
                                 f"does not hold")
                cur.released[j] = True
                owner[s][p] = None
                cur.intervals[j][3] = clock[0]

        def loader_step(s: int) -> bool:
            cur = loading[s]
            queue = queues[s]
            if cur is None:
                # 1. fetch into a free slot: the compute role has finished q - SLOTS
                q = ld_next[s]
                if q >= len(queue) or len(slots[s]) >= SLOTS:
                    return False
                rec = queue[q]
                self._validate(s, q, rec, stop)
                cur = _Instr(q, rec, self._page_plan(rec))
                slots[s].append(cur)
                loading[s] = cur
                if events is not None:
                    e = events[qs[s] + q]
                    e["queue_index"], e["sm"], e["slot"] = q, s, q % SLOTS
                    e["opcode"], e["op_index"] = rec["opcode"], rec["op_index"]
                mark(s, cur, "MK_T_FETCH")
                return True
            rec = cur.rec
            if cur.stage == "acquire":
                # 2. pages in queue order, lowest free first; too few free: wait for releases
                need = int(rec["pages"])
                free = [p for p in range(n_pages) if owner[s][p] is None]
                if len(free) < need:
                    return False
                cur.pages = free[:need]
                cur.released = [False] * need
                for p in cur.pages:
                    owner[s][p] = cur
                    iv = [cur.q, p, clock[0], None]
                    cur.intervals.append(iv)
                    intervals[s].append(iv)
                held = n_pages - len(free) + need
                peak[s] = max(peak[s], held)
                mark(s, cur, "MK_T_ACQUIRED")
                if events is not None:
                    events[qs[s] + cur.q]["pages_in_use"] = held
                cur.stage = "early" if cur.plan.preload_early else "wait"
                return True
            if cur.stage == "early":
                # 3. loads before the wait: only of operands nobody produces
                check_held(s, cur, cur.plan.preload_early, "the loader's early preload writes")
                self._check_reads(s, cur, rec, cur.plan.early_reads, written,
                                  "its loader preloaded (before the dependency wait)")
                cur.stage = "wait"
                return True
            if cur.stage == "wait":
                # 4. counters
                while cur.wait_k < int(rec["n_waits"]):
                    c = int(rec["wait_counter"][cur.wait_k])
                    target = ((epoch + 1) * int(rec["wait_target"][cur.wait_k])) & 0xFFFFFFFF
                    diff = (int(counters[c]) - target) & 0xFFFFFFFF
                    if diff >= 0x80000000:
                        return False
                    cur.wait_k += 1
                mark(s, cur, "MK_T_WAITED")
                if cur.plan.preload_late:
                    cur.stage = "late"
                    return True
            else:
                # 5. loads after the wait
                check_held(s, cur, cur.plan.preload_late, "the loader's late preload writes")
            cur.ready = True
            loading[s] = None
            ld_next[s] += 1
            return True

        def compute_step(s: int) -> bool:
            if not slots[s] or not slots[s][0].ready:
                return False
            cur = slots[s][0]
            rec = cur.rec
            phases = cur.plan.phases or _page_plan.NO_PAGES.phases
            if cur.phase < 0:
                # flagged words: the compute warps poll until all carry this run's stamp
                pending = self._flag_pending(rec, tensors)
                polling[s] = None if pending is None else (cur,) + pending
                if pending is not None:
                    return False
                # the op's reads all happen in its first phase
                check_held(s, cur, phases[0][0] if phases else (), "compute phase 0 uses")
                mark(s, cur, "MK_T_LOADED")
                self._run_op(s, cur, rec, tensors, written)
                cur.phase = 0
                return True
            if cur.phase < len(phases):
                p = cur.phase
                release(s, cur, phases[p][1], f"compute phase {p}")
                cur.phase += 1
                if cur.phase < len(phases):
                    check_held(s, cur, phases[cur.phase][0], f"compute phase {cur.phase} uses")
                else:
                    self._mark_written(rec, written)
                    mark(s, cur, "MK_T_COMPUTED")
                return True
            # outputs are in memory: signal, give back the rest, free the slot
            for j in range(int(rec["n_signals"])):
                c = int(rec["signal_counter"][j])
                counters[c] = (int(counters[c]) + 1) & 0xFFFFFFFF
            release(s, cur, [j for j in range(len(cur.pages)) if not cur.released[j]],
                    "the final release")
            mark(s, cur, "MK_T_STORED")
            slots[s].popleft()
            if not slots[s] and ld_next[s] >= len(queues[s]):
                if any(o is not None for o in owner[s]):
                    stop(_Stop(_LEAK, s, cur.q, rec))
                done[s] = True
                states[s].update(queue_index=len(queues[s]), error=_OK)
            return True

        steps = (loader_step, compute_step)
        ticks = 2 * n_sm
        rounds = 0
        try:
            while not all(done):
                actors = [(s, role) for s in range(n_sm) if not done[s]
                          for role in (_COMPUTE, _LOADER)]
                if self.order == "random":
                    # (SM, role) pairs, so one SM's loader and compute meet in every order
                    actors = [actors[i] for i in self.rng.permutation(len(actors))]
                moved = False
                for tick, (s, role) in enumerate(actors):
                    if done[s]:
                        continue
                    clock[0] = rounds * ticks + tick
                    moved |= steps[role](s)
                rounds += 1
                if not moved:
                    live = [s for s in range(n_sm) if not done[s]]
                    self._report_hang(live, loading, ld_next, epoch, states, stop, polling)
        finally:
            for s in range(n_sm):
                intervals[s] = [tuple(iv) for iv in intervals[s]]

    def _label(self, rec) -> str:
        labels = self.plan.op_labels
        i = int(rec["op_index"])
        return labels[i] if 0 <= i < len(labels) else f"op #{i}"

    def _page_plan(self, rec):
        a = int(rec["tensor"][abi.ARG_A])
        dtype_a = self.plan.tensors[a].dtype if a < len(self.plan.tensors) else "float32"
        return _page_plan.page_plan(rec, dtype_a)

    def _report_hang(self, live, loading, ld_next, epoch, states, stop, polling):
        # nothing moved: every live SM's compute role waits for its loader, or polls a
        # flagged word nobody will write, and the loader waits either for a counter (a hang)
        # or for pages that no instruction will release
        counters = self.counters
        first = None
        for s in live:
            if polling[s] is None:
                continue
            cur, slot, seen = polling[s]
            rec = cur.rec
            states[s].update(queue_index=cur.q, opcode=int(rec["opcode"]),
                             op_index=int(rec["op_index"]), counter=abi.FLAG_WAIT | slot,
                             expected=self.stamp, observed=seen, error=_TIMEOUT)
            if first is None:
                first = _Stop(_TIMEOUT, s, cur.q, rec, abi.FLAG_WAIT | slot, self.stamp, seen)
        for s in live:
            cur = loading[s]
            if cur is None:
                continue
            if cur.stage == "acquire":
                stop(_Stop(_LEAK, s, cur.q, cur.rec))
            if cur.stage != "wait":
                continue
            rec = cur.rec
            c = int(rec["wait_counter"][cur.wait_k])
            expected = ((epoch + 1) * int(rec["wait_target"][cur.wait_k])) & 0xFFFFFFFF
            states[s].update(queue_index=cur.q, opcode=int(rec["opcode"]),
                             op_index=int(rec["op_index"]), counter=c, expected=expected,
                             observed=int(counters[c]), error=_TIMEOUT)
            if first is None:
                first = _Stop(_TIMEOUT, s, cur.q, rec, c, expected, int(counters[c]))
        if first is None:
            first = _Stop(_TIMEOUT, live[0], ld_next[live[0]], None)
        saved = {s: dict(states[s]) for s in live if states[s]["error"] == _TIMEOUT}
        try:
            stop(first)
        except _Stop as exc:
            for s, st in saved.items():   # every stuck SM keeps its own wait record
                exc.states[s] = st
            raise
    def _validate(self, s, q, rec, stop) -> None:
        """The device's mk_validate: opcode, page budget, counters, then the op's operand
        slots (every position of its mask must name a tensor, used or not: the device
        prefetches them all) and its record-only limits (OpDef.check_record)."""
        plan = self.plan
        opcode = int(rec["opcode"])
        op = BY_OPCODE.get(opcode)
        if op is None and opcode != abi.OP_NOP:
            stop(_Stop(abi.ERRORS["MK_ERR_BAD_OPCODE"], s, q, rec))
        if int(rec["pages"]) > plan.n_pages - plan.stream_pages:
            stop(_Stop(abi.ERRORS["MK_ERR_PAGES"], s, q, rec))
        bad = (int(rec["n_waits"]) > abi.MAX_WAITS or int(rec["n_signals"]) > abi.MAX_SIGNALS
               or any(int(rec["wait_counter"][k]) >= plan.n_counters
                      for k in range(min(int(rec["n_waits"]), abi.MAX_WAITS)))
               or any(int(rec["signal_counter"][k]) >= plan.n_counters
                      for k in range(min(int(rec["n_signals"]), abi.MAX_SIGNALS)))
               or (bool(abi.own_counter(rec))
                   and not 0 <= int(rec["out_row0"]) < plan.n_counters))
        if not bad and op is not None:
            slots = [int(rec["tensor"][k]) for k in range(abi.MAX_TENSORS)
                     if op.operand_mask >> k & 1]
            bad = (any(t >= len(plan.tensors) for t in slots)
                   or int(rec["pages"]) < op.min_pages(rec) or not op.check_record(rec)
                   # only flag_io ops know flagged words (the device's debug check)
                   or (not op.flag_io and any(plan.tensors[t].flagged for t in slots)))
        if bad:
            stop(_Stop(abi.ERRORS["MK_ERR_BAD_DESCRIPTOR"], s, q, rec))

    def _run_op(self, s, cur, rec, tensors, written) -> None:
        opcode = int(rec["opcode"])
        if opcode == abi.OP_NOP:
            return
        op = BY_OPCODE[opcode]
        with np.errstate(all="ignore"):
            if getattr(op, "uses_counters", False):
                reads = op.simulate(rec, tensors, counters=self.counters, epoch=self._epoch)
            else:
                reads = op.simulate(rec, tensors)
        self._check_reads(s, cur, rec, reads, written, "it read")
        out = int(rec["tensor"][abi.ARG_OUT])
        if out in self._flag_words:
            # the op's stores carry this run's stamp, one store per word per run
            r0, r1, c0, c1 = op.written(rec)
            stamps = self._flag_words[out][1][r0:r1, c0:c1]
            if (stamps == self.stamp).any():
                raise MegakernelError(
                    f"sim: race on SM {s}, queue index {cur.q} ({self._label(rec)}): it "
                    f"writes flagged words of tensor slot {out} (rows {r0}:{r1}, cols "
                    f"{c0}:{c1}) that this run already wrote (one store per word per run)")
            stamps[...] = self.stamp

    def _flag_pending(self, rec, tensors):
        """(slot, stamp seen) of the first flagged word the record will read that does not
        carry this run's stamp yet; None when all do (or it reads none)."""
        if not self._flag_words:
            return None
        op = BY_OPCODE.get(int(rec["opcode"]))
        if op is None or not op.flag_io:
            return None
        for arg, r0, r1, c0, c1 in op.reads(rec, tensors):
            slot = int(rec["tensor"][arg])
            if slot in self._flag_words:
                stamps = self._flag_words[slot][1][r0:r1, c0:c1]
                stale = stamps != self.stamp
                if stale.any():
                    return slot, int(stamps[stale][0])
        return None

    def _check_reads(self, s, cur, rec, reads, written, how: str) -> None:
        """Every region read was completely written before (graph inputs always are);
        flagged words, in this run."""
        for arg, r0, r1, c0, c1 in reads:
            slot = int(rec["tensor"][arg])
            if slot in self._flag_words:
                stamps = self._flag_words[slot][1][r0:r1, c0:c1]
                if (stamps != self.stamp).any():
                    raise MegakernelError(
                        f"sim: race on SM {s}, queue index {cur.q} ({self._label(rec)}): "
                        f"{how} flagged words of tensor slot {slot} (rows {r0}:{r1}, cols "
                        f"{c0}:{c1}) that do not carry this run's stamp {self.stamp} (stale: "
                        f"read without polling them)")
                continue
            w = written[slot]
            if w is not None and not w[r0:r1, c0:c1].all():
                raise MegakernelError(
                    f"sim: race on SM {s}, queue index {cur.q} ({self._label(rec)}): {how} "
                    f"rows {r0}:{r1}, cols {c0}:{c1} of tensor slot {int(rec['tensor'][arg])} "
                    f"before they were all written (a missing dependency)")

    @staticmethod
    def _mark_written(rec, written) -> None:
        if int(rec["opcode"]) == abi.OP_NOP:
            return
        w = written[int(rec["tensor"][abi.ARG_OUT])]
        if w is not None:
            r0, r1, c0, c1 = BY_OPCODE[int(rec["opcode"])].written(rec)
            w[r0:r1, c0:c1] = True
