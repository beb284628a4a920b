"""The CUDA runtime: detection, device facts, refusals before launch, hang detection and
recovery, replays, managed memory. Everything but the detection and pure-logic tests needs a
GPU (marked `gpu`; the rootdir conftest skips them elsewhere)."""
import time

import numpy as np
import pytest

import megak
from megak import abi, pages
from megak.errors import GraphError, MegakernelError, MegakernelHang
from megak.plan import Plan, TensorSlot
from megak.runtime.executor import counter_max_target
from megak.runtime.invocation import next_epoch
from tests.reference import assert_close, evaluate, random_inputs

NOP = abi.OP_NOP


def nop_plan(queues, n_counters, *, n_pages=1, tensor_shape=(4, 4)):
    """A hand-built plan of NOP instructions: ``queues[s]`` lists (waits, signals) per
    instruction of SM s, waits as (counter, target) pairs. One small input tensor, so the
    tensor table is never empty."""
    recs, starts = [], [0]
    op = 0
    labels = []
    for s, queue in enumerate(queues):
        for waits, signals in queue:
            r = abi.empty_instrs(1)
            r["opcode"] = NOP
            r["op_index"] = op
            r["n_waits"] = len(waits)
            r["n_signals"] = len(signals)
            for k, (c, t) in enumerate(waits):
                r["wait_counter"][0, k] = c
                r["wait_target"][0, k] = t
            for k, c in enumerate(signals):
                r["signal_counter"][0, k] = c
            recs.append(r)
            labels.append(f"nop #{op} (SM {s} test instruction)")
            op += 1
        starts.append(len(recs))
    instrs = np.concatenate(recs) if recs else abi.empty_instrs(0)
    targets = np.zeros(n_counters, dtype=np.uint32)
    for r in instrs:
        for k in range(int(r["n_signals"])):
            targets[int(r["signal_counter"][k])] += 1
    rows, cols = tensor_shape
    return Plan(instrs=instrs, queue_start=np.array(starts, dtype=np.uint32),
                tensors=[TensorSlot(0, "x", rows, cols, "float32", "input")],
                n_counters=n_counters, n_sm=len(queues), n_pages=n_pages, op_labels=labels,
                inputs={"x": 0}, outputs={"x": 0},
                input_shapes={"x": ((rows, cols), "float32")},
                output_shapes={"x": (rows, cols)}, counter_targets=targets)


def handoff_plan():
    """SM 1 signals counter 0 once; SM 0 waits for it."""
    return nop_plan([[([(0, 1)], [])], [([], [0])]], n_counters=1)


# -- no GPU needed -----------------------------------------------------------------------------

def test_gpu_detection_is_a_fast_bool():
    from megak.runtime import driver
    driver._detect.cache_clear()
    t0 = time.perf_counter()
    usable = driver.gpu_usable()
    first = time.perf_counter() - t0
    assert isinstance(usable, bool)
    if not usable:  # with a driver, cuInit alone may take a while: only bound the no-GPU path
        assert first < 1.0, f"gpu_usable() took {first:.3f} s without a GPU"
        assert driver.gpu_unusable_reason()
    t0 = time.perf_counter()
    assert driver.gpu_usable() is usable
    assert time.perf_counter() - t0 < 0.01  # cached


def test_next_epoch_resets_before_counters_could_wrap():
    assert next_epoch(0, 1) == (1, False)
    assert next_epoch(0, 0) == (1, False)
    # run e waits for (e + 1) * t: e_last is the last epoch whose targets stay <= 2**31
    t = 1000
    e_last = 2 ** 31 // t - 1
    assert next_epoch(e_last - 1, t) == (e_last, False)
    assert next_epoch(e_last, t) == (0, True)
    assert next_epoch(2 ** 30, 2) == (0, True)


def test_counter_max_target_counts_signals_without_targets():
    plan = nop_plan([[([], [0, 1])], [([], [0])], [([(0, 2), (1, 1)], [])]], n_counters=2)
    assert counter_max_target(plan) == 2
    plan.counter_targets = None
    assert counter_max_target(plan) == 2


# -- GPU ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def info():
    from megak.runtime.driver import device_info
    return device_info()


@pytest.mark.gpu
def test_device_info(info):
    assert isinstance(info["name"], str) and info["name"]
    assert info["sm_count"] > 0
    major, minor = info["compute_capability"]
    assert info["arch"].startswith(f"sm_{major}{minor}")
    if (major, minor) == (9, 0):
        assert info["arch"] == "sm_90a"
        assert info["smem_optin"] == pages.HOPPER_OPTIN_SMEM
        assert info["smem_reserved"] == 1024
    assert info["smem_optin"] >= info["smem_per_block"] > 0
    assert 0 < info["free_mem"] <= info["total_mem"]
    assert info["driver_version"] >= 12000
    assert info["cooperative_launch"] is True


@pytest.mark.gpu
def test_too_much_shared_memory_is_refused_before_launch(info):
    from megak.runtime.executor import CudaExecutor
    with pytest.raises(MegakernelError, match="opt-in"):
        CudaExecutor(handoff_plan(), smem_bytes=info["smem_optin"] + 1024)
    too_many = pages.pages_for(info["smem_optin"]) + 1
    plan = handoff_plan()
    plan.n_pages = too_many
    with pytest.raises(MegakernelError, match="opt-in"):
        CudaExecutor(plan)


@pytest.mark.gpu
def test_more_sms_than_the_device_is_refused(info):
    from megak.runtime.executor import CudaExecutor
    plan = nop_plan([[]] * (info["sm_count"] + 1), n_counters=0)
    with pytest.raises(MegakernelError, match="SMs"):
        CudaExecutor(plan)


@pytest.mark.gpu
def test_managed_memory_above_free_is_refused(info):
    from megak.runtime.driver import mem_info
    from megak.runtime.executor import CudaExecutor
    from megak.runtime.memory import Memory
    m = Memory(0)
    try:
        free, _ = mem_info()
        with pytest.raises(MegakernelError, match=r"asked for .* free"):
            m.managed(free + (1 << 30), "too big")
        assert m.n_live == 0
    finally:
        m.close()
    side = 1 << 18  # one 2^18 x 2^18 fp32 tensor: 256 GiB, more than any current GPU has
    plan = nop_plan([[]], n_counters=0, tensor_shape=(side, side))
    with pytest.raises(MegakernelError, match=r"managed memory, the device has .* free"):
        CudaExecutor(plan, managed=True)


@pytest.mark.gpu
@pytest.mark.parametrize("managed", [False, True], ids=["device", "managed"])
def test_handoff_replays_and_round_trips(rng, managed):
    from megak.runtime.executor import CudaExecutor
    with CudaExecutor(handoff_plan(), managed=managed, debug=True) as ex:
        for run in range(5):
            x = rng.standard_normal((4, 4)).astype(np.float32)
            out = ex.run({0: x}, [0])
            assert out[0].dtype == np.float32 and out[0].shape == (4, 4)
            np.testing.assert_array_equal(out[0], x)  # an input read back is bit-exact
            assert ex.epoch == run + 1                 # no counter reset between good runs
            assert ex.last_status["finished_blocks"] == 2
        with pytest.raises(GraphError):
            ex.run({0: np.zeros((4, 5), dtype=np.float32)}, [0])
    assert ex.closed
    with pytest.raises(MegakernelError, match="closed"):
        ex.run({}, [0])


@pytest.mark.gpu
def test_nop_hang_is_detected_and_the_gpu_recovers():
    from megak.runtime.executor import CudaExecutor
    plan = handoff_plan()
    timeout = 1.0
    with CudaExecutor(plan, timeout_s=timeout) as ex:
        ex.run({}, [])
        plan.instrs["wait_target"][0, 0] = 2       # one more signal than anyone sends
        ex.reload_queues()
        t0 = time.monotonic()
        with pytest.raises(MegakernelHang) as err:
            ex.run({}, [])
        elapsed = time.monotonic() - t0
        assert elapsed < timeout + 1.0 + 0.5, f"hang reported after {elapsed:.2f} s"
        msg = str(err.value)
        assert "SM 0" in msg and "nop #0" in msg and "counter 0" in msg, msg
        assert err.value.record["error"] == abi.ERRORS["MK_ERR_TIMEOUT"]
        assert ex.epoch == 0
        plan.instrs["wait_target"][0, 0] = 1
        ex.reload_queues()
        for run in range(3):
            ex.run({}, [])
            assert ex.epoch == run + 1


def _mixed_graph(m=130, k=72, n=66):
    # odd sizes: partial tiles, and leading dims padded to MK_TENSOR_ALIGN_BYTES
    g = megak.Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    c = g.gemm(a, b)
    t = g.transpose(c)
    y = g.copy(t)
    g.output(y, "y")
    g.output(c, "c")
    return g


def _check(prog, g, rng):
    inputs = random_inputs(g, rng)
    out = prog.run(**inputs)
    env = evaluate(g, inputs)
    for name, t in g.outputs.items():
        value, bound = env[t.index]
        assert_close(out[name], value, bound, f"output {name!r}")
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("managed", [False, True], ids=["device", "managed"])
def test_mixed_graph_matches_float64(rng, managed):
    g = _mixed_graph()
    prog = megak.compile(g, backend="cuda", managed=managed, debug=True)
    try:
        for _ in range(3):  # replays: epoch-offset waits, no counter reset
            _check(prog, g, rng)
    finally:
        prog.close()


@pytest.mark.gpu
def test_operands_on_both_sides_of_the_table_head(rng):
    """A launched block reads the first MK_TABLE_HEAD descriptors from its shared copy of the
    table's head and the rest from global memory: a chain of adds over 60 inputs has
    operands on both sides (and records that mix them), each output checked, twice."""
    head = abi.LIMITS["MK_TABLE_HEAD"]
    g = megak.Graph()
    h = g.input("x0", (8, 48))
    for i in range(1, 60):
        h = g.add(h, g.input(f"x{i}", (8, 48)))
        if i % 20 == 0:
            g.output(h, f"y{i}")
    g.output(h, "y")
    with megak.compile(g, backend="cuda", debug=True) as prog:
        assert len(prog.plan.tensors) > head + 10
        for _ in range(2):
            _check(prog, g, rng)


@pytest.mark.gpu
def test_planted_hang_in_a_real_graph_then_recovery(rng):
    g = _mixed_graph()
    prog = megak.compile(g, backend="cuda", debug=True)
    try:
        ex, plan = prog._executor, prog.plan
        timeout = 1.0
        ex.timeout_s = timeout
        _check(prog, g, rng)
        waiting = np.nonzero(plan.instrs["n_waits"] > 0)[0]
        assert len(waiting), "the graph should have cross-op dependencies"
        i = int(waiting[0])
        original = plan.instrs.copy()
        # a target one above the signals a counter gets per run is never reached
        plan.instrs["wait_target"][i, 0] += 1
        ex.reload_queues()
        t0 = time.monotonic()
        with pytest.raises(MegakernelHang) as err:
            prog.run(**random_inputs(g, rng))
        elapsed = time.monotonic() - t0
        assert elapsed < timeout + 1.0 + 0.5, f"hang reported after {elapsed:.2f} s"
        rec = err.value.record
        assert rec["error"] == abi.ERRORS["MK_ERR_TIMEOUT"]
        assert rec["sm"] < plan.n_sm
        msg = str(err.value)
        assert msg.startswith(f"cuda: MK_ERR_TIMEOUT on SM {rec['sm']}"), msg
        assert plan.op_labels[rec["op_index"]] in msg, msg
        plan.instrs[:] = original
        ex.reload_queues()
        for _ in range(2):
            _check(prog, g, rng)
    finally:
        prog.close()


@pytest.mark.gpu
def test_close_frees_everything():
    from megak.runtime.executor import CudaExecutor
    ex = CudaExecutor(handoff_plan())
    memory = ex._memory
    ex.run({0: np.ones((4, 4), dtype=np.float32)}, [0])
    assert memory.n_live > 0
    ex.close()
    assert memory.n_live == 0 and memory.closed
    ex.close()  # idempotent


@pytest.mark.gpu
def test_a_host_view_read_while_another_thread_closes_reads_live_memory():
    """done() reads the mapped host view without the executor's lock: a reader that took the
    view just before close() (which swaps in a host copy, then frees) must still read memory
    that is there, and see every launch finished. The view's memory is Python's (registered
    with the driver), so it outlives the close; and a thread polling done() while close()
    runs never faults."""
    import threading
    from megak.runtime.executor import CudaExecutor
    x = np.ones((4, 4), dtype=np.float32)
    for _ in range(20):
        ex = CudaExecutor(handoff_plan())
        ex.run({0: x}, [0])
        ex.launch({0: x}, [0])              # in flight as the close begins
        held = ex._host                     # what a done() racing the close may hold
        started, stop = threading.Event(), threading.Event()
        polls = []

        def poll():
            while True:              # the last poll comes after the close
                last = stop.is_set()
                polls.append(ex.done(ex._ticket))
                started.set()
                if last:
                    return

        t = threading.Thread(target=poll)
        t.start()
        started.wait(10)
        ex.close()
        stop.set()
        t.join()
        assert polls and polls[-1]
        assert held.done(ex._ticket) and held.view["ticket_done"] == ex._ticket


# -- the executor's host logic against a fake driver (no GPU) -----------------------------------
#
# "Device memory" is host memory here and the "kernel" runs NOP queues with the epoch rule of
# instr.h on the CPU. This checks staging, padding, epochs, status decoding, the watchdog and
# freeing; it says nothing about the real driver or the device code (the gpu tests do that).

class _FakeGpu:
    def __init__(self, real):
        import types
        self.real = real
        R = real.CUresult
        self.ok = (R.CUDA_SUCCESS,)
        self.mem = {}               # aligned address -> backing ctypes buffer
        self.free_bytes = 100 << 30
        self.query = lambda: self.ok
        self.kernel = self.nop_kernel
        self.graphs = {}            # live graphs and executable graphs: handle -> what
        self.calls = []             # the launch calls made, by name
        self.refuse_graphs = False  # cuGraphInstantiate fails (a driver without the feature)
        fake = self

        class Drv:
            def __getattr__(self, name):  # enums, types, flags: the real ones
                return getattr(real, name)

            def cuDeviceGet(self, o): return (R.CUDA_SUCCESS, real.CUdevice(o))
            def cuDevicePrimaryCtxRetain(self, d): return (R.CUDA_SUCCESS, real.CUcontext(1))
            def cuDevicePrimaryCtxRelease(self, d): return fake.ok
            def cuCtxGetCurrent(self): return (R.CUDA_SUCCESS, real.CUcontext(1))
            def cuCtxPushCurrent(self, c): return fake.ok
            def cuCtxPopCurrent(self): return (R.CUDA_SUCCESS, real.CUcontext(1))
            def cuDeviceGetAttribute(self, a, d): return (R.CUDA_SUCCESS, 1)
            def cuDeviceTotalMem(self, d): return (R.CUDA_SUCCESS, 141 << 30)
            def cuMemGetInfo(self): return (R.CUDA_SUCCESS, fake.free_bytes, 141 << 30)
            def cuDriverGetVersion(self): return (R.CUDA_SUCCESS, 13000)
            def cuMemAlloc(self, n): return (R.CUDA_SUCCESS, real.CUdeviceptr(fake.alloc(n)))
            def cuMemAllocManaged(self, n, f):
                return (R.CUDA_SUCCESS, real.CUdeviceptr(fake.alloc(n)))
            def cuMemHostAlloc(self, n, f): return (R.CUDA_SUCCESS, fake.alloc(n))
            def cuMemHostGetDevicePointer(self, p, f): return (R.CUDA_SUCCESS, int(p))
            def cuStreamIsCapturing(self, h):
                return (R.CUDA_SUCCESS,
                        real.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)
            def cuLaunchCooperativeKernel(self, f, gx, gy, gz, bx, by, bz, smem, h, argv):
                assert bx == abi.BLOCK_THREADS and (gy, gz, by, bz) == (1, 1, 1, 1)
                fake.calls.append("cuLaunchCooperativeKernel")
                fake.kernel(*fake.arguments(argv))
                return fake.ok
            # graphs: a node's arguments are read when its parameters are set, as the
            # driver copies them; a replay runs the kernel with those
            def cuGraphCreate(self, flags):
                g = real.CUgraph(fake.handle("graph"))
                return (R.CUDA_SUCCESS, g)
            def cuGraphAddKernelNode(self, g, deps, n, params):
                assert int(g) in fake.graphs and n == 0
                assert params.blockDimX == abi.BLOCK_THREADS and params.gridDimY == 1
                fake.graphs[int(g)] = ("graph", fake.arguments(int(params.kernelParams)))
                return (R.CUDA_SUCCESS, real.CUgraphNode(int(g)))
            def cuGraphKernelNodeSetAttribute(self, node, attr, value):
                assert attr == real.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
                assert value.cooperative == 1
                fake.graphs[int(node)] += ("cooperative",)
                return fake.ok
            def cuGraphInstantiate(self, g, flags):
                if fake.refuse_graphs:
                    return (R.CUDA_ERROR_NOT_SUPPORTED, None)
                assert fake.graphs[int(g)][-1] == "cooperative"
                e = fake.handle("exec")
                fake.graphs[e] = ["exec", fake.graphs[int(g)][1]]
                return (R.CUDA_SUCCESS, real.CUgraphExec(e))
            def cuGraphExecKernelNodeSetParams(self, e, node, params):
                fake.calls.append("cuGraphExecKernelNodeSetParams")
                fake.graphs[int(e)][1] = fake.arguments(int(params.kernelParams))
                return fake.ok
            def cuGraphLaunch(self, e, h):
                fake.calls.append("cuGraphLaunch")
                fake.kernel(*fake.graphs[int(e)][1])
                return fake.ok
            def cuGraphExecDestroy(self, e):
                assert fake.graphs.pop(int(e))[0] == "exec"
                return fake.ok
            def cuGraphDestroy(self, g):
                assert fake.graphs.pop(int(g))[0] == "graph"
                return fake.ok
            def cuMemFree(self, p): del fake.mem[int(p)]; return fake.ok
            def cuMemFreeHost(self, p): del fake.mem[int(p)]; return fake.ok
            def cuMemHostRegister(self, p, n, f):
                assert int(p) % 4096 == 0 and n % 4096 == 0
                fake.mem[int(p)] = ("registered", n)
                return fake.ok
            def cuMemHostUnregister(self, p): del fake.mem[int(p)]; return fake.ok
            def cuMemcpyHtoDAsync(self, d, s, n, h): fake.move(d, s, n); return fake.ok
            def cuMemcpyDtoHAsync(self, d, s, n, h): fake.move(d, s, n); return fake.ok
            def cuMemsetD32Async(self, d, v, n, h):
                fake.view(int(d), np.uint32, n)[:] = v
                return fake.ok
            def cuMemPrefetchAsync(self, p, n, loc, flags, h): return fake.ok
            def cuStreamQuery(self, h): return fake.query()
            def cuKernelGetAttribute(self, a, k, d):
                values = {"CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK": abi.BLOCK_THREADS,
                          "CU_FUNC_ATTRIBUTE_NUM_REGS": 128}
                return (R.CUDA_SUCCESS, values.get(a.name, 0))
            def cuKernelSetAttribute(self, a, v, k, d): return fake.ok
            def cuKernelGetFunction(self, k): return (R.CUDA_SUCCESS, real.CUfunction(0))
            def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, f, t, s):
                return (R.CUDA_SUCCESS, 1)

        self.drv = Drv()
        props = types.SimpleNamespace(
            multiprocessor_count=132, max_shared_memory_per_block_optin=pages.HOPPER_OPTIN_SMEM,
            max_shared_memory_per_block=49152, reserved_shared_memory_per_block=1024,
            max_shared_memory_per_multiprocessor=233472, cooperative_launch=True,
            concurrent_managed_access=True, unified_addressing=True)

        class Device:
            def __init__(self, ordinal=0):
                self.name, self.compute_capability, self.properties = "Fake H200", (9, 0), props
            def set_current(self): pass
            def create_stream(self):
                return types.SimpleNamespace(handle=real.CUstream(0), close=lambda: None)

        class LaunchConfig:
            def __init__(self, grid, block, shmem_size, is_cooperative):
                assert is_cooperative and block == abi.BLOCK_THREADS
                self.grid = grid

        def launch(stream, config, kernel, arg):
            assert isinstance(arg, int)  # the params pointer, passed as a pointer
            fake.kernel(arg)

        self.core = types.SimpleNamespace(
            Device=Device, LaunchConfig=LaunchConfig, launch=launch,
            ObjectCode=types.SimpleNamespace(from_cubin=lambda cubin: types.SimpleNamespace(
                get_kernel=lambda name: types.SimpleNamespace(handle=real.CUkernel(0)))))
        from megak.runtime.compiler import bodies_defines
        self.compiler = types.SimpleNamespace(
            compile_megakernel=lambda arch, defines=None: types.SimpleNamespace(
                cubin=b"", arch=arch, defines=defines),
            bodies_defines=bodies_defines)

    def handle(self, what: str) -> int:
        h = 0x1000 + 16 * (1 + max(self.graphs, default=0) // 16)
        self.graphs[h] = (what,)
        return h

    def arguments(self, argv: int) -> tuple[int, int, int]:
        """(params, tensors, ticket): the kernel's first three arguments, read now."""
        import ctypes
        args = (ctypes.c_void_p * 3).from_address(argv)
        return (ctypes.c_uint64.from_address(args[0]).value,
                ctypes.c_uint64.from_address(args[1]).value,
                ctypes.c_uint32.from_address(args[2]).value)

    def alloc(self, n):
        import ctypes
        buf = ctypes.create_string_buffer(n + 256)
        ptr = -(-ctypes.addressof(buf) // 256) * 256
        self.mem[ptr] = buf
        return ptr

    def move(self, dst, src, n):
        import ctypes
        ctypes.memmove(int(dst), int(src), n)

    def view(self, ptr, dtype, n):
        from megak.runtime.memory import host_array
        return host_array(ptr, dtype, (n,))

    def nop_kernel(self, params_ptr, tensors_ptr, ticket):
        """NOP queues on the CPU, then the end of the invocation as the device's last block
        does it (megak.runtime.invocation.finish)."""
        p = self.view(params_ptr, abi.PARAMS_DTYPE, 1)[0]
        n_sm = int(p["n_sm"])
        qs = self.view(int(p["queue_start"]), np.uint32, n_sm + 1)
        ins = self.view(int(p["instrs"]), abi.INSTR_DTYPE, int(qs[-1]))
        ctr = self.view(int(p["counters"]), np.uint32, max(int(p["n_counters"]), 1))
        st = self.view(int(p["status"]), abi.STATUS_DTYPE, 1)[0]
        rs = self.view(int(p["run_state"]), abi.RUN_STATE_DTYPE, 1)[0]
        for t in self.view(tensors_ptr, abi.TENSOR_DTYPE, int(p["n_tensors"])):
            assert t["ptr"] % 256 == 0 and t["ld"] * 4 % abi.TENSOR_ALIGN_BYTES == 0
            assert t["ld"] >= t["cols"]
        epoch = int(rs["epoch"])
        self.run_kernel_body(ins, qs, ctr, st, n_sm, int(p["n_active"]), epoch)
        self.finish(p, st, rs, ctr, n_sm, epoch, ticket)

    def run_kernel_body(self, ins, qs, ctr, st, n_sm, n_active, epoch):
        for r in ins:  # every signal first, then every wait: NOP queues, no ordering
            for k in range(int(r["n_signals"])):
                ctr[int(r["signal_counter"][k])] += 1
        for s in range(n_sm):
            for qi in range(int(qs[s]), int(qs[s + 1])):
                r = ins[qi]
                for k in range(int(r["n_waits"])):
                    c, t = int(r["wait_counter"][k]), int(r["wait_target"][k])
                    need = ((epoch + 1) * t) & 0xFFFFFFFF
                    if np.uint32(int(ctr[c]) - need & 0xFFFFFFFF).view(np.int32) < 0:
                        for key, v in (("abort", 1), ("error", abi.ERRORS["MK_ERR_TIMEOUT"]),
                                       ("sm", s), ("queue_index", qi - int(qs[s])),
                                       ("op_index", r["op_index"]), ("counter", c),
                                       ("expected", need), ("observed", ctr[c])):
                            st[key] = v
                        return
        st["finished_blocks"] = n_active

    def abort_kernel(self, params_ptr, tensors_ptr, ticket):
        """Every block of a running invocation sees the abort flag and stops."""
        p = self.view(params_ptr, abi.PARAMS_DTYPE, 1)[0]
        n_sm = int(p["n_sm"])
        st = self.view(int(p["status"]), abi.STATUS_DTYPE, 1)[0]
        rs = self.view(int(p["run_state"]), abi.RUN_STATE_DTYPE, 1)[0]
        ctr = self.view(int(p["counters"]), np.uint32, max(int(p["n_counters"]), 1))
        self.finish(p, st, rs, ctr, n_sm, int(rs["epoch"]), ticket)

    def finish(self, p, st, rs, ctr, n_sm, epoch, ticket):
        from megak.runtime import invocation
        hv = self.view(int(p["host_view"]), abi.HOST_VIEW_DTYPE, 1)[0]
        hsm = self.view(int(p["host_sm_state"]), abi.SM_STATE_DTYPE, n_sm)
        sm = self.view(int(p["sm_state"]), abi.SM_STATE_DTYPE, n_sm)
        n_active = int(p["n_active"])
        assert n_active == 1 + sum(1 for b in range(1, n_sm) if qs_nonempty(p, b))
        for _ in range(n_active):
            invocation.finish(status=st, sm_state=sm, run_state=rs, host_view=hv,
                              host_sm_state=hsm, counters=ctr, n_active=n_active, epoch=epoch,
                              max_target=int(p["max_target"]), ticket=ticket)


def qs_nonempty(p, b: int) -> bool:
    from megak.runtime.memory import host_array
    qs = host_array(int(p["queue_start"]), np.uint32, (int(p["n_sm"]) + 1,))
    return int(qs[b + 1]) != int(qs[b])


@pytest.fixture
def fake_gpu(monkeypatch):
    import gc
    import sys

    from cuda.bindings import driver as real

    from megak.runtime import driver, executor, graph_launch, memory
    gc.collect()  # real executors left by earlier tests are finalized with the real driver
    fake = _FakeGpu(real)
    monkeypatch.setattr(driver, "_detect", lambda: (True, "fake"))
    for module in (driver, memory, executor, graph_launch):
        monkeypatch.setattr(module, "_bindings", lambda: fake.drv)
    monkeypatch.setitem(sys.modules, "cuda.core", fake.core)
    monkeypatch.setitem(sys.modules, "megak.runtime.compiler", fake.compiler)
    yield fake
    assert not fake.mem, f"{len(fake.mem)} fake allocations never freed"
    assert not fake.graphs, f"graphs never destroyed: {fake.graphs}"


@pytest.mark.parametrize("managed", [False, True], ids=["device", "managed"])
def test_fake_round_trip_padding_and_epochs(fake_gpu, rng, managed):
    from megak.runtime.executor import CudaExecutor
    plan = nop_plan([[([(0, 1)], [])], [([], [0])]], n_counters=1, tensor_shape=(5, 7))
    with CudaExecutor(plan, managed=managed, debug=True) as ex:
        assert ex._tensors[0].ld == 8
        for run in range(3):
            x = rng.standard_normal((5, 7)).astype(np.float32)
            out = ex.run({0: x}, [0])
            np.testing.assert_array_equal(out[0], x)
            assert ex.epoch == run + 1
        with pytest.raises(GraphError, match="takes a"):
            ex.run({0: x.astype(np.float64)}, [0])
        assert ex.last_trace_events is None
        np.testing.assert_array_equal(ex.run({0: x}, [0], trace=True)[0], x)
        ev = ex.last_trace_events
        assert ev.dtype == abi.TRACE_DTYPE and len(ev) == len(plan.instrs)
        # (trace, wgmma_only, the plan's bodies)
        assert set(ex._variants) == {(False, 0, ex.bodies, False), (True, 0, ex.bodies, False)}
        ex.run({0: x}, [0])
        assert ex.last_trace_events is None


def test_fake_hang_is_decoded_and_counters_restart(fake_gpu):
    from megak.runtime.executor import CudaExecutor
    plan = handoff_plan()
    with CudaExecutor(plan) as ex:
        ex.run({}, [])
        ex.run({}, [])
        plan.instrs["wait_target"][0, 0] = 2
        ex.reload_queues()
        with pytest.raises(MegakernelHang, match="MK_ERR_TIMEOUT on SM 0.*nop #0.*counter 0"):
            ex.run({}, [])
        assert ex.epoch == 0
        plan.instrs["wait_target"][0, 0] = 1
        ex.reload_queues()
        for run in range(2):
            ex.run({}, [])
            assert ex.epoch == run + 1


def test_fake_refusals_allocate_nothing(fake_gpu):
    from megak.runtime.executor import CudaExecutor
    with pytest.raises(MegakernelError, match="opt-in"):
        CudaExecutor(handoff_plan(), smem_bytes=pages.HOPPER_OPTIN_SMEM + 1)
    with pytest.raises(MegakernelError, match="132 SMs"):
        CudaExecutor(nop_plan([[]] * 133, n_counters=0))
    fake_gpu.free_bytes = 1 << 30
    with pytest.raises(MegakernelError, match="managed memory, the device has"):
        CudaExecutor(nop_plan([[]], 0, tensor_shape=(1 << 14, 1 << 14)), managed=True)
    assert not fake_gpu.mem


def test_fake_watchdog_aborts_a_kernel_that_ignores_its_deadlines(fake_gpu, monkeypatch):
    from megak.runtime.executor import CudaExecutor
    from megak.runtime import executor
    monkeypatch.setattr(executor, "_ABORT_GRACE_S", 0.1)
    ex = CudaExecutor(handoff_plan(), timeout_s=0.05, host_timeout_s=0.2)
    status = fake_gpu.view(ex._dev_buf["status"].ptr, abi.STATUS_DTYPE, 1)
    R = fake_gpu.real.CUresult
    running = []
    fake_gpu.kernel = lambda *args: running.append(args)  # "runs" until aborted

    def query():
        if not status[0]["abort"]:
            return (R.CUDA_ERROR_NOT_READY,)
        while running:      # the blocks see the flag and stop: the last one reports
            fake_gpu.abort_kernel(*running.pop())
        return (R.CUDA_SUCCESS,)
    fake_gpu.query = query
    with pytest.raises(MegakernelHang, match="host watchdog") as caught:
        ex.run({}, [])
    assert caught.value.record["error"] == abi.ERRORS["MK_ERR_ABORTED"]
    fake_gpu.kernel, fake_gpu.query = fake_gpu.nop_kernel, lambda: fake_gpu.ok
    ex.run({}, [])  # usable again
    # a device that ignores the abort flag too: the executor refuses further work and leaks
    # its buffers on purpose (freeing under a running kernel would block forever)
    fake_gpu.kernel = lambda *args: None
    fake_gpu.query = lambda: (R.CUDA_ERROR_NOT_READY,)
    with pytest.raises(MegakernelHang, match="stuck"):
        ex.run({}, [])
    with pytest.raises(MegakernelError, match="unusable"):
        ex.run({}, [])
    ex.close()
    assert fake_gpu.mem
    fake_gpu.mem.clear()


def test_fake_bound_run_replays_a_cooperative_graph_with_each_launchs_ticket(fake_gpu):
    """executor.run_bound (Program.run's bound case) replays a one-node graph whose node
    takes each launch's arguments (graph_launch.py); launch_bound, run and numpy runs launch
    directly; the graphs go with the executor."""
    from megak.interop import DeviceArray
    from megak.runtime.executor import CudaExecutor
    tickets = []
    run_nops = fake_gpu.kernel

    def kernel(params, tensors, ticket):
        tickets.append((tensors, ticket))
        run_nops(params, tensors, ticket)
    fake_gpu.kernel = kernel
    ptrs = [fake_gpu.alloc(4 * 4 * 4), fake_gpu.alloc(4 * 4 * 4)]
    try:
        with CudaExecutor(handoff_plan()) as ex:
            bindings = []
            for p in ptrs:
                ex.run({}, [], external={0: DeviceArray(None, "cuda", p, (4, 4), (4, 1),
                                                        "float32", 0)})
                assert ex.last_launch == "direct"
                bindings.append(ex.last_binding)
            fake_gpu.calls.clear()
            for k in range(4):
                b = bindings[k % 2]
                ex.run_bound(b, None)
                assert ex.last_launch == "graph"
                assert tickets[-1] == (b.table_ptr, ex._ticket) and b.last_ticket == ex._ticket
                assert ex._host.done(ex._ticket)
            assert fake_gpu.calls == ["cuGraphExecKernelNodeSetParams", "cuGraphLaunch"] * 4
            assert [t for _, t in tickets[-4:]] == [tickets[-4][1] + i for i in range(4)]
            assert sum(1 for g in fake_gpu.graphs.values() if g[0] == "exec") == 1
            ex.wait(ex.launch_bound(bindings[0], None))   # may be captured: launched directly
            assert ex.last_launch == "direct" and fake_gpu.calls[-1] == \
                "cuLaunchCooperativeKernel"
            ex.graph_launch = False
            ex.run_bound(bindings[1], None)
            assert ex.last_launch == "direct" and tickets[-1] == (bindings[1].table_ptr,
                                                                   ex._ticket)
        assert not fake_gpu.graphs
    finally:
        for p in ptrs:
            del fake_gpu.mem[p]


def test_fake_bound_run_launches_directly_where_no_graph_can_be_built(fake_gpu):
    from megak.interop import DeviceArray
    from megak.runtime.executor import CudaExecutor
    fake_gpu.refuse_graphs = True
    ptr = fake_gpu.alloc(4 * 4 * 4)
    try:
        with CudaExecutor(handoff_plan()) as ex:
            ex.run({}, [], external={0: DeviceArray(None, "cuda", ptr, (4, 4), (4, 1),
                                                    "float32", 0)})
            for _ in range(2):
                ex.run_bound(ex.last_binding, None)
                assert ex.last_launch == "direct" and ex._host.done(ex._ticket)
            assert "CUDA_ERROR_NOT_SUPPORTED" in ex._graph_launch.error
            assert fake_gpu.calls.count("cuLaunchCooperativeKernel") == 3
        assert not fake_gpu.graphs   # the refused graph was destroyed with its failure
    finally:
        del fake_gpu.mem[ptr]


def test_fake_sticky_error_is_raised_with_its_name(fake_gpu):
    from megak.runtime.executor import CudaExecutor
    R = fake_gpu.real.CUresult
    ex = CudaExecutor(handoff_plan())
    fake_gpu.kernel = lambda *args: None   # the kernel faults: its last block never reports
    fake_gpu.query = lambda: (R.CUDA_ERROR_ILLEGAL_ADDRESS,)
    with pytest.raises(MegakernelError, match="CUDA_ERROR_ILLEGAL_ADDRESS.*restart"):
        ex.run({}, [])
    with pytest.raises(MegakernelError, match="unusable"):
        ex.run({}, [])
    fake_gpu.query = lambda: fake_gpu.ok
    ex.close()
