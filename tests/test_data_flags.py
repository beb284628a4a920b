"""Data that is its own flag (device/flag.cuh, scheduler.flagged_tensors): which tensors the
scheduler gives the flagged form, that their edges carry no counters, that runs through them
compute the right thing on both backends, that a flagged word nobody writes is a hang naming
its tensor, and that the simulator catches a stale or doubly written word. The GPU stress test
runs 10,000 random chains through the protocol, every result checked."""
import numpy as np
import pytest

import megak
from megak import abi, scheduler
from megak.sim import SimExecutor
from tests.reference import assert_close, check_graph, evaluate, random_inputs


def copy_chain(n=6, shape=(1, 32)):
    g = megak.Graph()
    y = g.input("x", shape, "float32")
    for _ in range(n):
        y = g.copy(y)
    g.output(y, "y")
    return g


def opts(backend, **more):
    return {"n_sm": 4, **more} if backend == "sim" else {"timeout_s": 1.0, **more}


def flagged_slots(plan):
    return {t.slot for t in plan.tensors if t.flagged}


# -- the scheduler's choice --------------------------------------------------------------------

def test_a_chain_of_small_copies_is_flagged_and_has_no_counters():
    g = copy_chain(6)
    plan = scheduler.build_plan(g, n_sm=4)
    inner = {op.output.index for op in g.ops} - {g.outputs["y"].index}
    assert flagged_slots(plan) == inner
    assert plan.n_counters == 0
    assert (plan.instrs["n_waits"] == 0).all() and (plan.instrs["n_signals"] == 0).all()
    # the edges still placed the chain: no two consecutive copies on one SM
    sm = np.searchsorted(plan.queue_start.astype(np.int64), np.arange(6), side="right") - 1
    by_op = np.empty(6, dtype=np.int64)
    by_op[plan.instrs["op_index"]] = sm
    assert (by_op[1:] != by_op[:-1]).all()


def test_data_flags_false_keeps_every_counter():
    plan = scheduler.build_plan(copy_chain(6), n_sm=4, data_flags=False)
    assert not flagged_slots(plan)
    assert plan.n_counters == 5 and int(plan.instrs["n_waits"].sum()) == 5


@pytest.mark.parametrize("why", ["large", "gemm reader", "output", "bf16", "many readers"])
def test_what_stays_a_counter(why):
    g = megak.Graph()
    if why == "large":
        x = g.input("x", (8, scheduler.FLAG_MAX_ELEMENTS // 8 + 1), "float32")
        g.output(g.copy(g.copy(x)), "y")
    elif why == "gemm reader":
        x = g.input("x", (4, 16), "float32")
        w = g.input("w", (16, 16), "float32")
        g.output(g.gemm(g.copy(x), w), "y")
    elif why == "output":
        x = g.input("x", (1, 8), "float32")
        y = g.copy(x)
        g.output(y, "y")
        g.output(g.copy(y), "z")
    elif why == "bf16":
        x = g.input("x", (2, 16), "bfloat16")
        b = g.input("b", (2, 16), "bfloat16")
        g.output(g.add(g.add(x, b), b), "y")
    else:
        x = g.input("x", (1, 8), "float32")
        y = g.copy(x)
        g.output(g.add(y, y), "y0")
        for i in range(scheduler.FLAG_MAX_READERS):
            g.output(g.copy(y), f"z{i}")
    plan = scheduler.build_plan(g, n_sm=4)
    assert not flagged_slots(plan)
    assert plan.n_counters > 0


def test_a_flagged_edge_and_a_counted_edge_into_one_instruction():
    # add(copy(x), gemm(...)): the copy's output is flagged, the GEMM's is counted
    g = megak.Graph()
    x = g.input("x", (4, 16), "float32")
    w = g.input("w", (16, 16), "float32")
    y = g.add(g.copy(x), g.gemm(x, w))
    g.output(y, "y")
    plan = scheduler.build_plan(g, n_sm=4)
    assert len(flagged_slots(plan)) == 1
    add = plan.instrs[plan.instrs["opcode"] == abi.OPCODES["MK_OP_ADD"]]
    assert (add["n_waits"] == 1).all()      # the GEMM's counter only
    sim = megak.compile(g, backend="sim", n_sm=4, order="random", seed=7)
    check_graph(sim, g, np.random.default_rng(1), "mixed edges")


def test_drop_counters_from_keeps_the_order_of_the_rest():
    ins = abi.empty_instrs(2)
    ins["n_waits"] = [4, 2]
    ins["wait_counter"][0, :4] = [5, 1, 7, 2]
    ins["wait_target"][0, :4] = [50, 10, 70, 20]
    ins["wait_counter"][1, :2] = [9, 8]
    ins["wait_target"][1, :2] = [90, 80]
    ins["n_signals"] = [2, 1]
    ins["signal_counter"][0, :2] = [6, 3]
    ins["signal_counter"][1, :1] = [4]
    scheduler.drop_counters_from(ins, 6)
    assert list(ins["n_waits"]) == [3, 0]
    assert list(ins["wait_counter"][0]) == [5, 1, 2, 0, 0]
    assert list(ins["wait_target"][0]) == [50, 10, 20, 0, 0]
    assert list(ins["n_signals"]) == [1, 1]
    assert list(ins["signal_counter"][0]) == [3, 0, 0, 0]
    assert list(ins["signal_counter"][1]) == [4, 0, 0, 0]


# -- runs through flagged tensors ---------------------------------------------------------------

def random_chains(rng, n_chains, most_steps=12):
    """n_chains independent chains of copies and adds on small fp32 tensors (1-4 rows, 1-64
    columns): adds of a broadcast row, of the chain's own earlier values (a tensor read
    twice), of the chain's input. Every intermediate is small: the scheduler flags them."""
    g = megak.Graph()
    for c in range(n_chains):
        shape = (int(rng.integers(1, 5)), int(rng.integers(1, 65)))
        x = g.input(f"x{c}", shape, "float32")
        b = g.input(f"b{c}", (1, shape[1]), "float32")
        seen = [x]
        y = x
        for _ in range(int(rng.integers(1, most_steps + 1))):
            pick = rng.integers(4)
            if pick == 0:
                y = g.copy(y)
            elif pick == 1:
                y = g.add(y, b)
            elif pick == 2:
                y = g.add(y, seen[int(rng.integers(len(seen)))])
            else:
                y = g.add(seen[int(rng.integers(len(seen)))], y)
            seen.append(y)
        g.output(y if y is not x else g.copy(x), f"y{c}")
    return g


def check_outputs(g, inputs, out, what):
    env = evaluate(g, inputs)
    for name, t in g.outputs.items():
        value, bound = env[t.index]
        assert_close(out[name], value, bound, f"{what} {name}")


@pytest.mark.parametrize("order", ["round_robin", "random"])
def test_random_chains_on_the_simulator(rng, order):
    g = random_chains(rng, 12)
    prog = megak.compile(g, backend="sim", n_sm=5, order=order, seed=11)
    assert flagged_slots(prog.plan)
    for run in range(3):
        inputs = random_inputs(g, rng)
        check_outputs(g, inputs, prog.run(**inputs), f"run {run}")


def test_copy_chain_runs_and_reruns(backend, rng):
    g = copy_chain(40, (3, 37))
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        assert len(flagged_slots(prog.plan)) == 39
        for run in range(4):
            inputs, out = check_graph(prog, g, rng, f"run {run}")
            np.testing.assert_array_equal(out["y"], inputs["x"])


def plant_missing_writer(prog, op_index):
    """Turn op `op_index` (a copy writing a flagged tensor) into a NOP: its words are never
    written, its reader polls until the deadline."""
    ins = prog.plan.instrs
    original = ins.copy()
    ins["opcode"][ins["op_index"] == op_index] = abi.OP_NOP
    prog._executor.reload_queues()
    return original


def test_a_word_nobody_writes_is_a_hang_naming_its_tensor(backend, rng):
    g = copy_chain(6)
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        check_graph(prog, g, rng, "before")
        original = plant_missing_writer(prog, 2)
        slot = g.ops[2].output.index
        with pytest.raises(megak.MegakernelHang) as err:
            prog.run(**random_inputs(g, rng))
        msg = str(err.value)
        assert "the flagged words of tensor slot" in msg and "to carry this run's stamp" in msg
        # the reader of the unwritten tensor waits on it (those after it may time out first)
        states = err.value.sm_states
        waiting = [s for s in states if s["counter"] == abi.FLAG_WAIT | slot]
        assert waiting and all(s["observed"] != s["expected"] for s in waiting), states
        prog.plan.instrs[:] = original
        prog._executor.reload_queues()
        for run in range(2):   # the program is whole again
            check_graph(prog, g, rng, f"after the hang, run {run}")


def test_a_failed_run_spends_its_stamp_in_the_simulator(rng):
    # a failed run leaves words of its stamp behind: the next run must not take them
    g = copy_chain(6)
    prog = megak.compile(g, backend="sim", n_sm=4)
    ex = prog._executor
    check_graph(prog, g, rng, "first")
    ins = prog.plan.instrs
    original = ins.copy()
    ins["opcode"][ins["op_index"] == 4] = abi.OP_NOP
    with pytest.raises(megak.MegakernelHang):
        prog.run(**random_inputs(g, rng))
    assert ex.stamp == 2 and ex.epoch == 0   # the epoch restarts, the stamp never does
    ins[:] = original
    inputs, out = check_graph(prog, g, rng, "after")
    assert ex.stamp == 3


def test_the_simulator_catches_a_word_written_twice(rng):
    g = copy_chain(6)
    prog = megak.compile(g, backend="sim", n_sm=4)
    ins = prog.plan.instrs
    # copy #3 writes copy #2's output too (and no longer its own): two stores per word
    i2 = int(np.nonzero(ins["op_index"] == 2)[0][0])
    i3 = int(np.nonzero(ins["op_index"] == 3)[0][0])
    ins["tensor"][i3, abi.ARG_OUT] = ins["tensor"][i2, abi.ARG_OUT]
    with pytest.raises(megak.MegakernelError, match="already wrote"):
        prog.run(**random_inputs(g, rng))


def test_the_simulator_catches_a_stale_read(rng):
    # a reader that does not poll (here: the simulator told the record reads nothing) takes
    # whatever the word holds: a stale word is a race
    g = copy_chain(3)
    prog = megak.compile(g, backend="sim", n_sm=4)
    check_graph(prog, g, rng, "first")
    ex: SimExecutor = prog._executor
    ex._flag_pending = lambda rec, tensors: None
    ins = prog.plan.instrs
    ins["opcode"][ins["op_index"] == 1] = abi.OP_NOP   # its words keep the first run's stamp
    with pytest.raises(megak.MegakernelError, match="do not carry this run's stamp"):
        prog.run(**random_inputs(g, rng))


def test_an_op_without_flag_io_may_not_take_a_flagged_operand(rng):
    g = megak.Graph()
    x = g.input("x", (4, 4), "float32")
    g.output(g.transpose(g.copy(g.copy(x))), "y")
    prog = megak.compile(g, backend="sim", n_sm=2)
    ins = prog.plan.instrs
    first = int(np.nonzero(ins["op_index"] == 0)[0][0])
    flagged = int(ins["tensor"][first, abi.ARG_OUT])
    assert prog.plan.tensors[flagged].flagged
    t = int(np.nonzero(ins["opcode"] == abi.OPCODES["MK_OP_TRANSPOSE"])[0][0])
    ins["tensor"][t, abi.ARG_A] = flagged
    with pytest.raises(megak.MegakernelError, match="MK_ERR_BAD_DESCRIPTOR"):
        prog.run(**random_inputs(g, rng))


# -- the GPU stress test ------------------------------------------------------------------------

@pytest.mark.gpu
def test_stress_ten_thousand_random_chains_on_the_gpu(rng):
    """100 random chains per program, 100 runs with fresh inputs and poisoned outputs, every
    output of every run checked against float64: 10,000 chains through flagged words, on
    every SM, with the run's stamp advancing each time."""
    g = random_chains(rng, 100)
    with megak.compile(g, backend="cuda", timeout_s=2.0) as prog:
        assert len(flagged_slots(prog.plan)) > 200
        outs = {name: np.empty(t.shape, np.float32) for name, t in g.outputs.items()}
        for run in range(100):
            inputs = random_inputs(g, rng)
            for a in outs.values():
                a.fill(np.nan)
            out = prog.run(**inputs, out=outs)
            check_outputs(g, inputs, out, f"run {run}")


def test_resident_requests_through_flagged_words(backend, rng):
    # every request is an invocation with its own stamp; requests run back to back
    g = random_chains(rng, 6)
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        assert flagged_slots(prog.plan)
        with megak.resident(prog) as r:
            pending = []
            for _ in range(6):
                inputs = random_inputs(g, rng)
                pending.append((inputs, r.submit(prog, **inputs)))
            for i, (inputs, h) in enumerate(pending):
                check_outputs(g, inputs, h.wait(), f"request {i}")
