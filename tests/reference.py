"""float64 references with explicit error bounds for fp32 results.

A fp32 dot product of length K, summed in any order, is within K * u * (|a| . |b|) of the
exact value (u = 2^-24, the unit roundoff; we allow 2u per step for the rounding of the
inputs' products). Chained ops add their bounds; transpose and copy are exact. So every test
states its tolerance as that bound, not as a guessed rtol.
"""
from __future__ import annotations

import numpy as np

U32 = 2.0 ** -24


def evaluate(graph, inputs: dict[str, np.ndarray]):
    """Evaluate `graph` in float64. Returns {tensor index: (value, bound)} where bound is an
    elementwise upper limit on |fp32 result - value|."""
    env = {}
    for name, t in graph.inputs.items():
        env[t.index] = (inputs[name].astype(np.float64), np.zeros(t.shape))
    for op in graph.ops:
        args = [env[t.index] for t in op.inputs]
        if op.kind == "gemm":
            (a, ea), (b, eb) = args
            k = a.shape[1]
            value = a @ b
            mag = (np.abs(a) + ea) @ (np.abs(b) + eb)
            bound = ea @ np.abs(b) + np.abs(a) @ eb + ea @ eb + 2 * k * U32 * mag
        elif op.kind == "transpose":
            value, bound = args[0][0].T, args[0][1].T
        elif op.kind == "copy":
            value, bound = args[0]
        else:
            raise NotImplementedError(op.kind)
        env[op.output.index] = (value, bound)
    return env


def assert_close(actual: np.ndarray, value: np.ndarray, bound: np.ndarray, what: str = ""):
    assert actual.shape == value.shape, (what, actual.shape, value.shape)
    assert actual.dtype == np.float32, (what, actual.dtype)
    assert np.isfinite(actual).all(), f"{what}: non-finite values (unwritten output?)"
    err = np.abs(actual.astype(np.float64) - value)
    limit = bound + 1e-30
    worst = np.argmax(err - limit)
    assert (err <= limit).all(), (
        f"{what}: error {err.flat[worst]:.3e} exceeds bound {limit.flat[worst]:.3e} "
        f"at flat index {worst} (value {value.flat[worst]:.6e})")


def random_inputs(graph, rng) -> dict[str, np.ndarray]:
    return {name: rng.uniform(-1.0, 1.0, t.shape).astype(np.float32)
            for name, t in graph.inputs.items()}


def check_graph(prog, graph, rng, what=""):
    """Run `prog` on fresh random inputs and check every output against float64."""
    inputs = random_inputs(graph, rng)
    before = {k: v.copy() for k, v in inputs.items()}
    out = prog.run(**inputs)
    for k in inputs:  # the caller's arrays are never modified
        np.testing.assert_array_equal(inputs[k], before[k])
    env = evaluate(graph, inputs)
    assert set(out) == set(graph.outputs)
    for name, t in graph.outputs.items():
        value, bound = env[t.index]
        assert_close(out[name], value, bound, f"{what} output {name!r}")
    return inputs, out
