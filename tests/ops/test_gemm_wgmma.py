"""The Hopper bf16 GEMM tiles (MK_FLAG_WGMMA, megak/device/ops/gemm_wgmma.cuh): 128 x 256
tiles on wgmma with TMA copies, checked against float64 with each op's bound, on the simulator
and the GPU.

Paths on the GPU: the TMA ring with one m64n256k16 per k16 step (a stage's B pages side by
side, as the allocator hands them out here), and the generic fill (an operand TMA cannot
describe: a row stride that is not a multiple of 16 bytes), which runs the two-m64n128k16 form
the TMA ring takes when B's pages are apart. Edge tiles (rows, columns, K not a multiple of
64: the boxes' zero fill), split-K partials and every fused epilogue."""
import numpy as np
import pytest

import megak
from megak import abi
from megak.ops import gemm
from megak.runtime import tensor_maps
from tests.ops.test_gemm import EPILOGUES, epilogue_graph
from tests.reference import assert_close, check_graph, evaluate, random_inputs


def wgmma_records(prog):
    ins = prog.plan.instrs
    g = ins[ins["opcode"] == abi.OPCODE_OF["gemm"]]
    return g[(g["flags"] & abi.FLAG_WGMMA) != 0]


def compile_for(g, backend, n_sm=4):
    return megak.compile(g, backend=backend, **({"n_sm": n_sm} if backend == "sim" else {}))


# M > MK_STREAM_M (64), so that a bf16 GEMM of a graph input B is tiled, not streamed
@pytest.mark.parametrize("m,k,n", [(65, 1, 3), (128, 64, 256), (200, 64, 257), (300, 200, 520),
                                   (129, 1000, 130), (256, 4096, 256)])
def test_wgmma_matches_float64(backend, rng, m, k, n):
    g = epilogue_graph(m, k, n, dtype="bfloat16", out_dtype="float32")
    prog = compile_for(g, backend)
    check_graph(prog, g, rng, f"wgmma gemm {m}x{k}x{n}")
    rec = wgmma_records(prog)
    assert len(rec) and (rec["pages"] == gemm.WGMMA_PAGES).all()
    assert (rec["cols"] <= gemm.WGMMA_TILE_N).all() and (rec["rows"] <= gemm.WGMMA_TILE_M).all()


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("epi", EPILOGUES,
                         ids=lambda e: "+".join(f"{k}={v}" for k, v in e.items()) or "plain")
def test_wgmma_fused_epilogues(backend, rng, epi, out_dtype):
    g = epilogue_graph(200, 96, 300, dtype="bfloat16", out_dtype=out_dtype, **epi)
    # no split, the epilogue fused: 4 tiles on 2 SMs (sim); on a GPU's SMs 6 narrow ones
    # where the epilogue is at most a bias
    prog = compile_for(g, backend, n_sm=2)
    check_graph(prog, g, rng, f"wgmma gemm+{epi} -> {out_dtype}")
    rec = wgmma_records(prog)
    narrow = gemm.narrow_wgmma(200, 300, prog.plan.n_sm) and not (
        epi.get("activation") or epi.get("residual"))
    assert len(rec) == (6 if narrow else 4)
    want = gemm.epilogue_flags(g.ops[0])
    flags = rec["flags"].astype(np.int64) & ~(abi.FLAG_WGMMA | abi.FLAG_B_READY)
    assert (flags == want).all()


def test_wgmma_split_k(backend, rng):
    # 2 output tiles for 16 SMs: split over K into fp32 partials (wgmma tiles too), then the
    # reduce with the epilogue
    g = epilogue_graph(256, 2048, 200, dtype="bfloat16", bias=True, activation="gelu")
    prog = compile_for(g, backend, n_sm=16)
    check_graph(prog, g, rng, "wgmma split-K")
    by_op = prog.stats["instructions_per_opcode"]
    assert "reduce" in by_op
    rec = wgmma_records(prog)
    assert len(rec) == by_op["gemm"] and len(rec) > 2
    assert (rec["klen"] % gemm.abi.OP_SHAPES["MK_WGMMA_BK"] == 0).sum() >= len(rec) - 2


def test_wgmma_tiles_cover_the_output_once():
    g = epilogue_graph(300, 50, 700, dtype="bfloat16")
    prog = megak.compile(g, backend="sim", n_sm=2)
    cover = np.zeros((300, 700), dtype=int)
    for r in wgmma_records(prog):
        cover[r["row0"]:r["row0"] + r["rows"], r["col0"]:r["col0"] + r["cols"]] += 1
    assert (cover == 1).all()
    assert len(wgmma_records(prog)) == 3 * 3


def test_few_pages_keep_the_mma_sync_tiles(rng):
    g = epilogue_graph(200, 96, 300, dtype="bfloat16")
    prog = megak.compile(g, backend="sim", n_sm=2, n_pages=gemm.WGMMA_PAGES - 1)
    check_graph(prog, g, rng, "mma.sync tiles")
    assert len(wgmma_records(prog)) == 0


def test_simulator_checks_wgmma_records():
    g = epilogue_graph(200, 96, 300, dtype="bfloat16")
    prog = megak.compile(g, backend="sim", n_sm=2)
    rec = wgmma_records(prog)[0]
    assert gemm.OP.check_record(rec)
    for field, value in (("cols", gemm.WGMMA_TILE_N + 1), ("rows", gemm.WGMMA_TILE_M + 1),
                         ("pages", gemm.WGMMA_PAGES - 1)):
        bad = rec.copy()
        bad[field] = value
        assert not gemm.OP.check_record(bad), field
    bad = rec.copy()
    bad["flags"] |= abi.FLAG_STREAM
    assert not gemm.OP.check_record(bad)
    assert gemm.OP.min_pages(rec) == gemm.WGMMA_PAGES


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["a", "b"])
def test_wgmma_operand_tma_cannot_describe(rng, which):
    """A torch view whose row stride is 2 (K + 3) bytes: no tensor map, the generic fill."""
    torch = pytest.importorskip("torch")
    m, k, n = 200, 100, 300
    g = epilogue_graph(m, k, n, dtype="bfloat16", out_dtype="float32", bias=True)
    prog = megak.compile(g, backend="cuda")
    host = random_inputs(g, rng)
    dev = {name: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16).cuda()
           for name, v in host.items()}
    rows, cols = dev[which].shape
    wide = torch.full((rows, cols + 3), float("nan"), dtype=torch.bfloat16, device="cuda")
    wide[:, :cols] = dev[which]
    dev[which] = wide[:, :cols]                   # row stride cols + 3 elements
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
    prog.run(out={"c": out}, **dev)
    env = evaluate(g, host)
    value, bound = env[g.outputs["c"].index]
    assert_close(out.cpu().numpy(), value, bound, f"wgmma, {which} without a map")


@pytest.mark.parametrize("n_sm", [1, 2])
def test_wgmma_tiles_back_to_back(backend, rng, n_sm):
    """Many tiles per SM: each instruction's loader initialises the barriers and produces its
    stages while the one before may still be storing."""
    g = epilogue_graph(384, 640, 768, dtype="bfloat16", out_dtype="bfloat16", residual=True)
    prog = megak.compile(g, backend=backend, n_sm=n_sm)
    check_graph(prog, g, rng, f"wgmma, {n_sm} SMs")
    assert len(wgmma_records(prog)) == 9


# ---- the MK_WGMMA_ONLY kernel (device/pages.cuh: the body inlined, its MMAs pipelined) -----

def test_narrow_tiles_where_wide_ones_leave_sms_idle():
    """128 x 128 wgmma tiles when the 128 x 256 ones leave SMs idle and the narrow ones fit
    one wave, for a GEMM with at most a bias; such a program (every tile at most 128
    columns) runs the n128 build."""
    assert gemm.narrow_wgmma(512, 4096, 132)          # 64 wide tiles, 128 narrow
    assert gemm.narrow_wgmma(256, 4096, 132)
    assert not gemm.narrow_wgmma(1024, 4096, 132)     # 128 wide tiles: one wave already
    assert not gemm.narrow_wgmma(640, 4096, 132)      # 160 narrow tiles: two waves
    assert not gemm.narrow_wgmma(512, 128, 132)       # one column band either way
    for m, n, narrow, epi in ((512, 4096, True, {}), (512, 4096, True, {"bias": True}),
                              (4096, 4096, False, {}),
                              # the general kernel would run narrow tiles at a wide one's cost
                              (512, 4096, False, {"activation": "gelu"}),
                              (512, 4096, False, {"residual": True})):
        g = epilogue_graph(m, 64, n, dtype="bfloat16", **epi)
        rec = wgmma_records(megak.compile(g, backend="sim", n_sm=132))
        assert (rec["cols"] == (128 if narrow else 256)).all()
        assert len(rec) == (m // 128) * (n // (128 if narrow else 256))
        assert tensor_maps.wgmma_only_build(rec) == (2 if narrow else 1)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n,bias,out_dtype,n_sm,mma_n", [
    (128, 64, 256, False, "bfloat16", 132, 128),   # 2 narrow tiles
    (300, 200, 520, True, "float32", 3, 256),      # edge tiles, a K tail that ends at A's end
    (129, 1000, 130, True, "bfloat16", 1, 256),    # back to back on one SM
    (1024, 640, 1536, False, "bfloat16", 2, 256),
    (777, 4096, 300, False, "float32", 7, 256),    # 14 tiles: not split on 7 SMs
    (512, 1000, 1000, True, "bfloat16", 132, 128),  # narrow: 32 tiles for 132 SMs
    (520, 130, 1100, True, "float32", 64, 128),    # narrow edge tiles (8 rows, 76 columns)
    (200, 300, 100, False, "float32", 1, 128)])    # N <= 128: back to back, n128 build
def test_wgmma_only_kernel(rng, m, k, n, bias, out_dtype, n_sm, mma_n):
    """A program of wgmma tiles with at most a bias runs on the MK_WGMMA_ONLY kernel (the n128
    build when every tile is at most 128 columns wide), with megak's own tensors and with
    torch tensors (a caller's table) where TMA can describe them (rows of a multiple of 16
    bytes; else the general kernel): every output against float64, outputs poisoned before
    each run."""
    torch = pytest.importorskip("torch")
    g = epilogue_graph(m, k, n, dtype="bfloat16", out_dtype=out_dtype, bias=bias)
    with megak.compile(g, backend="cuda", n_sm=n_sm) as prog:
        assert prog._executor.wgmma_only_n == mma_n
        for run in range(2):
            check_graph(prog, g, rng, f"wgmma-only {m}x{k}x{n} run {run}")
            assert prog._executor.last_variant == "wgmma_only"
        host = random_inputs(g, rng)
        dev = {name: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16).cuda()
               for name, v in host.items()}
        out = torch.full((m, n), float("nan"), device="cuda",
                         dtype=getattr(torch, out_dtype))
        prog.run(out={"c": out}, **dev)
        mappable = (2 * k) % 16 == 0 and (2 * n) % 16 == 0
        assert prog._executor.last_variant == ("wgmma_only" if mappable else "general")
        value, bound = evaluate(g, host)[g.outputs["c"].index]
        assert_close(out.float().cpu().numpy(), value, bound, "wgmma-only, torch tensors")


@pytest.mark.gpu
def test_wgmma_only_kernel_not_taken(rng):
    """What the variant does not run takes the general kernel, with the same results: an
    activation (a staged epilogue), an operand without a tensor map, a traced run, a program
    with another op."""
    torch = pytest.importorskip("torch")
    g = epilogue_graph(200, 128, 300, dtype="bfloat16", out_dtype="float32", activation="relu")
    with megak.compile(g, backend="cuda", n_sm=2) as prog:
        check_graph(prog, g, rng, "relu")
        assert prog._executor.last_variant == "general"
    g = epilogue_graph(200, 128, 300, dtype="bfloat16", out_dtype="float32")
    with megak.compile(g, backend="cuda", n_sm=2) as prog:
        check_graph(prog, g, rng, "plain")
        assert prog._executor.last_variant == "wgmma_only"
        host = random_inputs(g, rng)
        dev = {name: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16).cuda()
               for name, v in host.items()}
        wide = torch.zeros((200, 131), dtype=torch.bfloat16, device="cuda")
        wide[:, :128] = dev["a"]
        dev["a"] = wide[:, :128]                 # row stride 262 B: no tensor map
        out = torch.full((200, 300), float("nan"), device="cuda", dtype=torch.float32)
        prog.run(out={"c": out}, **dev)
        assert prog._executor.last_variant == "general"
        value, bound = evaluate(g, host)[g.outputs["c"].index]
        assert_close(out.cpu().numpy(), value, bound, "no map for a")
        prog.run(trace=True, **{k: v for k, v in host.items()})
        assert prog._executor.last_variant == "trace"
    mixed = megak.Graph()
    a = mixed.input("a", (200, 128), "bfloat16")
    b = mixed.input("b", (128, 300), "bfloat16")
    mixed.output(mixed.gemm(a, b, out_dtype="float32"), "c")
    mixed.output(mixed.transpose(mixed.input("x", (64, 96), "float32")), "t")
    with megak.compile(mixed, backend="cuda", n_sm=2) as prog:
        check_graph(prog, mixed, rng, "gemm + add")
        assert prog._executor.last_variant == "general"


@pytest.mark.gpu
def test_wgmma_only_kernel_runs_split_k(rng):
    """A split-K wgmma GEMM (fp32 partials from wgmma tiles, then reduces that sum them and
    run the epilogue) takes the MK_WGMMA_ONLY kernel whatever its epilogue: 12 random
    programs of 1 or 2 output tiles on 16 SMs (split in 8 or more, a K tail in the last
    part; M > 64, which would stream B instead), 3 runs each on fresh inputs, every output
    against float64. The chained ring stands still across the reduces between an SM's
    tiles."""
    for i in range(12):
        m, n = int(rng.integers(gemm.STREAM_M + 1, 257)), int(rng.integers(1, 257))
        k = int(rng.integers(1024, 3000))
        epi = EPILOGUES[i % len(EPILOGUES)]
        g = epilogue_graph(m, k, n, dtype="bfloat16", out_dtype=("bfloat16", "float32")[i % 2],
                           **epi)
        with megak.compile(g, backend="cuda", n_sm=16) as prog:
            ops = prog.stats["instructions_per_opcode"]
            assert ops.get("reduce", 0) > 0 and ops["gemm"] >= 8, (i, m, k, n, ops)
            for run in range(3):
                check_graph(prog, g, rng, f"split {i} ({m}x{k}x{n}, {epi}) run {run}")
                assert prog._executor.last_variant == "wgmma_only", (i, m, k, n, epi)


@pytest.mark.gpu
def test_wgmma_only_chained_ring_stress(rng):
    """The MK_WGMMA_ONLY kernel's one ring across a queue (device/pages.cuh): 16 random
    programs of one or two chained GEMMs (the second reads the first's output through TMA),
    with or without a bias, on 1 or 2 SMs so that up to dozens of tiles of both GEMMs follow
    each other in one ring, K from 1 to 700 (1 to 11 stages per tile, K tails), 3 runs each on
    fresh inputs, every output against float64."""
    for i in range(16):
        # M > 128: at least 2 tiles, never split over K on 2 SMs (only GEMM tiles here)
        m, k, n = int(rng.integers(129, 600)), int(rng.integers(1, 700)), int(rng.integers(8, 700))
        g = megak.Graph()
        kw = {"bias": g.input("bias", (n,), "bfloat16")} if i % 2 else {}
        y = g.gemm(g.input("a", (m, k), "bfloat16"), g.input("b", (k, n), "bfloat16"), **kw)
        if i % 4 < 2:
            n2 = int(rng.integers(8, 400))
            g.output(g.gemm(y, g.input("w", (n, n2), "bfloat16"), out_dtype="float32"), "c")
        else:
            g.output(y, "c")
        with megak.compile(g, backend="cuda", n_sm=1 + i % 2) as prog:
            for run in range(3):
                check_graph(prog, g, rng, f"chained {i} ({m}x{k}x{n}) run {run}")
                assert prog._executor.last_variant == "wgmma_only", (i, m, k, n)


@pytest.mark.gpu
def test_wgmma_only_narrow_stress(rng):
    """The n128 build of the MK_WGMMA_ONLY kernel (device/pages.cuh, MK_WGMMA_NARROW): 12
    random programs of one or two chained GEMMs whose every tile is at most 128 columns wide
    (narrow tiles on many SMs, or N <= 128 on 1 or 2 SMs: tiles back to back in one ring), K
    from 1 to 700, with or without a bias, 3 runs each on fresh inputs against float64."""
    for i in range(12):
        many = i % 3 == 0
        m, k = int(rng.integers(129, 600)), int(rng.integers(1, 700))
        n = int(rng.integers(257, 700)) if many else int(rng.integers(1, 129))
        n_sm = 64 if many else 1 + i % 2
        g = megak.Graph()
        kw = {"bias": g.input("bias", (n,), "bfloat16")} if i % 2 else {}
        y = g.gemm(g.input("a", (m, k), "bfloat16"), g.input("b", (k, n), "bfloat16"), **kw)
        if not many and i % 4 < 2:
            n2 = int(rng.integers(1, 129))
            g.output(g.gemm(y, g.input("w", (n, n2), "bfloat16"), out_dtype="float32"), "c")
        else:
            g.output(y, "c")
        with megak.compile(g, backend="cuda", n_sm=n_sm) as prog:
            assert prog._executor.wgmma_only_n == 128, (i, m, k, n, n_sm)
            for run in range(3):
                check_graph(prog, g, rng, f"narrow {i} ({m}x{k}x{n}, {n_sm} SMs) run {run}")
                assert prog._executor.last_variant == "wgmma_only", (i, m, k, n)


@pytest.mark.gpu
def test_wgmma_stress(rng):
    """The ring the loader produces, many times over: 24 random GEMMs (every epilogue, both
    output dtypes) on 1 to 3 SMs, so tiles run back to back (barriers initialised again per
    tile, pages handed back before a register epilogue), 4 runs each on fresh inputs, every
    output against float64."""
    for i in range(24):
        m, k, n = int(rng.integers(65, 520)), int(rng.integers(1, 700)), int(rng.integers(1, 800))
        epi = EPILOGUES[i % len(EPILOGUES)]
        out_dtype = ("bfloat16", "float32")[i % 2]
        g = epilogue_graph(m, k, n, dtype="bfloat16", out_dtype=out_dtype, **epi)
        prog = megak.compile(g, backend="cuda", n_sm=int(rng.integers(1, 4)))
        try:
            assert len(wgmma_records(prog)) > 0
            for run in range(4):
                check_graph(prog, g, rng, f"stress {i} ({m}x{k}x{n}, {epi}) run {run}")
        finally:
            prog.close()
