"""compile() refuses, before lowering, graphs too big to run, and drops ops no output needs."""
import numpy as np
import pytest

import megak
from megak import scheduler


def test_tensors_beyond_memory_are_refused_before_lowering(monkeypatch):
    g = megak.Graph()
    a = g.input("a", (10**6, 10**6))
    g.output(g.gemm(a, a), "c")
    lowered = []
    monkeypatch.setattr(megak.ops.REGISTRY["gemm"], "lower", lambda unit: lowered.append(unit))
    with pytest.raises(megak.GraphError, match=r"need 7450.58 GiB .* but .* are available"):
        megak.compile(g, backend="sim")
    assert not lowered


def test_instruction_cap_is_checked_before_lowering(monkeypatch):
    g = megak.Graph()
    x = g.input("x", (1000, 1000))
    g.output(g.transpose(x), "y")     # 8 x 8 tiles = 64 instructions
    monkeypatch.setattr(scheduler, "MAX_INSTRUCTIONS", 63)
    with pytest.raises(megak.GraphError, match="more than 63 instructions"):
        megak.compile(g, backend="sim")
    monkeypatch.setattr(scheduler, "MAX_INSTRUCTIONS", 64)
    assert len(megak.compile(g, backend="sim").plan.instrs) == 64


def test_memory_limit_is_the_callers(monkeypatch):
    g = megak.Graph()
    g.output(g.copy(g.input("x", (1024, 1024))), "y")     # 2 x 4 MiB
    with pytest.raises(megak.GraphError, match=r"need 8.00 MiB .* but 4.00 MiB"):
        scheduler.build_plan(g, n_sm=4, memory_bytes=4 << 20)
    scheduler.build_plan(g, n_sm=4, memory_bytes=8 << 20)


def test_ops_no_output_needs_are_dropped(rng):
    g = megak.Graph()
    x = g.input("x", (64, 32))
    w = g.input("w", (32, 16))
    unused = g.gemm(x, w)                 # nothing reads it
    g.transpose(g.copy(x))                # nor this chain
    y = g.copy(x)
    g.output(y, "y")
    prog = megak.compile(g, backend="sim", n_sm=4)
    assert prog.stats["dropped_ops"] == [g.ops[0].label, g.ops[1].label, g.ops[2].label]
    assert prog.stats["instructions_per_opcode"] == {"copy": 1}
    kinds = {t.slot: t.kind for t in prog.plan.tensors}
    assert kinds[unused.index] == "unused" and kinds[y.index] == "intermediate"
    xv = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
    out = prog.run(x=xv, w=rng.uniform(-1, 1, (32, 16)).astype(np.float32))
    np.testing.assert_array_equal(out["y"], xv)


def test_a_fused_away_tensor_gets_no_memory():
    g = megak.Graph()
    x = g.input("x", (40, 24))
    h = g.gemm(x, g.input("w", (24, 70)))
    g.output(g.add(h, g.input("r", (40, 70))), "y")
    prog = megak.compile(g, backend="sim", n_sm=4)
    assert {t.slot: t.kind for t in prog.plan.tensors}[h.index] == "unused"
    assert prog.stats["dropped_ops"] == []
