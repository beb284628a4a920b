"""Skinny bf16 GEMMs (M <= MK_GEMM_SKINNY_M): one instruction per narrow column band of all
rows over the whole K (device/ops/gemm_bf16_skinny.cuh), never split-K; and MK_FLAG_B_READY on
every GEMM instruction whose B is a graph input."""
import numpy as np
import pytest

import megak
from megak import abi, scheduler
from megak.dtypes import numpy_dtype
from megak.ops import gemm, reduce
from megak.ops._lowering import cost_ns
from tests import sass
from tests.reference import assert_close, evaluate, nan_outside_tile, random_inputs

N_SM = 132   # an H200's SM count: the band width depends on it


def skinny_graph(m, k, n, out_dtype=None, bias=False, activation=None, residual=False,
                 dtype="bfloat16"):
    g = megak.Graph()
    a = g.input("a", (m, k), dtype)
    b = g.input("b", (k, n), dtype)
    kw = {"activation": activation, "out_dtype": out_dtype}
    if bias:
        kw["bias"] = g.input("bias", (n,), "bfloat16")
    if residual:
        kw["residual"] = g.input("res", (m, n), "float32")
    g.output(g.gemm(a, b, **kw), "c")
    return g


def run_checked(prog, g, inputs, what):
    """Run with every output poisoned (NaN) first; compare to float64 within the bound."""
    out = {name: np.full(t.shape, np.nan, dtype=numpy_dtype(t.dtype))
           for name, t in g.outputs.items()}
    res = prog.run(out=out, **inputs)
    env = evaluate(g, inputs)
    for name, t in g.outputs.items():
        value, bound = env[t.index]
        assert_close(res[name], value, bound, f"{what} output {name!r}", t.dtype)
    return res


def compile_for(g, backend, n_sm=N_SM):
    return megak.compile(g, backend=backend, **({"n_sm": n_sm} if backend == "sim" else {}))


def gemm_instrs(plan):
    return plan.instrs[plan.instrs["opcode"] == abi.OPCODE_OF["gemm"]]


def assert_skinny(plan, m, k, n, width):
    ins = gemm_instrs(plan)
    assert "reduce" not in scheduler.stats(plan)["instructions_per_opcode"]
    assert len(ins) == -(-n // width)
    assert (ins["row0"] == 0).all() and (ins["rows"] == m).all() and (ins["out_row0"] == 0).all()
    assert (ins["k0"] == 0).all() and (ins["klen"] == k).all()
    assert (ins["pages"] == abi.OP_SHAPES["MK_GEMM_PAGES"]).all()
    order = np.argsort(ins["col0"])
    col0, cols = ins["col0"][order].astype(np.int64), ins["cols"][order].astype(np.int64)
    assert col0[0] == 0 and (col0[1:] == col0[:-1] + cols[:-1]).all() and col0[-1] + cols[-1] == n
    assert (cols[:-1] == width).all() and 1 <= cols[-1] <= width <= gemm.SKINNY_MAX_N


# ---- numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [37, 200])
@pytest.mark.parametrize("k", [1, 17, 1000, 1024, 4096])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_skinny_matches_float64(backend, rng, m, k, n):
    g = skinny_graph(m, k, n)
    prog = compile_for(g, backend)
    assert_skinny(prog.plan, m, k, n, gemm.skinny_cols(m, n, "bfloat16", prog.plan.n_sm))
    out = run_checked(prog, g, random_inputs(g, rng), f"skinny {m}x{k}x{n}")
    assert out["c"].shape == (m, n) and out["c"].dtype == numpy_dtype("bfloat16")


EPILOGUES = [dict(bias=True), dict(activation="relu"), dict(bias=True, activation="gelu"),
             dict(activation="silu", residual=True),
             dict(bias=True, activation="gelu", residual=True)]


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("m,k,n", [(16, 1024, 200), (5, 1000, 37), (1, 17, 37), (16, 4096, 37)])
def test_skinny_epilogue(backend, rng, m, k, n, epi, out_dtype):
    g = skinny_graph(m, k, n, out_dtype=out_dtype, **epi)
    prog = compile_for(g, backend)
    out = run_checked(prog, g, random_inputs(g, rng), f"skinny {m}x{k}x{n} {epi} -> {out_dtype}")
    assert out["c"].dtype == numpy_dtype(out_dtype)
    ins = gemm_instrs(prog.plan)
    assert (ins["flags"].astype(np.int64) & ~abi.FLAG_B_READY
            == gemm.epilogue_flags(next(op for op in g.ops if op.kind == "gemm"))).all()


@pytest.mark.parametrize("n_sm", [1, 4, 132])
def test_skinny_on_few_sms(rng, n_sm):
    # fewer SMs than bands: the widest band, several bands per SM
    g = skinny_graph(16, 300, 200, bias=True, activation="relu", out_dtype="float32")
    prog = megak.compile(g, backend="sim", n_sm=n_sm)
    assert_skinny(prog.plan, 16, 300, 200, gemm.skinny_cols(16, 200, "bfloat16", n_sm))
    run_checked(prog, g, random_inputs(g, rng), f"skinny on {n_sm} SMs")


# ---- lowering ---------------------------------------------------------------------------------

def test_band_width_rule():
    assert gemm.SKINNY_M == 16 and gemm.SKINNY_MAX_N == 32 and gemm.SKINNY_WIDTHS == (8, 16, 32)
    assert gemm.skinny_cols(16, 1024, "bfloat16", 132) == 8      # 128 bands of 8
    assert gemm.skinny_cols(16, 1056, "bfloat16", 132) == 8      # 132 bands: still fits
    assert gemm.skinny_cols(16, 1057, "bfloat16", 132) == 16
    assert gemm.skinny_cols(16, 2048, "bfloat16", 132) == 16
    assert gemm.skinny_cols(16, 4096, "bfloat16", 132) == 32     # 128 bands of 32
    assert gemm.skinny_cols(16, 8192, "bfloat16", 132) == 32     # 256 bands: widest anyway
    assert gemm.skinny_cols(1, 37, "bfloat16", 4) == 16
    assert gemm.skinny_cols(16, 37, "bfloat16", 1) == 32
    assert gemm.skinny_cols(17, 1024, "bfloat16", 132) is None   # M > 16: tiles
    assert gemm.skinny_cols(16, 1024, "float32", 132) is None    # fp32: tiles / split-K


@pytest.mark.parametrize("m,k,n", [(16, 1024, 1024), (16, 4096, 4096), (1, 1000, 37),
                                   (5, 17, 200), (16, 8192, 8192)])
def test_bf16_few_rows_lower_to_skinny_bands(m, k, n):
    plan = scheduler.build_plan(skinny_graph(m, k, n), n_sm=N_SM)
    assert_skinny(plan, m, k, n, gemm.skinny_cols(m, n, "bfloat16", N_SM))


@pytest.mark.parametrize("m,dtype", [(16, "float32"), (17, "bfloat16"), (64, "bfloat16")])
def test_fp32_or_more_rows_keep_tiles(m, dtype):
    g = skinny_graph(m, 1024, 1024, dtype=dtype)
    units, _, _ = scheduler.lowering_units(g, N_SM)
    assert not any(u.attrs.get("skinny") for u in units)
    plan = scheduler.build_plan(g, n_sm=N_SM)
    ins = gemm_instrs(plan)
    assert (ins["cols"] == gemm.TILE_N).all()                     # 128 x 128 tiles
    # few output tiles: split-K partials and a reduce, as before
    assert "reduce" in scheduler.stats(plan)["instructions_per_opcode"]


def test_skinny_is_never_split():
    # this shape would be split 8 ways as fp32 (tests/ops/test_reduce.py)
    assert gemm.split_k_factor(16, 1024, 1024, N_SM)[0] > 1
    plan = scheduler.build_plan(skinny_graph(16, 1024, 1024), n_sm=N_SM)
    assert not any("split-K" in label for label in plan.op_labels)
    assert not any(t.name.endswith("_partials") for t in plan.tensors)
    assert (plan.instrs["opcode"] != reduce.OP.opcode).all()


def test_skinny_cost_model():
    g = skinny_graph(16, 4096, 4096, out_dtype="float32")
    units, _, _ = scheduler.lowering_units(g, N_SM)
    low = gemm.OP.lower(units[0])
    cols = 32
    nbytes = 4096 * cols * 2 + 16 * 4096 * 2 + 16 * cols * 4
    flops = 2 * 16 * cols * 4096
    want = cost_ns(flops, nbytes, tensor_cores=True)
    assert np.allclose(low.cost_ns, want)
    assert low.flops == 2.0 * 16 * 4096 * 4096


def test_band_dependencies():
    # a band consumer of the full activations waits on the whole previous layer with one
    # counter; a residual band waits only on the producer band with the same columns
    g = megak.Graph()
    x = g.input("x", (16, 256), "bfloat16")
    h = g.gemm(x, g.input("w1", (256, 256), "bfloat16"))
    y = g.gemm(h, g.input("w2", (256, 256), "bfloat16"), residual=h)
    g.output(y, "y")
    plan = scheduler.build_plan(g, n_sm=N_SM)
    ins = plan.instrs
    first, second = ins[ins["op_index"] == 0], ins[ins["op_index"] == 1]
    assert len(first) == len(second) == 256 // 8
    assert (first["n_waits"] == 0).all() and (second["n_waits"] == 2).all()
    sig = {int(c): (int(r["col0"]), int(r["cols"]))
           for r in first for c in r["signal_counter"][:r["n_signals"]]}
    for r in second:
        waits = dict(zip(r["wait_counter"][:2].tolist(), r["wait_target"][:2].tolist()))
        targets = sorted(waits.values())
        assert targets == [1, len(first)]         # one tile counter, one whole-layer counter
        tile = next(c for c, t in waits.items() if t == 1)
        assert sig[tile] == (int(r["col0"]), int(r["cols"]))


def test_mlp_chain_has_no_reduce_and_is_correct(backend, rng):
    # benchmarks W2 (bf16, batch 16, 16 layers of 1024 x 1024), every layer an output
    layers, hidden, batch = 16, 1024, 16
    g = megak.Graph()
    x = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        x = g.gemm(x, g.input(f"w{i}", (hidden, hidden), "bfloat16"))
        g.output(x, f"h{i}")
    prog = compile_for(g, backend)
    width = gemm.skinny_cols(batch, hidden, "bfloat16", prog.plan.n_sm)   # 8 on 132 SMs
    by_op = prog.stats["instructions_per_opcode"]
    assert by_op == {"gemm": layers * -(-hidden // width)}
    ins = prog.plan.instrs
    assert (ins["rows"] == batch).all() and (ins["cols"] == width).all()
    assert (ins["klen"] == hidden).all()
    # weights are graph inputs: all loadable before the waits
    assert (ins["flags"] & abi.FLAG_B_READY).all()
    # every layer after the first waits on the previous one with one counter
    assert (ins["n_waits"][ins["op_index"] == 0] == 0).all()
    assert (ins["n_waits"][ins["op_index"] > 0] == 1).all()
    bf16 = numpy_dtype("bfloat16")
    scale = np.float32(np.sqrt(3.0 / hidden))    # keeps the activations O(1) through the chain
    inputs = {"x": rng.uniform(-1, 1, (batch, hidden)).astype(np.float32).astype(bf16)}
    for i in range(layers):
        inputs[f"w{i}"] = (rng.uniform(-1, 1, (hidden, hidden)).astype(np.float32)
                           * scale).astype(bf16)
    run_checked(prog, g, inputs, "W2 chain")


# ---- MK_FLAG_B_READY ----------------------------------------------------------------------------

def _flags_by_graph_op(plan, g):
    """For each graph GEMM op: the B_READY bits of its GEMM instructions (split-K partials
    included; reduce instructions are not GEMMs)."""
    ins = plan.instrs
    out = {}
    for op in g.ops:
        if op.kind != "gemm":
            continue
        units = [u for u, label in enumerate(plan.op_labels)
                 if label.startswith(f"gemm #{op.index} (")]
        mine = np.isin(ins["op_index"], units) & (ins["opcode"] == abi.OPCODE_OF["gemm"])
        assert mine.any()
        out[op.index] = (ins["flags"][mine] & abi.FLAG_B_READY) != 0
    return out


@pytest.mark.parametrize("dtype,m,n_sm,split", [
    ("bfloat16", 16, N_SM, False),    # skinny bands
    ("bfloat16", 200, 4, False),      # 128 x 128 tiles
    ("bfloat16", 200, N_SM, True),    # bf16 split-K partials
    ("float32", 16, N_SM, True)])     # fp32 split-K partials
def test_b_ready_exactly_when_b_is_a_graph_input(dtype, m, n_sm, split):
    g = megak.Graph()
    x = g.input("x", (m, 1024), dtype)
    w = g.input("w", (1024, 256), dtype)
    w_made = g.gemm(g.input("u", (1024, 64), dtype), g.input("v", (64, 256), dtype))  # 8 x 2 tiles
    y1 = g.gemm(x, w)              # B = input
    y2 = g.gemm(x, w_made)         # B = an earlier op's output
    g.output(y1, "y1")
    g.output(y2, "y2")
    plan = scheduler.build_plan(g, n_sm=n_sm)
    flags = _flags_by_graph_op(plan, g)
    assert flags[w_made.producer].all()
    assert flags[y1.producer].all()
    assert not flags[y2.producer].any()
    # only GEMM records carry it
    assert not (plan.instrs["flags"][plan.instrs["opcode"] != abi.OPCODE_OF["gemm"]]
                & abi.FLAG_B_READY).any()
    assert ("reduce" in scheduler.stats(plan)["instructions_per_opcode"]) == split


def test_b_ready_runs_on_the_simulator(backend, rng):
    # B produced by an earlier op, read by a skinny GEMM: the flag must stay off (the
    # simulator checks that what is read early is complete)
    g = megak.Graph()
    x = g.input("x", (16, 64), "bfloat16")
    w = g.gemm(g.input("u", (64, 48), "bfloat16"), g.input("v", (48, 96), "bfloat16"))
    g.output(g.gemm(x, w, activation="relu"), "y")
    prog = compile_for(g, backend, n_sm=8)
    run_checked(prog, g, random_inputs(g, rng), "skinny with a produced B")


# ---- numpy model of the device tile (restates ops/gemm_bf16_skinny.cuh: change together) ----

PAGE = 16384
STAGE_K_LOG2 = 10        # MK_SKINNY_STAGE_K_LOG2
NAN_BF16 = 0x7FC0


def _slot(r):
    return r ^ ((r >> 2) & 6)


def _wavefronts(byte_addrs, width):
    """Shared-memory wavefronts of one warp access: the most accesses any 4-B bank sees."""
    banks = np.zeros(32, int)
    for a in byte_addrs:
        for w in range(0, width, 4):
            banks[((a + w) // 4) % 32] += 1
    return int(banks.max())


def _as_f(u16):
    return (np.asarray(u16, np.uint32) << 16).view(np.float32).astype(np.float64)


def _model_skinny(a, b, row0, col0, rows, cols, k0, klen):
    """The rows x cols result the device's skinny path leaves in the staging tile (float64),
    checking on the way: every smem byte the MMAs read was written in that stage, no chunk is
    written twice, and every ldmatrix phase, cp.async warp write and partial-sum access takes
    the minimum number of wavefronts."""
    au, bu = a.view(np.uint16), b.view(np.uint16)
    lg = 0 if cols <= 8 else (1 if cols <= 16 else 2)
    kst_log2 = STAGE_K_LOG2 - lg
    kst = 1 << kst_log2
    nst = (klen + kst - 1) >> kst_log2 if klen > 0 else 0
    planes = (cols + 7) >> 3
    nbw = 4 >> lg
    pages = [np.full(PAGE // 2, NAN_BF16, np.uint16) for _ in range(4)]   # stale bytes

    def load_stage(s):
        pg, written = pages[s & 3], np.zeros(PAGE // 16, bool)
        kb = s << kst_log2
        left = (klen - kb + 31) & ~31
        n = min(left, kst) << lg
        for t0 in range(0, n, 32):             # one warp instruction: 32 consecutive chunks
            dsts = []
            for t in range(t0, min(t0 + 32, n)):
                r, c = t >> lg, t & ((1 << lg) - 1)
                nv = cols - 8 * c
                if nv <= 0:
                    continue
                dst = (c << (kst_log2 + 4)) + (_slot(r) << 4)
                assert not written[dst // 16], "chunk written twice"
                written[dst // 16] = True
                dsts.append(dst)
                vals = np.zeros(8, np.uint16)
                nv = min(nv, 8) if kb + r < klen else 0
                if nv:
                    vals[:nv] = bu[k0 + kb + r, col0 + 8 * c:col0 + 8 * c + nv]
                pg[dst // 2:dst // 2 + 8] = vals
            assert _wavefronts(dsts, 16) <= -(-len(dsts) // 8) + (1 if planes == 3 else 0)
        return written

    def ld_a8(row, k):
        vals = np.zeros(8, np.uint16)
        if row < rows:
            n = max(0, min(8, klen - k))
            vals[:n] = au[row0 + row, k0 + k:k0 + k + n]
        return vals.view(np.uint32)   # 4 words, little-endian pairs

    lanes = np.arange(32)
    kr = 8 * ((lanes & 7) >> 1) + 2 * (lanes >> 3) + (lanes & 1)
    b_frag = _slot(kr) << 4
    acc = np.zeros((8, 4, 32, 4))      # warp, plane, lane, element
    for s in range(nst):
        written = load_stage(s)
        pg = pages[s & 3]
        for w in range(8):
            for i in range(4):
                kb = 32 * (w + 8 * i)
                if i >= nbw or (s << kst_log2) + kb >= klen:
                    continue
                kg = (s << kst_log2) + kb
                words = np.array([np.concatenate([ld_a8(l >> 2, kg + 8 * (l & 3)),
                                                  ld_a8((l >> 2) + 8, kg + 8 * (l & 3))])
                                  for l in range(32)])          # [lane][8]
                a0 = words[:, [0, 4, 1, 5]]
                a1 = words[:, [2, 6, 3, 7]]
                for p in range(planes):
                    addrs = (p << (kst_log2 + 4)) + (kb << 4) + b_frag
                    for ph in range(4):
                        ph_addrs = addrs[8 * ph:8 * ph + 8]
                        assert len({(x // 16) % 8 for x in ph_addrs}) == 8, "ldmatrix conflict"
                        assert all(written[x // 16] for x in ph_addrs), "reads an unwritten chunk"
                    # ldmatrix.x4.trans: matrix i from lanes 8i..8i+7; lane (g, q) gets
                    # (M_i[2q][g], M_i[2q+1][g])
                    mats = [np.stack([pg[x // 2:x // 2 + 8] for x in addrs[8 * i:8 * i + 8]])
                            for i in range(4)]
                    bw = np.zeros((32, 4), np.uint32)
                    for l in range(32):
                        g, q = l >> 2, l & 3
                        for i in range(4):
                            bw[l, i] = (np.uint32(mats[i][2 * q, g])
                                        | (np.uint32(mats[i][2 * q + 1, g]) << 16))
                    for af, bf in ((a0, bw[:, 0:2]), (a1, bw[:, 2:4])):
                        am, bm = np.zeros((16, 16)), np.zeros((16, 8))
                        for l in range(32):   # PTX m16n8k16 fragment layouts
                            g, q = l >> 2, l & 3
                            x = [_as_f([v & 0xFFFF, v >> 16]) for v in af[l]]
                            y = [_as_f([v & 0xFFFF, v >> 16]) for v in bf[l]]
                            am[g, 2 * q:2 * q + 2], am[g + 8, 2 * q:2 * q + 2] = x[0], x[1]
                            am[g, 2 * q + 8:2 * q + 10] = x[2]
                            am[g + 8, 2 * q + 8:2 * q + 10] = x[3]
                            bm[2 * q:2 * q + 2, g], bm[2 * q + 8:2 * q + 10, g] = y[0], y[1]
                        c = am @ bm
                        for l in range(32):
                            g, q = l >> 2, l & 3
                            acc[w, p, l] += (c[g, 2 * q], c[g, 2 * q + 1], c[g + 8, 2 * q],
                                             c[g + 8, 2 * q + 1])
    # partials (page 1), then the warp-ordered sum into the staging tile (page 0)
    part = np.full(PAGE // 4, np.nan)
    for w in range(8):
        for p in range(planes):
            for h in range(2):
                offs = []
                for l in range(32):
                    g, q = l >> 2, l & 3
                    r = g + 8 * h
                    off = 512 * w + r * 32 + 2 * ((4 * p + q) ^ ((r & 3) << 2))
                    assert np.isnan(part[off:off + 2]).all(), "partial written twice"
                    part[off:off + 2] = acc[w, p, l, 2 * h:2 * h + 2]
                    offs.append(4 * off)
                assert _wavefronts(offs, 8) == 2
    stage = np.full(PAGE // 4, np.nan)
    for w in range(8):          # the reduction reads, warp by warp of threads
        for tw in range(8):
            offs = []
            for l in range(32):
                t = 32 * tw + l
                r, pc = t >> 4, t & 15
                offs.append(4 * (512 * w + r * 32 + 2 * (pc ^ ((r & 3) << 2))))
            assert _wavefronts(offs, 8) == 2
    for t in range(256):
        r, pc = t >> 4, t & 15
        if r < rows and pc < 4 * planes:
            src = r * 32 + 2 * (pc ^ ((r & 3) << 2))
            v = sum(part[512 * w + src:512 * w + src + 2] for w in range(8))
            off = (r % 32) * 128 + (((pc >> 1) ^ (r & 7)) << 2) + 2 * (pc & 1)
            stage[off:off + 2] = v
    tile = np.zeros((rows, cols))
    for r in range(rows):       # the epilogue's reads: chunk c of row r at c ^ (r & 7)
        for c in range(cols):
            tile[r, c] = stage[(r % 32) * 128 + (((c >> 2) ^ (r & 7)) << 2) + (c & 3)]
    return tile


@pytest.mark.parametrize("m,k,n,row0,col0,rows,cols,k0,klen", [
    (16, 1024, 1024, 0, 64, 16, 8, 0, 1024),     # W2 1024: one stage, one plane
    (16, 600, 256, 0, 32, 16, 32, 0, 600),       # 3 stages of 256 k-rows, 4 planes
    (5, 2100, 64, 0, 16, 5, 16, 0, 2100),        # 5 stages of 512 (ring reuse), 2 planes
    (1, 17, 37, 0, 32, 1, 5, 0, 17),             # K and N edges, one row
    (16, 300, 200, 0, 176, 16, 20, 0, 300),      # 3 planes (an edge band of a 32 band)
    (40, 90, 70, 20, 3, 13, 29, 5, 77),          # nothing aligned, inside bigger tensors
    (16, 3, 8, 0, 0, 16, 8, 0, 0),               # klen = 0
])
def test_skinny_device_model(m, k, n, row0, col0, rows, cols, k0, klen):
    bf16 = numpy_dtype("bfloat16")
    rng = np.random.default_rng(m * 1000 + k + cols)
    a = rng.standard_normal((m, k)).astype(bf16)
    b = rng.standard_normal((k, n)).astype(bf16)
    # NaN outside the region: a read there, or a missing zero fill, would show
    ref = nan_outside_tile(a, b, row0, rows, col0, cols, k0, klen)
    tile = _model_skinny(a, b, row0, col0, rows, cols, k0, klen)
    np.testing.assert_allclose(tile, ref, rtol=1e-12, atol=1e-12)


# ---- device code, NVRTC only (no GPU): a probe kernel around the op and its preload -----------

PROBE = r'''
#include "ops/gemm.cuh"
/* the compute warps' op, at the entry's register cap (the strictest budget an op body gets) */
extern "C" __global__ void __maxnreg__(168) skinny_probe(const mk_instr* ins, const mk_tensor* op,
                                                         mk_u32 preloaded)
{
    const mk_pages pages = {mk_page_array(mk_smem), mk_ctl().slot[0].page, preloaded,
                            &mk_ctl().free_pages, &mk_ctl().free_pages};
    mk_gemm_bf16_skinny_run(*ins, op, pages);
}
/* the loader warp's share, with the loader's 40 registers */
extern "C" __global__ void __maxnreg__(40) skinny_preload_probe(const mk_instr* ins,
                                                                const mk_tensor* op)
{
    const mk_pages pages = {mk_page_array(mk_smem), mk_ctl().slot[0].page, 0u, nullptr, nullptr};
    if (mk_gemm_bf16_skinny_preload_stages(*ins, op) > 0)
        mk_gemm_bf16_skinny_preload(*ins, op, pages, threadIdx.x & 31, MK_PRELOAD_B);
}
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    compiler = pytest.importorskip("megak.runtime.compiler")
    pytest.importorskip("cuda.core")
    src = compiler.resolve_includes(PROBE, compiler.DEVICE_DIR)
    return compiler, compiler.compile_source(src, "sm_90a", cache_dir=tmp_path_factory.mktemp(
        "skinny-probe"), entry="skinny_probe", name="skinny_probe.cu")


@pytest.mark.parametrize("entry", ["skinny_probe", "skinny_preload_probe"])
def test_device_code_fits_its_registers(probe, entry):
    compiler, k = probe
    info = compiler.parse_ptxas_log(k.log, entry)
    print(f"\n{entry}: {info}")
    assert info["registers"] is not None, k.log
    assert info["spill_stores"] == info["spill_loads"] == 0 and info["stack_bytes"] == 0, k.log


def test_device_code_uses_tensor_cores(probe, tmp_path):
    import re
    _, k = probe
    funcs = {f.split(",")[0].strip(): f for f in sass.functions(k.cubin, tmp_path)}
    op = funcs["skinny_probe"]
    # one k loop per band width (1, 2, 4 planes), unrolled over a turn of the 4-slot A ring:
    # 4 k blocks x (1 + 2 + 4) planes x 2 k16 steps = 56 MMAs, one ldmatrix.x4.trans per block
    # and plane (28); B via cp.async with zero fill, A via 16-B loads, no local memory
    assert len(re.findall(r"HMMA\.16816\.F32\.BF16", op)) == 56
    assert len(re.findall(r"LDSM\.16\.MT88\.4", op)) == 28
    assert "LDGSTS.E.BYPASS.128" in op and "LDG.E.128" in op
    assert not re.search(r"\b(LDL|STL)\b", op)
    assert not re.search(r"\bBAR\.SYNC(\.DEFER_BLOCKING)?\s+0x0\b", op), "a whole-block barrier"
    pre = funcs["skinny_preload_probe"]
    assert "LDGSTS.E.BYPASS.128" in pre and not re.search(r"\b(LDL|STL)\b", pre)
