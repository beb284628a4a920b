"""float64 references with explicit error bounds for fp32 results.

A fp32 dot product of length K, summed in any order, is within K * u * (|a| . |b|) of the
exact value (u = 2^-24, the unit roundoff; we allow 2u per step for the rounding of the
inputs' products). Chained ops add their bounds; transpose and copy are exact. So every test
states its tolerance as that bound, not as a guessed rtol.
"""
from __future__ import annotations

import numpy as np

from megak.dtypes import UNIT_ROUNDOFF, numpy_dtype
from megak.ops.gemm import activation

U32 = 2.0 ** -24
# |act'| bounds: how much an error in the activation's input can grow
LIPSCHITZ = {None: 1.0, "relu": 1.0, "gelu": 1.13, "silu": 1.1}


def evaluate(graph, inputs: dict[str, np.ndarray]):
    """Evaluate `graph` in float64. Returns {tensor index: (value, bound)} where bound is an
    elementwise upper limit on |fp32 result - value|."""
    env = {}
    for name, t in graph.inputs.items():
        env[t.index] = (np.asarray(inputs[name]).astype(np.float64).reshape(t.shape),
                        np.zeros(t.shape))
    for op in graph.ops:
        args = [env[t.index] for t in op.inputs]
        if op.kind == "gemm":
            (a, ea), (b, eb) = args[:2]
            rest = list(args[2:])
            k = a.shape[1]
            value = a @ b
            mag = (np.abs(a) + ea) @ (np.abs(b) + eb)
            bound = ea @ np.abs(b) + np.abs(a) @ eb + ea @ eb + 2 * k * U32 * mag
            if op.attrs.get("bias"):
                bias, eb_ = rest.pop(0)
                value = value + bias.reshape(1, -1)
                bound = bound + eb_.reshape(1, -1) + U32 * (np.abs(value) + bound)
            act = op.attrs.get("activation")
            if act:
                # fp32 evaluation of tanh / exp costs a few ulps of the result and input
                bound = LIPSCHITZ[act] * bound + 8 * U32 * (np.abs(value) + 1.0)
                value = activation(value, act)
            if op.attrs.get("residual"):
                res, er = rest.pop(0)
                value = value + res
                bound = bound + er + U32 * (np.abs(value) + bound)
            # one rounding to the output dtype (fp32 rounding is inside the K bound already)
            if op.output.dtype != "float32":
                bound = bound + UNIT_ROUNDOFF[op.output.dtype] * (np.abs(value) + bound)
        elif op.kind == "transpose":
            value, bound = args[0][0].T, args[0][1].T
        elif op.kind == "copy":
            value, bound = args[0]
        else:
            raise NotImplementedError(op.kind)
        env[op.output.index] = (value, bound)
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
    env = evaluate(graph, inputs)
    assert set(out) == set(graph.outputs)
    for name, t in graph.outputs.items():
        value, bound = env[t.index]
        assert_close(out[name], value, bound, f"{what} output {name!r}", t.dtype)
    return inputs, out


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
