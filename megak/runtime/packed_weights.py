"""Constant weights packed for the weight stream (`Graph.constant`, instr.h
MK_STREAM_PACKED_READY).

A streamed GEMM's B arrives one ring page per stage (device/ops/gemm_stream.cuh): a box of
64 (wide bands) or 2 x 32 (narrow bands) columns by 128 k-rows, which from a row-major B is
128 row segments of 128 or 64 bytes, 2 or 4 KiB apart. A constant B, which megak holds
itself, also gets a packed copy: column band b (columns [W b, W b + W), W = 64 or 32) is
one run of K rows of W columns,

    packed[b, k, j] = B[k, W b + j]   (zeros past the last column),

so every box is 16 (or 8) contiguous KiB (on the H200 such a pattern streamed at 3.78 TB/s
against 3.11-3.55 for the boxes, benchmarks/ANALYSIS.md "The layer boundary"; through this
map the chains stream no faster, a tensor copy being row requests either way: "Constant
weights" there, with the 1-D bulk copy that was faster). The copy is read through a 3-D
tensor map (dims {W, K, bands}, the box {W, 128, 1}, the form's
swizzle, zeros past K): the streamer's copy at (0, k, band) lands in the page exactly as the
2-D box at (W band, k) of B does, so the readers are unchanged. The row-major copy stays:
every other reader (another op, a record whose band does not start on a band boundary)
reads it. Pure host code but `encode`: the CUDA executor uploads what `pack` makes, the
simulator reads its constants back through `unpack`, so a packing that does not invert is
caught on the CPU.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from . import tensor_maps

PACKED_READY = abi.OP_SHAPES["MK_STREAM_PACKED_READY"]
PACKED_NARROW_READY = abi.OP_SHAPES["MK_STREAM_PACKED_NARROW_READY"]
# ready word -> (band columns, swizzle of the box)
_FORMS = {PACKED_READY: (abi.STREAM_BOX_COLS, "128B"),
          PACKED_NARROW_READY: (abi.OP_SHAPES["MK_STREAM_NARROW_COLS"], "64B")}
_BF16_BYTES = 2


def packed_forms(instrs: np.ndarray, constant_slots) -> dict[int, int]:
    """{slot: ready word} of the constants worth packing: those read as the B of streamed GEMM
    records of one form (all wide or all narrow), each page by one record, and by no other
    TMA copy (a wgmma operand, a transpose's tile: those need B's own map). A GEMM of more
    than MK_STREAM_TILE_M rows has two row bands reading every page of B, and there the
    packed pages streamed slower than the boxes (W2-4096x8-bf16-b64 151.6 against 148.2 us
    on one H200 lease, by 1-D bulk copies: benchmarks/ANALYSIS.md). Sorted by slot."""
    constant_slots = set(int(s) for s in constant_slots)
    if len(instrs) == 0 or not constant_slots:
        return {}
    gemm = instrs["opcode"] == abi.OPCODE_OF["gemm"]
    flags = instrs["flags"].astype(np.int64)
    streamed = gemm & ((flags & abi.FLAG_STREAM) != 0) & ((flags & abi.FLAG_WGMMA) == 0)
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


def bands(cols: int, ready: int) -> int:
    """Column bands of a B of `cols` columns packed for `ready`'s form."""
    return -(-cols // _FORMS[ready][0])


def packed_bytes(rows: int, cols: int, ready: int) -> int:
    return bands(cols, ready) * rows * _FORMS[ready][0] * _BF16_BYTES


def pack(b: np.ndarray, ready: int) -> np.ndarray:
    """The packed copy (uint8, `packed_bytes` long) of the 2-D bf16 array `b` (k-rows x
    columns; ml_dtypes bfloat16 or its uint16 bits) for `ready`'s form."""
    width = _FORMS[ready][0]
    bits = np.ascontiguousarray(b).view(np.uint16)
    if bits.ndim != 2:
        raise ValueError(f"pack() takes a 2-D array, got shape {bits.shape}")
    rows, cols = bits.shape
    padded = np.zeros((rows, bands(cols, ready) * width), dtype=np.uint16)
    padded[:, :cols] = bits
    runs = padded.reshape(rows, -1, width).transpose(1, 0, 2)     # (band, k-row, column)
    return np.ascontiguousarray(runs).view(np.uint8).reshape(-1)


def unpack(image: np.ndarray, rows: int, cols: int, ready: int) -> np.ndarray:
    """The rows x cols uint16 bf16 bits `image` holds in `ready`'s form: `pack`'s inverse,
    read as the map reads it (band b's k-row k at (b K + k) W elements)."""
    width = _FORMS[ready][0]
    runs = np.ascontiguousarray(image).view(np.uint16).reshape(bands(cols, ready), rows, width)
    return np.ascontiguousarray(runs.transpose(1, 0, 2).reshape(rows, -1)[:, :cols])


def map_shape(rows: int, cols: int, ready: int) -> dict:
    """The 3-D tensor map of a packed copy, as cuTensorMapEncodeTiled takes it (innermost
    first): dims {W, K, bands}, byte strides of dims 1 and 2, the box {W, 128, 1} (a box of
    the streamed form: instr.h MK_STREAM_BOX_ROWS rows) and its swizzle."""
    width, swizzle = _FORMS[ready]
    return {"dims": (width, rows, bands(cols, ready)),
            "strides": (width * _BF16_BYTES, rows * width * _BF16_BYTES),
            "box": (width, abi.STREAM_BOX_ROWS, 1), "swizzle": swizzle}


def encode(ptr: int, rows: int, cols: int, ready: int) -> bytes:
    """The 128-byte CUtensorMap of the packed copy at device address `ptr` (`map_shape`).
    A host-only driver call."""
    shape = map_shape(rows, cols, ready)
    return tensor_maps.encode_tiled(abi.DTYPES["MK_DTYPE_BF16"], ptr, shape["dims"],
                                    shape["strides"], shape["box"], shape["swizzle"])
