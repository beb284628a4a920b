"""The TMA operands' tensor maps: the table layout from instr.h, which tensors TMA can
describe, the table image with a fake encoder, the map slots of a program and their boxes,
and the executor's tables on the fake driver. Only the `gpu` tests call the real driver."""
import numpy as np
import pytest

from megak import abi
from megak.interop import DeviceArray
from megak.plan import Plan, TensorSlot
from megak.runtime import tensor_maps
from tests.runtime.test_cuda_runtime import fake_gpu  # noqa: F401  (a fixture)

BF16 = abi.DTYPES["MK_DTYPE_BF16"]
F32 = abi.DTYPES["MK_DTYPE_F32"]


def fake_encoder(calls=None):
    """A stand-in for cuTensorMapEncodeTiled: 128 bytes that name its arguments."""
    def enc(ptr, rows, cols, ld, box_rows=128):
        if calls is not None:
            calls.append((ptr, rows, cols, ld) + (() if box_rows == 128 else (box_rows,)))
        return np.array([ptr, rows, cols, ld, box_rows] + [0xA5A5] * 11,
                        dtype=np.uint64).tobytes()
    return enc


# -- layout -----------------------------------------------------------------------------------

def test_constants_come_from_the_header():
    text = abi.HEADER_PATH.read_text()
    assert f"MK_TMAP_BYTES = {abi.TMAP_BYTES}" in text and abi.TMAP_BYTES == 128
    assert abi.FLAG_STREAM == abi.FLAGS["MK_FLAG_STREAM"] == 1024
    assert (abi.STREAM_BOX_COLS, abi.STREAM_BOX_ROWS) == (64, 128)
    assert abi.TENSOR_DTYPE.itemsize == 24


HEAD = 40 * 24   # MK_TABLE_HEAD entries: the least a table holds (a launch copies them)


@pytest.mark.parametrize("n, tmap, total", [
    (0, 0, HEAD),
    (1, 128, HEAD),                     # 128 + 128 + 160 is shorter than the head
    (5, 128, HEAD),                     # 120 B of entries fit below 128; 928 B in all
    (6, 256, 256 + 6 * 128 + 160),      # 144 B do not; the head's 40 ready words
    (16, 384, 384 + 16 * 128 + 160),
    (40, 1024, 1024 + 40 * 132),        # as many ready words as entries from 40 on
    (64, 1536, 1536 + 64 * 132),        # 1536 = 24 * 64 exactly: no padding
])
def test_layout(n, tmap, total):
    assert abi.LIMITS["MK_TABLE_HEAD"] * abi.TENSOR_DTYPE.itemsize == HEAD
    assert abi.tmap_offset(n) == tmap
    assert abi.ready_offset(n) == tmap + 128 * n
    assert abi.table_bytes(n) == total
    # a launched block copies MK_TABLE_HEAD entries and as many ready words
    assert abi.table_bytes(n) >= abi.ready_offset(n) + 4 * abi.LIMITS["MK_TABLE_HEAD"]


def test_maps_are_aligned_and_clear_of_the_entries():
    for n in range(0, 300):
        o = abi.tmap_offset(n)
        assert o % abi.TMAP_BYTES == 0
        assert 24 * n <= o < 24 * n + abi.TMAP_BYTES
        assert abi.ready_offset(n) % 4 == 0


# -- what TMA can describe ------------------------------------------------------------------

@pytest.mark.parametrize("ptr, rows, cols, ld, dtype, ok", [
    (1 << 20, 256, 64, 64, BF16, True),
    (1 << 20, 1, 1, 8, BF16, True),          # smallest: one element, a 16-B row stride
    (1 << 20, 4096, 11008, 11008, BF16, True),
    ((1 << 20) + 16, 256, 64, 64, BF16, True),
    ((1 << 20) + 8, 256, 64, 64, BF16, False),   # base not 16-B aligned
    ((1 << 20) + 2, 256, 64, 64, BF16, False),
    (0, 256, 64, 64, BF16, False),               # no tensor
    (1 << 20, 256, 60, 60, BF16, False),         # row stride 120 B
    (1 << 20, 256, 60, 64, BF16, True),          # padded rows
    (1 << 20, 256, 64, 63, BF16, False),         # a row longer than the stride
    (1 << 20, 0, 64, 64, BF16, False),           # empty
    (1 << 20, 256, 0, 64, BF16, False),
    (1 << 20, 2 ** 32, 64, 64, BF16, True),
    (1 << 20, 2 ** 32 + 1, 64, 64, BF16, False),
    (1 << 20, 2, 8, 2 ** 39 - 8, BF16, True),    # stride 2**40 - 16
    (1 << 20, 2, 8, 2 ** 39, BF16, False),       # stride 2**40
    (1 << 20, 256, 64, 64, F32, False),          # not bf16
])
def test_encodable(ptr, rows, cols, ld, dtype, ok):
    assert tensor_maps.encodable(ptr, rows, cols, ld, dtype) is ok


@pytest.mark.parametrize("ptr, ld, dtype, ok", [
    (1 << 20, 128, F32, True),
    (1 << 20, 132, F32, True),       # a view: pitch 528 B
    (1 << 20, 130, F32, False),      # pitch 520 B, not a multiple of 16
    ((1 << 20) + 4, 128, F32, False),  # a view starting off a 16-B boundary
    (1 << 20, 128, BF16, False),     # the transpose map is fp32
])
def test_encodable_for_a_transpose(ptr, ld, dtype, ok):
    assert tensor_maps.encodable(ptr, 256, 128, ld, dtype, tensor_maps.TRANSPOSE_READY) is ok


# -- table images -------------------------------------------------------------------------------

def entries_of(rows):
    t = np.zeros(len(rows), dtype=abi.TENSOR_DTYPE)
    for i, (ptr, r, c, ld, dt) in enumerate(rows):
        t[i] = (ptr, r, c, ld, dt)
    return t


def test_fill_table_with_a_fake_encoder():
    entries = entries_of([
        (0x10000, 4, 4, 4, F32),            # 0: not streamed
        (0x20000, 256, 64, 64, BF16),       # 1: streamed
        (0x30008, 256, 64, 64, BF16),       # 2: streamed, misaligned: ready 0
        (0x40000, 128, 96, 128, BF16),      # 3: streamed
        (0x50000, 64, 64, 64, BF16),        # 4: encodable, but not streamed
        (0x60000, 64, 64, 64, F32),         # 5: streamed slot of a non-bf16 tensor
    ])
    n = len(entries)
    buf = np.full(abi.table_bytes(n) + 40, 0xEE, dtype=np.uint8)   # stale bytes everywhere
    calls = []
    done = tensor_maps.fill_table(buf, n, entries, {1: 128, 2: 128, 3: 64, 5: 128, 99: 128},
                                  fake_encoder(calls))
    assert done == 2
    assert calls == [(0x20000, 256, 64, 64), (0x40000, 128, 96, 128, 64)]
    assert buf[:24 * n].tobytes() == entries.tobytes()
    assert not buf[24 * n:abi.tmap_offset(n)].any()              # padding
    assert not buf[abi.table_bytes(n):].any()                    # past the table
    maps = buf[abi.tmap_offset(n):abi.ready_offset(n)].reshape(n, 128)
    np.testing.assert_array_equal(maps[1].view(np.uint64)[:4], [0x20000, 256, 64, 64])
    np.testing.assert_array_equal(maps[3].view(np.uint64)[:4], [0x40000, 128, 96, 128])
    for i in (0, 2, 4, 5):
        assert not maps[i].any(), i
    ready = buf[abi.ready_offset(n):abi.ready_offset(n) + 4 * n].view(np.uint32)
    np.testing.assert_array_equal(ready, [0, 128, 0, 64, 0, 0])
    assert not buf[abi.ready_offset(n) + 4 * n:abi.table_bytes(n)].any()   # the head's rest
    np.testing.assert_array_equal(tensor_maps.ready_view(buf, n), ready)
    np.testing.assert_array_equal(tensor_maps.maps_view(buf, n), maps)


def test_write_maps_redoes_only_its_slots():
    entries = entries_of([(0x20000, 256, 64, 64, BF16), (0x40000, 128, 64, 64, BF16)])
    buf = np.zeros(abi.table_bytes(2), dtype=np.uint8)
    tensor_maps.fill_table(buf, 2, entries, {0: 128, 1: 128}, fake_encoder())
    before = tensor_maps.maps_view(buf, 2).copy()
    entries[1]["ptr"] = 0x80000
    calls = []
    assert tensor_maps.write_maps(buf, 2, entries, {1: 128}, fake_encoder(calls)) == 1
    assert calls == [(0x80000, 128, 64, 64)]
    np.testing.assert_array_equal(tensor_maps.maps_view(buf, 2)[0], before[0])
    assert tensor_maps.maps_view(buf, 2)[1].view(np.uint64)[0] == 0x80000
    entries[1]["ptr"] = 0x80002                           # now misaligned: map and flag cleared
    assert tensor_maps.write_maps(buf, 2, entries, {1: 128}, fake_encoder()) == 0
    assert not tensor_maps.maps_view(buf, 2)[1].any()
    np.testing.assert_array_equal(tensor_maps.ready_view(buf, 2), [128, 0])


def test_fill_table_without_stream_slots_calls_no_encoder():
    entries = entries_of([(0x20000, 256, 64, 64, BF16)] * 3)
    buf = np.zeros(abi.table_bytes(3), dtype=np.uint8)

    def refuse(*args):
        raise AssertionError("no map to encode")
    assert tensor_maps.fill_table(buf, 3, entries, {}, refuse) == 0
    assert not buf[abi.tmap_offset(3):].any()


def test_fill_table_refuses_a_short_image():
    entries = entries_of([(0x20000, 256, 64, 64, BF16)] * 3)
    with pytest.raises(ValueError, match="needs"):
        tensor_maps.fill_table(np.zeros(abi.table_bytes(3) - 1, np.uint8), 3, entries, {})
    with pytest.raises(TypeError):
        tensor_maps.fill_table(np.zeros(abi.table_bytes(3), np.uint8), 3, entries[:2], {})


# -- stream slots ---------------------------------------------------------------------------

def records(*rows):
    """(opcode name, flags, B slot[, A slot]) per record."""
    rec = abi.empty_instrs(len(rows))
    for i, row in enumerate(rows):
        op, flags, b = row[:3]
        rec[i]["opcode"] = abi.OPCODE_OF[op]
        rec[i]["flags"] = flags
        rec[i]["tensor"][abi.ARG_A] = row[3] if len(row) > 3 else 0
        rec[i]["tensor"][abi.ARG_B] = b
        rec[i]["tensor"][abi.ARG_OUT] = 9
    return rec


def test_map_boxes():
    S, R, W = abi.FLAG_STREAM, abi.FLAG_B_READY, abi.FLAG_WGMMA
    rec = records(("gemm", S | R, 3), ("gemm", R, 4), ("gemm", S | R | abi.FLAG_BIAS, 3),
                  ("gemm", S | R, 1), ("add", S, 5), ("nop", 0, 6), ("gemm", 0, 7))
    assert tensor_maps.map_boxes(rec) == {1: 128, 3: 128}
    assert tensor_maps.map_boxes(records(("gemm", R, 4))) == {}
    assert tensor_maps.map_boxes(abi.empty_instrs(0)) == {}
    # wgmma: A with 128-row boxes, B with 64; a slot wanted both ways keeps 128
    rec = records(("gemm", W, 2, 8), ("gemm", W | R, 5, 2), ("gemm", S | R, 6),
                  ("gemm", W, 6, 10), ("add", W, 11, 12))
    assert tensor_maps.map_boxes(rec) == {2: 128, 5: 64, 6: 128, 8: 128, 10: 128}
    assert list(tensor_maps.map_boxes(rec)) == [2, 5, 6, 8, 10]
    # narrow streamed bands: their own box where no other use wants the slot; after 128, before
    # 64 (the record whose box is not the slot's loads its B itself)
    N, NR = abi.FLAG_STREAM_NARROW, tensor_maps.STREAM_NARROW_READY
    rec = records(("gemm", S | N | R, 3), ("gemm", S | N | R, 4), ("gemm", S | R, 4),
                  ("gemm", W, 3, 9), ("gemm", S | N | R, 5), ("gemm", W, 5, 9))
    assert tensor_maps.map_boxes(rec) == {3: NR, 4: 128, 5: NR, 9: 128}
    assert tensor_maps.box_shape(NR) == (32, 128, "64B")
    assert tensor_maps.box_shape(128) == (64, 128, "128B")
    assert tensor_maps.box_shape(64) == (64, 64, "128B")
    # a transpose's A and OUT (slot 9 for every record here): fp32 boxes of one page, unless
    # a GEMM wants the slot
    TR = tensor_maps.TRANSPOSE_READY
    rec = records(("transpose", 0, 0, 3), ("transpose", 0, 0, 5), ("gemm", W, 2, 5),
                  ("transpose", 0, 0, 3))
    assert tensor_maps.map_boxes(rec) == {2: 64, 3: TR, 5: 128, 9: TR}
    rec = records(("transpose", 0, 0, 3), ("gemm", W, 2, 9))
    assert tensor_maps.map_boxes(rec) == {2: 64, 3: TR, 9: 128}   # OUT 9 is a wgmma A
    assert tensor_maps.box_shape(TR) == (32, 128, "128B")
    assert tensor_maps.map_dtype(TR) == F32 and tensor_maps.map_dtype(128) == BF16


def test_wgmma_only_slots_and_maps_cover():
    """Which programs the MK_WGMMA_ONLY kernel runs (every record a wgmma tile with at most a
    bias, a k range on block boundaries or to the operands' ends, or a split-K reduce), and
    which tables."""
    W, R = abi.FLAG_WGMMA, abi.FLAG_B_READY
    rows = np.array([0, 0, 300, 0, 0, 300], dtype=np.int64)   # slot 2: A (M x K), 5: B (K x N)
    cols = np.array([0, 0, 300, 0, 0, 90], dtype=np.int64)
    rows[4], cols[4] = 300, 300

    def rec(*rows_, klen=(128,), k0=(0,)):
        r = records(*rows_)
        r["klen"], r["k0"] = klen, k0
        return r
    ok = rec(("gemm", W | R, 5, 2), ("gemm", W | R | abi.FLAG_BIAS, 4, 2), klen=(128, 64))
    assert tensor_maps.wgmma_only_slots(ok, rows, cols) == ({2}, {4, 5})
    for bad in (rec(("gemm", W | 1 << abi.FLAG_ACT_SHIFT, 5, 2)),  # a staged epilogue
                rec(("gemm", W | abi.FLAG_RESIDUAL, 5, 2)),
                rec(("gemm", R, 5, 2)),                              # mma.sync tiles
                rec(("gemm", W, 5, 2), ("transpose", 0, 5, 2)),      # another op
                rec(("gemm", W, 5, 2), klen=(100,))):                # a tail inside A
        assert tensor_maps.wgmma_only_slots(bad, rows, cols) is None
    assert tensor_maps.wgmma_only_slots(rec(("gemm", W, 5, 2), klen=(300,)), rows, cols) \
        == ({2}, {5})                                                # a tail at A's, B's end
    assert tensor_maps.wgmma_only_slots(abi.empty_instrs(0), rows, cols) is None
    # split-K: tiles and the reduces of their partials (whatever the reduce's epilogue), not
    # reduces alone
    split = rec(("gemm", W, 5, 2), ("gemm", W, 5, 2), ("reduce", 1 << abi.FLAG_ACT_SHIFT, 0),
                klen=(128, 128, 2), k0=(0, 128, 300))
    assert tensor_maps.wgmma_only_slots(split, rows, cols) == ({2}, {5})
    assert tensor_maps.wgmma_only_slots(rec(("reduce", 0, 0)), rows, cols) is None
    ready = np.zeros(6, dtype=np.uint32)
    ready[[2, 4, 5]] = [128, 64, 64]
    assert tensor_maps.maps_cover(ready, ({2}, {4, 5}))
    for slot, words in ((2, 0), (4, 128), (5, 0)):   # missing, or boxed for another use
        r = ready.copy()
        r[slot] = words
        assert not tensor_maps.maps_cover(r, ({2}, {4, 5}))


# -- the executor's tables, on the fake driver --------------------------------------------------

def stream_plan(stream_pages=2):
    """NOP queues (what the fake kernel runs) plus one streamed GEMM record whose B is slot 1:
    the executor builds its tables from the records; the fake kernel only counts signals."""
    rec = records(("nop", 0, 0), ("gemm", abi.FLAG_STREAM | abi.FLAG_B_READY, 1))
    rec["tensor"][:, abi.ARG_A] = 0
    rec["tensor"][:, abi.ARG_OUT] = 2
    tensors = [TensorSlot(0, "x", 4, 4, "float32", "input"),
               TensorSlot(1, "w", 256, 64, "bfloat16", "input"),
               TensorSlot(2, "y", 4, 64, "float32", "intermediate")]
    return Plan(instrs=rec, queue_start=np.array([0, 2], dtype=np.uint32), tensors=tensors,
                n_counters=1, n_sm=1, n_pages=6, op_labels=["nop", "gemm"],
                inputs={"x": 0, "w": 1}, outputs={"y": 2},
                input_shapes={"x": ((4, 4), "float32"), "w": ((256, 64), "bfloat16")},
                output_shapes={"y": (4, 64)}, stream_pages=stream_pages)


def table_image(ptr, n):
    from megak.runtime.memory import host_array
    size = -(-abi.table_bytes(n) // 128) * 128
    return host_array(ptr, np.uint8, (size,)).copy()


def test_fake_executor_tables_carry_the_maps(fake_gpu, monkeypatch):  # noqa: F811
    from megak.runtime.executor import CudaExecutor
    from megak.runtime.memory import host_array
    calls = []
    monkeypatch.setattr(tensor_maps, "encode", fake_encoder(calls))
    seen = []
    run_nops = fake_gpu.kernel

    def kernel(params, tensors, ticket):
        seen.append(table_image(tensors, 3))
        run_nops(params, tensors, ticket)
    fake_gpu.kernel = kernel
    ext_ptrs = [fake_gpu.alloc(256 * 64 * 2), fake_gpu.alloc(4 * 4 * 4)]
    try:
        with CudaExecutor(stream_plan()) as ex:
            w = ex._tensors[1]
            assert calls == [(w.buf.ptr, 256, 64, w.ld)]
            assert ex._dev_buf["tensors"].ptr % 128 == 0 and ex._table_bytes % 128 == 0
            params = host_array(ex._dev_buf["params"].ptr, abi.PARAMS_DTYPE, (1,))[0]
            assert int(params["stream_pages"]) == 2 and int(params["n_tensors"]) == 3
            own = table_image(ex._dev_buf["tensors"].ptr, 3)
            np.testing.assert_array_equal(tensor_maps.ready_view(own, 3), [0, 128, 0])
            assert tensor_maps.maps_view(own, 3)[1].view(np.uint64)[0] == w.buf.ptr

            ex.run({}, [])
            np.testing.assert_array_equal(seen[-1], own)

            # a binding of new weights: its own map, encoded once, when the table is made
            wa = DeviceArray(None, "cuda", ext_ptrs[0], (256, 64), (64, 1), "bfloat16", 0)
            for _ in range(3):
                ex.run({}, [], external={1: wa})
                table = seen[-1]
                assert tensor_maps.maps_view(table, 3)[1].view(np.uint64)[0] == ext_ptrs[0]
                np.testing.assert_array_equal(tensor_maps.ready_view(table, 3), [0, 128, 0])
            assert calls[1:] == [(ext_ptrs[0], 256, 64, 64)]

            # a binding of another slot keeps megak's map of the weights, encoding nothing
            xa = DeviceArray(None, "cuda", ext_ptrs[1], (4, 4), (4, 1), "float32", 0)
            ex.run({}, [], external={0: xa})
            assert len(calls) == 2
            np.testing.assert_array_equal(tensor_maps.maps_view(seen[-1], 3),
                                          tensor_maps.maps_view(own, 3))
            np.testing.assert_array_equal(tensor_maps.ready_view(seen[-1], 3), [0, 128, 0])

            # weights TMA cannot read (misaligned): no map, the device loads them itself
            # (prepared, not run: the fake kernel insists on 256-B aligned tensors)
            wb = DeviceArray(None, "cuda", ext_ptrs[0] + 2, (256, 64), (64, 1), "bfloat16", 0)
            _, table_ptr, _, _ = ex.prepare_request({}, [], external={1: wb})
            assert len(calls) == 2
            table = table_image(table_ptr, 3)
            np.testing.assert_array_equal(tensor_maps.ready_view(table, 3), [0, 0, 0])
            assert not tensor_maps.maps_view(table, 3)[1].any()

            # the resident path hands out the same tables
            _, table_ptr, _, b = ex.prepare_request({}, [], external={1: wa})
            assert tensor_maps.maps_view(table_image(table_ptr, 3), 3)[1].view(
                np.uint64)[0] == ext_ptrs[0]
            _, table_ptr, _, b = ex.prepare_request({}, [])
            assert b is None and table_ptr == ex._dev_buf["tensors"].ptr
    finally:
        for p in ext_ptrs:
            del fake_gpu.mem[p]


def test_fake_executor_without_stream_slots_encodes_nothing(fake_gpu, monkeypatch):  # noqa: F811
    from megak.runtime.executor import CudaExecutor
    from megak.runtime.memory import host_array

    def refuse(*args):
        raise AssertionError("no map to encode")
    monkeypatch.setattr(tensor_maps, "encode", refuse)
    plan = stream_plan(stream_pages=0)
    plan.instrs["flags"] = 0
    with CudaExecutor(plan) as ex:
        own = table_image(ex._dev_buf["tensors"].ptr, 3)
        assert not own[abi.tmap_offset(3):].any()
        params = host_array(ex._dev_buf["params"].ptr, abi.PARAMS_DTYPE, (1,))[0]
        assert int(params["stream_pages"]) == 0
        ex.run({}, [])


def test_fake_executor_refuses_a_ring_larger_than_the_pages(fake_gpu):  # noqa: F811
    from megak.errors import GraphError
    from megak.runtime.executor import CudaExecutor
    with pytest.raises(GraphError, match="stream_pages"):
        CudaExecutor(stream_plan(stream_pages=7))


# -- the real driver ------------------------------------------------------------------------

@pytest.mark.gpu
def test_encode_a_real_map():
    from cuda.core import Device

    from megak.runtime.memory import Memory
    Device(0).set_current()
    m = Memory(0)
    try:
        buf = m.device(256 * 64 * 2, "weights")
        assert tensor_maps.encodable(buf.ptr, 256, 64, 64, BF16)
        a = tensor_maps.encode(buf.ptr, 256, 64, 64)
        assert isinstance(a, bytes) and len(a) == abi.TMAP_BYTES and any(a)
        b = tensor_maps.encode(buf.ptr + 256, 255, 64, 64)
        assert len(b) == abi.TMAP_BYTES and a != b
        c = tensor_maps.encode(buf.ptr, 256, 64, 64, tensor_maps.WGMMA_B_BOX_ROWS)
        assert len(c) == abi.TMAP_BYTES and c != a     # the box is in the map
        d = tensor_maps.encode(buf.ptr, 256, 64, 64, tensor_maps.STREAM_NARROW_READY)
        assert len(d) == abi.TMAP_BYTES and d not in (a, c)   # 32 columns, the 64-B swizzle
        assert tensor_maps.encodable(buf.ptr, 64, 128, 128, F32, tensor_maps.TRANSPOSE_READY)
        e = tensor_maps.encode(buf.ptr, 64, 128, 128, tensor_maps.TRANSPOSE_READY)
        assert len(e) == abi.TMAP_BYTES and e not in (a, c, d)   # fp32, 32 x 128
        image = np.zeros(abi.table_bytes(1), np.uint8)
        entries = entries_of([(buf.ptr, 256, 64, 64, BF16)])
        assert tensor_maps.fill_table(image, 1, entries, {0: 128}) == 1
        assert tensor_maps.maps_view(image, 1)[0].tobytes() == a
    finally:
        m.close()
