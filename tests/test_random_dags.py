"""Random DAGs of mixed ops on random SM interleavings, checked against float64: fp32 graphs,
and bf16 / fp32 graphs around the bf16 GEMM paths (the weight stream, wgmma tiles, epilogues).

The simulator also fails any instruction that reads a region before it was completely
written, so a missing or too-coarse dependency is caught even where the values would agree.
"""
import numpy as np
import pytest

import megak
from tests.random_dags import random_bf16_graph, random_graph
from tests.reference import assert_close, check_graph, evaluate, random_inputs

CPU_SEEDS = range(200)
GPU_SEEDS = range(120)


@pytest.mark.parametrize("seed", CPU_SEEDS)
def test_random_dag_on_simulator(seed):
    g = random_graph(seed)
    n_sm = [1, 2, 3, 8, 132][seed % 5]
    order = "random" if seed % 2 else "round_robin"
    prog = megak.compile(g, backend="sim", n_sm=n_sm, order=order, seed=seed)
    check_graph(prog, g, np.random.default_rng(1000 + seed), f"seed {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("seed", GPU_SEEDS)
def test_random_dag_on_gpu_matches_simulator_and_float64(seed):
    g = random_graph(seed)
    inputs = random_inputs(g, np.random.default_rng(2000 + seed))
    gpu = megak.compile(g, backend="cuda").run(**inputs)
    sim = megak.compile(g, backend="sim", order="random", seed=seed).run(**inputs)
    env = evaluate(g, inputs)
    for name, t in g.outputs.items():
        value, bound = env[t.index]
        assert_close(gpu[name], value, bound, f"seed {seed} cuda {name}")
        # two fp32 results, each within `bound` of the exact value
        assert_close(gpu[name], sim[name].astype(np.float64), 2 * bound,
                     f"seed {seed} cuda vs sim {name}")


@pytest.mark.parametrize("seed", range(300))
def test_random_bf16_dag_on_simulator(seed):
    g = random_bf16_graph(seed)
    n_sm = [1, 2, 3, 8, 132][seed % 5]
    order = "random" if seed % 2 else "round_robin"
    prog = megak.compile(g, backend="sim", n_sm=n_sm, order=order, seed=seed)
    check_graph(prog, g, np.random.default_rng(3000 + seed), f"bf16 seed {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(60))
def test_random_bf16_dag_on_gpu_matches_simulator_and_float64(seed):
    g = random_bf16_graph(seed)
    inputs = random_inputs(g, np.random.default_rng(4000 + seed))
    gpu = megak.compile(g, backend="cuda").run(**inputs)
    sim = megak.compile(g, backend="sim", order="random", seed=seed).run(**inputs)
    env = evaluate(g, inputs)
    for name, t in g.outputs.items():
        value, bound = env[t.index]
        assert_close(gpu[name], value, bound, f"bf16 seed {seed} cuda {name}", t.dtype)
        assert_close(gpu[name], sim[name].astype(np.float64), 2 * bound,
                     f"bf16 seed {seed} cuda vs sim {name}", t.dtype)
