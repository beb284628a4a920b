"""megak.resident on the simulator: the API and its semantics as on the GPU (requests run in
submission order, a failed request stops the kernel and later requests do not run, served
programs are used only through it, argument checks), so CI tests what users call.
The GPU side is tests/runtime/test_resident.py; the ring protocol's model is
tests/runtime/test_resident_model.py."""
import math

import numpy as np
import pytest

import megak


def add_one_graph(n=32):
    g = megak.Graph()
    x = g.input("x", (4, n))
    g.output(g.add(x, g.input("one", (4, n))), "y")
    return g


def copy_graph():
    g = megak.Graph()
    g.output(g.copy(g.input("x", (2, 16))), "y")
    return g


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_requests_run_in_order_and_return_what_run_returns(rng):
    a = megak.compile(add_one_graph(), backend="sim")
    b = megak.compile(copy_graph(), backend="sim")
    with megak.resident(a, b) as r:
        assert r.programs == (a, b) and r.backend == "sim" and not r.closed
        xs = [rng.standard_normal((4, 32)).astype(np.float32) for _ in range(6)]
        ha = [r.submit(a, x=x, one=np.ones_like(x)) for x in xs]
        hb = r.submit(b, x=np.arange(32, dtype=np.float32).reshape(2, 16))
        for x, h in zip(xs, ha):
            assert h.done()
            np.testing.assert_array_equal(h.wait()["y"], x + 1)
            assert h.wait() is h.wait()
        np.testing.assert_array_equal(hb.wait()["y"], np.arange(32).reshape(2, 16))
        out = np.full((2, 16), np.nan, np.float32)
        h = r.submit(b, x=np.ones((2, 16), np.float32), out={"y": out})
        assert h.wait()["y"] is out and (out == 1).all()
    assert r.closed and r.launches == 0


def test_a_failed_request_stops_it_and_later_ones_do_not_run():
    good = megak.compile(copy_graph(), backend="sim")
    bad = megak.compile(copy_graph(), backend="sim", timeout_s=0.5)
    ins = bad.plan.instrs
    ins["n_waits"][0] = 1
    ins["wait_counter"][0, 0] = 0
    ins["wait_target"][0, 0] = 5                   # never reached: a hang
    bad.plan.n_counters = max(bad.plan.n_counters, 1)
    x = np.ones((2, 16), np.float32)
    r = megak.resident(good, bad)
    assert r.submit(good, x=x).wait()["y"].sum() == 32
    h = r.submit(bad, x=x)
    with pytest.raises(megak.MegakernelHang):
        h.wait()
    with pytest.raises(megak.MegakernelError, match="stopped"):
        r.submit(good, x=x)
    r.close()
    assert good.run(x=x)["y"].sum() == 32         # usable again once it is closed


def test_served_programs_are_used_only_through_it():
    prog = megak.compile(copy_graph(), backend="sim")
    x = np.ones((2, 16), np.float32)
    r = megak.resident(prog)
    with pytest.raises(megak.MegakernelError, match="resident"):
        prog.run(x=x)
    with pytest.raises(megak.MegakernelError, match="resident"):
        prog.launch(x=x)
    with pytest.raises(megak.MegakernelError, match="resident"):
        prog.close()
    with pytest.raises(megak.GraphError, match="already served"):
        r.add(prog)
    with pytest.raises(megak.GraphError, match="another open resident"):
        megak.resident(prog)
    r.close()
    r.close()                                      # idempotent
    with pytest.raises(megak.MegakernelError, match="closed"):
        r.submit(prog, x=x)
    assert prog.run(x=x)["y"].sum() == 32
    with megak.resident(prog) as again:            # served again by a new one
        assert again.submit(prog, x=x).wait()["y"].sum() == 32


def test_add_a_program_while_it_serves():
    a = megak.compile(copy_graph(), backend="sim")
    with megak.resident(a) as r:
        c = megak.compile(add_one_graph(8), backend="sim")
        with pytest.raises(megak.GraphError, match="not served"):
            r.submit(c, x=np.zeros((4, 8), np.float32), one=np.ones((4, 8), np.float32))
        r.add(c)
        y = r.submit(c, x=np.zeros((4, 8), np.float32), one=np.ones((4, 8), np.float32))
        assert (y.wait()["y"] == 1).all()


def test_a_bound_call_is_submitted_with_its_own_arrays(rng):
    prog = megak.compile(add_one_graph(), backend="sim")
    x = np.empty((4, 32), np.float32)
    y = np.full((4, 32), np.nan, np.float32)
    bound = prog.bind(x=x, one=np.ones_like(x), out={"y": y})
    with megak.resident(prog) as r:
        for i in range(3):
            x[...] = rng.standard_normal(x.shape)
            y[...] = np.nan
            assert r.submit(bound).wait()["y"] is y
            np.testing.assert_array_equal(y, x + 1, err_msg=f"request {i}")
        with pytest.raises(megak.GraphError, match="its own arrays"):
            r.submit(bound, x=x)
        with pytest.raises(megak.MegakernelError, match="resident"):
            bound.run()                   # served: only through the resident kernel
    np.testing.assert_array_equal(bound.run()["y"], x + 1)


def test_bad_arguments_are_graph_errors():
    prog = megak.compile(copy_graph(), backend="sim")
    with pytest.raises(megak.GraphError, match="at least one"):
        megak.resident()
    with pytest.raises(megak.GraphError, match="compiled programs"):
        megak.resident(copy_graph())
    for idle in (0, -1, math.nan):
        with pytest.raises(megak.GraphError, match="idle_s"):
            megak.resident(prog, idle_s=idle)
    with megak.resident(prog, idle_s=math.inf) as r:
        with pytest.raises(megak.GraphError, match="missing inputs"):
            r.submit(prog)
        with pytest.raises(megak.GraphError, match="shape"):
            r.submit(prog, x=np.ones((3, 16), np.float32))
        with pytest.raises(megak.GraphError, match="compiled programs"):
            r.add("not a program")
        assert r.submit(prog, x=np.ones((2, 16), np.float32)).wait()["y"].shape == (2, 16)
    # a closed program is refused, when the kernel opens and by add(), as on the GPU
    closed = megak.compile(copy_graph(), backend="sim")
    closed.close()
    with pytest.raises(megak.GraphError, match="closed"):
        megak.resident(closed)
    with megak.resident(prog) as r:
        with pytest.raises(megak.GraphError, match="closed"):
            r.add(closed)
