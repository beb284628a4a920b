"""The pure parts of the benchmark report and the memory audit (no GPU): metric values, ratios,
targets, the JSON schema, markdown, the chart, ncu CSV parsing; and the workloads' builders and
correctness checks, run on the simulator at small sizes (the call path, W7, with numpy arrays
standing in for torch tensors). Timing helpers run on fake clocks; no measured time is judged."""
import json

import numpy as np
import pytest

import megak
from benchmarks import audit as A
from benchmarks import report as R
from benchmarks import workloads as W


# ---- fixtures --------------------------------------------------------------------------------

def result(workload, variant, us, metric="us", work=0.0, check="exact"):
    return R.make_result(workload, variant, [us * 0.98, us, us * 1.05], metric, work, check)


@pytest.fixture
def doc():
    flops = 2.0 * 8192 ** 3
    res = [result("W1", v, us, "us/op", 1000) for v, us in
           (("megak", 700.0), ("separate", 5000.0), ("graph", 1000.0), ("graph_pdl", 1050.0),
            ("torch", 6000.0), ("torch_graph", 1100.0))]
    res += [result("W3-8192-fp32", "megak", 30000.0, "TFLOP/s", flops),
            result("W3-8192-fp32", "torch", 21000.0, "TFLOP/s", flops),
            result("W2-1024x16-fp32", "megak", 60.0), result("W2-1024x16-fp32", "graph", 90.0),
            R.make_result("W6-lower-100k", "megak", [180e3, 190e3, 200e3], "ms", 0, "checked")]
    return {"machine": {"gpu": "NVIDIA H200", "sm_count": 132, "arch": "sm_90a",
                        "driver_version": "580.1", "cuda_driver_api": "13.0", "nvrtc": "13.0",
                        "packages": {"numpy": "2.4.6", "torch": None}},
            "date": "2026-11-29", "results": res,
            "failures": [{"workload": "W5-1GiB", "variant": "megak",
                          "error": "timing/check: CheckError: not exact"}],
            "skipped": [{"variant": "torch_graph", "reason": "example"}],
            "not_yet_available": dict(W.NOT_YET_AVAILABLE),
            "descriptions": {"W1": "a chain"}, "notes": {"W1": ["1000 ops on 132 SMs"]}}


# ---- metric values, results, ratios ------------------------------------------------------------

def test_metric_values():
    assert R.metric_value("us/op", 800.0, 1000) == pytest.approx(0.8)
    assert R.metric_value("us", 12.5, 0) == 12.5
    assert R.metric_value("ms", 182_000.0, 0) == pytest.approx(182.0)
    # 2 * 8192^3 flops in 24.43 ms = 45 TFLOP/s
    assert R.metric_value("TFLOP/s", 24_433.0, 2.0 * 8192 ** 3) == pytest.approx(45.0, rel=1e-3)
    # 2 GiB read + written in 500 us = 4295 GB/s
    assert R.metric_value("GB/s", 500.0, 2.0 * 2 ** 30) == pytest.approx(4294.97, rel=1e-5)
    with pytest.raises(ValueError, match="allowed"):
        R.metric_value("flops", 1.0, 1.0)
    with pytest.raises(ValueError, match="> 0"):
        R.metric_value("us", 0.0, 0)


def test_make_result_is_a_median_with_spread():
    r = R.make_result("W1", "megak", [3.0, 1.0, 2.0, 100.0], "us/op", 2, "exact")
    assert r["median_us"] == 2.5 and r["value"] == 1.25
    assert (r["reps"], r["min_us"], r["max_us"]) == (4, 1.0, 100.0)
    assert (r["p10_us"], r["p90_us"]) == pytest.approx((1.3, 70.9))   # numpy's linear rule
    assert set(R.RESULT_KEYS) <= set(r)
    with pytest.raises(ValueError, match="no timed runs"):
        R.make_result("W1", "megak", [], "us", 0, "")


def test_speeds_vs_megak_and_best_other():
    variants = {r["variant"]: r for r in (result("X", "megak", 10.0), result("X", "graph", 20.0),
                                           result("X", "torch", 5.0))}
    sp = R.speeds(variants)
    assert sp["megak"]["vs_megak"] == 1.0
    assert sp["graph"]["vs_megak"] == pytest.approx(0.5)      # twice as slow as megak
    assert sp["torch"]["vs_megak"] == pytest.approx(2.0)      # twice as fast
    assert sp["megak"]["best_other"] == "torch"
    assert sp["megak"]["vs_best_other"] == pytest.approx(0.5)  # megak loses to torch 2x
    assert sp["torch"]["vs_best_other"] == 1.0
    only = R.speeds({"megak": result("Y", "megak", 3.0)})
    assert only["megak"]["vs_best_other"] is None and only["megak"]["vs_megak"] == 1.0
    no_megak = R.speeds({"graph": result("Z", "graph", 3.0)})
    assert no_megak["graph"]["vs_megak"] is None


def test_targets_met_and_missed_in_both_directions():
    lower = R.Target("us/op", "<=", 0.8, "")
    assert lower.gap(0.8) == "met" and lower.gap(0.5) == "met"
    assert lower.gap(1.0) == "missed by 0.2 us/op (25%)"
    higher = R.Target("TFLOP/s", ">=", 45.0, "")
    assert higher.gap(50.0) == "met"
    assert higher.gap(36.0) == "missed by 9 TFLOP/s (20%)"
    assert higher.gap(None) == "not measured"
    assert R.TARGETS["W5-1GiB"].text() == ">= 4,100 GB/s"
    assert R.TARGETS["W1"].text() == "<= 0.45 us/op"


def test_targets_are_the_open_issues():
    t = R.TARGETS
    assert (t["W1"].op, t["W1"].value, t["W1"].metric) == ("<=", 0.45, "us/op")
    assert t["W2-1024x16-bf16"].value == 20 and t["W2-4096x8-bf16"].value == 70
    assert t["W2-8192x8-bf16"].value == 255
    assert t["W2-4096x8-bf16-b1"].value == 68 and t["W2-4096x8-bf16-b64"].value == 80
    for name in ("W2-4096x8-bf16-b1", "W2-4096x8-bf16-b64"):
        assert (t[name].metric, t[name].op, t[name].baseline) == ("us", "<=",
                                                                  "60 us at 4.48 TB/s")
    assert t["W3-8192-fp32"].value == 45 and t["W3-8192-bf16"].value == 650
    assert t["W4-16384-fp32"].value == 3700 and t["W5-1GiB"].value == 4100
    assert t["W6-lower-100k"].value == 1000 and t["W6-lower-100k"].metric == "ms"
    # every target is either measured by a workload or listed as not yet available
    for name in t:
        assert (name in W.FACTORIES) != (name in W.NOT_YET_AVAILABLE), name


def test_registry_names():
    assert list(W.FACTORIES) == ["W1", "W2-1024x16-fp32", "W2-4096x8-fp32", "W3-4096-fp32",
                                 "W3-8192-fp32", "W2-1024x16-bf16", "W2-4096x8-bf16",
                                 "W2-4096x8-bf16-b1", "W2-4096x8-bf16-b64",
                                 "W2-8192x8-bf16", "W3-4096-bf16", "W3-512x4096x4096-bf16",
                                 "W3-8192-bf16", "W4-16384-fp32", "W5-1GiB",
                                 "W6-lower-100k", "W6-compile-cold", "W6-compile-cached",
                                 "W7-call-copy", "W7-call-mlp1024"]
    assert W.NOT_YET_AVAILABLE == {}
    assert set(W.QUICK) <= set(W.FACTORIES)
    assert "W3-8192-fp32" not in W.QUICK and "W5-1GiB" not in W.QUICK
    for name in ("W2-1024x16-fp32", "W2-4096x8-bf16-b1", "W2-4096x8-bf16-b64",
                 "W3-8192-fp32", "W3-512x4096x4096-bf16", "W4-16384-fp32", "W5-1GiB"):
        w = W.get(name)   # builders only: nothing allocated until make_inputs
        assert w.name == name and w.metric in R.METRICS
        # megak_trace (the traced build) and megak_const (constant weights), W2 only, fall
        # back to megak's rep counts; the call-path variants are W7's own
        assert set(w.reps) | {"megak_trace", "megak_const"} == \
            set(W.VARIANTS) - set(W.CALL_VARIANTS) | {
            "torch", "torch_graph"}
    with pytest.raises(KeyError, match="known"):
        W.get("W9")


@pytest.mark.parametrize("batch", [1, 64])
def test_w2_batch_forms_are_the_w2_4096_bf16_chain(batch):
    w, base = W.get(f"W2-4096x8-bf16-b{batch}"), W.get("W2-4096x8-bf16")
    assert w.name == f"W2-4096x8-bf16-b{batch}" and base.name == "W2-4096x8-bf16"
    g, gb = w.build(), base.build()
    assert g.inputs["x"].shape == (batch, 4096) and g.inputs["x"].dtype == "bfloat16"
    assert gb.inputs["x"].shape == (16, 4096)
    # the same weights, ops and per-layer outputs as the batch-16 chain
    assert [(n, t.shape, t.dtype) for n, t in g.inputs.items() if n != "x"] == \
        [(n, t.shape, t.dtype) for n, t in gb.inputs.items() if n != "x"]
    assert [op.kind for op in g.ops] == ["gemm"] * 8 and list(g.outputs) == list(gb.outputs)
    assert f"x ({batch}, 4096)" in w.description
    assert (w.metric, w.reps, w.weight_bytes) == (base.metric, base.reps, base.weight_bytes)
    assert w.weight_bytes == 8 * 4096 * 4096 * 2 == 256 << 20
    # listed right after the batch-16 chain, measured with the same variants
    names = list(W.FACTORIES)
    i = names.index("W2-4096x8-bf16")
    assert names[i + 1:i + 3] == ["W2-4096x8-bf16-b1", "W2-4096x8-bf16-b64"]
    assert w.kind == "gpu" and set(w.reps) == set(base.reps)
    assert W.w2(64, 2).name == "W2-64x2-fp32" and W.w2(64, 2, batch=3).name == "W2-64x2-fp32-b3"


def test_weight_bytes_of_the_workloads():
    assert W.get("W2-1024x16-fp32").weight_bytes == 16 * 1024 * 1024 * 4
    assert W.get("W2-8192x8-bf16").weight_bytes == 8 * 8192 * 8192 * 2
    for name in ("W1", "W3-8192-fp32", "W5-1GiB", "W7-call-mlp1024", "W7-call-copy"):
        assert W.get(name).weight_bytes == 0, name   # W7: warm L2, no weight bandwidth


def test_weight_bandwidth_of_a_result():
    # 256 MiB of weights in 60 us: 4.47 TB/s (the "60 us at 4.48 TB/s" of the targets)
    assert R.weights_tb_s(256 << 20, 60.0) == pytest.approx(4.4739, rel=1e-4)
    assert R.weights_tb_s(1e12, 1e6) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="> 0"):
        R.weights_tb_s(1e9, 0.0)
    r = dict(result("W2-4096x8-bf16-b1", "torch_graph", 100.0))
    r.update(R.weight_fields(W.get("W2-4096x8-bf16-b1").weight_bytes, r["median_us"]))
    assert r["weight_bytes"] == 268_435_456 and isinstance(r["weight_bytes"], int)
    assert r["weights_tb_s"] == pytest.approx(268_435_456 / 100e-6 / 1e12)
    R.validate_doc({"machine": {"gpu": "G"}, "date": "2026-11-29", "results": [r]})
    with pytest.raises(ValueError, match="weights_tb_s"):
        R.validate_doc({"machine": {"gpu": "G"}, "date": "2026-11-29",
                        "results": [dict(r, weights_tb_s=float("nan"))]})
    # bytes in flight per SM: the stream's pages, 0 where a program streams no weights
    assert R.bytes_in_flight_per_sm({"stream_pages": 4}) == 4 * 16384
    assert R.bytes_in_flight_per_sm({"instructions": 3}) == 0
    assert R.fmt_kib(4 * 16384) == "64 KiB"


def test_gpu_slug_and_paths(tmp_path):
    assert R.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert R.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    p = R.output_paths(tmp_path, "NVIDIA H200", "2026-11-29", quick=False)
    assert p["json"] == tmp_path / "results" / "nvidia-h200-2026-11-29.json"
    assert p["png"] == tmp_path / "results" / "nvidia-h200-2026-11-29.png"
    assert p["md"] == tmp_path / "RESULTS.md"
    q = R.output_paths(tmp_path, "NVIDIA H200", "2026-11-29", quick=True)
    assert q["json"].name == "nvidia-h200-2026-11-29-quick.json"
    assert q["md"].name == "RESULTS-quick.md"


# ---- schema ------------------------------------------------------------------------------------

def test_schema_round_trip(doc, tmp_path):
    path = tmp_path / "r.json"
    R.write_json(doc, path)
    back = json.loads(path.read_text())
    R.validate_doc(back)
    assert back["machine"]["gpu"] == "NVIDIA H200" and back["date"] == "2026-11-29"
    for r in back["results"]:
        assert isinstance(r["workload"], str) and isinstance(r["variant"], str)
        assert isinstance(r["median_us"], float) and isinstance(r["value"], float)
        assert isinstance(r["metric"], str)


@pytest.mark.parametrize("breakage, match", [
    (lambda d: d.pop("machine"), "machine"),
    (lambda d: d.update(date="29/11/2026"), "YYYY-MM-DD"),
    (lambda d: d["results"][0].pop("value"), "value"),
    (lambda d: d["results"][0].update(median_us="fast"), "median_us"),
    (lambda d: d["results"][0].update(value=True), "value"),
    (lambda d: d["results"][0].update(metric="flops"), "metric"),
    (lambda d: d["results"][0].update(variant="cublas"), "variant"),
    (lambda d: d["results"][0].update(median_us=-1.0), "finite"),
    (lambda d: d["results"].append(dict(d["results"][0])), "duplicate"),
])
def test_schema_rejects(doc, breakage, match, tmp_path):
    breakage(doc)
    with pytest.raises(ValueError, match=match):
        R.write_json(doc, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


# ---- markdown ----------------------------------------------------------------------------------

def test_markdown(doc):
    md = R.render_markdown(doc, audit_md="| op | grid |\n|---|---|\n| copy | 1 |",
                           chart="results/x.png", json_name="x.json")
    assert "NVIDIA H200" in md and "580.1" in md and "numpy 2.4.6" in md
    assert "![speed of each variant relative to megak](results/x.png)" in md
    # one table per workload, every variant a row
    for name in ("W1", "W3-8192-fp32", "W2-1024x16-fp32", "W6-lower-100k"):
        assert f"### {name}" in md
    w1 = md.split("### W1")[1].split("###")[0]
    for v in W.VARIANTS:
        # megak_trace, megak_const: timed on the W2 chains only; megak_run, _bound,
        # _launch, _resident, _resident_bound: W7 only
        if v not in ("megak_trace", "megak_const", "megak_run", "megak_bound",
                     "megak_launch", "megak_resident", "megak_resident_bound"):
            assert f"| {v} |" in w1
    # W1: 0.7 us/op misses <= 0.45; megak vs best other (graph, 1000 us) = 1.43x
    assert ("| megak | 3 | 700.0 | 0.700 | 1.00x | 1.43x | exact | <= 0.45 us/op: **missed by "
            "0.25 us/op (56%)** |") in md
    assert "| separate | 3 | 5,000 | 5.000 | 0.14x |" in md
    # W3: 36.65 TFLOP/s misses 45 by 8.35 (19%)
    assert "missed by 8.35 TFLOP/s (19%)" in md
    assert "(see W2-1024x16-bf16: <= 20 us)" in md
    # the summary names every target, including the not-yet-available and failed ones
    summary = md.split("## Targets")[1].split("##")[0]
    for name in R.TARGETS:
        assert f"| {name} |" in summary
    assert "| W5-1GiB | >= 4,100 GB/s | FAILED (see Failures) |" in summary
    assert "| W4-16384-fp32 | >= 3,700 GB/s | not run |" in summary
    assert "**FAILED** W5-1GiB / megak: timing/check: CheckError: not exact" in md
    assert "- torch_graph: example" in md
    assert "Note: 1000 ops on 132 SMs" in md
    assert md.split("## Memory audit (Nsight Compute)")[1].strip().startswith("| op | grid |")
    assert "Quick smoke run" not in md


def test_markdown_hop_section(doc):
    assert "The dependent hop" not in R.render_markdown(doc)   # not measured: no section
    doc["hop"] = {"n_hops": 1000, "sm_count": 132, "reps": 20, "word_us": 0.251,
                  "flag_us": 0.67, "ratio": 2.67}
    md = R.render_markdown(doc)
    hop = md.split("### The dependent hop (benchmarks/hop.py)")[1].split("##")[0]
    assert "| data as its own flag (one 64-bit word, value + epoch, relaxed) | 0.251 |" in hop
    assert "| separate flag (release / acquire) | 0.670 |" in hop
    assert "| megak W1 (a copy instruction per hop, whole megakernel) | 0.700 |" in hop
    assert "2.67x" in hop


def test_markdown_quick_and_no_audit(doc):
    doc["quick"] = True
    md = R.render_markdown(doc)
    assert "Quick smoke run" in md
    assert "Not run yet: `python -m benchmarks.audit`" in md
    assert "![" not in md


def w2_rows(name="W2-4096x8-bf16-b1", in_flight=4 * 16384):
    wb = W.get(name).weight_bytes
    rows = []
    for v, us in (("megak", 120.0), ("megak_trace", 123.0), ("graph", 200.0),
                  ("torch", 150.0), ("torch_graph", 80.0)):
        r = result(name, v, us)
        r.update(R.weight_fields(wb, r["median_us"]))
        rows.append(r)
    if in_flight is not None:
        rows[0]["bytes_in_flight_per_sm"] = in_flight
    return rows


def test_markdown_renders_the_weight_bandwidth_of_w2_rows(doc, tmp_path):
    doc["results"] += w2_rows()
    path = tmp_path / "r.json"
    R.write_json(doc, path)
    md = R.render_markdown(json.loads(path.read_text()))
    table = md.split("### W2-4096x8-bf16-b1")[1].split("###")[0]
    assert "| check | target | weights (TB/s) |\n|---|---|---|---|---|---|---|---|---|" in table
    # 256 MiB in 120 us = 2.24 TB/s; in 80 us = 3.36 TB/s
    assert ("| megak | 3 | 120.0 | 120.0 | 1.00x | 0.67x | exact | <= 68 us: **missed by 52 us "
            "(76%)** | 2.237 |") in table
    assert "| torch_graph | 3 | 80.00 | 80.00 | 1.50x | 1.00x | exact |  | 3.355 |" in table
    assert ("Weights: 256 MiB (268,435,456 B) read per run; *weights (TB/s)* = those bytes / "
            "the median time, the effective weight bandwidth (megak: **2.237 TB/s**).") in table
    assert ("Bytes in flight per SM, at most (megak's weight stream: a ring of 4 pages of "
            "16 KiB): **64 KiB**.") in table
    # the targets table lists both batch forms
    summary = md.split("## Targets")[1].split("##")[0]
    assert "| W2-4096x8-bf16-b1 | <= 68 us | 120.0 us | **missed by 52 us (76%)** |" in summary
    assert ("| W2-4096x8-bf16-b64 | <= 80 us | not run | not measured | | | 60 us at 4.48 TB/s "
            "|") in summary
    # workloads without weights keep their columns
    assert "weights (TB/s)" not in md.split("### W1")[1].split("###")[0]
    # a program without a weight stream says so
    doc["results"] = w2_rows(in_flight=0)
    md = R.render_markdown(doc)
    assert "Bytes in flight per SM: none (the program streams no weights)." in md


def test_older_results_without_weight_fields_still_render(doc, tmp_path):
    old = [{k: v for k, v in r.items()
            if k not in ("weight_bytes", "weights_tb_s", "bytes_in_flight_per_sm")}
           for r in w2_rows()]
    doc["results"] += old
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    assert R.main(["--out-dir", str(tmp_path), "--render-only", str(path)]) == 0
    md = (tmp_path / "RESULTS.md").read_text()
    table = md.split("### W2-4096x8-bf16-b1")[1].split("###")[0]
    assert "| check | target |\n|---|---|---|---|---|---|---|---|\n" in table
    assert "TB/s" not in table and "in flight" not in table


def test_chart(doc, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "c.png"
    assert R.write_chart(doc, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # nothing to compare (megak alone): no chart
    lonely = dict(doc, results=[r for r in doc["results"] if r["variant"] == "megak"])
    assert not R.write_chart(lonely, tmp_path / "d.png")
    assert not (tmp_path / "d.png").exists()


def test_write_outputs_embeds_newest_audit_and_renders_again(doc, tmp_path):
    import importlib.util
    # CI without matplotlib: the report is written without its chart
    charts = importlib.util.find_spec("matplotlib") is not None
    results = tmp_path / "results"
    results.mkdir()
    audit_doc = {"machine": {"gpu": "NVIDIA H200"}, "date": "2026-11-29", "ncu": "2025.3",
                 "ops": [{"case": "copy", "op": "copy (W5-8192x8192)", "grid": 4096,
                          "derived": {"ld_requests": 100.0, "ld_sectors_per_request": 16.0,
                                      "registers_per_thread": 40.0}, "ptxas": {}}],
                 "failures": []}
    (results / "audit-2026-11-28.json").write_text(json.dumps({**audit_doc, "ops": []}))
    (results / "audit-2026-11-29.json").write_text(json.dumps(audit_doc))
    paths = R.write_outputs(doc, tmp_path)
    assert set(paths) == ({"json", "png", "md"} if charts else {"json", "md"})
    md = paths["md"].read_text()
    assert "| copy (W5-8192x8192) | 4,096 | 16.00 (100) |" in md
    assert ("results/nvidia-h200-2026-11-29.png" in md) == charts
    paths["md"].unlink()
    assert R.main(["--out-dir", str(tmp_path), "--render-only"]) == 0
    assert paths["md"].read_text() == md


def test_report_without_gpu_fails_cleanly(monkeypatch, capsys, tmp_path):
    import megak.runtime.driver as driver
    monkeypatch.setattr(driver, "gpu_usable", lambda: False)
    monkeypatch.setattr(driver, "gpu_unusable_reason", lambda: "no driver (test)")
    assert R.main(["--out-dir", str(tmp_path)]) == 2
    assert "needs a GPU: no driver (test)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_host_runner_checks_every_run():
    calls = []
    w = W.HostWorkload(name="H", description="", setup=lambda: "state",
                       prepare=lambda st: len(calls), step=lambda st, p: p * 2,
                       check=lambda st, prod: calls.append(prod) or "ok", cleanup=W._noop,
                       reps=(3, 1))
    res, fails, notes = R.run_host_workload(w, quick=False, log=lambda *a: None)
    assert fails == [] and notes == ["ok"] and calls == [0, 2, 4, 6]
    assert res[0]["variant"] == "megak" and res[0]["metric"] == "ms" and res[0]["reps"] == 3

    def bad(st, prod):
        raise W.CheckError("wrong product")
    w.check = bad
    res, fails, _ = R.run_host_workload(w, quick=False, log=lambda *a: None)
    assert res == [] and "wrong product" in fails[0]["error"]


# ---- correctness checks -------------------------------------------------------------------------

def test_check_bounded_and_exact():
    ref = np.array([[1.0, 2.0]])
    bound = np.array([[0.1, 0.0]])
    got = np.array([[1.05, 2.0]], dtype=np.float32)
    assert W.check_bounded(got, ref, bound, "t") == pytest.approx(0.5, rel=1e-6)
    with pytest.raises(W.CheckError, match="exceeds the bound"):
        W.check_bounded(np.array([[1.2, 2.0]], dtype=np.float32), ref, bound, "t")
    with pytest.raises(W.CheckError, match="exceeds"):   # zero bound: no error allowed
        W.check_bounded(np.array([[1.0, 2.000001]], dtype=np.float32), ref, bound, "t")
    with pytest.raises(W.CheckError, match="non-finite"):
        W.check_bounded(np.array([[np.nan, 2.0]], dtype=np.float32), ref, bound, "t")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert W.check_exact(x.copy(), x, "t") == 0.0
    y = x.copy()
    y[1, 2] = np.nextafter(y[1, 2], np.float32(0))
    with pytest.raises(W.CheckError, match=r"\(1, 2\)"):
        W.check_exact(y, x, "t")
    assert W.check_transpose_exact(np.ascontiguousarray(x.T), x, "t") == 0.0
    with pytest.raises(W.CheckError, match="transpose not exact"):
        W.check_transpose_exact(np.ascontiguousarray(y.T), x, "t")


def test_gemm_bound_holds_for_fp32_and_catches_errors(rng):
    a = rng.standard_normal((64, 300), dtype=np.float32)
    b = rng.standard_normal((300, 40), dtype=np.float32)
    ref = W.gemm_reference(a, b, rng)
    assert ref.rows is None   # small: full reference
    got = a @ b
    assert 0 < ref.check(got, "fp32") <= 1.0
    # an error of one part in 1e3 is far outside 2 K u |a||b|
    bad = got.copy()
    bad[5, 7] *= 1.001
    with pytest.raises(W.CheckError, match=r"\(5, 7\)"):
        ref.check(bad, "bad")
    with pytest.raises(W.CheckError, match="float32"):
        ref.check(got.astype(np.float64), "dtype")


def test_stratified_sampling_hits_every_tile(rng):
    idx = W.stratified(8192, 64, rng)
    assert idx[-1] == 8191 and (np.diff(idx) > 0).all()
    assert set(range(64)) == set((idx // 128).tolist())  # every 128-row tile sampled
    assert set(range(128)) == set((idx // 64).tolist())
    assert W.stratified(10, 64, rng).tolist()[-1] == 9


def test_sampled_gemm_reference_catches_a_wrong_tile(rng):
    a = rng.standard_normal((300, 64), dtype=np.float32)
    b = rng.standard_normal((64, 260), dtype=np.float32)
    ref = W.gemm_reference(a, b, rng, full_max_mnk=0)
    assert ref.rows is not None and ref.cols is not None
    got = a @ b
    ref.check(got, "sampled")
    bad = got.copy()
    bad[256:300, 128:256] = 0.0   # one wrong output tile, wherever the samples fall
    with pytest.raises(W.CheckError):
        ref.check(bad, "sampled")


def test_chain_checks_every_layer_on_its_computed_input(rng):
    x = rng.standard_normal((4, 32), dtype=np.float32)
    ws = [rng.standard_normal((32, 32), dtype=np.float32) / np.float32(6) for _ in range(5)]
    names = ["h0", "h1", "h2", "h3", "y"]
    ref = W.chain_reference(x, ws, names)
    outs, y = {}, x
    for w, name in zip(ws, names):
        y = y @ w   # fp32 along the chain, as the device does
        outs[name] = y
    assert 0 < ref.check(outs, "fp32") <= 1.0
    # a wrong middle layer is caught there, even if later layers are consistent with it
    bad = dict(outs, h2=outs["h2"] * np.float32(1.0001))
    with pytest.raises(W.CheckError, match=r"layer 2 \(h2\)"):
        ref.check(bad, "bad")
    with pytest.raises(W.CheckError, match="non-finite"):
        ref.check(dict(outs, h1=np.full_like(outs["h1"], np.nan)), "poisoned")


# ---- workloads on the simulator (small sizes) ---------------------------------------------------

def sim_run(w, rng, n_sm=8):
    prog = megak.compile(w.build(), backend="sim", n_sm=n_sm)
    inputs = w.make_inputs(rng)
    return prog, inputs, w.reference(inputs, rng), prog.run(**inputs)


def test_w1_chain_on_the_simulator(rng):
    w = W.w1(n_ops=40)
    prog, inputs, ref, out = sim_run(w, rng)
    note = w.plan_check(prog.plan)
    assert "40 ops on 8 SMs" in note
    assert w.check(ref, out, "sim") == 0.0
    assert w.work == 40 and w.metric == "us/op"
    bad = dict(out, y=out["y"] + np.float32(1))
    with pytest.raises(W.CheckError, match="not exact"):
        w.check(ref, bad, "sim")
    assert W.w1().name == "W1"


def test_w1_placement_check_rejects_one_sm(rng):
    w = W.w1(n_ops=5)
    prog = megak.compile(w.build(), backend="sim", n_sm=1)
    with pytest.raises(W.CheckError, match="both on SM 0"):
        w.plan_check(prog.plan)


def test_instruction_sms_with_empty_queues():
    class P:
        instrs = np.zeros(3)
        queue_start = np.array([0, 0, 2, 2, 3], dtype=np.uint32)
    assert W.instruction_sms(P).tolist() == [1, 1, 3]


def test_w2_chain_on_the_simulator(rng):
    w = W.w2(hidden=96, layers=3, batch=16)
    assert w.name == "W2-96x3-fp32" and w.metric == "us"
    prog, inputs, ref, out = sim_run(w, rng)
    assert sorted(inputs) == ["w0", "w1", "w2", "x"]
    assert sorted(out) == ["h0", "h1", "y"]
    assert 0 < w.check(ref, out, "sim") <= 1.0
    bad = dict(out, y=out["y"] * np.float32(1.001))
    with pytest.raises(W.CheckError, match="layer 2"):
        w.check(ref, bad, "sim")


def test_w3_gemm_sampled_on_the_simulator(rng):
    w = W.w3(200, full_max_mnk=0)   # force the sampled check of the large sizes
    assert w.work == 2.0 * 200 ** 3
    prog, inputs, ref, out = sim_run(w, rng)
    assert ref.rows is not None
    assert 0 < w.check(ref, out, "sim") <= 1.0
    bad = {"y": out["y"].copy()}
    bad["y"][128:200, 0:128] += np.float32(1)
    with pytest.raises(W.CheckError):
        w.check(ref, bad, "sim")


@pytest.mark.parametrize("make", [lambda: W.w4(136), lambda: W.w5(70, 300)])
def test_w4_w5_exact_on_the_simulator(make, rng):
    w = make()
    assert w.metric == "GB/s"
    prog, inputs, ref, out = sim_run(w, rng)
    assert w.check(ref, out, "sim") == 0.0
    x = inputs["x"]
    assert w.work == 2 * x.nbytes
    with pytest.raises(W.CheckError):
        w.check(ref, {"y": np.zeros_like(out["y"])}, "sim")


def test_w6_lower_checks_its_product():
    w = W.w6_lower()
    g = w.setup()
    plan, data = w.step(g, None)
    assert "100,352 instructions" in w.check(g, (plan, data))
    with pytest.raises(W.CheckError, match="decode"):
        w.check(g, (plan, data[:-128] + bytes(128)))


# ---- memory audit: ncu output -------------------------------------------------------------------

LONG_CSV = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "megak_op" - 0: 0%....50%....100% - 9 passes
AUDIT_TARGET {"case": "copy"}
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum.per_second","Tbyte/second","3.52"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","152.58"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum","request","1,048,576"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum","Msector","16.78"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_requests_pipe_lsu_mem_global_op_st.sum","request","0"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum","sector","0"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","launch__registers_per_thread","register/thread","40"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum","byte","0"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","sm__warps_active.avg.pct_of_peak_sustained_active","%","12.41"
"0","4242","python3.12","127.0.0.1","megak_op","1","13","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum","sector","n/a"
'''

RAW_CSV = '''"ID","Process ID","Kernel Name","dram__bytes.sum.per_second","launch__registers_per_thread","l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum","l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
"","","","byte/second","register/thread","sector","request"
"0","7","megak_op","3,500,000,000,000","64","4096","512"
"1","7","megak_op","1,000,000,000,000","64","800","100"
'''


def test_parse_long_csv_and_derive():
    ks = A.parse_ncu_csv(LONG_CSV)
    assert len(ks) == 1 and ks[0]["id"] == "0" and ks[0]["kernel"] == "megak_op"
    m = ks[0]["metrics"]
    assert m[A.DRAM_BW] == (pytest.approx(3.52e12), "Tbyte/second")
    assert m[A.LD_REQUESTS][0] == 1_048_576
    assert m["l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum"][0] is None
    d = A.derive(m)
    assert d["ld_sectors_per_request"] == pytest.approx(16.0, rel=1e-3)
    assert d["st_sectors_per_request"] is None and d["st_requests"] == 0   # no stores: no ratio
    assert d["ldgsts_sectors_per_request"] is None
    assert d["registers_per_thread"] == 40 and d["local_bytes"] == 0
    assert d["occupancy_pct"] == pytest.approx(12.41)
    assert d["dram_gbps"] == pytest.approx(3520.0)
    assert d["duration_us"] == pytest.approx(152.58)


def test_parse_raw_csv():
    ks = A.parse_ncu_csv("==PROF== x\n" + RAW_CSV)
    assert [k["id"] for k in ks] == ["0", "1"]
    d = A.derive(ks[1]["metrics"])
    assert d["ld_sectors_per_request"] == 8.0 and d["dram_gbps"] == pytest.approx(1000.0)


def test_units_and_numbers():
    assert A.parse_number("1,234.5") == 1234.5 and A.parse_number("n/a") is None
    assert A.to_base(2.0, "Gbyte/second") == 2e9
    assert A.to_base(2.0, "Kbyte") == 2e3 and A.to_base(1.0, "KiByte") == 1024
    assert A.to_base(3.0, "Ksector") == 3000 and A.to_base(5.0, "%") == 5.0
    assert A.to_base(7.0, "register/thread") == 7.0
    assert A.to_base(1.0, "byte/usecond") == 1e6
    assert A.to_base(150.0, "usecond") == pytest.approx(150e-6)
    assert A.to_base(None, "byte") is None


def test_ldgsts_split_metrics():
    m = {A.LDGSTS_SPLIT[0][0]: (300.0, "sector"), A.LDGSTS_SPLIT[0][1]: (20.0, "request"),
         A.LDGSTS_SPLIT[1][0]: (100.0, "sector"), A.LDGSTS_SPLIT[1][1]: (5.0, "request")}
    d = A.derive(m)
    assert d["ldgsts_sectors_per_request"] == 16.0 and d["ldgsts_requests"] == 25.0


def test_unknown_metric_is_dropped_exactly():
    out = ("==ERROR== Failed to find metric "
           "regex:^l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts\\.(sum|avg)$")
    base = A.unknown_metric(out)
    assert base == "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts"
    kept = A.drop_metric(list(A.METRICS), base)
    assert A.LDGSTS_SECTORS not in kept
    assert A.LDGSTS_SPLIT[0][0] in kept and len(kept) == len(A.METRICS) - 1
    assert A.unknown_metric("all good") is None


def test_audit_markdown():
    ks = A.parse_ncu_csv(LONG_CSV)
    doc = {"machine": {"gpu": "NVIDIA H200"}, "date": "2026-11-29", "ncu": "2025.3.1",
           "ops": [{"case": "copy", "op": "copy (W5-8192x8192)", "grid": 4096,
                    "check": "exact", "derived": A.derive(ks[0]["metrics"]),
                    "ptxas": {"megak_op": {"registers": 40, "spill_stores": 0, "spill_loads": 0},
                              "megakernel": {"registers": 128, "spill_stores": 8,
                                             "spill_loads": 8}}}],
           "failures": [{"case": "gemm", "error": "ncu timed out"}],
           "metrics_dropped": [A.LDGSTS_SECTORS]}
    md = A.render_markdown(doc)
    assert "ideal is **16**" in md and "512 B" in md
    row = [line for line in md.splitlines() if line.startswith("| copy")][0]
    assert "| 16.00 (1,048,576) | none | none |" in row
    assert "| 0 B / 16 B |" in row and "| 3,520 |" in row and "12.4%" in row
    assert "**FAILED** gemm: ncu timed out" in md
    assert A.LDGSTS_SECTORS in md


def test_audit_without_ncu_fails_clearly(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(A, "find_ncu", lambda: None)
    assert A.main(["--out", str(tmp_path / "a.json")]) == 2
    assert "needs Nsight Compute" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()


def test_ncu_command_line():
    cmd = A.ncu_command("/x/ncu", ["a.sum", "b.sum"], "gemm", 120)
    i = cmd.index("/x/ncu")
    assert cmd[i:i + 9] == ["/x/ncu", "--clock-control", "none", "--target-processes", "all",
                            "--kernel-name", "megak_op", "--csv", "--print-units"]
    assert "a.sum,b.sum" in cmd and cmd[-3:] == ["-m", "benchmarks.audit_target", "gemm"]


# ---- the measurement flow, on the simulator with a stand-in Bench ------------------------------

class SimBench:
    """Bench's interface over a simulator program. ``lazy`` variants skip the work (leave the
    outputs as they are), as a broken kernel would."""
    lazy: tuple = ()

    def __init__(self, prog):
        self.prog, self.out, self.closed = prog, None, False

    def upload(self, **inputs):
        self.inputs = inputs

    def poison(self):
        self.out = {k: np.full(s, np.nan, dtype=np.float32)
                    for k, s in self.prog.plan.output_shapes.items()}

    def _runs(self, variant, reps, warmup):
        if variant not in self.lazy:
            self.out = self.prog.run(**self.inputs)
        return np.linspace(10.0, 12.0, reps)

    def time_megakernel(self, reps, warmup, flush_l2, trace=False):
        return self._runs("megak_trace" if trace else "megak", reps, warmup)

    def time_separate(self, reps, warmup, flush_l2, graph=False, pdl=False):
        assert graph or not pdl
        return self._runs("graph_pdl" if pdl else "graph" if graph else "separate", reps,
                          warmup)

    def outputs(self):
        return self.out

    def close(self):
        self.closed = True


def test_flow_times_and_checks_every_variant(rng):
    w = W.w1(n_ops=12)
    res, fails, notes = R.run_gpu_workload(w, quick=True, torch_env=None, rng=rng,
                                           log=lambda *a: None, backend="sim",
                                           bench_cls=SimBench)
    assert fails == [] and "12 ops on" in notes[0]
    assert [r["variant"] for r in res] == ["megak", "separate", "graph", "graph_pdl"]
    for r in res:
        assert r["reps"] == R.QUICK_REPS[0] and r["median_us"] == 11.0
        assert r["value"] == pytest.approx(11.0 / 12) and r["check"] == "exact"


def test_flow_never_reports_a_variant_that_skipped_work(rng):
    class Lazy(SimBench):
        lazy = ("separate",)
    w = W.w2(hidden=64, layers=2)
    res, fails, _ = R.run_gpu_workload(w, quick=True, torch_env=None, rng=rng,
                                       log=lambda *a: None, backend="sim", bench_cls=Lazy)
    assert [r["variant"] for r in res] == ["megak", "megak_trace", "graph", "graph_pdl"]
    assert fails[0]["variant"] == "separate" and "non-finite" in fails[0]["error"]


def test_flow_catches_a_graph_pdl_run_that_skipped_work(rng):
    class Lazy(SimBench):
        lazy = ("graph_pdl",)
    res, fails, _ = R.run_gpu_workload(W.w1(n_ops=6), quick=True, torch_env=None, rng=rng,
                                       log=lambda *a: None, backend="sim", bench_cls=Lazy)
    assert [r["variant"] for r in res] == ["megak", "separate", "graph"]
    assert [f["variant"] for f in fails] == ["graph_pdl"] and "not exact" in fails[0]["error"]


# ---- the graph_pdl variant: offered where graph is, timed by Bench, compared as a peer ----------

def test_graph_pdl_is_offered_wherever_graph_is():
    assert W.VARIANTS.index("graph_pdl") == W.VARIANTS.index("graph") + 1
    assert "graph_pdl" not in R.MEGAK_VARIANTS and "graph_pdl" not in W.CALL_VARIANTS
    assert "programmatic dependent launch" in W.VARIANT_DESCRIPTIONS["graph_pdl"]
    assert "pdl=True" in W.VARIANT_DESCRIPTIONS["graph_pdl"]
    colors = [R.CHART_COLORS[v] for v in ("separate", "graph", "graph_pdl", "torch",
                                          "torch_graph")]
    assert len(set(colors)) == len(colors)
    offered = [name for name in W.FACTORIES if isinstance(W.get(name), W.Workload)
               and "graph" in W.get(name).reps]
    assert "W1" in offered and all(n in offered for n in W.FACTORIES if n.startswith("W2-"))
    for name in offered:
        w = W.get(name)
        assert w.reps["graph_pdl"] == w.reps["graph"], name
    # the call path (W7) times neither
    assert "graph_pdl" not in W.get("W7-call-mlp1024").reps


def test_time_bench_variant_times_graph_pdl_as_a_pdl_graph():
    calls = []

    class Recorder:
        def time_megakernel(self, **kw):
            calls.append(("megakernel", kw))
            return np.ones(kw["reps"])

        def time_separate(self, **kw):
            calls.append(("separate", kw))
            return np.ones(kw["reps"])
    for v in ("separate", "graph", "graph_pdl"):
        R.time_bench_variant(Recorder(), v, reps=4, warmup=1, flush=True)
    common = {"reps": 4, "warmup": 1, "flush_l2": True}
    assert calls == [("separate", dict(common, graph=False)),
                     ("separate", dict(common, graph=True)),
                     ("separate", dict(common, graph=True, pdl=True))]
    with pytest.raises(ValueError, match="graph_pdl"):
        R.time_bench_variant(Recorder(), "graph_pdl2", reps=1, warmup=0, flush=True)


def test_graph_pdl_is_a_peer_megak_is_compared_with(doc):
    """On a W2 row where graph_pdl is the fastest alternative, it is the "best other" of the
    megak row, of the targets table and of every other row."""
    name = "W2-4096x8-bf16"
    rows = [result(name, v, us) for v, us in (("megak", 120.0), ("graph", 150.0),
                                              ("graph_pdl", 96.0), ("torch_graph", 109.0))]
    sp = R.speeds({r["variant"]: r for r in rows})
    assert sp["megak"]["best_other"] == "graph_pdl"
    assert sp["megak"]["vs_best_other"] == pytest.approx(96.0 / 120.0)
    assert sp["graph_pdl"]["vs_megak"] == pytest.approx(120.0 / 96.0)
    assert sp["torch_graph"]["best_other"] == "graph_pdl"
    doc["results"] += rows
    md = R.render_markdown(doc)
    summary = md.split("## Targets")[1].split("##")[0]
    assert (f"| {name} | <= 70 us | 120.0 us | **missed by 50 us (71%)** | "
            f"graph_pdl: 96.00 us | 0.80x |") in summary
    table = md.split(f"### {name}")[1].split("###")[0]
    assert "| graph_pdl | 3 | 96.00 | 96.00 | 1.25x | 1.00x | exact |" in table
    assert "**graph_pdl**: the same CUDA graph with programmatic dependent launch" in md


class _FakeLaunches:
    """cuda.core.launch and memset32 stand-ins: what Bench._launch_ops enqueues, in order."""

    def __init__(self, monkeypatch):
        import cuda.core

        from megak.runtime import bench as B
        self.events = []
        monkeypatch.setattr(cuda.core, "launch",
                            lambda stream, cfg, kernel, params, first:
                            self.events.append(("launch", int(first), cfg)))
        monkeypatch.setattr(B.mem, "memset32", lambda ptr, value, n, h:
                            self.events.append(("memset", ptr, value, n)))


def _bench_without_gpu(op_ranges, combining=()):
    from types import SimpleNamespace

    from megak.runtime.bench import Bench, op_launch_configs
    b = Bench.__new__(Bench)   # no program, no GPU: the launch sequence only
    # the program's counters elsewhere: the separate launches zero their own (0x1000)
    b.ex = SimpleNamespace(_dev_buf={"counters": SimpleNamespace(ptr=0x3000)},
                           plan=SimpleNamespace(n_counters=5))
    b._h, b._stream, b._op_kernel = 7, "stream", "kernel"
    b._op_params = SimpleNamespace(ptr=0x2000)
    if combining:
        b._op_counters = SimpleNamespace(ptr=0x1000)
    b._op_ranges, b._counting_ops = op_ranges, set(combining)
    b._op_configs = op_launch_configs(op_ranges)
    b._graphs = {}
    return b


def test_op_launch_configs_carry_the_pdl_attribute():
    from megak import abi, pages
    from megak.runtime.bench import op_launch_configs
    (plain, pdl), = op_launch_configs([(3, 10, 6, 2)])
    for cfg in (plain, pdl):
        assert (cfg.grid, cfg.block) == ((6, 1, 1), (abi.THREADS, 1, 1))
        assert cfg.shmem_size == pages.smem_bytes(2)
    assert not plain.programmatic_stream_serialization
    assert pdl.programmatic_stream_serialization


def test_graph_pdl_launches_carry_the_pdl_attribute_after_the_first(monkeypatch):
    """graph_pdl: every launch after the first is programmatic; the combine counters are
    zeroed once, before the run (each combining op has its own), so no memset breaks the
    chain of programmatic edges. graph / separate: the same sequence, no PDL at all."""
    fake = _FakeLaunches(monkeypatch)
    ranges = [(0, 0, 2, 1), (1, 2, 3, 1), (2, 5, 1, 1), (3, 6, 4, 2)]
    b = _bench_without_gpu(ranges, combining=(2,))
    b._launch_ops(pdl=True)
    kinds = [(e[0], e[1]) for e in fake.events]
    assert kinds == [("memset", 0x1000), ("launch", 0), ("launch", 2), ("launch", 5),
                     ("launch", 6)]
    pdl = [e[2].programmatic_stream_serialization for e in fake.events if e[0] == "launch"]
    assert pdl == [False, True, True, True]
    assert fake.events[0][2:] == (0, 5)   # every counter zeroed
    fake.events.clear()
    b._launch_ops(0)   # separate (and the graph's capture): the same sequence, no PDL
    assert [(e[0], e[1]) for e in fake.events] == kinds
    assert not any(e[2].programmatic_stream_serialization
                   for e in fake.events if e[0] == "launch")
    fake.events.clear()
    _bench_without_gpu(ranges)._launch_ops(pdl=True)   # nothing combines: no memset
    assert [e[0] for e in fake.events] == ["launch"] * 4


def test_graph_pdl_needs_the_graph_and_close_frees_both_graphs(monkeypatch):
    from types import SimpleNamespace

    from megak.runtime import bench as B
    b = _bench_without_gpu([(0, 0, 1, 1)])
    with pytest.raises(ValueError, match="graph=True"):
        b.time_separate(reps=1, warmup=0, graph=False, pdl=True)
    freed = []
    drv = SimpleNamespace(cuGraphExecDestroy=lambda e: freed.append(e),
                          cuGraphDestroy=lambda g: freed.append(g))
    monkeypatch.setattr(B, "_bindings", lambda: drv)
    b._graphs = {False: ("g", "g-exec"), True: ("g-pdl", "g-pdl-exec")}
    b._memory = SimpleNamespace(free=lambda buf: freed.append("params"))
    b.close()
    assert sorted(freed) == ["g", "g-exec", "g-pdl", "g-pdl-exec", "params"]
    assert b._graphs == {}
    b.close()   # twice: nothing left to free
    assert len(freed) == 5


def test_flow_records_the_weight_bandwidth_of_w2(rng):
    w = W.w2(hidden=64, layers=3, batch=1, dtype="bfloat16")
    assert w.name == "W2-64x3-bf16-b1" and w.weight_bytes == 3 * 64 * 64 * 2
    res, fails, _ = R.run_gpu_workload(w, quick=True, torch_env=None, rng=rng,
                                       log=lambda *a: None, backend="sim", bench_cls=SimBench)
    assert fails == [] and [r["variant"] for r in res] == ["megak", "megak_trace", "separate",
                                                            "graph", "graph_pdl", "megak_const"]
    for r in res:
        assert r["weight_bytes"] == w.weight_bytes
        assert r["weights_tb_s"] == pytest.approx(w.weight_bytes / (r["median_us"] * 1e-6) / 1e12)
    # the streamed layers' ring on each SM (prog.stats["stream_pages"]): 13 pages less the
    # streamed GEMM's own
    ring = megak.pages.ring_pages(megak.pages.DEFAULT_PAGES, megak.abi.OP_SHAPES["MK_STREAM_PAGES"])
    assert ring > 0 and res[0]["bytes_in_flight_per_sm"] == ring * R.PAGE_BYTES
    assert all("bytes_in_flight_per_sm" not in r for r in res[1:])
    # a workload without weights records none
    res, _, _ = R.run_gpu_workload(W.w1(n_ops=4), quick=True, torch_env=None, rng=rng,
                                   log=lambda *a: None, backend="sim", bench_cls=SimBench)
    assert all("weights_tb_s" not in r and "bytes_in_flight_per_sm" not in r for r in res)


def test_flow_skips_timing_megak_when_its_run_is_wrong(rng, monkeypatch):
    w = W.w5(40, 70)
    real = w.check
    seen = []

    def check(ref, out, what):
        seen.append(what)
        if what == "megak prog.run":
            raise W.CheckError("wrong")
        return real(ref, out, what)
    monkeypatch.setattr(w, "check", check)
    res, fails, _ = R.run_gpu_workload(w, quick=True, torch_env=None, rng=rng,
                                       log=lambda *a: None, backend="sim", bench_cls=SimBench)
    assert [r["variant"] for r in res] == ["separate", "graph", "graph_pdl"]
    assert fails == [{"workload": w.name, "variant": "megak",
                      "error": "prog.run before timing: CheckError: wrong"}]


def test_a_run_stopped_early_leaves_what_it_measured(monkeypatch, tmp_path, capsys):
    """After each workload the results so far go to <gpu>.partial.json, marked partial with
    the workloads not run; a run that ends replaces it with the full results. The default
    --render-only never picks a partial file."""
    import functools

    import megak.runtime.driver as driver
    monkeypatch.setattr(driver, "gpu_usable", lambda: True)
    monkeypatch.setattr(R, "machine_info", lambda torch_env=None: {"gpu": "Fake GPU 1"})
    monkeypatch.setattr(R, "TorchEnv", lambda: (_ for _ in ()).throw(ImportError("no torch")))
    measured = functools.partial(R.run_gpu_workload, backend="sim", bench_cls=SimBench)

    def stopped_at_the_second(w, *args, **kwargs):
        if w.name != "W2-64x2-fp32":
            return measured(w, *args, **kwargs)
        raise KeyboardInterrupt   # what a lease's limit does to the process, as far as it goes
    monkeypatch.setattr(R, "run_gpu_workload", stopped_at_the_second)
    monkeypatch.setattr(W, "FACTORIES", {"W2-16x2-fp32": lambda: W.w2(16, 2),
                                         "W2-1024x16-fp32": lambda: W.w2(64, 2),
                                         "W5-1GiB": lambda: W.w2(16, 1)})
    argv = ["--quick", "--only", "W2-16x2-fp32", "W2-1024x16-fp32", "W5-1GiB",
            "--out-dir", str(tmp_path), "--seed", "5"]
    with pytest.raises(KeyboardInterrupt):
        R.main(argv)
    results = tmp_path / "results"
    (partial,) = results.glob("*.json")
    assert partial.name == "fake-gpu-1-quick.partial.json"
    doc = json.loads(partial.read_text())
    R.validate_doc(doc)
    assert doc["partial"] == {"not_run": ["W2-1024x16-fp32", "W5-1GiB"]}
    assert {r["workload"] for r in doc["results"]} == {"W2-16x2-fp32"}
    assert "**Partial run**" in R.render_markdown(doc, None)
    assert R.render_only(tmp_path, None) == 2     # no complete run to render
    monkeypatch.setattr(R, "run_gpu_workload", measured)
    assert R.main(argv) == 0, capsys.readouterr()
    (full,) = results.glob("*.json")
    assert full.name.endswith("-quick.json") and "partial" not in json.loads(full.read_text())


def test_main_end_to_end_on_the_simulator(monkeypatch, tmp_path, capsys):
    """main() as on the GPU, with the simulator behind a stand-in Bench and no torch."""
    import functools

    import megak.runtime.driver as driver
    monkeypatch.setattr(driver, "gpu_usable", lambda: True)
    monkeypatch.setattr(R, "machine_info", lambda torch_env=None: {"gpu": "Fake GPU 1"})

    def no_torch():
        raise ImportError("No module named 'torch'")
    monkeypatch.setattr(R, "TorchEnv", no_torch)
    monkeypatch.setattr(R, "run_gpu_workload", functools.partial(
        R.run_gpu_workload, backend="sim", bench_cls=SimBench))
    monkeypatch.setattr(W, "FACTORIES", {"W1": lambda: W.w1(n_ops=10),
                                         "W2-1024x16-fp32": lambda: W.w2(64, 2)})
    from benchmarks import hop   # W1 brings the hop microbenchmark (a GPU kernel) along
    fake_hop = {"n_hops": 1000, "sm_count": 4, "reps": 5, "word_us": 0.25, "flag_us": 0.5,
                "ratio": 2.0}
    monkeypatch.setattr(hop, "measure", lambda **kw: dict(fake_hop, **kw))
    rc = R.main(["--quick", "--only", "W1", "W2-1024x16-fp32", "--out-dir", str(tmp_path),
                 "--seed", "5"])
    assert rc == 0, capsys.readouterr()
    (js,) = (tmp_path / "results").glob("fake-gpu-1-*-quick.json")
    doc = json.loads(js.read_text())
    R.validate_doc(doc)
    assert doc["quick"] and doc["seed"] == 5 and doc["failures"] == []
    assert doc["hop"]["word_us"] == 0.25 and doc["hop"]["reps"] == 5
    assert {(r["workload"], r["variant"]) for r in doc["results"]} == {
        (w, v) for w in ("W1-10x32", "W2-64x2-fp32")
        for v in ("megak", "separate", "graph", "graph_pdl")
    } | {("W2-64x2-fp32", "megak_trace")}
    assert [s["variant"] for s in doc["skipped"]] == ["torch", "torch_graph"]
    md = (tmp_path / "RESULTS-quick.md").read_text()
    assert "Quick smoke run" in md and "torch unavailable: ImportError" in md
    assert "### W1-10x32\n\na dependent chain of 10 copies" in md


@pytest.mark.parametrize("factory", [lambda: W.w2(64, 3, dtype="bfloat16"),
                                     lambda: W.w3(96, dtype="bfloat16")],
                         ids=["w2-bf16", "w3-bf16"])
def test_bf16_workloads_are_checked_on_the_simulator(rng, factory):
    w = factory()
    assert w.name.endswith("-bf16")
    res, fails, _ = R.run_gpu_workload(w, quick=True, torch_env=None, rng=rng,
                                       log=lambda *a: None, backend="sim", bench_cls=SimBench)
    assert fails == [] and {r["variant"] for r in res} >= {"megak", "separate", "graph",
                                                           "graph_pdl"}
    # and a wrong bf16 result is caught: perturb one element by 4 bf16 ulps
    inputs = w.make_inputs(rng)
    ref = w.reference(inputs, rng)
    prog = megak.compile(w.build(), backend="sim", n_sm=4)
    out = prog.run(**inputs)
    name = list(out)[-1]
    bad = dict(out)
    bad[name] = out[name].copy()
    bad[name][0, 0] = (out[name][0, 0].astype(np.float32) * (1 + 4 * 2.0 ** -8) + 1).astype(out[name].dtype)
    with pytest.raises(W.CheckError):
        w.check(ref, bad, "perturbed")


def test_markdown_bubbles_and_baseline(doc, tmp_path):
    doc["results"][0]["bubble"] = {"mean": 0.25, "median": 0.2, "max": 0.5, "sms": 132}
    old = dict(doc, results=[result("W1", "megak", 1490.0, "us/op", 1000),
                             result("W3-8192-fp32", "megak", 33000.0, "TFLOP/s", 2.0 * 8192 ** 3)])
    path = tmp_path / "old.json"
    R.write_json(old, path)
    doc["baseline"] = R.load_baseline(path, "before the change")
    md = R.render_markdown(doc)
    assert "mean 25.0%, median 20.0%, max 50.0% over 132 SMs" in md
    assert "megak before |" in md and "`old.json` (before the change)" in md
    w1_row = next(line for line in md.splitlines() if line.startswith("| W1 |"))
    assert w1_row.rstrip().endswith("| 1.490 us/op |"), w1_row
    R.validate_doc(doc)   # the extra keys keep the schema valid


# ---- the call path (W7) ---------------------------------------------------------------------

def test_w7_workloads_are_registered_and_described():
    copy, mlp = W.get("W7-call-copy"), W.get("W7-call-mlp1024")
    for w in (copy, mlp):
        assert w.kind == "call" and w.metric == "us" and w.work == 0.0
        assert w.plan_check is None and set(w.reps) == set(W.CALL_VARIANTS)
        assert "no L2 flush" in w.description and "out=" in w.description
        assert "perf_counter_ns" in w.description
    assert "W7-call-copy" in W.QUICK and "W7-call-mlp1024" not in W.QUICK
    assert set(W.CALL_VARIANTS) <= set(W.VARIANTS) <= set(W.VARIANT_DESCRIPTIONS) | {
        "megak_trace"}
    # one copy of a (1, 32) fp32 tensor
    g = copy.build()
    assert [op.kind for op in g.ops] == ["copy"]
    assert g.inputs["x"].shape == (1, 32) and g.inputs["x"].dtype == "float32"
    assert list(g.outputs) == ["y"] and "(1, 32) fp32" in copy.description
    # the W2-1024x16-bf16 chain, from its builder: same inputs, same 16 outputs
    g, g2 = mlp.build(), W.get("W2-1024x16-bf16").build()
    assert [(n, t.shape, t.dtype) for n, t in g.inputs.items()] == \
        [(n, t.shape, t.dtype) for n, t in g2.inputs.items()]
    assert g.inputs["x"].shape == (16, 1024) and g.inputs["x"].dtype == "bfloat16"
    assert list(g.outputs) == list(g2.outputs) and len(g.outputs) == 16
    assert [op.kind for op in g.ops] == ["gemm"] * 16
    assert "W2-1024x16-bf16 chain" in mlp.description and "16 layers" in mlp.description
    # its description renders in RESULTS.md as every workload's does
    res = [result("W7-call-copy", "megak_run", 12.0)]
    md = R.render_markdown({"machine": {"gpu": "G"}, "date": "2026-11-29", "results": res,
                            "descriptions": {"W7-call-copy": copy.description}})
    assert f"### W7-call-copy\n\n{copy.description}\n" in md
    assert "**megak_run**: call path (W7)" in md and "**megak_launch**: call path" in md


class FakeClock:
    """perf_counter_ns stand-in: each reading advances by the next step (ns) and is logged."""

    def __init__(self, steps, log=None):
        self.steps, self.now, self.log = iter(steps), 0, log

    def __call__(self):
        self.now += next(self.steps)
        if self.log is not None:
            self.log.append("T")
        return self.now


def test_time_calls_is_per_call_wall_clock():
    calls = []
    # two warm-up calls (no clock), then three timed ones: 5, 7 and 6 us
    clock = FakeClock([100, 5000, 7, 7000, 50, 6000])
    us = R.time_calls(lambda: calls.append(1), reps=3, warmup=2, clock=clock)
    assert us.tolist() == [5.0, 7.0, 6.0] and len(calls) == 5
    r = R.make_result("W7-call-copy", "megak_run", us, "us", 0.0, "exact")
    assert r["median_us"] == 6.0 and r["value"] == 6.0 and r["reps"] == 3


def test_call_variants_are_timed_in_turn_each_block_between_its_poison_and_check():
    events = []
    clock = iter(range(0, 10**9, 1000))     # every call 1 us

    def variant(name, reps, warmup, fail_at=None):
        done = []

        def fn():
            done.append(1)
            events.append(name)
            if fail_at is not None and len(done) == fail_at:
                raise RuntimeError(f"{name} failed")
        return R.TimedCall(fn, reps, warmup, lambda: events.append(f"{name}:poison"),
                           lambda: events.append(f"{name}:check") or f"{name} ok")
    failed = []
    timed = R.time_in_turn({"a": variant("a", 5, 1), "b": variant("b", 4, 0),
                            "c": variant("c", 6, 2, fail_at=7)},
                           lambda v, exc: failed.append((v, str(exc))), rounds=2,
                           clock=lambda: next(clock))
    # warm-ups first, then 2 rounds, the order rotated by one; c fails in its second block
    assert events == ["a", "c", "c",
                      "a:poison", "a", "a", "a", "a:check", "b:poison", "b", "b", "b:check",
                      "c:poison", "c", "c", "c", "c:check",
                      "b:poison", "b", "b", "b:check", "c:poison", "c", "c",
                      "a:poison", "a", "a", "a:check"]
    assert failed == [("c", "c failed")] and set(timed) == {"a", "b"}
    assert timed["a"][0].tolist() == [1.0] * 5 and timed["a"][1] == "a ok"
    assert len(timed["b"][0]) == 4 and timed["b"][1] == "b ok"


def test_time_launch_batches_is_total_over_calls_and_waits_every_handle():
    events = []

    class Handle:
        def __init__(self, i, fails=False):
            self.i, self.fails, self.waits = i, fails, 0

        def wait(self):
            self.waits += 1
            events.append(f"W{self.i}")
            if self.fails:
                raise megak.MegakernelError(f"run {self.i} failed")
            return {}

    made = []

    def launch():
        events.append("L")
        made.append(Handle(len(made) % 4))
        return made[-1]

    # batches of 4 launches: 4 us (warm-up), then 8 us and 12 us in all
    clock = FakeClock([1, 4000, 1, 8000, 1, 12000], events)
    us = R.time_launch_batches(launch, reps=2, warmup=1, calls=4, clock=clock)
    assert us.tolist() == [2.0, 3.0]
    # timed: the launches and the one wait on the last; then, untimed, every handle
    assert events[:11] == ["T", "L", "L", "L", "L", "W3", "T", "W0", "W1", "W2", "W3"]
    assert len(made) == 12 and all(h.waits >= 1 for h in made)
    # a failed launch that is not the last is still reported
    made.clear()

    def launch_one_fails():
        made.append(Handle(len(made), fails=len(made) == 1))
        return made[-1]
    with pytest.raises(megak.MegakernelError, match="run 1 failed"):
        R.time_launch_batches(launch_one_fails, reps=1, warmup=0, calls=3,
                              clock=FakeClock([1, 1]))


def test_call_overhead_is_wall_minus_device_median():
    o = R.call_overhead(12.0, [4.0, 5.0, 100.0])
    assert o == {"device_us": 5.0, "device_reps": 3, "host_overhead_us": 7.0}
    with pytest.raises(ValueError, match="no device times"):
        R.call_overhead(12.0, [])


@pytest.fixture
def w7_doc(doc):
    res = [dict(result("W7-call-copy", "megak_run", 12.0), **R.call_overhead(12.0, [5.0])),
           dict(result("W7-call-copy", "megak_launch", 4.0), calls_per_rep=1000),
           result("W7-call-copy", "torch", 20.0), result("W7-call-copy", "torch_graph", 10.0),
           dict(result("W7-call-mlp1024", "megak_run", 130.0),
                **R.call_overhead(130.0, [110.0])),
           result("W7-call-mlp1024", "torch_graph", 100.0)]
    doc["results"] += res
    doc["descriptions"]["W7-call-copy"] = "one copy per call"
    return doc


def test_speeds_on_the_call_path_compare_with_megak_run(w7_doc):
    variants = R.by_workload(w7_doc["results"])["W7-call-copy"]
    sp = R.speeds(variants)
    assert R.reference_variant(variants) == "megak_run"
    assert sp["megak_launch"]["vs_megak"] == pytest.approx(3.0)
    assert sp["torch"]["vs_megak"] == pytest.approx(0.6)
    # megak_launch is megak itself: the best other is torch_graph
    assert sp["megak_run"]["best_other"] == "torch_graph"
    assert sp["megak_run"]["vs_best_other"] == pytest.approx(10 / 12)
    assert R.judged_variant("W7-call-copy") == "megak_run" and R.judged_variant("W1") == "megak"


def test_w7_target():
    t = R.TARGETS["W7-call-copy"]
    assert (t.metric, t.op, t.value, t.variant) == ("us", "<=", 15.0, "megak_run")
    assert t.text() == "<= 15 us" and t.gap(12.0) == "met"
    assert t.gap(20.0) == "missed by 5 us (33%)"
    # no resident mode yet: its targets are not in the table
    assert not any("resident" in name for name in R.TARGETS)


def test_markdown_renders_the_host_overhead_of_the_call_path(w7_doc, tmp_path):
    path = tmp_path / "r.json"
    R.write_json(w7_doc, path)                    # the extra keys keep the schema valid
    back = json.loads(path.read_text())
    row = next(r for r in back["results"]
               if (r["workload"], r["variant"]) == ("W7-call-copy", "megak_run"))
    assert (row["device_us"], row["host_overhead_us"], row["device_reps"]) == (5.0, 7.0, 1)
    md = R.render_markdown(back)
    w7 = md.split("### W7-call-copy")[1].split("###")[0]
    assert "| check | target | device (us) | host overhead per call (us) |" in w7
    assert ("| megak_run | 3 | 12.00 | 12.00 | 1.00x | 0.83x | exact | <= 15 us: **met** "
            "| 5.000 | 7.000 |") in w7
    assert "| megak_launch | 3 x 1,000 | 4.000 | 4.000 | 3.00x | 2.50x | exact |  | | |" in w7
    assert "| torch | 3 | 20.00 | 20.00 | 0.60x | 0.50x | exact |  | | |" in w7
    assert "wall-clock median 12.00 us - device median 5.000 us = **7.000 us**" in w7
    mlp = md.split("### W7-call-mlp1024")[1].split("###")[0]
    assert "| 110.0 | 20.00 |" in mlp and "= **20.00 us**" in mlp
    # the targets table judges megak_run, against the best non-megak variant
    summary = md.split("## Targets")[1].split("##")[0]
    assert ("| W7-call-copy | <= 15 us | 12.00 us (megak_run) | **met** | torch_graph: "
            "10.00 us | 0.83x |") in summary
    # the other workloads' tables keep their columns
    w1 = md.split("### W1")[1].split("###")[0]
    assert "host overhead" not in w1
    assert "perf_counter_ns around each call" in md


def test_chart_and_baseline_with_the_call_path(w7_doc, tmp_path):
    old = dict(w7_doc, results=[result("W7-call-copy", "megak_run", 30.0),
                                result("W7-call-copy", "megak_launch", 9.0)])
    path = tmp_path / "old.json"
    R.write_json(old, path)
    assert R.load_baseline(path)["megak"] == {"W7-call-copy": 30.0}
    w7_doc["baseline"] = R.load_baseline(path, "before the call path")
    row = next(line for line in R.render_markdown(w7_doc).splitlines()
               if line.startswith("| W7-call-copy |"))
    assert row.rstrip().endswith("| 30.00 us |"), row
    pytest.importorskip("matplotlib")
    assert R.write_chart(w7_doc, tmp_path / "c.png")


# the call path on the simulator, with numpy arrays standing in for torch tensors

class NumpyEnv:
    """TorchEnv's interface over numpy arrays, for the simulator: synchronising does nothing,
    a captured graph replays the function, device times are ``device_us``. ``lazy`` replaces
    what a broken part would skip: "replay" (the graph runs nothing), "device" (the
    device-timed launches never run)."""
    torch, device = None, "cpu"

    def __init__(self, lazy=(), device_us=4.0):
        self.lazy, self.device_us, self.released = lazy, device_us, False

    def to_device(self, inputs):
        return {k: v.copy() for k, v in inputs.items()}

    def empty(self, shape, dtype):
        from megak.dtypes import numpy_dtype
        return np.empty(shape, dtype=numpy_dtype(dtype))

    def poison_tensors(self, tensors):
        for t in tensors:
            t[...] = np.nan

    def poison(self, case):
        self.poison_tensors(case.buffers)

    def fetch_tensors(self, tensors):
        return {k: v.copy() for k, v in tensors.items()}

    def fetch(self, case):
        return self.fetch_tensors(case.outputs)

    def sync(self):
        pass

    def capture(self, fn):
        import types
        return types.SimpleNamespace(replay=(lambda: None) if "replay" in self.lazy else fn)

    def device_times(self, fn, reps, warmup):
        returned = [] if "device" in self.lazy else [fn() for _ in range(warmup + reps)]
        return np.full(reps, self.device_us), returned

    def release(self):
        self.released = True


def numpy_case(inputs, torch, device):
    """The torch calls of a chain workload (W1 copies, W2 GEMMs), in numpy."""
    names = ["y"] if "w0" not in inputs else \
        [f"h{i}" for i in range(len(inputs) - 2)] + ["y"]
    outs = {n: np.empty((inputs["x"].shape[0], inputs.get("w0", inputs["x"]).shape[1]),
                        inputs["x"].dtype) for n in names}

    def run():
        src = inputs["x"]
        for i, n in enumerate(names):
            if "w0" in inputs:
                w = inputs[f"w{i}"].astype(np.float32)
                outs[n][...] = (src.astype(np.float32) @ w).astype(src.dtype)
            else:
                outs[n][...] = src
            src = outs[n]
    return W.TorchCase(run, outs, list(outs.values()))


def call_flow(w, env, rng, monkeypatch, launch_batch=5):
    monkeypatch.setattr(w, "torch_case", numpy_case)
    return R.run_call_workload(w, quick=True, env=env, rng=rng, log=lambda *a: None,
                               backend="sim", launch_batch=launch_batch)


@pytest.mark.parametrize("factory", [W.w7_call_copy, lambda: W.w7_call_mlp(64, 2)],
                         ids=["copy", "mlp-bf16"])
def test_call_flow_times_and_checks_every_variant(rng, monkeypatch, factory):
    w = factory()
    env = NumpyEnv()
    res, fails, notes = call_flow(w, env, rng, monkeypatch)
    assert fails == [] and notes == [] and env.released
    by = {r["variant"]: r for r in res}
    assert list(by) == list(W.CALL_VARIANTS)
    exact = w.name == "W7-call-copy"
    for r in res:
        assert r["reps"] == R.QUICK_REPS[0] and r["metric"] == "us"
        assert r["value"] == r["median_us"] > 0
        assert (r["check"] == "exact") == exact, r["check"]
    assert by["megak_launch"]["calls_per_rep"] == 5
    run = by["megak_run"]
    assert run["device_us"] == 4.0 and run["device_reps"] == R.QUICK_REPS[0]
    assert run["host_overhead_us"] == pytest.approx(run["median_us"] - 4.0)
    assert all("host_overhead_us" not in by[v] for v in ("megak_bound", "megak_launch",
                                                         "megak_resident",
                                                         "megak_resident_bound",
                                                         "torch", "torch_graph"))
    R.validate_doc({"machine": {"gpu": "sim"}, "date": "2026-11-29", "results": res})
    assert "host overhead per call" in "\n".join(R.render_workload(w.name, by))


def test_call_flow_never_reports_work_that_was_skipped(rng, monkeypatch):
    w = W.w7_call_copy()
    res, fails, _ = call_flow(w, NumpyEnv(lazy=("replay", "device")), rng, monkeypatch)
    assert [r["variant"] for r in res] == ["megak_run", "megak_bound", "megak_launch",
                                           "megak_resident", "megak_resident_bound", "torch"]
    # the device-timed launches never ran: no host overhead is claimed from them
    assert "host_overhead_us" not in res[0]
    errors = {f["variant"]: f["error"] for f in fails}
    assert set(errors) == {"megak_run", "torch_graph"}
    assert errors["megak_run"].startswith("device time: CheckError")
    assert "not exact" in errors["torch_graph"]


def test_call_flow_times_no_megak_variant_when_its_run_is_wrong(rng, monkeypatch):
    w = W.w7_call_copy()
    real = w.check

    def check(ref, out, what):
        if what == "megak prog.run":
            raise W.CheckError("wrong")
        return real(ref, out, what)
    monkeypatch.setattr(w, "check", check)
    res, fails, _ = call_flow(w, NumpyEnv(), rng, monkeypatch)
    assert [r["variant"] for r in res] == ["torch", "torch_graph"]
    assert fails == [{"workload": w.name, "variant": v,
                      "error": "prog.run before timing: CheckError: wrong"}
                     for v in ("megak_run", "megak_bound", "megak_launch", "megak_resident",
                               "megak_resident_bound")]


def test_main_runs_the_call_path_and_skips_it_without_torch(monkeypatch, tmp_path, capsys):
    import functools

    import megak.runtime.driver as driver
    monkeypatch.setattr(driver, "gpu_usable", lambda: True)
    monkeypatch.setattr(R, "machine_info", lambda torch_env=None: {"gpu": "Fake GPU 1"})
    monkeypatch.setattr(R, "run_call_workload", functools.partial(
        R.run_call_workload, backend="sim", launch_batch=3))

    def copy():
        w = W.w7_call_copy()
        w.torch_case = numpy_case
        return w
    monkeypatch.setattr(W, "FACTORIES", {"W7-call-copy": copy})
    argv = ["--quick", "--only", "W7-call-copy", "--out-dir", str(tmp_path), "--seed", "5"]

    monkeypatch.setattr(R, "TorchEnv", NumpyEnv)
    assert R.main(argv) == 0, capsys.readouterr()
    (js,) = (tmp_path / "results").glob("fake-gpu-1-*-quick.json")
    doc = json.loads(js.read_text())
    assert [r["variant"] for r in doc["results"]] == list(W.CALL_VARIANTS)
    assert doc["failures"] == [] and doc["skipped"] == []
    assert "host_overhead_us" in doc["results"][0]
    md = (tmp_path / "RESULTS-quick.md").read_text()
    assert "| W7-call-copy | <= 15 us |" in md and "host overhead per call (us) |" in md

    def no_torch():
        raise ImportError("No module named 'torch'")
    monkeypatch.setattr(R, "TorchEnv", no_torch)
    js.unlink()
    assert R.main(argv) == 0, capsys.readouterr()
    doc = json.loads(next((tmp_path / "results").glob("fake-gpu-1-*-quick.json")).read_text())
    assert doc["results"] == [] and doc["failures"] == []
    assert [(s.get("workload"), s["variant"]) for s in doc["skipped"]] == \
        [(None, "torch"), (None, "torch_graph")] + [("W7-call-copy", v)
                                                    for v in W.CALL_VARIANTS]
    md = (tmp_path / "RESULTS-quick.md").read_text()
    assert "- W7-call-copy / megak_run: torch unavailable: ImportError" in md
    assert "| W7-call-copy | <= 15 us | skipped (see Not measured) |" in md


def test_a_failure_names_the_status_records_numbers():
    """A megakernel error's record goes into the failure's text (MK_ERR_PAGE_LEAK's message
    names neither the pages needed nor those free); other exceptions are as they were."""
    from megak.errors import MegakernelError
    exc = MegakernelError("cuda: MK_ERR_PAGE_LEAK on SM 3, queue index 1",
                          {"error": 9, "counter": 0, "expected": 3, "observed": 1})
    assert R._error(exc) == ("MegakernelError: cuda: MK_ERR_PAGE_LEAK on SM 3, queue "
                             "index 1 [status record: counter 0, expected 3, observed 1]")
    assert R._error(MegakernelError("no record")) == "MegakernelError: no record"
    assert R._error(ValueError("x")) == "ValueError: x"


def test_the_recorded_commit_is_the_named_one_where_the_caller_names_it(monkeypatch):
    monkeypatch.setenv("MEGAK_COMMIT", "abc1234")
    assert R.megak_commit() == "abc1234"
    monkeypatch.setenv("MEGAK_COMMIT", " ")
    monkeypatch.setattr(R, "_run_text", lambda cmd, cwd=None: "" if "status" in cmd else "def5678")
    assert R.megak_commit() == "def5678"


def _run_recording_benches(w, rng, lazy=()):
    """run_gpu_workload on the simulator, with every stand-in Bench it made, in order."""
    seen = []

    class Seen(SimBench):
        def __init__(self, prog):
            super().__init__(prog)
            self.lazy = lazy
            seen.append(self)
    res, fails, notes = R.run_gpu_workload(w, quick=True, torch_env=None, rng=rng,
                                           log=lambda *a: None, backend="sim", bench_cls=Seen)
    return res, fails, notes, seen


def test_separate_launches_of_an_fp32_stream_run_the_tiles(rng):
    # an fp32 chain of at most 16 rows streams its weights in the megakernel; its separate
    # launches time a program lowered without the stream (peer_lowering), checked as usual:
    # a peer that skips work still fails its check
    w = W.w2(hidden=64, layers=2, batch=8, dtype="float32")
    res, fails, notes, seen = _run_recording_benches(w, rng, lazy=("separate",))
    assert [r["variant"] for r in res][:4] == ["megak", "megak_trace", "graph", "graph_pdl"]
    assert [f["variant"] for f in fails] == ["separate"]
    own, peer = (b.prog.plan.instrs["flags"] for b in seen[:2])
    assert (own & megak.abi.FLAG_STREAM_F32).any() and not (peer & megak.abi.FLAG_STREAM).any()
    assert R.peer_lowering(seen[0].prog.plan) == {"weight_stream": False}
    assert any("weight_stream" in n for n in notes)
    assert all(b.closed for b in seen)


def test_separate_launches_of_a_bf16_stream_run_the_tiles_too(rng):
    w = W.w2(hidden=64, layers=2, batch=8, dtype="bfloat16")
    res, fails, notes, seen = _run_recording_benches(w, rng)
    assert fails == []
    own, peer = (b.prog.plan.instrs["flags"] for b in seen[:2])
    assert (own & megak.abi.FLAG_STREAM).any() and not (peer & megak.abi.FLAG_STREAM).any()
    assert R.peer_lowering(seen[0].prog.plan) == {"weight_stream": False}
    assert any("weight_stream" in n for n in notes)
    assert all(b.closed for b in seen)


def test_separate_launches_of_unstreamed_gemms_run_the_same_program():
    # 128 rows are past the stream's 64: the GEMM lowers as tiles, nothing to lower again
    g = megak.Graph()
    g.output(g.gemm(g.input("x", (128, 64), "bfloat16"), g.input("w", (64, 64), "bfloat16")),
             "y")
    plan = megak.compile(g, backend="sim").plan
    assert not (plan.instrs["flags"] & megak.abi.FLAG_STREAM).any()
    assert R.peer_lowering(plan) == {}


def test_a_failed_peer_program_fails_only_the_separate_launches(rng, monkeypatch):
    real = megak.compile

    def compile_(graph, **kw):
        if "weight_stream" in kw:
            raise megak.GraphError("planted")
        return real(graph, **kw)
    monkeypatch.setattr(megak, "compile", compile_)
    w = W.w2(hidden=64, layers=2, batch=8, dtype="float32")
    res, fails, _ = R.run_gpu_workload(w, quick=True, torch_env=None, rng=rng,
                                       log=lambda *a: None, backend="sim", bench_cls=SimBench)
    assert [r["variant"] for r in res] == ["megak", "megak_trace"]
    assert [f["variant"] for f in fails] == ["separate", "graph", "graph_pdl"]
    assert all("planted" in f["error"] for f in fails)
    assert "bubble" in res[0]
