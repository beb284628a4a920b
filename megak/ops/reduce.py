"""REDUCE: the second half of a split-K GEMM. Sums the fp32 partial products that the split
GEMM instructions left in rows [s*M, (s+1)*M) of a partials tensor (s = 0 .. splits-1), in
that order, then applies the GEMM's epilogue (bias, activation, residual) and rounds once
into the GEMM's output. Internal: the scheduler creates it when it splits a GEMM
(scheduler.expand); it is not a Graph method.

Record fields: tensor[A] = partials, k0 = M (rows between splits), klen = splits.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..dtypes import ITEMSIZE
from ._lowering import Lowered, Region, cost_ns, edges, grid
from .gemm import epilogue, epilogue_flags

OPCODE = abi.OPCODES["MK_OP_REDUCE"]
PAGES = abi.OP_SHAPES["MK_REDUCE_PAGES"]
TILE_ROWS = 128
TILE_COLS = abi.OP_SHAPES["MK_REDUCE_MAX_COLS"]


def lower(op) -> Lowered:
    part = op.inputs[0]
    out = op.output
    splits, m = op.attrs["splits"], op.attrs["part_rows"]
    rows, cols = out.rows, out.cols
    row_edges, col_edges = edges(rows, TILE_ROWS), edges(cols, TILE_COLS)
    r0, rn, c0, cn = grid(row_edges, col_edges)
    # the partials of rows r0..r0+rn in every split: one bounding box (exact when M fits
    # one tile, as in the skinny GEMMs that get split)
    reads = [Region(r0, (splits - 1) * m + r0 + rn, c0, c0 + cn)]
    operands = [abi.ARG_A]
    if op.attrs.get("bias"):
        reads.append(Region(np.zeros_like(r0), np.ones_like(r0), c0, c0 + cn))
        operands.append(abi.ARG_BIAS)
    if op.attrs.get("residual"):
        reads.append(Region(r0, r0 + rn, c0, c0 + cn))
        operands.append(abi.ARG_RESIDUAL)
    nbytes = 4.0 * splits * rn * cn + ITEMSIZE[out.dtype] * rn * cn
    n = len(r0)
    return Lowered(OPCODE, PAGES, row_edges, col_edges, reads, cost_ns(0.0, nbytes),
                   bytes=float(4.0 * splits * rows * cols + ITEMSIZE[out.dtype] * rows * cols),
                   extra={"k0": np.full(n, m), "klen": np.full(n, splits)},
                   operands=operands, flags=epilogue_flags(op))


def reference(partials: np.ndarray, splits: int) -> np.ndarray:
    m = partials.shape[0] // splits
    return partials.astype(np.float64).reshape(splits, m, -1).sum(axis=0)


def simulate(instr, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
    """Sum the partials in split order with fp32 adds (as the device does), then the epilogue."""
    t = instr["tensor"]
    part = tensors[t[abi.ARG_A]]
    r0, c0, rn, cn = int(instr["row0"]), int(instr["col0"]), int(instr["rows"]), int(instr["cols"])
    m, splits = int(instr["k0"]), int(instr["klen"])
    acc = part[r0:r0 + rn, c0:c0 + cn].astype(np.float32)
    for s in range(1, splits):
        acc = acc + part[s * m + r0:s * m + r0 + rn, c0:c0 + cn].astype(np.float32)
    reads = [(abi.ARG_A, r0 + s * m, r0 + s * m + rn, c0, c0 + cn) for s in range(splits)]
    return tuple(reads) + epilogue(acc, instr, tensors)
