"""torch / cupy / __cuda_array_interface__ inputs and outputs, zero-copy on the GPU."""
import numpy as np
import pytest

import megak
from megak import GraphError
from tests.reference import assert_close, evaluate


def graph(dtype="float32", out_dtype=None):
    g = megak.Graph()
    a = g.input("a", (130, 70), dtype)
    b = g.input("b", (70, 33), dtype)
    bias = g.input("bias", (33,), dtype)
    g.output(g.gemm(a, b, bias=bias, activation="relu", out_dtype=out_dtype), "y")
    return g


def numpy_inputs(g, rng):
    from megak.dtypes import numpy_dtype
    return {n: rng.uniform(-1, 1, t.shape).astype(np.float32).astype(numpy_dtype(t.dtype))
            for n, t in g.inputs.items()}


def check(g, host_inputs, y, what):
    env = evaluate(g, host_inputs)
    t = g.outputs["y"]
    assert_close(np.asarray(y), *env[t.index], what, t.dtype)


def test_numpy_out_is_written(backend, rng):
    g = graph()
    prog = megak.compile(g, backend=backend, **({"n_sm": 3} if backend == "sim" else {}))
    x = numpy_inputs(g, rng)
    buf = np.full((130, 33), np.nan, np.float32)
    res = prog.run(out={"y": buf}, **x)
    assert res["y"] is buf
    check(g, x, buf, "numpy out=")
    with pytest.raises(GraphError, match="unknown outputs"):
        prog.run(out={"z": buf}, **x)
    with pytest.raises(GraphError, match="out= array must have shape"):
        prog.run(out={"y": np.zeros((33, 130), np.float32)}, **x)


def test_torch_cpu_tensors_round_trip(rng):
    torch = pytest.importorskip("torch")
    g = graph()
    prog = megak.compile(g, backend="sim", n_sm=3)
    x = numpy_inputs(g, rng)
    res = prog.run(**{k: torch.from_numpy(v) for k, v in x.items()})
    assert isinstance(res["y"], torch.Tensor) and res["y"].device.type == "cpu"
    check(g, x, res["y"].numpy(), "torch cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_gpu_zero_copy(rng, dtype):
    torch = pytest.importorskip("torch")
    from megak.interop import _torch_to_numpy
    g = graph(dtype)
    prog = megak.compile(g, backend="cuda")
    host = numpy_inputs(g, rng)
    tens = {k: torch.from_numpy(v.astype(np.float32)).to(getattr(torch, dtype)).cuda()
            for k, v in host.items()}
    before = {k: v.clone() for k, v in tens.items()}
    res = prog.run(**tens)
    y = res["y"]
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == getattr(torch, dtype)
    check(g, host, _torch_to_numpy(y.cpu()), f"torch {dtype}")
    for k in tens:
        assert torch.equal(tens[k], before[k])          # inputs untouched
    ex = prog._executor
    for name in g.inputs:                               # no staging: read in place
        assert prog.plan.inputs[name] not in ex._staging
    # out=: written where it lies
    dst = torch.full((130, 33), float("nan"), dtype=getattr(torch, dtype), device="cuda")
    res2 = prog.run(out={"y": dst}, **tens)
    assert res2["y"].data_ptr() == dst.data_ptr()
    check(g, host, _torch_to_numpy(dst.cpu()), f"torch out= {dtype}")
    # a strided (row-padded) out view is fine: only the row stride changes
    big = torch.full((130, 40), 7.0, dtype=getattr(torch, dtype), device="cuda")
    prog.run(out={"y": big[:, :33]}, **tens)
    check(g, host, _torch_to_numpy(big[:, :33].cpu()), "padded out")
    assert (big[:, 33:] == 7).all()                     # nothing written past the view


@pytest.mark.gpu
def test_torch_gpu_bad_inputs_are_graph_errors(rng):
    torch = pytest.importorskip("torch")
    g = graph()
    prog = megak.compile(g, backend="cuda")
    t = {k: torch.from_numpy(v).cuda() for k, v in numpy_inputs(g, rng).items()}
    with pytest.raises(GraphError, match="expected dtype float32, got bfloat16"):
        prog.run(**{**t, "a": t["a"].to(torch.bfloat16)})
    with pytest.raises(GraphError, match=r"expected shape \(130, 70\)"):
        prog.run(**{**t, "a": t["a"][:100]})
    with pytest.raises(GraphError, match="row-major"):
        prog.run(**{**t, "a": torch.empty(70, 130, device="cuda").t()})
    with pytest.raises(GraphError, match="out"):
        prog.run(out={"y": torch.empty(33, 130, device="cuda")}, **t)


@pytest.mark.gpu
def test_cupy_and_cuda_array_interface(rng):
    cupy = pytest.importorskip("cupy")
    g = graph()
    prog = megak.compile(g, backend="cuda")
    host = numpy_inputs(g, rng)
    arrs = {k: cupy.asarray(v) for k, v in host.items()}
    res = prog.run(**arrs)
    assert isinstance(res["y"], cupy.ndarray)
    check(g, host, res["y"].get(), "cupy")

    class Wrapped:   # any object exposing only __cuda_array_interface__
        def __init__(self, a):
            self.a = a
            self.__cuda_array_interface__ = a.__cuda_array_interface__
    out = cupy.full((130, 33), cupy.nan, dtype=cupy.float32)
    res = prog.run(out={"y": Wrapped(out)}, **{k: Wrapped(v) for k, v in arrs.items()})
    check(g, host, out.get(), "cuda array interface")
