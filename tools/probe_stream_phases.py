#!/usr/bin/env python3
"""Probe: where a W2 chain's streamed instructions spend their time, from the trace build.

Runs the report's W2 chain (--dtype, bf16 by default; --hidden x --layers, batch --batch)
once traced
(``Program.run(trace=True)``: MK_TRACE's per-instruction boundaries, %globaltimer) after
three untraced runs, and prints the median of each trace segment over the GEMM instructions
(acquire, wait, load, compute = the k loop, store = reduce, combine, epilogue and signal),
the median layer (the op's first k-loop start to its last store) and the chain's span, with
the instruction count and rows per instruction; where the chain has split-K reduces (fp32
layers of parts), the same medians over the reduce instructions. It imports megak from PYTHONPATH (not this
checkout), so it times any tree that tools/ab_trees.py prepared:

    PYTHONPATH=ab/main python tools/probe_stream_phases.py --batch 64
    python tools/probe_stream_phases.py --dtype float32 --hidden 1024 --layers 16 --batch 16 \
        --save $OUT/f32-1024x16
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--label", default="")
    ap.add_argument("--save", metavar="PREFIX",
                    help="also write the traced run's events and the plan's instructions "
                         "(PREFIX-events.npy, PREFIX-instrs.npy) for a look per SM offline")
    args = ap.parse_args()
    import megak
    from benchmarks.workloads import w2
    from megak import abi
    from megak.trace import SEGMENTS

    rng = np.random.default_rng(0)
    work = w2(args.hidden, args.layers, args.batch, args.dtype)
    prog = megak.compile(work.build(), backend="cuda")
    inputs = work.make_inputs(rng)
    for _ in range(3):
        prog.run(**inputs)
    prog.run(**inputs, trace=True)
    ev = prog.last_trace.events
    t = ev["t"].astype(np.int64)
    gemm = ev["opcode"] == abi.OPCODE_OF["gemm"]
    seg = {name: float(np.median(t[gemm, b] - t[gemm, a])) / 1e3 for name, a, b in SEGMENTS}
    reduce = ev["opcode"] == abi.OPCODE_OF["reduce"]
    if reduce.any():
        seg.update({f"reduce {name}": float(np.median(t[reduce, b] - t[reduce, a])) / 1e3
                    for name, a, b in SEGMENTS})
    ph = abi.TRACE_PHASES
    ops = ev["op_index"]
    layers = [(t[ops == o, ph["MK_T_STORED"]].max() - t[ops == o, ph["MK_T_LOADED"]].min()) / 1e3
              for o in np.unique(ops)]
    span = (t[:, ph["MK_T_STORED"]].max() - t[:, ph["MK_T_FETCH"]].min()) / 1e3
    rows = prog.plan.instrs["rows"]
    print(f"{args.label or 'tree'} {args.hidden}x{args.layers} b{args.batch} {args.dtype}: "
          f"{len(prog.plan.instrs)} instructions of {int(rows.max())} rows, "
          f"pages {int(prog.plan.instrs['pages'].max())}, ring {prog.plan.stream_pages}; "
          + ", ".join(f"{k} {v:.2f}" for k, v in seg.items())
          + f"; layer {np.median(layers):.2f}, span {span:.1f} us", flush=True)
    if args.save:
        np.save(f"{args.save}-events.npy", ev)
        np.save(f"{args.save}-instrs.npy", prog.plan.instrs)
    prog.close()


if __name__ == "__main__":
    main()
