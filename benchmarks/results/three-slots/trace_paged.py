"""The script behind trace-8192.log and trace-fences.log (PYTHONPATH = the tree to trace):
per-instruction times of one traced n x n transpose. The tile-in mark (MK_T_COMPUTED) exists on
branch paged3 and after; elsewhere that column is the op's end.

    python trace_paged.py N OUT.npy
"""
import sys

import numpy as np

import megak
from megak import abi

P = abi.TRACE_PHASES
LABELS = ("fetch(q)-start(q-2)", "fetch(q)-start(q-1)", "acquired-fetch", "tile in - acquired",
          "tile in - start", "stored - tile in", "period", "start - stored(q-1)")


def main():
    n, out = int(sys.argv[1]), sys.argv[2]
    g = megak.Graph()
    x = g.input("x", (n, n), "float32")
    g.output(g.transpose(x), "y")
    with megak.compile(g, backend="cuda") as prog:
        xv = np.random.default_rng(0).uniform(-1, 1, (n, n)).astype(np.float32)
        assert np.array_equal(prog.run(x=xv)["y"], xv.T)
        for _ in range(2):   # the first traced run builds the traced kernel
            prog.run(x=xv, trace=True)
        ev = prog.last_trace.events
    np.save(out, ev)
    t = ev["t"].astype(np.int64)
    sm, qi = ev["sm"].astype(np.int64), ev["queue_index"].astype(np.int64)
    rows = []
    for s in np.unique(sm):
        mine = np.nonzero(sm == s)[0]
        mine = mine[np.argsort(qi[mine])]
        start, acq, fetch, tile_in, stored = (t[mine, P[k]] for k in (
            "MK_T_LOADED", "MK_T_ACQUIRED", "MK_T_FETCH", "MK_T_COMPUTED", "MK_T_STORED"))
        for i in range(2, len(mine) - 1):
            rows.append((fetch[i] - start[i - 2], fetch[i] - start[i - 1], acq[i] - fetch[i],
                         tile_in[i] - acq[i], tile_in[i] - start[i], stored[i] - tile_in[i],
                         start[i + 1] - start[i], start[i] - stored[i - 1]))
    r = np.array(rows, float) / 1e3
    for i, label in enumerate(LABELS):
        print(f"{label:<22} median {np.median(r[:, i]):7.3f}  "
              f"p10 {np.percentile(r[:, i], 10):7.3f}  p90 {np.percentile(r[:, i], 90):7.3f}")


if __name__ == "__main__":
    main()
