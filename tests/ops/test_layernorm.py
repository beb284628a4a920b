import numpy as np
import pytest

import megak
from tests.reference import check_graph

SHAPES = [(1, 1), (7, 3), (1, 4099), (300, 129), (130, 1000)]


def opts(backend):
    return {"n_sm": 5} if backend == "sim" else {}


def graph(shape, dtype="float32", vec_dtype=None, vector="1d", **kw):
    g = megak.Graph()
    n = shape[1]
    x = g.input("x", shape, dtype)
    vshape = (n,) if vector == "1d" else (1, n)
    w = g.input("w", vshape, vec_dtype or dtype)
    b = g.input("b", vshape, vec_dtype or dtype)
    y = g.layernorm(x, w, b, **kw)
    assert y.shape == shape and y.dtype == dtype
    g.output(y, "y")
    return g


@pytest.mark.parametrize("dtype,vec_dtype", [("float32", None), ("bfloat16", None),
                                             ("bfloat16", "float32")])
@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm_matches_float64(backend, rng, shape, dtype, vec_dtype):
    g = graph(shape, dtype, vec_dtype)
    prog = megak.compile(g, backend=backend, **opts(backend))
    check_graph(prog, g, rng, f"layernorm {shape} {dtype}")


def test_layernorm_is_stable_far_from_zero(backend, rng):
    # mean 1000, std ~0.3: E[x^2] - mean^2 would cancel every digit in fp32
    g = graph((64, 513), vector="row", eps=1e-6)
    prog = megak.compile(g, backend=backend, **opts(backend))
    x = (1000 + rng.uniform(-0.5, 0.5, (64, 513))).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (1, 513)).astype(np.float32)
    b = rng.uniform(-1, 1, (1, 513)).astype(np.float32)
    y = prog.run(x=x, w=w, b=b)["y"].astype(np.float64)
    xd = x.astype(np.float64)
    d = xd - xd.mean(axis=1, keepdims=True)
    ref = d / np.sqrt((d * d).mean(axis=1, keepdims=True) + 1e-6) * w + b
    # the input itself carries 2^-24 * 1000 of rounding: relative to std 0.3, ~2e-4
    np.testing.assert_allclose(y, ref, rtol=0, atol=2e-3)


def test_layernorm_checks_its_arguments():
    g = megak.Graph()
    x = g.input("x", (4, 6))
    w, b = g.input("w", (6,)), g.input("b", (6,))
    with pytest.raises(megak.GraphError, match=r"weight must have shape \(6,\) or \(1, 6\)"):
        g.layernorm(x, g.input("w2", (4, 6)), b)
    with pytest.raises(megak.GraphError, match="eps must be a positive finite number"):
        g.layernorm(x, w, b, eps=0)
    with pytest.raises(megak.GraphError, match="eps must be a positive finite number"):
        g.layernorm(x, w, b, eps=-1e-5)
