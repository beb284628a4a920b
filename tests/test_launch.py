"""prog.launch / Handle / prog.check on both backends: the asynchronous call path's contract.
A launched run returns at once; wait() gives run()'s result; a failed run raises from its
wait(), or if never waited on, from the next call on the program: never lost, and its
outputs never returned as valid."""
import numpy as np
import pytest

import megak

from tests.reference import check_graph, evaluate, random_inputs, assert_close


def chain(n=3):
    g = megak.Graph()
    x = g.input("x", (5, 70))
    w = g.input("w", (70, 70))
    h = x
    for _ in range(n):
        h = g.gemm(h, w)
    g.output(h, "y")
    return g


def opts(backend):
    return {"n_sm": 4} if backend == "sim" else {"timeout_s": 1.0}


def plant_hang(prog):
    """A wait target one above what its counter gets per run: never reached."""
    ins = prog.plan.instrs
    i = int(np.nonzero(ins["n_waits"] > 0)[0][0])
    original = ins.copy()
    ins["wait_target"][i, 0] += 1
    prog._executor.reload_queues()
    return original


def restore(prog, original):
    prog.plan.instrs[:] = original
    prog._executor.reload_queues()


def test_launch_then_wait_is_run(backend, rng):
    g = chain()
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        handles = []
        for _ in range(4):
            inputs = random_inputs(g, rng)
            handles.append((inputs, prog.launch(**inputs)))
        for inputs, h in handles:
            out = h.wait()
            assert h.done() and h.wait() is out           # the same dict again
            value, bound = evaluate(g, inputs)[g.outputs["y"].index]
            assert_close(out["y"], value, bound, "launched chain")
        check_graph(prog, g, rng, "run after launches")


def test_an_error_is_raised_by_its_wait_and_only_once(backend, rng):
    g = chain()
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        original = plant_hang(prog)
        h = prog.launch(**random_inputs(g, rng))
        with pytest.raises(megak.MegakernelHang):
            h.wait()
        with pytest.raises(megak.MegakernelHang):   # asked again: the same failure
            h.wait()
        restore(prog, original)
        prog.check()                                # reported already: nothing pending
        check_graph(prog, g, rng, "after the hang")


def test_an_error_never_waited_on_is_raised_by_the_next_call(backend, rng):
    g = chain()
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        original = plant_hang(prog)
        prog.launch(**random_inputs(g, rng))        # never waited on
        restore(prog, original)
        with pytest.raises(megak.MegakernelHang):
            prog.run(**random_inputs(g, rng))
        check_graph(prog, g, rng, "after the reported hang")


def test_check_reports_a_failure_without_waiting_on_a_handle(backend, rng):
    g = chain()
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        original = plant_hang(prog)
        h = prog.launch(**random_inputs(g, rng))
        while not h.done():
            pass
        restore(prog, original)
        with pytest.raises(megak.MegakernelHang):
            prog.check()
        prog.check()                                # once


def test_stream_is_checked(backend, rng):
    g = chain(1)
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        inputs = random_inputs(g, rng)
        if backend == "sim":                        # accepted and ignored there
            prog.run(stream=7, **inputs)
        with pytest.raises(megak.GraphError, match="stream= takes a CUDA stream"):
            prog.launch(stream="default", **inputs).wait()


def test_a_closed_program_refuses_to_run_on_either_backend(backend, rng):
    """close() ends a program on both backends alike, so code tested on the simulator fails
    the same way on the GPU: run, launch and the wait of a run not yet waited on raise,
    close again does nothing."""
    g = chain(1)
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        check_graph(prog, g, rng)
        inputs = random_inputs(g, rng)
        waited = prog.launch(**inputs)
        result = waited.wait()
        pending = prog.launch(**inputs)
    for call in (prog.run, prog.launch):
        with pytest.raises(megak.MegakernelError, match="closed"):
            call(**inputs)
    # a run waited on before close keeps its result; one that was not raises
    assert waited.wait() is result
    with pytest.raises(megak.MegakernelError, match="closed"):
        pending.wait()
    prog.close()


def test_runs_from_several_threads_are_each_correct(backend):
    """One program called from 4 threads at once: runs are serialised where they share state
    (the GPU executor's lock, the simulator's), each returns its own inputs' result."""
    import threading
    g = chain(2)
    failures = []
    with megak.compile(g, backend=backend, **opts(backend)) as prog:
        def work(seed):
            rng = np.random.default_rng(seed)
            try:
                for _ in range(10):
                    check_graph(prog, g, rng, f"thread {seed}")
            except Exception as exc:       # reported below, with the thread that saw it
                failures.append((seed, exc))
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures, failures[:2]


def test_an_interrupted_simulator_run_leaves_the_next_one_clean(rng, monkeypatch):
    """Ctrl-C inside a simulator run (KeyboardInterrupt part-way through) leaves counters
    part-way, as a failed run does: the next run starts from zero and is right."""
    from megak.sim import SimExecutor
    g = chain(3)
    prog = megak.compile(g, backend="sim", n_sm=4)
    real = SimExecutor._execute

    def interrupted(self, instrs, tensors, written):
        self.counters[:] += 1                      # some signals already sent
        monkeypatch.setattr(SimExecutor, "_execute", real)
        raise KeyboardInterrupt
    monkeypatch.setattr(SimExecutor, "_execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prog.run(**random_inputs(g, rng))
    check_graph(prog, g, rng, "after the interrupt")
