"""The GPU timing helpers used by benchmarks/: every variant computes the right result."""
import numpy as np
import pytest

import megak
from tests.reference import assert_close, evaluate, random_inputs

pytestmark = pytest.mark.gpu


def mixed_graph():
    g = megak.Graph()
    a = g.input("a", (300, 130), "float32")
    b = g.input("b", (130, 257), "float32")
    h = g.gemm(a, b)
    y = g.gemm(g.transpose(h), a)
    g.output(g.copy(y), "y")
    g.output(h, "h")
    return g


@pytest.mark.parametrize("variant", ["megak", "separate", "graph", "graph_pdl"])
def test_timed_variants_compute_the_graph(variant):
    from megak.runtime.bench import Bench
    g = mixed_graph()
    prog = megak.compile(g, backend="cuda")
    inputs = random_inputs(g, np.random.default_rng(7))
    bench = Bench(prog)
    try:
        bench.upload(**inputs)
        bench.poison()
        if variant == "megak":
            us = bench.time_megakernel(reps=5, warmup=2)
        else:
            us = bench.time_separate(reps=5, warmup=2, graph=variant != "separate",
                                     pdl=variant == "graph_pdl")
        assert us.shape == (5,) and (us > 0).all()
        out = bench.outputs()
        env = evaluate(g, inputs)
        for name, t in g.outputs.items():
            assert_close(out[name], *env[t.index], f"{variant} {name}")
        # the executor still runs normally afterwards (epochs continue)
        again = prog.run(**inputs)
        for name, t in g.outputs.items():
            assert_close(again[name], *env[t.index], f"{variant} then run {name}")
    finally:
        bench.close()
        prog.close()
