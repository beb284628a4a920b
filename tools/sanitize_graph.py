#!/usr/bin/env python3
"""One small mixed graph (gemm -> transpose -> copy) through the CUDA backend, checked
against float64. The workload `tools/sanitize.sh` runs under compute-sanitizer.

Sizes are deliberately odd (partial tiles, leading dimensions padded to
MK_TENSOR_ALIGN_BYTES) and small (the sanitizer slows the kernel down by 10-100x).
Exit status: 0 when every output is within its error bound, 1 on a mismatch, 2 when the run
itself failed.

    python tools/sanitize_graph.py [--m 130 --k 72 --n 66] [--runs 2] [--timeout 120]
"""
from __future__ import annotations

import argparse
import math
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megak  # noqa: E402

U32 = 2.0 ** -24  # fp32 unit roundoff


def build(m: int, k: int, n: int) -> megak.Graph:
    g = megak.Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    c = g.gemm(a, b)
    t = g.transpose(c)
    y = g.copy(t)
    g.output(y, "y")
    return g


def check(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    """y must be (a @ b).T within the fp32 dot-product bound 2 K u (|a| @ |b|) per element;
    transpose and copy are exact."""
    ref = (a.astype(np.float64) @ b.astype(np.float64)).T
    bound = 2 * a.shape[1] * U32 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).T
    if y.shape != ref.shape or y.dtype != np.float32:
        return False, f"y is {y.shape} {y.dtype}, expected {ref.shape} float32"
    if not np.isfinite(y).all():
        bad = int(np.count_nonzero(~np.isfinite(y)))
        return False, f"{bad} non-finite values in y (unwritten output?)"
    err = np.abs(y.astype(np.float64) - ref)
    excess = err - bound
    worst = int(np.argmax(excess))
    if excess.flat[worst] > 1e-30:
        return False, (f"max error {err.flat[worst]:.3e} exceeds bound {bound.flat[worst]:.3e} "
                       f"at {tuple(int(i) for i in np.unravel_index(worst, y.shape))}")
    return True, f"max error {err.max():.3e} (bound at worst {bound.flat[worst]:.3e})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=130)
    p.add_argument("--k", type=int, default=72)
    p.add_argument("--n", type=int, default=66)
    p.add_argument("--runs", type=int, default=2, help="replays (epoch-offset waits)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="device spin deadline in s (generous: the sanitizer is slow)")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    g = build(args.m, args.k, args.n)
    try:
        prog = megak.compile(g, backend="cuda", timeout_s=args.timeout, debug=True)
    except Exception:
        traceback.print_exc()
        print("sanitize_graph: FAILED to compile", flush=True)
        return 2
    ok = True
    try:
        ex = getattr(prog, "_executor", None)
        if ex is not None and hasattr(ex, "host_timeout_s"):
            ex.host_timeout_s = math.inf  # the sanitizer's pace is not a hang
        for run in range(args.runs):
            a = rng.uniform(-1, 1, (args.m, args.k)).astype(np.float32)
            b = rng.uniform(-1, 1, (args.k, args.n)).astype(np.float32)
            y = prog.run(a=a, b=b)["y"]
            good, msg = check(y, a, b)
            print(f"sanitize_graph: run {run}: {'ok' if good else 'MISMATCH'}: {msg}", flush=True)
            ok &= good
    except Exception:
        traceback.print_exc()
        print("sanitize_graph: FAILED while running", flush=True)
        return 2
    finally:
        close = getattr(prog, "close", None)
        if close is not None:
            try:
                close()  # free everything before exit: memcheck's leak check sees real leaks
            except Exception:
                traceback.print_exc()
                ok = False
    print(f"sanitize_graph: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
