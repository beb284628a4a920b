#!/usr/bin/env python3
"""Probe: where a repeated `prog.run(out=..., **tensors)` call's time goes, step by step.

The W7 report rows give one figure per call: wall-clock minus the launch's device time. On
the H200 (benchmarks/ANALYSIS.md) that host share was 9.3 us for the one-copy program and
40 us for the 16-layer chain (17 tensors), so something grows with the call. For each W7
workload this times, with the same torch tensors as the report (inputs and every output
given as `out=`, a bound call), the median over N calls of:

  key          Program._call_key: the identity of every tensor (torch accessors per tensor)
  lookup       Program._bound_call: the key plus the call cache's lookup
  stream       interop.current_stream: torch's current stream, as the fast path asks
  enqueue      executor.launch_bound: the driver's enqueue of the launch, no wait
  enqueue graph  the same launch as run_bound enqueues it: a graph replay (graph_launch.py)
  is capturing   cuStreamIsCapturing on the call's stream: what asking it per launch would
               cost (a launch() that replays the graph where the stream is not capturing)
  run_bound    executor.run_bound: launch and wait on the mapped host word (the fast path
               minus the key and the stream); the launch a graph replay (graph_launch.py)
  run_bound direct, run direct
               the same with the executor's graph_launch off: a cooperative launch each
  run          prog.run, the whole call (the report's megak_run)
  bound        Bound.run of the same call bound once (the report's megak_bound)
  device       the launch timed by CUDA events behind a spin kernel (the report's device
               figure)
  idle gap     run_bound - device: launch latency on an idle GPU and the completion seen
               by the host
  resident     r.submit(prog, out=..., **tensors).wait() on a resident kernel (megak_resident)
  resident bound  r.submit(bound).wait(): the same request without the call key

    python tools/probe_run_steps.py [--n 1000] [--workloads W7-call-copy W7-call-mlp1024]
                                    [--n-sm DEFAULT 1 ...] [--rounds 1]

--n-sm: the programs compiled for each of these SM counts in turn, round by round ("DEFAULT":
the device's; a smaller count launches that many blocks: what the blocks of empty queues,
which leave at once, cost a call).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

import megak  # noqa: E402
from megak import interop  # noqa: E402
from megak.runtime.driver import _bindings  # noqa: E402


def median_us(fn, n: int, warmup: int = 20) -> float:
    """The report's per-call timing (benchmarks.report.time_calls), its median."""
    from benchmarks.report import time_calls
    return float(np.median(time_calls(fn, n, warmup)))


def steps(name: str, n: int, n_sm: int | None = None) -> dict:
    from benchmarks import report
    from benchmarks.workloads import FACTORIES
    w = FACTORIES[name]()
    env = report.TorchEnv()
    inputs = w.make_inputs(np.random.default_rng(5))
    prog = megak.compile(w.build(), backend="cuda", n_sm=n_sm)
    try:
        plan = prog.plan
        tin = env.to_device(inputs)
        outs = {o: env.empty(plan.output_shapes[o], plan.tensors[slot].dtype)
                for o, slot in plan.outputs.items()}
        prog.run(out=outs, **tin)          # binds the call
        _, call = prog._bound_call(tin, outs)
        if call is None:
            raise RuntimeError(f"{name}: the call did not bind (no fast path)")
        ex = prog._executor
        h = interop.current_stream(call.kind, ex.ordinal)
        out = {"tensors": len(tin) + len(outs)}
        out["key"] = median_us(lambda: prog._call_key(tin, outs), n)
        out["lookup"] = median_us(lambda: prog._bound_call(tin, outs), n)
        out["stream"] = median_us(lambda: interop.current_stream(call.kind, ex.ordinal), n)

        def direct():
            return ex.launch_bound(call.binding, h)

        def replay():                     # as run_bound enqueues it, without its wait
            with ex._lock:
                return ex._launch_bound(call.binding, h, graph=True)[0]

        def enqueue_then_wait(launch):
            t0 = time.perf_counter_ns()
            ticket = launch()
            t = time.perf_counter_ns() - t0
            ex.wait(ticket)
            return t
        for _ in range(20):
            enqueue_then_wait(direct)
            enqueue_then_wait(replay)
        for name, launch in (("enqueue", direct), ("enqueue graph", replay)):
            out[name] = statistics.median(enqueue_then_wait(launch) for _ in range(n)) / 1e3
        drv = _bindings()
        out["is capturing"] = median_us(lambda: drv.cuStreamIsCapturing(h), n)
        out["run_bound"] = median_us(lambda: ex.run_bound(call.binding, h), n)
        out["run_bound via"] = ex.last_launch
        ex.graph_launch = False
        out["run_bound direct"] = median_us(lambda: ex.run_bound(call.binding, h), n)
        out["run direct"] = median_us(lambda: prog.run(out=outs, **tin), n)
        ex.graph_launch = True
        out["run"] = median_us(lambda: prog.run(out=outs, **tin), n)
        bound = prog.bind(out=outs, **tin)
        out["bound"] = median_us(bound.run, n)
        dev, handles = env.device_times(lambda: prog.launch(out=outs, **tin), min(n, 200), 10)
        for hd in handles:
            hd.wait()
        out["device"] = float(np.median(dev))
        out["idle gap"] = out["run_bound"] - out["device"]
        env.sync()                          # the resident kernel holds every SM from here
        with megak.resident(prog) as r:
            out["resident"] = median_us(lambda: r.submit(prog, out=outs, **tin).wait(), n)
            out["resident bound"] = median_us(lambda: r.submit(bound).wait(), n)
        return out
    finally:
        prog.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--workloads", nargs="*", default=["W7-call-copy", "W7-call-mlp1024"])
    ap.add_argument("--n-sm", nargs="*", default=["DEFAULT"])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    counts = [None if c == "DEFAULT" else int(c) for c in args.n_sm]
    for r in range(args.rounds):
        for name in args.workloads:
            for n_sm in counts:
                s = steps(name, args.n, n_sm)
                tag = "" if n_sm is None else f" n_sm {n_sm}"
                cells = (f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in s.items())
                print(f"{name}{tag} round {r}: " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
