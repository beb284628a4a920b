"""pytest-benchmark around the megakernel and the separate / CUDA-graph / CUDA-graph-with-PDL
variants of the small workloads (W1, W2-1024x16-fp32, W3-4096-fp32). GPU only (marked `gpu`,
skipped elsewhere).

    python -m pytest benchmarks/test_gpu_benchmarks.py --benchmark-only

Each round is one real run of the variant (launch + wait), timed by pytest-benchmark on the
host; the CUDA-event time of the same run goes to ``extra_info["cuda_event_us"]``. The outputs
are poisoned before the rounds and checked against float64 after them. Nothing here asserts on
time: `python -m benchmarks.report` is where figures are compared.
"""
import numpy as np
import pytest

import megak
from benchmarks import workloads as W
from benchmarks.report import (L2_FLUSH_BYTES, SEPARATE_VARIANTS, peer_lowering,
                               time_bench_variant)

pytestmark = pytest.mark.gpu

WORKLOADS = ("W1", "W2-1024x16-fp32", "W3-4096-fp32")
ROUNDS = {"W1": 20, "W2-1024x16-fp32": 30, "W3-4096-fp32": 5}


@pytest.fixture(scope="module")
def bench_for():
    """(workload name, variant) -> (workload, reference, Bench) built once per module, the
    separate launches on the lowering the report times them on (peer_lowering); closed at the
    end."""
    from megak.runtime.bench import Bench
    built, benches, progs = {}, {}, []

    def get(name, variant):
        if name not in built:
            w = W.get(name)
            rng = np.random.default_rng()
            inputs = w.make_inputs(rng)
            built[name] = (w, inputs, w.reference(inputs, rng))
        w, inputs, ref = built[name]
        lowering = {}
        if variant in SEPARATE_VARIANTS:
            lowering = peer_lowering(get(name, "megak")[2].prog.plan)
        key = (name, tuple(sorted(lowering.items())))
        if key not in benches:
            prog = megak.compile(w.build(), backend="cuda", **lowering)
            progs.append(prog)
            if w.plan_check is not None and not lowering:
                w.plan_check(prog.plan)
            w.check(ref, prog.run(**inputs), f"{name}: prog.run {lowering}")
            b = Bench(prog)
            b.upload(**inputs)
            benches[key] = b
        return w, ref, benches[key]

    yield get
    for b in benches.values():
        b.close()
    for p in progs:
        p.close()


@pytest.mark.parametrize("variant", ["megak", "separate", "graph", "graph_pdl"])
@pytest.mark.parametrize("name", WORKLOADS)
def test_variant(benchmark, bench_for, name, variant):
    w, ref, b = bench_for(name, variant)
    flush = w.working_set_bytes <= L2_FLUSH_BYTES
    event_us = []

    def one_run():
        event_us.extend(time_bench_variant(b, variant, reps=1, warmup=0, flush=flush))

    b.poison()
    benchmark.pedantic(one_run, rounds=ROUNDS[name], iterations=1, warmup_rounds=1)
    err = w.check(ref, b.outputs(), f"{name}/{variant} after the benchmark rounds")
    benchmark.extra_info.update(workload=name, variant=variant, metric=w.metric,
                                cuda_event_us=float(np.median(event_us)),
                                max_err_over_bound=err)
    # --benchmark-disable runs the function once, without rounds
    runs = 1 if benchmark.disabled else ROUNDS[name] + 1
    assert len(event_us) == runs and all(t > 0 for t in event_us)


# small chains for the graph_pdl variant: W1's copies, an fp32 GEMM chain, bf16 chains whose
# GEMMs stream their weights (1024: programmatic edges between every pair of launches; 2048:
# every GEMM combines its parts, so a counter memset sits between launches), a 32 MiB copy
# whose takers share a hand-out counter (zeroed by that memset before every run)
SMALL_CHAINS = {"W1-10x32": lambda: W.w1(n_ops=10), "W2-64x2-fp32": lambda: W.w2(64, 2),
                "W2-1024x3-bf16": lambda: W.w2(1024, 3, dtype="bfloat16"),
                "W2-2048x3-bf16": lambda: W.w2(2048, 3, dtype="bfloat16"),
                "W5-2048x4096": lambda: W.w5(2048, 4096)}


@pytest.mark.parametrize("name", list(SMALL_CHAINS))
def test_graph_pdl_computes_the_reference(name):
    """graph and graph_pdl on one Bench (each its own graph exec): outputs poisoned, the
    poison seen by the check, then each variant's timed runs leave the reference."""
    from megak.runtime.bench import Bench
    w = SMALL_CHAINS[name]()
    assert w.name == name
    rng = np.random.default_rng(11)
    inputs = w.make_inputs(rng)
    ref = w.reference(inputs, rng)
    with megak.compile(w.build(), backend="cuda") as prog:
        w.check(ref, prog.run(**inputs), f"{name}: prog.run")
        b = Bench(prog)
        try:
            b.upload(**inputs)
            for variant in ("graph", "graph_pdl", "graph_pdl"):   # the second: a replay
                b.poison()
                with pytest.raises(W.CheckError):
                    w.check(ref, b.outputs(), f"{name}: poisoned")
                us = time_bench_variant(b, variant, reps=3, warmup=1,
                                        flush=w.working_set_bytes <= L2_FLUSH_BYTES)
                assert us.shape == (3,)
                w.check(ref, b.outputs(), f"{name}/{variant} (outputs of the timed runs)")
            assert set(b._graphs) == {False, True}
        finally:
            b.close()
