import numpy as np
import pytest

import megak
from megak import abi
from megak.ops import copy
from tests.reference import check_graph


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (1, 4099), (300, 129), (1025, 257)])
def test_copy_is_exact(backend, rng, shape):
    g = megak.Graph()
    x = g.input("x", shape, "float32")
    g.output(g.copy(x), "y")
    prog = megak.compile(g, backend=backend, **({"n_sm": 4} if backend == "sim" else {}))
    inputs, out = check_graph(prog, g, rng, f"copy {shape}")
    np.testing.assert_array_equal(out["y"], inputs["x"])


def test_copy_chunks_are_large_and_cover_rows_once():
    g = megak.Graph()
    x = g.input("x", (5000, 1000), "float32")
    y = g.copy(x)
    low = copy.OP.lower(g.ops[y.producer])
    assert low.pages == copy.OP.pages == abi.OP_SHAPES["MK_COPY_PAGES"]
    r0, rn, c0, cn = low.tile_regions()
    assert (cn == 1000).all() and rn.sum() == 5000
    assert (rn[:-1] * 1000 * 4 >= copy.COPY_CHUNK_BYTES * 0.9).all()
