"""megak.bfloat16 is the numpy type to build bf16 inputs with."""
import numpy as np

import megak


def test_bfloat16_is_exported():
    assert "bfloat16" in megak.__all__
    assert np.dtype(megak.bfloat16).name == "bfloat16"
    assert megak.Graph().input("x", (2, 2), megak.bfloat16).dtype == "bfloat16"


def test_numpy_bfloat16_arrays_are_bf16_inputs_on_the_simulator(rng):
    g = megak.Graph()
    x = g.input("x", (2, 4), "bfloat16")
    w = g.input("w", (4, 3), "bfloat16")
    bias = g.input("bias", (3,), "bfloat16")
    g.output(g.gemm(x, w, bias=bias, out_dtype="float32"), "y")
    prog = megak.compile(g, backend="sim", n_sm=2)
    xv = rng.integers(-3, 4, (2, 4)).astype(megak.bfloat16)   # small ints: exact in bf16
    wv = rng.integers(-3, 4, (4, 3)).astype(megak.bfloat16)
    y = prog.run(x=xv, w=wv, bias=np.zeros(3, megak.bfloat16))["y"]
    np.testing.assert_array_equal(y, xv.astype(np.float64) @ wv.astype(np.float64))
