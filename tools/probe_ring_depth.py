#!/usr/bin/env python3
"""Probe: how a streamed chain's time moves with the depth of the weight ring.

The ring is what a block's pages leave after its largest record (pages.ring_pages: 13 pages
less the streamed GEMM's 3 = 10 on the H200). Between two layers the ring holds the next
layer's first stages while the tail (reduce, epilogue, signal, dependency wait) runs; once it
is full HBM idles for that SM (benchmarks/ANALYSIS.md, "What sets a streamed layer's time").
Fewer pages per block (compile's n_pages) give a shallower ring with the same instructions,
so the slope per ring page says what a deeper one would be worth (a narrow band needing two
pages of its own instead of three would give it 11) before anything is built for it.

Per row and n_pages, alternated round by round on one GPU: the megak variant's median as
`python -m benchmarks.report` times it (Bench.time_megakernel, the L2 flushed where the
report flushes it), the outputs checked against the float64 reference after the timed runs.

    python tools/probe_ring_depth.py [--pages 11 12 13] [--rounds 2] [--rows ...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

ROWS = ("W2-4096x8-bf16", "W2-4096x8-bf16-b1", "W2-8192x8-bf16", "W2-4096x8-bf16-b64")


def time_row(name: str, n_pages: int, seed: int) -> tuple[int, float]:
    """(ring pages, median us) of row `name` compiled for n_pages pages per block."""
    import megak
    from benchmarks import workloads as W
    from megak.runtime.bench import L2_FLUSH_BYTES, Bench
    rng = np.random.default_rng(seed)
    w = W.get(name)
    n, warmup = w.reps["megak"]
    inputs = w.make_inputs(rng)
    ref = w.reference(inputs, rng)
    with megak.compile(w.build(), backend="cuda", n_pages=n_pages) as prog:
        ring = int(prog.plan.stream_pages)
        bench = Bench(prog)
        w.check(ref, prog.run(**inputs), "prog.run")
        bench.upload(**inputs)
        bench.poison()
        t = bench.time_megakernel(reps=n, warmup=warmup,
                                  flush_l2=w.working_set_bytes <= L2_FLUSH_BYTES)
        w.check(ref, bench.outputs(), "the timed runs' outputs")
        del bench
    return ring, float(np.median(t))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, nargs="*", default=[11, 12, 13])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", nargs="*", default=list(ROWS))
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    got: dict[tuple[str, int], list[float]] = {}
    rings: dict[int, int] = {}
    for k in range(args.rounds):
        for name in args.rows:
            for p in args.pages:
                ring, us = time_row(name, p, args.seed)
                rings[p] = ring
                got.setdefault((name, p), []).append(us)
                print(f"round {k + 1}: {name} n_pages {p} ring {ring}: {us:.1f} us", flush=True)
    head = ["row"] + [f"ring {rings[p]} (n_pages {p})" for p in args.pages]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in args.rows:
        cells = [" / ".join(f"{v:.1f}" for v in got[(name, p)]) for p in args.pages]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name in args.rows:
        means = [statistics.fmean(got[(name, p)]) for p in args.pages]
        if len(means) > 1:
            slope = (means[-1] - means[0]) / max(rings[args.pages[-1]] - rings[args.pages[0]], 1)
            print(f"{name}: {slope:+.2f} us per ring page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
