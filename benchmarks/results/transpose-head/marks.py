#!/usr/bin/env python3
"""The loader's path per paged transpose record, from a trace saved by
`tools/trace_transpose_phases.py N --tile-in --save OUT.npy` on a tree with diag-head.patch or
diag-tmap2.patch (never for main), whose marks mean: FETCH record q in (end of L2), ACQUIRED
its pages taken (L3), LOADED the transpose's preload_stages known (A's ready word read),
WAITED the tile's copies issued (end of L6), COMPUTED the tile in, STORED the compute barrier
after the stores. Medians (p10, p90) over every record q >= 2 of every SM, us.

    python benchmarks/results/transpose-head/marks.py OUT.npy [OUT2.npy ...]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools"))
from trace_transpose_phases import _report, per_sm  # noqa: E402

LABELS = ("L2 done -> pages taken (L3)", "pages taken -> stages known (ready word)",
          "stages known -> copies issued (L4-L6)", "issued -> tile in", "tile in -> stored",
          "stored(q-2) -> L2 done(q)", "issued(q) - tile in(q-1)", "period (tile in)",
          "period (stored)")


def main(path):
    rows = []
    for e in per_sm(np.load(path)):
        f, a, k, iss = e["fetch"], e["acquired"], e["loaded"], e["waited"]
        tin, sto = e["computed"], e["stored"]
        for q in range(2, len(f)):
            rows.append([a[q] - f[q], k[q] - a[q], iss[q] - k[q], tin[q] - iss[q],
                         sto[q] - tin[q], f[q] - sto[q - 2], iss[q] - tin[q - 1],
                         tin[q] - tin[q - 1], sto[q] - sto[q - 1]])
    _report(np.array(rows, dtype=np.float64), LABELS)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(p)
        main(p)
