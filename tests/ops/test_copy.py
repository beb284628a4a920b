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


def takers_of(prog):
    ins = prog.plan.instrs
    return ins[(ins["opcode"] == copy.OP.opcode) & ((ins["flags"] & abi.FLAG_COPY_TAKE) != 0)]


@pytest.mark.parametrize("shape, n_sm, takers, bands", [
    ((16384, 16384), 132, 132, 131072),  # W5: a 64 KiB row is eight bands
    ((5000, 1000), 132, 132, 2442),      # 250 units a row: bands straddle rows
    ((300, 129), 4, 3, 19),              # 3 blocks' worth of bands: a taker each
    ((7, 1 << 16), 8, 8, 224)])          # a row is 32 bands
def test_a_copy_nothing_reads_is_taken_in_turn(shape, n_sm, takers, bands):
    from megak.runtime import take_model
    from megak.scheduler import build_plan
    g = megak.Graph()
    g.output(g.copy(g.input("x", shape, "float32")), "y")
    plan = build_plan(g, n_sm, memory_bytes=1 << 40)
    ins = plan.instrs
    assert len(ins) == takers and (ins["flags"] & abi.FLAG_COPY_TAKE == abi.FLAG_COPY_TAKE).all()
    assert (ins["row0"] == 0).all() and (ins["rows"] == shape[0]).all()
    assert (ins["col0"] == 0).all() and (ins["cols"] == shape[1]).all()
    assert (ins["k0"] == takers).all() and sorted(ins["param"].tolist()) == list(range(takers))
    assert copy.take_bands(*shape) == bands
    assert copy.TAKE_UNITS * 16 == 8 << 10 and copy.TAKE_BLOCK_UNITS * 16 == 64 << 10
    # one hand-out counter, its per-run target the model's: every band, and each taker
    # warp's last take that finds none left
    (c,) = set(ins["out_row0"].tolist())
    assert (int(plan.counter_targets[c]) == take_model.per_run_count(takers, bands, 8)
            == bands + 8 * takers)
    sm = np.searchsorted(plan.queue_start, np.arange(len(ins)), side="right")
    assert len(set(sm.tolist())) == takers                       # one per SM
    assert copy.OP.bodies(ins) == 1 << copy.OP.opcode | abi.BODY_COPY_TAKE


def test_take_shares_cover_the_rows_once():
    for takers, rows in [(1, 5), (3, 3), (4, 3), (132, 16384), (7, 100)]:
        covered = np.zeros(rows, int)
        for k in range(takers):
            lo, hi = copy.take_share(k, takers, rows)
            covered[lo:hi] += 1
        assert (covered == 1).all()


def test_a_copy_read_in_the_graph_or_of_one_blocks_worth_is_dealt_out():
    from megak.scheduler import build_plan
    g = megak.Graph()
    y = g.copy(g.input("x", (5000, 1000), "float32"))
    g.output(g.transpose(y), "t")          # read inside the graph: its readers wait for rows
    g.output(g.copy(g.input("v", (1, 32), "float32")), "w")   # one band
    g.output(g.copy(g.input("u", (64, 256), "float32")), "s")  # 64 KiB: one block's worth
    ins = build_plan(g, 132).instrs
    copies = ins[ins["opcode"] == copy.OP.opcode]
    assert not (copies["flags"] & abi.FLAG_COPY_TAKE).any()
    assert copy.OP.bodies(copies) == 1 << copy.OP.opcode


def test_takers_consumers_wait_for_the_whole_copy():
    # a graph output that is also read by nothing: takers. Placed behind a producer, every
    # taker waits for all of it, and the op's counter is what nothing else could wait on
    from megak.scheduler import build_plan
    g = megak.Graph()
    a = g.add(g.input("x", (600, 300), "float32"), g.input("z", (600, 300), "float32"))
    g.output(g.copy(a), "y")
    ins = build_plan(g, 8).instrs
    takers = ins[(ins["flags"] & abi.FLAG_COPY_TAKE) != 0]
    adds = ins[ins["opcode"] != copy.OP.opcode]
    assert len(takers) == 8 and (takers["n_waits"] == 1).all()
    (waited,) = set(takers["wait_counter"][:, 0].tolist())
    assert (adds["signal_counter"][:, :adds["n_signals"].max()] == waited).any(axis=1).all()
    assert (takers["wait_target"][:, 0] == len(adds)).all()


@pytest.mark.parametrize("shape", [(300, 129), (1025, 257), (7, 70000)])
def test_takers_copy_exactly_run_after_run(backend, rng, shape):
    # the hand-out counter advances a run's bands + 8 takers per run: every run's bands are
    # handed out again, with fresh inputs each time (check_graph: outputs against float64)
    g = megak.Graph()
    g.output(g.copy(g.input("x", shape, "float32")), "y")
    with megak.compile(g, backend=backend, **({"n_sm": 4} if backend == "sim" else {})) as prog:
        assert len(takers_of(prog)) > 1
        for i in range(5):
            inputs, out = check_graph(prog, g, rng, f"copy {shape} run {i}")
            np.testing.assert_array_equal(out["y"], inputs["x"])


def test_takers_after_a_failed_run(backend, rng):
    # a taker that never starts (its wait planted one past its target) leaves the counter
    # part-way through a run: the run fails, the counters are zeroed, and the next runs hand
    # out every band again from epoch 0
    g = megak.Graph()
    a = g.add(g.input("x", (600, 300), "float32"), g.input("z", (600, 300), "float32"))
    g.output(g.copy(a), "y")
    opts = {"n_sm": 4} if backend == "sim" else {"timeout_s": 0.5}
    with megak.compile(g, backend=backend, **opts) as prog:
        ins = prog.plan.instrs
        takers = np.nonzero((ins["flags"] & abi.FLAG_COPY_TAKE) != 0)[0]
        assert len(takers) > 1
        original = ins.copy()
        for _ in range(2):
            check_graph(prog, g, rng, "before the failure")
        ins["wait_target"][takers[-1], 0] += 1
        prog._executor.reload_queues()
        with pytest.raises(megak.MegakernelHang):
            prog.run(x=np.ones((600, 300), np.float32), z=np.ones((600, 300), np.float32))
        prog.plan.instrs[:] = original
        prog._executor.reload_queues()
        for i in range(3):
            check_graph(prog, g, rng, f"run {i} after the failure")


@pytest.mark.gpu
def test_takers_stress_sizes_and_epochs():
    # copies of 2 to 16,384 bands on every SM, some with fewer bands than SMs, odd widths,
    # run again and again with the output poisoned each time; a bound program's runs too
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    rng = np.random.default_rng(5)
    for shape in [(2048, 4096), (16384, 1024), (3001, 4099), (100_003, 5), (2, 70000),
                  (131, 16384), (133, 16384)]:
        g = megak.Graph()
        g.output(g.copy(g.input("x", shape, "float32")), "y")
        with megak.compile(g, backend="cuda") as prog:
            assert len(takers_of(prog)) > 1
            out = np.full(shape, np.nan, np.float32)
            for run in range(6):
                x = rng.uniform(-1, 1, shape).astype(np.float32)
                out[...] = np.nan
                prog.run(x=x, out={"y": out})
                np.testing.assert_array_equal(out, x, err_msg=f"copy {shape} run {run}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(300, 129), (2048, 1000), (7, 70000)])
def test_takers_on_tensors_not_16_byte_aligned(shape):
    # a caller's tensors 4 B past a 16-B boundary: no taker takes a band, each copies its
    # share of the rows and adds its share of the count; runs on aligned tensors before and
    # after it find the counter where they expect it
    torch = pytest.importorskip("torch")
    from megak.runtime.driver import gpu_usable
    if not gpu_usable():
        pytest.skip("needs a GPU")
    rows, cols = shape
    g = megak.Graph()
    g.output(g.copy(g.input("x", shape, "float32")), "y")
    gen = torch.Generator(device="cuda").manual_seed(3)

    def tensors(offset):
        buf_x = torch.rand(rows * cols + 4, device="cuda", generator=gen)
        buf_y = torch.full((rows * cols + 4,), float("nan"), device="cuda")
        return (buf_x[offset:offset + rows * cols].view(rows, cols),
                buf_y[offset:offset + rows * cols].view(rows, cols))

    with megak.compile(g, backend="cuda") as prog:
        assert len(takers_of(prog)) > 1
        for run, offset in enumerate([0, 1, 1, 0, 3, 0]):
            x, y = tensors(offset)
            assert (x.data_ptr() % 16 == 0) == (offset == 0)
            prog.run(x=x, out={"y": y})
            assert torch.equal(y, x), f"copy {shape} run {run} offset {offset}"


def test_a_taker_record_out_of_its_limits_is_refused(backend, rng):
    # mk_copy_check: a taker's index below the takers, a body of float4 units to walk; and
    # mk_validate: a counter id the program has. The next good run finds its counter zeroed
    g = megak.Graph()
    g.output(g.copy(g.input("x", (300, 129), "float32")), "y")
    with megak.compile(g, backend=backend, **({"n_sm": 4} if backend == "sim" else {})) as prog:
        original = prog.plan.instrs.copy()
        for field, value in [("param", 3), ("k0", 0), ("cols", 3), ("out_row0", 99)]:
            prog.plan.instrs[:] = original
            prog.plan.instrs[field][0] = value
            prog._executor.reload_queues()
            with pytest.raises(megak.MegakernelError, match="MK_ERR_BAD_DESCRIPTOR"):
                prog.run(x=np.zeros((300, 129), np.float32))
        prog.plan.instrs[:] = original
        prog._executor.reload_queues()
        check_graph(prog, g, rng, "after the refused records")
