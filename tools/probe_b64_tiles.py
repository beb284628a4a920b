#!/usr/bin/env python3
"""Probe: the batch-64 chain (W2-4096x8-bf16-b64) on the weight stream against the tiled
lowering of the same GEMMs (wgmma tiles split over K, then the reduces).

Why: at batch 64 the stream runs two row bands of 32 rows per 64-column band, each streaming
the band's B (512 KiB) and its 32 rows of A (256 KiB) into its SM every layer: ~768 KiB per
SM and layer, where batch 16's narrow bands take 384. A 128-row wgmma tile split over K
takes each B byte once and its A rows once per split (TMA zero-fills the rows past 64), at
the cost of a reduce per layer. Which one wins is the question; the lowering's rule is
replaced for the probe only (gemm.stream_split returning None: not streamed).

Prints per lowering: the chain's median (CUDA events; the report flushes L2 only for working
sets up to 256 MiB, and this chain's 268 MB are not flushed there either), the instructions
per layer by opcode, and the result's max |err| / bound against float64 layer by layer (the
report's W2 workload and check).

    python tools/probe_b64_tiles.py [--reps 50] [--batch 64]
"""
import argparse
from collections import Counter

import numpy as np

import megak
from benchmarks.workloads import w2
from megak import abi
from megak.ops import gemm
from megak.runtime.bench import Bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    work = w2(args.hidden, args.layers, args.batch, "bfloat16")   # the report's W2 chain
    g = work.build()
    inputs = work.make_inputs(rng)
    ref = work.reference(inputs, rng)
    rule = gemm.stream_split
    for name, split in (("stream (the rule)", rule), ("tiled (wgmma, split K)",
                                                       lambda *a, **k: None)):
        gemm.stream_split = split
        try:
            prog = megak.compile(g, backend="cuda")
        finally:
            gemm.stream_split = rule
        ops = Counter(abi.OPCODE_NAMES[int(op)] for op in prog.plan.instrs["opcode"])
        per_layer = {k: v / args.layers for k, v in sorted(ops.items())}
        ratio = work.check(ref, prog.run(**inputs), name)   # raises past a layer's bound
        b = Bench(prog)
        b.upload(**inputs)
        t = float(np.median(b.time_megakernel(reps=args.reps)))
        b.close()
        print(f"{args.hidden}x{args.layers} batch {args.batch}, {name}: {t:7.1f} us "
              f"({work.weight_bytes / t / 1e6:4.2f} TB/s of weights); instructions per layer "
              f"{per_layer}; max |err|/bound {ratio:.3f}", flush=True)
        prog.close()


if __name__ == "__main__":
    main()
