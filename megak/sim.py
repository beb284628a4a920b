"""The CPU simulator: the living definition of every opcode and of the scheduling protocol.

It executes the *encoded* per-SM queues (the bytes the GPU gets), one SM step at a time, in
round-robin or seeded random order. Each SM has two instruction slots::

    fetch -> wait (counters) -> acquire pages -> [run -> release -> signal]
             ^ the next instruction may get this far while the current one runs

Counters persist across runs with epochs, like the device's. When no SM can move, that is a
hang: MegakernelHang carries the record the GPU writes (SM, queue index, opcode, counter,
expected, observed). It also checks what the GPU cannot cheaply check: every region an
instruction reads was completely written first (a missing dependency is an error here, not
a flaky result), and every page is released exactly once.
"""
from __future__ import annotations

import numpy as np

from . import abi
from .dtypes import numpy_dtype
from .errors import MegakernelError, raise_for_status
from .ops import BY_OPCODE
from .plan import Plan

_OK = abi.ERRORS["MK_OK"]
_TIMEOUT = abi.ERRORS["MK_ERR_TIMEOUT"]
_ABORTED = abi.ERRORS["MK_ERR_ABORTED"]


class _Slot:
    __slots__ = ("q", "instr", "phase", "pages", "wait_k")

    def __init__(self, q, instr):
        self.q = q
        self.instr = instr
        self.phase = "wait"   # -> "acquire" -> "ready"
        self.pages: list[int] = []
        self.wait_k = 0


class _Stop(Exception):
    def __init__(self, code, sm, q, instr, counter=0, expected=0, observed=0):
        super().__init__(code)
        self.fields = dict(error=code, sm=sm, queue_index=q,
                           opcode=int(instr["opcode"]) if instr is not None else 0,
                           op_index=int(instr["op_index"]) if instr is not None else 0,
                           counter=counter, expected=expected, observed=observed)


class SimExecutor:
    """Runs a Plan on the CPU. ``order``: "round_robin" or "random" (seeded by ``seed``)."""

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
        self.last_peak_pages: list[int] = []

    def _reset_counters(self) -> None:
        # a failed run leaves counters part-way: start the next one from zero, as the GPU does
        self.counters[:] = 0
        self.epoch = 0

    def reload_queues(self) -> None:
        """Nothing to upload on the CPU: the plan's records are read at each run."""

    def close(self) -> None:
        pass

    # -- one run ----------------------------------------------------------------------------
    def run(self, inputs: dict[int, np.ndarray], outputs: list[int],
            trace: bool = False) -> dict[int, np.ndarray]:
        """Execute the plan; with ``trace``, ``self.last_trace_events`` holds one
        abi.TRACE_DTYPE record per instruction (queue order), in logical steps."""
        plan = self.plan
        data = abi.encode(plan.instrs)          # execute the bytes, not the Python objects
        instrs = abi.decode(data)
        tensors = []
        written = []
        for slot in plan.tensors:
            dtype = numpy_dtype(slot.dtype)
            if slot.slot in inputs:
                tensors.append(np.array(inputs[slot.slot], dtype=dtype, copy=True)
                               .reshape(slot.shape))
                written.append(None)
            else:
                tensors.append(np.full(slot.shape, np.nan, dtype=dtype))  # poison
                written.append(np.zeros(slot.shape, dtype=bool))
        self._events = np.zeros(len(instrs), dtype=abi.TRACE_DTYPE) if trace else None
        try:
            self._execute(instrs, tensors, written)
        except _Stop as stop:
            self._reset_counters()
            raise_for_status(stop.fields, stop.states, plan.op_labels, plan.instrs,
                             plan.queue_start, backend="sim")
        except MegakernelError:
            self._reset_counters()
            raise
        self.epoch += 1
        self.last_trace_events = self._events
        return {s: tensors[s].copy() for s in outputs}

    def _execute(self, instrs, tensors, written) -> None:
        plan = self.plan
        n_sm = plan.n_sm
        qs = plan.queue_start.astype(np.int64)
        queues = [instrs[qs[s]:qs[s + 1]] for s in range(n_sm)]
        nxt = [0] * n_sm
        slots: list[list[_Slot]] = [[] for _ in range(n_sm)]
        free_pages = [list(range(plan.n_pages)) for _ in range(n_sm)]
        peak = [0] * n_sm
        done = [len(queues[s]) == 0 for s in range(n_sm)]
        epoch = self.epoch
        counters = self.counters
        states = [dict(queue_index=0, opcode=0, op_index=0, counter=0, expected=0,
                       observed=0, error=_OK, pad=0) for _ in range(n_sm)]

        def stop(exc: _Stop):
            for s in range(n_sm):
                if not done[s]:
                    cur = slots[s][0] if slots[s] else None
                    states[s].update(queue_index=cur.q if cur else nxt[s], error=_ABORTED)
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

        def mark(s: int, cur: _Slot, which: str, extra: int = 0) -> None:
            if events is not None:
                e = events[qs[s] + cur.q]
                e["t"][phase[which]] = clock[0] + extra

        def step(s: int) -> bool:
            """One transition of SM s; False when it cannot move."""
            sl = slots[s]
            # fetch into a free slot
            if len(sl) < 2 and nxt[s] < len(queues[s]):
                rec = queues[s][nxt[s]]
                self._validate(s, nxt[s], rec, stop)
                sl.append(_Slot(nxt[s], rec))
                if events is not None:
                    e = events[qs[s] + nxt[s]]
                    e["queue_index"], e["sm"], e["slot"] = nxt[s], s, nxt[s] % 2
                    e["opcode"], e["op_index"] = rec["opcode"], rec["op_index"]
                mark(s, sl[-1], "MK_T_FETCH")
                nxt[s] += 1
                return True
            for k, cur in enumerate(sl):
                rec = cur.instr
                if cur.phase == "wait":
                    while cur.wait_k < int(rec["n_waits"]):
                        c = int(rec["wait_counter"][cur.wait_k])
                        target = ((epoch + 1) * int(rec["wait_target"][cur.wait_k])) & 0xFFFFFFFF
                        diff = (int(counters[c]) - target) & 0xFFFFFFFF
                        if diff >= 0x80000000:
                            break
                        cur.wait_k += 1
                    else:
                        cur.phase = "acquire"
                        # end of the round: a signal seen now may come from a store this round
                        mark(s, cur, "MK_T_WAITED", 3)
                        return True
                    continue
                if cur.phase == "acquire":
                    if k > 0 and sl[0].phase != "ready":
                        continue  # pages are acquired in queue order
                    need = int(rec["pages"])
                    if len(free_pages[s]) >= need:
                        cur.pages = [free_pages[s].pop(0) for _ in range(need)]
                        cur.phase = "ready"
                        held = sum(len(x.pages) for x in sl)
                        peak[s] = max(peak[s], held)
                        mark(s, cur, "MK_T_ACQUIRED")
                        if events is not None:
                            events[qs[s] + cur.q]["pages_in_use"] = held
                        return True
                    continue
                if cur.phase == "ready" and k == 0:
                    # an op is one step here; its load/compute/store boundaries split it
                    mark(s, cur, "MK_T_LOADED", 1)
                    self._run_op(s, cur, rec, tensors, written, stop)
                    mark(s, cur, "MK_T_COMPUTED", 2)
                    mark(s, cur, "MK_T_STORED", 3)
                    release = cur.pages
                    if int(rec["flags"]) & abi.FLAG_DEBUG_LEAK_PAGE and release:
                        release = release[:-1]
                    free_pages[s].extend(release)
                    free_pages[s].sort()
                    for j in range(int(rec["n_signals"])):
                        c = int(rec["signal_counter"][j])
                        counters[c] = (int(counters[c]) + 1) & 0xFFFFFFFF
                    sl.pop(0)
                    if not sl and nxt[s] >= len(queues[s]):
                        if len(free_pages[s]) != plan.n_pages:
                            stop(_Stop(abi.ERRORS["MK_ERR_PAGE_LEAK"], s, cur.q, rec))
                        done[s] = True
                        states[s].update(queue_index=len(queues[s]), error=_OK)
                    return True
            return False

        rounds = 0
        while not all(done):
            # logical time: every live SM makes at most one transition per round; a round is
            # 4 ticks so an op's load/compute/store boundaries fall inside its round
            clock[0] = 4 * rounds
            rounds += 1
            live = [s for s in range(n_sm) if not done[s]]
            if self.order == "random":
                self.rng.shuffle(live)
            moved = False
            for s in live:
                moved |= step(s)
            if not moved:
                self._report_hang(live, slots, queues, nxt, free_pages, epoch, states, stop)
        self.last_peak_pages = peak

    def _report_hang(self, live, slots, queues, nxt, free_pages, epoch, states, stop):
        counters = self.counters
        first = None
        for s in live:
            sl = slots[s]
            cur = next((x for x in sl if x.phase == "wait"), None)
            if cur is None:
                # blocked on pages that nobody will release: a leak
                head = sl[0]
                if head.phase == "acquire":
                    stop(_Stop(abi.ERRORS["MK_ERR_PAGE_LEAK"], s, head.q, head.instr))
                continue
            rec = cur.instr
            c = int(rec["wait_counter"][cur.wait_k])
            expected = ((epoch + 1) * int(rec["wait_target"][cur.wait_k])) & 0xFFFFFFFF
            states[s].update(queue_index=cur.q, opcode=int(rec["opcode"]),
                             op_index=int(rec["op_index"]), counter=c, expected=expected,
                             observed=int(counters[c]), error=_TIMEOUT)
            if first is None:
                first = _Stop(_TIMEOUT, s, cur.q, rec, c, expected, int(counters[c]))
        if first is None:
            first = _Stop(_TIMEOUT, live[0], nxt[live[0]], None)
        saved = {s: dict(states[s]) for s in live if states[s]["error"] == _TIMEOUT}
        try:
            stop(first)
        except _Stop as exc:
            for s, st in saved.items():   # every stuck SM keeps its own wait record
                exc.states[s] = st
            raise

    def _validate(self, s, q, rec, stop) -> None:
        plan = self.plan
        if int(rec["opcode"]) not in BY_OPCODE and int(rec["opcode"]) != abi.OP_NOP:
            stop(_Stop(abi.ERRORS["MK_ERR_BAD_OPCODE"], s, q, rec))
        if int(rec["pages"]) > plan.n_pages:
            stop(_Stop(abi.ERRORS["MK_ERR_PAGES"], s, q, rec))
        bad = (int(rec["n_waits"]) > abi.MAX_WAITS or int(rec["n_signals"]) > abi.MAX_SIGNALS
               or any(int(rec["wait_counter"][k]) >= plan.n_counters
                      for k in range(min(int(rec["n_waits"]), abi.MAX_WAITS)))
               or any(int(rec["signal_counter"][k]) >= plan.n_counters
                      for k in range(min(int(rec["n_signals"]), abi.MAX_SIGNALS))))
        if not bad and int(rec["opcode"]) != abi.OP_NOP:
            used = [abi.ARG_A, abi.ARG_OUT]
            if int(rec["opcode"]) in (abi.OP_GEMM, abi.OPCODES["MK_OP_REDUCE"]):
                # every operand slot is checked, used by the epilogue or not (as the device
                # does: it prefetches all the op's descriptors)
                used += [abi.ARG_BIAS, abi.ARG_RESIDUAL]
                if int(rec["opcode"]) == abi.OP_GEMM:
                    used.append(abi.ARG_B)
                act = (int(rec["flags"]) & abi.FLAG_ACT_MASK) >> abi.FLAG_ACT_SHIFT
                bad = act not in abi.ACTIVATIONS.values() or int(rec["out_row0"]) < 0
            bad = bad or any(int(rec["tensor"][k]) >= len(plan.tensors) for k in used)
        if bad:
            stop(_Stop(abi.ERRORS["MK_ERR_BAD_DESCRIPTOR"], s, q, rec))

    def _run_op(self, s, cur, rec, tensors, written, stop) -> None:
        opcode = int(rec["opcode"])
        if opcode == abi.OP_NOP:
            return
        module = BY_OPCODE[opcode]
        out_slot = int(rec["tensor"][abi.ARG_OUT])
        # reads must come after their writes: check before running
        with np.errstate(all="ignore"):
            reads = module.simulate(rec, tensors)
        for arg, r0, r1, c0, c1 in reads:
            w = written[int(rec["tensor"][arg])]
            if w is not None and not w[r0:r1, c0:c1].all():
                raise MegakernelError(
                    f"sim: race on SM {s}, queue index {cur.q} "
                    f"({self.plan.op_labels[int(rec['op_index'])]}): it read rows {r0}:{r1}, "
                    f"cols {c0}:{c1} of tensor slot {int(rec['tensor'][arg])} before they were "
                    f"all written (a missing dependency)")
        r0, c0 = int(rec["out_row0"]), int(rec["col0"])
        if written[out_slot] is not None:
            written[out_slot][r0:r0 + int(rec["rows"]), c0:c0 + int(rec["cols"])] = True
