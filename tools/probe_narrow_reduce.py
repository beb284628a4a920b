#!/usr/bin/env python3
"""Probe: a narrow band's reduce through page 2 (mk_stream_reduce_narrow, MK_NARROW_REDUCE=1)
against the 64-column reduce (0), on one lease: the W2 bf16 chains' device time (CUDA events,
L2 flushed and hot, medians) and, from traced runs, each layer's tail (k loop done -> stored)
and layer time (last store to last store), medians over layers 1.. and runs; every variant's
last layer checked against the chain in float64 of its bf16 layers.

    python tools/probe_narrow_reduce.py [--cases 1024x16 4096x8] [--reps 60]"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import megak                                       # noqa: E402
from megak import abi                              # noqa: E402
from megak.runtime import compiler                 # noqa: E402
from megak.runtime.bench import Bench              # noqa: E402
from benchmarks import workloads as W              # noqa: E402

P = abi.TRACE_PHASES


def phases(prog, inputs, layers, runs):
    tail, layer = [], []
    for _ in range(runs):
        prog.run(**inputs, trace=True)
        ev = prog.last_trace.events
        t = ev["t"].astype(np.int64)
        op = ev["op_index"].astype(np.int64)
        last = np.array([t[op == i, P["MK_T_STORED"]].max() for i in range(layers)])
        for i in range(1, layers):
            mine = t[op == i]
            tail.append(np.median(mine[:, P["MK_T_STORED"]] - mine[:, P["MK_T_COMPUTED"]]))
            layer.append(last[i] - last[i - 1])
    return np.median(tail) / 1e3, np.median(layer) / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", default=["1024x16", "4096x8"])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--runs", type=int, default=10,
                    help="traced runs for the phases (0: none; the traced build compiles apart)")
    args = ap.parse_args()
    plain = compiler.device_source
    rng = np.random.default_rng(0)
    for case in args.cases:
        hidden, layers = map(int, case.split("x"))
        wl = W.w2(hidden, layers, 16, "bfloat16")
        g = wl.build()
        inputs = wl.make_inputs(rng)
        ref = wl.reference(inputs, rng)
        for variant in (1, 0):
            compiler.device_source = lambda v=variant: plain().replace(
                "#define MK_NARROW_REDUCE 1", f"#define MK_NARROW_REDUCE {v}")
            with megak.compile(g, backend="cuda") as prog:
                err = wl.check(ref, prog.run(**inputs), f"variant {variant}")
                b = Bench(prog)
                b.upload(**inputs)
                cold = float(np.median(b.time_megakernel(reps=args.reps)))
                hot = float(np.median(b.time_megakernel(reps=args.reps, flush_l2=False)))
                b.close()
                tail, layer = (phases(prog, inputs, layers, args.runs) if args.runs
                               else (float("nan"), float("nan")))
            print(f"{case} reduce {'narrow (page 2)' if variant else '64-column'}: device "
                  f"{cold:8.2f} us (L2 flushed) {hot:8.2f} (hot); traced tail {tail:.3f} us, "
                  f"layer {layer:.3f} us; check {err:.3f} of the bound", flush=True)


if __name__ == "__main__":
    main()
