"""Program.bind on the GPU with torch tensors: a bound call repeated with new values written
into its tensors, one launch per call on one binding, a moved tensor bound again, launches
in order on a stream, capture into a CUDA graph, and an error reported by the bound call.
Every result is checked against float64 (tests/reference.py bounds), outputs poisoned first."""
import numpy as np
import pytest

import megak
from tests.runtime.test_call_path import (chain_graph, check, expected, planted_hang,
                                          poisoned, tensors)
from tests.reference import assert_close

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(4321)


def refill(static: dict, gen, g) -> dict:
    fresh = tensors(g, gen)
    for k, v in static.items():
        v.copy_(fresh[k])
    return fresh


def test_a_bound_call_runs_new_values_on_one_binding(gen):
    g = chain_graph(4, dtype="bfloat16")
    with megak.compile(g, backend="cuda") as prog:
        static = tensors(g, gen, torch.bfloat16)
        y = torch.empty(g.outputs["y"].shape, device="cuda", dtype=torch.bfloat16)
        bound = prog.bind(out={"y": y}, **static)
        for i in range(20):
            fresh = refill(static, gen, g)
            y.fill_(float("nan"))
            out = bound.run()
            assert out["y"] is y
            check(g, fresh, y, f"bound run {i}")
        assert len(prog._executor._bindings) == 1
        assert bound._fast_call() is not None, "the bound call left the fast path"


def test_a_moved_tensor_is_bound_again(gen):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda") as prog:
        x = tensors(g, gen)
        y = poisoned(g)
        bound = prog.bind(out={"y": y}, **x)
        bound.run()
        check(g, x, y, "first")
        first = bound._call.binding
        x["w0"].set_(torch.rand(x["w0"].shape, device="cuda", generator=gen))  # new address
        assert bound._fast_call() is None
        y.fill_(float("nan"))
        bound.run()
        check(g, x, y, "after w0 moved")
        assert bound._call.binding is not first and bound._fast_call() is not None
        x["w1"].resize_(160, 160)        # a new address, and no longer the input's shape
        with pytest.raises(megak.GraphError, match="w1"):
            bound.run()


def test_bound_launches_in_order_on_a_stream(gen):
    g = chain_graph(2, m=8, n=64)
    with megak.compile(g, backend="cuda") as prog:
        x = tensors(g, gen)
        y = poisoned(g)
        acc = torch.zeros_like(y)
        bound = prog.bind(out={"y": y}, **x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        want, want_err, size = np.zeros(y.shape), np.zeros(y.shape), np.zeros(y.shape)
        with torch.cuda.stream(s):
            for i in range(50):
                x["x"].mul_(-1.0)          # on s: ordered before the launch after it
                h = bound.launch()
                acc.add_(y)                # on s: ordered after it
                value, err = expected(g, x)
                want += value
                want_err += err
                size += np.abs(value) + err
        h.wait()
        torch.cuda.synchronize()
        want_err += 50 * 2.0 ** -24 * size     # each fp32 add into acc rounds once more
        assert_close(acc.cpu().numpy(), want, want_err, "sum of 50 bound launches")


def test_a_bound_launch_captured_in_a_cuda_graph(gen):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda") as prog:
        static = tensors(g, gen)
        y = poisoned(g)
        z = torch.empty_like(y)
        bound = prog.bind(out={"y": y}, **static)
        bound.run()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            bound.launch()
            torch.mul(y, 2.0, out=z)
        for i in range(30):
            fresh = refill(static, gen, g)
            y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            value, err = expected(g, fresh)
            assert_close(z.cpu().numpy(), 2.0 * value, 2.0 * err, f"replay {i}")
        prog.check()


def test_a_hang_in_a_bound_call_raises_and_the_next_call_runs(gen):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda", timeout_s=0.5) as prog:
        x = tensors(g, gen)
        y = poisoned(g)
        bound = prog.bind(out={"y": y}, **x)
        bound.run()
        with planted_hang(prog):
            with pytest.raises(megak.MegakernelHang, match="MK_ERR_TIMEOUT"):
                bound.run()
        y.fill_(float("nan"))
        bound.run()
        check(g, x, y, "after the hang")
