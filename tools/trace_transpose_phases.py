#!/usr/bin/env python3
"""Where a transpose's time goes between two instructions of an SM, from one traced run.

A graph of one n x n fp32 transpose (default 8192) on every SM, checked exactly against x^T,
then run traced (MK_TRACE: %globaltimer marks, benchmarks/ANALYSIS.md has their meaning).
For each pair of consecutive instructions q, q + 1 of an SM, medians (p10, p90) over every
pair of the last traced run, in us:

  fetch(q+1)-start(q)    the loader has q + 1's record and descriptors, after q started
  fetch->acquired        ... to its pages taken (validation, allocator)
  fetch->waited          ... to its dependency waits passed (its late preload comes next)
  start(q+1)-stored(q)   the compute warps' idle time between two instructions
  op span                an instruction's start to its signal
  period                 one instruction's start to the next's

    python tools/trace_transpose_phases.py [n]      (on a GPU; any tree on PYTHONPATH)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout
import megak                                                     # noqa: E402
from megak import abi                                            # noqa: E402

P = abi.TRACE_PHASES
LABELS = ("fetch(q+1)-start(q)", "fetch->acquired", "fetch->waited", "start(q+1)-stored(q)",
          "op span", "period")


def pairs(ev) -> np.ndarray:
    """One row per consecutive pair of an SM's instructions, the LABELS' intervals in ns."""
    t = ev["t"].astype(np.int64)
    sm, qi = ev["sm"].astype(np.int64), ev["queue_index"].astype(np.int64)
    rows = []
    for s in np.unique(sm):
        mine = np.nonzero(sm == s)[0]
        mine = mine[np.argsort(qi[mine])]
        for a, b in zip(mine[:-1], mine[1:]):
            rows.append((t[b, P["MK_T_FETCH"]] - t[a, P["MK_T_LOADED"]],
                         t[b, P["MK_T_ACQUIRED"]] - t[b, P["MK_T_FETCH"]],
                         t[b, P["MK_T_WAITED"]] - t[b, P["MK_T_FETCH"]],
                         t[b, P["MK_T_LOADED"]] - t[a, P["MK_T_STORED"]],
                         t[a, P["MK_T_STORED"]] - t[a, P["MK_T_LOADED"]],
                         t[b, P["MK_T_LOADED"]] - t[a, P["MK_T_LOADED"]]))
    return np.array(rows, dtype=np.float64)


def main(argv=None) -> int:
    n = int((argv or sys.argv[1:] or ["8192"])[0])
    g = megak.Graph()
    x = g.input("x", (n, n), "float32")
    g.output(g.transpose(x), "y")
    with megak.compile(g, backend="cuda") as prog:
        xv = np.random.default_rng(0).uniform(-1, 1, (n, n)).astype(np.float32)
        if not np.array_equal(prog.run(x=xv)["y"], xv.T):
            print("trace_transpose_phases: the transpose is wrong")
            return 1
        for _ in range(2):     # the first traced run builds the traced kernel
            prog.run(x=xv, trace=True)
        ev = prog.last_trace.events
    r = pairs(ev) / 1e3
    for i, label in enumerate(LABELS):
        print(f"{label:<24} median {np.median(r[:, i]):7.3f} us  "
              f"p10 {np.percentile(r[:, i], 10):7.3f}  p90 {np.percentile(r[:, i], 90):7.3f}")
    print(f"instructions per SM {len(ev) / len(np.unique(ev['sm'])):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
