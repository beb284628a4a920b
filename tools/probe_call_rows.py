#!/usr/bin/env python3
"""Probe: the report's W7 rows as the report times them, without the workloads before them.

In the committed report W7-call-copy's `megak_run` (21.66 us, p10 20.75) sits 8.3 us above
`megak_bound` (13.31), where `tools/probe_run_steps.py` measured the unbound call 3.7 us above
the bound one on the same machine: the call key of two tensors and the cache's lookup. The
two differ in what ran before (the report's W1-W6 in the same process) and in order (the
report times megak_run first, right after the program's first call). This runs
`benchmarks.report.run_call_workload` itself, `--rounds` times in one process, and counts the
calls that took the full path (`Program._describe`: the key missed, or the binding was not
live) during each round: a miss on every call would explain the gap where the key alone
cannot. `--before NAME ...`: after the first rows, each of these report workloads in turn
(through the report's own dispatch, its figures not printed), the rows again after each:
which of what the report runs first moves them. Each round also times the call key's torch
accessors alone (`data_ptr()`, `shape`, `stride()` of a (1, 32) GPU tensor, median of 2,000),
and counts the garbage collector's passes during the rows and the objects it tracks.

Result (H200, 2026-12-04, benchmarks/results/call-rows/): every call took the fast path, the
collector's passes were the same in every round, and nothing that ran before set the rows:
the host's speed moves in phases of tens of seconds (torch's graph replay of the copy
9.5-11.5 <-> 16-16.6 us, torch's tensor reads 0.44 <-> 0.86 us), and megak_run is that replay
+ 4.4-5.3 us in either phase (alone: 14.46-15.99 us). The report had timed megak_run in a slow
phase and torch's graph in a fast one; it now times the per-call variants in turn
(benchmarks.report.time_in_turn).

    python tools/probe_call_rows.py [--workloads W7-call-copy] [--rounds 2] [--quick]
                                    [--before W6-lower-100k W3-4096-bf16 ...]
"""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

from benchmarks import report, workloads as W  # noqa: E402
from megak.program import Program  # noqa: E402

ROWS = ("p10_us", "median_us", "p90_us", "min_us")


def counting_describe():
    """Patch Program._describe to count its calls; returns the counter (a one-item list)."""
    count = [0]
    describe = Program._describe

    def counted(self, inputs, out):
        count[0] += 1
        return describe(self, inputs, out)
    Program._describe = counted
    return count


def accessors_us(torch, n: int = 2000) -> float:
    """Median us of the three torch reads the call key makes of one tensor."""
    t = torch.empty((1, 32), device="cuda")

    def read():
        return t.data_ptr(), t.shape, t.stride()
    return float(np.median(report.time_calls(read, n, 200)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["W7-call-copy"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--before", nargs="*", default=[])
    args = ap.parse_args(argv)
    env = report.TorchEnv()
    count = counting_describe()
    rng = np.random.default_rng(0)
    status = 0
    quiet = {"log": lambda *a: None}
    for rnd, before in enumerate([None] * args.rounds + args.before):
        if before is not None:
            w = W.get(before)
            if w.kind == "host":
                report.run_host_workload(w, args.quick, **quiet)
            else:
                report.run_gpu_workload(w, args.quick, env, rng, **quiet)
            print(f"-- after {before}")
        for name in args.workloads:
            w = W.get(name)
            described = count[0]
            collections = [g["collections"] for g in gc.get_stats()]
            results, failures, _ = report.run_call_workload(w, args.quick, env, rng,
                                                            log=lambda *a: None)
            reps = sum(r["reps"] for r in results if r["variant"].startswith("megak"))
            print(f"round {rnd} {name}: Program._describe called {count[0] - described} times "
                  f"(timed megak calls: {reps}); the key's torch reads of one tensor "
                  f"{accessors_us(env.torch):.3f} us; gc collections by generation during "
                  f"it {[g['collections'] - c for g, c in zip(gc.get_stats(), collections)]}, "
                  f"objects tracked {len(gc.get_objects()):,}")
            for r in results:
                extra = (f", device {r['device_us']:.2f}" if "device_us" in r else "")
                print(f"  {r['variant']:<22}" + "  ".join(f"{k[:-3]} {r[k]:7.2f}" for k in ROWS)
                      + extra)
            for f in failures:
                status = 1
                print(f"  FAILED {f}")
    return status


if __name__ == "__main__":
    sys.exit(main())
