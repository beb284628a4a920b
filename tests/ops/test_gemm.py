import numpy as np
import pytest

import megak
from megak import abi
from megak.ops import gemm, reduce
from tests.reference import check_graph, check_outputs

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
    # b is a graph input: every GEMM instruction may have it loaded before its waits; at most
    # 16 rows stream it (tests/ops/test_gemm_stream_f32.py)
    assert (ins["flags"][is_gemm] & abi.FLAG_B_READY).all()
    stream = abi.FLAG_STREAM | abi.FLAG_STREAM_F32
    assert ((ins["flags"][is_gemm] & stream) == (stream if m <= 16 else 0)).all()
    flags = ins["flags"].astype(np.int64) & ~(abi.FLAG_B_READY | stream)
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


# ---- the short fp32 tile (device/ops/gemm_f32_short.cuh): <= 16 rows ------------------------
# (a B that is a graph input streams at these rows: each test here makes its B in the graph)

SHORT_ROWS = abi.OP_SHAPES["MK_GEMM_F32_SHORT_ROWS"]


def _made(g, name, shape):
    """A graph input copied by the graph: a B with a producer, which takes the tiles."""
    return g.copy(g.input(name, shape, "float32"))


def _gemm_records(prog):
    ins = prog.plan.instrs
    return ins[ins["opcode"] == abi.OPCODE_OF["gemm"]]


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 33, 130), (8, 96, 3), (9, 300, 257),
                                   (16, 1000, 130), (16, 4, 128), (5, 65, 200)])
def test_short_fp32_tiles(backend, rng, m, k, n):
    # 1-16 rows: every warp on the region's rows (the 8-row and 16-row k loops), K from one
    # partial slice to 32 (the ring's stages reused), column tails, the loader's first stages
    g = megak.Graph()
    a = g.input("a", (m, k), "float32")
    g.output(g.gemm(a, _made(g, "b", (k, n))), "c")
    prog = megak.compile(g, backend=backend, **({"n_sm": 3} if backend == "sim" else {}))
    assert all(gemm.f32_short(r) for r in _gemm_records(prog))
    out = {"c": np.full((m, n), np.nan, np.float32)}     # poisoned: every element written
    inputs = {"a": rng.uniform(-1, 1, (m, k)).astype(np.float32),
              "b": rng.uniform(-1, 1, (k, n)).astype(np.float32)}
    check_outputs(g, inputs, prog.run(out=out, **inputs), f"short fp32 {m}x{k}x{n}")


@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(f"{k}={v}" for k, v in e.items()) or "plain")
def test_short_fp32_chain_split_over_k(backend, rng, epi):
    # a batch-16 layer chain: split-K partials of 16 rows, their reduce and its epilogue, the
    # next layer's A produced (weights made in the graph: weights that are inputs stream)
    g = megak.Graph()
    x = g.input("x", (16, 512), "float32")
    for i, (k, n) in enumerate([(512, 1024), (1024, 256), (256, 200)]):
        kw = dict(epi)
        if kw.pop("bias", False):
            kw["bias"] = g.input(f"bias{i}", (n,), "float32")
        if kw.pop("residual", False):
            kw["residual"] = g.input(f"res{i}", (16, n), "float32")
        x = g.gemm(x, _made(g, f"w{i}", (k, n)), **kw)
        g.output(x, f"h{i}")
    prog = megak.compile(g, backend=backend, **({"n_sm": 40} if backend == "sim" else {}))
    recs = _gemm_records(prog)
    assert "reduce" in prog.stats["instructions_per_opcode"]
    assert all(gemm.f32_short(r) for r in recs)
    for run in range(2):
        check_graph(prog, g, rng, f"short fp32 chain {epi} run {run}")


def test_short_fp32_page_plan():
    # the loader fills B's first stages (before the wait: B_READY) and A's page after it;
    # the phases are the fp32 tile's with one staging page kept; 17 rows, or an origin off
    # 16 B, keep the 128 x 128 tile (the loader fills nothing)
    g = megak.Graph()
    x = g.input("x", (16, 1000), "float32")
    y = g.gemm(x, _made(g, "w", (1000, 300)))
    g.output(g.gemm(y, _made(g, "v", (300, 40))), "z")
    recs = _gemm_records(megak.compile(g, backend="sim", n_sm=2)).copy()
    recs["flags"] |= abi.FLAG_B_READY    # as for weights the stream does not take
    stages = abi.OP_SHAPES["MK_GEMM_F32_SHORT_STAGES"]
    preload = abi.OP_SHAPES["MK_GEMM_F32_SHORT_PRELOAD_STAGES"]
    slices = -(-int(recs[0]["klen"]) // abi.OP_SHAPES["MK_GEMM_BK"])
    assert slices > preload
    for rec in recs:
        p = gemm.OP.page_plan(rec, "float32")
        n = min(preload, -(-int(rec["klen"]) // abi.OP_SHAPES["MK_GEMM_BK"]))
        assert p.preload_early == tuple(range(n)) and p.preload_late == (stages,)
        assert p.early_reads == ((abi.ARG_B, int(rec["k0"]), int(rec["k0"]) + int(rec["klen"]),
                                  int(rec["col0"]), int(rec["col0"]) + int(rec["cols"])),)
        assert p.phases == (((0, 1, 2, 3), (1, 2, 3)), ((0,), (0,)))
    rec = recs[0].copy()
    for field, value in (("rows", SHORT_ROWS + 1), ("k0", 2), ("col0", 6)):
        odd = rec.copy()
        odd[field] = value
        assert not gemm.f32_short(odd)
        p = gemm.OP.page_plan(odd, "float32")
        assert p.preload_early == p.preload_late == () and p.early_reads == ()
    produced = rec.copy()
    produced["flags"] = int(rec["flags"]) & ~abi.FLAG_B_READY   # B made by the graph
    p = gemm.OP.page_plan(produced, "float32")
    assert p.preload_early == () and p.preload_late == tuple(range(preload)) + (stages,)


@pytest.mark.gpu
@pytest.mark.parametrize("what", ["a_offset", "b_offset", "a_ld", "aligned_padded"])
def test_short_fp32_caller_tensors(rng, what):
    # a caller's GPU tensors as they come, B a graph input, so streamed: A's origin off 16 B
    # or its row pitch not a multiple of 4 floats copy A with scalar loads, B's origin off
    # 16 B gets no tensor map (B copied by the op itself); padded, aligned rows take the ring
    torch = pytest.importorskip("torch")
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    m, k, n = 16, 300, 130
    g = megak.Graph()
    g.output(g.gemm(g.input("a", (m, k), "float32"), g.input("b", (k, n), "float32")), "c")
    prog = megak.compile(g, backend="cuda")
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)

    def placed(x, shift, pad):
        big = torch.full((x.shape[0], x.shape[1] + shift + pad), float("nan"),
                         dtype=torch.float32, device="cuda")
        view = big[:, shift:shift + x.shape[1]]
        view.copy_(torch.from_numpy(x))
        return view
    ta = placed(a, 1 if what == "a_offset" else 0, 1 if what == "a_ld" else
                4 if what == "aligned_padded" else 0)
    tb = placed(b, 3 if what == "b_offset" else 0, 2 if what == "aligned_padded" else 0)
    aligned = ta.data_ptr() % 16 == 0 and tb.data_ptr() % 16 == 0 and \
        ta.stride(0) % 4 == 0 and tb.stride(0) % 4 == 0
    assert aligned == (what == "aligned_padded")
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
    for _ in range(3):
        prog.run(a=ta, b=tb, out={"c": out})
        check_outputs(g, {"a": a, "b": b}, {"c": out.cpu().numpy()}, f"caller tensors {what}")
        out.fill_(float("nan"))


@pytest.mark.gpu
def test_short_fp32_stress_random_chains():
    # random fp32 layer chains of 1-16 rows (split or not, epilogues, odd widths) run again
    # and again: the loader's stages and the op's ring from instruction to instruction (the
    # weights made in the graph: weights that are inputs stream)
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(31)
    for case in range(10):
        m = int(rng.choice([1, 2, 7, 8, 9, 15, 16]))
        widths = [int(rng.choice([3, 64, 100, 257, 1000, 1024, 2048])) for _ in range(3)]
        g = megak.Graph()
        x = g.input("x", (m, widths[0]), "float32")
        for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
            x = g.gemm(x, _made(g, f"w{i}", (k, n)), activation="relu" if i % 2 else None)
            g.output(x, f"h{i}")
        prog = megak.compile(g, backend="cuda")
        assert all(gemm.f32_short(r) for r in _gemm_records(prog))
        for run in range(5):
            check_graph(prog, g, rng, f"chain {case} {widths} batch {m} run {run}")
