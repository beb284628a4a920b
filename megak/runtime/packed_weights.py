"""Constant weights packed for the weight stream (`Graph.constant`, instr.h `mk_packed_b`).

A streamed GEMM's B arrives one ring page per stage (device/ops/gemm_stream.cuh): through a
tensor map that is a 2-D box of 64 (wide bands) or 2 x 32 (narrow bands) columns, which DRAM
serves as 128- or 64-byte row segments. A constant B, which megak holds itself, is also kept
packed: every page's bytes laid out as the stage's readers take them, a band's pages one run,
so each stage is one 1-D bulk copy of 16 KiB (on the H200 the packed pattern streamed at
3.78 TB/s against 3.11-3.55 for the boxes, benchmarks/ANALYSIS.md "The layer boundary").
Only a build holding the packed stream (instr.h MK_BODY_STREAM_PACKED) copies these pages;
the executor builds it for a program with packed constants and no other, since its reader
hand-back costs the chains on input weights (device/stream.cuh, MK_RING_LANE_ARRIVALS).

    wide   (MK_STREAM_PACKED_READY): band b = columns [64 b, 64 b + 64), stage s = k-rows
           [128 s, 128 s + 128); k-row r of the stage at byte 128 r, its 16-B chunk c
           (columns 8 c .. 8 c + 7) at chunk c ^ (r & 7) (the 128-B swizzle)
    narrow (MK_STREAM_PACKED_NARROW_READY): band b = columns [32 b, 32 b + 32), stage s =
           k-rows [256 s, 256 s + 256) as two boxes of 128 in the page's halves; k-row r of a
           box at byte 64 r of its half, chunk c (c < 4) at chunk c ^ ((r / 2) & 3) (the 64-B
           swizzle)

Page (b, s) is at (b * stages + s) * 16 KiB, zeros past the tensor's rows and columns. The
row-major copy stays too: every reader other than the stream (another op, a record the
device finds does not fit the packed geometry) reads that one. Pure host code: the CUDA
executor uploads what `pack` makes, the simulator reads its constants back through `unpack`,
so a packing that does not invert is caught on the CPU.
"""
from __future__ import annotations

import numpy as np

from .. import abi

PAGE_BYTES = abi.PAGE_BYTES
PACKED_READY = abi.OP_SHAPES["MK_STREAM_PACKED_READY"]
PACKED_NARROW_READY = abi.OP_SHAPES["MK_STREAM_PACKED_NARROW_READY"]
_BOX_ROWS = abi.STREAM_BOX_ROWS
# ready word -> (band columns, stage rows, boxes per page, 16-B chunks per box row, swizzle
# row shift: chunk c of k-row r sits at c ^ ((r >> shift) & (chunks - 1)))
_FORMS = {
    PACKED_READY: (abi.STREAM_BOX_COLS, _BOX_ROWS, 1, 8, 0),
    PACKED_NARROW_READY: (abi.OP_SHAPES["MK_STREAM_NARROW_COLS"], 2 * _BOX_ROWS, 2, 4, 1),
}
_CHUNK = 8          # bf16 per 16-B chunk


def packed_forms(instrs: np.ndarray, constant_slots) -> dict[int, int]:
    """{slot: ready word} of the constants worth packing: those read as the B of streamed GEMM
    records of one form (all wide or all narrow), each page by one record, and by no other
    TMA copy (a wgmma operand, a transpose's tile: those need the tensor map). A GEMM of more
    than MK_STREAM_TILE_M rows has two row bands reading every page of B, and there the
    packed pages streamed slower than the boxes (W2-4096x8-bf16-b64 151.6 against 148.2 us
    on one H200 lease, benchmarks/ANALYSIS.md). Sorted by slot."""
    constant_slots = set(int(s) for s in constant_slots)
    if len(instrs) == 0 or not constant_slots:
        return {}
    gemm = instrs["opcode"] == abi.OPCODE_OF["gemm"]
    flags = instrs["flags"].astype(np.int64)
    # fp32 bands stream through B's own map (a transpose's box): no packed form
    streamed = (gemm & ((flags & abi.FLAG_STREAM) != 0) & ((flags & abi.FLAG_WGMMA) == 0)
                & ((flags & abi.FLAG_STREAM_F32) == 0))
    narrow = streamed & ((flags & abi.FLAG_STREAM_NARROW) != 0)
    wide_b = set(instrs["tensor"][streamed & ~narrow, abi.ARG_B].tolist())
    narrow_b = set(instrs["tensor"][narrow, abi.ARG_B].tolist())
    wgmma = gemm & ((flags & abi.FLAG_WGMMA) != 0)
    transpose = instrs["opcode"] == abi.OPCODE_OF["transpose"]
    mapped = (set(instrs["tensor"][wgmma, abi.ARG_A].tolist())
              | set(instrs["tensor"][wgmma, abi.ARG_B].tolist())
              | set(instrs["tensor"][transpose, abi.ARG_A].tolist())
              | set(instrs["tensor"][transpose, abi.ARG_OUT].tolist()))
    b = instrs["tensor"][:, abi.ARG_B].astype(np.int64)
    pages = instrs[["col0", "k0"]][streamed]
    forms = {}
    for slot in sorted(constant_slots - mapped):
        mine = pages[b[streamed] == slot]
        if len(np.unique(mine)) < len(mine):     # two readers of a page
            continue
        if slot in wide_b and slot not in narrow_b:
            forms[slot] = PACKED_READY
        elif slot in narrow_b and slot not in wide_b:
            forms[slot] = PACKED_NARROW_READY
    return forms


def geometry(rows: int, cols: int, ready: int) -> tuple[int, int]:
    """(bands, stages per band) of a rows x cols B packed for `ready`'s form."""
    band_cols, stage_rows = _FORMS[ready][:2]
    return -(-cols // band_cols), -(-rows // stage_rows)


def packed_bytes(rows: int, cols: int, ready: int) -> int:
    bands, stages = geometry(rows, cols, ready)
    return bands * stages * PAGE_BYTES


def _swizzle(rows: int, chunks: int, shift: int) -> np.ndarray:
    """[r, p]: the chunk stored at position p of k-row r (the xor is its own inverse)."""
    r = np.arange(rows)[:, None]
    return np.arange(chunks)[None, :] ^ ((r >> shift) & (chunks - 1))


def pack(b: np.ndarray, ready: int) -> np.ndarray:
    """The packed image (uint8, `packed_bytes` long) of the 2-D bf16 array `b` (k-rows x
    columns; ml_dtypes bfloat16 or its uint16 bits) for `ready`'s form."""
    band_cols, stage_rows, boxes, chunks, shift = _FORMS[ready]
    bits = np.ascontiguousarray(b).view(np.uint16)
    if bits.ndim != 2:
        raise ValueError(f"pack() takes a 2-D array, got shape {bits.shape}")
    rows, cols = bits.shape
    bands, stages = geometry(rows, cols, ready)
    padded = np.zeros((stages * stage_rows, bands * band_cols), dtype=np.uint16)
    padded[:rows, :cols] = bits
    box_rows = stage_rows // boxes
    # (band, stage, box, k-row, chunk, element)
    tiles = padded.reshape(stages, boxes, box_rows, bands, chunks, _CHUNK)
    tiles = tiles.transpose(3, 0, 1, 2, 4, 5)
    stored = tiles[:, :, :, np.arange(box_rows)[:, None], _swizzle(box_rows, chunks, shift)]
    return np.ascontiguousarray(stored).view(np.uint8).reshape(-1)


def unpack(image: np.ndarray, rows: int, cols: int, ready: int) -> np.ndarray:
    """The rows x cols uint16 bf16 bits that `image` holds in `ready`'s form: `pack`'s
    inverse, read as the device's readers read a page."""
    band_cols, stage_rows, boxes, chunks, shift = _FORMS[ready]
    bands, stages = geometry(rows, cols, ready)
    box_rows = stage_rows // boxes
    stored = np.ascontiguousarray(image).view(np.uint16).reshape(
        bands, stages, boxes, box_rows, chunks, _CHUNK)
    tiles = stored[:, :, :, np.arange(box_rows)[:, None], _swizzle(box_rows, chunks, shift)]
    padded = tiles.transpose(1, 2, 3, 0, 4, 5).reshape(stages * stage_rows, bands * band_cols)
    return np.ascontiguousarray(padded[:rows, :cols])


def descriptor(ptr: int, rows: int, cols: int, ready: int) -> np.ndarray:
    """The map slot (abi.TMAP_BYTES, uint8) of a packed B at device address `ptr`: an
    mk_packed_b, zeros after it."""
    slot = np.zeros(abi.TMAP_BYTES, dtype=np.uint8)
    desc = np.zeros(1, dtype=abi.PACKED_B_DTYPE)
    desc[0]["ptr"] = ptr
    desc[0]["bands"], desc[0]["stages"] = geometry(rows, cols, ready)
    slot[:abi.PACKED_B_DTYPE.itemsize] = desc.view(np.uint8)
    return slot
