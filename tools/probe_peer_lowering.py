#!/usr/bin/env python3
"""Probe: which lowering the separate launches (separate, graph, graph_pdl) run best, per W2 row.

The report times the separate launches on the megakernel's own lowering except where
benchmarks.report.peer_lowering says otherwise (streamed chains: weight_stream=False). This times
graph_pdl (and graph) of each row on both lowerings, outputs checked against float64 after the
timed runs, so the choice rests on a measurement:

    python tools/probe_peer_lowering.py W2-4096x8-bf16 W2-1024x16-bf16
"""
import argparse

import numpy as np


def main() -> None:
    import megak
    from benchmarks import workloads as W
    from benchmarks.report import L2_FLUSH_BYTES, time_bench_variant
    from megak.runtime.bench import Bench
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    rng = np.random.default_rng(5)
    for name in a.rows:
        w = W.get(name)
        inputs = w.make_inputs(rng)
        ref = w.reference(inputs, rng)
        flush = w.working_set_bytes <= L2_FLUSH_BYTES
        for stream in (True, False):
            with megak.compile(w.build(), backend="cuda", weight_stream=stream) as prog:
                b = Bench(prog)
                try:
                    b.upload(**inputs)
                    for v in ("graph", "graph_pdl"):
                        b.poison()
                        t = time_bench_variant(b, v, a.reps, 5, flush)
                        err = w.check(ref, b.outputs(), f"{name}/{v}")
                        print(f"{name} weight_stream={stream} {v}: median {np.median(t):.1f} us "
                              f"(p10 {np.percentile(t, 10):.1f}, p90 {np.percentile(t, 90):.1f}; "
                              f"err/bound {err:.2g})", flush=True)
                finally:
                    b.close()


if __name__ == "__main__":
    main()
