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
    python tools/probe_stream_phases.py --per-op benchmarks/results/f32-phases/float32-1024x16

--per-op PREFIX reads a saved run (no GPU) and prints, per graph op, its instructions' first and
last phase times and segment medians, then the layer period (the step between the GEMM ops'
last stores) and each kind's segments past the first two ops.
"""
import argparse

import numpy as np


def save(prefix: str, prog) -> None:
    """The last traced run's events and the plan's instructions of `prog` (--save)."""
    np.save(f"{prefix}-events.npy", prog.last_trace.events)
    np.save(f"{prefix}-instrs.npy", prog.plan.instrs)


def per_op(prefix: str) -> None:
    """The saved run at `prefix` (--save), op by op; times in us from its first fetch."""
    from megak import abi
    from megak.trace import SEGMENTS as segs
    ev = np.load(f"{prefix}-events.npy")
    t = ev["t"].astype(np.int64)
    t -= t[:, 0].min()
    ph = abi.TRACE_PHASES
    waited, loaded, stored = ph["MK_T_WAITED"], ph["MK_T_LOADED"], ph["MK_T_STORED"]
    name = {v: k for k, v in abi.OPCODE_OF.items()}
    print(f"{prefix}: {len(ev)} instructions on {len(np.unique(ev['sm']))} SMs, "
          f"span {t[:, stored].max() / 1e3:.1f} us")
    print("op kind     n  first wait end  first loaded  last stored | medians: "
          + " ".join(n for n, _, _ in segs))
    ops = np.unique(ev["op_index"])
    for o in ops:
        m = ev["op_index"] == o
        tt = t[m] / 1e3
        print(f"{o:3d} {name[int(ev['opcode'][m][0])]:7s} {m.sum():4d} {tt[:, waited].min():14.1f} "
              f"{tt[:, loaded].min():13.1f} {tt[:, stored].max():12.1f} | "
              + " ".join(f"{np.median(tt[:, b] - tt[:, a]):.2f}" for _, a, b in segs))
    gemm = [o for o in ops if ev["opcode"][ev["op_index"] == o][0] == abi.OPCODE_OF["gemm"]]
    last = [t[ev["op_index"] == o, stored].max() / 1e3 for o in gemm]
    print(f"layer period: {np.median(np.diff(last)):.2f} us (median step of the GEMM ops' "
          "last stores)")
    late = ev["op_index"] >= ops[min(2, len(ops) - 1)]
    for code in np.unique(ev["opcode"]):
        m = late & (ev["opcode"] == code)
        print(f"  {name[int(code)]} past the first two ops: " + ", ".join(
            f"{n} {np.median(t[m, b] - t[m, a]) / 1e3:.2f} (p90 "
            f"{np.percentile(t[m, b] - t[m, a], 90) / 1e3:.2f})" for n, a, b in segs[2:]))


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
    ap.add_argument("--per-op", metavar="PREFIX", help="print a saved run op by op (no GPU)")
    args = ap.parse_args()
    if args.per_op:
        per_op(args.per_op)
        return
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
        save(args.save, prog)
    prog.close()


if __name__ == "__main__":
    main()
