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

With --tile-in, for a tree whose paged transpose marks its tile's arrival (MK_T_COMPUTED, the
compute threads' wait done; branch paged3 and after), per instruction q >= 1 of an SM:

  record(q)-tile in(q-1)   the loader has q's record, after the tile before landed
  acquired-record(q)       ... to q's pages taken
  tile in-acquired         the tile's flight (its copies go out right after the pages)
  tile in-start            how long the compute warps waited in the op for the tile
  stored-tile in           reads, transpose, stores issued, compute barrier

--save OUT.npy keeps the traced run's events.

    python tools/trace_transpose_phases.py [n] [--tile-in] [--save OUT.npy]
                                            (on a GPU; the megak of this checkout)
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout
import megak                                                     # noqa: E402
from megak import abi                                            # noqa: E402

P = abi.TRACE_PHASES
LABELS = ("fetch(q+1)-start(q)", "fetch->acquired", "fetch->waited", "start(q+1)-stored(q)",
          "op span", "period")
TILE_LABELS = ("record(q)-tile in(q-1)", "acquired-record(q)", "tile in-acquired",
               "tile in-start", "stored-tile in")


def per_sm(ev):
    """Each SM's events in queue order, as a dict phase name -> times (int64 ns)."""
    t = ev["t"].astype(np.int64)
    sm, qi = ev["sm"].astype(np.int64), ev["queue_index"].astype(np.int64)
    for s in np.unique(sm):
        mine = np.nonzero(sm == s)[0]
        mine = mine[np.argsort(qi[mine])]
        yield {name[5:].lower(): t[mine, i] for name, i in P.items() if name != "MK_TRACE_PHASES"}


def pairs(ev) -> np.ndarray:
    """One row per consecutive pair of an SM's instructions, the LABELS' intervals in ns."""
    rows = []
    for e in per_sm(ev):
        start, stored, fetch = e["loaded"], e["stored"], e["fetch"]
        rows += zip(fetch[1:] - start[:-1], e["acquired"][1:] - fetch[1:],
                    e["waited"][1:] - fetch[1:], start[1:] - stored[:-1],
                    stored[:-1] - start[:-1], start[1:] - start[:-1])
    return np.array(rows, dtype=np.float64).reshape(-1, len(LABELS))


def tile_rows(ev) -> np.ndarray:
    """One row per instruction q >= 1 of an SM, the TILE_LABELS' intervals in ns (MK_T_COMPUTED
    read as the tile's arrival)."""
    rows = []
    for e in per_sm(ev):
        fetch, acq, tile_in = e["fetch"], e["acquired"], e["computed"]
        rows += zip(fetch[1:] - tile_in[:-1], acq[1:] - fetch[1:], tile_in[1:] - acq[1:],
                    tile_in[1:] - e["loaded"][1:], e["stored"][1:] - tile_in[1:])
    return np.array(rows, dtype=np.float64).reshape(-1, len(TILE_LABELS))


def _report(rows: np.ndarray, labels) -> None:
    r, width = rows / 1e3, max(24, *map(len, labels))
    for i, label in enumerate(labels):
        print(f"{label:<{width}} median {np.median(r[:, i]):7.3f} us  "
              f"p10 {np.percentile(r[:, i], 10):7.3f}  p90 {np.percentile(r[:, i], 90):7.3f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=8192)
    ap.add_argument("--tile-in", action="store_true")
    ap.add_argument("--save", metavar="OUT.npy")
    a = ap.parse_args(argv)
    n = a.n
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
    if a.save:
        np.save(a.save, ev)
    _report(pairs(ev), LABELS)
    if a.tile_in:
        _report(tile_rows(ev), TILE_LABELS)
    print(f"instructions per SM {len(ev) / len(np.unique(ev['sm'])):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
