"""Checking a result against float64 with a rigorous, tight error bound.

    expected = gemm_expected(x, w1, bias=b1, activation="gelu", out_dtype="bfloat16")
    result = check(got, expected, "layer 0 GEMM 1")
    print(result.line())          # max |err|, the bound there, worst |err| / bound
    assert result.ok              # every element within its bound

The bound of one GEMM out = act(a @ b + bias) + residual, elementwise, in the order the
device computes it (fp32 accumulation, then the epilogue in fp32, then one rounding):

* accumulation: a dot product of length K summed in fp32, in any order, is within
  2 * K * u * (|a| @ |b|) of the exact value (u = 2^-24): a step may round twice (product and
  add, where they are not fused), or truncate (tensor cores).
* each fp32 add of the epilogue (bias, residual) rounds once: u * |its result|.
* an activation carries the error of its input through its slope (at most 1 for relu,
  1.13 for the tanh form of gelu, 1.1 for silu) and adds the fp32 evaluation error of
  tanh / exp: at most 8 u * |input| (tanhf / expf are within 2 ulp; derived in
  `ACTIVATION_EVAL_ERROR`).
* a bf16 output rounds once more: 2^-8 * |result|.

A chain of GEMMs is checked one GEMM at a time, each on the *computed* result of the one
before (declare the intermediates as graph outputs: they live in device memory anyway).
Carried through a chain from the inputs alone, the bound must assume every error of one
GEMM adds up with the same sign in the next, which random data never does: such a bound
sits 10^3 to 10^4 times above the errors it is meant to catch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .dtypes import UNIT_ROUNDOFF, numpy_dtype

U = UNIT_ROUNDOFF["float32"]

# The largest |slope| of each activation: how much an error in its input can grow.
ACTIVATION_SLOPE = {"relu": 1.0, "gelu": 1.13, "silu": 1.1}

# fp32 evaluation error of each activation, in units of u * |input|. gelu (tanh form): the
# argument w = c (v + 0.044715 v^3) has at most 7 roundings (5 operations, 2 constants),
# tanhf adds 2 ulp and passes on sech^2(w) |w| <= 0.45 of w's error, 1 + t and the product
# round once each: 5.6 u |v| in all. silu: expf 2 ulp, 1 + e and the division once each:
# 6 u |silu(v)| <= 6 u |v|. relu is exact.
ACTIVATION_EVAL_ERROR = {"relu": 0.0, "gelu": 8.0, "silu": 8.0}

def exact_activation(v: np.ndarray, name: str) -> np.ndarray:
    """The epilogue activations, exactly (float64): the simulator's definitions
    (megak/ops/_epilogue.py) evaluated in float64."""
    if name not in ACTIVATION_SLOPE:
        raise ValueError(f"unknown activation {name!r}; allowed: {', '.join(ACTIVATION_SLOPE)}")
    from .ops._epilogue import activation
    return activation(np.asarray(v, dtype=np.float64), name)


def accumulation_gamma(k: int) -> float:
    """Relative bound factor of a length-k fp32 accumulation: 2 k u. Each step may round
    twice where the accumulation is not fused (the product, then the add: numpy's matmul in
    the simulator), and tensor cores truncate (bf16 operands); the FMA pipes of the fp32 GEMM
    round once, so fp32 results on the GPU sit further inside."""
    return 2.0 * k * U


@dataclass
class Expected:
    """A float64 reference and an elementwise bound on |computed - value|."""
    value: np.ndarray
    bound: np.ndarray
    dtype: str = "float32"   # of the computed result


def gemm_expected(a: np.ndarray, b: np.ndarray, *, bias: np.ndarray | None = None,
                  activation: str | None = None, residual: np.ndarray | None = None,
                  out_dtype: str = "float32") -> Expected:
    """act(a @ b + bias) + residual in float64, with the bound of the device's computation:
    the GEMM op's own reference (megak/ops/gemm.py), on operands as megak saw them."""
    from types import SimpleNamespace

    from .ops import REGISTRY
    operands = [a, b] + [v for v in (bias, residual) if v is not None]
    args = [(np.asarray(v, np.float64), np.zeros(np.shape(v))) for v in operands]
    op = SimpleNamespace(attrs={"bias": bias is not None, "activation": activation,
                                "residual": residual is not None},
                         output=SimpleNamespace(dtype=out_dtype))
    value, bound = REGISTRY["gemm"].reference(op, args)
    return Expected(value, bound, out_dtype)


@dataclass
class Check:
    """How a computed array compares with its Expected."""
    what: str
    max_err: float
    bound_at_max_err: float
    ratio: float                 # max over elements of |err| / bound: within bound iff <= 1
    problem: str = ""            # wrong shape or dtype, non-finite values

    @property
    def ok(self) -> bool:
        return not self.problem and self.ratio <= 1.0

    def line(self) -> str:
        if self.problem:
            return f"{self.what}: {self.problem}"
        verdict = "within" if self.ok else "OUTSIDE"
        return (f"{self.what}: max |err| {self.max_err:.2e} (bound there "
                f"{self.bound_at_max_err:.2e}), worst |err|/bound {self.ratio:.2e}: "
                f"{verdict} the bound")


def check(got, expected: Expected, what: str) -> Check:
    """Compare `got` (any array numpy can read) with `expected`, elementwise."""
    got = np.asarray(got)
    if got.shape != expected.value.shape or got.dtype != numpy_dtype(expected.dtype):
        return Check(what, np.inf, 0.0, np.inf,
                     problem=f"expected a {expected.value.shape} {expected.dtype} array, got "
                             f"{got.shape} {got.dtype}")
    got64 = got.astype(np.float64)
    if not np.isfinite(got64).all():
        return Check(what, np.inf, 0.0, np.inf,
                     problem=f"{int((~np.isfinite(got64)).sum())} non-finite values")
    err = np.abs(got64 - expected.value)
    bound = expected.bound
    with np.errstate(divide="ignore", invalid="ignore"):
        # a zero bound (every product zero) leaves no room: any error there fails
        ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0),
                         np.where(err > 0, np.inf, 0.0))
    worst_err = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    return Check(what, float(err[worst_err]) if err.size else 0.0,
                 float(bound[worst_err]) if err.size else 0.0,
                 float(ratio.max()) if err.size else 0.0)


def report(checks: list[Check]) -> bool:
    """Print one line per check; True when all are within their bounds."""
    for c in checks:
        print(c.line())
    return all(c.ok for c in checks)
