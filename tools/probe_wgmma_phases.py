#!/usr/bin/env python3
"""Probe: where a wgmma GEMM tile's time goes inside the megakernel (a traced run).

For one bf16 GEMM (M x N x K) compiled by megak, runs it untimed once, then traced
(MK_TRACE: %globaltimer per instruction phase) and prints the medians over its tile
instructions of:
  fetch -> loaded      the op's start to its first stage landed (barriers, first copies)
  loaded -> computed   the k loop, and per k-block of 64
  computed -> stored   staging + epilogue + signals
  stored -> next fetch the interpreter's hand-over to the next tile on the same SM
and the untraced run's time (CUDA events around prog.run on torch tensors, median of 10).
The untraced run of a plain GEMM takes the MK_WGMMA_ONLY kernel (pipelined MMAs); a traced
run always takes the general one (its trace marks would serialise the MMAs), so the phases
are those of the serialised body: use them for the shape of a tile, ncu for the variant.

    python tools/probe_wgmma_phases.py [--mnk 8192 8192 8192]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

import numpy as np  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mnk", type=int, nargs=3, default=[8192, 8192, 8192])
    args = ap.parse_args()
    import torch

    import megak
    from megak import abi
    m, n, k = args.mnk
    g = megak.Graph()
    g.output(g.gemm(g.input("a", (m, k), "bfloat16"), g.input("b", (k, n), "bfloat16")), "y")
    prog = megak.compile(g, backend="cuda")
    a = torch.randn((m, k), device="cuda").to(torch.bfloat16)
    b = torch.randn((k, n), device="cuda").to(torch.bfloat16)
    y = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    prog.run(a=a, b=b, out={"y": y})
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        prog.run(a=a, b=b, out={"y": y})
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    t = statistics.median(ts)
    err = (y.float() - a.float() @ b.float()).abs().max().item()
    print(f"{m}x{n}x{k} bf16: {t:.1f} us = {2.0 * m * n * k / t / 1e6:.1f} TFLOP/s "
          f"(max |y - fp32 ref| {err:.3g})")
    prog.run(a=a, b=b, out={"y": y}, trace=True)
    ev = prog.last_trace.events
    gemm = ev[ev["opcode"] == abi.OPCODE_OF["gemm"]]
    tt = gemm["t"].astype(np.float64)
    F, L, C, S = (abi.TRACE_PHASES[x] for x in ("MK_T_FETCH", "MK_T_LOADED", "MK_T_COMPUTED",
                                                 "MK_T_STORED"))
    nk = -(-k // 64)
    med = lambda x: float(np.median(x))   # noqa: E731
    print(f"tiles {len(gemm)}, traced span {(tt[:, S].max() - tt[:, F].min()) / 1e3:.1f} us")
    print(f"  fetch -> loaded     {med(tt[:, L] - tt[:, F]):9.0f} ns")
    print(f"  loaded -> computed  {med(tt[:, C] - tt[:, L]):9.0f} ns "
          f"({med(tt[:, C] - tt[:, L]) / nk:.0f} ns per k-block of 64)")
    print(f"  computed -> stored  {med(tt[:, S] - tt[:, C]):9.0f} ns")
    gaps = []
    for sm in np.unique(gemm["sm"]):
        e = tt[gemm["sm"] == sm]
        e = e[np.argsort(e[:, F])]
        gaps += list(e[1:, F] - e[:-1, S])
    if gaps:
        print(f"  stored -> next fetch {med(gaps):8.0f} ns (same SM)")


if __name__ == "__main__":
    main()
