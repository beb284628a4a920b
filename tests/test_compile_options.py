"""compile()'s counts and backend options are typed and checked before anything is lowered."""
import math

import numpy as np
import pytest

import megak
from megak import GraphError
from megak.options import OPTION_NAMES, CudaOptions, SimOptions, backend_options


def tiny_graph():
    g = megak.Graph()
    a = g.input("a", (4, 4), "float32")
    g.output(g.gemm(a, a), "y")
    return g


@pytest.mark.parametrize("name", ["n_sm", "n_pages"])
@pytest.mark.parametrize("value", [0, -1, True, False, 2.0, 2.5, "4", np.bool_(True)])
def test_bad_counts_are_errors_naming_the_value(name, value):
    with pytest.raises(GraphError, match=f"{name}={value!r}"):
        megak.compile(tiny_graph(), backend="sim", **{name: value})


def test_more_pages_than_the_page_mask_holds_is_an_error():
    with pytest.raises(GraphError, match=r"n_pages=33 .* from 1 to 32"):
        megak.compile(tiny_graph(), backend="sim", n_pages=33)


def test_numpy_integers_are_counts_and_none_is_an_h200_on_the_simulator():
    prog = megak.compile(tiny_graph(), backend="sim", n_sm=np.int64(3), n_pages=np.int32(6))
    assert (prog.plan.n_sm, prog.plan.n_pages) == (3, 6)
    assert isinstance(prog.plan.n_sm, int)
    prog = megak.compile(tiny_graph(), backend="sim", n_sm=None, n_pages=None)
    assert (prog.plan.n_sm, prog.plan.n_pages) == (132, 13)


@pytest.mark.parametrize("options, message", [
    ({"seed": "x"}, "seed='x'"),
    ({"seed": -1}, "seed=-1"),
    ({"seed": 1.5}, "seed=1.5"),
    ({"seed": True}, "seed=True"),
    ({"order": "fifo"}, "order='fifo'.*allowed: round_robin, random"),
    ({"timeout_s": 0}, "timeout_s=0"),
    ({"timeout_s": -2.0}, "timeout_s=-2.0"),
    ({"timeout_s": math.inf}, "timeout_s=inf"),
    ({"timeout_s": "5"}, "timeout_s='5'"),
    ({"timeout_s": True}, "timeout_s=True"),
    ({"managed": 1}, "managed=1"),
    ({"debug": "yes"}, "debug='yes'"),
])
@pytest.mark.parametrize("backend", ["sim", "cuda"])
def test_bad_option_values_are_errors_on_every_backend(backend, options, message):
    # checked before any device is touched, so this runs without a GPU too
    with pytest.raises(GraphError, match=message):
        backend_options(backend, options)
    if backend == "sim":
        with pytest.raises(GraphError, match=message):
            megak.compile(tiny_graph(), backend="sim", **options)


def test_unknown_option_lists_the_allowed_ones():
    with pytest.raises(GraphError, match=r"unknown option\(s\) 'sead'; allowed: order, seed "
                                         r"\(sim\); timeout_s, managed, debug \(cuda\)"):
        megak.compile(tiny_graph(), backend="sim", sead=3)


def test_gpu_options_are_accepted_by_the_simulator(rng):
    prog = megak.compile(tiny_graph(), backend="sim", n_sm=2, timeout_s=0.5, managed=True,
                         debug=True, order="random", seed=7)
    assert prog.options == SimOptions(order="random", seed=7)
    x = rng.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(prog.run(a=x)["y"], x.astype(np.float64) @ x, rtol=1e-5,
                               atol=1e-5)


def test_each_backend_keeps_only_its_own_options():
    given = {"order": "random", "seed": np.int64(3), "timeout_s": 2, "managed": True,
             "debug": np.bool_(False)}
    sim = backend_options("sim", given)
    cuda = backend_options("cuda", given)
    assert sim == SimOptions(order="random", seed=3) and type(sim.seed) is int
    assert cuda == CudaOptions(timeout_s=2.0, managed=True, debug=False)
    assert type(cuda.timeout_s) is float and type(cuda.debug) is bool
    assert backend_options("cuda", {}) == CudaOptions(timeout_s=5.0, managed=False,
                                                      debug=False)


def test_options_are_frozen():
    with pytest.raises(AttributeError):
        SimOptions().order = "random"


def test_help_explains_backend_counts_and_every_option():
    doc = megak.compile.__doc__
    for word in ("MEGAK_BACKEND", "n_sm", "n_pages", "132", "13", *OPTION_NAMES):
        assert word in doc, word


@pytest.mark.parametrize("value", [1, "yes", None])
def test_data_flags_must_be_a_bool(value):
    g = megak.Graph()
    g.output(g.copy(g.copy(g.input("x", (1, 8)))), "y")
    with pytest.raises(megak.GraphError, match="data_flags"):
        megak.compile(g, backend="sim", data_flags=value)
    assert "data_flags" in megak.compile.__doc__
    assert not any(t.flagged for t in megak.compile(g, backend="sim",
                                                      data_flags=False).plan.tensors)


@pytest.mark.parametrize("dtype, rows", [("float32", 16), ("bfloat16", 64)])
def test_weight_stream_false_lowers_input_weights_as_tiles(dtype, rows, rng):
    g = megak.Graph()
    x, w = g.input("x", (rows, 256), dtype), g.input("w", (256, 512), dtype)
    g.output(g.gemm(x, w), "y")
    streamed = megak.compile(g, backend="sim").plan.instrs["flags"]
    tiled = megak.compile(g, backend="sim", weight_stream=False)
    assert (streamed & megak.abi.FLAG_STREAM).all()
    assert not (tiled.plan.instrs["flags"] & megak.abi.FLAG_STREAM).any()
    a = rng.standard_normal((rows, 256)).astype(np.float32)
    b = rng.standard_normal((256, 512)).astype(np.float32)
    if dtype == "bfloat16":
        a, b = a.astype(megak.bfloat16), b.astype(megak.bfloat16)
    got = tiled.run(x=a, w=b)["y"].astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # fp32 sums of 256 products; bf16 output rounded to 8 bits of mantissa
    tol = 1e-4 if dtype == "float32" else 2.0 ** -8
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
    assert "weight_stream" in megak.compile.__doc__


@pytest.mark.parametrize("value", [0, "no", None])
def test_weight_stream_must_be_a_bool(value):
    g = megak.Graph()
    g.output(g.copy(g.input("x", (1, 8))), "y")
    with pytest.raises(megak.GraphError, match="weight_stream"):
        megak.compile(g, backend="sim", weight_stream=value)
