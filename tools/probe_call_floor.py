#!/usr/bin/env python3
"""Probe: the device time of the one-copy call (W7-call-copy) against a trivial kernel's.

The report's device figure for W7-call-copy is ~7.5 us: CUDA events around one launch, queued
behind a spin kernel (benchmarks/report.py, TorchEnv.device_times). This times, the same way,
round by round:

  megak n_pages P   the W7-call-copy program compiled with P shared-memory pages per SM
                    (DEFAULT: as many as fit): whether the launch's dynamic shared memory
                    (33,792 to 230,400 B) moves a call's device time
  torch copy_ / fill_   a (1, 32) tensor's copy and fill: the device time of a launch that
                    does next to nothing, measured the same way (the floor a call of any
                    one-kernel library sits on)

For the SM count (what the blocks of empty queues cost), see probe_run_steps.py --n-sm.

    python tools/probe_call_floor.py [--pages DEFAULT 4 1] [--rounds 2] [--reps 300]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

import megak  # noqa: E402


def _line(what: str, dev: np.ndarray) -> str:
    return (f"{what}: device median {np.median(dev):.2f} us "
            f"(p10 {np.percentile(dev, 10):.2f}, p90 {np.percentile(dev, 90):.2f})")


def megak_copy(env, pages: int | None, reps: int) -> str:
    from benchmarks.workloads import FACTORIES
    w = FACTORIES["W7-call-copy"]()
    tin = env.to_device(w.make_inputs(np.random.default_rng(5)))
    with megak.compile(w.build(), backend="cuda", n_pages=pages) as prog:
        outs = {o: env.empty(prog.plan.output_shapes[o], prog.plan.tensors[s].dtype)
                for o, s in prog.plan.outputs.items()}
        prog.run(out=outs, **tin)          # binds the call, as the report's runs are
        dev, handles = env.device_times(lambda: prog.launch(out=outs, **tin), reps, 20)
        for h in handles:
            h.wait()
        smem = prog._executor.smem_bytes
    return _line(f"megak n_pages {pages or 'DEFAULT'} (smem {smem:,} B)", dev)


def torch_trivial(env, reps: int) -> list[str]:
    torch = env.torch
    x = torch.randn(1, 32, device="cuda")
    y = torch.empty_like(x)
    return [_line(name, env.device_times(fn, reps, 20)[0])
            for name, fn in (("torch copy_ (1, 32)", lambda: y.copy_(x)),
                             ("torch fill_ (1, 32)", lambda: y.fill_(1.0)))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", nargs="*", default=["DEFAULT", "4", "1"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args(argv)
    from benchmarks import report
    env = report.TorchEnv()
    pages = [None if p == "DEFAULT" else int(p) for p in args.pages]
    for r in range(args.rounds):
        for p in pages:
            print(f"round {r} {megak_copy(env, p, args.reps)}", flush=True)
        for line in torch_trivial(env, args.reps):
            print(f"round {r} {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
