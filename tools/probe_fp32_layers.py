#!/usr/bin/env python3
"""Where an fp32 W2 chain's layer goes: one traced run (the MK_TRACE=1 build) of each chain,
each op's instructions split into the trace's segments (tools: megak.trace.SEGMENTS), medians
over its instructions, and each op's span (its first instruction's fetch to its last store),
so a layer reads as its GEMM parts, then its reduce.

    python tools/probe_fp32_layers.py [--cases W2-1024x16-fp32 W2-4096x8-fp32] [--runs 3]

Needs a GPU. Prints one table per case (us, medians over the runs' instructions)."""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

import megak  # noqa: E402
from benchmarks import workloads as W  # noqa: E402
from megak.trace import ORDER, SEGMENTS  # noqa: E402


def layer_table(prog, inputs, runs: int) -> list[str]:
    per_op: dict[int, dict[str, list[float]]] = {}
    for _ in range(runs):
        prog.run(**inputs, trace=True)
        tr = prog.last_trace
        ev = tr.events
        t = ev["t"].astype(np.float64) / 1e3   # us
        for op in np.unique(ev["op_index"]):
            m = ev["op_index"] == op
            row = per_op.setdefault(int(op), {"n": [], "span": [],
                                              **{name: [] for name, _, _ in SEGMENTS}})
            row["n"].append(int(m.sum()))
            row["span"].append(float(t[m, ORDER[-1]].max() - t[m, ORDER[0]].min()))
            for name, a, b in SEGMENTS:
                row[name].append(float(np.median(t[m, b] - t[m, a])))
        labels = tr.op_labels
    head = ["op", "instrs"] + [name for name, _, _ in SEGMENTS] + ["op span"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op, row in sorted(per_op.items()):
        cells = [labels[op], str(int(np.median(row["n"])))]
        cells += [f"{np.median(row[name]):.2f}" for name, _, _ in SEGMENTS]
        cells.append(f"{np.median(row['span']):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="+", default=["W2-1024x16-fp32", "W2-4096x8-fp32"])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(3)
    for name in args.cases:
        w = W.get(name)
        inputs = w.make_inputs(rng)
        with megak.compile(w.build(), backend="cuda") as prog:
            prog.run(**inputs)   # warm: module loaded, tables uploaded
            print(f"== {name}: {prog.stats}", flush=True)
            print("\n".join(layer_table(prog, inputs, args.runs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
