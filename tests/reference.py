"""float64 references with explicit error bounds, from each op's contract.

Every op states its float64 reference and an elementwise bound on |megak's result - exact|
in its own module (OpDef.reference, megak/ops/<op>.py): a fp32 dot product of length K,
summed in any order, is within K * u * (|a| . |b|) of the exact value (u = 2^-24); chained
ops propagate their inputs' bounds; transpose and copy are exact. So every test states its
tolerance as that bound, not as a guessed rtol.
"""
from __future__ import annotations

import numpy as np

from megak.dtypes import numpy_dtype
from megak.ops import REGISTRY


def evaluate(graph, inputs: dict[str, np.ndarray]):
    """Evaluate `graph` in float64. Returns {tensor index: (value, bound)} where bound is an
    elementwise upper limit on |megak's result - value|."""
    env = {}
    for name, t in graph.inputs.items():
        value = np.asarray(inputs[name]).astype(np.float64).reshape(t.shape)
        env[t.index] = (value, np.zeros(t.shape))
    for t in graph.constants.values():
        value = graph.constant_values[t.index].astype(np.float64).reshape(t.shape)
        env[t.index] = (value, np.zeros(t.shape))
    for op in graph.ops:
        args = [env[t.index] for t in op.inputs]
        value, bound = REGISTRY[op.kind].reference(op, args)
        env[op.output.index] = (value.reshape(op.output.shape), bound.reshape(op.output.shape))
    return env


def assert_close(actual: np.ndarray, value: np.ndarray, bound: np.ndarray, what: str = "",
                 dtype: str = "float32"):
    assert actual.shape == value.shape, (what, actual.shape, value.shape)
    assert actual.dtype == numpy_dtype(dtype), (what, actual.dtype)
    assert np.isfinite(actual).all(), f"{what}: non-finite values (unwritten output?)"
    err = np.abs(actual.astype(np.float64) - value)
    limit = bound + 1e-30
    worst = np.argmax(err - limit)
    assert (err <= limit).all(), (
        f"{what}: error {err.flat[worst]:.3e} exceeds bound {limit.flat[worst]:.3e} "
        f"at flat index {worst} (value {value.flat[worst]:.6e})")


def random_inputs(graph, rng) -> dict[str, np.ndarray]:
    return {name: rng.uniform(-1.0, 1.0, t.shape).astype(np.float32).astype(numpy_dtype(t.dtype))
            for name, t in graph.inputs.items()}


def check_graph(prog, graph, rng, what=""):
    """Run `prog` on fresh random inputs and check every output against float64."""
    inputs = random_inputs(graph, rng)
    before = {k: v.copy() for k, v in inputs.items()}
    out = prog.run(**inputs)
    for k in inputs:  # the caller's arrays are never modified
        np.testing.assert_array_equal(inputs[k], before[k])
    check_outputs(graph, inputs, out, what)
    return inputs, out


def check_outputs(graph, inputs: dict, out: dict, what: str = "") -> None:
    """Every output of one run of `graph` on `inputs` (name -> array) against float64."""
    env = evaluate(graph, inputs)
    assert set(out) == set(graph.outputs), (what, sorted(out), sorted(graph.outputs))
    for name, t in graph.outputs.items():
        value, bound = env[t.index]
        assert_close(np.asarray(out[name]), value, bound, f"{what} output {name!r}", t.dtype)


def nan_outside_tile(a: np.ndarray, b: np.ndarray, row0: int, rows: int, col0: int, cols: int,
                     k0: int, klen: int) -> np.ndarray:
    """NaN everywhere in `a` and `b` but the operands of one GEMM tile (rows x klen of a,
    klen x cols of b), so that a model reading outside them, or missing a zero fill, shows.
    Returns the tile's float64 product."""
    outside = np.ones(a.shape, bool)
    outside[row0:row0 + rows, k0:k0 + klen] = False
    a[outside] = np.nan
    outside = np.ones(b.shape, bool)
    outside[k0:k0 + klen, col0:col0 + cols] = False
    b[outside] = np.nan
    return (a[row0:row0 + rows, k0:k0 + klen].astype(np.float64)
            @ b[k0:k0 + klen, col0:col0 + cols].astype(np.float64))
