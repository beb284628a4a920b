"""Add: out = a + b, elementwise in fp32, rounded once to a's dtype. b has a's shape, or is a
row vector (N,) / (1, N) broadcast over a's rows; a and b may each be float32 or bfloat16.

Where it is free, the add is not an instruction at all: `fuse` folds it into the GEMM that
produced its operand (a full-shape b becomes that GEMM's residual, a row vector its bias),
when nothing else reads the GEMM's result and the epilogue adds in the graph's order.
Otherwise it is lowered into bands of whole rows (MK_ADD_PAGES = 0: registers only,
device/ops/add.cuh).
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..dtypes import ITEMSIZE
from ..errors import GraphError
from . import _epilogue
from ._lowering import Lowered, RowBands, cost_ns, row_bands
from .base import OpDef, Unit, region


def add(self, a, b):
    """``a + b``: b of a's shape, or a row vector ``(N,)`` / ``(1, N)`` added to every row
    of a (N = a's columns). fp32 arithmetic; the output has a's dtype and shape."""
    self.check_operand(a, "add", "a")
    self.check_operand(b, "add", "b")
    n = a.cols
    if b.shape != a.shape and b.shape not in ((n,), (1, n)):
        raise GraphError(f"add: b must have a's shape {a.shape}, or be a row vector ({n},) "
                         f"or (1, {n}) broadcast over rows; got {b.shape}")
    return self.append_op("add", (a, b), a.shape, a.dtype, broadcast=b.shape != a.shape)


class Add(RowBands, OpDef):
    name = "add"
    operands = (abi.ARG_A, abi.ARG_B)
    build = staticmethod(add)
    flag_io = True

    def fuse(self, op, producer: Unit, position: int) -> Unit | None:
        """add(gemm(...), b) -> gemm(..., residual=b) (b full-shape) or gemm(..., bias=b) (b a
        row vector, the GEMM with no bias, no activation and no residual: the epilogue adds
        its bias before both). Only where the epilogue adds in the graph's order: fp32
        additions do not reassociate, so (x @ w + r) + bias folded as (x @ w + bias) + r
        rounds differently and can land past the error bound of the graph's own order."""
        if producer.kind != "gemm" or position != 0 or producer.attrs.get("split"):
            return None
        attrs = dict(producer.attrs)
        if not op.attrs["broadcast"] and not attrs.get("residual"):
            attrs["residual"] = True
        elif op.attrs["broadcast"] and not (attrs.get("bias") or attrs.get("activation")
                                            or attrs.get("residual")):
            attrs["bias"] = True
        else:
            return None
        inputs = tuple(producer.inputs) + (op.inputs[1],)   # a, b, bias, residual (gemm.py)
        return producer.with_(inputs=inputs, output=op.output, attrs=attrs,
                              label=f"{producer.label} + {op.label} (fused)")

    def lower(self, unit) -> Lowered:
        a, b = unit.inputs
        out = unit.output
        row_edges, col_edges, reads = row_bands(
            a.rows, a.cols, unit.attrs["rows_per_instr"],
            ["rows", "row0" if unit.attrs["broadcast"] else "rows"])
        band_rows = np.diff(row_edges)
        row_bytes = (ITEMSIZE[a.dtype] + ITEMSIZE[out.dtype]
                     + (0 if unit.attrs["broadcast"] else ITEMSIZE[b.dtype])) * a.cols
        return Lowered(self.opcode, self.pages, row_edges, col_edges, reads,
                       cost_ns(band_rows * a.cols, band_rows * row_bytes),
                       flops=float(a.rows * a.cols),
                       bytes=float(a.rows * row_bytes + ITEMSIZE[b.dtype] * b.rows * b.cols))

    def check_record(self, rec) -> bool:
        return min(region(rec)) >= 0

    def reads(self, rec, tensors):
        r0, c0, rn, cn = region(rec)
        # b has one row: broadcast (as the device decides, from b's row count)
        one_row = tensors[rec["tensor"][abi.ARG_B]].shape[0] == 1
        br0, br1 = (0, 1) if one_row else (r0, r0 + rn)
        return ((abi.ARG_A, r0, r0 + rn, c0, c0 + cn), (abi.ARG_B, br0, br1, c0, c0 + cn))

    def simulate(self, rec, tensors):
        t = rec["tensor"]
        a, b, out = tensors[t[abi.ARG_A]], tensors[t[abi.ARG_B]], tensors[t[abi.ARG_OUT]]
        reads = self.reads(rec, tensors)
        (_, r0, r1, c0, c1), (_, br0, br1, _, _) = reads
        v = a[r0:r1, c0:c1].astype(np.float32) + b[br0:br1, c0:c1].astype(np.float32)
        out[r0:r1, c0:c1] = v.astype(out.dtype)
        return reads

    def reference(self, op, args):
        (a, ea), (b, eb) = args
        b, eb = b.reshape(1, -1) if op.attrs["broadcast"] else b, \
            eb.reshape(1, -1) if op.attrs["broadcast"] else eb
        value = a + b
        bound = ea + eb + _epilogue.U32 * (np.abs(value) + ea + eb)   # one fp32 rounding
        return value, _epilogue.round_to(value, bound, op.output.dtype)


OP = Add()
