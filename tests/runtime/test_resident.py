"""The resident megakernel on the GPU (megak.resident): requests of several programs in
order, numpy and torch tensors, idle exits and relaunch, programs added while it runs, a
failed request stopping it cleanly, the process dying under it, and a stress run of many
requests with every result checked against float64 (tests/reference.py bounds).

While a resident kernel runs it holds every SM: no torch kernel may be queued before it has
left, so these tests make their tensors and references first and move data only by copies
(which run beside it)."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import megak
from megak import abi
from tests.reference import assert_close, evaluate

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def chain_graph(layers=3, m=16, n=96, dtype="float32"):
    g = megak.Graph()
    x = g.input("x", (m, n), dtype)
    h = x
    for i in range(layers):
        h = g.gemm(h, g.input(f"w{i}", (n, n), dtype), activation="relu")
    g.output(h, "y")
    return g


def copy_graph(shape=(1, 32)):
    g = megak.Graph()
    g.output(g.copy(g.input("x", shape)), "y")
    return g


class Case:
    """One request's tensors (torch, on the GPU), its float64 expectation, and a NaN host
    tensor to poison its output with by copy."""

    def __init__(self, g, rng, dtype=torch.float32):
        host = {name: rng.uniform(-1, 1, t.shape).astype(np.float32)
                for name, t in g.inputs.items()}
        self.inputs = {k: torch.from_numpy(v).to("cuda", dtype) for k, v in host.items()}
        exact = {k: v.float().cpu().numpy() for k, v in self.inputs.items()}
        self.value, self.bound = evaluate(g, exact)[g.outputs["y"].index]
        self.y = torch.empty(g.outputs["y"].shape, device="cuda", dtype=dtype)
        self.nan = torch.full(self.y.shape, float("nan"), dtype=dtype)

    def poison(self):
        self.y.copy_(self.nan)            # a copy: it runs beside the resident kernel

    def check(self, what):
        assert_close(self.y.cpu().float().numpy(), self.value, self.bound, what)


def run_rounds(r, cases, rounds):
    """`rounds` times: every (program, Case) request submitted on its poisoned output, then
    each waited for and checked."""
    for rnd in range(rounds):
        for _, c in cases:
            c.poison()
        handles = [r.submit(p, out={"y": c.y}, **c.inputs) for p, c in cases]
        for i, ((_, c), h) in enumerate(zip(cases, handles)):
            assert h.wait()["y"] is c.y and h.done()
            c.check(f"round {rnd} request {i}")


@pytest.fixture
def rng():
    return np.random.default_rng(20261201)


def test_requests_of_two_programs_run_in_order(rng):
    ga, gb = chain_graph(3), chain_graph(2, m=8, n=64, dtype="bfloat16")
    with megak.compile(ga, backend="cuda") as a, megak.compile(gb, backend="cuda") as b:
        cases = [(a, Case(ga, rng)) if i % 3 else (b, Case(gb, rng, torch.bfloat16))
                 for i in range(12)]
        torch.cuda.synchronize()
        with megak.resident(a, b) as r:
            run_rounds(r, cases, 3)
            assert r.launches == 1


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_numpy_inputs_and_outputs(rng, debug):
    """numpy arrays go through pinned staging by copies; debug's NaN poison too (a memset
    may be a kernel, which would wait for the resident one)."""
    g = chain_graph(2)
    with megak.compile(g, backend="cuda", debug=debug, timeout_s=2.0) as prog, \
            megak.resident(prog) as r:
        for i in range(5):
            host = {n: rng.uniform(-1, 1, t.shape).astype(np.float32) for n, t in g.inputs.items()}
            value, bound = evaluate(g, {k: v.astype(np.float64) for k, v in host.items()})[
                g.outputs["y"].index]
            y = r.submit(prog, **host).wait()["y"]
            assert isinstance(y, np.ndarray)
            assert_close(y, value, bound, f"numpy request {i}")


def test_numpy_requests_in_flight_keep_their_own_results(rng):
    """numpy requests submitted back to back without waiting share the program's buffers:
    each submit first waits for the earlier ones, so every request keeps its own inputs and
    results, whatever order they are waited in."""
    g = chain_graph(2)
    with megak.compile(g, backend="cuda", timeout_s=2.0) as prog, megak.resident(prog) as r:
        pending = []
        for _ in range(6):
            host = {n: rng.uniform(-1, 1, t.shape).astype(np.float32) for n, t in g.inputs.items()}
            value, bound = evaluate(g, {k: v.astype(np.float64) for k, v in host.items()})[
                g.outputs["y"].index]
            pending.append((value, bound, r.submit(prog, **host)))
        for i, (value, bound, h) in reversed(list(enumerate(pending))):
            assert_close(h.wait()["y"], value, bound, f"numpy request {i}")


def test_it_leaves_when_idle_and_the_next_submit_launches_it_again(rng):
    g = copy_graph()
    with megak.compile(g, backend="cuda") as prog:
        c = Case(g, rng)
        torch.cuda.synchronize()
        with megak.resident(prog, idle_s=0.05) as r:
            for round_ in range(3):
                c.poison()
                r.submit(prog, out={"y": c.y}, **c.inputs).wait()
                c.check(f"after {round_} idle exits")
                time.sleep(0.3)
                r._kernel.kick()
                assert not r._kernel.running, "the kernel stayed past its idle deadline"
            assert r.launches == 3


def test_a_program_added_while_it_runs(rng):
    ga = chain_graph(2)
    # compiled before the kernel is resident: a module's load waits for a kernel that holds
    # every SM (tools/probe_module_load.py); its queues are uploaded by then as well
    gc_ = chain_graph(4, m=8, n=128)
    with megak.compile(ga, backend="cuda") as a, megak.compile(gc_, backend="cuda") as c:
        # the premise: c needs no op body a's build lacks, so adding it widens nothing
        assert not c._executor.bodies & ~a._executor.bodies
        ca = Case(ga, rng)
        x = {n: rng.uniform(-1, 1, t.shape).astype(np.float32) for n, t in gc_.inputs.items()}
        torch.cuda.synchronize()
        with megak.resident(a, idle_s=30) as r:
            r.submit(a, out={"y": ca.y}, **ca.inputs).wait()
            r.add(c)
            assert r._kernel.running and r.launches == 1
            value, bound = evaluate(gc_, {k: v.astype(np.float64) for k, v in x.items()})[
                gc_.outputs["y"].index]
            assert_close(r.submit(c, **x).wait()["y"], value, bound, "added program")
            assert r.launches == 1, "the kernel left before the added program's request"
            r.close()
        ca.check("first program")


def test_it_runs_its_programs_bodies_and_a_wider_build_for_an_added_one(rng):
    """The kernel is a build of its programs' op bodies (a copy: no GEMM code). Adding a GEMM
    chain compiles a wider build while the kernel runs; the kernel leaves after the request
    already submitted (served by the old build) and the next request launches the new one,
    which serves both programs."""
    from megak import abi
    from megak.runtime import compiler
    gcopy, gchain = copy_graph(), chain_graph(2)
    with megak.compile(gcopy, backend="cuda") as a, megak.compile(gchain, backend="cuda") as b, \
            megak.compile(gchain, backend="cuda") as b2:
        cases = [Case(gcopy, rng) for _ in range(3)]
        cb = Case(gchain, rng)
        torch.cuda.synchronize()
        with megak.resident(a, idle_s=30) as r:
            k = r._kernel
            assert k.bodies == a._executor.bodies
            built = compiler.compile_megakernel(
                a._executor.info["arch"],
                defines=a._executor._variant_defines(False, 0, k.bodies, True))
            names = " ".join(compiler.code_sizes(built.cubin))
            assert "megakernel_resident" in names and "mk_gemm" not in names, names
            cases[0].poison()
            first = r.submit(a, out={"y": cases[0].y}, **cases[0].inputs)
            r.add(b)
            assert k.bodies == a._executor.bodies | b._executor.bodies
            assert k.bodies != a._executor.bodies     # the added program widened the build
            assert k.bodies & (abi.BODY_GEMM_TILED | abi.BODY_GEMM_STREAM)
            first.wait()
            cases[0].check("the request before the wider build")
            cb.poison()
            cases[1].poison()
            hb = r.submit(b, out={"y": cb.y}, **cb.inputs)
            ha = r.submit(a, out={"y": cases[1].y}, **cases[1].inputs)
            hb.wait()
            ha.wait()
            cb.check("the added program, on the wider build")
            cases[1].check("the first program, on the wider build")
            assert r.launches == 2 and k.running
            r.add(b2)
            assert r.launches == 2          # known bodies: no new build, no relaunch
            cases[2].poison()
            r.submit(a, out={"y": cases[2].y}, **cases[2].inputs).wait()
            cases[2].check("after an add of known bodies")
            assert r.launches == 2


def test_bound_requests_run_new_values_and_a_moved_tensor(rng):
    """r.submit(bound): the bound tensors' new values (copied in from the host beside the
    kernel: a device-to-device copy may be a kernel, which would wait for the resident one to
    leave) on one table; a tensor that moved takes the full path once and is bound again.
    The copies are waited for on torch's stream alone: a device-wide synchronize would wait
    for the resident kernel to leave on idle."""
    g = chain_graph(3)
    with megak.compile(g, backend="cuda") as prog:
        static, cases = Case(g, rng), [Case(g, rng) for _ in range(6)]
        hosts = [{k: v.cpu() for k, v in c.inputs.items()} for c in cases]
        moved = cases[-1].inputs["w0"].clone()       # allocated before the kernel holds the SMs
        bound = prog.bind(out={"y": static.y}, **static.inputs)
        torch.cuda.synchronize()
        with megak.resident(prog, idle_s=30) as r:
            for i, (c, host) in enumerate(zip(cases[:-1], hosts)):
                for k, v in static.inputs.items():
                    v.copy_(host[k])                 # host -> device: beside the kernel
                static.poison()
                torch.cuda.current_stream().synchronize()
                assert r.submit(bound).wait()["y"] is static.y
                assert_close(static.y.cpu().numpy(), c.value, c.bound, f"bound request {i}")
            table = bound._call.binding
            last = cases[-1]
            for k, v in static.inputs.items():
                if k != "w0":
                    v.copy_(hosts[-1][k])
            static.inputs["w0"].set_(moved)
            static.poison()
            torch.cuda.current_stream().synchronize()
            r.submit(bound).wait()
            assert_close(static.y.cpu().numpy(), last.value, last.bound, "after w0 moved")
            assert bound._call.binding is not table and bound._fast_call() is not None
            assert r.launches == 1


def test_close_serves_what_was_submitted(rng):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda") as prog:
        cases = [Case(g, rng) for _ in range(20)]
        torch.cuda.synchronize()
        r = megak.resident(prog)
        handles = [r.submit(prog, out={"y": c.y}, **c.inputs) for c in cases]
        r.close()
        assert all(h.done() for h in handles)
        for i, (c, h) in enumerate(zip(cases, handles)):
            h.wait()
            c.check(f"request {i}")
        with pytest.raises(megak.MegakernelError, match="closed"):
            r.submit(prog, out={"y": cases[0].y}, **cases[0].inputs)


def test_more_requests_in_flight_than_the_ring_holds(rng):
    """The host waits for ring slots the kernel has taken, never overwrites a waiting one."""
    g = copy_graph((8, 64))
    with megak.compile(g, backend="cuda") as prog:
        cases = [Case(g, rng) for _ in range(3 * megak.abi.RESIDENT["MK_RING_SLOTS"])]
        torch.cuda.synchronize()
        with megak.resident(prog) as r:
            handles = [r.submit(prog, out={"y": c.y}, **c.inputs) for c in cases]
            for i, (c, h) in enumerate(zip(cases, handles)):
                h.wait()
                c.check(f"request {i}")


def test_a_served_program_is_used_only_through_its_resident(rng):
    g = copy_graph()
    with megak.compile(g, backend="cuda") as prog:
        c = Case(g, rng)
        torch.cuda.synchronize()
        with megak.resident(prog) as r:
            with pytest.raises(megak.MegakernelError, match="resident"):
                prog.run(out={"y": c.y}, **c.inputs)
            with pytest.raises(megak.MegakernelError, match="resident"):
                prog.close()
            with pytest.raises(megak.GraphError, match="already served"):
                r.add(prog)
        c.poison()
        prog.run(out={"y": c.y}, **c.inputs)
        c.check("run after the resident closed")


@pytest.mark.parametrize("fault", ["hang", "bad record"])
def test_a_failed_request_stops_it_cleanly(rng, fault):
    g = chain_graph(2)
    with megak.compile(g, backend="cuda", timeout_s=0.5) as good, \
            megak.compile(g, backend="cuda", timeout_s=0.5) as bad:
        ins = bad.plan.instrs
        if fault == "hang":
            i = int(np.nonzero(ins["n_waits"] > 0)[0][0])
            ins["wait_target"][i, 0] += 1              # never reached
        else:
            ins["opcode"][0] = 0xFFFF                   # no such op
        bad._executor.reload_queues()
        cases = [Case(g, rng) for _ in range(4)]
        torch.cuda.synchronize()
        with megak.resident(good, bad) as r:
            def submit_behind(case):
                """A request behind the failed one: taken and never run, or refused at once
                once the kernel has stopped. A bad record stops it within microseconds, so
                its submit may see the stop; a hang takes the 0.5 s timeout, so never."""
                try:
                    return r.submit(good, out={"y": case.y}, **case.inputs)
                except megak.MegakernelError as exc:
                    assert fault == "bad record" and "stopped" in str(exc), exc
                    return None

            h1 = r.submit(good, out={"y": cases[0].y}, **cases[0].inputs)
            h2 = r.submit(bad, out={"y": cases[1].y}, **cases[1].inputs)
            h3 = submit_behind(cases[2])
            h4 = submit_behind(cases[3])
            h1.wait()
            cases[0].check("the request before the failure")
            error = megak.MegakernelHang if fault == "hang" else megak.MegakernelError
            with pytest.raises(error, match="MK_ERR_TIMEOUT" if fault == "hang"
                               else "MK_ERR_BAD_OPCODE"):
                h2.wait()
            if h3 is not None:
                with pytest.raises(megak.MegakernelError, match="not run"):
                    h3.wait()
            with pytest.raises(megak.MegakernelError, match="stopped"):
                r.submit(good, out={"y": cases[2].y}, **cases[2].inputs)
        if h4 is not None:
            # a request first asked about after the close (the kernel's memory is freed by then)
            assert h4.done()
            with pytest.raises(megak.MegakernelError, match="not run"):
                h4.wait()
        # the GPU and both programs stay usable
        cases[2].poison()
        good.run(out={"y": cases[2].y}, **cases[2].inputs)
        cases[2].check("run after the failed resident")


def test_the_kernel_ends_with_the_process_that_started_it(rng):
    child = textwrap.dedent("""
        import os, numpy as np, megak
        g = megak.Graph()
        g.output(g.copy(g.input("x", (1, 32))), "y")
        prog = megak.compile(g, backend="cuda")
        r = megak.resident(prog, idle_s=float("inf"))
        r.submit(prog, x=np.ones((1, 32), np.float32)).wait()
        print("served", flush=True)
        os._exit(0)            # no close, no finalizer: the driver ends the kernel
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0 and "served" in out.stdout, out.stderr
    g = copy_graph()
    with megak.compile(g, backend="cuda", timeout_s=2.0) as prog:
        c = Case(g, rng)
        torch.cuda.synchronize()
        c.poison()
        prog.run(out={"y": c.y}, **c.inputs)
        c.check("after the process that held a resident kernel ended")


def test_paged_transposes_in_requests(rng):
    """Whole transpose tiles through the resident kernel, whose loader keeps no copy of the
    table's head: the transpose reads its A's tensor-map ready word from global memory. Ten
    requests on fresh inputs, each exact on an output poisoned before it."""
    g = megak.Graph()
    g.output(g.transpose(g.input("x", (256, 512))), "y")
    prog = megak.compile(g, backend="cuda", n_sm=2)
    try:
        xs = [torch.from_numpy(rng.uniform(-1, 1, (256, 512)).astype(np.float32)).cuda()
              for _ in range(10)]
        y = torch.empty((512, 256), device="cuda")
        nan = torch.full((512, 256), float("nan"))
        torch.cuda.synchronize()
        with megak.resident(prog) as r:
            for i, x in enumerate(xs):
                y.copy_(nan)                  # a copy: it runs beside the resident kernel
                r.submit(prog, x=x, out={"y": y}).wait()
                np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy().T,
                                              err_msg=f"request {i}")
    finally:
        prog.close()


def test_copies_taken_in_turn_in_requests(rng):
    """A copy whose takers share a hand-out counter, requested again and again between
    requests of another program: each request hands every band out once more (the counter
    runs on from the last request's bands + 8 x takers), every result exact on a poisoned
    output."""
    gc, gm = copy_graph((2048, 1000)), chain_graph(2)
    with megak.compile(gc, backend="cuda") as c, megak.compile(gm, backend="cuda") as m:
        ins = c.plan.instrs
        assert ((ins["flags"] & abi.FLAG_COPY_TAKE) != 0).sum() > 1
        cases = [(c, Case(gc, rng)) if i % 2 else (m, Case(gm, rng)) for i in range(8)]
        torch.cuda.synchronize()
        with megak.resident(c, m) as r:
            run_rounds(r, cases, 4)


def test_stress_many_requests_of_random_programs(rng):
    """The request ring and the relay under load: 2,000 requests over three programs of
    different grids (one SM, a few, all), posted in bursts that wrap the ring, every result
    checked."""
    graphs = [copy_graph((4, 64)), chain_graph(2, m=16, n=64), chain_graph(3, m=32, n=96)]
    progs = [megak.compile(g, backend="cuda") for g in graphs]
    try:
        pool = [[Case(g, rng) for _ in range(4)] for g in graphs]
        torch.cuda.synchronize()
        done = 0
        with megak.resident(*progs) as r:
            while done < 2000:
                burst = []
                used = set()
                for _ in range(int(rng.integers(1, 90))):
                    k = int(rng.integers(0, len(progs)))
                    j = int(rng.integers(0, 4))
                    if (k, j) in used:
                        continue            # one request per output buffer per burst
                    used.add((k, j))
                    c = pool[k][j]
                    c.poison()
                    burst.append((c, r.submit(progs[k], out={"y": c.y}, **c.inputs)))
                for c, h in burst:
                    h.wait()
                    c.check(f"request {done}")
                    done += 1
            assert r.launches == 1
    finally:
        for p in progs:
            p.close()
