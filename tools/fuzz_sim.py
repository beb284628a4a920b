#!/usr/bin/env python3
"""Random graphs on the simulator, past the test seeds: every output checked against float64.

    tools/fuzz_sim.py [--modes plain pages api resident]
                      [--kinds fp32 bf16 fused stream f32chain const]
                      [--seeds 0 1000] [--stop-on-failure]

Each seed of each kind (tests/random_dags.py) runs in each mode:

  plain     a random SM count (1 to 132) and a random interleaving of the SMs' actors
  pages     a random page budget (1 to 13 pages per SM) and data flags on or off; a graph
            whose op needs more pages than the budget is counted as refused, not failed
  api       inputs as strided numpy views (a column slice of a wider array), ``out=`` for a
            random half of the outputs (poisoned with NaN first), three launches with
            fresh inputs waited for in a random order
  resident  a resident kernel of the program: three requests, waited for in a random order

The simulator also fails any instruction that reads a region before it was completely
written, so a missing dependency is caught even where the values would agree. Prints one
line per failure and a summary, also when stopped by SIGTERM (an outer `timeout`) or ^C: the
counts of every mode that ran, and each kind's last seed that ran in every mode. Exit status
1 when anything failed.
"""
from __future__ import annotations

import argparse
import signal
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import megak  # noqa: E402
from megak.dtypes import numpy_dtype  # noqa: E402
from tests.random_dags import (random_bf16_graph, random_const_graph,  # noqa: E402
                               random_f32_chain_graph, random_fused_graph, random_graph,
                               random_stream_graph)
from tests.reference import check_outputs, random_inputs  # noqa: E402

KINDS = {"fp32": random_graph, "bf16": random_bf16_graph, "fused": random_fused_graph,
         "stream": random_stream_graph, "f32chain": random_f32_chain_graph,
         "const": random_const_graph}
MODES = ("plain", "pages", "api", "resident")
SM_COUNTS = (1, 2, 3, 4, 5, 7, 8, 13, 16, 33, 132)
LAUNCHES = 3


def strided(a: np.ndarray, rng) -> np.ndarray:
    """The same values as a view whose rows are padded: a column slice of a wider array."""
    if a.ndim != 2:
        return a
    wide = np.full((a.shape[0], a.shape[1] + int(rng.integers(1, 9))), np.nan, dtype=a.dtype)
    view = wide[:, :a.shape[1]]
    view[...] = a
    return view


def poisoned_out(graph, rng) -> dict:
    """out= arrays for a random half of the graph's outputs, filled with NaN."""
    out = {}
    for name, t in graph.outputs.items():
        if rng.random() < 0.5:
            out[name] = np.full(t.shape, np.nan, dtype=numpy_dtype(t.dtype))
    return out


def run_mode(mode: str, graph, seed: int, rng) -> str:
    """Run one graph in one mode; 'ok' or 'refused' (page budget), else raise."""
    if mode == "plain":
        prog = megak.compile(graph, backend="sim", n_sm=int(rng.choice(SM_COUNTS)),
                             order="random", seed=seed)
        inputs = random_inputs(graph, rng)
        check_outputs(graph, inputs, prog.run(**inputs), "plain")
        return "ok"
    if mode == "pages":
        try:
            prog = megak.compile(graph, backend="sim", n_sm=int(rng.choice(SM_COUNTS)),
                                 n_pages=int(rng.integers(1, 14)),
                                 data_flags=bool(rng.random() < 0.5),
                                 order="random", seed=seed)
        except megak.GraphError as e:
            if "shared-memory pages" in str(e):
                return "refused"
            raise
        inputs = random_inputs(graph, rng)
        check_outputs(graph, inputs, prog.run(**inputs), "pages")
        return "ok"
    prog = megak.compile(graph, backend="sim", n_sm=int(rng.choice(SM_COUNTS)),
                         order="random", seed=seed)
    calls = []
    if mode == "api":
        handles = []
        for _ in range(LAUNCHES):
            inputs = random_inputs(graph, rng)
            out = poisoned_out(graph, rng)
            views = {k: strided(v, rng) for k, v in inputs.items()}
            handles.append(prog.launch(out=out, **views))
            calls.append((inputs, out))
        results = _in_random_order([h.wait for h in handles], rng)
    else:
        with megak.resident(prog) as r:
            requests = []
            for _ in range(LAUNCHES):
                inputs = random_inputs(graph, rng)
                out = poisoned_out(graph, rng)
                requests.append(r.submit(prog, out=out, **inputs))
                calls.append((inputs, out))
            results = _in_random_order([q.wait for q in requests], rng)
    for i, ((inputs, out), got) in enumerate(zip(calls, results)):
        for name, a in out.items():     # the result is the caller's own out= array
            if got[name] is not a:
                raise AssertionError(f"{mode}: output {name!r} is not the out= array given")
        check_outputs(graph, inputs, got, f"{mode} call {i}")
    return "ok"


def _in_random_order(waits: list, rng) -> list:
    results = [None] * len(waits)
    for i in rng.permutation(len(waits)):
        results[i] = waits[i]()
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    ap.add_argument("--seeds", nargs=2, type=int, default=(0, 1000), metavar=("FIRST", "END"))
    ap.add_argument("--stop-on-failure", action="store_true")
    args = ap.parse_args(argv)
    counts = {"ok": 0, "refused": 0, "failed": 0}
    # an outer `timeout` (SIGTERM) or ^C ends the run with the summary of what it ran
    before = signal.signal(signal.SIGTERM, _interrupt)
    done = {kind: None for kind in args.kinds}     # kind -> last seed run in every mode
    try:
        for kind in args.kinds:
            for seed in range(*args.seeds):
                if _run_seed(kind, seed, args.modes, counts) and args.stop_on_failure:
                    return 1
                done[kind] = seed
    except KeyboardInterrupt:
        print("fuzz_sim: interrupted; the summary counts the seeds that ran", flush=True)
    finally:
        signal.signal(signal.SIGTERM, before)
    ran = "; ".join(f"{kind} seeds {args.seeds[0]}-{last}" if last is not None
                    else f"{kind} none" for kind, last in done.items())
    print(f"fuzz_sim: {counts['ok']} passed, {counts['refused']} refused by the page budget, "
          f"{counts['failed']} failed ({ran}; modes {', '.join(args.modes)})", flush=True)
    return 1 if counts["failed"] else 0


def _run_seed(kind: str, seed: int, modes, counts: dict) -> bool:
    """One seed of one kind in each mode, counted; whether any failed (each failure printed)."""
    graph = KINDS[kind](seed)
    failed = False
    for mode in modes:
        # a seed of its own per (kind, seed, mode): a failure reruns alone
        rng = np.random.default_rng([seed, MODES.index(mode), list(KINDS).index(kind)])
        try:
            counts[run_mode(mode, graph, seed, rng)] += 1
        except Exception as e:     # noqa: BLE001 - every failure is reported
            counts["failed"] += 1
            failed = True
            last = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {kind} seed {seed} mode {mode}: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200]} ({Path(last.filename).name}:"
                  f"{last.lineno})", flush=True)
    return failed


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
