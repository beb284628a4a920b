"""Scheduler structure: tile-level dependencies, no whole-op barriers, epochs, and a
deadlock check that rejects bad schedules."""
import numpy as np
import pytest

import megak
from megak import GraphError, abi, scheduler
from megak.ops import REGISTRY


def signalers_of(plan):
    """counter -> set of global instruction indices (queue position) that signal it."""
    out = {}
    for i, rec in enumerate(plan.instrs):
        for k in range(int(rec["n_signals"])):
            out.setdefault(int(rec["signal_counter"][k]), set()).add(i)
    return out


def waited_producers(plan, i, sig):
    rec = plan.instrs[i]
    got = set()
    for k in range(int(rec["n_waits"])):
        got |= sig[int(rec["wait_counter"][k])]
    return got


def overlapping(plan, i, producer_op, region):
    """Queue positions of producer_op's instructions whose output tile overlaps region."""
    r0, r1, c0, c1 = region
    ins = plan.instrs
    m = ((ins["op_index"] == producer_op) & (ins["row0"] < r1) &
         (ins["row0"] + ins["rows"] > r0) & (ins["col0"] < c1) & (ins["col0"] + ins["cols"] > c0))
    return set(np.nonzero(m)[0].tolist())




def chain_graph():
    g = megak.Graph()
    a = g.input("a", (512, 256), "float32")
    w = g.input("w", (256, 384), "float32")
    h = g.gemm(a, w)                 # op 0: 4 x 3 tiles
    t = g.transpose(h)               # op 1: (384, 512) in 64-tiles
    y = g.gemm(t, a)                 # op 2: (384, 512) @ (512, 256)
    c = g.copy(y)                    # op 3
    g.output(c, "y")
    return g


def test_dependencies_are_tile_level_and_sufficient():
    g = chain_graph()
    plan = scheduler.build_plan(g, n_sm=8)   # few SMs: no GEMM is split (units == ops)
    assert len(plan.op_labels) == len(g.ops)
    sig = signalers_of(plan)
    ops = g.ops
    for i, rec in enumerate(plan.instrs):
        op = ops[int(rec["op_index"])]
        waited = waited_producers(plan, i, sig)
        r0, c0 = int(rec["row0"]), int(rec["col0"])
        r1, c1 = r0 + int(rec["rows"]), c0 + int(rec["cols"])
        if op.kind == "transpose":
            needed = overlapping(plan, i, op.inputs[0].producer, (c0, c1, r0, r1))
            assert waited == needed        # exactly the tiles it reads: tile level
            assert len(needed) == 1
        elif op.kind == "gemm" and op.index == 2:
            k = op.inputs[0].cols
            needed = overlapping(plan, i, 1, (r0, r1, 0, k))
            assert needed <= waited        # sufficient
            all_t = set(np.nonzero(plan.instrs["op_index"] == 1)[0].tolist())
            assert waited < all_t          # but not a barrier on the whole transpose
        elif op.kind == "copy":
            needed = overlapping(plan, i, 2, (r0, r1, c0, c1))
            assert needed <= waited
        else:
            assert int(rec["n_waits"]) == 0


def test_gemm_band_reads_use_band_counters_not_k_tiles():
    g = megak.Graph()
    a = g.input("a", (256, 1024), "float32")
    w = g.input("w", (1024, 1024), "float32")
    h = g.gemm(a, w)                 # 2 x 8 tiles
    g.output(g.gemm(h, w), "y")      # each tile reads a full 1024-wide row band of h
    plan = scheduler.build_plan(g, n_sm=8)
    second = plan.instrs[plan.instrs["op_index"] == 1]
    assert (second["n_waits"] == 1).all()
    assert (second["wait_target"][:, 0] == 8).all()   # one row band = 8 tiles


def test_placement_balances_cost():
    g = megak.Graph()
    a = g.input("a", (1024, 512), "float32")
    g.output(g.gemm(a, g.input("b", (512, 1024), "float32")), "y")
    plan = scheduler.build_plan(g, n_sm=8)
    assert plan.queue_lengths() == [8] * 8


def test_gemm_tiles_are_placed_in_grouped_order():
    """Tiles placed one after another run at the same time: a wide GEMM's first wave (each
    SM's first tile) covers about sqrt(132 x 256 / 128) = 16 row bands of A and 132 / 16 column
    bands of B, not 5 row bands and all 32 column bands as row-major order would; every tile
    once, queue order still topological (a chain after it)."""
    from megak.ops._lowering import grouped_order, tile_group
    assert tile_group(132, 128, 256) == 16 and tile_group(132, 128, 128) == 11
    order = grouped_order(5, 3, 2)
    assert order.tolist() == [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11, 12, 13, 14]
    assert grouped_order(0, 3, 2).size == 0
    g = megak.Graph()
    a = g.input("a", (8192, 1024), "bfloat16")
    y = g.gemm(a, g.input("b", (1024, 8192), "bfloat16"))
    g.output(g.gemm(y, g.input("c", (8192, 512), "bfloat16")), "z")
    plan = scheduler.build_plan(g, n_sm=132)
    ins = plan.instrs
    first = ins[plan.queue_start[:-1]]
    assert (first["op_index"] == 0).all()
    assert len(np.unique(first["row0"])) == 16 and len(np.unique(first["col0"])) == 9
    op0 = ins[ins["op_index"] == 0]
    assert len({(int(r), int(c)) for r, c in zip(op0["row0"], op0["col0"])}) == 64 * 32
    scheduler.check_deadlock_free(plan)


def test_queue_order_is_topological_and_checked():
    plan = scheduler.build_plan(chain_graph(), n_sm=4)
    scheduler.check_deadlock_free(plan)  # the full (Kahn) check passes too


def test_deadlock_check_rejects_a_reversed_queue():
    plan = scheduler.build_plan(chain_graph(), n_sm=1)
    plan.instrs = plan.instrs[::-1].copy()   # consumers before their producers on one SM
    with pytest.raises(GraphError, match="deadlock: .*cycle"):
        scheduler.check_deadlock_free(plan)


def test_deadlock_check_rejects_a_cross_sm_cycle():
    g = megak.Graph()
    a = g.input("a", (64, 64), "float32")
    b = g.input("b", (64, 64), "float32")
    x, y = g.copy(a), g.copy(b)
    g.output(g.transpose(x), "tx")
    g.output(g.transpose(y), "ty")
    plan = scheduler.build_plan(g, n_sm=2)
    ins = plan.instrs
    by_op = {int(r["op_index"]): r.copy() for r in ins}
    # SM0: transpose(y) then copy(a); SM1: transpose(x) then copy(b): each waits on the other
    plan.instrs = np.array([by_op[3], by_op[0], by_op[2], by_op[1]], dtype=abi.INSTR_DTYPE)
    plan.queue_start = np.array([0, 2, 4], dtype=np.uint32)
    with pytest.raises(GraphError, match="deadlock"):
        scheduler.check_deadlock_free(plan)
    # the simulator, made to run it anyway, reports the hang the GPU would
    from megak.sim import SimExecutor
    with pytest.raises(megak.MegakernelHang) as info:
        SimExecutor(plan).run({0: np.ones((64, 64), np.float32),
                               1: np.ones((64, 64), np.float32)}, [4, 5])
    rec = info.value.record
    assert rec["error"] == abi.ERRORS["MK_ERR_TIMEOUT"] and rec["queue_index"] == 0
    assert rec["expected"] == 1 and rec["observed"] == 0
    msg = str(info.value)
    assert "transpose" in msg
    # the report shows the cycle: each SM's producer is the other SM, itself waiting
    assert msg.count("queue index 0, which waits") == 2, msg
    assert "SM 0" in msg and "SM 1" in msg


def test_deadlock_check_rejects_wrong_targets():
    plan = scheduler.build_plan(chain_graph(), n_sm=4)
    i = int(np.nonzero(plan.instrs["n_waits"] > 0)[0][0])
    plan.instrs["wait_target"][i, 0] += 1
    with pytest.raises(GraphError, match="expects .* signals per run"):
        scheduler.check_deadlock_free(plan)


def test_counters_need_no_reset_between_runs(rng):
    g = chain_graph()
    prog = megak.compile(g, backend="sim", n_sm=6)
    inputs = {"a": rng.standard_normal((512, 256)).astype(np.float32),
              "w": rng.standard_normal((256, 384)).astype(np.float32)}
    first = prog.run(**inputs)["y"]
    for _ in range(2):
        np.testing.assert_array_equal(prog.run(**inputs)["y"], first)
    ex = prog._executor
    assert ex.epoch == 3
    np.testing.assert_array_equal(ex.counters[:prog.plan.n_counters],
                                  3 * prog.plan.counter_targets)


def test_lowering_100k_instructions_is_fast_enough_to_matter():
    # correctness of a large plan; its speed is measured in benchmarks/, not asserted here
    g = megak.Graph()
    x = g.input("x", (4096, 4096), "float32")
    w = g.input("w", (4096, 4096), "float32")
    for _ in range(10):
        x = g.gemm(x, w)
    g.output(x, "y")
    plan = scheduler.build_plan(g, n_sm=132)
    assert len(plan.instrs) == 10 * 32 * 32
    assert len(plan.encoded()) == len(plan.instrs) * abi.INSTR_BYTES
