"""Tensor maps of the weight stream: one CUtensorMap per streamed weight, in the tensor table.

A GEMM record with MK_FLAG_STREAM gets its B operand (the weights) through TMA copies
(``cp.async.bulk.tensor``) issued by the streamer warp (megakernel.cu) into the block's weight
ring and consumed by megak/device/ops/gemm_stream.cuh. A TMA copy names its source by a
CUtensorMap, which only the host can encode and which embeds the tensor's device address: so
every tensor table (megak's own, and each caller binding's, whose addresses differ) carries
its own maps, in the same buffer, right after its entries (instr.h, above ``mk_tensor``)::

    0                        mk_tensor[n]            (24 B each)
    tmap_offset(n)           CUtensorMap[n]          (128 B each; 24 n rounded up to 128)
    tmap_offset(n) + 128 n   u32 ready[n]            (1: map i encoded for this table)

Map i describes tensor i as B of a streamed GEMM: bf16, dims {cols, rows}, row stride 2 ld
bytes, box {MK_STREAM_BOX_COLS, MK_STREAM_BOX_ROWS}, 128-B swizzle, zeros out of bounds. Only
the "stream slots" (the B slots of streamed records) are encoded; every other entry, and any
tensor TMA cannot describe, has ready 0 and the device loads that B itself. A request of a
resident kernel passes a table's address, so the maps travel with it.

Everything but `encode` is pure host code (testable without a GPU); `fill_table` and
`write_maps` take the encoder as an argument.
"""
from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from .. import abi

_BF16 = abi.DTYPES["MK_DTYPE_BF16"]
_BF16_BYTES = 2

Encoder = Callable[[int, int, int, int], bytes]   # (ptr, rows, cols, ld) -> 128 bytes


def stream_slots(instrs: np.ndarray) -> tuple[int, ...]:
    """The tensor slots whose maps a program needs: operand B of every GEMM record flagged
    MK_FLAG_STREAM (sorted, distinct)."""
    if len(instrs) == 0:
        return ()
    streamed = (instrs["opcode"] == abi.OPCODE_OF["gemm"]) \
        & ((instrs["flags"] & abi.FLAG_STREAM) != 0)
    return tuple(int(s) for s in np.unique(instrs["tensor"][streamed, abi.ARG_B]))


def encodable(ptr: int, rows: int, cols: int, ld: int, dtype: int) -> bool:
    """Whether cuTensorMapEncodeTiled accepts this tensor as a streamed B: bf16, a 16-B
    aligned non-null base, a row stride (2 ld bytes) that is a multiple of 16 below 2**40 and
    covers a row, and both dims in 1 .. 2**32."""
    if dtype != _BF16 or ptr <= 0 or ptr % 16:
        return False
    if not (1 <= rows <= 2 ** 32 and 1 <= cols <= 2 ** 32 and ld >= cols):
        return False
    stride = _BF16_BYTES * ld
    return stride % 16 == 0 and stride < 2 ** 40


def encode(ptr: int, rows: int, cols: int, ld: int) -> bytes:
    """The 128-byte CUtensorMap of a bf16 (rows x cols, leading dimension ld) tensor at device
    address ptr, as the weight stream reads it. A host-only driver call: no stream, no sync."""
    from .driver import _bindings, check
    drv = _bindings()
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    tmap = check(drv.cuTensorMapEncodeTiled(
        drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, int(ptr),
        [u64(cols), u64(rows)], [u64(_BF16_BYTES * ld)],
        [u32(abi.STREAM_BOX_COLS), u32(abi.STREAM_BOX_ROWS)], [u32(1), u32(1)],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
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
    """The n ready flags of a table image (u32)."""
    o = abi.ready_offset(n)
    return buf[o:o + 4 * n].view(np.uint32)


def write_maps(buf: np.ndarray, n: int, entries: np.ndarray, slots: Iterable[int],
               encoder: Encoder | None = None) -> int:
    """(Re)encode the maps of `slots` from `entries` into the table image `buf` and set their
    ready flags; other slots are left as they are. Returns how many were encoded. The encoder
    (default: the driver's) is called only for encodable tensors."""
    maps, ready = maps_view(buf, n), ready_view(buf, n)
    done = 0
    for slot in slots:
        if not 0 <= slot < n:
            continue
        e = entries[slot]
        args = (int(e["ptr"]), int(e["rows"]), int(e["cols"]), int(e["ld"]))
        if encodable(*args, int(e["dtype"])):
            maps[slot] = np.frombuffer((encoder or encode)(*args), dtype=np.uint8)
            ready[slot] = 1
            done += 1
        else:
            maps[slot] = 0
            ready[slot] = 0
    return done


def fill_table(buf: np.ndarray, n: int, entries: np.ndarray, slots: Iterable[int],
               encoder: Encoder | None = None) -> int:
    """The whole image of a tensor table of n entries into `buf` (uint8, at least
    abi.table_bytes(n) long; the rest is zeroed): entries, then the maps and ready flags of
    `slots`, every other map and flag zero. Returns how many maps were encoded."""
    if entries.dtype != abi.TENSOR_DTYPE or len(entries) < n:
        raise TypeError(f"fill_table() takes at least {n} entries of abi.TENSOR_DTYPE")
    if buf.dtype != np.uint8 or buf.ndim != 1 or len(buf) < abi.table_bytes(n):
        raise ValueError(f"fill_table(): the image needs {abi.table_bytes(n)} bytes (uint8)")
    buf[:] = 0
    raw = np.ascontiguousarray(entries[:n]).view(np.uint8)
    buf[:len(raw)] = raw
    return write_maps(buf, n, entries, slots, encoder)
