import numpy as np
import pytest

import megak
from megak import abi
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
        assert rn <= transpose.TILE and cn <= transpose.TILE
        cover[r0:r0 + rn, c0:c0 + cn] += 1
    assert (cover == 1).all()
    # each tile reads the mirrored region of x
    reads = low.reads[0]
    r0, rn, c0, cn = low.tile_regions()
    np.testing.assert_array_equal(reads.r0, c0)
    np.testing.assert_array_equal(reads.c1, r0 + rn)


@pytest.mark.parametrize("shape", [(300, 1100), (256, 512), (129, 640)])
def test_transpose_of_many_tiles_per_sm(backend, rng, shape):
    """Few SMs for many tiles: on the GPU the loader copies each whole tile into its
    instruction's pages while the tile before it is stored (the paged path); the edge tiles
    between them take the register path."""
    g = megak.Graph()
    x = g.input("x", shape, "float32")
    g.output(g.transpose(x), "y")
    prog = megak.compile(g, backend=backend, n_sm=2)
    ins = prog.plan.instrs
    whole = (ins["rows"] == transpose.TILE) & (ins["cols"] == transpose.TILE)
    assert whole.sum() >= 4 and (ins["pages"] == transpose.PAGES).all()
    inputs, out = check_graph(prog, g, rng, f"transpose {shape}")
    np.testing.assert_array_equal(out["y"], inputs["x"].T)


def test_transpose_page_plan():
    """A whole tile: every page preloaded after the wait, read by the op, handed back after
    it; an edge tile: its pages unused."""
    g = megak.Graph()
    x = g.input("x", (130, 256), "float32")
    g.output(g.transpose(x), "y")
    prog = megak.compile(g, backend="sim", n_sm=2)
    for rec in prog.plan.instrs:
        plan = transpose.OP.page_plan(rec, "float32")
        if rec["rows"] == transpose.TILE and rec["cols"] == transpose.TILE:
            assert plan.preload_early == () and plan.preload_late == (0, 1, 2, 3)
            assert plan.phases == (((0, 1, 2, 3), ()),)
        else:
            assert plan.preload_late == () and plan.phases == (((), ()),)


@pytest.mark.gpu
@pytest.mark.parametrize("offset, width", [(1, 260), (0, 257), (4, 264)])
def test_transpose_of_views_the_loader_cannot_copy(rng, offset, width):
    """torch views whose rows start off a 16-B boundary (offset 1, or a row pitch of 257
    floats) have no tensor map and take the register path on whole tiles; an aligned view
    (offset 4, pitch 264) gets its map and the paged path. Each result exact, outputs
    poisoned first."""
    torch = pytest.importorskip("torch")
    g = megak.Graph()
    x = g.input("x", (256, 256), "float32")
    g.output(g.transpose(x), "y")
    prog = megak.compile(g, backend="cuda", n_sm=2)
    base = torch.from_numpy(rng.uniform(-1, 1, (256, width)).astype(np.float32)).cuda()
    view = base[:, offset:offset + 256]
    assert view.stride() == (width, 1)
    y = torch.full((256, 256), float("nan"), device="cuda")
    prog.run(x=view, out={"y": y})
    torch.cuda.synchronize()
    np.testing.assert_array_equal(y.cpu().numpy(), view.cpu().numpy().T)


@pytest.mark.gpu
@pytest.mark.parametrize("offset, width", [(1, 260), (0, 257), (4, 264)])
def test_transpose_into_views_the_stores_cannot_describe(rng, offset, width):
    """OUT views whose rows start off a 16-B boundary have no tensor map: whole tiles take the
    register path though x has its map; an aligned view (offset 4, pitch 264) gets its map,
    and the paged tiles' TMA stores write into it at its pitch. Each result exact, and the
    columns of the base around the view still hold the poison."""
    torch = pytest.importorskip("torch")
    g = megak.Graph()
    x = g.input("x", (256, 256), "float32")
    g.output(g.transpose(x), "y")
    prog = megak.compile(g, backend="cuda", n_sm=2)
    xs = torch.from_numpy(rng.uniform(-1, 1, (256, 256)).astype(np.float32)).cuda()
    base = torch.full((256, width), float("nan"), device="cuda")
    view = base[:, offset:offset + 256]
    prog.run(x=xs, out={"y": view})
    torch.cuda.synchronize()
    np.testing.assert_array_equal(view.cpu().numpy(), xs.cpu().numpy().T)
    around = torch.cat([base[:, :offset], base[:, offset + 256:]], dim=1)
    assert torch.isnan(around).all()


@pytest.mark.gpu
def test_tiles_stored_by_tma_feed_consumers_on_other_sms(rng):
    """Transposes whose outputs other instructions read, on 4 SMs: x -> T -> T (its A read by
    the loader's TMA copies of the first T's stores) -> copy (generic loads); the signalling
    records wait for their stores' writes before the signal. 20 runs on fresh inputs, every
    stage exact on outputs poisoned before each run."""
    torch = pytest.importorskip("torch")
    g = megak.Graph()
    x = g.input("x", (512, 768), "float32")
    t1 = g.transpose(x)
    t2 = g.transpose(t1)
    g.output(t1, "t1")
    g.output(t2, "t2")
    g.output(g.copy(t2), "c")
    prog = megak.compile(g, backend="cuda", n_sm=4)
    try:
        ins = prog.plan.instrs
        tiles = (ins["opcode"] == transpose.OP.opcode) & (ins["rows"] == transpose.TILE) & \
                (ins["cols"] == transpose.TILE)
        assert tiles.sum() == 48 and (ins["n_signals"][tiles] > 0).sum() >= 24
        for _ in range(20):
            xs = torch.from_numpy(rng.uniform(-1, 1, (512, 768)).astype(np.float32)).cuda()
            out = {"t1": torch.full((768, 512), float("nan"), device="cuda"),
                   "t2": torch.full((512, 768), float("nan"), device="cuda"),
                   "c": torch.full((512, 768), float("nan"), device="cuda")}
            prog.run(x=xs, out=out)
            torch.cuda.synchronize()
            want = xs.cpu().numpy()
            np.testing.assert_array_equal(out["t1"].cpu().numpy(), want.T)
            np.testing.assert_array_equal(out["t2"].cpu().numpy(), want)
            np.testing.assert_array_equal(out["c"].cpu().numpy(), want)
    finally:
        prog.close()


@pytest.mark.gpu
def test_paged_transpose_of_a_tensor_past_the_table_head(rng):
    """x's table slot lies past the MK_TABLE_HEAD entries (and ready words) a launched block
    copies at its entry: the loader reads x's tensor-map ready word from global memory, and
    the whole tiles still take the paged path; exact, outputs poisoned first."""
    g = megak.Graph()
    for i in range(abi.LIMITS["MK_TABLE_HEAD"]):
        g.output(g.copy(g.input(f"c{i}", (1, 4))), f"d{i}")
    g.output(g.transpose(g.input("x", (256, 256))), "y")
    prog = megak.compile(g, backend="cuda", n_sm=2)
    ins = prog.plan.instrs
    a = ins[ins["opcode"] == transpose.OP.opcode]["tensor"][:, abi.ARG_A]
    assert (a >= abi.LIMITS["MK_TABLE_HEAD"]).all() and len(a) == 4
    inputs, out = check_graph(prog, g, rng, "transpose past the head")
    np.testing.assert_array_equal(out["y"], inputs["x"].T)


@pytest.mark.gpu
def test_paged_tiles_under_stress_then_a_stop_and_recovery(rng):
    """32 whole tiles on each of 2 SMs (the loader up to two records ahead, three tiles in
    flight), 30 runs on fresh inputs, each exact on an output poisoned before it; then a run in
    which one SM's tenth transpose waits for a counter never reached (its loader stops with
    the tiles before it issued, and drains them), reported as a hang; then exact again."""
    torch = pytest.importorskip("torch")
    g = megak.Graph()
    x = g.input("x", (1024, 512), "float32")
    g.output(g.transpose(g.copy(x)), "y")
    prog = megak.compile(g, backend="cuda", n_sm=2, timeout_s=1.0)

    def exact_runs(n, what):
        for _ in range(n):
            xs = torch.from_numpy(rng.uniform(-1, 1, (1024, 512)).astype(np.float32)).cuda()
            y = torch.full((512, 1024), float("nan"), device="cuda")
            prog.run(x=xs, out={"y": y})
            torch.cuda.synchronize()
            np.testing.assert_array_equal(y.cpu().numpy(), xs.cpu().numpy().T, err_msg=what)

    try:
        ins = prog.plan.instrs
        paged = (ins["opcode"] == transpose.OP.opcode) & (ins["rows"] == transpose.TILE) & \
                (ins["cols"] == transpose.TILE)
        assert paged.sum() == 32
        exact_runs(30, "paged transposes")
        waiting = np.nonzero(paged & (ins["n_waits"] > 0))[0]
        i = int(waiting[min(9, len(waiting) - 1)])
        original = ins.copy()
        ins["wait_target"][i, 0] += 1   # one above the signals the counter gets per run
        prog._executor.reload_queues()
        with pytest.raises(megak.MegakernelHang):
            prog.run(x=rng.uniform(-1, 1, (1024, 512)).astype(np.float32))
        ins[:] = original
        prog._executor.reload_queues()
        exact_runs(3, "paged transposes after the stop")
    finally:
        prog.close()
