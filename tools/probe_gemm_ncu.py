#!/usr/bin/env python3
"""Probe: one megak GEMM and cuBLAS's (torch.matmul) on the same operands, for ncu.

Compiles each shape, runs it once outside the profiled range (NVRTC, tensor maps, the call's
binding), checks the result against a float64 reference on sampled rows, then runs megak's
program once and torch.matmul once between cudaProfilerStart / Stop. Run it under ncu with
``--profile-from-start off`` so that only those two kernels per shape are profiled:

    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python tools/probe_gemm_ncu.py --mnk 512 4096 4096 --mnk 4096 4096 4096

Without ncu it prints each kernel's time (CUDA events, median of 20) beside cuBLAS's.
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout


def event_us(fn, n: int = 20) -> float:
    import torch
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mnk", type=int, nargs=3, action="append",
                    help="M N K of one GEMM (repeatable; default 512 4096 4096)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = ap.parse_args()
    import numpy as np
    import torch

    import megak
    tdt = getattr(torch, args.dtype)
    progs = []
    for m, n, k in args.mnk or [[512, 4096, 4096]]:
        g = megak.Graph()
        g.output(g.gemm(g.input("a", (m, k), args.dtype), g.input("b", (k, n), args.dtype)),
                 "y")
        prog = megak.compile(g, backend="cuda")
        a = torch.randn((m, k), device="cuda").to(tdt)
        b = torch.randn((k, n), device="cuda").to(tdt)
        y = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
        prog.run(a=a, b=b, out={"y": y})
        torch.cuda.synchronize()
        rows = np.random.default_rng(0).choice(m, size=min(m, 64), replace=False)
        ref = a[rows].double().cpu().numpy() @ b.double().cpu().numpy()
        got = y[rows].double().cpu().numpy()
        tol = 0.02 if args.dtype == "bfloat16" else 1e-3
        err = float(np.max(np.abs(got - ref) / (np.abs(ref) + np.sqrt(k))))
        status = "ok" if err <= tol else "MISMATCH"
        mk = event_us(lambda: prog.run(a=a, b=b, out={"y": y}))
        tc = event_us(lambda: torch.matmul(a, b, out=y))
        flop = 2.0 * m * n * k
        print(f"{m}x{n}x{k} {args.dtype}: megak {mk:.1f} us ({flop / mk / 1e6:.1f} TFLOP/s), "
              f"cuBLAS {tc:.1f} us ({flop / tc / 1e6:.1f}), ratio {tc / mk:.2f}; "
              f"sampled rows max scaled error {err:.2e}: {status}")
        if status != "ok":
            sys.exit(1)
        progs.append((prog, a, b, y))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for prog, a, b, y in progs:
        prog.run(a=a, b=b, out={"y": y})
        torch.matmul(a, b, out=y)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
