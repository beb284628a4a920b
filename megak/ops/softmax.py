"""Softmax: out[i, :] = exp(v - max v) / sum exp(v - max v) with v = scale * x[i, :], row by
row, in fp32; with causal=True column j of row i is masked out where j > i (its output is 0).

Device (device/ops/softmax.cuh): a warp per row, two passes over the row: an online max and
sum of exponentials (rescaled when the max grows), combined across lanes; then the outputs.
Record: param = the scale's fp32 bits, MK_FLAG_CAUSAL.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..graph import check_2d
from ..errors import GraphError
from . import _epilogue
from ._rowwise import RowwiseOp
from .base import f32_param, region


def softmax(self, x, scale=1.0, causal=False):
    """Row-wise ``softmax(scale * x)`` of a 2-D tensor; with ``causal=True``, column j of row
    i is masked out (output 0) where j > i. fp32 arithmetic; the output has x's dtype."""
    self.check_operand(x, "softmax", "x")
    check_2d(x, "softmax", "x")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
            or not abs(scale) <= float(np.finfo(np.float32).max):   # NaN fails too
        raise GraphError(f"softmax: scale must be a finite number (as float32), got {scale!r}")
    if not isinstance(causal, bool):
        raise GraphError(f"softmax: causal must be True or False, got {causal!r}")
    return self.append_op("softmax", (x,), x.shape, x.dtype, scale=float(scale), causal=causal)


def valid_cols(row: np.ndarray, cols: int, causal: bool) -> np.ndarray:
    """Columns of each row that take part: all, or 0..i for row i when causal."""
    return np.minimum(cols, row + 1) if causal else np.full(row.shape, cols)


class Softmax(RowwiseOp):
    name = "softmax"
    operands = (abi.ARG_A,)
    flops_per_element = 8
    param_positive = False      # a scale: any finite value
    build = staticmethod(softmax)

    def flags(self, unit) -> int:
        return abi.FLAG_CAUSAL if unit.attrs["causal"] else 0

    param_attr = "scale"

    def simulate(self, rec, tensors):
        t = rec["tensor"]
        x, out = tensors[t[abi.ARG_A]], tensors[t[abi.ARG_OUT]]
        r0, c0, rn, cn = region(rec)
        causal = bool(int(rec["flags"]) & abi.FLAG_CAUSAL)
        v = f32_param(rec) * x[r0:r0 + rn, c0:c0 + cn].astype(np.float32)
        rows = np.arange(r0, r0 + rn)
        keep = np.arange(c0, c0 + cn)[None, :] < valid_cols(rows, c0 + cn, causal)[:, None]
        v = np.where(keep, v, np.float32(-np.inf))
        e = np.where(keep, np.exp(v - v.max(axis=1, keepdims=True)), np.float32(0))
        out[r0:r0 + rn, c0:c0 + cn] = (e / e.sum(axis=1, keepdims=True)).astype(out.dtype)
        return ((abi.ARG_A, r0, r0 + rn, c0, c0 + cn),)

    def reference(self, op, args):
        """Relative error of each output: the fp32 sum of N exponentials, each rescaled at
        most N times by the online max (4N u), exp and the division (16 u), the rounding of
        v and of v - max (8 u max|v|); an input error e moves every v by scale e."""
        (x, ex), = args
        scale, causal = op.attrs["scale"], op.attrs["causal"]
        n = x.shape[1]
        v = scale * x
        keep = np.arange(n)[None, :] < valid_cols(np.arange(x.shape[0]), n, causal)[:, None]
        v = np.where(keep, v, -np.inf)
        e = np.where(keep, np.exp(v - v.max(axis=1, keepdims=True)), 0.0)
        value = e / e.sum(axis=1, keepdims=True)
        vmax = np.where(keep, np.abs(v), 0.0).max(axis=1, keepdims=True)
        emax = np.where(keep, ex, 0.0).max(axis=1, keepdims=True)
        u = _epilogue.U32
        rel = (4 * n + 16) * u + 8 * u * vmax + 2 * abs(scale) * emax
        bound = value * rel
        return value, _epilogue.round_to(value, bound, op.output.dtype)


OP = Softmax()
