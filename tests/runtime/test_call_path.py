"""The call path on the GPU with torch tensors: stream order instead of host syncs, cached
bindings, asynchronous launches, CUDA graph capture and replay, errors inside replays, and a
stress run of many back-to-back launches on changing tensors. Every result is checked
against float64 (tests/reference.py bounds) on fresh inputs, outputs poisoned first."""
import contextlib

import numpy as np
import pytest

import megak
from tests.reference import assert_close, evaluate

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def chain_graph(layers=3, m=16, n=96, dtype="float32"):
    g = megak.Graph()
    x = g.input("x", (m, n), dtype)
    ws = [g.input(f"w{i}", (n, n), dtype) for i in range(layers)]
    h = x
    for w in ws:
        h = g.gemm(h, w, activation="relu")
    g.output(h, "y")
    return g


def tensors(g, gen, dtype=torch.float32):
    return {name: (torch.rand(t.shape, generator=gen, device="cuda", dtype=torch.float32)
                   * 2 - 1).to(dtype) for name, t in g.inputs.items()}


def expected(g, inputs):
    host = {k: v.float().cpu().numpy() for k, v in inputs.items()}
    return evaluate(g, host)[g.outputs["y"].index]


def poisoned(g):
    return torch.full(g.outputs["y"].shape, float("nan"), device="cuda")


def check(g, inputs, y, what):
    value, bound = expected(g, inputs)
    assert_close(y.float().cpu().numpy(), value, bound, what)


@contextlib.contextmanager
def planted_hang(prog):
    """Inside: the program's first instruction with a wait waits for one signal more than it
    ever gets (a hang, reported after the program's timeout); after: its queues as before."""
    ins = prog.plan.instrs
    original = ins.copy()
    i = int(np.nonzero(ins["n_waits"] > 0)[0][0])
    ins["wait_target"][i, 0] += 1
    prog._executor.reload_queues()
    try:
        yield
    finally:
        ins[:] = original
        prog._executor.reload_queues()


def input_as_output_graph():
    """x as an output of its own (read in place, never written) beside y = copy(x)."""
    g = megak.Graph()
    x = g.input("x", (4, 32))
    g.output(x, "same")
    g.output(g.copy(x), "y")
    return g


@pytest.fixture
def gen():
    return torch.Generator(device="cuda").manual_seed(1234)


def test_runs_on_torchs_current_stream_without_a_host_sync(gen):
    g = chain_graph()
    with megak.compile(g, backend="cuda") as prog:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for i in range(5):
                x = tensors(g, gen)                     # produced on s, not synchronised
                y = poisoned(g)
                out = prog.run(out={"y": y}, **x)
                assert out["y"] is y
                z = y * 2                               # ordered after megak on s
                check(g, x, y, f"stream run {i}")
                torch.testing.assert_close(z, y * 2)


@pytest.mark.parametrize("how", ["torch", "int", "cuda.core"])
def test_an_explicit_stream(gen, how):
    from cuda.core import Device
    g = chain_graph(2)
    with megak.compile(g, backend="cuda") as prog:
        ts = torch.cuda.Stream()
        core = Device(0).create_stream() if how == "cuda.core" else None
        stream = {"torch": ts, "int": ts.cuda_stream, "cuda.core": core}[how]
        x = tensors(g, gen)
        torch.cuda.synchronize()
        y = poisoned(g)
        torch.cuda.synchronize()
        h = prog.launch(out={"y": y}, stream=stream, **x)
        h.wait()
        check(g, x, y, f"stream={how}")


def test_repeated_calls_reuse_one_checked_binding(gen):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda") as prog:
        x = tensors(g, gen)
        y = poisoned(g)
        for _ in range(3):
            prog.run(out={"y": y}, **x)
        assert len(prog._calls) == 1 and len(prog._executor._bindings) == 1
        check(g, x, y, "reused binding")
        x2 = tensors(g, gen)                            # new memory: a new binding
        y2 = poisoned(g)
        prog.run(out={"y": y2}, **x2)
        assert len(prog._calls) == 2 and len(prog._executor._bindings) == 2
        check(g, x2, y2, "second binding")
        check(g, x, y, "first binding untouched")


def test_parameters_reuse_one_checked_binding(gen):
    """Weights held as nn.Parameter (as nn.Linear holds them) take the fast path too."""
    g = chain_graph(2)
    with megak.compile(g, backend="cuda") as prog:
        x = tensors(g, gen)
        params = {k: torch.nn.Parameter(v, requires_grad=False) if k != "x" else v
                  for k, v in x.items()}
        y = poisoned(g)
        for _ in range(3):
            prog.run(out={"y": y}, **params)
        assert len(prog._calls) == 1 and len(prog._executor._bindings) == 1
        check(g, x, y, "nn.Parameter weights")
        assert prog._bound_call(params, {"y": y})[1] is not None


def test_the_bound_fast_path_returns_fresh_results_and_raises_its_errors(gen):
    """Repeated run() on one binding (Program.run's fast path: no handle, the wait inline):
    new values copied into the same tensors each time, the output poisoned first; each call
    returns its own dict holding the caller's tensor; a planted hang raises from that run
    and the next run is correct again."""
    g = chain_graph(2)
    with megak.compile(g, backend="cuda", timeout_s=0.5) as prog:
        x = tensors(g, gen)
        y = poisoned(g)
        first = prog.run(out={"y": y}, **x)
        for i in range(4):
            for t in x.values():
                t.copy_(torch.rand(t.shape, generator=gen, device="cuda") * 2 - 1)
            y.fill_(float("nan"))
            out = prog.run(out={"y": y}, **x)
            assert out["y"] is y and out is not first and list(out) == ["y"]
            check(g, x, y, f"fast path run {i}")
            assert prog._executor.last_launch == "graph"    # runtime/graph_launch.py
        assert len(prog._calls) == 1
        with planted_hang(prog), pytest.raises(megak.MegakernelHang, match="MK_ERR_TIMEOUT"):
            prog.run(out={"y": y}, **x)
        assert prog._executor.last_launch == "graph"
        y.fill_(float("nan"))
        prog.run(out={"y": y}, **x)
        check(g, x, y, "fast path after the hang")


def test_graph_replays_and_launches_interleaved_on_two_bindings(gen):
    """Program.run's bound case replays one cooperative graph node with each call's table
    and ticket (runtime/graph_launch.py); launches (direct, capturable) and runs on another
    binding come between them. Fresh values every call, outputs poisoned first."""
    from cuda.bindings import driver as drv
    g = chain_graph(2, m=8, n=64)
    with megak.compile(g, backend="cuda") as prog:
        sets = [(tensors(g, gen), poisoned(g)) for _ in range(2)]
        ex = prog._executor
        for i in range(12):
            x, y = sets[i % 2]
            for t in x.values():
                t.copy_(torch.rand(t.shape, generator=gen, device="cuda") * 2 - 1)
            y.fill_(float("nan"))
            if i % 3 == 2:
                prog.launch(out={"y": y}, **x).wait()
                assert ex.last_launch == "direct"
            else:
                prog.run(out={"y": y}, **x)
                assert ex.last_launch == "graph" or i < 2   # a binding's first run checks
            check(g, x, y, f"call {i}")
        assert ex._graph_launch.error is None
        (_, _, node, _, *_), = ex._graph_launch._graphs.values()
        attr = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        err, value = drv.cuGraphKernelNodeGetAttribute(node, attr)
        assert int(err) == 0 and value.cooperative == 1


def test_the_fast_path_with_an_output_that_is_an_input(gen):
    g = input_as_output_graph()
    with megak.compile(g, backend="cuda") as prog:
        t = torch.rand(4, 32, generator=gen, device="cuda")
        y = torch.full((4, 32), float("nan"), device="cuda")
        for i in range(3):
            t.copy_(torch.rand(4, 32, generator=gen, device="cuda"))
            y.fill_(float("nan"))
            out = prog.run(out={"y": y}, x=t)
            assert out["y"] is y and out["same"].data_ptr() != t.data_ptr()
            torch.testing.assert_close(out["same"], t, rtol=0, atol=0)
            torch.testing.assert_close(y, t, rtol=0, atol=0)
        assert len(prog._calls) == 1


def test_many_launches_on_changing_tensors(gen):
    """1000 back-to-back launches over 3 sets of tensors (3 bindings), one wait at the end,
    then every handle: each set's output is the last launch's on its inputs."""
    g = chain_graph(2, m=8, n=64)
    with megak.compile(g, backend="cuda") as prog:
        sets = [(tensors(g, gen), poisoned(g)) for _ in range(3)]
        handles = [prog.launch(out={"y": sets[i % 3][1]}, **sets[i % 3][0])
                   for i in range(1000)]
        handles[-1].wait()
        assert all(h.done() for h in handles)
        for h in handles:
            h.wait()
        for k, (x, y) in enumerate(sets):
            check(g, x, y, f"set {k}")


@pytest.mark.parametrize("warm", [True, False], ids=["warmed", "first-call-in-capture"])
def test_torch_op_megak_torch_op_in_one_cuda_graph(gen, warm):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda") as prog:
        static = tensors(g, gen)
        a = torch.empty_like(static["x"])
        y = poisoned(g)
        z = torch.empty_like(y)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        if warm:
            with torch.cuda.stream(s):
                torch.mul(static["x"], 0.5, out=a)
                prog.run(out={"y": y}, x=a, **{k: v for k, v in static.items() if k != "x"})
                torch.add(y, 1.0, out=z)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch.mul(static["x"], 0.5, out=a)
            prog.launch(out={"y": y}, x=a, **{k: v for k, v in static.items() if k != "x"})
            torch.add(y, 1.0, out=z)
        for i in range(100):
            fresh = tensors(g, gen)
            for k in static:
                static[k].copy_(fresh[k])
            y.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            value, bound = expected(g, {**fresh, "x": fresh["x"] * 0.5})
            got = z.cpu().numpy()
            assert_close(got, value + 1.0, bound + 2.0 ** -24 * (np.abs(value) + 1.0),
                         f"replay {i}")
        prog.check()


def test_a_hang_inside_a_replay_is_reported_by_check(gen):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda", timeout_s=0.5) as prog:
        x = tensors(g, gen)
        y = poisoned(g)
        prog.run(out={"y": y}, **x)
        s = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            prog.launch(out={"y": y}, **x)
        graph.replay()
        torch.cuda.synchronize()
        prog.check()
        with planted_hang(prog):
            graph.replay()
            torch.cuda.synchronize()
            with pytest.raises(megak.MegakernelHang, match="MK_ERR_TIMEOUT"):
                prog.check()
            prog.check()                                 # reported once
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        prog.check()
        check(g, x, y, "replay after the hang")
        y2 = poisoned(g)
        prog.run(out={"y": y2}, **x)                     # and eager runs too
        check(g, x, y2, "run after the hang")


def test_an_output_that_is_an_input_given_as_a_gpu_tensor(gen):
    g = input_as_output_graph()
    with megak.compile(g, backend="cuda") as prog:
        t = torch.rand(4, 32, generator=gen, device="cuda")
        out = prog.run(x=t)
        assert out["same"].device.type == "cuda" and out["same"].data_ptr() != t.data_ptr()
        torch.testing.assert_close(out["same"], t, rtol=0, atol=0)
        torch.testing.assert_close(out["y"], t, rtol=0, atol=0)


def test_a_closed_program_with_bound_tensors_raises_and_reads_no_freed_memory(gen):
    """A call bound to its tensors (the fast path) of a closed program must not launch on the
    freed tensor table, nor may done() or check() read the freed host view: run and launch
    raise "closed", a launch made before the close counts as finished and its wait raises."""
    g = chain_graph()
    prog = megak.compile(g, backend="cuda")
    inputs = tensors(g, gen)
    y = poisoned(g)
    for _ in range(2):   # the second call takes the bound path
        prog.run(**inputs, out={"y": y})
    check(g, inputs, y, "before close")
    pending = prog.launch(**inputs, out={"y": y})
    prog.close()
    for call in (prog.run, prog.launch):
        with pytest.raises(megak.MegakernelError, match="closed"):
            call(**inputs, out={"y": y})
    assert pending.done()
    with pytest.raises(megak.MegakernelError, match="closed"):
        pending.wait()
    prog.check()       # nothing pending: the runs before the close succeeded
    torch.cuda.synchronize()
    check(g, inputs, y, "the launch before close ran to its end")


def test_reloading_the_queues_waits_for_launches_on_other_streams(gen):
    """A launch queued on a caller's stream behind other work still runs the queues it was
    launched with: reload_queues waits for it (before, only for the executor's own stream,
    so its upload could overtake the launch)."""
    g = chain_graph()
    with megak.compile(g, backend="cuda", timeout_s=0.5) as prog:
        inputs = tensors(g, gen)
        y = poisoned(g)
        prog.run(**inputs, out={"y": y})
        y.fill_(float("nan"))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())   # after the fill above
        with torch.cuda.stream(side):
            torch.cuda._sleep(100_000_000)    # tens of ms of GPU time before the launch
            pending = prog.launch(**inputs, out={"y": y})
        with planted_hang(prog):              # new queues: they would hang that launch
            pending.wait()
        check(g, inputs, y, "the launch queued before the reload")


def test_a_wait_interrupted_can_be_waited_again(gen, monkeypatch):
    """Ctrl-C during a wait (KeyboardInterrupt from the spin) loses nothing: the launch stays
    pending, and the next wait() returns its results (numpy ones too, read back then)."""
    g = chain_graph()
    with megak.compile(g, backend="cuda") as prog:
        inputs = tensors(g, gen)
        host = {k: v.cpu().numpy() for k, v in inputs.items()}
        ex = prog._executor
        real = ex._wait_ticket

        def interrupted(*args):
            monkeypatch.setattr(ex, "_wait_ticket", real)   # once
            raise KeyboardInterrupt
        monkeypatch.setattr(ex, "_wait_ticket", interrupted)
        h = prog.launch(**host)                              # numpy in and out
        with pytest.raises(KeyboardInterrupt):
            h.wait()
        y = h.wait()["y"]
        check(g, inputs, torch.from_numpy(y), "the interrupted launch's result")


def test_fresh_tensors_every_call_are_not_kept_alive(gen):
    """The call cache remembers a call's tensors without holding them: a loop that makes new
    tensors for every call frees each set once the caller drops it."""
    import gc
    import weakref
    g = chain_graph()
    with megak.compile(g, backend="cuda") as prog:
        refs = []
        for i in range(5):
            inputs = tensors(g, gen)
            y = poisoned(g)
            for _ in range(2):       # the second call takes the cached binding
                prog.run(**inputs, out={"y": y})
            check(g, inputs, y, f"call {i}")
            refs += [weakref.ref(t) for t in (*inputs.values(), y)]
            del inputs, y
        gc.collect()
        assert all(r() is None for r in refs), "a cached call kept a tensor alive"
        assert not prog._calls


def test_the_call_workloads_back_to_back_on_the_streamed_chain():
    """benchmarks.report's W7 workloads in one process, every megak variant: the copy, then
    the 16-layer bf16 chain of the weight stream (wide bands; each SM's two instructions take
    all of its allocator pages), run, bound, launched back to back and served by a resident
    kernel, every output checked against float64. Why it is here: with every streamed
    instruction holding the streamer (branch hold-all) these calls failed with
    MK_ERR_PAGE_LEAK in most runs, and no other test failed (benchmarks/ANALYSIS.md)."""
    from benchmarks import report, workloads
    env = report.TorchEnv()
    rng = np.random.default_rng()
    megak_variants = {v for v in workloads.CALL_VARIANTS if v.startswith("megak")}
    for name in ("W7-call-copy", "W7-call-mlp1024"):
        results, failures, _ = report.run_call_workload(workloads.get(name), False, env, rng,
                                                        log=lambda *a: None)
        assert not failures, failures
        assert {r["variant"] for r in results} >= megak_variants, (name, results)
