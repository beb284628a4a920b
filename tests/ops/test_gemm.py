import numpy as np
import pytest

import megak
from megak.ops import gemm
from tests.reference import check_graph

SHAPES = [(1, 1, 1), (7, 5, 3), (129, 7, 130), (300, 129, 1), (128, 128, 128),
          (257, 300, 129), (1, 300, 7), (64, 1, 200)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_gemm_matches_float64(backend, rng, m, k, n):
    g = megak.Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    g.output(g.gemm(a, b), "c")
    prog = megak.compile(g, backend=backend, **({"n_sm": 5} if backend == "sim" else {}))
    _, out = check_graph(prog, g, rng, f"gemm {m}x{k}x{n}")
    assert out["c"].shape == (m, n) and out["c"].dtype == np.float32


def test_gemm_lowering_tiles_cover_output_once():
    g = megak.Graph()
    a = g.input("a", (300, 50), "float32")
    b = g.input("b", (50, 129), "float32")
    c = g.gemm(a, b)
    low = gemm.lower(g.ops[c.producer])
    cover = np.zeros((300, 129), dtype=int)
    for r0, rn, c0, cn in zip(*low.tile_regions()):
        assert rn <= gemm.TILE_M and cn <= gemm.TILE_N
        cover[r0:r0 + rn, c0:c0 + cn] += 1
    assert (cover == 1).all()
    assert low.n == 3 * 2 and low.pages == gemm.PAGES
    assert (low.cost_ns > 0).all()


def test_gemm_reference_is_float64():
    a = np.ones((2, 3), np.float32)
    assert gemm.reference(a, a.T).dtype == np.float64
