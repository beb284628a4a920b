"""Copy: out = x, lowered into bands of whole rows of about COPY_CHUNK_BYTES each, large enough
that per-instruction overhead is small against the bytes moved, small enough to spread a big
copy over every SM. A copy holds PAGES = 0 pages (instr.h): the device streams the data through
registers, 64 KiB of loads in flight per SM, with no shared-memory hop."""
from __future__ import annotations

import numpy as np

from .. import abi
from ._lowering import Lowered, Region, cost_ns, edges

OPCODE = abi.OP_COPY
PAGES = abi.OP_SHAPES["MK_COPY_PAGES"]
COPY_CHUNK_BYTES = 1 << 20


def rows_per_chunk(rows: int, cols: int) -> int:
    return max(1, min(rows, COPY_CHUNK_BYTES // (4 * cols)))


def lower(op) -> Lowered:
    (x,) = op.inputs
    rows, cols = x.rows, x.cols
    row_edges = edges(rows, rows_per_chunk(rows, cols))
    col_edges = np.array([0, cols], dtype=np.int64)
    r0, r1 = row_edges[:-1], row_edges[1:]
    n = len(r0)
    reads = [Region(r0, r1, np.zeros(n, dtype=np.int64), np.full(n, cols, dtype=np.int64))]
    nbytes = 8.0 * (r1 - r0) * cols
    return Lowered(OPCODE, PAGES, row_edges, col_edges, reads, cost_ns(0.0, nbytes),
                   bytes=8.0 * rows * cols)


def reference(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64).copy()


def simulate(instr, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
    x, out = tensors[instr["tensor"][abi.ARG_A]], tensors[instr["tensor"][abi.ARG_OUT]]
    r0, c0, rn, cn = int(instr["row0"]), int(instr["col0"]), int(instr["rows"]), int(instr["cols"])
    out[r0:r0 + rn, c0:c0 + cn] = x[r0:r0 + rn, c0:c0 + cn]
    return ((abi.ARG_A, r0, r0 + rn, c0, c0 + cn),)
