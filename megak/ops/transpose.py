"""Transpose: out = x^T, lowered into TILE x TILE tiles in output coordinates (128, from
instr.h); on the device each tile travels in registers as 4 x 4 blocks (PAGES = 0, no
shared-memory hop): the whole tile's loads (64 KiB) are in flight at once, which is what sets
the bandwidth."""
from __future__ import annotations

import numpy as np

from .. import abi
from ._lowering import Lowered, Region, cost_ns, edges, grid

OPCODE = abi.OP_TRANSPOSE
PAGES = abi.OP_SHAPES["MK_TRANSPOSE_PAGES"]
TILE = abi.OP_SHAPES["MK_TRANSPOSE_TILE"]


def lower(op) -> Lowered:
    (x,) = op.inputs
    rows, cols = op.output.shape           # = (x.cols, x.rows)
    row_edges, col_edges = edges(rows, TILE), edges(cols, TILE)
    r0, rn, c0, cn = grid(row_edges, col_edges)
    # out[r0:r1, c0:c1] = x[c0:c1, r0:r1]^T
    reads = [Region(c0, c0 + cn, r0, r0 + rn)]
    nbytes = 8.0 * rn * cn
    return Lowered(OPCODE, PAGES, row_edges, col_edges, reads, cost_ns(0.0, nbytes),
                   bytes=8.0 * rows * cols)


def reference(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64).T


def simulate(instr, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
    x, out = tensors[instr["tensor"][abi.ARG_A]], tensors[instr["tensor"][abi.ARG_OUT]]
    r0, c0, rn, cn = int(instr["row0"]), int(instr["col0"]), int(instr["rows"]), int(instr["cols"])
    out[r0:r0 + rn, c0:c0 + cn] = x[c0:c0 + cn, r0:r0 + rn].T
    return ((abi.ARG_A, c0, c0 + cn, r0, r0 + rn),)
