"""Streamed fp32 GEMMs (MK_FLAG_STREAM | MK_FLAG_STREAM_F32: at most 16 rows, B a graph input):
bands of 32 columns, B in boxes of 32 fp32 columns x 128 k-rows (a transpose's map) through the
weight ring, FMAs into the MMA accumulator layout, then the bf16 stream's reduce, combine and
store (device/ops/gemm_stream_f32.cuh)."""
import numpy as np
import pytest

import megak
from megak import abi, scheduler
from megak.ops import gemm
from megak.runtime import tensor_maps
from tests.ops.test_gemm_stream import N_SM, chain_inputs, compile_for, gemm_instrs, run_checked
from tests.random_dags import random_layer_chain
from tests.reference import random_inputs

STREAM = abi.FLAG_STREAM | abi.FLAG_STREAM_F32
COLS, BOX_ROWS = gemm.F32_COLS, gemm.BOX_ROWS


def f32_graph(m, k, n, bias=False, activation=None, residual=False, out_dtype=None):
    g = megak.Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    kw = {"activation": activation, "out_dtype": out_dtype}
    if bias:
        kw["bias"] = g.input("bias", (n,), "float32")
    if residual:
        kw["residual"] = g.input("res", (m, n), "float32")
    g.output(g.gemm(a, b, **kw), "c")
    return g


def chain_graph(m, widths, activation=None):
    g = megak.Graph()
    x = g.input("x", (m, widths[0]), "float32")
    for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
        x = g.gemm(x, g.input(f"w{i}", (k, n), "float32"), activation=activation)
        g.output(x, f"h{i}")
    return g


def assert_f32_streamed(plan, m, k, n):
    """Every GEMM record an fp32 band: 32 columns, all m rows, its parts tiling K in whole
    boxes (the last one short at K's end) and sharing one combine counter. Returns the parts."""
    ins = gemm_instrs(plan)
    flags = ins["flags"].astype(np.int64)
    assert ((flags & STREAM) == STREAM).all() and (flags & abi.FLAG_B_READY).all()
    assert not (flags & abi.FLAG_STREAM_NARROW).any()
    assert (ins["pages"] == gemm.STREAM_PAGES).all()
    parts = ins["param"] >> 16
    assert len(set(parts.tolist())) == 1
    p = int(parts[0])
    bands = -(-n // COLS)
    assert len(ins) == p * bands and (ins["rows"] == m).all() and (ins["row0"] == 0).all()
    for band in range(bands):
        mine = ins[ins["col0"] == band * COLS]
        assert len(mine) == p and (mine["cols"] == min(COLS, n - band * COLS)).all()
        order = np.argsort(mine["param"] & 0xFFFF)
        k0, kl = mine["k0"][order].astype(np.int64), mine["klen"][order].astype(np.int64)
        assert k0[0] == 0 and (k0[1:] == k0[:-1] + kl[:-1]).all() and k0[-1] + kl[-1] == k
        assert (k0 % BOX_ROWS == 0).all()
        if p > 1:
            assert len(set(mine["out_row0"].tolist())) == 1
    return p


# ---- numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [37, 200, 1024])
@pytest.mark.parametrize("k", [17, 300, 4096])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_f32_stream_matches_float64(backend, rng, m, k, n):
    g = f32_graph(m, k, n)
    prog = compile_for(g, backend)
    assert_f32_streamed(prog.plan, m, k, n)
    run_checked(prog, g, random_inputs(g, rng), f"fp32 stream {m}x{k}x{n}")


EPILOGUES = [dict(bias=True), dict(activation="relu"), dict(bias=True, activation="gelu"),
             dict(activation="silu", residual=True),
             dict(bias=True, activation="gelu", residual=True)]


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(f"{k}={v}" for k, v in e.items()))
# (1, 4096, 64): 2 bands of 32 boxes, 4 parts each (the combine); the others one part
@pytest.mark.parametrize("m,k,n", [(16, 1000, 200), (1, 4096, 64), (5, 300, 37)])
def test_f32_stream_epilogue(backend, rng, m, k, n, epi, out_dtype):
    g = f32_graph(m, k, n, out_dtype=out_dtype, **epi)
    prog = compile_for(g, backend)
    parts = assert_f32_streamed(prog.plan, m, k, n)
    assert parts == (4 if k == 4096 else 1)
    run_checked(prog, g, random_inputs(g, rng), f"fp32 stream {m}x{k}x{n} {epi} -> {out_dtype}")


def test_f32_stream_chain_runs_again_and_again(backend, rng):
    # the ring across layers, the combine counters across runs
    g = chain_graph(16, [1024, 1024, 512, 300, 4096, 64], activation="relu")
    prog = compile_for(g, backend)
    assert ((gemm_instrs(prog.plan)["flags"] & STREAM) == STREAM).all()
    for run in range(3):
        run_checked(prog, g, chain_inputs(g, rng), f"fp32 chain run {run}")


# ---- the lowering ------------------------------------------------------------------------------

def test_f32_split_rule():
    # bands of 32 columns; parts as for bf16: as few as keep a part within the ring's 10 boxes,
    # as many as the SMs allow past that
    assert gemm.F32_COLS == 32 and gemm.F32_STREAM_M == 16
    assert gemm.stream_split(16, 4096, 4096, "float32", True, 132) == (1, 4096)   # 128 bands
    assert gemm.stream_split(16, 1024, 1024, "float32", True, 132) == (1, 1024)   # 8 boxes
    assert gemm.stream_split(1, 4096, 64, "float32", True, 132) == (4, 1024)
    assert gemm.stream_split(16, 2048, 1024, "float32", True, 132) == (2, 1024)   # 16 boxes
    assert gemm.stream_split(17, 1024, 1024, "float32", True, 132) is None        # > 16 rows
    assert gemm.stream_split(16, 1024, 1024, "float32", False, 132) is None       # B produced


def test_f32_b_takes_a_transpose_box():
    # B's map: 32 fp32 columns x 128 rows, the 128-B swizzle: the transpose's, one ring page
    plan = scheduler.build_plan(f32_graph(16, 1000, 200), n_sm=N_SM)
    b = int(gemm_instrs(plan)["tensor"][0, abi.ARG_B])
    boxes = tensor_maps.map_boxes(plan.instrs)
    assert boxes == {b: tensor_maps.TRANSPOSE_READY}
    assert tensor_maps.box_shape(boxes[b]) == (COLS, BOX_ROWS, "128B")
    assert tensor_maps.map_dtype(boxes[b]) == abi.DTYPES["MK_DTYPE_F32"]
    assert plan.stream_pages == min(plan.n_pages - gemm.STREAM_PAGES,
                                    abi.OP_SHAPES["MK_STREAM_MAX_RING"])


def test_f32_constants_are_not_packed():
    from megak.runtime import packed_weights
    plan = scheduler.build_plan(f32_graph(16, 1000, 200), n_sm=N_SM)
    b = int(gemm_instrs(plan)["tensor"][0, abi.ARG_B])
    assert packed_weights.packed_forms(plan.instrs, {b}) == {}


def test_f32_record_check():
    plan = scheduler.build_plan(f32_graph(16, 1000, 200), n_sm=N_SM)
    rec = gemm_instrs(plan)[0].copy()
    assert gemm.OP.check_record(rec)
    for field, value in (("rows", 17), ("cols", COLS + 1)):
        bad = rec.copy()
        bad[field] = value
        assert not gemm.OP.check_record(bad), field
    bad = rec.copy()
    bad["flags"] |= abi.FLAG_STREAM_NARROW
    assert not gemm.OP.check_record(bad)


# ---- the device loop's layout (restates ops/gemm_stream_f32.cuh: change together) ------------

def _b_chunk(r, chunk):
    """Byte offset of k-row r's 16-B chunk `chunk` in a box page (the TMA's 128-B swizzle)."""
    return 128 * r + 16 * (chunk ^ (r & 7))


def test_f32_b_reads_cover_each_row_in_two_wavefronts():
    # lane (g, t) reads chunks t and t + 4 of a k-row: each load is 4 distinct 16-B chunks of
    # one 128-B row (a broadcast over g), the two together the whole row, each column once
    for r in range(BOX_ROWS):
        seen = []
        for which in (0, 1):
            addrs = {_b_chunk(r, t + 4 * which) for t in range(4)}
            assert len(addrs) == 4 and all(128 * r <= a < 128 * (r + 1) for a in addrs)
            seen += sorted(addrs)
        assert sorted(seen) == [128 * r + 16 * c for c in range(8)]


def test_f32_a_reads_are_one_wavefront():
    # rows g (and g + 8) at unit u of a chunk, 256 B a row (the ring's) or 512 (a copied
    # stage's): the 8 rows' 16-B units fall in 8 different bank groups
    for pitch, units in ((256, 16), (512, 32)):
        for u in range(units):
            for base in (0, 8):
                groups = {((base + g) * pitch + 16 * (u ^ ((base + g) & 7))) // 16 % 8
                          for g in range(8)}
                assert len(groups) == 8


def test_f32_sums_move_into_the_mma_layout():
    # c[h][j] of lane (g, t): row g + 8h, column 4t + j (j < 4) or 16 + 4t + j - 4; the two
    # shuffles per (n8, h, e) must leave acc[n8][2h + e] = row g + 8h, column 8 n8 + 2t + e
    def col_of(t, j):
        return 4 * t + j if j < 4 else 16 + 4 * t + j - 4
    c = np.zeros((32, 2, 8), dtype=np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for h in range(2):
            for j in range(8):
                c[lane, h, j] = 100 * (g + 8 * h) + col_of(t, j)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for n8 in range(4):
            src = (lane & ~3) | (2 * (n8 & 1) + (t >> 1))
            for h in range(2):
                for e in range(2):
                    lo, hi = c[src, h, 4 * (n8 >> 1) + e], c[src, h, 4 * (n8 >> 1) + 2 + e]
                    got = hi if t & 1 else lo
                    assert got == 100 * (g + 8 * h) + 8 * n8 + 2 * t + e


# ---- GPU only -----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_f32_stream_stress_random_chains():
    # random fp32 layer chains (batch 1..16, odd widths, epilogues) run again and again, every
    # result checked: the ring across instructions, the combine across runs
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(41)
    for case in range(10):
        g, m, widths = random_layer_chain(rng, "float32", [1, 3, 8, 9, 16],
                                          [37, 64, 100, 1000, 1024, 2048, 4096])
        prog = megak.compile(g, backend="cuda")
        assert ((gemm_instrs(prog.plan)["flags"] & STREAM) == STREAM).all()
        for run in range(5):
            run_checked(prog, g, chain_inputs(g, rng), f"chain {case} {widths} batch {m} run {run}")


@pytest.mark.gpu
@pytest.mark.parametrize("n_pages", [4, 5, 6, 9, 13])
def test_f32_stream_ring_sizes(n_pages):
    # rings of 0 (every stage copied by the op itself), 2, 3, 6 and 10 pages under
    # instructions of 1 to 32 stages, two warps a stage
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(50 + n_pages)
    for case, (m, widths) in enumerate([(16, [4096, 128, 1000, 64, 2048]),
                                        (1, [1024, 1024, 1024]), (9, [2048, 256, 3000])]):
        g = chain_graph(m, widths)
        prog = megak.compile(g, backend="cuda", n_pages=n_pages)
        ring = n_pages - gemm.STREAM_PAGES
        assert prog.plan.stream_pages == (min(ring, 10) if ring >= 2 else 0)
        for run in range(3):
            run_checked(prog, g, chain_inputs(g, rng), f"ring {prog.plan.stream_pages}, "
                                                       f"chain {case} {widths} batch {m} run {run}")
