"""megak.accuracy: its bounds hold for the computation they describe, are tight on random
data, and catch the errors a check is for."""
import numpy as np
import pytest

from megak.accuracy import (ACTIVATION_EVAL_ERROR, U, Expected, check, exact_activation,
                            gemm_expected)
from megak.dtypes import numpy_dtype

F = np.float32


def device_activation(v: np.ndarray, name: str) -> np.ndarray:
    """The activations in fp32, one rounding per operation, in the order and with the
    constants of megak/device/ops/gemm_epilogue.cuh."""
    if name == "gelu":
        v3 = ((F(0.044715) * v) * v) * v
        t = np.tanh(F(0.7978845608) * (v + v3))
        return (F(0.5) * v) * (F(1) + t)
    if name == "silu":
        return v / (F(1) + np.exp(-v))
    return np.maximum(v, F(0))


@pytest.mark.parametrize("name", ["gelu", "silu", "relu"])
def test_activation_evaluation_error_bound_holds(name):
    v = np.concatenate([np.linspace(-12, 12, 200_001), np.geomspace(1e-6, 80, 20_001),
                        -np.geomspace(1e-6, 80, 20_001)]).astype(F)
    got = device_activation(v, name).astype(np.float64)
    err = np.abs(got - exact_activation(v.astype(np.float64), name))
    assert (err <= ACTIVATION_EVAL_ERROR[name] * U * np.abs(v.astype(np.float64))).all()


def fp32_gemm(rng, m=96, k=256, n=80):
    a = rng.uniform(-1, 1, (m, k)).astype(F)
    b = rng.uniform(-1, 1, (k, n)).astype(F)
    return a, b, a @ b


def test_fp32_gemm_bound_holds_and_is_tight(rng):
    a, b, got = fp32_gemm(rng)
    result = check(got, gemm_expected(a, b), "a @ b")
    assert result.ok, result.line()
    assert result.ratio > 1e-3, result.line()   # the error is a real fraction of the bound


def test_a_dropped_term_of_one_dot_product_fails(rng):
    a, b, got = fp32_gemm(rng)
    k = int(np.argmax(np.abs(a[5] * b[:, 7])))
    got[5, 7] -= a[5, k] * b[k, 7]              # one product of K = 256 left out
    result = check(got, gemm_expected(a, b), "a @ b")
    assert not result.ok and result.ratio > 10, result.line()
    assert "OUTSIDE the bound" in result.line()


def test_bf16_epilogue_bound_holds_and_is_tight(rng):
    """fp32 accumulation of bf16 operands, bias, GELU, residual in fp32, one rounding to bf16:
    the computation of a fused bf16 MLP layer."""
    bf16 = numpy_dtype("bfloat16")
    x = rng.standard_normal((16, 128)).astype(F).astype(bf16)
    w = (rng.standard_normal((128, 256)) / np.sqrt(128)).astype(F).astype(bf16)
    bias = rng.standard_normal(256).astype(F).astype(bf16)
    res = rng.standard_normal((16, 256)).astype(F).astype(bf16)
    v = x.astype(F) @ w.astype(F) + bias.astype(F)
    got = (device_activation(v, "gelu") + res.astype(F)).astype(bf16)
    expected = gemm_expected(x, w, bias=bias, activation="gelu", residual=res,
                             out_dtype="bfloat16")
    result = check(got, expected, "layer")
    assert result.ok, result.line()
    assert result.ratio > 0.1, result.line()    # the bf16 rounding is most of the bound


def test_check_reports_shape_dtype_and_non_finite_values():
    expected = Expected(np.zeros((2, 3)), np.ones((2, 3)))
    assert "expected a (2, 3) float32 array, got (3, 2) float32" in \
        check(np.zeros((3, 2), F), expected, "y").line()
    assert not check(np.zeros((2, 3), np.float64), expected, "y").ok
    bad = np.zeros((2, 3), F)
    bad[1, 2] = np.nan
    result = check(bad, expected, "y")
    assert not result.ok and result.line() == "y: 1 non-finite values"


def test_a_zero_bound_admits_no_error():
    expected = Expected(np.zeros((1, 2)), np.zeros((1, 2)))
    assert check(np.zeros((1, 2), F), expected, "y").ok
    assert not check(np.array([[0, 1e-30]], F), expected, "y").ok
