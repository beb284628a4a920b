"""Transpose: out = x^T, lowered into regions of TILE rows x up to MAX_TILES tiles of TILE
columns in output coordinates (128 and 2, from instr.h); on the device each tile travels in
registers as 4 x 4 blocks (MK_TRANSPOSE_PAGES = 0, no shared-memory hop), and the second
tile's loads are in flight while the first is stored. Transposes too small to give every SM
MAX_TILES tiles get one tile per instruction (more SMs busy)."""
from __future__ import annotations

from .. import abi
from ..graph import check_2d, check_float32_only
from ._lowering import Lowered, Region, cost_ns, edges, grid
from .base import OpDef, region

TILE = abi.OP_SHAPES["MK_TRANSPOSE_TILE"]
MAX_TILES = abi.OP_SHAPES["MK_TRANSPOSE_MAX_TILES"]


def transpose(self, x):
    """``x^T`` of a 2-D float32 tensor: (rows, cols) -> (cols, rows)."""
    self.check_operand(x, "transpose", "x")
    check_float32_only(x, "transpose")
    check_2d(x, "transpose", "x")
    return self.append_op("transpose", (x,), (x.cols, x.rows), x.dtype)


class Transpose(OpDef):
    name = "transpose"
    operands = (abi.ARG_A,)
    build = staticmethod(transpose)

    def expand(self, unit, ctx):
        rows, cols = unit.output.shape
        tiles = -(-rows // TILE) * -(-cols // TILE)
        per = MAX_TILES if tiles >= MAX_TILES * ctx.n_sm else 1
        return [unit.with_(attrs=dict(unit.attrs, tiles_per_instr=per))]

    def count(self, unit) -> int:
        rows, cols = unit.output.shape
        return -(-rows // TILE) * -(-cols // (TILE * unit.attrs.get("tiles_per_instr", 1)))

    def lower(self, unit) -> Lowered:
        rows, cols = unit.output.shape           # = (x.cols, x.rows)
        width = TILE * unit.attrs.get("tiles_per_instr", 1)
        row_edges, col_edges = edges(rows, TILE), edges(cols, width)
        r0, rn, c0, cn = grid(row_edges, col_edges)
        # out[r0:r1, c0:c1] = x[c0:c1, r0:r1]^T
        reads = [Region(c0, c0 + cn, r0, r0 + rn)]
        nbytes = 8.0 * rn * cn
        return Lowered(self.opcode, self.pages, row_edges, col_edges, reads,
                       cost_ns(0.0, nbytes), bytes=8.0 * rows * cols)

    def check_record(self, rec) -> bool:
        return (min(int(rec["row0"]), int(rec["col0"]), int(rec["rows"]), int(rec["cols"])) >= 0
                and int(rec["rows"]) <= TILE and int(rec["cols"]) <= TILE * MAX_TILES)

    def simulate(self, rec, tensors):
        x, out = tensors[rec["tensor"][abi.ARG_A]], tensors[rec["tensor"][abi.ARG_OUT]]
        r0, c0, rn, cn = region(rec)
        out[r0:r0 + rn, c0:c0 + cn] = x[c0:c0 + cn, r0:r0 + rn].T
        return ((abi.ARG_A, c0, c0 + cn, r0, r0 + rn),)

    def reference(self, op, args):
        value, bound = args[0]
        return value.T, bound.T   # exact


OP = Transpose()
