"""Trace structure, on the simulator (CI) and the GPU (gpu tier)."""
import json

import numpy as np
import pytest

import megak
from megak import abi
from megak.trace import ORDER

P = abi.TRACE_PHASES


def traced(backend, rng):
    g = megak.Graph()
    a = g.input("a", (384, 256), "float32")
    b = g.input("b", (256, 300), "float32")
    y = g.gemm(g.transpose(g.gemm(a, b)), a)
    g.output(g.copy(y), "y")
    opts = {"n_sm": 8} if backend == "sim" else {}
    prog = megak.compile(g, backend=backend, **opts)
    x = {"a": rng.uniform(-1, 1, (384, 256)).astype(np.float32),
         "b": rng.uniform(-1, 1, (256, 300)).astype(np.float32)}
    plain = prog.run(**x)["y"]
    assert prog.last_trace is None            # only traced runs record
    out = prog.run(trace=True, **x)["y"]
    np.testing.assert_array_equal(out, plain)  # tracing does not change results
    return prog, prog.last_trace


def test_trace_structure(backend, rng):
    prog, tr = traced(backend, rng)
    plan = prog.plan
    ev = tr.events
    assert len(ev) == len(plan.instrs)
    assert tr.unit == ("step" if backend == "sim" else "ns")
    t = ev["t"].astype(np.int64)
    # the loader takes pages before it waits; the compute role runs after both
    assert (np.diff(t[:, ORDER], axis=1) >= 0).all(), "phase boundaries out of order"
    # every event sits at its queue position, on the SM that owns the queue
    qs = plan.queue_start.astype(np.int64)
    for sm in range(plan.n_sm):
        q = ev[qs[sm]:qs[sm + 1]]
        assert (q["sm"] == sm).all()
        assert (q["queue_index"] == np.arange(len(q))).all()
        assert (q["opcode"] == plan.queue(sm)["opcode"]).all()
        # one instruction computes at a time on an SM
        tq = t[qs[sm]:qs[sm + 1]]
        assert (tq[1:, P["MK_T_LOADED"]] >= tq[:-1, P["MK_T_COMPUTED"]]).all()
    # a consumer's wait ends after every producer it waited on has stored
    stored_by_counter = {}
    for i, rec in enumerate(plan.instrs):
        for k in range(int(rec["n_signals"])):
            c = int(rec["signal_counter"][k])
            stored_by_counter[c] = max(stored_by_counter.get(c, 0), t[i, P["MK_T_STORED"]])
    for i, rec in enumerate(plan.instrs):
        for k in range(int(rec["n_waits"])):
            assert t[i, P["MK_T_WAITED"]] >= stored_by_counter[int(rec["wait_counter"][k])]
    for sm in range(plan.n_sm):
        _, held = tr.pages_over_time(sm)
        assert (held >= 0).all() and (held <= plan.n_pages).all()
    bub = tr.bubble_fraction()
    assert bub.shape == (plan.n_sm,) and ((bub >= 0) & (bub <= 1)).all()


def test_trace_exports(tmp_path, rng):
    _, tr = traced("sim", rng)
    path = tmp_path / "trace.json"
    tr.save_json(path)
    data = json.loads(path.read_text())
    slices = [e for e in data["traceEvents"] if e["ph"] == "X" and e.get("cat") != "phase"]
    assert len(slices) == len(tr.events)
    tracks = {e["tid"] for e in data["traceEvents"] if e["ph"] == "M"}
    assert tracks == set(range(tr.n_sm))
    assert any(e["ph"] == "C" for e in data["traceEvents"])           # pages counters
    assert {e["name"] for e in data["traceEvents"] if e.get("cat") == "phase"} >= {"wait"}
    text = tr.summary()
    for label in tr.op_labels:
        assert label in text
    assert "idle (bubble) fraction" in text
    pytest.importorskip("matplotlib")
    png = tmp_path / "trace.png"
    tr.save_png(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_compares_bf16_gemms_with_tensor_core_ceiling():
    import numpy as np
    from megak.trace import DEFAULT_CEILINGS, Trace
    ev = np.zeros(2, dtype=abi.TRACE_DTYPE)
    ev["op_index"] = [0, 1]
    ev["t"][:, :] = np.arange(6) * 1000      # 5 us from fetch to store, 4 us running
    tr = Trace(events=ev, op_labels=["gemm #0", "gemm #1"], op_kinds=["gemm", "gemm"],
               op_flops=[4e9, 4e9], op_bytes=[1e6, 1e6], n_sm=1, n_pages=13,
               own_pages=np.array([4, 4]), op_dtypes=["float32", "bfloat16"])
    text = tr.summary()
    assert f"of {DEFAULT_CEILINGS['fp32_tflops']})" in text.splitlines()[1]
    assert f"of {DEFAULT_CEILINGS['bf16_tflops']})" in text.splitlines()[2]
