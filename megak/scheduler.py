"""From a validated graph to per-SM instruction queues.

0. from graph ops to lowering units: drop the ops no output depends on, fold ops into their
   producer's epilogue where the op allows it (OpDef.fuse), expand each into its units
   (OpDef.expand: split-K, bands); refuse a graph whose tensors do not fit the memory or whose
   instruction count passes MAX_INSTRUCTIONS, before lowering anything;
1. lower every unit into tile instructions (OpDef.lower, megak/ops/<op>.py);
2. wire dependencies at tile granularity: an instruction waits only on counters signalled by
   the producer tiles that wrote the region it reads. Counters come at four levels per
   producer op, allocated only where some consumer uses them::

       tile     one per producer instruction                 target 1
       row      one per row band of the producer's grid      target = tiles in the band
       col      one per column band                          target = tiles in the band
       op       one for the whole producer op                target = its instruction count

   A consumer uses the finest level whose wait count fits in MK_MAX_WAITS (a GEMM tile
   reading a 128-row band of a GEMM output waits on one row counter, not K/128 tiles).
   Small fp32 intermediates between ops that can poll them (flagged_tensors) carry their
   own flags instead (device/flag.cuh): their edges have no counters in the records;
3. place instructions on SMs by list scheduling: op by op in topological order, and inside
   an op in its lowering's placement order (Lowered.placement: a GEMM's grouped tile order),
   each goes to the SM that frees up first, so queue order follows a topological order of
   the dependency graph (an op's instructions do not depend on each other) and the schedule
   is deadlock-free by construction;
4. check it anyway (`check_deadlock_free`), from the encoded records alone.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from . import abi, pages
from .dtypes import ITEMSIZE
from .errors import GraphError, fmt_bytes
from .graph import Graph
from .ops import REGISTRY
from .ops.base import ExpandContext, Hidden, Unit
from .plan import Plan, TensorSlot

LEVELS = ("tile", "row", "col", "op")
HANDOFF_NS = 500.0  # a cross-SM acquire/release hand-off, measured on an H200


@dataclass
class _CounterBlock:
    base: int
    count: int
    target: np.ndarray  # per counter of the block


def _bands(edges_: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the first and last band of `edges_` overlapping [lo, hi)."""
    first = np.searchsorted(edges_, lo, side="right") - 1
    last = np.searchsorted(edges_, hi - 1, side="right") - 1
    return first, last


# A compiled program's records live in host and device memory (128 B each): past this many,
# compile refuses (16M instructions = 2 GiB of records) instead of lowering for minutes.
MAX_INSTRUCTIONS = 1 << 24


def build_plan(graph: Graph, n_sm: int, n_pages: int = pages.DEFAULT_PAGES,
               memory_bytes: int | None = None, data_flags: bool = True,
               weight_stream: bool = True) -> Plan:
    """Lower, place and check `graph` for `n_sm` SMs of `n_pages` pages each; refuse it when
    its tensors need more than `memory_bytes` (default: this host's physical memory).
    `data_flags`: small intermediates between flag_io ops carry their own flags
    (flagged_tensors) instead of counters. `weight_stream`: skinny GEMMs with input weights
    stream them (ExpandContext.weight_stream)."""
    graph.validate()
    if n_sm < 1:
        raise GraphError(f"n_sm must be >= 1, got {n_sm}")
    units, hidden, dropped = lowering_units(graph, n_sm, n_pages, weight_stream)
    check_size(graph, units, hidden, host_memory_bytes() if memory_bytes is None
               else memory_bytes)
    producer = {u.output.index: u.index for u in units}   # tensor slot -> unit writing it
    lowered = []
    for op in units:
        low = REGISTRY[op.kind].lower(op)
        pages.check_page_needs(low.pages, n_pages, op.label)
        lowered.append(low)
    outputs = {t.index for t in graph.outputs.values()}
    flagged = flagged_tensors(units, lowered, outputs) if data_flags else set()

    counts = np.array([low.n for low in lowered], dtype=np.int64)
    op_start = np.concatenate([[0], np.cumsum(counts)])
    total = int(op_start[-1])
    ins = abi.empty_instrs(total)

    # 1. per-instruction fields straight from each op's lowering
    for op, low in zip(units, lowered):
        s = slice(op_start[op.index], op_start[op.index + 1])
        rec = ins[s]
        rec["opcode"] = low.opcode
        rec["pages"] = low.pages
        rec["op_index"] = op.index
        tensor = np.zeros(abi.MAX_TENSORS, dtype=np.uint32)
        tensor[abi.ARG_OUT] = op.output.index
        positions = low.operands or list(range(len(op.inputs)))
        for pos, t in zip(positions, op.inputs):
            tensor[pos] = t.index
        rec["tensor"] = tensor
        rec["flags"] = low.flags
        early = REGISTRY[op.kind].early_operand
        if early is not None and op.inputs[early].index not in producer:
            # that operand is a graph input (weights): the loader may fetch it before the waits
            rec["flags"] = low.flags | abi.FLAG_B_READY
        row0, rows, col0, cols = low.tile_regions()
        rec["row0"], rec["rows"], rec["col0"], rec["cols"] = row0, rows, col0, cols
        rec["out_row0"] = row0
        for key, value in low.extra.items():
            rec[key] = value

    # 2. dependencies. The edges out of a flagged tensor's producer get counters too, but in a
    # separate numbering (from VIRTUAL): placement and the deadlock check see every edge; the
    # records keep only the real counters (flagged words are their own signal).
    blocks: dict[tuple[int, str], _CounterBlock] = {}
    n_counters = 0
    n_virtual = 0

    def counter_block(producer: int, level: str) -> _CounterBlock:
        nonlocal n_counters, n_virtual
        key = (producer, level)
        if key not in blocks:
            p = lowered[producer]
            nr, nc = p.n_row_tiles, p.n_col_tiles
            if level == "tile":
                target = np.ones(nr * nc, dtype=np.int64)
            elif level == "row":
                target = np.full(nr, nc, dtype=np.int64)
            elif level == "col":
                target = np.full(nc, nr, dtype=np.int64)
            else:
                target = np.array([nr * nc], dtype=np.int64)
            if units[producer].output.index in flagged:
                blocks[key] = _CounterBlock(VIRTUAL + n_virtual, len(target), target)
                n_virtual += len(target)
            else:
                blocks[key] = _CounterBlock(n_counters, len(target), target)
                n_counters += len(target)
        return blocks[key]

    n_waits = np.zeros(total, dtype=np.int64)
    for op, low in zip(units, lowered):
        s = slice(op_start[op.index], op_start[op.index + 1])
        produced = [(j, t) for j, t in enumerate(op.inputs) if t.index in producer]
        used = 0
        for pos, (j, t) in enumerate(produced):
            p = lowered[producer[t.index]]
            reg = low.reads[j]
            rb0, rb1 = _bands(p.row_edges, reg.r0, reg.r1)
            cb0, cb1 = _bands(p.col_edges, reg.c0, reg.c1)
            nrb, ncb = rb1 - rb0 + 1, cb1 - cb0 + 1
            avail = abi.MAX_WAITS - used - (len(produced) - pos - 1)
            options = {"tile": int((nrb * ncb).max()), "row": int(nrb.max()),
                       "col": int(ncb.max()), "op": 1}
            allowed = p.wait_levels or LEVELS
            level = next(lv for lv in LEVELS if lv in allowed and options[lv] <= avail)
            blk = counter_block(producer[t.index], level)
            waits = _wait_lists(level, blk, p.n_col_tiles, rb0, nrb, cb0, ncb)
            rec = ins[s]
            for cid, mask in waits:
                slot = n_waits[s][mask]
                idx = np.nonzero(mask)[0]
                wc = rec["wait_counter"]
                wt = rec["wait_target"]
                wc[idx, slot] = cid[mask]
                wt[idx, slot] = blk.target[cid[mask] - blk.base]
                rec["wait_counter"] = wc
                rec["wait_target"] = wt
                n_waits[s.start + idx] += 1
            used += options[level]
    ins["n_waits"] = n_waits

    # counters an op's instructions add to and never wait on (no signals): a streamed GEMM
    # band's combine (every part adds one per run; the last to add runs the epilogue), a
    # copy's hand-out (a run adds bands + 8 x takers); their targets keep the epoch wrap
    combine_targets = []
    for op, low in zip(units, lowered):
        if low.combine is None:
            continue
        s = slice(op_start[op.index], op_start[op.index + 1])
        groups = int(low.combine.max()) + 1
        ins["out_row0"][s] = n_counters + low.combine
        adds = (np.bincount(low.combine, minlength=groups) if low.combine_adds is None
                else np.asarray(low.combine_adds, dtype=np.int64))
        combine_targets.append((n_counters, adds))
        n_counters += groups

    # the virtual counters after every real one: real ids never move
    n_real = n_counters
    for blk in blocks.values():
        if blk.base >= VIRTUAL:
            blk.base += n_real - VIRTUAL
    wc = ins["wait_counter"]
    ins["wait_counter"] = np.where(wc >= VIRTUAL, wc - VIRTUAL + n_real, wc)
    n_counters = n_real + n_virtual

    # signals: each producer instruction signals the counters of every level someone uses
    n_sig = np.zeros(total, dtype=np.int64)
    for (unit, level), blk in sorted(blocks.items(), key=lambda kv: kv[1].base):
        p = lowered[unit]
        s = slice(op_start[unit], op_start[unit + 1])
        local = np.arange(p.n)
        if level == "tile":
            cid = local
        elif level == "row":
            cid = local // p.n_col_tiles
        elif level == "col":
            cid = local % p.n_col_tiles
        else:
            cid = np.zeros(p.n, dtype=np.int64)
        sc = ins["signal_counter"][s]
        sc[np.arange(p.n), n_sig[s]] = blk.base + cid
        ins["signal_counter"][s] = sc
        n_sig[s] += 1
    ins["n_signals"] = n_sig

    counter_targets = np.zeros(n_counters, dtype=np.uint32)
    for blk in blocks.values():
        counter_targets[blk.base:blk.base + blk.count] = blk.target
    for base, parts in combine_targets:
        counter_targets[base:base + len(parts)] = parts

    # 3. placement
    cost = np.concatenate([low.cost_ns for low in lowered]) if total else np.zeros(0)
    placement = np.concatenate(
        [op_start[op.index] + (np.arange(low.n) if low.placement is None else low.placement)
         for op, low in zip(units, lowered)]) if total else np.zeros(0, dtype=np.int64)
    sm = _place(ins, cost, n_sm, n_counters, placement)
    position = np.empty(total, dtype=np.int64)   # of each instruction in the placement order
    position[placement] = np.arange(total)
    order = np.lexsort((position, sm))
    ins = ins[order]
    queue_start = np.searchsorted(sm[order], np.arange(n_sm + 1)).astype(np.uint32)
    rank = position[order]  # a topological index of each queued instruction

    # a tensor no unit writes (a dropped op's, or one fused away) gets no memory; hidden
    # inputs (a streamed GEMM's partials) are written by the unit that reads them
    written = {u.output.index for u in units}
    written |= {t.index for u in units for t in u.inputs if isinstance(t, Hidden)}
    tensors = [TensorSlot(t.index, t.name or f"t{t.index}", t.rows, t.cols, t.dtype,
                          "input" if t.producer is None
                          else "intermediate" if t.index in written else "unused",
                          flagged=t.index in flagged)
               for t in list(graph.tensors) + hidden]
    plan = Plan(
        instrs=ins, queue_start=queue_start, tensors=tensors, n_counters=n_counters,
        n_sm=n_sm, n_pages=n_pages, op_labels=[op.label for op in units],
        inputs={name: t.index for name, t in graph.inputs.items()},
        outputs={name: t.index for name, t in graph.outputs.items()},
        input_shapes={name: (t.shape, t.dtype) for name, t in graph.inputs.items()},
        output_shapes={name: t.shape for name, t in graph.outputs.items()},
        counter_targets=counter_targets,
        op_kinds=[op.kind for op in units],
        op_flops=[low.flops for low in lowered],
        op_bytes=[low.bytes for low in lowered],
        op_dtypes=[op.inputs[0].dtype for op in units],
        dropped_ops=dropped,
        stream_pages=stream_pages(ins, n_pages),
        constant_values=dict(graph.constant_values),
    )
    check_deadlock_free(plan, rank=rank)
    if n_virtual:
        # proven deadlock-free with the flagged edges; now the records lose them (fewer
        # edges cannot make a cycle, and every real counter keeps its signals and waits)
        drop_counters_from(plan.instrs, n_real)
        plan.n_counters = n_real
        plan.counter_targets = counter_targets[:n_real].copy()
    return plan


# Data as its own flag (device/flag.cuh) is for small tensors read by few instructions: each
# reader polls every word it needs, 8 bytes per element, so past these sizes the counter's
# one signal per tile is the cheaper hand-off.
FLAG_MAX_ELEMENTS = 8192
FLAG_MAX_READERS = 16
VIRTUAL = 1 << 30   # counter ids of flagged edges while the plan is built (see build_plan)


def flagged_tensors(units: list[Unit], lowered: list, outputs: set[int]) -> set[int]:
    """Tensor slots to hold as data that is its own flag: fp32 intermediates (not graph
    outputs, not hidden) of at most FLAG_MAX_ELEMENTS elements, written by a flag_io unit and
    read only by flag_io units, at most FLAG_MAX_READERS instructions in all."""
    readers: dict[int, set[int]] = {}
    for u in units:
        for t in u.inputs:
            readers.setdefault(t.index, set()).add(u.index)
    out = set()
    for u in units:
        t = u.output
        if (not REGISTRY[u.kind].flag_io or isinstance(t, Hidden) or t.index in outputs
                or t.dtype != "float32" or t.rows * t.cols > FLAG_MAX_ELEMENTS):
            continue
        rs = readers.get(t.index)
        if (rs and all(REGISTRY[units[r].kind].flag_io for r in rs)
                and sum(lowered[r].n for r in rs) <= FLAG_MAX_READERS):
            out.add(t.index)
    return out


def drop_counters_from(ins: np.ndarray, first: int) -> None:
    """Remove every wait on and signal of a counter >= `first` from the records, in place,
    keeping the order of the others."""
    for ids, count, width, targets in (("wait_counter", "n_waits", abi.MAX_WAITS, "wait_target"),
                                       ("signal_counter", "n_signals", abi.MAX_SIGNALS, None)):
        c = ins[ids].astype(np.int64)
        keep = (np.arange(width)[None, :] < ins[count].astype(np.int64)[:, None]) & (c < first)
        order = np.argsort(~keep, axis=1, kind="stable")   # kept entries first, in order
        kept = np.take_along_axis(keep, order, axis=1)
        ins[ids] = np.where(kept, np.take_along_axis(c, order, axis=1), 0)
        if targets is not None:
            t = ins[targets].astype(np.int64)
            ins[targets] = np.where(kept, np.take_along_axis(t, order, axis=1), 0)
        ins[count] = keep.sum(axis=1)


def stream_pages(ins: np.ndarray, n_pages: int) -> int:
    """Pages of each block's weight ring (pages.ring_pages); 0 when nothing streams."""
    if len(ins) == 0 or not (ins["flags"] & abi.FLAG_STREAM).any():
        return 0
    return pages.ring_pages(n_pages, int(ins["pages"].max()))


def lowering_units(graph: Graph, n_sm: int, n_pages: int = pages.DEFAULT_PAGES,
                   weight_stream: bool = True):
    """Graph ops -> the units the ops lower, the hidden tensors they add, and the labels of
    the ops dropped because no output depends on them."""
    live = _live_ops(graph)
    dropped = [op.label for op in graph.ops if op.index not in live]
    readers: dict[int, int] = {}
    for op in graph.ops:
        if op.index in live:
            for t in op.inputs:
                readers[t.index] = readers.get(t.index, 0) + 1
    outputs = {t.index for t in graph.outputs.values()}
    units: list[Unit | None] = []      # None: a unit fused into a later position
    writer: dict[int, int] = {}        # tensor index -> position in units
    for op in graph.ops:
        if op.index not in live:
            continue
        spec = REGISTRY[op.kind]
        fused = None
        for pos, t in enumerate(op.inputs):
            at = writer.get(t.index)
            if at is None or readers[t.index] != 1 or t.index in outputs:
                continue
            fused = spec.fuse(op, units[at], pos)
            if fused is not None:
                del writer[t.index]
                # Units stay in a topological order (placement and the queues follow it): the
                # fused unit now also reads the op's other operands, and where one of them is
                # written after the producer (x@w1 + x@w2), it moves to the op's place.
                if any(writer.get(u.index, -1) > at for u in fused.inputs):
                    units[at] = None
                    at = len(units)
                    units.append(fused)
                else:
                    units[at] = fused
                writer[op.output.index] = at
                break
        if fused is None:
            writer[op.output.index] = len(units)
            units.append(Unit.of(op))
    ctx = ExpandContext(n_sm=n_sm, first_hidden=len(graph.tensors), n_pages=n_pages,
                        weight_stream=weight_stream, readers=readers)
    expanded = [part for u in units if u is not None
                for part in REGISTRY[u.kind].expand(u, ctx)]
    return [u.with_(index=i) for i, u in enumerate(expanded)], ctx.hidden, dropped


def _live_ops(graph: Graph) -> set[int]:
    """Indices of the ops some output depends on."""
    live: set[int] = set()
    stack = [t.producer for t in graph.outputs.values() if t.producer is not None]
    while stack:
        i = stack.pop()
        if i in live:
            continue
        live.add(i)
        stack.extend(t.producer for t in graph.ops[i].inputs if t.producer is not None)
    return live


def tensor_bytes(t) -> int:
    """Bytes of one tensor as megak holds it (rows padded to MK_TENSOR_ALIGN_BYTES)."""
    row = -(-ITEMSIZE[t.dtype] * t.cols // abi.TENSOR_ALIGN_BYTES) * abi.TENSOR_ALIGN_BYTES
    return t.rows * row


def host_memory_bytes() -> int:
    """Physical memory of this host (the simulator's tensors live there)."""
    import os
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def check_size(graph: Graph, units: list[Unit], hidden: list, memory_bytes: int) -> None:
    """Refuse, before lowering, a graph too big to run: tensors beyond `memory_bytes`, or more
    than MAX_INSTRUCTIONS instructions. Cheap: sizes and counts, no records."""
    used = {t.index for u in units for t in u.inputs} | {u.output.index for u in units}
    need = sum(tensor_bytes(t) for t in list(graph.tensors) + list(hidden) if t.index in used)
    if need > memory_bytes:
        biggest = max((t for t in graph.tensors if t.index in used), key=tensor_bytes)
        raise GraphError(
            f"the graph's tensors need {fmt_bytes(need)} but {fmt_bytes(memory_bytes)} are "
            f"available (largest: {biggest!r}, {fmt_bytes(tensor_bytes(biggest))})")
    total = 0
    for u in units:
        total += REGISTRY[u.kind].count(u)
        if total > MAX_INSTRUCTIONS:
            raise GraphError(
                f"the graph lowers to more than {MAX_INSTRUCTIONS:,} instructions (the cap: "
                f"{MAX_INSTRUCTIONS * abi.INSTR_BYTES / 2**30:.0f} GiB of records); "
                f"{u.label} alone makes {REGISTRY[u.kind].count(u):,}")


def _wait_lists(level, blk, p_cols, rb0, nrb, cb0, ncb):
    """(counter ids, mask) pairs: the k-th wait of each consumer instruction at `level`."""
    out = []
    if level == "tile":
        for dr in range(int(nrb.max())):
            for dc in range(int(ncb.max())):
                mask = (dr < nrb) & (dc < ncb)
                out.append((blk.base + (rb0 + dr) * p_cols + (cb0 + dc), mask))
    elif level == "row":
        for dr in range(int(nrb.max())):
            out.append((blk.base + rb0 + dr, dr < nrb))
    elif level == "col":
        for dc in range(int(ncb.max())):
            out.append((blk.base + cb0 + dc, dc < ncb))
    else:
        out.append((np.full(len(rb0), blk.base), np.ones(len(rb0), dtype=bool)))
    return out


def _place(ins: np.ndarray, cost: np.ndarray, n_sm: int, n_counters: int,
           placement: np.ndarray) -> np.ndarray:
    """List scheduling in the order `placement` (instruction indices, a topological order):
    each instruction goes to the SM that frees first; it starts when that SM is free and its
    counters are complete (+ a hand-off)."""
    total = len(ins)
    sm_of = np.empty(total, dtype=np.int64)
    ready_of_counter = [0.0] * max(n_counters, 1)
    free = [(0.0, s) for s in range(n_sm)]
    heapq.heapify(free)
    n_waits = ins["n_waits"].tolist()
    n_signals = ins["n_signals"].tolist()
    waits = ins["wait_counter"].tolist()
    signals = ins["signal_counter"].tolist()
    cost_l = cost.tolist()
    for i in placement.tolist():
        ready = 0.0
        for w in range(n_waits[i]):
            r = ready_of_counter[waits[i][w]]
            if r > ready:
                ready = r
        t_free, s = heapq.heappop(free)
        start = t_free if t_free > ready + HANDOFF_NS else ready + HANDOFF_NS
        if n_waits[i] == 0:
            start = t_free
        end = start + cost_l[i]
        heapq.heappush(free, (end, s))
        sm_of[i] = s
        for k in range(n_signals[i]):
            c = signals[i][k]
            if end > ready_of_counter[c]:
                ready_of_counter[c] = end
    return sm_of


def check_deadlock_free(plan: Plan, rank: np.ndarray | None = None) -> None:
    """Raise GraphError unless every counter's waits match its signals and the graph of
    queue order + dependency edges is acyclic (so no SM can wait forever).

    With `rank` (a candidate topological index per queued instruction) the check is
    vectorised; without it, or if the candidate fails, Kahn's algorithm finds the cycle.
    """
    ins = plan.instrs
    total = len(ins)
    nc = plan.n_counters
    # every counter: signals per run == every target that waits on it
    sig_mask = np.arange(abi.MAX_SIGNALS)[None, :] < ins["n_signals"][:, None]
    wait_mask = np.arange(abi.MAX_WAITS)[None, :] < ins["n_waits"][:, None]
    sig_c = ins["signal_counter"][sig_mask].astype(np.int64)
    wait_c = ins["wait_counter"][wait_mask].astype(np.int64)
    wait_t = ins["wait_target"][wait_mask].astype(np.int64)
    if (sig_c >= nc).any() or (wait_c >= nc).any():
        raise GraphError(f"schedule names a counter >= n_counters ({nc})")
    signals_per_counter = np.bincount(sig_c, minlength=nc)
    bad = np.nonzero(signals_per_counter[wait_c] != wait_t)[0]
    if len(bad):
        c = int(wait_c[bad[0]])
        raise GraphError(f"deadlock: a wait on counter {c} expects {int(wait_t[bad[0]])} "
                         f"signals per run but {int(signals_per_counter[c])} instructions "
                         f"signal it")
    if rank is not None and total:
        rank = np.asarray(rank, dtype=np.int64)
        sig_owner = np.nonzero(sig_mask)[0]
        wait_owner = np.nonzero(wait_mask)[0]
        last_producer = np.full(nc, -1, dtype=np.int64)
        np.maximum.at(last_producer, sig_c, rank[sig_owner])
        deps_ok = (last_producer[wait_c] < rank[wait_owner]).all()
        qs = plan.queue_start.astype(np.int64)
        same_queue = np.ones(total - 1, dtype=bool)
        same_queue[qs[1:-1][(qs[1:-1] > 0) & (qs[1:-1] < total)] - 1] = False
        queue_ok = (np.diff(rank)[same_queue] > 0).all() if total > 1 else True
        if deps_ok and queue_ok:
            return
    _kahn(plan)


def _kahn(plan: Plan) -> None:
    ins = plan.instrs
    total = len(ins)
    qs = plan.queue_start.astype(np.int64)
    queue_of = np.searchsorted(qs, np.arange(total), side="right") - 1
    signalers: dict[int, list[int]] = {}
    for i in range(total):
        for k in range(int(ins["n_signals"][i])):
            signalers.setdefault(int(ins["signal_counter"][i][k]), []).append(i)
    # nodes: instructions 0..total-1, counters total..total+nc-1
    indeg = [0] * (total + plan.n_counters)
    succ: list[list[int]] = [[] for _ in range(total + plan.n_counters)]
    for i in range(total):
        for k in range(int(ins["n_signals"][i])):
            c = total + int(ins["signal_counter"][i][k])
            succ[i].append(c)
            indeg[c] += 1
        for k in range(int(ins["n_waits"][i])):
            c = total + int(ins["wait_counter"][i][k])
            succ[c].append(i)
            indeg[i] += 1
        if i + 1 < total and queue_of[i + 1] == queue_of[i]:
            succ[i].append(i + 1)
            indeg[i + 1] += 1
    stack = [n for n in range(len(indeg)) if indeg[n] == 0]
    seen = 0
    while stack:
        n = stack.pop()
        seen += 1
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                stack.append(m)
    if seen == len(indeg):
        return
    stuck = [i for i in range(total) if indeg[i] > 0]
    i = stuck[0]
    sm = int(queue_of[i])
    desc = []
    for k in range(int(ins["n_waits"][i])):
        c = int(ins["wait_counter"][i][k])
        if indeg[total + c] > 0 or any(indeg[p] > 0 for p in signalers.get(c, [])):
            who = [(int(queue_of[p]), p - int(qs[queue_of[p]])) for p in signalers.get(c, [])
                   if indeg[p] > 0][:4]
            desc.append(f"counter {c} (signalled by SM/queue-index {who})")
    label = plan.op_labels[int(ins["op_index"][i])] if plan.op_labels else ""
    raise GraphError(f"deadlock: queue order and dependencies form a cycle; SM {sm} queue "
                     f"index {i - int(qs[sm])} ({label}) can never run: it waits on "
                     f"{', '.join(desc) or 'an earlier blocked instruction in its queue'}; "
                     f"{len(stuck)} instructions blocked in all")


def stats(plan: Plan) -> dict:
    ins = plan.instrs
    by_op = {abi.OPCODE_NAMES[int(k)]: int(v)
             for k, v in zip(*np.unique(ins["opcode"], return_counts=True))}
    peak = []
    for s in range(plan.n_sm):
        p = plan.queue(s)["pages"].astype(np.int64)
        if len(p) == 0:
            peak.append(0)
            continue
        # up to pages.SLOTS - 1 instructions after the running one hold their pages while it
        # runs, as many as fit beside it; the next one waits for a release
        peak_here = int(p.max())
        for k in range(1, min(pages.SLOTS, len(p))):
            window = sum(p[j:len(p) - k + j] for j in range(k + 1))   # k + 1 in a row
            fits = window[window <= plan.n_pages]
            peak_here = max(peak_here, int(fits.max()) if len(fits) else 0)
        peak.append(peak_here)
    return {
        "instructions": int(len(ins)),
        "instructions_per_opcode": by_op,
        "queue_lengths": plan.queue_lengths(),
        "counters": int(plan.n_counters),
        "pages_per_sm": int(plan.n_pages),
        "stream_pages": int(plan.stream_pages),
        "peak_pages_per_sm": peak,
        "n_sm": int(plan.n_sm),
        "dropped_ops": list(plan.dropped_ops),
    }
