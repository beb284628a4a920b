"""Streamed bf16 GEMMs (MK_FLAG_STREAM: M <= MK_STREAM_M, B a graph input): B in boxes of
64 columns x 128 k-rows through the weight ring, each band in equal k parts combined by the
last part to finish (device/stream.cuh, device/ops/gemm_stream.cuh); and MK_FLAG_B_READY on
every GEMM instruction whose B is a graph input."""
import numpy as np
import pytest

import megak
from megak import abi, scheduler
from megak.dtypes import numpy_dtype
from megak.ops import gemm
from tests.random_dags import random_layer_chain
from tests.reference import assert_close, evaluate, random_inputs

N_SM = 132   # an H200's SM count: the parts depend on it
BOX_COLS, BOX_ROWS = gemm.BOX_COLS, gemm.BOX_ROWS


def stream_graph(m, k, n, out_dtype=None, bias=False, activation=None, residual=False,
                 dtype="bfloat16", res_dtype="float32"):
    g = megak.Graph()
    a = g.input("a", (m, k), dtype)
    b = g.input("b", (k, n), dtype)
    kw = {"activation": activation, "out_dtype": out_dtype}
    if bias:
        kw["bias"] = g.input("bias", (n,), "bfloat16")
    if residual:
        kw["residual"] = g.input("res", (m, n), res_dtype)
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


def chain_inputs(g, rng):
    """Random inputs of a layer chain, each weight w<i> scaled by 1 / sqrt(K): the chain's
    values stay O(1) however many layers."""
    inputs = random_inputs(g, rng)
    for name, t in g.inputs.items():
        if name.startswith("w"):
            inputs[name] = (inputs[name].astype(np.float32)
                            / np.sqrt(t.shape[0])).astype(inputs[name].dtype)
    return inputs


def compile_for(g, backend, n_sm=N_SM):
    return megak.compile(g, backend=backend, **({"n_sm": n_sm} if backend == "sim" else {}))


def gemm_instrs(plan):
    return plan.instrs[plan.instrs["opcode"] == abi.OPCODE_OF["gemm"]]


def assert_streamed(plan, m, k, n):
    """Every GEMM record streamed: row bands of <= 32 rows and bands of 64 columns (32 for
    narrow bands: all or none of the records, one part, one m16 tile) tile the output, each
    (row band, band)'s parts tile K in whole boxes (the last one short at K's end) and share
    one combine counter. Returns the parts."""
    ins = gemm_instrs(plan)
    flags = ins["flags"].astype(np.int64)
    assert (flags & abi.FLAG_STREAM).all() and (flags & abi.FLAG_B_READY).all()
    assert (ins["pages"] == gemm.STREAM_PAGES).all()
    parts, part = ins["param"] >> 16, ins["param"] & 0xFFFF
    assert len(set(parts.tolist())) == 1
    p = int(parts[0])
    narrow = flags & abi.FLAG_STREAM_NARROW
    assert narrow.all() or not narrow.any()
    cols = gemm.NARROW_COLS if narrow.any() else BOX_COLS
    assert not narrow.any() or (p == 1 and m <= 16)
    bands, row_bands = -(-n // cols), -(-m // gemm.STREAM_TILE_M)
    assert len(ins) == p * bands * row_bands
    counters = set()
    for r in range(row_bands):
        for b in range(bands):
            mine = ins[(ins["col0"] == b * cols) & (ins["row0"] == r * gemm.STREAM_TILE_M)]
            assert len(mine) == p
            assert (mine["cols"] == min(cols, n - b * cols)).all()
            assert (mine["rows"] == min(gemm.STREAM_TILE_M, m - r * gemm.STREAM_TILE_M)).all()
            order = np.argsort(mine["param"] & 0xFFFF)
            k0, kl = mine["k0"][order].astype(np.int64), mine["klen"][order].astype(np.int64)
            assert k0[0] == 0 and (k0[1:] == k0[:-1] + kl[:-1]).all() and k0[-1] + kl[-1] == k
            assert (k0 % BOX_ROWS == 0).all()
            if p > 1:   # one combine counter per (row band, band), a target of `parts` per run
                assert len(set(mine["out_row0"].tolist())) == 1
                c = int(mine["out_row0"][0])
                assert c < plan.n_counters and plan.counter_targets[c] == p
                counters.add(c)
    assert p == 1 or len(counters) == bands * row_bands
    return p


# ---- numbers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [37, 200])
@pytest.mark.parametrize("k", [1, 17, 1000, 1024, 4096])
@pytest.mark.parametrize("m", [1, 5, 16, 20, 33, 40, 64])   # bands of 1 and 2 m16 tiles
def test_stream_matches_float64(backend, rng, m, k, n):
    g = stream_graph(m, k, n)
    prog = compile_for(g, backend)
    assert_streamed(prog.plan, m, k, n)
    out = run_checked(prog, g, random_inputs(g, rng), f"stream {m}x{k}x{n}")
    assert out["c"].shape == (m, n) and out["c"].dtype == numpy_dtype("bfloat16")


EPILOGUES = [dict(bias=True), dict(activation="relu"), dict(bias=True, activation="gelu"),
             dict(activation="silu", residual=True),
             dict(bias=True, activation="gelu", residual=True)]


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("m,k,n", [(16, 1024, 200), (5, 1000, 37), (1, 17, 37), (64, 4096, 70)])
def test_stream_epilogue(backend, rng, m, k, n, epi, out_dtype):
    g = stream_graph(m, k, n, out_dtype=out_dtype, **epi)
    prog = compile_for(g, backend)
    out = run_checked(prog, g, random_inputs(g, rng), f"stream {m}x{k}x{n} {epi} -> {out_dtype}")
    assert out["c"].dtype == numpy_dtype(out_dtype)
    ins = gemm_instrs(prog.plan)
    assert (ins["flags"].astype(np.int64)
            & ~(abi.FLAG_B_READY | abi.FLAG_STREAM | abi.FLAG_STREAM_NARROW)
            == gemm.epilogue_flags(next(op for op in g.ops if op.kind == "gemm"))).all()


# bands of one part store their sums from registers (mk_stream_store_direct): one and two m16
# tiles, a band of 6 columns after a full one (odd pairs), odd leading dimensions (no pair
# stores), bf16 and fp32 residuals
@pytest.mark.parametrize("res_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("m,k,n", [(7, 100, 70), (32, 128, 70), (20, 1, 37), (32, 128, 64)])
def test_stream_one_part_stores_direct(backend, rng, m, k, n, out_dtype, res_dtype):
    g = stream_graph(m, k, n, out_dtype=out_dtype, bias=True, activation="gelu",
                     residual=True, res_dtype=res_dtype)
    # on two SMs: three narrow bands of 70 columns would not fit one wave, so 7 rows stay wide
    prog = megak.compile(g, backend=backend, n_sm=2)
    assert assert_streamed(prog.plan, m, k, n) == 1
    assert not (gemm_instrs(prog.plan)["flags"] & abi.FLAG_STREAM_NARROW).any()
    run_checked(prog, g, random_inputs(g, rng), f"one part {m}x{k}x{n} -> {out_dtype}")


@pytest.mark.parametrize("n_sm", [1, 4, 132])
def test_stream_on_few_sms(rng, n_sm):
    # fewer SMs than bands: one part per band, several bands per SM, the ring across them
    g = stream_graph(16, 300, 200, bias=True, activation="relu", out_dtype="float32")
    prog = megak.compile(g, backend="sim", n_sm=n_sm)
    assert assert_streamed(prog.plan, 16, 300, 200) == 1   # 3 boxes: within the ring
    run_checked(prog, g, random_inputs(g, rng), f"stream on {n_sm} SMs")


def test_stream_runs_again_and_again(backend, rng):
    # the combine counters advance per run like the dependency counters: every run's last
    # part is found again, with fresh inputs each time
    g = stream_graph(16, 2048, 200, bias=True)
    prog = compile_for(g, backend)
    assert assert_streamed(prog.plan, 16, 2048, 200) > 1
    for i in range(5):
        run_checked(prog, g, random_inputs(g, rng), f"run {i}")


def test_stream_chain_is_correct(backend, rng):
    # benchmarks W2 (bf16, batch 16, 16 layers of 1024 x 1024), every layer an output: the
    # ring carries the next layers' weights across instruction boundaries
    layers, hidden, batch = 16, 1024, 16
    g = megak.Graph()
    x = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        x = g.gemm(x, g.input(f"w{i}", (hidden, hidden), "bfloat16"))
        g.output(x, f"h{i}")
    prog = compile_for(g, backend)
    # 8 boxes per wide band fit the ring (one part): 32 narrow bands per layer instead of 16
    assert prog.stats["instructions_per_opcode"] == {"gemm": layers * 32}
    ins = prog.plan.instrs
    assert (ins["flags"] & abi.FLAG_STREAM).all() and prog.plan.stream_pages >= 2
    assert (ins["flags"] & abi.FLAG_STREAM_NARROW).all()
    # every layer after the first waits only on the bands of the previous one it reads
    assert (ins["n_waits"][ins["op_index"] == 0] == 0).all()
    assert (ins["n_waits"][ins["op_index"] > 0] >= 1).all()
    bf16 = numpy_dtype("bfloat16")
    scale = np.float32(np.sqrt(3.0 / hidden))    # keeps the activations O(1) through the chain
    inputs = {"x": rng.uniform(-1, 1, (batch, hidden)).astype(np.float32).astype(bf16)}
    for i in range(layers):
        inputs[f"w{i}"] = (rng.uniform(-1, 1, (hidden, hidden)).astype(np.float32)
                           * scale).astype(bf16)
    run_checked(prog, g, inputs, "W2 chain")


# ---- lowering ---------------------------------------------------------------------------------

def test_split_rule():
    assert (gemm.STREAM_M, BOX_COLS, BOX_ROWS) == (64, 64, 128)
    # bands x parts <= SMs, parts of whole boxes, equal except the last
    assert gemm.RING_BOXES == 10
    assert gemm.stream_split(16, 1024, 1024, "bfloat16", True, 132) == (1, 1024)     # in a ring
    assert gemm.stream_split(16, 2048, 1024, "bfloat16", True, 132) == (2, 1024)
    assert gemm.stream_split(16, 4096, 4096, "bfloat16", True, 132) == (2, 2048)     # 64 x 2
    assert gemm.stream_split(16, 8192, 8192, "bfloat16", True, 132) == (1, 8192)     # 128 x 1
    assert gemm.stream_split(1, 4096, 4096, "bfloat16", True, 132) == (2, 2048)
    assert gemm.stream_split(64, 4096, 4096, "bfloat16", True, 132) == (1, 4096)     # 2 row bands
    assert gemm.stream_split(16, 4096, 1024, "bfloat16", True, 132) == (4, 1024)
    assert gemm.stream_split(16, 1000, 37, "bfloat16", True, 132) == (1, 1024)
    assert gemm.stream_split(16, 17, 37, "bfloat16", True, 132) == (1, 128)
    assert gemm.stream_split(16, 300, 200, "bfloat16", True, 4) == (1, 384)
    assert gemm.stream_split(65, 1024, 1024, "bfloat16", True, 132) is None   # > 64 rows
    assert gemm.stream_split(17, 1024, 1024, "float32", True, 132) is None    # fp32 > 16 rows
    assert gemm.stream_split(16, 1024, 1024, "bfloat16", False, 132) is None  # B produced


@pytest.mark.parametrize("m,k,n", [(16, 1024, 1024), (16, 4096, 4096), (1, 1000, 37),
                                   (5, 17, 200), (64, 8192, 8192), (33, 4096, 100), (16, 4096, 1024)])
def test_bf16_few_rows_with_weights_are_streamed(m, k, n):
    plan = scheduler.build_plan(stream_graph(m, k, n), n_sm=N_SM)
    parts = assert_streamed(plan, m, k, n)
    assert parts == 1 or parts * -(-n // BOX_COLS) * -(-m // gemm.STREAM_TILE_M) <= N_SM
    # the ring: the pages the streamed GEMMs leave
    assert plan.stream_pages == min(plan.n_pages - gemm.STREAM_PAGES,
                                    abi.OP_SHAPES["MK_STREAM_MAX_RING"])
    # a partials tensor (parts * M rows, fp32) only where parts meet
    partials = [t for t in plan.tensors if t.name.endswith("_stream_partials")]
    assert len(partials) == (parts > 1)
    if parts > 1:
        assert partials[0].shape == (parts * gemm.STREAM_M, n)
        assert partials[0].dtype == "float32"
        assert partials[0].kind == "intermediate"


@pytest.mark.parametrize("m,dtype", [(17, "float32"), (65, "bfloat16")])
def test_fp32_or_more_rows_keep_tiles(m, dtype):
    g = stream_graph(m, 1024, 1024, dtype=dtype)
    plan = scheduler.build_plan(g, n_sm=N_SM)
    ins = gemm_instrs(plan)
    assert not (ins["flags"] & abi.FLAG_STREAM).any() and plan.stream_pages == 0
    # 128 x 128 tiles, or 128 x 256 wgmma tiles for bf16
    assert (ins["cols"] == gemm.tile_shape({"wgmma": dtype == "bfloat16"})[1]).all()
    assert "reduce" in scheduler.stats(plan)["instructions_per_opcode"]   # few tiles: split-K


def test_few_pages_leave_no_ring():
    # 4 pages: 3 for the op leave 1, below MK_STREAM_MIN_RING: the GEMMs load B themselves
    plan = scheduler.build_plan(stream_graph(16, 1024, 256), n_sm=N_SM, n_pages=4)
    assert plan.stream_pages == 0
    assert (gemm_instrs(plan)["flags"] & abi.FLAG_STREAM).all()


def test_few_pages_still_run(rng):
    g = stream_graph(16, 1000, 200, bias=True)
    plan = scheduler.build_plan(g, n_sm=8, n_pages=4)
    from megak.sim import SimExecutor
    ex = SimExecutor(plan)
    inputs = random_inputs(g, rng)
    slots = {plan.inputs[k]: v for k, v in inputs.items()}
    out = ex.run(slots, [plan.outputs["c"]])[plan.outputs["c"]]
    value, bound = evaluate(g, inputs)[g.outputs["c"].index]
    assert_close(out, value, bound, "stream without a ring", "bfloat16")


def test_band_dependencies():
    # a consumer reading a band's columns waits on that band's counter (all its parts),
    # never on one part: the grid's rows are parts, not output rows
    g = megak.Graph()
    x = g.input("x", (16, 4096), "bfloat16")
    h = g.gemm(x, g.input("w1", (4096, 256), "bfloat16"))
    y = g.gemm(h, g.input("w2", (256, 256), "bfloat16"), residual=h)
    g.output(y, "y")
    plan = scheduler.build_plan(g, n_sm=N_SM)
    ins = plan.instrs
    first, second = ins[ins["op_index"] == 0], ins[ins["op_index"] == 1]
    p1 = int(first["param"][0]) >> 16
    assert p1 > 1 and len(first) == p1 * 4
    targets = plan.counter_targets
    for r in second:
        waits = r["wait_counter"][:r["n_waits"]]
        assert len(waits) >= 1
        for c, t in zip(waits, r["wait_target"][:r["n_waits"]]):
            # a band counter (target: parts) or the whole op (all instructions)
            assert int(t) in (p1, len(first)) and targets[int(c)] == t


def test_stream_cost_and_bytes():
    g = stream_graph(20, 4096, 4096, out_dtype="float32")
    units, _, _ = scheduler.lowering_units(g, N_SM)
    low = gemm.OP.lower(units[0])
    assert low.flops == 2.0 * 20 * 4096 * 4096
    assert low.n == 128 and low.wait_levels == ("col", "op")
    assert (low.combine == np.tile(np.arange(64), 2)).all()
    # at one m16 tile the same layer takes 128 narrow bands, one part each: no combine
    low = gemm.OP.lower(scheduler.lowering_units(stream_graph(16, 4096, 4096), N_SM)[0][0])
    assert low.n == 128 and low.combine is None and low.flops == 2.0 * 16 * 4096 * 4096
    assert (low.flags & abi.FLAG_STREAM_NARROW) and (low.col_edges[1:] - low.col_edges[:-1] == 32).all()


def test_narrow_rule():
    # narrow bands at one m16 tile, when they fit one wave and keep at least as many SMs
    # streaming, where the wide split would combine or leaves SMs the narrow bands use
    assert gemm.NARROW_COLS == 32
    assert gemm.stream_narrow(16, 4096, 2, 132)          # 4096 x 4096: 128 bands, one part
    assert gemm.stream_narrow(1, 4096, 2, 132)
    assert not gemm.stream_narrow(17, 4096, 2, 132)      # two m16 tiles
    assert not gemm.stream_narrow(16, 4096, 1, 64)       # 128 narrow bands: two waves
    assert gemm.stream_narrow(16, 1024, 1, 132)          # 32 narrow bands against 16 wide
    assert gemm.stream_split(16, 1024, 1024, "bfloat16", True, 132)[0] == 1
    assert not gemm.stream_narrow(16, 32, 1, 132)        # one band either way: no SM gained
    assert not gemm.stream_narrow(16, 1024, 1, 31)       # 32 narrow bands: two waves
    assert not gemm.stream_narrow(16, 1024, 4, 132)      # 32 narrow bands < 16 x 4 wide parts
    assert not gemm.stream_narrow(16, 8192, 2, 132)      # 256 narrow bands: two waves
    assert gemm.stream_narrow(16, 64, 2, 2) and gemm.stream_narrow(5, 100, 2, 8)


# narrow bands (m, k, n, SMs): 2 bands on 2 SMs, K in whole stages, K ending in its last
# stage's second box, K ending in its first (the second box not copied, nor read); 16 bands;
# a band of 4 columns; the W2 layer. Then bands of at most 8 rows (half-height A chunks, the
# next one ahead): the same K ends, the W2 batch-1 layer, and a K of odd length (A's rows
# not 16-B aligned: the scalar copy)
NARROW = [(16, 2560, 64, 2), (16, 2500, 64, 2), (16, 2100, 64, 2), (1, 4096, 512, 16),
          (5, 2000, 100, 8), (16, 4096, 4096, N_SM),
          (8, 2560, 64, 2), (8, 2500, 64, 2), (3, 2100, 64, 2), (1, 4096, 4096, N_SM),
          (7, 1001, 96, 4)]


def test_a_narrow_band_of_parts_is_refused(backend, rng):
    # a narrow band stores its own sums (one part, the lowering's rule): a narrow record that
    # names parts (edited in) fails its record check on either backend, never runs as one part
    g = stream_graph(16, 2560, 64)
    prog = megak.compile(g, backend=backend, n_sm=2)
    ins = prog.plan.instrs
    narrow = (ins["flags"] & abi.FLAG_STREAM_NARROW) != 0
    assert narrow.any() and gemm.OP.check_record(ins[narrow][0])
    ins["param"][narrow] = (2 << 16) | 0
    assert not gemm.OP.check_record(ins[narrow][0])
    prog._executor.reload_queues()
    with pytest.raises(megak.MegakernelError, match="MK_ERR_BAD_DESCRIPTOR"):
        prog.run(**random_inputs(g, rng))


@pytest.mark.parametrize("m,k,n,n_sm", NARROW)
def test_stream_narrow_matches_float64(backend, rng, m, k, n, n_sm):
    g = stream_graph(m, k, n)
    prog = megak.compile(g, backend=backend, n_sm=n_sm)
    assert assert_streamed(prog.plan, m, k, n) == 1
    assert (gemm_instrs(prog.plan)["flags"] & abi.FLAG_STREAM_NARROW).all()
    for run in range(2):
        run_checked(prog, g, random_inputs(g, rng), f"narrow {m}x{k}x{n} on {n_sm} run {run}")


@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "+".join(f"{k}={v}" for k, v in e.items()))
def test_stream_narrow_epilogue(backend, rng, epi):
    g = stream_graph(16, 2500, 64, out_dtype="float32", **epi)
    prog = megak.compile(g, backend=backend, n_sm=2)
    assert (gemm_instrs(prog.plan)["flags"] & abi.FLAG_STREAM_NARROW).all()
    run_checked(prog, g, random_inputs(g, rng), f"narrow {epi}")


# ---- MK_FLAG_B_READY ----------------------------------------------------------------------------

def _flags_by_graph_op(plan, g, flag):
    ins = plan.instrs
    out = {}
    for op in g.ops:
        if op.kind != "gemm":
            continue
        units = [u for u, label in enumerate(plan.op_labels)
                 if label.startswith(f"gemm #{op.index} (")]
        mine = np.isin(ins["op_index"], units) & (ins["opcode"] == abi.OPCODE_OF["gemm"])
        assert mine.any()
        out[op.index] = (ins["flags"][mine] & flag) != 0
    return out


@pytest.mark.parametrize("dtype,m,n_sm,split", [
    ("bfloat16", 16, N_SM, True),     # y1 streamed; y2 (B produced) split-K
    ("bfloat16", 200, 3, False),      # 2 wgmma tiles (128 x 256) for 3 SMs: no split
    ("bfloat16", 200, N_SM, True),    # bf16 split-K partials
    ("float32", 16, N_SM, True),      # y1 streamed (fp32 bands); y2 split-K
    ("float32", 17, N_SM, True)])     # fp32 split-K partials
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
    ready = _flags_by_graph_op(plan, g, abi.FLAG_B_READY)
    stream = _flags_by_graph_op(plan, g, abi.FLAG_STREAM)
    assert ready[w_made.producer].all() and ready[y1.producer].all()
    assert not ready[y2.producer].any() and not stream[y2.producer].any()
    assert stream[y1.producer].all() == (m <= (64 if dtype == "bfloat16" else 16))
    assert not (plan.instrs["flags"][plan.instrs["opcode"] != abi.OPCODE_OF["gemm"]]
                & (abi.FLAG_B_READY | abi.FLAG_STREAM)).any()
    assert ("reduce" in scheduler.stats(plan)["instructions_per_opcode"]) == split


def test_produced_b_runs_tiled(backend, rng):
    # B produced by an earlier op: not streamed (the streamer runs ahead of every wait)
    g = megak.Graph()
    x = g.input("x", (16, 64), "bfloat16")
    w = g.gemm(g.input("u", (64, 48), "bfloat16"), g.input("v", (48, 96), "bfloat16"))
    g.output(g.gemm(x, w, activation="relu"), "y")
    prog = compile_for(g, backend, n_sm=8)
    run_checked(prog, g, random_inputs(g, rng), "a GEMM on a produced B")


# ---- the device tile's layout (restates ops/gemm_stream.cuh: change together) --------------------

def _phase_groups(addrs):
    """16-B bank groups of 8 row addresses (one ldmatrix phase)."""
    return {(a // 16) % 8 for a in addrs}


def _assert_b_fragments(page, box, addr, k16, j):
    """The ldmatrix.x4.trans of k16 step `k16`, columns 16 j.., at the lanes' byte addresses
    `addr` in `page` (bf16 pairs as uint32 words): each phase reads 8 bank groups, and matrix
    i (lanes 8i..8i+7) reads rows k = 16 k16 + 8 (i % 2) + (0..7), columns 8 (2 j + i // 2) +
    (0..7) of `box`; .trans gives lane (g, q) (M[2q][g], M[2q+1][g])."""
    for ph in range(4):
        assert len(_phase_groups(addr[8 * ph:8 * ph + 8])) == 8
    for i in range(4):
        rows = [page[a // 2:a // 2 + 8] for a in addr[8 * i:8 * i + 8]]
        k0, c0 = 16 * k16 + 8 * (i % 2), 8 * (2 * j + i // 2)
        assert (np.array(rows) == box[k0:k0 + 8, c0:c0 + 8]).all()


def test_box_swizzle_and_fragments():
    # the TMA's 128-B swizzle: k-row r's 16-B chunk c at byte 128 r + 16 (c ^ (r % 8)); the
    # op's ldmatrix.x4.trans addresses read back B's m16n8k16 fragments, conflict-free
    rng = np.random.default_rng(1)
    box = rng.integers(0, 1 << 16, (BOX_ROWS, BOX_COLS), dtype=np.uint32)
    page = np.zeros(BOX_ROWS * BOX_COLS, np.uint32)
    for r in range(BOX_ROWS):
        for c in range(8):
            page[64 * r + 8 * (c ^ (r % 8)):64 * r + 8 * (c ^ (r % 8)) + 8] = box[r, 8 * c:8 * c + 8]
    lanes = np.arange(32)
    for w in range(8):   # k16 step w of the box (a warp's own without the ring; every warp's
        b_row = 16 * w + (lanes & 7) + ((lanes >> 3) & 1) * 8   # in turn with it)
        for j in range(4):
            chunk = 2 * j + (lanes >> 4)
            _assert_b_fragments(page, box, 128 * b_row + 16 * (chunk ^ (b_row & 7)), w, j)


def test_a_chunk_layout_is_conflict_free_and_one_to_one():
    # with the ring, warp w's A chunk: kc = 128 / mts k-rows of 16 mts rows, row r's 16-B
    # unit u at r * 2 kc + 16 (u ^ (r % 8)) (mk_stream_chunk_at); the copy's 256 units fill
    # the 4 KiB exactly, and the ldmatrix.x4 of m16 tile mt at k16 step ks (lane l: row
    # 16 mt + l % 16, unit 2 ks + l / 16) reads 8 bank groups per phase
    lanes = np.arange(32)
    for mts in (1, 2):
        kc = BOX_ROWS // mts
        pitch, units = 2 * kc, kc // 8
        i = np.arange(256)
        r, u = i // units, i % units
        filled = r * pitch + 16 * (u ^ (r % 8))
        assert sorted(filled.tolist()) == list(range(0, 4096, 16))
        for ks in range(kc // 16):
            for mt in range(mts):
                r = 16 * mt + (lanes & 15)
                addr = r * pitch + 16 * ((2 * ks + (lanes >> 4)) ^ (r % 8))
                for ph in range(4):
                    assert len(_phase_groups(addr[8 * ph:8 * ph + 8])) == 8
                # and it is the unit the copy put row r's k-columns 16 ks + 8 (l / 16) .. into
                unit = 2 * ks + (lanes >> 4)
                assert (addr == r * pitch + 16 * (unit ^ (r % 8))).all() and (unit < units).all()


def test_rows8_half_chunks_are_filled_once_and_read_conflict_free():
    # a narrow band of at most 8 rows (mk_stream_kloop_ring_rows8): each 2 KiB half of a
    # warp's buffer is 8 rows of 16 units (pitch 256 B, unit u of row r at 16 (u ^ r)); a
    # stage copies rows < m (mk_stream_chunk_a8), the loop zeroed rows m..7 once: together
    # every 16 B of the half exactly once. The ldmatrix.x2 of k16 step ks (lane l < 16: row
    # l % 8, unit 2 ks + (l / 8) % 2) reads 8 bank groups per phase, rows 0-7 at the k-columns
    # 16 ks + 8 ((l / 8) % 2) the copy put there
    for m in range(1, 9):
        copied = [(i >> 4, i & 15) for i in range(16 * m)]
        zeroed = []                       # the loop's i over both halves: half 0's share
        for i in range(2 * 8 * 16):
            half, r, u = i // 128, (i // 16) % 8, i % 16
            if r >= m and half == 0:
                zeroed.append((r, u))
        addr = sorted(256 * r + 16 * (u ^ r) for r, u in copied + zeroed)
        assert addr == list(range(0, 2048, 16)), m
    lanes = np.arange(16)
    for ks in range(BOX_ROWS // 16):
        r, unit = lanes % 8, 2 * ks + (lanes // 8) % 2
        addr = 256 * r + 16 * (unit ^ r)
        for ph in range(2):
            assert len(_phase_groups(addr[8 * ph:8 * ph + 8])) == 8
        assert (unit < 16).all()


def test_narrow_box_swizzle_and_fragments():
    # a narrow band's box (32 columns x 128 k-rows, the TMA's 64-B swizzle): k-row r's 16-B
    # chunk c at byte 64 r + 16 (c ^ ((r / 2) % 4)); the op's ldmatrix.x4.trans addresses (two
    # per k16 step, 4 n8 tiles) read back B's fragments, conflict-free
    rng = np.random.default_rng(2)
    cols = gemm.NARROW_COLS
    box = rng.integers(0, 1 << 16, (BOX_ROWS, cols), dtype=np.uint32)
    page = np.zeros(BOX_ROWS * cols, np.uint32)
    for r in range(BOX_ROWS):
        for c in range(cols // 8):
            at = (64 * r + 16 * (c ^ ((r >> 1) & 3))) // 2
            page[at:at + 8] = box[r, 8 * c:8 * c + 8]
    lanes = np.arange(32)
    for ks in range(BOX_ROWS // 16):
        b_row = 16 * ks + (lanes & 7) + ((lanes >> 3) & 1) * 8
        for j in range(2):
            chunk = 2 * j + (lanes >> 4)
            _assert_b_fragments(page, box, 64 * b_row + 16 * (chunk ^ ((b_row >> 1) & 3)), ks, j)


def test_a_slot_layout_is_conflict_free():
    # without the ring, warp w's A slice of a stage: row r's chunk c at
    # 32 r + 16 (c ^ ((r >> 2) & 1)); the ldmatrix.x4 of m16 tile mt (lane l: row
    # 16 mt + l % 16, chunk l / 16)
    lanes = np.arange(32)
    for mt in range(4):
        r = 16 * mt + (lanes & 15)
        c = lanes >> 4
        addr = 32 * r + 16 * (c ^ ((r >> 2) & 1))
        for ph in range(4):
            assert len(_phase_groups(addr[8 * ph:8 * ph + 8])) == 8
        assert len(set(addr.tolist())) == 32


# ---- GPU only -----------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 24, 40, 64])   # bands of 1 and 2 m16 tiles
def test_stream_unaligned_weights_load_themselves(rng, m):
    # a caller's B view whose rows are not 16-B aligned gets no tensor map: the GEMM copies
    # B into its own page instead of the ring, same results
    torch = pytest.importorskip("torch")
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    k, n = 1000, 200
    g = stream_graph(m, k, n, bias=True)
    prog = megak.compile(g, backend="cuda")
    inputs = random_inputs(g, rng)
    big = torch.zeros((k, n + 1), dtype=torch.bfloat16, device="cuda")
    big[:, 1:] = torch.from_numpy(inputs["b"].view(np.uint16).astype(np.int16)).view(
        torch.bfloat16).cuda()
    view = big[:, 1:]
    assert view.data_ptr() % 16 != 0
    out = prog.run(a=inputs["a"], b=view, bias=inputs["bias"])
    value, bound = evaluate(g, inputs)[g.outputs["c"].index]
    got = out["c"].to(torch.float32).cpu().numpy().astype(numpy_dtype("bfloat16"))   # exact
    assert_close(got, value, bound, "unaligned B view", "bfloat16")


@pytest.mark.gpu
def test_stream_stress_random_chains():
    # random layer chains (batch 1..64, odd widths, epilogues) run many times each, every
    # result checked: the ring across instructions, the combine across runs
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(12)
    for case in range(12):
        g, m, widths = random_layer_chain(rng, "bfloat16", [1, 3, 16, 17, 40, 64],
                                          [64, 100, 256, 1000, 1024, 2048])
        prog = megak.compile(g, backend="cuda")
        assert (gemm_instrs(prog.plan)["flags"] & abi.FLAG_STREAM).all()
        for run in range(8):
            run_checked(prog, g, chain_inputs(g, rng), f"chain {case} {widths} batch {m} run {run}")


@pytest.mark.gpu
@pytest.mark.parametrize("n_pages", [5, 6, 9, 13])
def test_stream_ring_sizes_stress(n_pages):
    # rings of 2, 3, 6 and 10 pages (13 - 3 op pages at most) under instructions of 1 to 32
    # stages: a warp takes every 8th stage of its instruction (every 4th, with the warp 4
    # apart, for two m16 tiles: batch 40 mixes both in one queue), so with a small ring the
    # warps wait for positions the streamer issues R at a time into slots whose previous stage
    # other warps read (the issued word and the two arrivals per phase, stream.cuh); run
    # again and again, every result checked
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(20 + n_pages)
    for case, (m, widths) in enumerate([(16, [4096, 128, 1000, 64, 2048]),
                                        (1, [1024, 1024, 1024]), (40, [2048, 256, 3000]),
                                        (20, [1024, 640, 2048])]):
        g = megak.Graph()
        x = g.input("x", (m, widths[0]), "bfloat16")
        for i, (k, n) in enumerate(zip(widths[:-1], widths[1:])):
            x = g.gemm(x, g.input(f"w{i}", (k, n), "bfloat16"))
            g.output(x, f"h{i}")
        prog = megak.compile(g, backend="cuda", n_pages=n_pages)
        assert prog.plan.stream_pages == min(n_pages - gemm.STREAM_PAGES, 10)
        assert (gemm_instrs(prog.plan)["flags"] & abi.FLAG_STREAM).all()
        for run in range(4):
            run_checked(prog, g, chain_inputs(g, rng), f"ring {n_pages - gemm.STREAM_PAGES}, "
                                                       f"chain {case} {widths} batch {m} run {run}")
