"""Random DAGs of mixed ops on random SM interleavings, checked against float64: fp32 graphs,
bf16 / fp32 graphs around the bf16 GEMM paths (the weight stream, wgmma tiles, epilogues),
adds folded into GEMMs whose other operand is written later (fused), layer chains on the
weight stream with several layers' bands per SM (stream), fp32 layer chains at batch 1 to 17
(f32chain), and both kinds of chain with constant weights, biases and residuals (const).

The simulator also fails any instruction that reads a region before it was completely
written, so a missing or too-coarse dependency is caught even where the values would agree.
"""
import numpy as np
import pytest

import megak
from tests.random_dags import (random_bf16_graph, random_const_graph, random_f32_chain_graph,
                               random_fused_graph, random_graph, random_stream_graph)
from tests.reference import assert_close, check_graph, evaluate, random_inputs

# kind -> (graph maker, simulator seeds, GPU seeds, input seed offsets (simulator, GPU))
KINDS = {"fp32": (random_graph, range(200), range(120), (1000, 2000)),
         "bf16": (random_bf16_graph, range(300), range(60), (3000, 4000)),
         "fused": (random_fused_graph, range(200), range(40), (5000, 6000)),
         "stream": (random_stream_graph, range(200), range(30), (7000, 8000)),
         "f32chain": (random_f32_chain_graph, range(100), range(20), (9000, 10000)),
         "const": (random_const_graph, range(100), range(20), (11000, 12000))}


def cases(which: int):
    return [(kind, seed) for kind, spec in KINDS.items() for seed in spec[which]]


@pytest.mark.parametrize("kind, seed", cases(1))
def test_random_dag_on_simulator(kind, seed):
    make, _, _, (offset, _) = KINDS[kind]
    g = make(seed)
    n_sm = [1, 2, 3, 8, 132][seed % 5]
    order = "random" if seed % 2 else "round_robin"
    prog = megak.compile(g, backend="sim", n_sm=n_sm, order=order, seed=seed)
    check_graph(prog, g, np.random.default_rng(offset + seed), f"{kind} seed {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind, seed", cases(2))
def test_random_dag_on_gpu_matches_simulator_and_float64(kind, seed):
    make, _, _, (_, offset) = KINDS[kind]
    g = make(seed)
    inputs = random_inputs(g, np.random.default_rng(offset + seed))
    gpu = megak.compile(g, backend="cuda").run(**inputs)
    sim = megak.compile(g, backend="sim", order="random", seed=seed).run(**inputs)
    env = evaluate(g, inputs)
    for name, t in g.outputs.items():
        value, bound = env[t.index]
        what = f"{kind} seed {seed}"
        assert_close(gpu[name], value, bound, f"{what} cuda {name}", t.dtype)
        # two results, each within `bound` of the exact value
        assert_close(gpu[name], sim[name].astype(np.float64), 2 * bound,
                     f"{what} cuda vs sim {name}", t.dtype)
