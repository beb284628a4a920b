"""The simulator's two roles per SM (loader one instruction ahead, compute in phases) and the
page hand-over between them (megak/page_plan.py), under every interleaving it can shuffle."""
from collections import defaultdict

import numpy as np
import pytest

import megak
from megak import MegakernelError, MegakernelHang, abi
from megak import page_plan as pp
from megak.pages import SLOTS
from megak.trace import ORDER, Trace
from tests.reference import check_graph

P = abi.TRACE_PHASES
SEEDS = range(50)


def mixed_graph():
    """bf16 and fp32 GEMMs (with 128-row, 72-row and <= 32-row tiles, so some release pages
    early), transposes and copies, with both produced and graph-input B operands."""
    g = megak.Graph()
    x = g.input("x", (200, 70), "float32")
    h = g.gemm(x, g.transpose(x))                      # fp32, B produced, rows 128 + 72
    y = g.copy(g.transpose(h))
    g.output(g.gemm(y, g.copy(x)), "y")              # fp32 (200, 70)
    p = g.input("p", (20, 64), "bfloat16")
    w = g.input("w", (64, 150), "bfloat16")
    v = g.input("v", (150, 40), "bfloat16")
    s = g.gemm(p, w)                                   # bf16, 20 rows: one page kept
    g.output(g.gemm(s, v, out_dtype="float32"), "z")   # bf16, B input, A produced
    u = g.input("u", (40, 96), "bfloat16")
    g.output(g.gemm(g.gemm(p, w, activation="relu"), g.gemm(v, u)), "t")  # B produced
    return g


def by_page(intervals):
    out = defaultdict(list)
    for q, page, acq, rel in intervals:
        out[page].append((acq, rel, q))
    return out


def check_page_intervals(prog):
    """Every page acquired was released once, each physical page had one holder at a time,
    and each instruction held exactly the pages it asked for. Returns the intervals."""
    ex = prog._executor
    plan = prog.plan
    ivs = ex.last_page_intervals
    assert len(ivs) == plan.n_sm
    for sm in range(plan.n_sm):
        want = plan.queue(sm)["pages"].astype(int)
        held = defaultdict(list)
        for q, page, acq, rel in ivs[sm]:
            assert 0 <= page < plan.n_pages
            assert rel is not None and rel > acq, (sm, q, page, acq, rel)
            held[q].append(page)
        for q, need in enumerate(want):
            assert sorted(held.get(q, [])) == sorted(set(held.get(q, []))), (sm, q)
            assert len(held.get(q, [])) == need, (sm, q)
        for page, spans in by_page(ivs[sm]).items():
            spans.sort()
            for (a0, r0, q0), (a1, r1, q1) in zip(spans, spans[1:]):
                assert r0 < a1, (f"SM {sm} page {page}: queue index {q0} held it until {r0}, "
                                 f"{q1} took it at {a1}")
                assert q0 < q1, "pages are acquired in queue order"
    assert max(ex.last_peak_pages) <= plan.n_pages
    return ivs


def test_page_plan_rules():
    rec = np.zeros(1, dtype=abi.INSTR_DTYPE)[0]
    rec["opcode"], rec["pages"], rec["rows"], rec["cols"], rec["klen"] = abi.OPCODE_OF["gemm"], 4, 20, 64, 70
    plan = pp.page_plan(rec, "bfloat16")
    assert plan.phases == (((0, 1, 2, 3), (1, 2, 3)), ((0,), (0,)))
    assert plan.preload_early == () and plan.preload_late == (0, 1, 2)   # ceil(70/32) = 3
    rec["rows"], rec["klen"], rec["flags"] = 65, 40, abi.FLAG_B_READY
    plan = pp.page_plan(rec, "bfloat16")
    assert plan.phases == (((0, 1, 2, 3), (3,)), ((0, 1, 2), (0, 1, 2)))
    assert plan.preload_early == plan.preload_late == (0, 1)
    assert plan.early_reads == ((abi.ARG_B, 0, 40, 0, 64),)
    fp32 = pp.page_plan(rec, "float32")
    assert fp32.preload_early == fp32.preload_late == () and fp32.phases == plan.phases
    rec["rows"] = 128
    assert pp.page_plan(rec, "float32").phases == (((0, 1, 2, 3), ()), ((0, 1, 2, 3), (0, 1, 2, 3)))
    for op in (abi.OP_NOP, abi.OPCODE_OF["copy"], abi.OPCODE_OF["transpose"], abi.OPCODE_OF["reduce"]):
        rec["opcode"] = op
        assert pp.page_plan(rec, "bfloat16") == pp.PagePlan(phases=(((), ()),))


def test_stream_page_plan():
    rec = np.zeros(1, dtype=abi.INSTR_DTYPE)[0]
    rec["opcode"], rec["pages"], rec["rows"], rec["cols"], rec["klen"] = abi.OPCODE_OF["gemm"], 3, 16, 64, 1024
    rec["k0"], rec["col0"], rec["flags"] = 0, 64, abi.FLAG_B_READY | abi.FLAG_STREAM
    plan = pp.page_plan(rec, "bfloat16")
    # B comes through the ring (not the op's pages): nothing preloaded; A's ring in 0-1, the
    # box page 2, the partials' 1-2 go after the reduction
    assert plan.preload_early == () and plan.preload_late == ()
    assert plan.phases == (((0, 1, 2), ()), ((0, 1, 2), (1, 2)), ((0,), (0,)))
    rec["flags"] = abi.FLAG_B_READY                       # not streamed: the 128 x 128 path
    assert pp.page_plan(rec, "bfloat16").phases[0][1] == (1, 2, 3)


def test_page_invariants_hold_under_random_interleavings(rng):
    g = mixed_graph()
    handed_over = 0
    for seed in SEEDS:
        prog = megak.compile(g, backend="sim", n_sm=3, order="random", seed=seed)
        check_graph(prog, g, rng, f"seed {seed}")
        ivs = check_page_intervals(prog)
        # q+1 took a page that q gave back in a phase, while q still held others
        for sm_ivs in ivs:
            rel_of = {(q, page): rel for q, page, _, rel in sm_ivs}
            last_rel = defaultdict(int)
            for q, _, _, rel in sm_ivs:
                last_rel[q] = max(last_rel[q], rel)
            for q, page, acq, _ in sm_ivs:
                if (q - 1, page) in rel_of and acq < last_rel[q - 1]:
                    handed_over += 1
    assert handed_over > 0, "no page was ever handed over before its instruction ended"
    plan = prog.plan
    assert (plan.instrs["opcode"] == abi.OPCODE_OF["gemm"]).sum() > 0
    short = (plan.instrs["opcode"] == abi.OPCODE_OF["gemm"]) & (plan.instrs["rows"] <= 32)
    assert short.any(), "the graph must have short GEMM tiles (early release)"


def test_trace_order_under_random_interleavings(rng):
    g = mixed_graph()
    all_ahead = False   # some loader as far ahead as its slots allow
    for seed in range(10):
        prog = megak.compile(g, backend="sim", n_sm=4, order="random", seed=seed)
        prog.run(trace=True, **{k: rng.uniform(-1, 1, t.shape).astype(np.float32)
                                .astype(megak.dtypes.numpy_dtype(t.dtype))
                                for k, t in g.inputs.items()})
        ev = prog.last_trace.events
        t = ev["t"].astype(np.int64)
        assert (np.diff(t[:, ORDER], axis=1) > 0).all()
        qs = prog.plan.queue_start.astype(np.int64)
        for sm in range(prog.plan.n_sm):
            tq = t[qs[sm]:qs[sm + 1]]
            # the loader is at most SLOTS - 1 instructions ahead of the compute role
            assert (tq[SLOTS:, P["MK_T_FETCH"]] > tq[:-SLOTS, P["MK_T_STORED"]]).all()
            assert (tq[1:, P["MK_T_LOADED"]] > tq[:-1, P["MK_T_STORED"]]).all()
            assert (tq[1:, P["MK_T_ACQUIRED"]] > tq[:-1, P["MK_T_ACQUIRED"]]).all()
            far = SLOTS - 1
            all_ahead |= bool((tq[far:, P["MK_T_FETCH"]] < tq[:-far, P["MK_T_STORED"]]).any())
    assert all_ahead, "no loader ever fetched q + SLOTS - 1 before q was stored: a slot unused"


def _two_big_gemms(prog, pages):
    """Make two consecutive GEMMs of one SM's queue ask for `pages` pages each."""
    plan = prog.plan
    for sm in range(plan.n_sm):
        q = plan.queue(sm)
        gemms = np.nonzero(q["opcode"] == abi.OPCODE_OF["gemm"])[0]
        pairs = [i for i in gemms if i + 1 in gemms]
        if pairs:
            i = int(pairs[0])
            base = int(plan.queue_start[sm])
            plan.instrs["pages"][base + i] = pages
            plan.instrs["pages"][base + i + 1] = pages
            return sm, i
    raise AssertionError("no SM runs two GEMMs back to back")


def test_instruction_waits_for_pages_released_by_the_one_ahead(rng):
    g = megak.Graph()
    a = g.input("a", (300, 96), "float32")
    b = g.input("b", (96, 20), "float32")
    g.output(g.gemm(a, b), "y")                   # 3 tiles, one SM: back to back
    for seed in SEEDS:
        prog = megak.compile(g, backend="sim", n_sm=1, order="random", seed=seed)
        assert prog.plan.n_pages == 13
        sm, i = _two_big_gemms(prog, 9)
        check_graph(prog, g, rng, f"9 + 9 of 13 pages, seed {seed}")
        ivs = check_page_intervals(prog)[sm]
        first = [iv for iv in ivs if iv[0] == i]
        second = [iv for iv in ivs if iv[0] == i + 1]
        assert len(first) == len(second) == 9
        # 9 + 9 > 13 and the first keeps pages 4..8 to its end: the second got its pages
        # only after the first's final release, and only pages free by then
        acq = second[0][2]
        assert all(iv[2] == acq for iv in second)
        assert acq > max(iv[3] for iv in first)
        mine = {iv[1] for iv in first}
        assert len(mine & {iv[1] for iv in second}) >= 5


def test_smallest_page_budget_completes_and_overlaps(rng):
    g = megak.Graph()
    x = g.input("x", (30, 64), "float32")
    w = g.input("w", (64, 200), "float32")
    h = g.gemm(x, w)                             # 30-row tiles keep 1 page for the epilogue
    g.output(g.gemm(h, g.transpose(w)), "y")     # (30, 64)
    g.output(g.gemm(g.transpose(h), h), "z")     # (200, 200): 128- and 72-row tiles
    overlapped = 0
    for seed in range(20):
        prog = megak.compile(g, backend="sim", n_sm=2, n_pages=5, order="random", seed=seed)
        assert prog.plan.n_pages == 5 and (prog.plan.instrs["pages"] <= 4).all()
        check_graph(prog, g, rng, f"5 pages, seed {seed}")
        for sm_ivs in check_page_intervals(prog):
            end = defaultdict(int)
            for q, _, _, rel in sm_ivs:
                end[q] = max(end[q], rel)
            overlapped += sum(1 for q, _, acq, _ in sm_ivs if acq < end.get(q - 1, -1))
    # two GEMMs of 4 pages never fit 5 pages at once: only early release lets them overlap
    assert overlapped > 0


def test_plan_that_releases_a_page_still_in_use_is_caught(rng, monkeypatch):
    g = megak.Graph()
    a = g.input("a", (64, 48), "float32")
    g.output(g.gemm(a, g.transpose(a)), "y")
    prog = megak.compile(g, backend="sim", n_sm=2)
    check_graph(prog, g, rng, "correct plan")
    real = pp.page_plan

    def early_page_0(rec, dtype_a="float32"):
        plan = real(rec, dtype_a)
        if int(rec["opcode"]) != abi.OPCODE_OF["gemm"]:
            return plan
        return pp.PagePlan(phases=(((0, 1, 2, 3), (0,)), ((0, 1), (1, 2, 3))))
    monkeypatch.setattr(pp, "page_plan", early_page_0)
    with pytest.raises(MegakernelError) as info:
        prog.run(a=rng.standard_normal((64, 48)).astype(np.float32))
    msg = str(info.value)
    assert not isinstance(info.value, MegakernelHang)
    assert "compute phase 1 uses page 0" in msg and "after releasing it" in msg
    assert "SM " in msg and "queue index" in msg and "gemm #1" in msg


@pytest.mark.parametrize("phases,what", [
    ((((0, 1, 2, 3), (0,)), ((1,), (0, 1, 2, 3))), "a second time"),
    ((((0, 1, 2, 3, 4), ()), ((0,), (0, 1, 2, 3))), "holds only 4 pages"),
    ((((0, 1, 2, 3), (7,)), ((0,), (0, 1, 2, 3))), "holds only 4 pages"),
])
def test_plan_that_breaks_ownership_is_caught(rng, monkeypatch, phases, what):
    g = megak.Graph()
    a = g.input("a", (64, 48), "float32")
    g.output(g.gemm(a, g.transpose(a)), "y")
    prog = megak.compile(g, backend="sim", n_sm=2)
    real = pp.page_plan
    monkeypatch.setattr(pp, "page_plan", lambda rec, dtype_a="float32": (
        pp.PagePlan(phases=phases) if int(rec["opcode"]) == abi.OPCODE_OF["gemm"] else real(rec, dtype_a)))
    with pytest.raises(MegakernelError, match=what):
        prog.run(a=rng.standard_normal((64, 48)).astype(np.float32))


def test_preload_of_a_page_not_held_is_caught(rng, monkeypatch):
    g = megak.Graph()
    a = g.input("a", (64, 48), "bfloat16")
    g.output(g.gemm(a, g.input("b", (48, 32), "bfloat16")), "y")
    prog = megak.compile(g, backend="sim", n_sm=1)
    real = pp.page_plan
    monkeypatch.setattr(pp, "page_plan", lambda rec, dtype_a="float32": (
        pp.PagePlan(preload_late=(5,), phases=real(rec, dtype_a).phases)))
    with pytest.raises(MegakernelError, match="late preload writes page 5"):
        prog.run(a=rng.uniform(-1, 1, (64, 48)).astype(megak.dtypes.numpy_dtype("bfloat16")),
                 b=rng.uniform(-1, 1, (48, 32)).astype(megak.dtypes.numpy_dtype("bfloat16")))


# 8 pages: the bf16 GEMMs take the mma.sync tiles, whose loader preloads B before the
# dependency wait under MK_FLAG_B_READY (a wgmma tile's loader issues every copy after it)
B_READY_PAGES = 8


def b_ready_graph():
    g = megak.Graph()
    x = g.input("x", (40, 64), "bfloat16")
    w = g.input("w", (64, 256), "bfloat16")
    v = g.input("v", (256, 300), "bfloat16")
    wv = g.gemm(w, v)                             # (64, 300): a produced B
    g.output(g.gemm(x, wv, out_dtype="float32"), "produced")
    g.output(g.gemm(x, w, out_dtype="float32"), "weights")
    return g


def set_b_ready(prog, produced: bool) -> int:
    plan = prog.plan
    ins = plan.instrs
    inputs = set(plan.inputs.values())
    n = 0
    for i in np.nonzero(ins["opcode"] == abi.OPCODE_OF["gemm"])[0]:
        if (int(ins["tensor"][i, abi.ARG_B]) not in inputs) == produced:
            ins["flags"][i] |= abi.FLAG_B_READY
            n += 1
    return n


@pytest.mark.parametrize("order,seed", [("round_robin", None)] + [("random", s) for s in range(8)])
def test_b_ready_on_a_produced_operand_is_a_race(rng, order, seed):
    g = b_ready_graph()
    prog = megak.compile(g, backend="sim", n_sm=8, order=order, seed=seed,
                         n_pages=B_READY_PAGES)
    assert set_b_ready(prog, produced=True) > 0
    # the flagged GEMMs sit second in their queues, behind a split-K partial that is not
    # their producer: their loaders reach the early preload long before the reduce that
    # writes their B (which waits for every partial) has stored
    ins = prog.plan.instrs
    flagged = (ins["flags"] & abi.FLAG_B_READY) > 0
    with pytest.raises(MegakernelError) as info:
        check_graph(prog, g, rng)
    msg = str(info.value)
    assert not isinstance(info.value, MegakernelHang)
    assert "race" in msg and "before the dependency wait" in msg and "gemm #1" in msg
    produced_b = {int(s) for s in ins["tensor"][flagged, abi.ARG_B]}
    assert any(f"of tensor slot {s} " in msg for s in produced_b)


def test_b_ready_on_a_graph_input_runs(rng):
    g = b_ready_graph()
    for seed in range(10):
        prog = megak.compile(g, backend="sim", n_sm=8, order="random", seed=seed,
                             n_pages=B_READY_PAGES)
        assert set_b_ready(prog, produced=False) > 0
        check_graph(prog, g, rng, f"B_READY on weights, seed {seed}")
        check_page_intervals(prog)


def test_leak_hook_keeps_a_page_a_phase_would_release(rng):
    # a 20-row GEMM with 4 pages gives every page back in its phases: the hook still
    # withholds the last one, and the end-of-queue check reports it
    g = megak.Graph()
    a = g.input("a", (20, 64), "float32")
    g.output(g.gemm(a, g.input("b", (64, 64), "float32")), "y")
    prog = megak.compile(g, backend="sim", n_sm=1)
    ins = prog.plan.instrs
    assert ins["pages"][0] == 4
    plan = pp.page_plan(ins[0], "float32")
    assert sorted(j for _, rel in plan.phases for j in rel) == [0, 1, 2, 3]
    ins["flags"][0] |= abi.FLAG_DEBUG_LEAK_PAGE
    x = {"a": rng.standard_normal((20, 64)).astype(np.float32),
         "b": rng.standard_normal((64, 64)).astype(np.float32)}
    with pytest.raises(MegakernelError) as info:
        prog.run(**x)
    assert info.value.record["error"] == abi.ERRORS["MK_ERR_PAGE_LEAK"]
    leaked = [iv for iv in prog._executor.last_page_intervals[0] if iv[3] is None]
    assert [(q, p) for q, p, _, _ in leaked] == [(0, 3)]


def test_missing_signal_is_a_hang_with_both_roles(rng):
    g = megak.Graph()
    a = g.input("a", (200, 130), "float32")
    g.output(g.copy(g.gemm(a, g.transpose(a))), "y")
    prog = megak.compile(g, backend="sim", n_sm=3, order="random", seed=3)
    ins = prog.plan.instrs
    i = int(np.nonzero((ins["op_index"] == 1) & (ins["n_signals"] > 0))[0][0])
    ins["n_signals"][i] = 0
    with pytest.raises(MegakernelHang) as info:
        prog.run(a=rng.standard_normal((200, 130)).astype(np.float32))
    rec = info.value.record
    assert rec["error"] == abi.ERRORS["MK_ERR_TIMEOUT"] and rec["observed"] < rec["expected"]
    assert len(info.value.sm_states) == 3
    stuck = [s for s in info.value.sm_states if s["error"] == abi.ERRORS["MK_ERR_TIMEOUT"]]
    assert stuck and all(s["opcode"] == abi.OPCODE_OF["copy"] for s in stuck)


def test_bubble_fraction_of_a_known_trace():
    ev = np.zeros(3, dtype=abi.TRACE_DTYPE)
    ev["sm"] = [0, 0, 2]
    ev["op_index"] = [0, 0, 0]
    t = np.zeros((3, 6))
    # SM 0: fetch 0; op A runs [2, 6], op B [8, 10]: busy 6 of 10. SM 2: busy [5, 9] of [1, 9]
    for row, (f, a, w, ld, c, s) in enumerate([(0, 1, 1, 2, 5, 6), (1, 3, 7, 8, 9, 10),
                                                (1, 2, 3, 5, 8, 9)]):
        t[row, [P["MK_T_FETCH"], P["MK_T_ACQUIRED"], P["MK_T_WAITED"], P["MK_T_LOADED"],
                P["MK_T_COMPUTED"], P["MK_T_STORED"]]] = [f, a, w, ld, c, s]
    ev["t"] = t.astype(np.uint64)
    tr = Trace(events=ev, op_labels=["gemm #0"], op_kinds=["gemm"], op_flops=[0.0],
               op_bytes=[0.0], n_sm=3, n_pages=13, own_pages=np.array([4, 4, 4]),
               unit="step")
    np.testing.assert_allclose(tr.bubble_fraction(), [0.4, 1.0, 0.5])
    b = tr.bubble_summary()
    assert b["sms"] == 2
    np.testing.assert_allclose([b["mean"], b["median"], b["max"]], [0.45, 0.45, 0.5])
    assert "mean 0.45, median 0.45, max 0.50 over 2 SMs" in tr.summary()


def test_bubble_fraction_of_a_simulated_run(rng):
    g = mixed_graph()
    prog = megak.compile(g, backend="sim", n_sm=4)
    prog.run(trace=True, **{k: rng.uniform(-1, 1, t.shape).astype(np.float32)
                            .astype(megak.dtypes.numpy_dtype(t.dtype))
                            for k, t in g.inputs.items()})
    tr = prog.last_trace
    bub = tr.bubble_fraction()
    assert bub.shape == (4,) and ((bub >= 0) & (bub <= 1)).all()
    t = tr.events["t"].astype(np.float64)
    for sm in range(4):
        m = tr.events["sm"] == sm
        assert m.any()
        span = t[m, P["MK_T_STORED"]].max() - t[m, P["MK_T_FETCH"]].min()
        # ops run one after another on an SM: the busy time is the sum of their runs
        run = (t[m, P["MK_T_STORED"]] - t[m, P["MK_T_LOADED"]]).sum()
        np.testing.assert_allclose(bub[sm], 1 - run / span, rtol=1e-12)
    b = tr.bubble_summary()
    np.testing.assert_allclose([b["mean"], b["median"], b["max"]],
                               [bub.mean(), np.median(bub), bub.max()], rtol=1e-12)
    line = [ln for ln in tr.summary().splitlines() if "idle (bubble) fraction" in ln]
    assert len(line) == 1 and f"median {b['median']:.2f}" in line[0]
