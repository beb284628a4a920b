"""Transpose: out = x^T, lowered into one instruction per output tile of TILE x TILE (128, from
instr.h), each with MK_TRANSPOSE_PAGES = 4 pages: the loader copies a whole tile of x into
them by TMA (x's tensor map, runtime/tensor_maps.py) ahead of the instruction, the compute
warps write it back transposed into the same pages as 4 x 4 blocks, and thread 0 stores them
by TMA (the output's map; device/ops/transpose.cuh says when, and why). Edge tiles, and tiles
where x or the output has no map, are loaded and stored by the op itself through registers."""
from __future__ import annotations

from .. import abi
from ..graph import check_2d, check_float32_only
from ._lowering import Lowered, Region, cost_ns, edges, grid
from .base import NO_PAGES, OpDef, PagePlan, region

TILE = abi.OP_SHAPES["MK_TRANSPOSE_TILE"]
PAGES = abi.OP_SHAPES["MK_TRANSPOSE_PAGES"]
# a whole tile: the loader's preload fills every page after the dependency wait, the op reads
# them all, and they go back after it
PAGED_PLAN = PagePlan(preload_late=tuple(range(PAGES)), phases=((tuple(range(PAGES)), ()),))


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

    def count(self, unit) -> int:
        rows, cols = unit.output.shape
        return -(-rows // TILE) * -(-cols // TILE)

    def lower(self, unit) -> Lowered:
        rows, cols = unit.output.shape           # = (x.cols, x.rows)
        row_edges, col_edges = edges(rows, TILE), edges(cols, TILE)
        # tiles in row-major order, so a wave of SMs writes whole output rows: the GEMMs'
        # grouped order (longer runs of each x row per wave) measured 0.8-2.1% slower on a
        # 16384^2 transpose (benchmarks/ANALYSIS.md, "W4's last 1%")
        r0, rn, c0, cn = grid(row_edges, col_edges)
        # out[r0:r1, c0:c1] = x[c0:c1, r0:r1]^T
        reads = [Region(c0, c0 + cn, r0, r0 + rn)]
        nbytes = 8.0 * rn * cn
        return Lowered(self.opcode, self.pages, row_edges, col_edges, reads,
                       cost_ns(0.0, nbytes), bytes=8.0 * rows * cols)

    def check_record(self, rec) -> bool:
        return (min(int(rec["row0"]), int(rec["col0"]), int(rec["rows"]), int(rec["cols"])) >= 0
                and int(rec["rows"]) <= TILE and int(rec["cols"]) <= TILE)

    def page_plan(self, rec, dtype_a: str) -> PagePlan:
        """A whole tile is preloaded into the record's pages (the device also needs tensor
        maps of x and the output, which only the run's tensors allow: where either's rows are
        not 16-B aligned it has none, the op loads and stores the tile itself and the pages
        stay unused); an edge tile holds its pages unused."""
        if int(rec["rows"]) == TILE and int(rec["cols"]) == TILE:
            return PAGED_PLAN
        return NO_PAGES

    def simulate(self, rec, tensors):
        x, out = tensors[rec["tensor"][abi.ARG_A]], tensors[rec["tensor"][abi.ARG_OUT]]
        r0, c0, rn, cn = region(rec)
        out[r0:r0 + rn, c0:c0 + cn] = x[c0:c0 + cn, r0:r0 + rn].T
        return ((abi.ARG_A, c0, c0 + cn, r0, r0 + rn),)

    def reference(self, op, args):
        value, bound = args[0]
        return value.T, bound.T   # exact


OP = Transpose()
