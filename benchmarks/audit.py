"""Memory audit of the device ops with Nsight Compute: coalescing, bank conflicts, registers,
spills, occupancy and DRAM bandwidth of each op's own kernel.

    python -m benchmarks.audit [--out benchmarks/results/audit-<date>.json] [--timeout 300]

For each case of benchmarks/audit_target.py (copy 8192^2, transpose 8192^2, GEMM 2048^3), one
ncu invocation profiles the single `separate` launch of that op (entry point megak_op)::

    ncu --clock-control none --target-processes all --kernel-name megak_op --csv
        --print-units base --metrics <METRICS> python -m benchmarks.audit_target <case>

A metric this ncu does not know ("Failed to find metric") is dropped and the run repeated, so
one renamed counter costs a column, not the audit. Writes the JSON and a markdown table next to
it (``.md``); ``python -m benchmarks.report`` embeds the newest audit in RESULTS.md.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
CASES = ("copy", "transpose", "gemm")
KERNEL = "megak_op"

LD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
LD_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
ST_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
ST_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
# cp.async (LDGSTS) global->shared loads are not "op_ld": ncu counts them apart. Newer ncu
# splits them by L1 policy (cache_access / cache_bypass); whichever names exist are used.
LDGSTS_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"
LDGSTS_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum"
LDGSTS_SPLIT = [(f"l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_{p}.sum",
                 f"l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts_cache_{p}.sum")
                for p in ("access", "bypass")]
SMEM_LD_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
SMEM_ST_CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
SMEM_LD_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
SMEM_ST_WAVEFRONTS = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"
REGISTERS = "launch__registers_per_thread"
LOCAL_LD = "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"
LOCAL_ST = "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
DRAM_BW = "dram__bytes.sum.per_second"
DURATION = "gpu__time_duration.sum"

METRICS = [LD_SECTORS, LD_REQUESTS, ST_SECTORS, ST_REQUESTS, LDGSTS_SECTORS, LDGSTS_REQUESTS,
           *[m for pair in LDGSTS_SPLIT for m in pair],
           SMEM_LD_CONFLICTS, SMEM_ST_CONFLICTS, SMEM_LD_WAVEFRONTS, SMEM_ST_WAVEFRONTS,
           REGISTERS, LOCAL_LD, LOCAL_ST, OCCUPANCY, DRAM_BW, DURATION]

_SI = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME_S = {"second": 1.0, "s": 1.0, "msecond": 1e-3, "ms": 1e-3, "usecond": 1e-6, "us": 1e-6,
           "nsecond": 1e-9, "ns": 1e-9}


class AuditError(RuntimeError):
    pass


# ---- parsing (pure) ----------------------------------------------------------------------------

def parse_number(text: str) -> float | None:
    """ncu's printed value -> float; thousands separators dropped; "n/a" / "" -> None."""
    t = (text or "").strip().replace(",", "")
    if t in ("", "n/a", "N/A", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def to_base(value: float | None, unit: str) -> float | None:
    """A value in ncu's (possibly auto-scaled) unit -> the base unit: Gbyte/second -> byte/s,
    Ksector -> sectors, msecond -> seconds. Units without a prefix pass through."""
    if value is None:
        return None
    u = (unit or "").strip()
    scale = 1.0
    m = re.fullmatch(r"([KMGTP])(i?)([A-Za-z].*)", u)
    if m:
        prefix, binary, u = m.groups()
        power = "KMGTP".index(prefix) + 1
        scale = 1024.0 ** power if binary else _SI[prefix]
    if "/" in u:
        num, den = u.split("/", 1)
        if den in _TIME_S:
            scale /= _TIME_S[den]
        u = num
    if u in _TIME_S:
        scale *= _TIME_S[u]
    return value * scale


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernels from ncu ``--csv`` output, in ID order: [{"id", "kernel", "metrics": {name:
    (value in base units, unit as printed)}}]. Accepts the default long format (one row per
    metric: "Metric Name", "Metric Unit", "Metric Value") and the wide ``--page raw`` format
    (one row per kernel, a units row under the header); skips "==PROF==" and program lines."""
    rows = [line for line in text.splitlines() if line.lstrip().startswith('"')]
    kernels: dict[str, dict] = {}
    header: list[str] | None = None
    units: dict[str, str] | None = None
    wide = False
    for rec in csv.reader(rows):
        if rec and rec[0] == "ID":
            header, wide, units = rec, "Metric Name" not in rec, None
            continue
        if header is None or len(rec) != len(header):
            continue
        d = dict(zip(header, rec))
        if not wide:
            k = kernels.setdefault(d["ID"], {"id": d["ID"], "kernel": d.get("Kernel Name", ""),
                                             "metrics": {}})
            unit = d.get("Metric Unit", "")
            k["metrics"][d["Metric Name"]] = (to_base(parse_number(d["Metric Value"]), unit),
                                              unit)
            continue
        if units is None and not d["ID"].strip():
            units = d           # the row under a raw-page header carries the units
            continue
        k = kernels.setdefault(d["ID"], {"id": d["ID"], "kernel": d.get("Kernel Name", ""),
                                         "metrics": {}})
        for col, val in d.items():
            if "__" in col:   # metric columns; the others are launch descriptors
                unit = (units or {}).get(col, "")
                k["metrics"][col] = (to_base(parse_number(val), unit), unit)

    def order(key):
        try:
            return (0, int(key))
        except ValueError:
            return (1, key)
    return [kernels[k] for k in sorted(kernels, key=order)]


def unknown_metric(output: str) -> str | None:
    """The base name ncu names in 'Failed to find metric ...', if any."""
    m = re.search(r"Failed to find metric\s+(?:regex:)?\^?([A-Za-z0-9_]+)", output)
    return m.group(1) if m else None


def drop_metric(metrics: list[str], base: str) -> list[str]:
    # exact base only: "..._op_ldgsts" unknown must not take "..._op_ldgsts_cache_access" along
    return [m for m in metrics if m != base and not m.startswith(base + ".")] if base else metrics


def derive(metrics: dict[str, tuple]) -> dict:
    """The audit's figures from one kernel's metrics (values in base units)."""
    v = {k: val for k, (val, _) in metrics.items() if val is not None}

    def ratio(num, den):
        if num in v and den in v:
            return v[num] / v[den] if v[den] else None
        return None

    if LDGSTS_SECTORS in v:
        ldgsts = ratio(LDGSTS_SECTORS, LDGSTS_REQUESTS)
        ldgsts_req = v.get(LDGSTS_REQUESTS)
    else:
        secs = [v[s] for s, _ in LDGSTS_SPLIT if s in v]
        reqs = [v[r] for _, r in LDGSTS_SPLIT if r in v]
        ldgsts_req = sum(reqs) if reqs else None
        ldgsts = sum(secs) / ldgsts_req if secs and ldgsts_req else None
    local = [v[k] for k in (LOCAL_LD, LOCAL_ST) if k in v]
    return {
        "ld_requests": v.get(LD_REQUESTS),
        "ld_sectors_per_request": ratio(LD_SECTORS, LD_REQUESTS),
        "st_requests": v.get(ST_REQUESTS),
        "st_sectors_per_request": ratio(ST_SECTORS, ST_REQUESTS),
        "ldgsts_requests": ldgsts_req,
        "ldgsts_sectors_per_request": ldgsts,
        "smem_ld_bank_conflicts": v.get(SMEM_LD_CONFLICTS),
        "smem_st_bank_conflicts": v.get(SMEM_ST_CONFLICTS),
        "smem_ld_wavefronts": v.get(SMEM_LD_WAVEFRONTS),
        "smem_st_wavefronts": v.get(SMEM_ST_WAVEFRONTS),
        "registers_per_thread": v.get(REGISTERS),
        "local_bytes": sum(local) if local else None,
        "occupancy_pct": v.get(OCCUPANCY),
        "dram_gbps": v[DRAM_BW] / 1e9 if DRAM_BW in v else None,
        "duration_us": v[DURATION] * 1e6 if DURATION in v else None,
    }


# ---- markdown (pure) ---------------------------------------------------------------------------

def _f(x, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _count(x) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def render_markdown(doc: dict) -> str:
    m = doc.get("machine", {})
    lines = [
        f"Nsight Compute {doc.get('ncu', '?')} on {m.get('gpu', '?')} ({doc.get('date', '?')}), "
        f"`{doc.get('command', 'python -m benchmarks.audit')}`: each op's own kernel (entry "
        f"`{KERNEL}`, the `separate` variant), one launch, clocks not locked.",
        "",
        "How to read *sectors/request*: one warp-wide global request of 4-byte words touches 4 "
        "sectors of 32 B when perfectly coalesced (32 lanes x 4 B = 128 B); 8 for 8-byte "
        "accesses; for 16-byte vector accesses (float4) the ideal is **16**, since one warp "
        "request moves 512 B. Above the ideal = sectors fetched and not used (uncoalesced or "
        "misaligned). cp.async (LDGSTS) global->shared loads are counted apart from ordinary "
        "loads. Bank conflicts: extra shared-memory wavefronts (0 is ideal). Local memory "
        "bytes are spills seen by the hardware; ptxas spills are the compiler's figures for "
        "the cubin that ran.",
        "",
        "| op | grid | ld sectors/req (reqs) | st sectors/req (reqs) | cp.async sectors/req "
        "(reqs) | smem bank conflicts ld / st | regs/thread | local mem bytes | ptxas spills "
        "megak_op / megakernel | occupancy | DRAM GB/s | kernel time | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for op in doc.get("ops", []):
        d = op.get("derived", {})
        px = op.get("ptxas", {})

        def spill(entry):
            p = px.get(entry) or {}
            if p.get("registers") is None and not (p.get("spill_stores") or
                                                   p.get("spill_loads")):
                return "n/a"
            return f"{int(p.get('spill_stores', 0)) + int(p.get('spill_loads', 0))} B"

        def spr(key, reqs):
            return (f"{_f(d.get(key), 2)} ({_count(d.get(reqs))})"
                    if d.get(reqs) else "none")

        lines.append(
            f"| {op.get('op', op.get('case'))} | {_count(op.get('grid'))} | "
            f"{spr('ld_sectors_per_request', 'ld_requests')} | "
            f"{spr('st_sectors_per_request', 'st_requests')} | "
            f"{spr('ldgsts_sectors_per_request', 'ldgsts_requests')} | "
            f"{_count(d.get('smem_ld_bank_conflicts'))} / "
            f"{_count(d.get('smem_st_bank_conflicts'))} | "
            f"{_count(d.get('registers_per_thread'))} | {_count(d.get('local_bytes'))} | "
            f"{spill('megak_op')} / {spill('megakernel')} | {_f(d.get('occupancy_pct'))}% | "
            f"{_f(d.get('dram_gbps'), 0)} | {_f(d.get('duration_us'))} us | "
            f"{op.get('check', '')} |")
    for f in doc.get("failures", []):
        lines.append(f"\n**FAILED** {f['case']}: {f['error']}")
    if doc.get("metrics_dropped"):
        lines.append(f"\nMetrics this ncu does not know (dropped): "
                     f"{', '.join(doc['metrics_dropped'])}")
    return "\n".join(lines) + "\n"


# ---- running ncu -------------------------------------------------------------------------------

def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if os.access(cand, os.X_OK):
            return cand
    return None


def ncu_version(ncu: str) -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "?"
    m = re.search(r"Version\s+(\S+)", out.stdout)
    return m.group(1) if m else (out.stdout.strip().splitlines() or ["?"])[-1]


def ncu_command(ncu: str, metrics: list[str], case: str, timeout_s: int) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", "--kernel-name", KERNEL,
           "--csv", "--print-units", "base", "--metrics", ",".join(metrics),
           sys.executable, "-m", "benchmarks.audit_target", case]
    timeout_bin = shutil.which("timeout")
    # coreutils timeout signals ncu, which takes its target down with it; the subprocess
    # timeout in run_case is only the backstop
    return ([timeout_bin, "--kill-after=15", str(timeout_s)] + cmd) if timeout_bin else cmd


def run_case(ncu: str, case: str, metrics: list[str], timeout_s: int,
             dropped: list[str]) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_DIR), env.get("PYTHONPATH")) if p)
    env.setdefault("CUDA_PYTHON_DISABLE_VERSION_CHECK", "1")
    for _ in range(len(METRICS)):
        cmd = ncu_command(ncu, metrics, case, timeout_s)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_DIR, env=env,
                                  timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:
            raise AuditError(f"ncu did not finish within {timeout_s + 60} s") from None
        out = proc.stdout + "\n" + proc.stderr
        if proc.returncode == 124:
            raise AuditError(f"ncu timed out after {timeout_s} s: {tail(out)}")
        bad = unknown_metric(out)
        if bad:
            kept = drop_metric(metrics, bad)
            if len(kept) == len(metrics):
                raise AuditError(f"ncu rejects metric {bad!r}, which was not requested: "
                                 f"{tail(out)}")
            dropped += [m for m in metrics if m not in kept]
            metrics[:] = kept
            continue
        if "ERR_NVGPUCTRPERM" in out:
            raise AuditError("ncu may not read the GPU performance counters "
                             "(ERR_NVGPUCTRPERM): run as root, or load the driver with "
                             "NVreg_RestrictProfilingToAdminUsers=0")
        if proc.returncode != 0:
            raise AuditError(f"ncu exited with status {proc.returncode}: {tail(out)}")
        info = None
        for line in proc.stdout.splitlines():
            if line.startswith("AUDIT_TARGET "):
                info = json.loads(line[len("AUDIT_TARGET "):])
        if info is None:
            raise AuditError(f"the audited program printed no AUDIT_TARGET line: {tail(out)}")
        kernels = [k for k in parse_ncu_csv(proc.stdout) if KERNEL in k["kernel"]]
        if not kernels:
            raise AuditError(f"ncu profiled no {KERNEL} kernel: {tail(out)}")
        k = kernels[-1]
        return {"case": case, "op": f"{case} ({info['workload']})", "grid": info["grid"],
                "pages": info["pages"], "kernel_launches_profiled": len(kernels),
                "check": info["check"], "ptxas": info["ptxas"], "target": info,
                "raw": {name: list(vu) for name, vu in k["metrics"].items()},
                "derived": derive(k["metrics"])}
    raise AuditError("ncu kept rejecting metrics")


def tail(text: str, n: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def main(argv: list[str] | None = None) -> int:
    date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    p = argparse.ArgumentParser(prog="python -m benchmarks.audit",
                                description="Nsight Compute memory audit of megak's device ops")
    p.add_argument("--out", default=str(BENCH_DIR / "results" / f"audit-{date}.json"),
                   help="JSON to write (a .md table goes next to it)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per ncu run")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = p.parse_args(argv)

    ncu = find_ncu()
    if ncu is None:
        print("benchmarks.audit needs Nsight Compute: no `ncu` on PATH or in /usr/local/cuda/bin",
              file=sys.stderr)
        return 2
    os.environ.setdefault("CUDA_PYTHON_DISABLE_VERSION_CHECK", "1")
    from megak.runtime.driver import gpu_unusable_reason, gpu_usable
    if not gpu_usable():
        print(f"benchmarks.audit needs a GPU: {gpu_unusable_reason()}", file=sys.stderr)
        return 2

    metrics = list(METRICS)
    dropped: list[str] = []
    ops, failures = [], []
    for case in args.cases:
        print(f"audit: {case} ...", flush=True)
        try:
            ops.append(run_case(ncu, case, metrics, args.timeout, dropped))
            d = ops[-1]["derived"]
            print(f"  ld {d['ld_sectors_per_request']} st {d['st_sectors_per_request']} "
                  f"sectors/req, {d['registers_per_thread']} regs, "
                  f"DRAM {d['dram_gbps']} GB/s", flush=True)
        except AuditError as exc:
            failures.append({"case": case, "error": str(exc)})
            print(f"  FAILED: {exc}", file=sys.stderr, flush=True)
    target = ops[0]["target"] if ops else {}
    doc = {
        "machine": {"gpu": target.get("device", "?"), "sm_count": target.get("sm_count"),
                    "arch": target.get("arch"), "cuda_driver_api": target.get("driver_api")},
        "date": date,
        "ncu": ncu_version(ncu),
        "command": "python -m benchmarks.audit" + (" " + " ".join(argv) if argv else ""),
        "metrics_requested": METRICS,
        "metrics_dropped": dropped,
        "ops": ops,
        "failures": failures,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    md = out.with_suffix(".md")
    md.write_text(render_markdown(doc))
    print(f"wrote {out} and {md}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
