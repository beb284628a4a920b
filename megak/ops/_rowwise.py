"""What the row-wise ops (softmax, layernorm, rmsnorm) share: bands of whole rows per
instruction, a warp per row on the device, the row's other operands (a weight and a bias of
one value per column) read whole by every instruction. No pages (MK_ROWWISE_PAGES = 0): each
pass reads the row from global memory (L1/L2 after the first), so any width works."""
from __future__ import annotations

import numpy as np

from ..dtypes import ITEMSIZE
from ._lowering import Lowered, RowBands, cost_ns, row_bands
from .base import OpDef, f32_param, param_bits, region


class RowwiseOp(RowBands, OpDef):
    passes = 2              # reads of each row: statistics, then the output
    flops_per_element = 4
    param_attr = "eps"      # the attr the record's fp32 param carries

    def lower(self, unit) -> Lowered:
        x = unit.inputs[0]
        vectors = unit.inputs[1:]            # one value per column, every band reads all
        row_edges, col_edges, reads = row_bands(x.rows, x.cols, unit.attrs["rows_per_instr"],
                                                ["rows"] + ["row0"] * len(vectors))
        band = np.diff(row_edges)
        row_bytes = (self.passes * ITEMSIZE[x.dtype] + ITEMSIZE[unit.output.dtype]) * x.cols
        vec_bytes = sum(ITEMSIZE[v.dtype] * v.cols for v in vectors)
        return Lowered(self.opcode, self.pages, row_edges, col_edges, reads,
                       cost_ns(self.flops_per_element * band * x.cols,
                               band * row_bytes + vec_bytes),
                       flops=float(self.flops_per_element * x.rows * x.cols),
                       bytes=float(x.rows * row_bytes + vec_bytes),
                       operands=list(self.operands), flags=self.flags(unit),
                       extra={"param": np.full(len(band), self.param_bits(unit),
                                               dtype=np.int64)})

    def flags(self, unit) -> int:
        return 0

    def param_bits(self, unit) -> int:
        return param_bits(unit.attrs[self.param_attr])

    param_positive = True      # the record's scalar: > 0 (an epsilon), or only finite

    def check_record(self, rec) -> bool:
        """The device's mk_rowwise_check and mk_param_ok."""
        r0, c0, rn, cn = region(rec)
        p = f32_param(rec)
        return (min(r0, rn, cn) >= 0 and c0 == 0 and bool(np.isfinite(p))
                and (p > 0 or not self.param_positive))


def vector_reads(rec, positions, cols_of_row: int, c0: int):
    """The regions a band reads from its per-column operands (row 0, the band's columns)."""
    return tuple((pos, 0, 1, c0, c0 + cols_of_row) for pos in positions)
