import numpy as np
import pytest

import megak
from megak.ops import transpose
from tests.reference import check_graph


@pytest.mark.parametrize("shape", [(1, 1), (1, 300), (300, 1), (7, 129), (64, 64), (129, 65),
                                   (128, 128), (257, 131), (300, 257)])
def test_transpose_matches_float64(backend, rng, shape):
    g = megak.Graph()
    x = g.input("x", shape, "float32")
    g.output(g.transpose(x), "y")
    prog = megak.compile(g, backend=backend, **({"n_sm": 3} if backend == "sim" else {}))
    inputs, out = check_graph(prog, g, rng, f"transpose {shape}")
    np.testing.assert_array_equal(out["y"], inputs["x"].T)  # exact: no arithmetic


def test_transpose_lowering_covers_output_once():
    g = megak.Graph()
    x = g.input("x", (130, 70), "float32")
    y = g.transpose(x)
    low = transpose.OP.lower(g.ops[y.producer])
    cover = np.zeros((70, 130), dtype=int)
    for r0, rn, c0, cn in zip(*low.tile_regions()):
        assert rn <= transpose.TILE and cn <= transpose.TILE * transpose.MAX_TILES
        cover[r0:r0 + rn, c0:c0 + cn] += 1
    assert (cover == 1).all()
    # each tile reads the mirrored region of x
    reads = low.reads[0]
    r0, rn, c0, cn = low.tile_regions()
    np.testing.assert_array_equal(reads.r0, c0)
    np.testing.assert_array_equal(reads.c1, r0 + rn)


@pytest.mark.parametrize("shape", [(300, 1100), (256, 512), (129, 640)])
def test_transpose_of_several_tiles_per_instruction(backend, rng, shape):
    """Few SMs for many tiles: MAX_TILES tiles side by side per instruction, the second's
    loads in flight while the first is stored; partial tiles at the edges."""
    g = megak.Graph()
    x = g.input("x", shape, "float32")
    g.output(g.transpose(x), "y")
    prog = megak.compile(g, backend=backend, n_sm=2)
    assert (prog.plan.instrs["cols"] > transpose.TILE).any()
    inputs, out = check_graph(prog, g, rng, f"transpose {shape}")
    np.testing.assert_array_equal(out["y"], inputs["x"].T)
