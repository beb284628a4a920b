"""Copy: out = x, lowered into bands of whole rows of about COPY_CHUNK_BYTES each, large enough
that per-instruction overhead is small against the bytes moved, small enough to spread a big
copy over every SM. A copy holds no pages (MK_COPY_PAGES = 0): the device streams the data
through registers, 64 KiB of loads in flight per SM, with no shared-memory hop."""
from __future__ import annotations

import numpy as np

from .. import abi
from ..graph import check_float32_only
from ._lowering import Lowered, Region, cost_ns, edges
from .base import OpDef, region

COPY_CHUNK_BYTES = 1 << 20


def rows_per_chunk(rows: int, cols: int) -> int:
    return max(1, min(rows, COPY_CHUNK_BYTES // (4 * cols)))


def copy(self, x):
    """``x`` copied into a new tensor of the same shape (2-D, or 1-D vectors); float32."""
    self.check_operand(x, "copy", "x")
    check_float32_only(x, "copy")
    return self.append_op("copy", (x,), x.shape, x.dtype)


class Copy(OpDef):
    name = "copy"
    operands = (abi.ARG_A,)
    build = staticmethod(copy)
    flag_io = True

    def count(self, unit) -> int:
        x = unit.inputs[0]
        return -(-x.rows // rows_per_chunk(x.rows, x.cols))

    def lower(self, unit) -> Lowered:
        (x,) = unit.inputs
        rows, cols = x.rows, x.cols
        row_edges = edges(rows, rows_per_chunk(rows, cols))
        col_edges = np.array([0, cols], dtype=np.int64)
        r0, r1 = row_edges[:-1], row_edges[1:]
        n = len(r0)
        reads = [Region(r0, r1, np.zeros(n, dtype=np.int64), np.full(n, cols, dtype=np.int64))]
        nbytes = 8.0 * (r1 - r0) * cols
        return Lowered(self.opcode, self.pages, row_edges, col_edges, reads,
                       cost_ns(0.0, nbytes), bytes=8.0 * rows * cols)

    def check_record(self, rec) -> bool:
        return min(int(rec["row0"]), int(rec["col0"]), int(rec["rows"]), int(rec["cols"])) >= 0

    def reads(self, rec, tensors):
        r0, c0, rn, cn = region(rec)
        return ((abi.ARG_A, r0, r0 + rn, c0, c0 + cn),)

    def simulate(self, rec, tensors):
        x, out = tensors[rec["tensor"][abi.ARG_A]], tensors[rec["tensor"][abi.ARG_OUT]]
        r0, c0, rn, cn = region(rec)
        out[r0:r0 + rn, c0:c0 + cn] = x[r0:r0 + rn, c0:c0 + cn]
        return self.reads(rec, tensors)

    def reference(self, op, args):
        value, bound = args[0]
        return value, bound   # exact


OP = Copy()
