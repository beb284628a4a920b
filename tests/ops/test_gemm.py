import numpy as np
import pytest

import megak
from megak import abi
from megak.ops import gemm, reduce
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
    low = gemm.OP.lower(g.ops[c.producer])
    cover = np.zeros((300, 129), dtype=int)
    for r0, rn, c0, cn in zip(*low.tile_regions()):
        assert rn <= gemm.TILE_M and cn <= gemm.TILE_N
        cover[r0:r0 + rn, c0:c0 + cn] += 1
    assert (cover == 1).all()
    assert low.n == 3 * 2 and low.pages == gemm.OP.pages
    assert (low.cost_ns > 0).all()


def test_gemm_reference_is_float64():
    a = np.ones((2, 3), np.float32)
    assert gemm.reference(a, a.T).dtype == np.float64


EPILOGUES = [dict(), dict(bias=True), dict(activation="relu"), dict(bias=True, activation="gelu"),
             dict(activation="silu", residual=True),
             dict(bias=True, activation="gelu", residual=True)]


def epilogue_graph(m, k, n, dtype="float32", out_dtype=None, bias=False, activation=None,
                   residual=False, bias_1d=True):
    g = megak.Graph()
    a = g.input("a", (m, k), dtype)
    b = g.input("b", (k, n), dtype)
    kw = {"activation": activation, "out_dtype": out_dtype}
    if bias:
        kw["bias"] = g.input("bias", (n,) if bias_1d else (1, n), dtype)
    if residual:
        kw["residual"] = g.input("res", (m, n), "float32")
    g.output(g.gemm(a, b, **kw), "c")
    return g


@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(f"{k}={v}" for k, v in e.items()) or "plain")
@pytest.mark.parametrize("m,k,n", [(129, 7, 130), (1, 300, 7), (200, 64, 257)])
def test_fused_epilogue_fp32(backend, rng, m, k, n, epi):
    g = epilogue_graph(m, k, n, **epi)
    prog = megak.compile(g, backend=backend, **({"n_sm": 4} if backend == "sim" else {}))
    check_graph(prog, g, rng, f"gemm+{epi}")
    ins = prog.plan.instrs
    want = gemm.epilogue_flags(g.ops[0])
    by_op = prog.stats["instructions_per_opcode"]
    is_gemm = ins["opcode"] == abi.OPCODE_OF["gemm"]
    # b is a graph input: every GEMM instruction may have it loaded before its waits
    assert (ins["flags"][is_gemm] & abi.FLAG_B_READY).all()
    flags = ins["flags"].astype(np.int64) & ~abi.FLAG_B_READY
    if "reduce" in by_op:   # split-K: plain partials, the epilogue fused into the reduce
        assert (flags[is_gemm] == 0).all()
        assert (flags[ins["opcode"] == reduce.OP.opcode] == want).all()
    else:                   # one fused instruction per tile
        assert (flags == want).all() and by_op == {"gemm": len(ins)}


# n_pages 8: too few for the wgmma tiles, the mma.sync tiles run instead
@pytest.mark.parametrize("n_pages", [None, 8], ids=["wgmma", "mma_sync"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (129, 300, 130), (16, 1024, 256),
                                   (300, 129, 1)])
def test_bf16_gemm(backend, rng, m, k, n, out_dtype, n_pages):
    g = epilogue_graph(m, k, n, dtype="bfloat16", out_dtype=out_dtype)
    opts = {"n_sm": 4} if backend == "sim" else {}
    if n_pages:
        opts["n_pages"] = n_pages
    prog = megak.compile(g, backend=backend, **opts)
    _, out = check_graph(prog, g, rng, f"bf16 gemm {m}x{k}x{n} -> {out_dtype}")
    assert out["c"].dtype == megak.dtypes.numpy_dtype(out_dtype)
    ins = prog.plan.instrs
    g_ins = ins[ins["opcode"] == abi.OPCODE_OF["gemm"]]
    streamed = (g_ins["flags"] & abi.FLAG_STREAM) != 0   # <= 64 rows: tests/ops/test_gemm_stream.py
    assert streamed.all() == (m <= gemm.STREAM_M)
    wide = (g_ins["flags"] & abi.FLAG_WGMMA) != 0        # tests/ops/test_gemm_wgmma.py
    assert (wide == (~streamed & (n_pages is None))).all()
    assert (g_ins["pages"] == np.where(streamed, gemm.STREAM_PAGES,
                                       np.where(wide, gemm.WGMMA_PAGES,
                                                gemm.PAGES_BY_DTYPE["bfloat16"]))).all()


@pytest.mark.parametrize("epi", EPILOGUES[1:], ids=lambda e: "+".join(e))
def test_bf16_gemm_with_epilogue(backend, rng, epi):
    g = epilogue_graph(130, 96, 200, dtype="bfloat16", bias_1d=False, **epi)
    prog = megak.compile(g, backend=backend, **({"n_sm": 4} if backend == "sim" else {}))
    check_graph(prog, g, rng, f"bf16 gemm+{epi}")


def test_epilogue_arguments_are_checked():
    g = megak.Graph()
    a = g.input("a", (4, 3), "float32")
    b = g.input("b", (3, 5), "float32")
    with pytest.raises(megak.GraphError, match="unknown activation 'tanh'; allowed: None, 'relu', 'gelu', 'silu'"):
        g.gemm(a, b, activation="tanh")
    with pytest.raises(megak.GraphError, match=r"bias must have shape \(5,\) or \(1, 5\)"):
        g.gemm(a, b, bias=g.input("bias", (4,), "float32"))
    with pytest.raises(megak.GraphError, match=r"residual must have shape \(4, 5\)"):
        g.gemm(a, b, residual=g.input("r", (5, 4), "float32"))
    with pytest.raises(megak.GraphError, match="allowed: float32, bfloat16"):
        g.gemm(a, b, out_dtype="float16")


def test_epilogue_dependencies_are_tile_level():
    # bias and residual produced by earlier ops: each tile waits only on what it reads
    g = megak.Graph()
    a = g.input("a", (256, 64), "float32")
    w = g.input("w", (64, 256), "float32")
    r = g.gemm(a, w)                                       # residual, 2 x 2 tiles
    bias = g.copy(g.input("bias", (1, 256), "float32"))     # one row
    g.output(g.gemm(a, w, bias=bias, residual=r, activation="relu"), "y")
    from megak import scheduler
    plan = scheduler.build_plan(g, n_sm=4)
    last = plan.instrs[plan.instrs["op_index"] == 2]
    assert (last["n_waits"] == 2).all()       # one residual tile + one bias chunk


def test_activations_far_out_reach_their_limits_without_warnings():
    """Past about -88 silu's exp(-v), and past about 7e12 gelu's cube, overflow in fp32 (as on
    the device); the simulator's epilogue gives the limit and no overflow warning."""
    import warnings
    from megak.ops._epilogue import activation
    v = np.array([-1e13, -200.0, -90.0, 0.0, 3.0, 1e13], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        silu, gelu = activation(v, "silu"), activation(v, "gelu")
    assert silu.dtype == gelu.dtype == np.float32
    np.testing.assert_array_equal(silu[:4], 0.0)
    np.testing.assert_array_equal(gelu[:4], 0.0)
    np.testing.assert_allclose(silu[4:], [3.0 / (1.0 + np.exp(-3.0)), 1e13], rtol=1e-6)
    np.testing.assert_allclose(gelu[5], 1e13, rtol=1e-6)
