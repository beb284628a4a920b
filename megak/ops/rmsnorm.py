"""RMSNorm: out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight per row, in fp32;
weight (N,) or (1, N). The output has x's dtype.

Device (device/ops/rmsnorm.cuh): a warp per row, two passes over the row: the sum of
squares, then the outputs. Record: param = eps's fp32 bits; tensor[B] = weight.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..graph import check_2d, check_positive_number, check_row_vector
from . import _epilogue
from ._rowwise import RowwiseOp, vector_reads
from .base import f32_param, region


def rmsnorm(self, x, weight, eps=1e-6):
    """Per row of the 2-D ``x``: ``x / sqrt(mean(x^2) + eps) * weight``; ``weight`` of shape
    ``(N,)`` or ``(1, N)``, ``eps > 0``. fp32 arithmetic; the output has x's dtype."""
    self.check_operand(x, "rmsnorm", "x")
    check_2d(x, "rmsnorm", "x")
    self.check_operand(weight, "rmsnorm", "weight")
    check_row_vector(weight, x.cols, "rmsnorm", "weight")
    eps = check_positive_number(eps, "rmsnorm", "eps")
    return self.append_op("rmsnorm", (x, weight), x.shape, x.dtype, eps=eps)


class RmsNorm(RowwiseOp):
    name = "rmsnorm"
    operands = (abi.ARG_A, abi.ARG_B)
    flops_per_element = 4
    build = staticmethod(rmsnorm)

    def simulate(self, rec, tensors):
        t = rec["tensor"]
        x, out = tensors[t[abi.ARG_A]], tensors[t[abi.ARG_OUT]]
        w = tensors[t[abi.ARG_B]][0:1].astype(np.float32)
        r0, c0, rn, cn = region(rec)
        f32 = np.float32
        v = x[r0:r0 + rn, c0:c0 + cn].astype(f32)
        ms = (v * v).sum(axis=1, keepdims=True, dtype=f32) / f32(cn)
        r = f32(1) / np.sqrt(ms + f32_param(rec))
        out[r0:r0 + rn, c0:c0 + cn] = (v * r * w[:, c0:c0 + cn]).astype(out.dtype)
        return ((abi.ARG_A, r0, r0 + rn, c0, c0 + cn),) + vector_reads(
            rec, (abi.ARG_B,), cn, c0)

    def reference(self, op, args):
        """First-order error: the mean of N fp32 squares ((N + 2) u), 1/sqrt (3 u), two
        products (2 u); input errors through the mean square and the products."""
        (x, ex), (w, ew) = args
        w, ew = w.reshape(1, -1), ew.reshape(1, -1)
        eps = op.attrs["eps"]
        n = x.shape[1]
        u = _epilogue.U32
        ms = (x * x).mean(axis=1, keepdims=True)
        r = 1.0 / np.sqrt(ms + eps)
        value = x * r * w
        e_ms = (n + 2) * u * ms + 2 * (np.abs(x) * ex).mean(axis=1, keepdims=True) \
            + (ex * ex).mean(axis=1, keepdims=True)
        rel_r = e_ms / (2 * (ms + eps)) + 3 * u
        bound = (np.abs(w) * r * (np.abs(x) * rel_r + ex) + ew * np.abs(x) * r
                 + 3 * u * np.abs(value))
        return value, _epilogue.round_to(value, bound, op.output.dtype)


OP = RmsNorm()
