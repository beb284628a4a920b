#!/usr/bin/env python3
"""Probe: a resident request's round trip, split where the host can see it.

For a (1, 32) copy and a graph with no instruction, on a resident kernel (megak.resident),
without the Python of submit/wait: the host posts the request (ResidentKernel.post: the ring
entry's six words, then `kick`), spins until the relay's `view.taken` names it, then until
the program's host view says it is done. Medians of 2,700 requests (the first 300 of 3,000
dropped), us:

  post                 the host's ring write (Python)
  post -> taken seen   the relay's poll seeing the entry, its mirror and `go`, and its
                       `view.taken` (st.release.sys) crossing PCIe to the host
  taken -> done seen   the request on the device and its completion word crossing PCIe

then post + spin on the completion alone after a pause of 0, 20 and 100 us between requests
(the relay idle-polling for that long).

    python tools/probe_resident_split.py
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

import megak  # noqa: E402
from megak.runtime import resident as resident_rt  # noqa: E402


def split(name: str, g, inputs: dict, out: dict) -> None:
    prog = megak.compile(g, backend="cuda")
    ex = prog._executor
    with megak.resident(prog, idle_s=10) as r:
        k = r._kernel
        r.submit(prog, out=out, **inputs).wait()
        _, words, table, _ = prog._prepare_request(inputs, out)
        taken_at = resident_rt._VIEW["taken"]

        def post() -> tuple[int, int]:
            t = ex._ticket = (ex._ticket + 1) & 0xFFFFFFFF or 1
            return t, k.post(words, table, t, time.monotonic() + 10)

        rows = []
        for _ in range(3000):
            t0 = time.perf_counter_ns()
            t, s = post()
            t1 = time.perf_counter_ns()
            while k._view[taken_at] != s:
                pass
            t2 = time.perf_counter_ns()
            while not ex.done(t):
                pass
            rows.append((t1 - t0, t2 - t1, time.perf_counter_ns() - t2))
        a = np.array(rows[300:]) / 1e3
        total = a.sum(axis=1)
        print(f"{name}: post {np.median(a[:, 0]):.2f}  post->taken seen {np.median(a[:, 1]):.2f}  "
              f"taken->done seen {np.median(a[:, 2]):.2f}  total {np.median(total):.2f} us "
              f"(p10 {np.percentile(total, 10):.2f} p90 {np.percentile(total, 90):.2f})",
              flush=True)
        for pause_us in (0, 20, 100):
            ts = []
            for _ in range(1500):
                t0 = time.perf_counter_ns()
                t, _ = post()
                while not ex.done(t):
                    pass
                ts.append(time.perf_counter_ns() - t0)
                end = time.perf_counter_ns() + pause_us * 1000
                while time.perf_counter_ns() < end:
                    pass
            print(f"{name}: post+spin after a {pause_us} us pause: "
                  f"{statistics.median(ts[150:]) / 1e3:.2f} us", flush=True)
    prog.close()


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    import torch
    x = torch.randn(1, 32, device="cuda")
    y = torch.empty(1, 32, device="cuda")
    g = megak.Graph()
    g.output(g.copy(g.input("x", (1, 32))), "y")
    split("copy", g, {"x": x}, {"y": y})
    g = megak.Graph()
    g.output(g.input("x", (1, 32)), "x_out")
    split("empty", g, {"x": x}, {})
    return 0


if __name__ == "__main__":
    sys.exit(main())
