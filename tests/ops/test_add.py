import numpy as np
import pytest

import megak
from megak import abi
from tests.reference import check_graph

SHAPES = [(1, 1), (7, 3), (1, 4099), (300, 129), (1025, 257)]
SIM = {"n_sm": 5}


def opts(backend):
    return SIM if backend == "sim" else {}


@pytest.mark.parametrize("dtype_a,dtype_b", [("float32", "float32"), ("bfloat16", "bfloat16"),
                                             ("bfloat16", "float32"), ("float32", "bfloat16")])
@pytest.mark.parametrize("shape", SHAPES)
def test_add_matches_float64(backend, rng, shape, dtype_a, dtype_b):
    g = megak.Graph()
    a = g.input("a", shape, dtype_a)
    b = g.input("b", shape, dtype_b)
    y = g.add(a, b)
    assert y.shape == shape and y.dtype == dtype_a
    g.output(y, "y")
    prog = megak.compile(g, backend=backend, **opts(backend))
    check_graph(prog, g, rng, f"add {shape} {dtype_a}+{dtype_b}")


@pytest.mark.parametrize("vector", ["1d", "row"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_add_broadcasts_a_row_vector(backend, rng, vector, dtype):
    g = megak.Graph()
    a = g.input("a", (67, 130), dtype)
    b = g.input("b", (130,) if vector == "1d" else (1, 130), dtype)
    g.output(g.add(a, b), "y")
    prog = megak.compile(g, backend=backend, **opts(backend))
    inputs, out = check_graph(prog, g, rng, f"add broadcast {vector}")
    if dtype == "float32":   # one fp32 add per element: exact to the rounding of numpy's
        np.testing.assert_array_equal(out["y"], inputs["a"] + inputs["b"].reshape(1, -1))


def test_add_checks_shapes():
    g = megak.Graph()
    a = g.input("a", (4, 5))
    with pytest.raises(megak.GraphError, match=r"add: b must have a's shape \(4, 5\)"):
        g.add(a, g.input("b", (5, 4)))
    with pytest.raises(megak.GraphError, match="add: b must"):
        g.add(a, g.input("c", (4,)))
    with pytest.raises(megak.GraphError, match="add: a must be a megak Tensor"):
        g.add(np.ones((4, 5)), a)


def test_add_is_spread_over_the_sms():
    g = megak.Graph()
    a = g.input("a", (1000, 64))
    g.output(g.add(a, a), "y")
    plan = megak.compile(g, backend="sim", n_sm=8).plan
    assert len(plan.instrs) == 8 and (plan.instrs["rows"] == 125).all()


def _gemm_add(residual_shape, *, activation=None, bias=False, also_output=False):
    g = megak.Graph()
    x = g.input("x", (40, 24))
    w = g.input("w", (24, 70))
    kw = {"activation": activation}
    if bias:
        kw["bias"] = g.input("bias", (70,))
    h = g.gemm(x, w, **kw)
    r = g.input("r", residual_shape)
    g.output(g.add(h, r), "y")
    if also_output:
        g.output(h, "h")
    return g


@pytest.mark.parametrize("case", ["residual", "bias", "after-activation-residual"])
def test_add_folds_into_the_gemm_epilogue(backend, rng, case):
    g = {"residual": lambda: _gemm_add((40, 70)),
         "bias": lambda: _gemm_add((70,)),
         "after-activation-residual": lambda: _gemm_add((40, 70), activation="gelu")}[case]()
    prog = megak.compile(g, backend=backend, **opts(backend))
    assert "add" not in prog.stats["instructions_per_opcode"]
    gemm = prog.plan.instrs[prog.plan.instrs["opcode"] == abi.OPCODE_OF["gemm"]]
    want = abi.FLAG_RESIDUAL if case != "bias" else abi.FLAG_BIAS
    assert (gemm["flags"] & want).all()
    assert any("(fused)" in label for label in prog.plan.op_labels)
    check_graph(prog, g, rng, f"fused add {case}")


def _residual_then_bias(x_shape=(40, 24), n=70):
    """(x @ w + r) + bias: the bias comes after the residual."""
    g = megak.Graph()
    x = g.input("x", x_shape)
    h = g.gemm(x, g.input("w", (x_shape[1], n)))
    s = g.add(h, g.input("r", (x_shape[0], n)))
    g.output(g.add(s, g.input("bias", (n,))), "y")
    return g


@pytest.mark.parametrize("graph", [
    lambda: _gemm_add((70,), activation="relu"),       # a bias would go before the relu
    lambda: _gemm_add((70,), bias=True),               # the GEMM has its bias already
    lambda: _gemm_add((40, 70), also_output=True),     # the GEMM's result is needed too
    _residual_then_bias,                               # a bias would go before the residual
])
def test_add_stays_an_instruction_where_folding_would_change_the_result(rng, graph):
    g = graph()
    prog = megak.compile(g, backend="sim", n_sm=4)
    assert "add" in prog.stats["instructions_per_opcode"]
    check_graph(prog, g, rng, "unfused add")


def test_an_add_after_the_residual_keeps_the_graph_order(backend):
    """(x @ w + r) + bias in that order, exactly: with x @ w = 0.5, r = -0.5 and bias =
    0.75 + 2^-24, the graph's order is exact (0, then the bias), while the epilogue's order
    (x @ w + bias, a tie rounded to even at 1.25, then + r) would give 0.75."""
    g = _residual_then_bias((3, 2), 4)
    prog = megak.compile(g, backend=backend, **opts(backend))
    assert prog.stats["instructions_per_opcode"]["add"] > 0
    bias = np.full(4, 0.75 + 2.0 ** -24, np.float32)
    assert bias[0] != np.float32(0.75)
    out = prog.run(x=np.full((3, 2), 0.5, np.float32), w=np.full((2, 4), 0.5, np.float32),
                   r=np.full((3, 4), -0.5, np.float32), bias=bias)
    np.testing.assert_array_equal(out["y"], np.broadcast_to(bias, (3, 4)))


def _sum_with_a_later_producer(case):
    g = megak.Graph()
    x = g.input("x", (33, 64))
    h = g.gemm(x, g.input("w1", (64, 48)))
    if case == "two-gemms":                    # x@w1 + x@w2
        b = g.gemm(x, g.input("w2", (64, 48)))
    elif case == "lora":                       # x@w + (x@a)@b
        b = g.gemm(g.gemm(x, g.input("a", (64, 8))), g.input("b", (8, 48)))
    else:                                      # x@w + copy(v)
        b = g.copy(g.input("v", (33, 48)))
    g.output(g.add(h, b), "y")
    return g


@pytest.mark.parametrize("n_sm", [1, 2, 5])
@pytest.mark.parametrize("case", ["two-gemms", "lora", "copy"])
def test_a_fused_add_waits_for_an_operand_written_after_its_gemm(backend, rng, case, n_sm):
    """The add folds into the first GEMM, whose residual is written by a later op: the fused
    unit must come after that op in every queue (one SM: a single queue in unit order)."""
    g = _sum_with_a_later_producer(case)
    prog = megak.compile(g, backend=backend, n_sm=n_sm)
    assert "add" not in prog.stats["instructions_per_opcode"]
    labels = prog.plan.op_labels
    fused = next(i for i, label in enumerate(labels) if "(fused)" in label)
    assert fused == len(labels) - 1, labels
    check_graph(prog, g, rng, f"fused add after {case}")
