#!/usr/bin/env python3
"""Probe: the batch-64 chain (W2-4096x8-bf16-b64) on the weight stream against the tiled
lowering of the same GEMMs (wgmma tiles split over K, then the reduces).

Why: at batch 64 the stream runs two row bands of 32 rows per 64-column band, each streaming
the band's B (512 KiB) and its 32 rows of A (256 KiB) into its SM every layer: ~768 KiB per
SM and layer, where batch 16's narrow bands take 384. A 128-row wgmma tile split over K
takes each B byte once and its A rows once per split (TMA zero-fills the rows past 64), at
the cost of a reduce per layer. Which one wins is the question; the lowering's rule is
replaced for the probe only (gemm.stream_split returning None: not streamed).

Prints per lowering: the chain's median (CUDA events, L2 flushed as the report flushes:
this chain's 268 MB are not), the instructions per layer by opcode, and the result's
max |err| / bound against float64 layer by layer.

    python tools/probe_b64_tiles.py [--reps 50] [--batch 64]
"""
import argparse
from collections import Counter

import numpy as np

import megak
from megak import abi
from megak.dtypes import numpy_dtype
from megak.ops import gemm
from megak.runtime.bench import Bench

def chain(hidden: int, layers: int, batch: int) -> megak.Graph:
    g = megak.Graph()
    x = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        x = g.gemm(x, g.input(f"w{i}", (hidden, hidden), "bfloat16"))
        g.output(x, f"h{i}")
    return g


def inputs_for(hidden: int, layers: int, batch: int, rng) -> dict:
    bf16 = numpy_dtype("bfloat16")
    scale = np.float32(np.sqrt(3.0 / hidden))
    out = {"x": rng.uniform(-1, 1, (batch, hidden)).astype(np.float32).astype(bf16)}
    for i in range(layers):
        out[f"w{i}"] = (rng.uniform(-1, 1, (hidden, hidden)).astype(np.float32)
                        * scale).astype(bf16)
    return out


def worst_ratio(g, inputs: dict, got: dict) -> float:
    """max |err| / bound over every layer, each against float64 on its computed input."""
    from tests.reference import evaluate
    worst = 0.0
    ref = evaluate(g, inputs)
    for name, out in g.outputs.items():
        value, bound = ref[out.index]
        err = np.abs(np.asarray(got[name], dtype=np.float64) - value)
        worst = max(worst, float((err / np.maximum(bound, 1e-30)).max()))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    g = chain(args.hidden, args.layers, args.batch)
    inputs = inputs_for(args.hidden, args.layers, args.batch, rng)
    wbytes = args.layers * args.hidden * args.hidden * 2
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
        got = prog.run(**inputs)
        ratio = worst_ratio(g, inputs, got)
        b = Bench(prog)
        b.upload(**inputs)
        t = float(np.median(b.time_megakernel(reps=args.reps)))
        b.close()
        print(f"{args.hidden}x{args.layers} batch {args.batch}, {name}: {t:7.1f} us "
              f"({wbytes / t / 1e6:4.2f} TB/s of weights); instructions per layer "
              f"{per_layer}; max |err|/bound {ratio:.3f}", flush=True)
        prog.close()


if __name__ == "__main__":
    main()
