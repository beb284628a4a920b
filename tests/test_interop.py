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
def test_torch_gpu_out_sharing_memory_with_an_input(rng):
    """An out= tensor overlapping an input is refused; views of one buffer that share no
    byte (an input in the left columns, the output in the right ones) run and are right."""
    torch = pytest.importorskip("torch")
    g = megak.Graph()
    x = g.input("x", (64, 32))
    g.output(g.gemm(x, g.input("w", (32, 32))), "y")
    prog = megak.compile(g, backend="cuda")
    host = numpy_inputs(g, rng)
    buf = torch.full((64, 64), float("nan"), device="cuda")
    buf[:, :32] = torch.from_numpy(host["x"]).cuda()
    w = torch.from_numpy(host["w"]).cuda()
    with pytest.raises(GraphError, match="shares memory with input 'x'"):
        prog.run(x=buf[:, :32], w=w, out={"y": buf[:, 16:48]})
    prog.run(x=buf[:, :32], w=w, out={"y": buf[:, 32:]})
    env = evaluate(g, host)
    assert_close(buf[:, 32:].cpu().numpy(), *env[g.outputs["y"].index], "right half")
    assert torch.equal(buf[:, :32].cpu(), torch.from_numpy(host["x"]))


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


def test_overlap_of_gpu_arrays_is_exact(rng):
    """interop.overlaps against a byte-by-byte answer, on random row-major views of one
    buffer (interleaved column halves share no byte and must not count)."""
    from megak.interop import DeviceArray, overlaps

    def view(offset, rows, cols, ld, dtype="float32", device=0):
        shape, strides = ((rows, cols), (ld, 1)) if rows else ((cols,), (1,))
        return DeviceArray(None, "cuda", (1 << 20) + offset, shape, strides, dtype, device)

    def bytes_of(x):
        item = 4 if x.dtype == "float32" else 2
        n = x.shape[0] if len(x.shape) == 2 else 1
        return {x.ptr + item * (i * x.row_stride() + j) + k for i in range(n)
                for j in range(x.shape[-1]) for k in range(item)}

    left, right = view(0, 8, 32, 64), view(32 * 4, 8, 32, 64)
    assert not overlaps(left, right) and overlaps(left, view(0, 8, 64, 64))
    assert not overlaps(left, view(0, 8, 32, 64, device=1))
    for _ in range(2000):
        a, b = (view(2 * int(rng.integers(0, 80)), int(rng.integers(0, 5)),
                     int(rng.integers(1, 9)), 9 + int(rng.integers(0, 4)),
                     "float32" if rng.random() < 0.5 else "bfloat16") for _ in range(2))
        truth = bool(bytes_of(a) & bytes_of(b))
        assert overlaps(a, b) == truth == overlaps(b, a), (a, b)


@pytest.fixture
def gpu_stand_in(monkeypatch):
    """A class standing in for torch GPU tensors as far as megak's checks go (an address and
    a layout; values the simulator reads), with interop taught to describe it."""
    from megak import interop
    from megak.interop import DeviceArray

    class Gpu:
        def __init__(self, ptr, values):
            self.values = values
            self.desc = DeviceArray(self, "torch", ptr, values.shape,
                                    (values.shape[1], 1), "float32", 0)

    real_describe, real_kind = interop.describe, interop.kind_of
    monkeypatch.setattr(interop, "kind_of",
                        lambda o: "torch" if isinstance(o, Gpu) else real_kind(o))
    monkeypatch.setattr(interop, "describe",
                        lambda o: o.desc if isinstance(o, Gpu) else real_describe(o))
    monkeypatch.setattr(interop, "to_host", lambda d: d.obj.values)
    return Gpu


def test_an_out_array_sharing_memory_with_an_input_is_refused(gpu_stand_in, rng):
    """A GPU out= array the GPU would write in place while another instruction reads the
    input it overlaps: refused before anything runs, on the simulator as on the GPU (here
    with stand-ins for torch GPU tensors: the simulator would copy both and not show it)."""
    Gpu = gpu_stand_in
    g = megak.Graph()
    x = g.input("x", (8, 16))
    g.output(g.gemm(x, g.input("w", (16, 16))), "y")
    prog = megak.compile(g, backend="sim", n_sm=2)
    values = rng.uniform(-1, 1, (8, 16)).astype(np.float32)
    w = rng.uniform(-1, 1, (16, 16)).astype(np.float32)
    with pytest.raises(GraphError, match="'y' shares memory with input 'x'"):
        prog.run(x=Gpu(1 << 20, values), w=w, out={"y": Gpu(1 << 20, values)})
    with pytest.raises(GraphError, match="shares memory"):       # the last row overlaps
        prog.run(x=Gpu(1 << 20, values), w=w, out={"y": Gpu((1 << 20) - 7 * 64 + 4, values)})


def test_out_arrays_sharing_part_of_their_memory_are_refused(gpu_stand_in, rng):
    """Two GPU out= arrays that overlap without starting at the same address (the column
    halves of one buffer that cross): refused like any other overlap, by the same test."""
    Gpu = gpu_stand_in
    g = megak.Graph()
    x = g.input("x", (8, 16))
    g.output(g.copy(x), "y")
    g.output(g.transpose(g.transpose(x)), "z")
    prog = megak.compile(g, backend="sim", n_sm=2)
    values = rng.uniform(-1, 1, (8, 16)).astype(np.float32)
    base = 1 << 20
    with pytest.raises(GraphError, match="overlapping memory"):
        prog.run(x=values, out={"y": Gpu(base, values), "z": Gpu(base + 8 * 4, values)})
