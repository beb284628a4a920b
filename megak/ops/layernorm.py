"""LayerNorm: out[i, :] = (x[i, :] - mean) / sqrt(var + eps) * weight + bias per row, biased
variance, in fp32; weight and bias (N,) or (1, N). The output has x's dtype.

Device (device/ops/layernorm.cuh): a warp per row, three passes over the row: the mean, the
sum of squared deviations from it (two passes: no cancellation, unlike E[x^2] - mean^2),
then the outputs. Record: param = eps's fp32 bits; tensor[B] = weight, tensor[BIAS] = bias.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..graph import check_2d, check_positive_number, check_row_vector
from . import _epilogue
from ._rowwise import RowwiseOp, vector_reads
from .base import f32_param, region


def layernorm(self, x, weight, bias, eps=1e-5):
    """Per row of the 2-D ``x``: ``(x - mean) / sqrt(var + eps) * weight + bias`` with the
    biased variance; ``weight`` and ``bias`` of shape ``(N,)`` or ``(1, N)``, ``eps > 0``.
    fp32 arithmetic; the output has x's dtype."""
    self.check_operand(x, "layernorm", "x")
    check_2d(x, "layernorm", "x")
    for v, arg in ((weight, "weight"), (bias, "bias")):
        self.check_operand(v, "layernorm", arg)
        check_row_vector(v, x.cols, "layernorm", arg)
    eps = check_positive_number(eps, "layernorm", "eps")
    return self.append_op("layernorm", (x, weight, bias), x.shape, x.dtype, eps=eps)


class LayerNorm(RowwiseOp):
    name = "layernorm"
    operands = (abi.ARG_A, abi.ARG_B, abi.ARG_BIAS)
    passes = 3
    flops_per_element = 8
    build = staticmethod(layernorm)

    def simulate(self, rec, tensors):
        t = rec["tensor"]
        x, out = tensors[t[abi.ARG_A]], tensors[t[abi.ARG_OUT]]
        w = tensors[t[abi.ARG_B]][0:1].astype(np.float32)
        b = tensors[t[abi.ARG_BIAS]][0:1].astype(np.float32)
        r0, c0, rn, cn = region(rec)
        f32 = np.float32
        v = x[r0:r0 + rn, c0:c0 + cn].astype(f32)
        mean = v.sum(axis=1, keepdims=True, dtype=f32) / f32(cn)
        d = v - mean
        var = (d * d).sum(axis=1, keepdims=True, dtype=f32) / f32(cn)
        rstd = f32(1) / np.sqrt(var + f32_param(rec))
        out[r0:r0 + rn, c0:c0 + cn] = (d * rstd * w[:, c0:c0 + cn] + b[:, c0:c0 + cn]
                                       ).astype(out.dtype)
        return ((abi.ARG_A, r0, r0 + rn, c0, c0 + cn),) + vector_reads(
            rec, (abi.ARG_B, abi.ARG_BIAS), cn, c0)

    def reference(self, op, args):
        """First-order error of the three passes: the mean of N fp32 terms (N u mean|x|),
        each deviation (u), the variance (N u var and the mean's error), 1/sqrt (3 u), the
        scale and shift (3 u); input errors propagate through each."""
        (x, ex), (w, ew), (b, eb) = args
        w, ew, b, eb = (a.reshape(1, -1) for a in (w, ew, b, eb))
        eps = op.attrs["eps"]
        n = x.shape[1]
        u = _epilogue.U32
        mean = x.mean(axis=1, keepdims=True)
        d = x - mean
        var = (d * d).mean(axis=1, keepdims=True)
        sigma = np.sqrt(var + eps)
        xhat = d / sigma
        value = xhat * w + b
        emax = ex.max(axis=1, keepdims=True)
        e_mean = (n + 1) * u * np.abs(x).mean(axis=1, keepdims=True) + emax
        e_d = e_mean + ex + u * np.abs(d)
        e_var = ((n + 4) * u * var + 2 * np.abs(d).mean(axis=1, keepdims=True) * (e_mean + emax)
                 + (e_mean + emax) ** 2)
        rel_r = e_var / (2 * (var + eps)) + 3 * u
        bound = (np.abs(w) * (e_d + np.abs(d) * rel_r) / sigma + ew * np.abs(xhat) + eb
                 + 3 * u * (np.abs(value) + np.abs(b)))
        return value, _epilogue.round_to(value, bound, op.output.dtype)


OP = LayerNorm()
