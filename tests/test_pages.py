import pytest

import megak
from megak import GraphError, abi, pages


def test_hopper_gets_13_pages():
    assert pages.pages_for(232_448) == 13
    assert pages.smem_bytes(13) <= 232_448


@pytest.mark.parametrize("optin,expected", [(101_376, 5), (166_912, 9), (49_152, 1),
                                            (17_000, 0)])
def test_smaller_gpus_get_fewer_pages(optin, expected):
    n = pages.pages_for(optin)
    assert n == expected
    assert pages.smem_bytes(n) <= optin or n == 0


def test_static_smem_is_subtracted():
    assert pages.pages_for(232_448, static_smem_bytes=1024) == 13
    assert pages.pages_for(232_448, static_smem_bytes=4096) == 12


def test_instruction_needing_more_pages_than_exist_is_rejected():
    g = megak.Graph()
    a = g.input("a", (17, 17), "float32")   # > 16 rows: a tile, not the stream's 3 pages
    g.output(g.gemm(a, a), "y")
    with pytest.raises(GraphError, match=r"needs 4 shared-memory pages .* n_pages=3 per SM"):
        megak.compile(g, backend="sim", n_pages=3)


def test_gemm_runs_with_the_fewest_pages_it_needs(rng):
    import numpy as np
    g = megak.Graph()
    a = g.input("a", (130, 20), "float32")
    g.output(g.gemm(a, g.transpose(a)), "y")
    prog = megak.compile(g, backend="sim", n_sm=3,
                         n_pages=abi.OP_SHAPES["MK_GEMM_PAGES"])
    x = rng.standard_normal((130, 20)).astype(np.float32)
    np.testing.assert_allclose(prog.run(a=x)["y"], x.astype(np.float64) @ x.T,
                               rtol=1e-5, atol=1e-4)
    assert max(prog._executor.last_peak_pages) <= 4
