"""Every bad graph or input raises the documented GraphError, before anything runs."""
import numpy as np
import pytest

import megak
from megak import GraphError


def small_program(backend="sim"):
    g = megak.Graph()
    a = g.input("a", (5, 3), "float32")
    b = g.input("b", (3, 4), "float32")
    g.output(g.gemm(a, b), "c")
    return g, megak.compile(g, backend=backend, n_sm=2)


def test_errors_are_value_errors_and_hang_is_an_error():
    assert issubclass(GraphError, ValueError)
    assert issubclass(megak.MegakernelHang, megak.MegakernelError)


@pytest.mark.parametrize("dtype", ["float64", "int32", np.float16, "nope"])
def test_unsupported_dtype_names_the_allowed_ones(dtype):
    g = megak.Graph()
    with pytest.raises(GraphError, match="allowed: float32, bfloat16"):
        g.input("x", (2, 2), dtype)


def test_bfloat16_only_where_the_device_supports_it():
    g = megak.Graph()
    x = g.input("x", (4, 4), "bfloat16")
    with pytest.raises(GraphError, match="not supported by transpose yet; allowed: float32"):
        g.transpose(x)
    with pytest.raises(GraphError, match="not supported by copy yet"):
        g.copy(x)
    y = g.gemm(x, x, out_dtype="float32")
    assert y.dtype == "float32" and g.gemm(x, x).dtype == "bfloat16"
    with pytest.raises(GraphError, match="dtypes differ"):
        g.gemm(x, g.input("f", (4, 4), "float32"))


def test_numpy_dtype_object_is_accepted():
    g = megak.Graph()
    assert g.input("x", (2, 2), np.float32).dtype == "float32"


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (-1, 2), (0,), (), (2, 2, 2), "ab", 5,
                                   (2.5, 2)])
def test_bad_shapes(shape):
    with pytest.raises(GraphError):
        megak.Graph().input("x", shape, "float32")


def test_gemm_shape_mismatch():
    g = megak.Graph()
    a = g.input("a", (5, 3), "float32")
    b = g.input("b", (4, 4), "float32")
    with pytest.raises(GraphError, match="inner dimensions"):
        g.gemm(a, b)


def test_duplicate_names():
    g = megak.Graph()
    a = g.input("a", (2, 2), "float32")
    with pytest.raises(GraphError, match="duplicate"):
        g.input("a", (2, 2), "float32")
    g.output(a, "y")
    with pytest.raises(GraphError, match="duplicate"):
        g.output(g.copy(a), "y")
    with pytest.raises(GraphError, match="duplicate"):
        g.output(a, "a")


@pytest.mark.parametrize("name", ["", "1x", "a b", None, 3])
def test_bad_names(name):
    with pytest.raises(GraphError, match="identifier"):
        megak.Graph().input(name, (2, 2), "float32")


def test_tensor_from_another_graph():
    g1, g2 = megak.Graph(), megak.Graph()
    a = g1.input("a", (2, 2), "float32")
    b = g2.input("b", (2, 2), "float32")
    with pytest.raises(GraphError, match="another Graph"):
        g2.gemm(b, a)
    with pytest.raises(GraphError, match="another Graph"):
        g2.output(a, "y")
    with pytest.raises(GraphError, match="megak Tensor"):
        g2.copy(np.zeros((2, 2), np.float32))


def test_no_outputs():
    g = megak.Graph()
    g.copy(g.input("a", (2, 2), "float32"))
    with pytest.raises(GraphError, match="no outputs"):
        megak.compile(g, backend="sim")


def test_unknown_backend_lists_the_allowed_ones():
    g, _ = small_program()
    with pytest.raises(GraphError, match="allowed: sim, cuda"):
        megak.compile(g, backend="tpu")


def test_backend_from_environment(monkeypatch):
    monkeypatch.setenv("MEGAK_BACKEND", "sim")
    assert megak.resolve_backend(None) == "sim"
    monkeypatch.setenv("MEGAK_BACKEND", "rocm")
    with pytest.raises(GraphError, match="allowed"):
        megak.resolve_backend(None)
    monkeypatch.delenv("MEGAK_BACKEND")
    assert megak.resolve_backend(None) in ("sim", "cuda")


def test_run_input_errors(rng):
    _, prog = small_program()
    a = rng.standard_normal((5, 3)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    with pytest.raises(GraphError, match=r"missing inputs \['b'\]"):
        prog.run(a=a)
    with pytest.raises(GraphError, match=r"unknown inputs \['z'\]"):
        prog.run(a=a, b=b, z=b)
    with pytest.raises(GraphError, match=r"expected shape \(3, 4\), got \(4, 3\)"):
        prog.run(a=a, b=b.T.copy())
    with pytest.raises(GraphError, match="expected dtype float32, got float64"):
        prog.run(a=a.astype(np.float64), b=b)
    with pytest.raises(GraphError, match="numpy array"):
        prog.run(a=a.tolist(), b=b)


def test_non_contiguous_inputs_are_copied_and_never_modified(rng):
    _, prog = small_program()
    big = rng.standard_normal((10, 6)).astype(np.float32)
    a = big[::2, ::2]                     # (5, 3), strided
    b = np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32))
    keep_a, keep_b = a.copy(), b.copy()
    out1 = prog.run(a=a, b=b)["c"]
    out2 = prog.run(a=a, b=b)["c"]
    np.testing.assert_array_equal(a, keep_a)
    np.testing.assert_array_equal(b, keep_b)
    np.testing.assert_array_equal(out1, out2)  # running twice gives identical results
    ref = keep_a.astype(np.float64) @ keep_b
    np.testing.assert_allclose(out1, ref, rtol=1e-5, atol=1e-5)


def test_outputs_can_be_inputs_and_repeated_tensors(rng):
    g = megak.Graph()
    a = g.input("a", (3, 3), "float32")
    g.output(a, "same")
    sq = g.gemm(a, a)
    g.output(sq, "sq")
    g.output(sq, "sq_again")
    prog = megak.compile(g, backend="sim", n_sm=2)
    x = rng.standard_normal((3, 3)).astype(np.float32)
    out = prog.run(a=x)
    np.testing.assert_array_equal(out["same"], x)
    np.testing.assert_allclose(out["sq"], x.astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out["sq"], out["sq_again"])
    out["sq"][:] = 0   # results are fresh arrays, not views of each other
    assert np.abs(out["sq_again"]).sum() > 0


def test_stats_describe_the_program():
    _, prog = small_program()
    st = prog.stats
    assert st["instructions_per_opcode"] == {"gemm": 1}
    assert sum(st["queue_lengths"]) == st["instructions"] == 1
    # a 5-row fp32 GEMM whose B is an input streams: its record holds the stream's 3 pages
    assert len(st["peak_pages_per_sm"]) == 2 and max(st["peak_pages_per_sm"]) == 3
    assert st["pages_per_sm"] == 13
