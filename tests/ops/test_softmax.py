import numpy as np
import pytest

import megak
from megak import abi
from tests.reference import check_graph

SHAPES = [(1, 1), (7, 3), (1, 4099), (300, 129), (130, 1000)]


def opts(backend):
    return {"n_sm": 5} if backend == "sim" else {}


def graph(shape, dtype="float32", **kw):
    g = megak.Graph()
    x = g.input("x", shape, dtype)
    y = g.softmax(x, **kw)
    assert y.shape == shape and y.dtype == dtype
    g.output(y, "y")
    return g


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_matches_float64(backend, rng, shape, dtype):
    g = graph(shape, dtype)
    prog = megak.compile(g, backend=backend, **opts(backend))
    _, out = check_graph(prog, g, rng, f"softmax {shape} {dtype}")
    rows = out["y"].astype(np.float64).sum(axis=1)
    assert np.allclose(rows, 1.0, atol=shape[1] * 2.0 ** -7)


@pytest.mark.parametrize("shape", [(5, 5), (3, 9), (9, 3), (200, 300)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_causal_softmax_masks_the_future(backend, rng, shape, dtype):
    g = graph(shape, dtype, scale=0.125, causal=True)
    prog = megak.compile(g, backend=backend, **opts(backend))
    _, out = check_graph(prog, g, rng, f"causal softmax {shape}")
    y = out["y"].astype(np.float64)
    future = np.arange(shape[1])[None, :] > np.arange(shape[0])[:, None]
    assert (y[future] == 0).all() and (y[~future] > 0).all()
    assert (prog.plan.instrs["flags"] & abi.FLAG_CAUSAL).all()


def test_softmax_scale_and_large_values(backend, rng):
    # values of +-80 with scale 4: exp overflows unless the row max is subtracted
    g = graph((33, 257), scale=4.0)
    prog = megak.compile(g, backend=backend, **opts(backend))
    x = rng.uniform(-80, 80, (33, 257)).astype(np.float32)
    y = prog.run(x=x)["y"].astype(np.float64)
    v = 4.0 * x.astype(np.float64)
    e = np.exp(v - v.max(axis=1, keepdims=True))
    ref = e / e.sum(axis=1, keepdims=True)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kw,match", [
    (dict(scale=float("nan")), "scale must be a finite number"),
    (dict(scale=1e300), "scale must be a finite number"),
    (dict(scale="2"), "scale must be a finite number"),
    (dict(causal=1), "causal must be True or False"),
])
def test_softmax_checks_its_arguments(kw, match):
    g = megak.Graph()
    x = g.input("x", (4, 4))
    with pytest.raises(megak.GraphError, match=match):
        g.softmax(x, **kw)
    with pytest.raises(megak.GraphError, match="must be 2-D"):
        g.softmax(g.input("v", (4,)))
