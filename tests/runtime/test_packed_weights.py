"""Constants (Graph.constant) and the weight stream's packed B (runtime/packed_weights.py,
instr.h mk_packed_b): the packing against the readers' page layout, which constants are
packed, the API's checks, and runs on the simulator (which reads packed constants back
through the inverse) and the GPU (which streams them by 1-D bulk copies)."""
import numpy as np
import pytest

import megak
from megak import abi
from megak.dtypes import numpy_dtype
from megak.errors import GraphError
from megak.ops import gemm
from megak.runtime import packed_weights as pw
from tests.reference import assert_close, evaluate

BF16 = numpy_dtype("bfloat16")
FORMS = [pw.PACKED_READY, pw.PACKED_NARROW_READY]


def bf16(rng, shape, scale=1.0):
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(BF16)


# -- the packing ----------------------------------------------------------------------------

def element_at(form: int, stages: int, k: int, n: int) -> int:
    """Byte offset of B[k, n] in the packed image, from the readers' layout as
    device/ops/gemm_stream.cuh states it (written out here, not through pack)."""
    if form == pw.PACKED_READY:         # 64 columns x 128 k-rows, the 128-B swizzle
        band, col = divmod(n, 64)
        stage, r = divmod(k, 128)
        chunk, e = divmod(col, 8)
        inside = 128 * r + 16 * (chunk ^ (r & 7)) + 2 * e
    else:                               # two boxes of 32 columns x 128 k-rows, the 64-B one
        band, col = divmod(n, 32)
        stage, kk = divmod(k, 256)
        half, r = divmod(kk, 128)
        chunk, e = divmod(col, 8)
        inside = half * 8192 + 64 * r + 16 * (chunk ^ ((r >> 1) & 3)) + 2 * e
    return (band * stages + stage) * abi.PAGE_BYTES + inside


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("k,n", [(1, 1), (128, 64), (300, 70), (257, 33), (1024, 96)])
def test_pack_lays_out_pages_as_the_readers_take_them(rng, form, k, n):
    b = bf16(rng, (k, n))
    image = pw.pack(b, form)
    bands, stages = pw.geometry(k, n, form)
    assert image.dtype == np.uint8 and len(image) == bands * stages * abi.PAGE_BYTES
    assert len(image) == pw.packed_bytes(k, n, form)
    bits = b.view(np.uint16)
    words = image.view(np.uint16)
    filled = np.zeros(len(words), dtype=bool)
    for kk in range(k):
        for nn in range(n):
            at = element_at(form, stages, kk, nn) // 2
            assert words[at] == bits[kk, nn], (kk, nn)
            filled[at] = True
    assert (words[~filled] == 0).all(), "bytes past the tensor must be zeros"
    assert (pw.unpack(image, k, n, form) == bits).all()


def test_descriptor_is_an_mk_packed_b():
    slot = pw.descriptor(0x7F00_0000_1000, 300, 70, pw.PACKED_NARROW_READY)
    assert len(slot) == abi.TMAP_BYTES and abi.PACKED_B_DTYPE.itemsize == 16
    d = slot[:16].view(abi.PACKED_B_DTYPE)[0]
    assert (int(d["ptr"]), int(d["bands"]), int(d["stages"])) == (0x7F00_0000_1000, 3, 2)
    assert not slot[16:].any()


def chain(m, k, n, layers=2, constant=True, rng=None):
    g = megak.Graph()
    h = x = g.input("x", (m, k), "bfloat16")
    for i in range(layers):
        cols = n if i == layers - 1 else k
        value = bf16(rng, (k, cols), 1 / np.sqrt(k))
        w = g.constant(f"w{i}", value) if constant else g.input(f"w{i}", (k, cols), "bfloat16")
        h = g.gemm(h, w)
        g.output(h, f"h{i}")
    return g, x


def test_streamed_constants_are_packed_for_their_form(rng):
    # batch 16 of 1024 x 1024: narrow bands; batch 32 of 4096 x 4096: wide bands of two
    # parts; batch 64: two row bands read every page, not packed
    for m, k, form in ((16, 1024, pw.PACKED_NARROW_READY), (32, 4096, pw.PACKED_READY),
                       (64, 1024, None)):
        g, _ = chain(m, k, k, layers=1, rng=rng)
        plan = megak.compile(g, backend="sim").plan
        parts = set((plan.instrs["param"] >> 16).tolist())
        assert form != pw.PACKED_READY or parts != {1}
        assert pw.packed_forms(plan.instrs, plan.constant_values) == (
            {t.index: form for t in g.constants.values()} if form else {})
    # fp32 and many-row GEMMs are not streamed; a constant read as the A of a GEMM neither
    g = megak.Graph()
    a = g.constant("a", np.ones((128, 64), np.float32))
    g.output(g.gemm(a, g.input("b", (64, 32))), "y")
    plan = megak.compile(g, backend="sim").plan
    assert pw.packed_forms(plan.instrs, plan.constant_values) == {}


def test_only_a_program_with_packed_constants_builds_the_packed_stream(rng):
    # (instr.h MK_BODY_STREAM_PACKED: its readers' per-lane hand-back costs the input-weight
    # chains, so no other program's build has it)
    from megak import ops
    from megak.runtime.executor import program_bodies
    for constant in (True, False):
        g, _ = chain(16, 1024, 1024, 2, constant=constant, rng=rng)
        plan = megak.compile(g, backend="sim").plan
        mask = program_bodies(plan.instrs, pw.packed_forms(plan.instrs, plan.constant_values))
        assert bool(mask & abi.BODY_STREAM_PACKED) == constant
        assert mask & ~abi.BODY_STREAM_PACKED == ops.bodies(plan.instrs)


def test_a_constant_wanted_by_another_tma_copy_keeps_its_map():
    # B of a streamed GEMM (batch 16) and B of a wgmma GEMM (batch 256): not packed
    rng = np.random.default_rng(0)
    g = megak.Graph()
    w = g.constant("w", bf16(rng, (256, 256)))
    g.output(g.gemm(g.input("x", (16, 256), "bfloat16"), w), "y")
    g.output(g.gemm(g.input("z", (256, 256), "bfloat16"), w), "v")
    plan = megak.compile(g, backend="sim").plan
    flags = plan.instrs["flags"].astype(np.int64)
    assert (flags & abi.FLAG_STREAM).any() and (flags & abi.FLAG_WGMMA).any()
    assert pw.packed_forms(plan.instrs, plan.constant_values) == {}


# -- the API --------------------------------------------------------------------------------

def test_constant_is_a_snapshot_and_not_a_run_keyword(rng):
    value = bf16(rng, (64, 32))
    g = megak.Graph()
    x = g.input("x", (4, 64), "bfloat16")
    w = g.constant("w", value)
    assert "constant 'w'" in repr(w) and w.shape == (64, 32) and w.dtype == "bfloat16"
    g.output(g.gemm(x, w), "y")
    expect = evaluate(g, {"x": (xv := bf16(rng, (4, 64)))})[g.outputs["y"].index]
    value[:] = 0                           # the graph copied it
    prog = megak.compile(g, backend="sim")
    assert_close(prog.run(x=xv)["y"], *expect, "constant", "bfloat16")
    with pytest.raises(GraphError, match="unknown inputs"):
        prog.run(x=xv, w=value)


@pytest.mark.parametrize("value,match", [
    (np.zeros((4, 4), np.float64), "not supported"),
    (np.zeros((2, 2, 2), np.float32), "2-D"),
    (np.zeros((0, 4), np.float32), "positive"),
    ([[1.0]], "expected a numpy array"),
])
def test_constant_refuses_what_it_cannot_hold(value, match):
    with pytest.raises(GraphError, match=match):
        megak.Graph().constant("w", value)


def test_constant_names_and_outputs():
    g = megak.Graph()
    g.input("x", (2, 2))
    with pytest.raises(GraphError, match="duplicate name"):
        g.constant("x", np.ones((2, 2), np.float32))
    c = g.constant("c", np.ones((2, 2), np.float32))
    with pytest.raises(GraphError, match="duplicate name"):
        g.input("c", (2, 2))
    with pytest.raises(GraphError, match="is a constant"):
        g.output(c, "y")
    with pytest.raises(GraphError, match="identifier"):
        g.constant("not a name", np.ones((2, 2), np.float32))


def test_a_vector_constant_is_one_row(rng):
    g = megak.Graph()
    x = g.input("x", (3, 8))
    bias = g.constant("bias", np.arange(8, dtype=np.float32))
    assert bias.shape == (8,)
    g.output(g.add(x, bias), "y")
    xv = rng.random((3, 8), dtype=np.float32)
    y = megak.compile(g, backend="sim").run(x=xv)["y"]
    assert np.array_equal(y, xv + np.arange(8, dtype=np.float32))


# -- runs -------------------------------------------------------------------------------------

def run_chain(backend, g, x, rng):
    with megak.compile(g, backend=backend) as prog:
        check_runs(prog, g, x, rng, backend)


def check_runs(prog, g, x, rng, what):
    """Two runs of the chain `g` on fresh inputs, outputs poisoned, against float64."""
    m, k = x.shape
    out = {name: np.full(t.shape, np.nan, dtype=BF16) for name, t in g.outputs.items()}
    for _ in range(2):
        xv = bf16(rng, (m, k))
        env = evaluate(g, {"x": xv})
        res = prog.run(x=xv, out=out)
        for name, t in g.outputs.items():
            assert_close(res[name], *env[t.index], f"{what} {name}", "bfloat16")
            out[name][:] = np.nan


CASES = [(16, 1024, 1024, 3), (1, 1024, 1024, 2), (5, 4096, 512, 2), (32, 1024, 1024, 2),
         (24, 300, 200, 2), (16, 200, 70, 2), (7, 1000, 37, 2), (64, 1024, 1024, 2),
         (40, 300, 200, 2)]


@pytest.mark.parametrize("m,k,n,layers", CASES)
def test_streamed_chain_with_constant_weights(backend, rng, m, k, n, layers):
    # narrow bands (batch 1-16), wide bands of several parts (batch 5 of 4096, 32), shapes
    # whose last box and band are short; two row bands (40, 64): constants, not packed
    g, x = chain(m, k, n, layers, rng=rng)
    plan = megak.compile(g, backend="sim").plan
    packed = pw.packed_forms(plan.instrs, plan.constant_values)
    assert bool(packed) == (m <= gemm.STREAM_TILE_M), packed
    run_chain(backend, g, x, rng)


def test_constants_beside_input_weights_and_other_readers(backend, rng):
    # a packed constant, an input weight, and a constant bias read by the epilogue
    g = megak.Graph()
    x = g.input("x", (8, 512), "bfloat16")
    h = g.gemm(x, g.constant("w0", bf16(rng, (512, 512), 1 / np.sqrt(512))),
               bias=g.constant("b0", bf16(rng, (512,))), activation="relu")
    h = g.gemm(h, g.input("w1", (512, 256), "bfloat16"))
    g.output(h, "y")
    inputs = {"x": bf16(rng, (8, 512)), "w1": bf16(rng, (512, 256), 1 / np.sqrt(512))}
    env = evaluate(g, inputs)
    with megak.compile(g, backend=backend) as prog:
        assert_close(prog.run(**inputs)["y"], *env[g.outputs["y"].index], backend, "bfloat16")


@pytest.mark.gpu
def test_packed_constants_on_the_gpu_take_the_bulk_path(rng):
    # the table megak uploads carries the packed form for each streamed constant, and the
    # program's build holds the packed stream (instr.h, MK_BODY_STREAM_PACKED); a build
    # without it streams no packed B: each record loads B itself, from the row-major copy
    from megak.runtime import tensor_maps
    g, x = chain(16, 1024, 1024, 2, rng=rng)
    with megak.compile(g, backend="cuda") as prog:
        ex = prog._executor
        ready = tensor_maps.ready_view(ex._table_image, ex._n_tensors)
        for t in g.constants.values():
            assert ready[t.index] == pw.PACKED_NARROW_READY
            assert t.index not in ex._map_boxes
        assert ex.bodies & abi.BODY_STREAM_PACKED
        check_runs(prog, g, x, rng, "packed stream")
        own = ex.bodies
        ex._use_bodies(own & ~abi.BODY_STREAM_PACKED)
        check_runs(prog, g, x, rng, "a build without the packed stream")
        ex._use_bodies(own)
        check_runs(prog, g, x, rng, "packed stream again")
    g_in, x = chain(16, 1024, 1024, 2, constant=False, rng=rng)
    with megak.compile(g_in, backend="cuda") as prog:
        assert not prog._executor.bodies & abi.BODY_STREAM_PACKED   # input weights: maps


@pytest.mark.gpu
def test_packed_constants_in_bound_calls_and_resident_requests(rng):
    torch = pytest.importorskip("torch")
    g, x = chain(16, 1024, 1024, 3, rng=rng)
    xv = bf16(rng, (16, 1024))
    env = evaluate(g, {"x": xv})
    names = list(g.outputs)
    dev = torch.device("cuda")
    xt = torch.from_numpy(xv.view(np.int16)).view(torch.bfloat16).to(dev)
    outs = {n: torch.full(g.outputs[n].shape, float("nan"), dtype=torch.bfloat16, device=dev)
            for n in names}

    def check(what):
        torch.cuda.synchronize()
        for n in names:
            got = outs[n].cpu().view(torch.int16).numpy().view(BF16)
            assert_close(got, *env[g.outputs[n].index], what, "bfloat16")
            outs[n].fill_(float("nan"))

    with megak.compile(g, backend="cuda") as prog:
        for _ in range(3):
            prog.run(x=xt, out=outs)
            check("bound run")
        with megak.resident(prog) as r:
            for _ in range(3):
                r.submit(prog, x=xt, out=outs).wait()
                check("resident request")


@pytest.mark.gpu
def test_packed_stream_stress_against_the_mapped_one():
    # the same chains with the weights as inputs (tensor maps) and as constants (packed):
    # bit for bit the same results, run after run
    rng = np.random.default_rng(7)
    for m, k, n, layers in [(16, 4096, 4096, 2), (32, 2048, 2048, 2), (1, 2048, 1024, 3)]:
        g_const, _ = chain(m, k, n, layers, rng=np.random.default_rng(m))
        g_in, _ = chain(m, k, n, layers, constant=False, rng=np.random.default_rng(m))
        weights = {name: g_const.constant_values[t.index]
                   for name, t in g_const.constants.items()}
        with megak.compile(g_const, backend="cuda") as pc, \
                megak.compile(g_in, backend="cuda") as pi:
            for _ in range(20):
                xv = bf16(rng, (m, k))
                a, b = pc.run(x=xv), pi.run(x=xv, **weights)
                for name in g_const.outputs:
                    assert np.array_equal(a[name].view(np.uint16), b[name].view(np.uint16)), \
                        (m, k, n, name)
