"""The simulator reports what the GPU would: hangs with the GPU's record, page leaks, bad
instructions, and (beyond the GPU) reads of regions that were not yet written."""
import numpy as np
import pytest

import megak
from megak import MegakernelError, MegakernelHang, abi
from megak.sim import SimExecutor


def two_stage(n_sm=3, **options):
    g = megak.Graph()
    a = g.input("a", (200, 130), "float32")
    h = g.gemm(a, g.transpose(a))        # (200, 200)
    g.output(g.copy(h), "y")
    return g, megak.compile(g, backend="sim", n_sm=n_sm, **options)


def inputs(rng):
    return {"a": rng.standard_normal((200, 130)).astype(np.float32)}


def test_planted_missing_signal_is_reported_as_a_hang(rng):
    g, prog = two_stage()
    x = inputs(rng)
    good = prog.run(**x)["y"]
    ins = prog.plan.instrs
    i = int(np.nonzero((ins["op_index"] == 1) & (ins["n_signals"] > 0))[0][0])
    saved = ins[i].copy()
    counter = int(ins["signal_counter"][i][0])
    ins["n_signals"][i] = 0                   # this gemm tile never signals
    with pytest.raises(MegakernelHang) as info:
        prog.run(**x)
    rec = info.value.record
    assert rec["error"] == abi.ERRORS["MK_ERR_TIMEOUT"]
    assert rec["counter"] == counter and rec["observed"] < rec["expected"]
    assert rec["opcode"] == abi.OPCODE_OF["copy"] and rec["op_index"] == 2
    msg = str(info.value)
    assert "copy #2" in msg and f"counter {counter}" in msg and "SM" in msg
    assert "no instruction produces it (a missing producer)" in msg
    assert any(s["error"] == abi.ERRORS["MK_ERR_TIMEOUT"] for s in info.value.sm_states)
    # restored, the next run succeeds: counters were reset after the failure
    ins[i] = saved
    np.testing.assert_array_equal(prog.run(**x)["y"], good)


def test_planted_page_leak_is_reported(rng):
    _, prog = two_stage(n_sm=1)
    ins = prog.plan.instrs
    i = int(np.nonzero(ins["pages"] > 0)[0][0])
    ins["flags"][i] |= abi.FLAG_DEBUG_LEAK_PAGE
    with pytest.raises(MegakernelError) as info:
        prog.run(**inputs(rng))
    assert not isinstance(info.value, MegakernelHang)
    assert info.value.record["error"] == abi.ERRORS["MK_ERR_PAGE_LEAK"]
    assert "MK_ERR_PAGE_LEAK" in str(info.value)


def test_leak_that_starves_a_later_instruction_is_reported_as_a_leak(rng):
    _, prog = two_stage(n_sm=1, n_pages=4)
    ins = prog.plan.instrs
    i = int(np.nonzero(ins["opcode"] == abi.OPCODE_OF["gemm"])[0][0])   # a later gemm needs all 4
    ins["flags"][i] |= abi.FLAG_DEBUG_LEAK_PAGE
    with pytest.raises(MegakernelError) as info:
        prog.run(**inputs(rng))
    assert info.value.record["error"] == abi.ERRORS["MK_ERR_PAGE_LEAK"]


@pytest.mark.parametrize("field,value,error", [
    ("opcode", 99, "MK_ERR_BAD_OPCODE"),
    ("pages", 14, "MK_ERR_PAGES"),
    ("n_waits", abi.MAX_WAITS + 1, "MK_ERR_BAD_DESCRIPTOR"),
])
def test_bad_instructions_are_reported(rng, field, value, error):
    _, prog = two_stage()
    prog.plan.instrs[field][0] = value
    with pytest.raises(MegakernelError) as info:
        prog.run(**inputs(rng))
    assert info.value.record["error"] == abi.ERRORS[error]


def test_bad_tensor_slot_is_reported(rng):
    _, prog = two_stage()
    prog.plan.instrs["tensor"][0, abi.ARG_A] = 1000
    with pytest.raises(MegakernelError) as info:
        prog.run(**inputs(rng))
    assert info.value.record["error"] == abi.ERRORS["MK_ERR_BAD_DESCRIPTOR"]


def test_missing_dependency_is_caught_as_a_race(rng):
    g, _ = two_stage()
    caught = 0
    for seed in range(12):
        # 3 SMs: queues of unequal length (4 SMs would get one transpose then one gemm tile
        # each, run in lockstep rounds: no consumer could ever overtake its producer)
        prog = megak.compile(g, backend="sim", n_sm=3, order="random", seed=seed)
        prog.plan.instrs["n_waits"][:] = 0        # drop every dependency
        prog.plan.counter_targets[:] = 0
        try:
            prog.run(**inputs(rng))
        except MegakernelError as e:
            assert "race" in str(e) and "missing dependency" in str(e)
            caught += 1
    assert caught > 0


def test_random_orders_agree_with_round_robin(rng):
    x = inputs(rng)
    _, rr = two_stage(n_sm=5)
    ref = rr.run(**x)["y"]
    for seed in range(5):
        _, prog = two_stage(n_sm=5, order="random", seed=seed)
        np.testing.assert_array_equal(prog.run(**x)["y"], ref)


def test_slots_overlap_pages_and_respect_the_budget(rng):
    # copy (no pages), transpose (edge tiles: pages held unused) and gemm (4 pages) share an
    # SM; the slots may hold up to SLOTS x 4
    _, prog = two_stage(n_sm=1)
    prog.run(**inputs(rng))
    peak = prog._executor.last_peak_pages[0]
    assert 4 <= peak <= prog.plan.n_pages
    # with exactly 4 pages a gemm must wait for the previous gemm's release: still completes
    _, tight = two_stage(n_sm=1, n_pages=4)
    tight.run(**inputs(rng))
    assert tight._executor.last_peak_pages[0] == 4


def test_executes_the_encoded_bytes(rng, monkeypatch):
    _, prog = two_stage()
    seen = {}
    real = abi.decode

    def spy(data):
        seen["bytes"] = bytes(data)
        return real(data)
    monkeypatch.setattr(abi, "decode", spy)
    prog.run(**inputs(rng))
    assert seen["bytes"] == prog.plan.encoded()


def test_order_is_validated():
    _, prog = two_stage()
    with pytest.raises(ValueError, match="round_robin"):
        SimExecutor(prog.plan, order="chaos")


def test_bad_activation_is_a_bad_descriptor(rng):
    _, prog = two_stage()
    ins = prog.plan.instrs
    i = int(np.nonzero(ins["opcode"] == abi.OPCODE_OF["gemm"])[0][0])
    ins["flags"][i] |= 9 << abi.FLAG_ACT_SHIFT
    with pytest.raises(MegakernelError) as info:
        prog.run(**inputs(rng))
    assert info.value.record["error"] == abi.ERRORS["MK_ERR_BAD_DESCRIPTOR"]


@pytest.mark.parametrize("kind,param", [("softmax", float("inf")), ("softmax", float("nan")),
                                        ("layernorm", 0.0), ("rmsnorm", -1e-6),
                                        ("rmsnorm", float("inf"))])
def test_rowwise_records_with_a_bad_scalar_are_bad_descriptors(kind, param):
    from megak.ops.base import param_bits
    g = megak.Graph()
    x = g.input("x", (4, 8))
    w = g.input("w", (8,))
    y = {"softmax": lambda: g.softmax(x), "layernorm": lambda: g.layernorm(x, w, w),
         "rmsnorm": lambda: g.rmsnorm(x, w)}[kind]()
    g.output(y, "y")
    prog = megak.compile(g, backend="sim", n_sm=1)
    prog.plan.instrs["param"] = param_bits(param)
    with pytest.raises(megak.MegakernelError, match="BAD_DESCRIPTOR"):
        prog.run(x=np.ones((4, 8), np.float32), w=np.ones(8, np.float32))
