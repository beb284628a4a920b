"""The benchmark report: megakernel vs separate launches, CUDA graphs (plain and with
programmatic dependent launch) and torch/cuBLAS.

    python -m benchmarks.report [--quick] [--out-dir benchmarks] [--only W1 ...] [--seed N]
    python -m benchmarks.report --render-only     # RESULTS.md again from the newest JSON (no GPU)

For every workload of benchmarks/workloads.py, in ONE process (so medians and ratios share a
machine state): build the graph, fresh random inputs, a float64 reference; check a normal
``prog.run``; then per variant: poison every tensor the graph writes, time it, check what the
timed runs left in memory. A variant whose check fails is reported as a failure, never as a
time. The call-path workloads (W7) are timed per call from Python instead (wall-clock, no L2
flush; ``run_call_workload``), megak_run, megak_bound, torch and torch_graph in turn over
CALL_ROUNDS rounds (the host's speed moves in phases), with the megakernel's device time
beside them. Writes

    OUT/results/<gpu-slug>-<date>.json   {"machine", "date", "results": [{workload, variant,
                                          median_us, metric, value, ...}], ...}
    OUT/results/<gpu-slug>-<date>.png    speed of each variant relative to megak
    OUT/RESULTS.md                       tables, targets (TARGETS below), memory audit

(--quick: tiny rep counts, smaller workloads, files suffixed "-quick", RESULTS-quick.md.)

The pure parts (metric values, ratios, targets, JSON schema, markdown, chart) need no GPU and
are tested in tests/test_benchmark_report.py.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megak.abi import FLAG_STREAM, PAGE_BYTES
from megak.runtime.bench import L2_FLUSH_BYTES   # what Bench's flush writes (no cuda import)

from . import workloads as W

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
TRACE_OVERHEAD_TARGET = 0.05    # tracing on may cost at most 5% on the W2 chains
QUICK_REPS = (3, 1)             # (timed reps, warm-up) of every variant in a --quick run
#: W7: the per-call variants (megak_run, megak_bound, torch, torch_graph) are timed in turn,
#: this many rounds, each round a share of every variant's reps: the host's speed moves in
#: phases of tens of seconds (torch's graph replay of a copy 9.5-11.5 <-> 16-17.6 us on the
#: H200's host, benchmarks/ANALYSIS.md), and variants timed one after another could land in
#: different phases
CALL_ROUNDS = 10
# the spin kernel queued ahead of each device-timed launch (torch.cuda._sleep cycles, ~0.5 ms
# at an H200's clock): longer than the host takes to queue the events and the launch
DEVICE_TIMING_SLEEP_CYCLES = 1_000_000
METRICS = ("us/op", "us", "ms", "TFLOP/s", "GB/s")
RESULT_KEYS = {"workload": str, "variant": str, "median_us": float, "metric": str,
               "value": float}


# ---- targets --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    metric: str
    op: str             # "<=" (lower is better) or ">=" (higher is better)
    value: float
    baseline: str       # what a user has today (the measured peers)
    variant: str = "megak"   # the variant judged (W7, the call path: megak_run)

    def met(self, value: float) -> bool:
        return value <= self.value if self.op == "<=" else value >= self.value

    def text(self) -> str:
        return f"{self.op} {fmt_short(self.value)} {self.metric}"

    def gap(self, value: float | None) -> str:
        """"met" or "missed by X unit (P%)", plainly."""
        if value is None or not math.isfinite(value):
            return "not measured"
        if self.met(value):
            return "met"
        short = value - self.value if self.op == "<=" else self.value - value
        return f"missed by {fmt_short(short)} {self.metric} ({short / self.value:.0%})"


#: megak targets, from the project's issues (the measured peers and limits): the megak
#: variant's figure is judged against them.
TARGETS: dict[str, Target] = {
    "W1": Target("us/op", "<=", 0.45, "CUDA graph of tiny kernels 0.80 us per node, 0.60 with "
                 "programmatic dependent launch; data-as-flag hop probe 0.25 us"),
    "W2-1024x16-bf16": Target("us", "<=", 20.0, "torch CUDA graph 78.6 us (HBM floor 7.5 us; "
                              "hop-bound)"),
    "W2-4096x8-bf16": Target("us", "<=", 70.0, "torch CUDA graph 109 us (60 us at 4.48 TB/s)"),
    "W2-4096x8-bf16-b1": Target("us", "<=", 68.0, "60 us at 4.48 TB/s"),
    "W2-4096x8-bf16-b64": Target("us", "<=", 80.0, "60 us at 4.48 TB/s"),
    "W2-8192x8-bf16": Target("us", "<=", 255.0, "torch CUDA graph 271 us (240 us at 4.48 TB/s)"),
    "W3-8192-fp32": Target("TFLOP/s", ">=", 45.0, "cuBLAS 51.3 TFLOP/s"),
    "W3-8192-bf16": Target("TFLOP/s", ">=", 650.0, "cuBLAS 784 TFLOP/s"),
    "W4-16384-fp32": Target("GB/s", ">=", 3700.0, "torch 1,163 GB/s; device copy 4,228 GB/s"),
    "W5-1GiB": Target("GB/s", ">=", 4100.0, "torch 4,251 GB/s; device copy 4,228 GB/s"),
    "W6-lower-100k": Target("ms", "<=", 1000.0, "181.6 ms on the 2-core CPU machine "
                            "(benchmarks/LOWERING.md)"),
    "W7-call-copy": Target("us", "<=", 15.0, "cuda.core launch + sync 10.7 us; torch CUDA graph "
                           "replay + sync 14.5 us (the torch rows are measured alongside)",
                           variant="megak_run"),
}

#: the megakernel itself, in its forms: never the "best other variant" it is compared with
MEGAK_VARIANTS = ("megak", "megak_trace", "megak_const", "megak_run", "megak_bound",
                  "megak_launch", "megak_resident", "megak_resident_bound")

#: fp32 workloads whose target is for the bf16 version (shown for context, no gap)
RELATED_TARGET = {"W2-1024x16-fp32": "W2-1024x16-bf16", "W2-4096x8-fp32": "W2-4096x8-bf16",
                  "W3-4096-fp32": "W3-8192-fp32"}


# ---- pure helpers ------------------------------------------------------------------------------

def fmt(v: float | None) -> str:
    """About four significant digits, thousands separated."""
    if v is None or not math.isfinite(v):
        return "n/a"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    if a >= 0.1:
        return f"{v:.3f}"
    return f"{v:.3g}"


def fmt_short(v: float) -> str:
    """Three significant digits, no exponent: target values and gaps ("0.8", "45", "3,950")."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def metric_value(metric: str, median_us: float, work: float) -> float:
    """The workload's figure from a median time: per op, a time, or a rate."""
    if not median_us > 0:
        raise ValueError(f"median time must be > 0 us, got {median_us}")
    if metric == "us/op":
        return median_us / work
    if metric == "us":
        return median_us
    if metric == "ms":
        return median_us / 1e3
    if metric == "TFLOP/s":
        return work / (median_us * 1e-6) / 1e12
    if metric == "GB/s":
        return work / (median_us * 1e-6) / 1e9
    raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(METRICS)}")


def make_result(workload: str, variant: str, times_us, metric: str, work: float,
                check: str) -> dict:
    t = np.asarray(times_us, dtype=np.float64)
    if t.ndim != 1 or len(t) == 0:
        raise ValueError(f"{workload}/{variant}: no timed runs")
    med = float(np.median(t))
    return {"workload": workload, "variant": variant, "median_us": med, "metric": metric,
            "value": float(metric_value(metric, med, work)), "reps": int(len(t)),
            "min_us": float(t.min()), "max_us": float(t.max()),
            "p10_us": float(np.percentile(t, 10)), "p90_us": float(np.percentile(t, 90)),
            "check": check}


def weights_tb_s(weight_bytes: float, median_us: float) -> float:
    """Effective weight bandwidth in TB/s: the weight bytes one run reads / its median time."""
    if not median_us > 0:
        raise ValueError(f"median time must be > 0 us, got {median_us}")
    return weight_bytes / (median_us * 1e-6) / 1e12


def weight_fields(weight_bytes: int, median_us: float) -> dict:
    """The keys a result of a workload with weights (W2) carries: ``weight_bytes`` (the
    workload's, the same on every variant) and ``weights_tb_s`` (this variant's)."""
    return {"weight_bytes": int(weight_bytes),
            "weights_tb_s": weights_tb_s(weight_bytes, median_us)}


def bytes_in_flight_per_sm(stats) -> int:
    """Bytes of weights the megakernel keeps in flight on each SM: its weight stream's ring of
    pages (``stream_pages`` in the program's stats; a program without a stream has none)."""
    return int(stats.get("stream_pages", 0) or 0) * PAGE_BYTES


def fmt_kib(nbytes: int) -> str:
    return f"{nbytes / 1024:,.0f} KiB"


def check_text(err_ratio: float, exact: bool = False) -> str:
    return "exact" if exact or err_ratio == 0.0 else f"max |err|/bound {err_ratio:.2g}"


def gpu_slug(name: str) -> str:
    """"NVIDIA H200" -> "nvidia-h200" (file names)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "gpu"


def by_workload(results: list[dict]) -> dict[str, dict[str, dict]]:
    """workload -> variant -> result, workloads in first-seen order."""
    out: dict[str, dict[str, dict]] = {}
    for r in results:
        out.setdefault(r["workload"], {})[r["variant"]] = r
    return out


def reference_variant(variants) -> str | None:
    """The megak variant the others are compared with: megak; on the call-path workloads
    (W7), which have no megak variant, megak_run (one call as a user makes it)."""
    for v in ("megak", "megak_run"):
        if v in variants:
            return v
    return None


def judged_variant(name: str) -> str:
    """The variant a workload's target (and a baseline's "megak before") is about."""
    t = TARGETS.get(name)
    return t.variant if t is not None else "megak"


def speeds(variants: dict[str, dict]) -> dict[str, dict]:
    """Per variant: ``vs_megak`` = t_megak / t (>1: faster than megak) and ``vs_best_other`` =
    t_best / t where best is the fastest variant other than megak (for the megak row: how
    megak compares with the best alternative). None where there is nothing to compare with.
    "megak" is `reference_variant` (megak_run on W7)."""
    t = {v: r["median_us"] for v, r in variants.items()}
    ref = reference_variant(t)
    # the traced build and the call-path forms are megak itself, not alternatives to it
    others = {v: x for v, x in t.items() if v not in MEGAK_VARIANTS}
    best = min(others, key=others.get) if others else None
    out = {}
    for v, x in t.items():
        out[v] = {
            "vs_megak": t[ref] / x if ref is not None else None,
            "vs_best_other": t[best] / x if best is not None else None,
            "best_other": best,
        }
    return out


def validate_doc(doc: dict) -> None:
    """The results file's schema; raises ValueError naming the first problem."""
    if not isinstance(doc, dict):
        raise ValueError("results document must be a JSON object")
    for key in ("machine", "date", "results"):
        if key not in doc:
            raise ValueError(f"results document lacks {key!r}")
    if not isinstance(doc["machine"], dict) or "gpu" not in doc["machine"]:
        raise ValueError("machine must be an object with at least 'gpu'")
    if not isinstance(doc["date"], str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", doc["date"]):
        raise ValueError(f"date must be YYYY-MM-DD, got {doc['date']!r}")
    if not isinstance(doc["results"], list):
        raise ValueError("results must be a list")
    seen = set()
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict):
            raise ValueError(f"results[{i}] is not an object")
        for key, typ in RESULT_KEYS.items():
            if key not in r:
                raise ValueError(f"results[{i}] lacks {key!r}")
            ok = isinstance(r[key], (int, float)) and not isinstance(r[key], bool) \
                if typ is float else isinstance(r[key], typ)
            if not ok:
                raise ValueError(f"results[{i}].{key} must be {typ.__name__}, got {r[key]!r}")
        if r["metric"] not in METRICS:
            raise ValueError(f"results[{i}].metric {r['metric']!r} not one of {METRICS}")
        if r["variant"] not in W.VARIANTS:
            raise ValueError(f"results[{i}].variant {r['variant']!r} not one of {W.VARIANTS}")
        if not (r["median_us"] > 0 and math.isfinite(r["median_us"]) and math.isfinite(r["value"])):
            raise ValueError(f"results[{i}]: median_us and value must be finite, median > 0")
        for key in ("weights_tb_s", "weight_bytes", "bytes_in_flight_per_sm"):
            if key in r and not (isinstance(r[key], (int, float)) and not isinstance(r[key], bool)
                                 and math.isfinite(r[key]) and r[key] >= 0):
                raise ValueError(f"results[{i}].{key} must be a finite number >= 0, "
                                 f"got {r[key]!r}")
        if (r["workload"], r["variant"]) in seen:
            raise ValueError(f"results[{i}]: duplicate {r['workload']}/{r['variant']}")
        seen.add((r["workload"], r["variant"]))


def write_json(doc: dict, path: Path) -> None:
    validate_doc(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


# ---- markdown ----------------------------------------------------------------------------------

def _machine_lines(m: dict) -> list[str]:
    pk = m.get("packages", {})
    pkgs = ", ".join(f"{k} {v}" for k, v in pk.items() if v) or "n/a"
    drv = m.get("driver_version") or "n/a"
    lines = [
        f"- GPU: **{m.get('gpu', '?')}**, {m.get('sm_count', '?')} SMs, {m.get('arch', '?')}, "
        f"{fmt(m.get('memory_gib'))} GiB",
        f"- Driver: {drv} (CUDA driver API {m.get('cuda_driver_api', '?')}); NVRTC "
        f"{m.get('nvrtc', '?')}" + (f"; torch built for CUDA {m['torch_cuda']}"
                                    if m.get("torch_cuda") else ""),
        f"- Host: {m.get('cpu', '?')} ({m.get('cpu_count', '?')} CPUs), Python "
        f"{m.get('python', '?')}, {m.get('platform', '?')}",
        f"- Packages: {pkgs}",
    ]
    if m.get("megak_commit"):
        lines.append(f"- megak: {m['megak_commit']}")
    return lines


def _target_cell(name: str, variant: str, r: dict) -> str:
    t = TARGETS.get(name)
    if t is not None and variant == t.variant and t.metric == r["metric"]:
        return f"{t.text()}: **{t.gap(r['value'])}**"
    if variant != "megak":
        return ""
    rel = RELATED_TARGET.get(name)
    if rel and rel in TARGETS:
        return f"(see {rel}: {TARGETS[rel].text()})"
    return ""


def render_summary(doc: dict) -> list[str]:
    grouped = by_workload(doc["results"])
    failed = {(f["workload"], f["variant"]) for f in doc.get("failures", [])}
    skipped = {(s["workload"], s["variant"]) for s in doc.get("skipped", []) if "workload" in s}
    nya = doc.get("not_yet_available", {})
    before = doc.get("baseline", {}).get("megak", {})
    lines = ["| workload | target | megak | gap | best other variant | megak speed vs it "
             "| baseline |", "|---|---|---|---|---|---|---|"]
    if before:
        lines = [lines[0] + " megak before |", lines[1] + "---|"]
    for name, t in TARGETS.items():
        if name in nya:
            lines.append(f"| {name} | {t.text()} | not yet available | not measured: {nya[name]} "
                         f"| | | {t.baseline} |")
            continue
        variants = grouped.get(name, {})
        r = variants.get(t.variant)
        if r is None:
            why = ("FAILED (see Failures)" if (name, t.variant) in failed
                   else "skipped (see Not measured)" if (name, t.variant) in skipped
                   else "not run" + (" (quick run)" if doc.get("quick") else ""))
            lines.append(f"| {name} | {t.text()} | {why} | not measured | | | {t.baseline} |")
            continue
        sp = speeds(variants)[t.variant]
        best = sp["best_other"]
        best_txt = (f"{best}: {fmt(variants[best]['value'])} {variants[best]['metric']}"
                    if best else "")
        vs = f"{sp['vs_best_other']:.2f}x" if sp["vs_best_other"] else ""
        which = f" ({t.variant})" if t.variant != "megak" else ""
        row = (f"| {name} | {t.text()} | {fmt(r['value'])} {r['metric']}{which} | "
               f"**{t.gap(r['value'])}** | {best_txt} | {vs} | {t.baseline} |")
        if before:
            row += f" {fmt(before[name])} {r['metric']} |" if name in before else " |"
        lines.append(row)
    if before:
        lines += ["", f"*megak before*: the megak variant in `{doc['baseline']['source']}` "
                      f"({doc['baseline'].get('what', 'the previous run')})."]
    return lines


def render_workload(name: str, variants: dict[str, dict], description: str = "",
                    notes: list[str] = ()) -> list[str]:
    sp = speeds(variants)
    metric = next(iter(variants.values()))["metric"]
    lines = [f"### {name}", ""]
    if description:
        lines += [description, ""]
    # the call path (W7) records the megakernel's device time of megak_run's call beside it
    overhead = any("host_overhead_us" in r for r in variants.values())
    # the chains with weights (W2) record each variant's weight bandwidth; older results lack it
    weights = any("weights_tb_s" in r for r in variants.values())
    lines += [f"| variant | runs | median (us) | {metric} | speed vs megak | speed vs best "
              f"other | check | target |" + (" device (us) | host overhead per call (us) |"
                                              if overhead else "")
              + (" weights (TB/s) |" if weights else ""),
              "|---|---|---|---|---|---|---|---|" + ("---|---|" if overhead else "")
              + ("---|" if weights else "")]
    order = [v for v in W.VARIANTS if v in variants]
    for v in order:
        r, s = variants[v], sp[v]
        vm = f"{s['vs_megak']:.2f}x" if s["vs_megak"] is not None else "n/a"
        vb = f"{s['vs_best_other']:.2f}x" if s["vs_best_other"] is not None else "n/a"
        runs = r.get("reps", "?")
        if r.get("calls_per_rep"):   # megak_launch: batches of back-to-back launches
            runs = f"{runs} x {r['calls_per_rep']:,}"
        row = (f"| {v} | {runs} | {fmt(r['median_us'])} | "
               f"{fmt(r['value'])} | {vm} | {vb} | {r.get('check', '')} | "
               f"{_target_cell(name, v, r)} |")
        if overhead:
            row += (f" {fmt(r['device_us'])} | {fmt(r['host_overhead_us'])} |"
                    if "host_overhead_us" in r else " | |")
        if weights:
            row += f" {fmt(r['weights_tb_s'])} |" if "weights_tb_s" in r else " |"
        lines.append(row)
    lines += _weight_lines(variants)
    if "megak" in variants and "megak_trace" in variants:
        cost = variants["megak_trace"]["median_us"] / variants["megak"]["median_us"] - 1
        verdict = "met" if cost <= TRACE_OVERHEAD_TARGET else "missed"
        lines += ["", f"Tracing on (megak_trace, the MK_TRACE=1 build) costs {100 * cost:+.1f}% "
                      f"of the megak median (target <= {100 * TRACE_OVERHEAD_TARGET:.0f}%: "
                      f"**{verdict}**); tracing off is a separate build with no trace code."]
    for v in order:
        r = variants[v]
        if "host_overhead_us" in r:
            lines += ["", f"Host overhead per call ({v}): wall-clock median "
                          f"{fmt(r['median_us'])} us - device median {fmt(r['device_us'])} us "
                          f"= **{fmt(r['host_overhead_us'])} us**: what the call costs beyond "
                          f"the megakernel's own run (device: CUDA events around one "
                          f"prog.launch, queued behind a spin kernel so that they time the "
                          f"GPU alone; {r.get('device_reps', '?')} runs)."]
    b = variants.get("megak", {}).get("bubble")
    if b:
        lines += ["", f"Bubble fraction per SM (one traced run; the share of an SM's span in "
                      f"which its compute warps run no instruction): mean {b['mean']:.1%}, "
                      f"median {b['median']:.1%}, max {b['max']:.1%} over {b['sms']} SMs."]
    for n in notes:
        lines += ["", f"Note: {n}"]
    return lines + [""]


def _weight_lines(variants: dict[str, dict]) -> list[str]:
    """Under a W2 table: what *weights (TB/s)* counts, and megak's bytes in flight per SM."""
    lines = []
    wb = next((r["weight_bytes"] for r in variants.values() if r.get("weight_bytes")), None)
    mk = variants.get("megak", {})
    if wb:
        text = (f"Weights: {wb / 2**20:,.0f} MiB ({wb:,} B) read per run; *weights (TB/s)* = "
                f"those bytes / the median time, the effective weight bandwidth")
        if "weights_tb_s" in mk:
            text += f" (megak: **{fmt(mk['weights_tb_s'])} TB/s**)"
        lines += ["", text + "."]
    if "bytes_in_flight_per_sm" in mk:
        b = mk["bytes_in_flight_per_sm"]
        lines += ["", f"Bytes in flight per SM, at most (megak's weight stream: a ring of "
                      f"{b // PAGE_BYTES} pages of {PAGE_BYTES // 1024} KiB): **{fmt_kib(b)}**."
                  if b else "Bytes in flight per SM: none (the program streams no weights)."]
    return lines


def render_markdown(doc: dict, audit_md: str | None = None, chart: str | None = None,
                    json_name: str | None = None) -> str:
    """RESULTS.md from a results document (pure: no GPU, no files)."""
    validate_doc(doc)
    m = doc["machine"]
    quick = bool(doc.get("quick"))
    out = ["# megak benchmark results", ""]
    if quick:
        out += ["> **Quick smoke run** (`--quick`): tiny rep counts and only the smaller "
                "workloads. Not figures to cite.", ""]
    if doc.get("partial"):
        not_run = ", ".join(doc["partial"].get("not_run", [])) or "none"
        out += [f"> **Partial run**: stopped before its end; not run: {not_run}.", ""]
    out += [f"Measured {doc['date']}" + (f" ({doc['timestamp']})" if doc.get("timestamp") else "")
            + (f" by `{doc['command']}`" if doc.get("command") else "")
            + (f"; raw results: `results/{json_name}`" if json_name else "") + ".", ""]
    out += _machine_lines(m) + [""]
    out += ["How to read: every figure is the median of the timed runs, all in one process: "
            "GPU variants with CUDA events around each run, the L2 flushed before each run "
            f"where the working set is at most {L2_FLUSH_BYTES >> 20} MiB (bigger ones evict "
            "it themselves; flushing them would only add the flush's dirty lines to the timed "
            "run); host workloads (W6) with perf_counter; the call-path workloads (W7) "
            "with perf_counter_ns around each call from Python, wall-clock, no L2 flush, "
            f"megak_run, megak_bound, torch and torch_graph timed in turn over {CALL_ROUNDS} "
            "rounds (each round a share of every variant's calls, so all of them sample the "
            "same phases of the host), "
            "their *megak* being megak_run (host overhead per call = its wall-clock median - "
            "the megakernel's device median). "
            "*speed vs megak* = t_megak / t: above 1 that variant is faster than megak. "
            "*speed vs best other* = t_best / t, best = the fastest variant other than megak: "
            "on the megak row, above 1 means megak beats every alternative. Every figure was "
            "checked against a float64 reference after its timed runs, on outputs poisoned "
            "with NaN beforehand: each GEMM within 2·K·2⁻²⁴·(|a|@|b|), a chain layer by layer "
            "on its computed input; copies and transposes exact. Targets are the project's "
            "(TARGETS in benchmarks/report.py), for the megak variant.", ""]
    out += ["Variants: " + "; ".join(f"**{v}**: {d}" for v, d in W.VARIANT_DESCRIPTIONS.items())
            + ".", ""]
    out += ["## Targets", ""] + render_summary(doc) + [""]
    if chart:
        out += [f"![speed of each variant relative to megak]({chart})", ""]
    if doc.get("failures"):
        out += ["## Failures", ""]
        for f in doc["failures"]:
            out.append(f"- **FAILED** {f['workload']} / {f['variant']}: {f['error']}")
        out.append("")
    skipped = doc.get("skipped", [])
    if skipped:
        out += ["## Not measured", ""]
        out += [f"- {s['workload'] + ' / ' if 'workload' in s else ''}{s['variant']}: "
                f"{s['reason']}" for s in skipped]
        out.append("")
    out += ["## Results per workload", ""]
    descr = doc.get("descriptions", {})
    notes = doc.get("notes", {})
    for name, variants in by_workload(doc["results"]).items():
        out += render_workload(name, variants, descr.get(name, ""), notes.get(name, []))
    out += render_hop(doc)
    nya = doc.get("not_yet_available", {})
    if nya:
        out += ["## Not yet available", ""]
        for name, why in nya.items():
            t = TARGETS.get(name)
            out.append(f"- {name}: not measured: {why}" + (f" (target {t.text()})" if t else ""))
        out.append("")
    out += ["## Memory audit (Nsight Compute)", ""]
    out += [audit_md.strip() if audit_md else
            "Not run yet: `python -m benchmarks.audit` writes `results/audit-<date>.json`; "
            "then `python -m benchmarks.report --render-only` puts its table here.", ""]
    return "\n".join(out)


def render_hop(doc: dict) -> list[str]:
    """The hop microbenchmark's two figures (benchmarks/hop.py), beside W1's megak figure."""
    h = doc.get("hop")
    if not h:
        return []
    w1 = by_workload(doc["results"]).get("W1", {}).get("megak")
    out = ["### The dependent hop (benchmarks/hop.py)", "",
           f"One thread per SM, a chain of {h['n_hops']:,} hops across the "
           f"{h['sm_count']} SMs, timed inside the kernel (%globaltimer), medians of "
           f"{h['reps']} launches: the floor of one cross-SM dependent step, outside megak.", "",
           "| hand-off | us per hop |", "|---|---|",
           f"| data as its own flag (one 64-bit word, value + epoch, relaxed) | "
           f"{h['word_us']:.3f} |",
           f"| separate flag (release / acquire) | {h['flag_us']:.3f} |"]
    if w1 is not None:
        out.append(f"| megak W1 (a copy instruction per hop, whole megakernel) | "
                   f"{w1['value']:.3f} |")
    return out + ["", f"Separate flag / data as its own flag: {h['ratio']:.2f}x.", ""]


# ---- chart -------------------------------------------------------------------------------------

#: bar colour of each variant compared with megak (others: matplotlib's cycle)
CHART_COLORS = {"separate": "#4c72b0", "graph": "#55a868", "graph_pdl": "#2ca7a0",
                "torch": "#c44e52", "torch_graph": "#8172b2", "megak_launch": "#dd8452",
                "megak_bound": "#64b5cd",
                "megak_resident": "#937860", "megak_resident_bound": "#8c613c"}


def write_chart(doc: dict, path: Path) -> bool:
    """Horizontal bars: per workload, t_megak / t of every other variant (log scale; 1 = as
    fast as megak). Returns False (and writes nothing) without matplotlib or anything to plot."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    rows = []
    for name, variants in by_workload(doc["results"]).items():
        ref = reference_variant(variants)
        if ref is not None and len(variants) > 1:
            sp = speeds(variants)
            rows.append((name, {v: sp[v]["vs_megak"] for v in variants if v != ref}))
    if not rows:
        return False
    others = [v for v in W.VARIANTS if any(v in r[1] for r in rows)]
    height = 0.8 / max(len(others), 1)
    # the Figure API directly (no pyplot): no global state, no display backend needed
    fig = Figure(figsize=(9, 0.6 + 0.55 * len(rows) * max(1, len(others) / 2)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ys = np.arange(len(rows))[::-1]
    lo, hi = 1.0, 1.0
    for k, v in enumerate(others):
        vals = [r[1].get(v) for r in rows]
        # first variant on top; bars grow from 1 (as fast as megak) to the variant's speed,
        # leftwards when it is slower: the log axis makes 2x slower and 2x faster equally long
        pos = [y - (k - (len(others) - 1) / 2) * height for y in ys]
        xs = [x if x else np.nan for x in vals]
        ax.barh(pos, [x - 1.0 for x in xs], height=height * 0.9, left=1.0, label=v,
                color=CHART_COLORS.get(v))
        for p, x in zip(pos, xs):
            if x == x:
                lo, hi = min(lo, x), max(hi, x)
                slower = x < 1.0
                ax.text(x, p, f"{x:.2g}x " if slower else f" {x:.2g}x", va="center",
                        ha="right" if slower else "left", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(lo / 2, hi * 3)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_yticks(ys, [r[0] for r in rows])
    ax.set_xlabel("speed relative to megak (t_megak / t, log scale; W7: megak_run): < 1 = "
                  "slower than megak")
    title = f"{doc['machine'].get('gpu', '')} {doc['date']}" + (" (quick)" if doc.get("quick")
                                                                 else "")
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return True


# ---- files -------------------------------------------------------------------------------------

def output_paths(out_dir: Path, gpu: str, date: str, quick: bool) -> dict[str, Path]:
    stem = f"{gpu_slug(gpu)}-{date}" + ("-quick" if quick else "")
    return {"json": out_dir / "results" / f"{stem}.json",
            "png": out_dir / "results" / f"{stem}.png",
            "md": out_dir / ("RESULTS-quick.md" if quick else "RESULTS.md")}


def partial_path(out_dir: Path, gpu: str, quick: bool) -> Path:
    """Where a run keeps its results so far, rewritten after each workload and removed once
    the full results are written: a run stopped early (a lease's limit, a timeout) still
    leaves every workload it finished, marked "partial" with the ones it did not run. Never
    picked by --render-only's default; RESULTS.md is rendered from a complete run."""
    return out_dir / "results" / (f"{gpu_slug(gpu)}" + ("-quick" if quick else "")
                                  + ".partial.json")


def latest_audit(results_dir: Path) -> tuple[Path | None, str | None]:
    """The newest audit-*.json (by date in the name) and its markdown table."""
    from . import audit
    found = sorted(results_dir.glob("audit-*.json"))
    if not found:
        return None, None
    path = found[-1]
    try:
        return path, audit.render_markdown(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        return path, f"(audit file {path.name} could not be read: {exc})"


def write_outputs(doc: dict, out_dir: Path) -> dict[str, Path]:
    paths = output_paths(out_dir, doc["machine"]["gpu"], doc["date"], bool(doc.get("quick")))
    write_json(doc, paths["json"])
    chart = write_chart(doc, paths["png"])
    _, audit_md = latest_audit(out_dir / "results")
    md = render_markdown(doc, audit_md,
                         chart=f"results/{paths['png'].name}" if chart else None,
                         json_name=paths["json"].name)
    paths["md"].write_text(md)
    if not chart:
        paths.pop("png")
    return paths


def load_baseline(path: Path, what: str = "") -> dict:
    """The megak figures of an earlier results file, to print beside this run's."""
    old = json.loads(path.read_text())
    validate_doc(old)
    megak = {r["workload"]: r["value"] for r in old["results"]
             if r["variant"] == judged_variant(r["workload"])}
    try:
        source = path.resolve().relative_to(BENCH_DIR).as_posix()
    except ValueError:
        source = path.name
    return {"source": source, "date": old["date"], "megak": megak,
            "what": what or f"measured {old['date']}"}


def render_only(out_dir: Path, source: str | None) -> int:
    results = out_dir / "results"
    if source:
        path = Path(source)
    else:
        found = sorted((p for p in results.glob("*.json")
                        if not p.name.startswith("audit-") and not p.stem.endswith("-quick")
                        and not p.name.endswith(".partial.json")),
                       key=lambda p: p.stat().st_mtime)
        if not found:
            print(f"benchmarks.report: no results JSON in {results}", file=sys.stderr)
            return 2
        path = found[-1]
    doc = json.loads(path.read_text())
    paths = write_outputs(doc, out_dir)
    print(f"rendered {paths['md']} from {path}")
    return 0


# ---- GPU measurement ---------------------------------------------------------------------------

def time_bench_variant(b, variant: str, reps: int, warmup: int, flush: bool) -> np.ndarray:
    """Microseconds per run of one of the megak-side variants on Bench `b`."""
    if variant == "megak":
        return b.time_megakernel(reps=reps, warmup=warmup, flush_l2=flush)
    if variant == "megak_trace":   # the MK_TRACE=1 build: what tracing costs when on
        return b.time_megakernel(reps=reps, warmup=warmup, flush_l2=flush, trace=True)
    if variant == "separate":
        return b.time_separate(reps=reps, warmup=warmup, flush_l2=flush, graph=False)
    if variant == "graph":
        return b.time_separate(reps=reps, warmup=warmup, flush_l2=flush, graph=True)
    if variant == "graph_pdl":   # the same graph, launches joined by programmatic edges
        return b.time_separate(reps=reps, warmup=warmup, flush_l2=flush, graph=True, pdl=True)
    raise ValueError(f"unknown Bench variant {variant!r}; allowed: megak, megak_trace, "
                     f"separate, graph, graph_pdl")


def time_calls(fn, reps: int, warmup: int, clock=time.perf_counter_ns) -> np.ndarray:
    """Microseconds per call of fn, wall-clock from Python: each call timed on its own (the
    call path, W7: fn waits for its GPU work itself)."""
    for _ in range(warmup):
        fn()
    times = np.empty(reps, dtype=np.float64)
    for i in range(reps):
        t0 = clock()
        fn()
        times[i] = clock() - t0
    return times / 1e3


def time_launch_batches(launch, reps: int, warmup: int, calls: int = W.LAUNCH_BATCH,
                        clock=time.perf_counter_ns) -> np.ndarray:
    """Microseconds per call of `calls` launches back to back then one wait() on the last
    handle, per batch (wall-clock). After each batch, untimed, every handle is waited on, so
    a failed launch raises here instead of hiding behind the last one."""
    times = []
    for b in range(warmup + reps):
        t0 = clock()
        handles = [launch() for _ in range(calls)]
        handles[-1].wait()
        dt = clock() - t0
        for h in handles:
            h.wait()
        if b >= warmup:
            times.append(dt / calls)
    return np.asarray(times, dtype=np.float64) / 1e3


def call_overhead(wall_median_us: float, device_us) -> dict:
    """What a call costs beyond the GPU's work: the wall-clock median of one call minus the
    device median of the same launch (CUDA events). Keys as stored with the megak_run
    result."""
    d = np.asarray(device_us, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError("no device times")
    dev = float(np.median(d))
    return {"device_us": dev, "device_reps": int(len(d)),
            "host_overhead_us": float(wall_median_us) - dev}


class TorchEnv:
    """torch on device 0 with TF32 off, an L2 flush buffer and CUDA-event timing."""

    def __init__(self):
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        # fp32 means fp32: cuBLAS must not round operands to TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        self.torch = torch
        self.device = torch.device("cuda", 0)
        self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.float32, device=self.device)

    def time(self, fn, reps: int, warmup: int, flush: bool) -> np.ndarray:
        torch = self.torch
        for _ in range(warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            if flush:
                self._flush.zero_()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return np.array([s.elapsed_time(e) for s, e in zip(starts, ends)]) * 1e3

    def capture(self, fn):
        """fn captured in a CUDA graph (warmed up on a side stream first, as capture needs)."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        return graph

    def poison(self, case: W.TorchCase) -> None:
        self.poison_tensors(case.buffers)

    def poison_tensors(self, tensors) -> None:
        for buf in tensors:
            buf.fill_(float("nan"))
        self.torch.cuda.synchronize()

    def fetch(self, case: W.TorchCase) -> dict:
        return self.fetch_tensors(case.outputs)

    def fetch_tensors(self, tensors: dict) -> dict:
        from megak.interop import _torch_to_numpy   # bf16 tensors have no .numpy()
        return {name: _torch_to_numpy(t.cpu()) for name, t in tensors.items()}

    # -- the call path (W7): the caller's tensors, per-call synchronisation, device time ----
    def to_device(self, inputs: dict) -> dict:
        return {name: W._to_torch(a, self.torch, self.device) for name, a in inputs.items()}

    def empty(self, shape, dtype: str):
        return self.torch.empty(shape, dtype=getattr(self.torch, dtype), device=self.device)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def device_times(self, fn, reps: int, warmup: int) -> tuple[np.ndarray, list]:
        """Microseconds of the GPU work fn queues on the current stream (CUDA events around
        it), and what every call of fn returned (warm-up included), for the caller to wait
        on. On an idle stream the first event would complete at once and the interval would
        hold the host's own launch work, the very thing subtracted from the wall-clock time:
        a spin kernel queued ahead keeps the stream busy until both events and fn's launch
        are queued."""
        torch = self.torch
        returned = [fn() for _ in range(warmup)]
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            torch.cuda._sleep(DEVICE_TIMING_SLEEP_CYCLES)
            starts[i].record()
            returned.append(fn())
            ends[i].record()
        torch.cuda.synchronize()
        return np.array([s.elapsed_time(e) for s, e in zip(starts, ends)]) * 1e3, returned

    def release(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()


def _error(exc: BaseException) -> str:
    """The exception in one line; a megakernel error with its status record's numbers, which
    its message leaves out for most codes (MK_ERR_PAGE_LEAK's pages needed and free)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    rec = getattr(exc, "record", None)
    if isinstance(rec, dict) and rec.get("error"):
        text += (f" [status record: counter {rec.get('counter', 0)}, expected "
                 f"{rec.get('expected', 0)}, observed {rec.get('observed', 0)}]")
    return text


def _reps(w, variant: str, quick: bool) -> tuple[int, int]:
    return QUICK_REPS if quick else w.reps.get(variant, w.reps.get("megak"))


def traced_bubbles(prog, w: W.Workload, inputs: dict, ref) -> dict:
    """One traced run (the MK_TRACE=1 build), checked like the timed ones; its per-SM bubble
    fraction: the share of each SM's span (its first fetch to its last store) in which its
    compute warps are not inside an instruction's [loaded, stored] (megak/trace.py)."""
    w.check(ref, prog.run(**inputs, trace=True), "megak traced run")
    return prog.last_trace.bubble_summary()


def _record_failure(failures: list, workload: str, log, variant: str, stage: str,
                    exc) -> None:
    """One failed variant: into the results' failures, and said in the log."""
    failures.append({"workload": workload, "variant": variant,
                     "error": f"{stage}: {_error(exc)}"})
    log(f"  {workload}/{variant}: FAILED {stage}: {_error(exc)}")


SEPARATE_VARIANTS = ("separate", "graph", "graph_pdl")
PEER_LOWERING_WHY = ("a streamed GEMM's loop without the megakernel's weight ring runs "
                     "1.3-2.9x slower than the tiles in separate launches: graph_pdl "
                     "W2-4096x8-fp32 519.5 against 265.9 us (H100), W2-4096x8-bf16 731.4 "
                     "against 255.3 (H200), W2-1024x16-bf16 389.4 against 302.4 (H200), "
                     "W2-8192x8-bf16 1,364.8 against 1,071.0 (H100)")


def peer_lowering(plan) -> dict:
    """compile() keywords for the program the separate launches time, where they differ from
    the megakernel's (which compiles with the defaults): each variant runs the lowering it
    runs best. A plan with streamed GEMMs (bf16 or fp32) is lowered again without the weight
    stream (PEER_LOWERING_WHY: tools/probe_peer_lowering.py measured every W2 row)."""
    flags = plan.instrs["flags"]
    return {"weight_stream": False} if (flags & FLAG_STREAM).any() else {}


def run_gpu_workload(w: W.Workload, quick: bool, torch_env: TorchEnv | None,
                     rng: np.random.Generator, log=print, backend: str = "cuda",
                     bench_cls=None) -> tuple[list, list, list]:
    """All variants of one workload: (results, failures, notes). ``backend`` and ``bench_cls``
    exist for the CPU tests (the simulator and a stand-in Bench); the report uses the GPU."""
    import megak
    if bench_cls is None:
        from megak.runtime.bench import Bench as bench_cls

    results, failures, notes = [], [], []
    flush = w.working_set_bytes <= L2_FLUSH_BYTES
    inputs = w.make_inputs(rng)
    ref = w.reference(inputs, rng)

    fail = functools.partial(_record_failure, failures, w.name, log)

    def record(variant, times, err):
        r = make_result(w.name, variant, times, w.metric, w.work, check_text(err))
        if w.weight_bytes:
            r.update(weight_fields(w.weight_bytes, r["median_us"]))
        results.append(r)
        log(f"  {w.name}/{variant}: median {fmt(r['median_us'])} us, {fmt(r['value'])} "
            f"{w.metric} ({r['reps']} runs, {r['check']})"
            + (f", weights {fmt(r['weights_tb_s'])} TB/s" if "weights_tb_s" in r else ""))

    # -- megak, separate, graph, graph_pdl: one Bench per program, on its device buffers ---------
    bench_variants = ("megak", "separate", "graph", "graph_pdl")
    if w.name.startswith("W2-"):   # tracing overhead is measured on the MLP chains
        bench_variants = ("megak", "megak_trace", "separate", "graph", "graph_pdl")
    prog = bench = peer_prog = peer = None
    stage = "compile"

    def time_on(b, variants) -> None:
        for v in variants:
            try:
                reps, warmup = _reps(w, v, quick)
                b.poison()   # a variant that skips work then fails its check
                times = time_bench_variant(b, v, reps, warmup, flush)
                err = w.check(ref, b.outputs(), f"{v} (outputs of the timed runs)")
                record(v, times, err)
            except Exception as exc:
                fail(v, "timing/check", exc)

    try:
        prog = megak.compile(w.build(), backend=backend)
        if w.plan_check is not None:
            stage = "plan check"
            notes.append(w.plan_check(prog.plan))
        stage = "Bench set-up"
        bench = bench_cls(prog)
        run_ok = True
        try:
            w.check(ref, prog.run(**inputs), "megak prog.run")
        except Exception as exc:   # the timed megak variant would be unchecked: skip it
            fail("megak", "prog.run before timing", exc)
            run_ok = False
        stage = "upload"
        bench.upload(**inputs)
        separate = [v for v in bench_variants if v in SEPARATE_VARIANTS]
        time_on(bench, [v for v in bench_variants if v not in separate
                        and (v != "megak" or run_ok)])
        lowering = peer_lowering(prog.plan)
        try:
            if lowering:
                peer_prog = megak.compile(w.build(), backend=backend, **lowering)
                peer = bench_cls(peer_prog)
                peer.upload(**inputs)
                notes.append(f"separate launches: lowered with {lowering} "
                             f"({PEER_LOWERING_WHY})")
            time_on(bench if peer is None else peer, separate)
        except Exception as exc:   # the megakernel's rows stand; its traced run follows
            for v in separate:
                fail(v, "the separate launches' program", exc)
        megak_row = next((r for r in results if r["variant"] == "megak"), None)
        if megak_row is not None and w.weight_bytes:
            megak_row["bytes_in_flight_per_sm"] = bytes_in_flight_per_sm(prog.stats)
        if megak_row is not None:
            stage = "traced run"
            try:
                megak_row["bubble"] = traced_bubbles(prog, w, inputs, ref)
            except Exception as exc:
                notes.append(f"no bubble fraction: the traced run failed: {_error(exc)}")
    except Exception as exc:
        done = {f["variant"] for f in failures} | {r["variant"] for r in results}
        for v in bench_variants:
            if v not in done:
                fail(v, stage, exc)
    finally:
        close_bench(peer, peer_prog)
        close_bench(bench, prog)

    if w.build_constant is not None:
        run_constant_variant(w, quick, inputs, ref, record, fail, backend, bench_cls)

    # -- torch and torch_graph -----------------------------------------------------------------
    if torch_env is not None:
        case = None
        try:
            case = w.torch_case(inputs, torch_env.torch, torch_env.device)
            case.run()
            w.check(ref, torch_env.fetch(case), "torch (before timing)")
        except Exception as exc:
            fail("torch", "set-up/check", exc)
            case = None
        if case is not None:
            try:
                reps, warmup = _reps(w, "torch", quick)
                torch_env.poison(case)
                times = torch_env.time(case.run, reps, warmup, flush)
                err = w.check(ref, torch_env.fetch(case), "torch (outputs of the timed runs)")
                record("torch", times, err)
            except Exception as exc:
                fail("torch", "timing/check", exc)
            try:
                reps, warmup = _reps(w, "torch_graph", quick)
                graph = torch_env.capture(case.run)
                torch_env.poison(case)
                times = torch_env.time(graph.replay, reps, warmup, flush)
                err = w.check(ref, torch_env.fetch(case), "torch_graph (outputs of the timed "
                              "runs)")
                record("torch_graph", times, err)
                del graph
            except Exception as exc:
                fail("torch_graph", "capture/timing/check", exc)
        del case
        torch_env.release()
    return results, failures, notes


def close_bench(bench, prog) -> None:
    """Free a workload's Bench (its failure to close is no result's) and its program."""
    if bench is not None:
        try:
            bench.close()
        except Exception:
            pass
    if prog is not None:
        prog.close()


def run_constant_variant(w: W.Workload, quick: bool, inputs: dict, ref, record, fail,
                         backend: str, bench_cls) -> None:
    """megak_const: the workload's graph with its weights as constants (w.build_constant),
    timed as the megak variant is, on the inputs that are left."""
    import megak
    prog = bench = None
    left = {k: inputs[k] for k in w.constant_inputs}
    try:
        prog = megak.compile(w.build_constant(inputs), backend=backend)
        w.check(ref, prog.run(**left), "megak_const prog.run")
        bench = bench_cls(prog)
        bench.upload(**left)
        reps, warmup = _reps(w, "megak_const", quick)
        bench.poison()
        times = time_bench_variant(bench, "megak", reps, warmup,
                                   w.working_set_bytes <= L2_FLUSH_BYTES)
        record("megak_const", times,
               w.check(ref, bench.outputs(), "megak_const (outputs of the timed runs)"))
    except Exception as exc:
        fail("megak_const", "compile/timing/check", exc)
    finally:
        close_bench(bench, prog)


@dataclass
class TimedCall:
    """One per-call variant of time_in_turn: ``fn`` is one call (it waits for its GPU work);
    ``before()`` runs untimed ahead of each of the variant's blocks (poison its outputs),
    ``after()`` untimed behind each (check them: it returns the check's text and raises
    when they are wrong)."""
    fn: object
    reps: int
    warmup: int
    before: object
    after: object


def time_in_turn(calls: dict, on_fail, rounds: int = CALL_ROUNDS,
                 clock=time.perf_counter_ns) -> dict:
    """Microseconds per call of each of ``calls`` (name -> TimedCall), wall-clock from
    Python, the variants timed in turn: every variant's warm-up, then ``rounds`` rounds in
    which each variant times its share of its reps between its before() and after(), the
    order rotated by one each round, so every variant samples the same phases of the host.
    A variant whose fn, before() or after() raises leaves the rounds and is reported
    through ``on_fail(name, exc)``. Returns name -> (times, the text of its last check) for
    the variants that finished."""
    live = {}
    for name, c in calls.items():
        try:
            for _ in range(c.warmup):
                c.fn()
            live[name] = c
        except Exception as exc:
            on_fail(name, exc)
    blocks = {name: [] for name in live}
    checked = {}
    order = list(live)
    for r in range(rounds):
        turn = order[r % len(order):] + order[:r % len(order)] if order else []
        for name in turn:
            c = live.get(name)
            n = c.reps // rounds + (r < c.reps % rounds) if c is not None else 0
            if n == 0:
                continue
            try:
                c.before()
                times = time_calls(c.fn, n, 0, clock)
                checked[name] = c.after()
            except Exception as exc:
                del live[name]
                on_fail(name, exc)
                continue
            blocks[name].append(times)
    return {name: (np.concatenate(blocks[name]), checked[name]) for name in live}


def run_call_workload(w: W.Workload, quick: bool, env, rng: np.random.Generator, log=print,
                      backend: str = "cuda",
                      launch_batch: int = W.LAUNCH_BATCH) -> tuple[list, list, list]:
    """The call path (W7): each variant timed per call from Python, wall-clock, no L2 flush;
    (results, failures, notes). ``env`` is a TorchEnv: the megak variants take its GPU tensors
    in and write ``out=`` tensors, so a call is one launch on torch's current stream.
    megak_run, megak_bound, torch and torch_graph are timed in turn (time_in_turn), their
    outputs poisoned before and checked after each round's calls; then megak_run's device
    time, megak_launch and the resident variants (whose kernel holds every SM) one after
    another. ``backend``, ``launch_batch`` and a stand-in ``env`` exist for the CPU tests."""
    import megak

    results, failures, notes = [], [], []
    inputs = w.make_inputs(rng)
    ref = w.reference(inputs, rng)

    fail = functools.partial(_record_failure, failures, w.name, log)

    def record(variant, times, err, **extra):
        r = make_result(w.name, variant, times, w.metric, w.work, check_text(err))
        r.update(extra)
        results.append(r)
        log(f"  {w.name}/{variant}: median {fmt(r['median_us'])} us per call "
            f"({r['reps']} runs, {r['check']})")
        return r

    megak_variants = ("megak_run", "megak_bound", "megak_launch")
    resident_variants = ("megak_resident", "megak_resident_bound")
    prog = case = graph = None
    calls = {}
    try:
        # -- one program, the same tensors on every call: its run checked once ---------------
        stage = "compile"
        try:
            prog = megak.compile(w.build(), backend=backend)
            stage = "tensors"
            plan = prog.plan
            tin = env.to_device(inputs)
            # every output the graph declares goes to a tensor of the caller: nothing is
            # allocated or copied per call, so repeated calls reuse one checked binding
            outs = {name: env.empty(plan.output_shapes[name], plan.tensors[slot].dtype)
                    for name, slot in plan.outputs.items()}

            def call():
                return prog.run(out=outs, **tin)

            def launch():
                return prog.launch(out=outs, **tin)

            bound = prog.bind(out=outs, **tin)
            stage = "prog.run before timing"
            call()
            w.check(ref, env.fetch_tensors(outs), "megak prog.run")
        except Exception as exc:
            for v in megak_variants + resident_variants:
                fail(v, stage, exc)
            prog_ok = False
        else:
            prog_ok = True

            def poison_outs():
                env.poison_tensors(outs.values())   # a variant that skips work then fails

            def check_megak(v):
                return w.check(ref, env.fetch_tensors(outs), f"{v} (outputs of the timed runs)")
            for v, fn in (("megak_run", call), ("megak_bound", bound.run)):
                calls[v] = TimedCall(fn, *_reps(w, v, quick), poison_outs,
                                     functools.partial(check_megak, v))

        # -- torch and torch_graph, each call synchronised ------------------------------------
        try:
            case = w.torch_case(inputs, env.torch, env.device)
            case.run()
            env.sync()
            w.check(ref, env.fetch(case), "torch (before timing)")
        except Exception as exc:
            fail("torch", "set-up/check", exc)
            case = None
        if case is not None:
            def eager():
                case.run()
                env.sync()

            def check_torch(v):
                return w.check(ref, env.fetch(case), f"{v} (outputs of the timed runs)")
            calls["torch"] = TimedCall(eager, *_reps(w, "torch", quick),
                                       lambda: env.poison(case),
                                       functools.partial(check_torch, "torch"))
            try:
                graph = env.capture(case.run)
            except Exception as exc:
                fail("torch_graph", "capture", exc)
            else:
                def replay():
                    graph.replay()
                    env.sync()
                calls["torch_graph"] = TimedCall(replay, *_reps(w, "torch_graph", quick),
                                                 lambda: env.poison(case),
                                                 functools.partial(check_torch, "torch_graph"))

        timed = time_in_turn(calls, lambda v, exc: fail(v, "timing/check", exc))
        for v, (times, err) in timed.items():
            row = record(v, times, err)
            if v != "megak_run":
                continue
            try:   # the same launch timed on the device: what of the call is the GPU's
                env.poison_tensors(outs.values())
                reps, warmup = _reps(w, v, quick)
                dev, handles = env.device_times(launch, reps, warmup)
                for h in handles:
                    h.wait()
                w.check(ref, env.fetch_tensors(outs), "megak_run (outputs of the device-timed "
                        "runs)")
                row.update(call_overhead(row["median_us"], dev))
                log(f"  {w.name}/megak_run: device median {fmt(row['device_us'])} us, host "
                    f"overhead per call {fmt(row['host_overhead_us'])} us")
            except Exception as exc:
                fail(v, "device time", exc)
        if prog_ok:
            # -- megak_launch: batches of launches, one wait each ------------------------------
            try:
                reps, warmup = _reps(w, "megak_launch", quick)
                env.poison_tensors(outs.values())
                times = time_launch_batches(launch, reps, warmup, launch_batch)
                err = w.check(ref, env.fetch_tensors(outs),
                              "megak_launch (outputs of the timed runs)")
                record("megak_launch", times, err, calls_per_rep=launch_batch)
            except Exception as exc:
                fail("megak_launch", "timing/check", exc)
            # -- megak_resident(_bound): the same program served by a resident kernel, its
            # requests made from the tensors or from the bound call --------------------------
            for v in resident_variants:
                try:
                    reps, warmup = _reps(w, v, quick)
                    env.poison_tensors(outs.values())   # before: the kernel holds every SM
                    with megak.resident(prog) as r:
                        if v == "megak_resident":
                            def submit():
                                return r.submit(prog, out=outs, **tin).wait()
                        else:
                            def submit():
                                return r.submit(bound).wait()
                        times = time_calls(submit, reps, warmup)
                        launches = r.launches
                    err = w.check(ref, env.fetch_tensors(outs),
                                  f"{v} (outputs of the timed runs)")
                    record(v, times, err, kernel_launches=launches)
                except Exception as exc:
                    fail(v, "timing/check", exc)
    finally:
        if prog is not None:
            prog.close()
        graph = case = None   # torch's graph and buffers go before env.release()
        env.release()
    rank = {v: i for i, v in enumerate(W.CALL_VARIANTS)}
    results.sort(key=lambda r: rank[r["variant"]])
    failures.sort(key=lambda f: rank.get(f["variant"], len(rank)))
    return results, failures, notes


def run_host_workload(w: W.HostWorkload, quick: bool, log=print) -> tuple[list, list, list]:
    reps, warmup = (QUICK_REPS if quick else w.reps)
    times, note = [], ""
    try:
        state = w.setup()
        try:
            for i in range(warmup + reps):
                prepared = w.prepare(state)
                try:
                    t0 = time.perf_counter()
                    product = w.step(state, prepared)
                    dt = time.perf_counter() - t0
                    # a step run in a child process reports its own time (no process start)
                    dt = getattr(product, "elapsed_s", dt)
                finally:
                    w.cleanup(state, prepared)
                note = w.check(state, product)   # every run's product, timed or not
                if i >= warmup:
                    times.append(dt * 1e6)
        finally:
            w.teardown(state)
        r = make_result(w.name, "megak", times, w.metric, 0.0, "checked")
    except Exception as exc:
        log(f"  {w.name}/megak: FAILED: {_error(exc)}")
        return [], [{"workload": w.name, "variant": "megak", "error": _error(exc)}], []
    log(f"  {w.name}/megak: median {fmt(r['value'])} ms ({r['reps']} runs; {note})")
    return [r], [], [note] if note else []


# ---- machine -----------------------------------------------------------------------------------

def _run_text(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def package_versions(names=("numpy", "cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc",
                            "torch", "matplotlib")) -> dict[str, str | None]:
    from importlib import metadata
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def megak_commit() -> str | None:
    """The megak revision a run measures: $MEGAK_COMMIT where the caller names it (a working
    tree copied to a GPU machine can carry a stale .git, whose HEAD would be recorded), else
    the checkout's HEAD, marked when the tree has uncommitted changes."""
    named = os.environ.get("MEGAK_COMMIT", "").strip()
    if named:
        return named
    commit = _run_text(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_DIR)
    if commit and _run_text(["git", "status", "--porcelain"], cwd=REPO_DIR):
        commit += " (with uncommitted changes)"
    return commit


def machine_info(torch_env: TorchEnv | None = None) -> dict:
    from megak.runtime.compiler import nvrtc_version
    from megak.runtime.driver import device_info
    info = device_info()
    api = int(info["driver_version"])
    smi = _run_text(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    commit = megak_commit()
    major, minor = nvrtc_version()
    return {
        "gpu": info["name"],
        "sm_count": info["sm_count"],
        "compute_capability": "%d.%d" % tuple(info["compute_capability"]),
        "arch": info["arch"],
        "memory_gib": round(info["total_mem"] / 2 ** 30, 1),
        "driver_version": smi.splitlines()[0] if smi else None,
        "cuda_driver_api": f"{api // 1000}.{api % 1000 // 10}",
        "nvrtc": f"{major}.{minor}",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(),
        "torch_cuda": (torch_env.torch.version.cuda if torch_env is not None else None),
        "torch_tf32": (False if torch_env is not None else None),
        "megak_commit": commit,
    }


# ---- main --------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report",
                                description="megak benchmarks: megakernel vs separate launches, "
                                            "CUDA graphs and torch/cuBLAS (needs a GPU)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny rep counts, smaller workloads only (< 1 min)")
    p.add_argument("--out-dir", default=str(BENCH_DIR),
                   help="where RESULTS.md and results/ go (default: the benchmarks folder)")
    p.add_argument("--only", nargs="+", metavar="WORKLOAD",
                   help=f"run only these workloads (of: {', '.join(W.FACTORIES)})")
    p.add_argument("--seed", type=int, help="input seed (default: fresh, recorded in the JSON)")
    p.add_argument("--no-torch", action="store_true", help="skip the torch variants")
    p.add_argument("--baseline", metavar="JSON",
                   help="an earlier results file: its megak figures go in a 'megak before' "
                        "column of the targets table")
    p.add_argument("--render-only", nargs="?", const="", metavar="JSON",
                   help="only write RESULTS.md and the chart again, from JSON (default: the "
                        "newest results file in OUT_DIR/results) and the newest audit; no GPU")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out_dir = Path(args.out_dir)
    if args.render_only is not None:
        return render_only(out_dir, args.render_only or None)

    os.environ.setdefault("CUDA_PYTHON_DISABLE_VERSION_CHECK", "1")
    from megak.runtime.driver import gpu_unusable_reason, gpu_usable
    if not gpu_usable():
        print(f"benchmarks.report needs a GPU: {gpu_unusable_reason()}", file=sys.stderr)
        return 2
    names = list(args.only) if args.only else list(W.QUICK if args.quick else W.FACTORIES)
    unknown = [n for n in names if n not in W.FACTORIES]
    if unknown:
        print(f"benchmarks.report: unknown workloads {unknown}; known: "
              f"{', '.join(W.FACTORIES)}", file=sys.stderr)
        return 2

    t_start = time.monotonic()
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**63)
    rng = np.random.default_rng(seed)
    skipped = []
    torch_env = None
    if args.no_torch:
        skipped = [{"variant": v, "reason": "--no-torch"} for v in ("torch", "torch_graph")]
    else:
        try:
            torch_env = TorchEnv()
        except Exception as exc:   # ImportError, or a torch without CUDA
            skipped = [{"variant": v, "reason": f"torch unavailable: {_error(exc)}"}
                       for v in ("torch", "torch_graph")]
    machine = machine_info(torch_env)
    print(f"benchmarks.report: {machine['gpu']}, {len(names)} workloads, seed {seed}"
          + (" (quick)" if args.quick else ""), flush=True)

    results, failures, notes, descriptions = [], [], {}, {}

    def document() -> dict:
        now = _dt.datetime.now(_dt.timezone.utc)
        return {
            "machine": machine,
            "date": now.date().isoformat(),
            "timestamp": now.isoformat(timespec="seconds"),
            "command": "python -m benchmarks.report" + (" " + " ".join(argv or sys.argv[1:])
                                                        if (argv or sys.argv[1:]) else ""),
            "quick": bool(args.quick),
            "seed": seed,
            "results": results,
            "failures": failures,
            "skipped": skipped,
            "not_yet_available": dict(W.NOT_YET_AVAILABLE),
            "descriptions": descriptions,
            "notes": notes,
            "elapsed_s": round(time.monotonic() - t_start, 1),
        }

    partial = partial_path(out_dir, machine["gpu"], bool(args.quick))
    for done, name in enumerate(names):
        w = W.get(name)
        descriptions[w.name] = w.description
        t0 = time.monotonic()
        print(f"{name}: {w.description}", flush=True)
        try:
            if w.kind == "host":
                r, f, n = run_host_workload(w, args.quick)
            elif w.kind == "call" and torch_env is None:
                # the call path takes torch tensors: without torch there is nothing to call
                why = next(s["reason"] for s in skipped)
                skipped += [{"workload": w.name, "variant": v, "reason": why}
                            for v in W.CALL_VARIANTS]
                print(f"  {w.name}: not measured ({why})", flush=True)
                r, f, n = [], [], []
            elif w.kind == "call":
                r, f, n = run_call_workload(w, args.quick, torch_env, rng)
            else:
                r, f, n = run_gpu_workload(w, args.quick, torch_env, rng)
        except Exception as exc:   # inputs/reference failed: nothing of it was measured
            traceback.print_exc()
            r, f, n = [], [{"workload": w.name, "variant": "megak", "error": _error(exc)}], []
        results += r
        failures += f
        if n:
            notes[w.name] = n
        print(f"  ({time.monotonic() - t0:.1f} s)", flush=True)
        # what a run stopped before its end leaves (a lease's limit, a timeout)
        write_json(document() | {"partial": {"not_run": names[done + 1:]}}, partial)

    hop_figures = None
    if "W1" in names:   # W1's floor, measured beside it (benchmarks/hop.py)
        try:
            from . import hop
            hop_figures = hop.measure(n_hops=1000, reps=5 if args.quick else 20)
            print(f"hop: data as its own flag {hop_figures['word_us']:.3f} us, separate flag "
                  f"{hop_figures['flag_us']:.3f} us per hop", flush=True)
        except Exception as exc:
            traceback.print_exc()
            failures.append({"workload": "hop", "variant": "megak", "error": _error(exc)})

    doc = document()
    if hop_figures is not None:
        doc["hop"] = hop_figures
    if args.baseline:
        doc["baseline"] = load_baseline(Path(args.baseline))
    paths = write_outputs(doc, out_dir)
    partial.unlink(missing_ok=True)
    for kind, p in paths.items():
        print(f"wrote {p}")
    print(f"{len(results)} results, {len(failures)} failures, "
          f"{doc['elapsed_s']:.0f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
