"""The fused epilogue, ``out = act(v + bias) + residual``: shared by every op that has one
(GEMM, REDUCE) and by the ops that fold into it (add). Python twin of device/epilogue.cuh.

Flags (instr.h): MK_FLAG_BIAS, MK_FLAG_RESIDUAL, the activation code in bits
MK_FLAG_ACT_SHIFT..; operands MK_ARG_BIAS (1 x N) and MK_ARG_RESIDUAL (M x N).
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..accuracy import ACTIVATION_EVAL_ERROR, ACTIVATION_SLOPE
from ..dtypes import UNIT_ROUNDOFF

# activation names by code, from instr.h's enum mk_activation (None = MK_ACT_NONE)
_ACT_CODES = {k[len("MK_ACT_"):].lower(): v for k, v in abi.ACTIVATIONS.items()
              if k != "MK_ACT_COUNT"}
ACT_COUNT = abi.ACTIVATIONS["MK_ACT_COUNT"]
ACTIVATIONS = (None,) + tuple(n for n, v in sorted(_ACT_CODES.items(), key=lambda kv: kv[1])
                              if n != "none")
_ACT_NAMES = {v: n for n, v in _ACT_CODES.items()}

U32 = UNIT_ROUNDOFF["float32"]


def flags(attrs: dict) -> int:
    """MK_FLAG_* bits of an epilogue described by op attrs (bias, activation, residual)."""
    act = _ACT_CODES[attrs.get("activation") or "none"]
    return ((abi.FLAG_BIAS if attrs.get("bias") else 0)
            | (abi.FLAG_RESIDUAL if attrs.get("residual") else 0)
            | (act << abi.FLAG_ACT_SHIFT))


def act_code_ok(rec) -> bool:
    return (int(rec["flags"]) & abi.FLAG_ACT_MASK) >> abi.FLAG_ACT_SHIFT < ACT_COUNT


def activation(v: np.ndarray, name: str | None) -> np.ndarray:
    """The epilogue activations, in the input's precision (float32 in the simulator)."""
    if name is None or name == "none":
        return v
    # far out, silu's exp(-v) and gelu's cube overflow to inf in fp32, as on the device, and
    # the result is still the limit (v / inf = -0, tanh(inf) = 1): no warning for that
    with np.errstate(over="ignore"):
        return _activation(v, name)


def _activation(v: np.ndarray, name: str) -> np.ndarray:
    t = v.dtype.type
    if name == "relu":
        return np.maximum(v, t(0))
    if name == "gelu":   # tanh form, as the device computes it
        c = t(0.7978845608028654)
        return t(0.5) * v * (t(1) + np.tanh(c * (v + t(0.044715) * v * v * v)))
    if name == "silu":
        return v / (t(1) + np.exp(-v))
    raise ValueError(f"unknown activation {name!r}")


def simulate(v: np.ndarray, rec, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
    """act(v + bias) + residual in fp32, in the device's order, rounded once into the output
    at rows out_row0.. Returns the regions it read."""
    t = rec["tensor"]
    r0, c0, rn, cn = int(rec["row0"]), int(rec["col0"]), int(rec["rows"]), int(rec["cols"])
    f = int(rec["flags"])
    reads = []
    if f & abi.FLAG_BIAS:
        v = v + tensors[t[abi.ARG_BIAS]][0:1, c0:c0 + cn].astype(np.float32)
        reads.append((abi.ARG_BIAS, 0, 1, c0, c0 + cn))
    v = activation(v, _ACT_NAMES[(f & abi.FLAG_ACT_MASK) >> abi.FLAG_ACT_SHIFT])
    if f & abi.FLAG_RESIDUAL:
        v = v + tensors[t[abi.ARG_RESIDUAL]][r0:r0 + rn, c0:c0 + cn].astype(np.float32)
        reads.append((abi.ARG_RESIDUAL, r0, r0 + rn, c0, c0 + cn))
    out = tensors[t[abi.ARG_OUT]]
    orow = int(rec["out_row0"])
    out[orow:orow + rn, c0:c0 + cn] = v.astype(out.dtype)
    return tuple(reads)


def reference(value: np.ndarray, bound: np.ndarray, attrs: dict, rest: list, out_dtype: str):
    """float64 epilogue on a (value, bound) pair; `rest` holds the (value, bound) of bias then
    residual, as present. The result's bound adds one fp32 rounding per step and the final
    rounding to out_dtype."""
    rest = list(rest)
    if attrs.get("bias"):
        bias, e = rest.pop(0)
        value = value + bias.reshape(1, -1)
        bound = bound + e.reshape(1, -1) + U32 * (np.abs(value) + bound)
    act = attrs.get("activation")
    if act:
        # the input's error through the slope, plus the fp32 evaluation (megak/accuracy.py
        # derives both constants)
        bound = (ACTIVATION_SLOPE[act] * bound
                 + ACTIVATION_EVAL_ERROR[act] * U32 * (np.abs(value) + bound))
        value = activation(value, act)
    if attrs.get("residual"):
        res, e = rest.pop(0)
        value = value + res
        bound = bound + e + U32 * (np.abs(value) + bound)
    return value, round_to(value, bound, out_dtype)


def round_to(value: np.ndarray, bound: np.ndarray, dtype: str) -> np.ndarray:
    """The bound after one rounding to `dtype` (fp32 roundings are inside the ops' bounds)."""
    if dtype == "float32":
        return bound
    return bound + UNIT_ROUNDOFF[dtype] * (np.abs(value) + bound)
