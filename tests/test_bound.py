"""Program.bind on the CPU: a bound call checks its arguments when made, runs new values
written into its arrays on the simulator, and on the GPU path takes one launch on its binding
while no torch tensor moved, the full path (checked and bound again) when one did. The GPU
side, with real tensors, is tests/runtime/test_bound.py."""
import numpy as np
import pytest

import megak
from megak import interop, program


def test_a_bound_call_reads_new_values_on_the_simulator():
    g = megak.Graph()
    g.output(g.gemm(g.input("a", (8, 16)), g.input("b", (16, 4))), "y")
    with megak.compile(g, backend="sim") as prog:
        rng = np.random.default_rng(3)
        a = np.empty((8, 16), np.float32)
        b = np.empty((16, 4), np.float32)
        y = np.full((8, 4), np.nan, np.float32)
        bound = prog.bind(a=a, b=b, out={"y": y})
        assert bound.program is prog
        for i in range(3):
            a[...] = rng.uniform(-1, 1, a.shape)
            b[...] = rng.uniform(-1, 1, b.shape)
            y[...] = np.nan
            out = bound.run()
            assert out["y"] is y
            np.testing.assert_allclose(y, a.astype(np.float64) @ b, rtol=0, atol=1e-5,
                                       err_msg=f"call {i}")
            y[...] = np.nan
            assert bound.launch().wait()["y"] is y
            np.testing.assert_allclose(y, a.astype(np.float64) @ b, rtol=0, atol=1e-5)


def test_bind_checks_its_arguments_when_made():
    g = megak.Graph()
    g.output(g.copy(g.input("x", (4, 8))), "y")
    with megak.compile(g, backend="sim") as prog:
        x = np.zeros((4, 8), np.float32)
        with pytest.raises(megak.GraphError, match="missing inputs"):
            prog.bind(out={"y": np.zeros((4, 8), np.float32)})
        with pytest.raises(megak.GraphError, match="shape"):
            prog.bind(x=np.zeros((4, 9), np.float32))
        with pytest.raises(megak.GraphError, match="takes a dict"):
            prog.bind(x=x, out=[x])
        with pytest.raises(megak.GraphError, match="unknown outputs"):
            prog.bind(x=x, out={"z": x})


class Tensor:
    """What a bound call reads of a torch GPU tensor: its address."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class Binding:
    live = True


class Executor:
    """The executor calls of the fast path, recorded."""
    ordinal = 0

    def __init__(self):
        self.calls = []

    def run_bound(self, binding, stream):
        self.calls.append(("run_bound", binding, stream))

    def launch_bound(self, binding, stream):
        self.calls.append(("launch_bound", binding, stream))
        return 7


@pytest.fixture
def gpu_path(monkeypatch):
    """A sim program whose executor and torch type are stand-ins: the fast path's choices."""
    g = megak.Graph()
    g.output(g.copy(g.input("x", (4, 8))), "y")
    prog = megak.compile(g, backend="sim")
    sim = prog._executor
    ex = Executor()
    monkeypatch.setattr(interop, "torch_tensor_types", lambda: (Tensor,))
    monkeypatch.setattr(interop, "current_stream", lambda kind, ordinal: 99)
    monkeypatch.setattr(prog, "_executor", ex)
    full = []

    class Handle:
        def __init__(self, call):
            self._call = call

        def wait(self):
            return {"y": "full path"}

    def launch(out, stream, trace, inputs):
        full.append(stream)
        return Handle(program._Call(arrays={}, external={}, slots=[], kind="torch",
                                    on_gpu=True, targets={}, in_place={}, binding=Binding(),
                                    all_out=True))
    monkeypatch.setattr(prog, "_launch", launch)
    yield prog, ex, full
    monkeypatch.setattr(prog, "_executor", sim)
    prog.close()


def test_the_fast_path_is_one_launch_until_a_tensor_moves(gpu_path):
    prog, ex, full = gpu_path
    x, y = Tensor(1 << 20), Tensor(2 << 20)
    bound = megak.Bound(prog, {"x": x}, {"y": y}, None)
    assert bound.run()["y"] == "full path" and full == [None]     # not bound yet
    first = bound._call.binding
    assert bound.run()["y"] is y and ex.calls == [("run_bound", first, 99)]
    h = bound.launch(stream=5)
    assert ex.calls[-1] == ("launch_bound", first, 5) and h._ticket == 7
    y.ptr += 4096                                                  # the output moved
    assert bound.run()["y"] == "full path" and len(full) == 2 and len(ex.calls) == 2
    assert bound._call.binding is not first
    bound.run()
    assert ex.calls[-1][0] == "run_bound" and len(full) == 2
    bound._call.binding.live = False                                # its table was reused
    bound.run()
    assert len(full) == 3


def test_a_program_served_by_a_resident_kernel_refuses_bound_runs(gpu_path):
    prog, ex, full = gpu_path
    x, y = Tensor(1 << 20), Tensor(2 << 20)
    bound = megak.Bound(prog, {"x": x}, {"y": y}, None)
    bound.run()
    prog._resident = object()
    try:
        with pytest.raises(megak.MegakernelError, match="resident"):
            bound.run()
        assert len(ex.calls) == 0
    finally:
        prog._resident = None
