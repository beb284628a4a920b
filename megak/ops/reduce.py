"""REDUCE: the second half of a split-K GEMM. Sums the fp32 partial products that the split
GEMM instructions left in rows [s*M, (s+1)*M) of a partials tensor (s = 0 .. splits-1), in
that order, then applies the GEMM's epilogue (bias, activation, residual) and rounds once
into the GEMM's output. Internal: the GEMM's `expand` creates it when it splits a GEMM; it
is not a Graph method.

Record fields: tensor[A] = partials, k0 = M (rows between splits), klen = splits.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..dtypes import ITEMSIZE
from . import _epilogue
from ._lowering import Lowered, Region, cost_ns, edges, grid
from .base import OpDef, region

TILE_ROWS = abi.OP_SHAPES["MK_REDUCE_MAX_ROWS"]
TILE_COLS = abi.OP_SHAPES["MK_REDUCE_MAX_COLS"]


class Reduce(OpDef):
    name = "reduce"
    internal = True
    operands = (abi.ARG_A,)    # the partials, then bias and residual as present

    def count(self, unit) -> int:
        out = unit.output
        return -(-out.rows // TILE_ROWS) * -(-out.cols // TILE_COLS)

    def lower(self, unit) -> Lowered:
        out = unit.output
        splits, m = unit.attrs["splits"], unit.attrs["part_rows"]
        rows, cols = out.rows, out.cols
        row_edges, col_edges = edges(rows, TILE_ROWS), edges(cols, TILE_COLS)
        r0, rn, c0, cn = grid(row_edges, col_edges)
        # the partials of rows r0..r0+rn in every split: one bounding box (exact when M fits
        # one tile, as in the few-row GEMMs that get split)
        reads = [Region(r0, (splits - 1) * m + r0 + rn, c0, c0 + cn)]
        operands = [abi.ARG_A]
        if unit.attrs.get("bias"):
            reads.append(Region(np.zeros_like(r0), np.ones_like(r0), c0, c0 + cn))
            operands.append(abi.ARG_BIAS)
        if unit.attrs.get("residual"):
            reads.append(Region(r0, r0 + rn, c0, c0 + cn))
            operands.append(abi.ARG_RESIDUAL)
        out_size = ITEMSIZE[out.dtype]
        nbytes = 4.0 * splits * rn * cn + out_size * rn * cn
        n = len(r0)
        return Lowered(self.opcode, self.pages, row_edges, col_edges, reads, cost_ns(0.0, nbytes),
                       bytes=float((4.0 * splits + out_size) * rows * cols),
                       extra={"k0": np.full(n, m), "klen": np.full(n, splits)},
                       operands=operands, flags=_epilogue.flags(unit.attrs))

    def check_record(self, rec) -> bool:
        r0, c0, rn, cn = region(rec)
        return (min(r0, c0, rn, cn, int(rec["out_row0"]), int(rec["k0"])) >= 0
                and int(rec["klen"]) >= 1 and rn <= TILE_ROWS and cn <= TILE_COLS
                and _epilogue.act_code_ok(rec))

    def simulate(self, rec, tensors):
        """Sum the partials in split order with fp32 adds (as the device does), then the
        epilogue."""
        part = tensors[rec["tensor"][abi.ARG_A]]
        r0, c0, rn, cn = region(rec)
        m, splits = int(rec["k0"]), int(rec["klen"])
        acc = part[r0:r0 + rn, c0:c0 + cn].astype(np.float32)
        for s in range(1, splits):
            acc = acc + part[s * m + r0:s * m + r0 + rn, c0:c0 + cn].astype(np.float32)
        reads = [(abi.ARG_A, r0 + s * m, r0 + s * m + rn, c0, c0 + cn) for s in range(splits)]
        return tuple(reads) + _epilogue.simulate(acc, rec, tensors)


OP = Reduce()


def reference(partials: np.ndarray, splits: int) -> np.ndarray:
    """float64 sum of the stacked partials."""
    m = partials.shape[0] // splits
    return partials.astype(np.float64).reshape(splits, m, -1).sum(axis=0)
