import numpy as np
import pytest

import megak
from tests.reference import check_graph

SHAPES = [(1, 1), (7, 3), (1, 4099), (300, 129), (130, 1000)]


def opts(backend):
    return {"n_sm": 5} if backend == "sim" else {}


def graph(shape, dtype="float32", w_dtype=None, **kw):
    g = megak.Graph()
    x = g.input("x", shape, dtype)
    w = g.input("w", (shape[1],), w_dtype or dtype)
    y = g.rmsnorm(x, w, **kw)
    assert y.shape == shape and y.dtype == dtype
    g.output(y, "y")
    return g


@pytest.mark.parametrize("dtype,w_dtype", [("float32", None), ("bfloat16", None),
                                           ("float32", "bfloat16")])
@pytest.mark.parametrize("shape", SHAPES)
def test_rmsnorm_matches_float64(backend, rng, shape, dtype, w_dtype):
    g = graph(shape, dtype, w_dtype)
    prog = megak.compile(g, backend=backend, **opts(backend))
    check_graph(prog, g, rng, f"rmsnorm {shape} {dtype}")


def test_rmsnorm_eps_dominates_tiny_rows(backend):
    g = graph((3, 40), eps=1.0)
    prog = megak.compile(g, backend=backend, **opts(backend))
    x = np.full((3, 40), 1e-3, np.float32)
    w = np.ones(40, np.float32)
    y = prog.run(x=x, w=w)["y"]
    np.testing.assert_allclose(y, 1e-3 / np.sqrt(1e-6 + 1.0), rtol=1e-6)


def test_rmsnorm_checks_its_arguments():
    g = megak.Graph()
    x = g.input("x", (4, 6))
    with pytest.raises(megak.GraphError, match=r"weight must have shape \(6,\) or \(1, 6\)"):
        g.rmsnorm(x, g.input("w", (5,)))
    with pytest.raises(megak.GraphError, match="eps must be a positive finite number"):
        g.rmsnorm(x, g.input("w2", (6,)), eps=float("inf"))
