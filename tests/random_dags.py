"""Seeded random graphs of mixed ops with odd shapes, shared by the CPU and GPU tiers."""
from __future__ import annotations

import numpy as np

import megak

DIMS = [1, 3, 7, 33, 64, 65, 129, 200, 300]


def random_graph(seed: int) -> megak.Graph:
    rng = np.random.default_rng(seed)
    g = megak.Graph()
    pool = []
    n_inputs = 0

    def new_input(rows, cols):
        nonlocal n_inputs
        t = g.input(f"in{n_inputs}", (int(rows), int(cols)), "float32")
        n_inputs += 1
        pool.append(t)
        return t

    def new_vector(n):
        nonlocal n_inputs
        t = g.input(f"in{n_inputs}", (int(n),), "float32")
        n_inputs += 1
        return t

    new_input(rng.choice(DIMS), rng.choice(DIMS))
    for _ in range(int(rng.integers(2, 9))):
        kind = rng.choice(["gemm", "gemm", "transpose", "copy", "add", "softmax", "layernorm",
                           "rmsnorm"])
        x = pool[int(rng.integers(len(pool)))]
        if kind == "gemm":
            partners = [t for t in pool if t.rows == x.cols]
            if partners and rng.random() < 0.6:
                b = partners[int(rng.integers(len(partners)))]
            else:
                b = new_input(x.cols, rng.choice(DIMS))
            pool.append(g.gemm(x, b))
        elif kind == "transpose":
            pool.append(g.transpose(x))
        elif kind == "copy":
            pool.append(g.copy(x))
        elif kind == "add":
            same = [t for t in pool if t.shape == x.shape and t is not x]
            if same and rng.random() < 0.6:
                b = same[int(rng.integers(len(same)))]
            elif rng.random() < 0.5:
                b = new_vector(x.cols)          # broadcast over rows
            else:
                b = new_input(x.rows, x.cols)
            pool.append(g.add(x, b))
        elif kind == "softmax":
            pool.append(g.softmax(x, scale=float(rng.choice([1.0, 0.125, 3.0])),
                                  causal=bool(rng.random() < 0.5)))
        elif kind == "layernorm":
            pool.append(g.layernorm(x, new_vector(x.cols), new_vector(x.cols)))
        else:
            pool.append(g.rmsnorm(x, new_vector(x.cols)))
    produced = [t for t in pool if t.producer is not None]
    outs = {produced[-1].index: produced[-1]}
    for t in produced[:-1]:
        if rng.random() < 0.3:
            outs[t.index] = t
    for i, t in enumerate(outs.values()):
        g.output(t, f"out{i}")
    return g
