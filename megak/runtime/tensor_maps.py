"""Tensor maps of the TMA operands: one CUtensorMap per tensor that a TMA copy reads, in the
tensor table.

Two ops read operands through TMA copies (``cp.async.bulk.tensor``): a GEMM record with
MK_FLAG_STREAM gets its B operand (the weights) from the streamer warp (megakernel.cu) through
the block's weight ring (megak/device/ops/gemm_stream.cuh), and one with MK_FLAG_WGMMA gets A
and B into its own pages (megak/device/ops/gemm_wgmma.cuh); and the loader copies a
transpose's whole tiles of A into its pages (megak/device/ops/transpose.cuh). A TMA copy
names its source by a CUtensorMap, which only the host can encode and which embeds the
tensor's device address: so every tensor table (megak's own, and each caller binding's, whose
addresses differ) carries its own maps, in the same buffer, right after its entries (instr.h,
above ``mk_tensor``)::

    0                        mk_tensor[n]            (24 B each)
    tmap_offset(n)           CUtensorMap[n]          (128 B each; 24 n rounded up to 128)
    tmap_offset(n) + 128 n   u32 ready[n]            (the box rows of map i; 0: none), zeros
                                                     up to MK_TABLE_HEAD words (a launched
                                                     block copies that many with the head)

Map i describes tensor i: dims {cols, rows}, row stride ld elements, zeros out of bounds, and
a box that depends on the use (`map_boxes`), named by its ready word: box rows
MK_STREAM_BOX_ROWS (128) for a streamed B and a wgmma A, MK_WGMMA_B_BOX_ROWS (64) for a wgmma
B, both bf16, 64 columns wide with the 128-B swizzle; MK_STREAM_NARROW_READY for the B of a
narrow streamed band (MK_FLAG_STREAM_NARROW: 32 columns x 128 rows, the 64-B swizzle);
MK_TRANSPOSE_READY for a transpose's A and OUT (fp32, 32 columns x 128 rows, one page, the
128-B swizzle: the loader copies A's tile in by four, the compute warps' thread 0 stores the
transposed tile out by four) and for the B of an fp32 streamed band (MK_FLAG_STREAM_F32: a
ring stage is one such box). A tensor wanted several ways keeps the first of 128, narrow,
64, transpose, and a record that wanted another loads its operand itself, as does every
record whose tensor TMA cannot describe (ready 0); a transpose takes its paged path only
where both A and OUT have their maps. A request of a resident kernel passes a table's
address, so the maps travel with it.

Everything but `encode` is pure host code (testable without a GPU); `fill_table` and
`write_maps` take the encoder as an argument.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from .. import abi

_BF16 = abi.DTYPES["MK_DTYPE_BF16"]
_F32 = abi.DTYPES["MK_DTYPE_F32"]
_BYTES = {_BF16: 2, _F32: 4}

Encoder = Callable[[int, int, int, int, int], bytes]   # (ptr, rows, cols, ld, box: the
                                                      #   ready word) -> 128 bytes
STREAM_BOX_ROWS = abi.OP_SHAPES["MK_STREAM_BOX_ROWS"]
WGMMA_B_BOX_ROWS = abi.OP_SHAPES["MK_WGMMA_B_BOX_ROWS"]
WGMMA_BK = abi.OP_SHAPES["MK_WGMMA_BK"]
WGMMA_NARROW_N = abi.OP_SHAPES["MK_WGMMA_NARROW_N"]
STREAM_NARROW_READY = abi.OP_SHAPES["MK_STREAM_NARROW_READY"]
STREAM_NARROW_COLS = abi.OP_SHAPES["MK_STREAM_NARROW_COLS"]
TRANSPOSE_READY = abi.OP_SHAPES["MK_TRANSPOSE_READY"]
TRANSPOSE_TILE = abi.OP_SHAPES["MK_TRANSPOSE_TILE"]
TRANSPOSE_BOX_COLS = abi.OP_SHAPES["MK_TRANSPOSE_BOX_COLS"]


def map_boxes(instrs: np.ndarray) -> dict[int, int]:
    """The tensor slots whose maps a program needs, each with its box (the ready word): B of
    every GEMM record flagged MK_FLAG_STREAM alone and A of every MK_FLAG_WGMMA record
    (STREAM_BOX_ROWS); B of every narrow streamed record (STREAM_NARROW_READY) unless also
    wanted so; B of every MK_FLAG_WGMMA record (WGMMA_B_BOX_ROWS) unless also wanted either
    way; A and OUT of every transpose record and B of every fp32 streamed record
    (MK_FLAG_STREAM_F32: the same fp32 box of 32 columns x 128 rows, TRANSPOSE_READY) unless a
    bf16 GEMM wants them.
    Sorted by slot."""
    if len(instrs) == 0:
        return {}
    gemm = instrs["opcode"] == abi.OPCODE_OF["gemm"]
    transpose = instrs["opcode"] == abi.OPCODE_OF["transpose"]
    flags = instrs["flags"].astype(np.int64)
    streamed = gemm & ((flags & abi.FLAG_STREAM) != 0)
    f32 = streamed & ((flags & abi.FLAG_STREAM_F32) != 0)
    streamed &= ~f32
    narrow = streamed & ((flags & abi.FLAG_STREAM_NARROW) != 0)
    wide = gemm & ((flags & abi.FLAG_WGMMA) != 0)
    tall = set(instrs["tensor"][streamed & ~narrow, abi.ARG_B].tolist()) \
        | set(instrs["tensor"][wide, abi.ARG_A].tolist())
    slim = set(instrs["tensor"][narrow, abi.ARG_B].tolist()) - tall
    short = set(instrs["tensor"][wide, abi.ARG_B].tolist()) - tall - slim
    boxes = {int(s): STREAM_BOX_ROWS for s in tall}
    boxes.update({int(s): STREAM_NARROW_READY for s in slim})
    boxes.update({int(s): WGMMA_B_BOX_ROWS for s in short})
    flipped = (set(instrs["tensor"][transpose, abi.ARG_A].tolist())
               | set(instrs["tensor"][transpose, abi.ARG_OUT].tolist())
               | set(instrs["tensor"][f32, abi.ARG_B].tolist())) - tall - slim - short
    boxes.update({int(s): TRANSPOSE_READY for s in flipped})
    return dict(sorted(boxes.items()))


def wgmma_only_slots(instrs: np.ndarray, rows: np.ndarray,
                     cols: np.ndarray) -> tuple[frozenset, frozenset] | None:
    """(A slots, B slots) when the kernel variant MK_WGMMA_ONLY (device/pages.cuh) can run
    every record of `instrs`, else None: at least one GEMM, each GEMM record flagged
    MK_FLAG_WGMMA with at most a bias for epilogue, whose k range ends on a k-block boundary
    or at A's and B's ends (the TMA path's record-only conditions, mk_gemm_wgmma_tma_ok); the
    other records split-K reduces (any epilogue: theirs runs in the reduce body). `rows`,
    `cols`: each tensor slot's shape. A table then qualifies when `maps_cover` says its maps
    are there."""
    opcode = instrs["opcode"]
    gemms = instrs[opcode == abi.OPCODE_OF["gemm"]]
    if len(gemms) == 0 or len(gemms) + int((opcode == abi.OPCODE_OF["reduce"]).sum()) \
            != len(instrs):
        return None
    flags = gemms["flags"].astype(np.int64)
    if not (((flags & abi.FLAG_WGMMA) != 0).all()
            and ((flags & (abi.FLAG_ACT_MASK | abi.FLAG_RESIDUAL)) == 0).all()):
        return None
    a, b = gemms["tensor"][:, abi.ARG_A], gemms["tensor"][:, abi.ARG_B]
    end = gemms["k0"].astype(np.int64) + gemms["klen"]
    if not ((gemms["klen"] % WGMMA_BK == 0) | ((end == cols[a]) & (end == rows[b]))).all():
        return None
    return frozenset(a.tolist()), frozenset(b.tolist())


def wgmma_only_build(instrs: np.ndarray) -> int:
    """The MK_WGMMA_ONLY build for a program `wgmma_only_slots` accepts: 2 (the n128 MMAs)
    when every GEMM tile is at most WGMMA_NARROW_N columns wide, else 1 (n256)."""
    gemms = instrs[instrs["opcode"] == abi.OPCODE_OF["gemm"]]
    return 2 if (gemms["cols"] <= WGMMA_NARROW_N).all() else 1


def maps_cover(ready: np.ndarray, slots: tuple[frozenset, frozenset]) -> bool:
    """Whether a table whose ready words are `ready` (ready_view) has every map the
    MK_WGMMA_ONLY kernel reads: A's with STREAM_BOX_ROWS, B's with WGMMA_B_BOX_ROWS
    (`wgmma_only_slots`)."""
    a, b = slots
    return (all(ready[s] == STREAM_BOX_ROWS for s in a)
            and all(ready[s] == WGMMA_B_BOX_ROWS for s in b))


def map_dtype(box: int) -> int:
    """The element type (abi.DTYPES) of the maps a ready word names: fp32 for a transpose's A
    and OUT, bf16 for the GEMMs' operands."""
    return _F32 if box == TRANSPOSE_READY else _BF16


def encodable(ptr: int, rows: int, cols: int, ld: int, dtype: int,
              box: int = STREAM_BOX_ROWS) -> bool:
    """Whether cuTensorMapEncodeTiled accepts this tensor for a map of `box` (its ready word):
    the box's element type (`map_dtype`), a 16-B aligned non-null base, a row stride that is
    a multiple of 16 bytes below 2**40 and covers a row, and both dims in 1 .. 2**32."""
    if dtype != map_dtype(box) or ptr <= 0 or ptr % 16:
        return False
    if not (1 <= rows <= 2 ** 32 and 1 <= cols <= 2 ** 32 and ld >= cols):
        return False
    stride = _BYTES[dtype] * ld
    return stride % 16 == 0 and stride < 2 ** 40


def box_shape(box: int) -> tuple[int, int, str]:
    """(box columns, box rows, swizzle) of the map a ready word names: STREAM_NARROW_READY is
    32 columns x 128 rows with the 64-B swizzle (a box row is 64 B), TRANSPOSE_READY 32 fp32
    columns x 128 rows with the 128-B swizzle (one page: a box row is 128 B), any other value
    that many rows of 64 columns with the 128-B swizzle."""
    if box == STREAM_NARROW_READY:
        return STREAM_NARROW_COLS, STREAM_BOX_ROWS, "64B"
    if box == TRANSPOSE_READY:
        return TRANSPOSE_BOX_COLS, TRANSPOSE_TILE, "128B"
    return abi.STREAM_BOX_COLS, box, "128B"


def encode(ptr: int, rows: int, cols: int, ld: int, box: int = STREAM_BOX_ROWS) -> bytes:
    """The 128-byte CUtensorMap of a (rows x cols, leading dimension ld) tensor of the box's
    element type (`map_dtype`) at device address ptr, boxes of `box_shape(box)`. A host-only
    driver call: no stream, no sync."""
    from .driver import _bindings, check
    drv = _bindings()
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    box_cols, box_rows, swizzle = box_shape(box)
    dtype = map_dtype(box)
    data_type = (drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32 if dtype == _F32
                 else drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16)
    tmap = check(drv.cuTensorMapEncodeTiled(
        data_type, 2, int(ptr),
        [u64(cols), u64(rows)], [u64(_BYTES[dtype] * ld)],
        [u32(box_cols), u32(box_rows)], [u32(1), u32(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle}"),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled")
    data = np.array([int(x) for x in tmap.opaque], dtype=np.uint64).tobytes()
    if len(data) != abi.TMAP_BYTES:
        raise RuntimeError(f"a CUtensorMap of {len(data)} bytes; instr.h reserves "
                           f"{abi.TMAP_BYTES}")
    return data


def maps_view(buf: np.ndarray, n: int) -> np.ndarray:
    """The n tensor maps of a table image, one row of 128 bytes each."""
    o = abi.tmap_offset(n)
    return buf[o:o + abi.TMAP_BYTES * n].reshape(n, abi.TMAP_BYTES)


def ready_view(buf: np.ndarray, n: int) -> np.ndarray:
    """The n ready words of a table image (u32: the box of each map, `box_shape`; 0 for none)."""
    o = abi.ready_offset(n)
    return buf[o:o + 4 * n].view(np.uint32)


def write_maps(buf: np.ndarray, n: int, entries: np.ndarray, boxes: Mapping[int, int],
               encoder: Encoder | None = None) -> int:
    """(Re)encode the maps of `boxes` ({slot: box, the ready word}) from `entries` into the
    table image `buf` and set their ready words; other slots are left as they are. Returns how
    many were encoded. The encoder (default: the driver's) is called only for encodable
    tensors."""
    maps, ready = maps_view(buf, n), ready_view(buf, n)
    done = 0
    for slot, box in boxes.items():
        if not 0 <= slot < n:
            continue
        e = entries[slot]
        args = (int(e["ptr"]), int(e["rows"]), int(e["cols"]), int(e["ld"]))
        if encodable(*args, int(e["dtype"]), box):
            maps[slot] = np.frombuffer((encoder or encode)(*args, box), dtype=np.uint8)
            ready[slot] = box
            done += 1
        else:
            maps[slot] = 0
            ready[slot] = 0
    return done


def fill_table(buf: np.ndarray, n: int, entries: np.ndarray, boxes: Mapping[int, int],
               encoder: Encoder | None = None) -> int:
    """The whole image of a tensor table of n entries into `buf` (uint8, at least
    abi.table_bytes(n) long; the rest is zeroed): entries, then the maps and ready words of
    `boxes` ({slot: box rows}), every other map and word zero. Returns how many maps were
    encoded."""
    if entries.dtype != abi.TENSOR_DTYPE or len(entries) < n:
        raise TypeError(f"fill_table() takes at least {n} entries of abi.TENSOR_DTYPE")
    if buf.dtype != np.uint8 or buf.ndim != 1 or len(buf) < abi.table_bytes(n):
        raise ValueError(f"fill_table(): the image needs {abi.table_bytes(n)} bytes (uint8)")
    buf[:] = 0
    raw = np.ascontiguousarray(entries[:n]).view(np.uint8)
    buf[:len(raw)] = raw
    return write_maps(buf, n, entries, boxes, encoder)
