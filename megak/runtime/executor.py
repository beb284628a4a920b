"""CudaExecutor: runs a Plan as one cooperative megakernel launch on the GPU.

Set up once (``__init__``)::

    device 0 current -> compile (cubin for the device's exact arch, cached) -> load
    -> checks that need the loaded kernel (static smem, opt-in, pages, occupancy, SM count)
    -> buffers: one per tensor slot (rows x ld, ld padded to MK_TENSOR_ALIGN_BYTES),
       tensor table, queues, counters, status, sm_state, params
    -> tensor table + queues uploaded once through pinned staging on the executor's stream

Each ``run``, all on one stream, one wait at the end::

    1. inputs  -> pinned staging (padded rows) -> device        (+ prefetch when managed)
    2. debug: poison every non-input tensor with NaN
    3. zero status + sm_state; write params (epoch, deadline, debug)
    4. cooperative launch: grid = plan.n_sm, block = MK_BLOCK_THREADS, dynamic smem = pages
    5. status, sm_state, outputs -> pinned staging (or prefetch managed outputs to the host)
    6. wait, bounded by a host watchdog; decode the status; raise or advance the epoch
    7. outputs -> fresh numpy arrays

Counters are never reset between good runs: waits are offset by the epoch (see instr.h). After
a failed run they hold partial counts, so they are zeroed (stream-ordered, before the next
launch) and the epoch restarts at 0.
"""
from __future__ import annotations

import math
import threading
import time
import warnings
import weakref

import numpy as np

from .. import abi, dtypes, pages
from ..errors import (GraphError, MegakernelError, MegakernelHang, raise_for_status,
                      sm_states_to_dicts, status_to_dict)
from ..plan import Plan, TensorSlot
from . import memory as mem
from .driver import CudaError, _bindings, check, device_info, require_gpu


# Errors after which the CUDA context is dead for the rest of the process.
_STICKY = {
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_DEINITIALIZED",
}

_SPIN_S = 0.010        # poll the stream flat out this long: short runs return at once
_MAX_NAP_S = 0.001     # then back off to at most this between polls
_ABORT_GRACE_S = 5.0   # after the watchdog raises the abort flag, this long to stop


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def next_epoch(epoch: int, max_target: int) -> tuple[int, bool]:
    """The epoch after a good run, and whether counters must be zeroed first.

    Run `e` waits for ``(e + 1) * target`` on counters that end at that value; zero the
    counters (and restart at 0) before the next run's ``(e + 2) * target`` could reach 2**31,
    so no product or signed difference the device forms can wrap.
    """
    nxt = epoch + 1
    if (nxt + 1) * max(int(max_target), 1) > 2 ** 31:
        return 0, True
    return nxt, False


def counter_max_target(plan: Plan) -> int:
    """Signals per run of the busiest counter (from plan.counter_targets, or counted)."""
    if plan.counter_targets is not None and len(plan.counter_targets):
        return int(np.max(plan.counter_targets))
    ins = plan.instrs
    if plan.n_counters == 0 or len(ins) == 0:
        return 0
    mask = np.arange(abi.MAX_SIGNALS)[None, :] < ins["n_signals"][:, None]
    sig = ins["signal_counter"][mask].astype(np.int64)
    return int(np.bincount(sig).max()) if len(sig) else 0


def validate_plan(plan: Plan) -> None:
    """The structural facts the executor relies on; a broken Plan is a host bug, said clearly."""
    if plan.instrs.dtype != abi.INSTR_DTYPE:
        raise GraphError("plan.instrs must be an array of abi.INSTR_DTYPE")
    if plan.n_sm < 1:
        raise GraphError(f"plan.n_sm must be >= 1, got {plan.n_sm}")
    qs = np.asarray(plan.queue_start)
    if qs.shape != (plan.n_sm + 1,):
        raise GraphError(f"plan.queue_start has shape {qs.shape}; expected ({plan.n_sm + 1},)")
    if int(qs[0]) != 0 or int(qs[-1]) != len(plan.instrs) \
            or (np.diff(qs.astype(np.int64)) < 0).any():
        raise GraphError(f"plan.queue_start must rise from 0 to len(instrs) = {len(plan.instrs)}")
    slots = [t.slot for t in plan.tensors]
    if len(set(slots)) != len(slots) or any(s < 0 for s in slots):
        raise GraphError(f"plan.tensors: slot numbers must be distinct and >= 0, got {slots}")
    for t in plan.tensors:
        if t.dtype not in dtypes.SUPPORTED:
            raise GraphError(f"tensor {t.name!r}: dtype {t.dtype!r} is not supported by the "
                             f"CUDA backend; allowed: {', '.join(dtypes.SUPPORTED)}")
        if t.rows < 0 or t.cols < 0 or t.rows >= 2 ** 31 or t.cols >= 2 ** 31:
            raise GraphError(f"tensor {t.name!r}: shape {t.shape} out of range")
    if plan.n_counters < 0:
        raise GraphError(f"plan.n_counters must be >= 0, got {plan.n_counters}")


def _launch_config(grid: int, block: int, smem: int):
    """A cooperative LaunchConfig. cuda.core 1.2 spells the flag ``is_cooperative``; the
    fallback keeps a renamed field from turning into a silent non-cooperative launch."""
    from cuda.core import LaunchConfig
    try:
        return LaunchConfig(grid=grid, block=block, shmem_size=smem, is_cooperative=True)
    except TypeError:
        return LaunchConfig(grid=grid, block=block, shmem_size=smem, cooperative_launch=True)


class _TensorBuffer:
    __slots__ = ("slot", "buf", "ld", "np_dtype", "poison")

    def __init__(self, slot: TensorSlot, buf: mem.DeviceBuffer, ld: int):
        self.slot = slot
        self.buf = buf
        self.ld = ld
        self.np_dtype = dtypes.numpy_dtype(slot.dtype)
        self.poison = dtypes.POISON_WORD[slot.dtype]

    @property
    def padded_shape(self) -> tuple[int, int]:
        return (self.slot.rows, self.ld)


def _shutdown(state: dict, memory: mem.Memory | None, streams: list) -> None:
    """Finalizer: free device memory, then the streams. Holds no reference to the executor."""
    if state.get("broken"):
        # A kernel may still be running (the watchdog could not stop it): freeing its memory
        # would block or corrupt. Leak deliberately; the process must restart anyway.
        return
    failures = memory.close() if memory is not None else []
    for s in streams:
        try:
            s.close()
        except Exception:  # at interpreter exit cuda.core may already be gone
            pass
    if failures and not state.get("dead"):
        warnings.warn("megak: some GPU buffers could not be freed: " + "; ".join(failures),
                      RuntimeWarning, stacklevel=2)


class CudaExecutor:
    """Runs `plan` on one GPU (``device``, default 0) as one cooperative megakernel.

    ``managed``: tensors in managed memory (prefetched each way) instead of device memory.
    ``timeout_s``: deadline of every spin-wait on the device; a wait past it is a hang.
    ``debug``: poison non-input tensors with NaN before each run; page-leak checks on device.
    ``smem_bytes``: dynamic shared memory to request (default: what plan.n_pages needs).
    ``host_timeout_s``: host watchdog on a whole run (default max(60, 10 * timeout_s));
    ``math.inf`` disables it.
    """

    def __init__(self, plan: Plan, *, managed: bool = False, timeout_s: float = 5.0,
                 debug: bool = False, smem_bytes: int | None = None,
                 host_timeout_s: float | None = None, device: int = 0):
        self.plan = plan
        self.managed = bool(managed)
        self.debug = bool(debug)
        self.timeout_s = timeout_s        # validated by the property
        self.host_timeout_s = host_timeout_s
        self.epoch = 0
        self.last_status: dict | None = None
        self.last_trace_events: np.ndarray | None = None
        self._trace_bufs: tuple | None = None
        self._state: dict = {"broken": None, "dead": None}
        self._memory: mem.Memory | None = None
        self._streams: list = []
        self._lock = threading.Lock()
        self._zero_counters = True
        self._tensors: dict[int, _TensorBuffer] = {}
        self._staging: dict[int, mem.PinnedBuffer] = {}
        self._finalizer = None

        validate_plan(plan)
        require_gpu()
        from cuda.core import Device
        drv = _bindings()
        self._dev = Device(device)
        self._dev.set_current()
        self.ordinal = device
        self.info = info = device_info(device)
        self._cu_dev = check(drv.cuDeviceGet(device), "cuDeviceGet")

        # -- checks that need only the device: fail before compiling ---------------------------
        if plan.n_sm > info["sm_count"]:
            raise MegakernelError(f"the plan has {plan.n_sm} SM queues but {info['name']} has "
                                  f"{info['sm_count']} SMs: recompile the graph for this device")
        if not info["cooperative_launch"]:
            raise MegakernelError(f"{info['name']} does not support cooperative launch, which "
                                  f"the megakernel needs (its blocks wait on each other)")
        need = pages.smem_bytes(plan.n_pages)
        self.smem_bytes = need if smem_bytes is None else int(smem_bytes)
        if smem_bytes is not None and self.smem_bytes < need:
            raise MegakernelError(f"smem_bytes={self.smem_bytes} is less than the "
                                  f"{need} B that {plan.n_pages} pages need")
        if self.smem_bytes > info["smem_optin"]:
            why = (f"{plan.n_pages} pages need" if smem_bytes is None else "requested")
            raise MegakernelError(
                f"{why} {self.smem_bytes:,} B of dynamic shared memory per block; "
                f"{info['name']} allows at most {info['smem_optin']:,} B per block (opt-in), "
                f"i.e. {pages.pages_for(info['smem_optin'])} pages of {pages.PAGE_BYTES} B")

        # -- compile and load (the traced variant only when a traced run asks for it) -----------
        self._variants: dict[bool, tuple] = {}   # trace -> (compiled, object code, kernel, info)
        self.compiled, _, _, self.kernel_info = self._variant(trace=False)
        self._grid = plan.n_sm
        self._config = _launch_config(plan.n_sm, abi.BLOCK_THREADS, self.smem_bytes)

        # -- buffers ------------------------------------------------------------------------------
        try:
            self._streams = [self._dev.create_stream(), self._dev.create_stream()]
            self._stream, self._ctl_stream = self._streams
            self._h = self._stream.handle        # CUstream for cuda.bindings calls
            self._ctl_h = self._ctl_stream.handle
            self._memory = mem.Memory(device)
            self._allocate()
            self._finalizer = weakref.finalize(self, _shutdown, self._state, self._memory,
                                               self._streams)
            self._upload_tables()
        except BaseException:
            self._shutdown_now()
            raise

    # -- settings ---------------------------------------------------------------------------------
    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        value = float(value)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {value}")
        self._timeout_s = value

    @property
    def host_timeout_s(self) -> float:
        if self._host_timeout_s is None:
            return max(60.0, 10.0 * self._timeout_s)
        return self._host_timeout_s

    @host_timeout_s.setter
    def host_timeout_s(self, value: float | None) -> None:
        if value is not None:
            value = float(value)
            if not value > 0:
                raise ValueError(f"host_timeout_s must be > 0 (math.inf: no watchdog), "
                                 f"got {value}")
        self._host_timeout_s = value

    # -- set-up ------------------------------------------------------------------------------------
    def _variant(self, trace: bool) -> tuple:
        """(compiled, object code, kernel, kernel info) of the plain or the MK_TRACE=1 build:
        compiled (cached on disk), loaded and configured once per executor."""
        if trace not in self._variants:
            from cuda.core import ObjectCode

            from .compiler import compile_megakernel
            compiled = compile_megakernel(arch=self.info["arch"],
                                          defines={"MK_TRACE": 1} if trace else None)
            code = ObjectCode.from_cubin(compiled.cubin)
            kernel = code.get_kernel("megakernel")
            kinfo = self._configure_kernel(kernel)
            self._variants[trace] = (compiled, code, kernel, kinfo)
        return self._variants[trace]

    def _configure_kernel(self, kernel) -> dict:
        """Opt in to the dynamic smem, then check what only the loaded kernel can tell."""
        drv = _bindings()
        info = self.info
        attr = drv.CUfunction_attribute
        max_dyn = attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        handle = kernel.handle
        if not isinstance(handle, drv.CUfunction):
            # cuda.core loads cubins through the library API: the handle is a CUkernel (wrap
            # a bare address the same way, should a version hand one out)
            if not isinstance(handle, drv.CUkernel):
                handle = drv.CUkernel(int(handle))

            def get(a, what):
                return int(check(drv.cuKernelGetAttribute(a, handle, self._cu_dev),
                                 f"cuKernelGetAttribute({what})"))

            def set_max_dynamic(n):
                check(drv.cuKernelSetAttribute(max_dyn, n, handle, self._cu_dev),
                      "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
            func = check(drv.cuKernelGetFunction(handle), "cuKernelGetFunction")
        else:                                   # a CUfunction (module API)
            func = handle

            def get(a, what):
                return int(check(drv.cuFuncGetAttribute(a, func), f"cuFuncGetAttribute({what})"))

            def set_max_dynamic(n):
                check(drv.cuFuncSetAttribute(func, max_dyn, n),
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")

        static = get(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "SHARED_SIZE_BYTES")
        regs = get(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, "NUM_REGS")
        local = get(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "LOCAL_SIZE_BYTES")
        max_threads = get(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "MAX_THREADS_PER_BLOCK")
        optin = info["smem_optin"]
        max_dynamic = optin - static
        if self.smem_bytes > max_dynamic:
            raise MegakernelError(
                f"requested {self.smem_bytes:,} B of dynamic shared memory per block; with the "
                f"kernel's {static:,} B of static shared memory {info['name']} leaves "
                f"{max_dynamic:,} B (opt-in {optin:,} B)")
        max_pages = pages.pages_for(optin, static)
        if self.plan.n_pages > max_pages:
            raise MegakernelError(
                f"the plan uses {self.plan.n_pages} shared-memory pages per SM; {info['name']} "
                f"fits {max_pages} (opt-in {optin:,} B, kernel static {static:,} B): compile "
                f"the graph with n_pages <= {max_pages}")
        if max_threads < abi.BLOCK_THREADS:
            raise MegakernelError(f"the megakernel can run at most {max_threads} threads per "
                                  f"block (registers: {regs}); it needs {abi.BLOCK_THREADS}")
        set_max_dynamic(self.smem_bytes)
        blocks = int(check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            func, abi.BLOCK_THREADS, self.smem_bytes), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))
        if blocks < 1:
            raise MegakernelError(
                f"one block of {abi.BLOCK_THREADS} threads with {self.smem_bytes:,} B of dynamic "
                f"shared memory does not fit on an SM of {info['name']} (registers/thread "
                f"{regs}, static smem {static:,} B): the cooperative launch would fail")
        return {"static_smem": static, "registers": regs, "local_bytes": local,
                "dynamic_smem": self.smem_bytes, "max_dynamic_smem": max_dynamic,
                "max_pages": max_pages, "blocks_per_sm": blocks}

    def _allocate(self) -> None:
        plan = self.plan
        m = self._memory
        layout = []
        for t in plan.tensors:
            if t.kind == "unused":   # no instruction touches it: its table entry stays zero
                continue
            itemsize = dtypes.ITEMSIZE[t.dtype]
            ld = round_up(max(t.cols, 1), abi.TENSOR_ALIGN_BYTES // itemsize)
            layout.append((t, ld, round_up(t.rows * ld * itemsize, mem.DEVICE_ALIGN)))
        tensor_bytes = sum(n for _, _, n in layout)
        n_tensors = (max(t.slot for t in plan.tensors) + 1) if plan.tensors else 0
        self._n_tensors = n_tensors
        control = [
            ("instrs", max(len(plan.instrs), 1) * abi.INSTR_BYTES),
            ("queue_start", (plan.n_sm + 1) * 4),
            ("tensors", max(n_tensors, 1) * abi.TENSOR_DTYPE.itemsize),
            ("counters", max(plan.n_counters, 1) * 4),
            ("status", abi.STATUS_DTYPE.itemsize),
            ("sm_state", plan.n_sm * abi.SM_STATE_DTYPE.itemsize),
            ("params", abi.PARAMS_DTYPE.itemsize),
        ]
        control_bytes = sum(round_up(n, mem.DEVICE_ALIGN) for _, n in control)
        # one up-front check of the whole request: a clear error before anything is allocated
        m.check_fits(tensor_bytes + control_bytes, managed=self.managed,
                     what=f"{len(plan.tensors)} tensors + control data")
        for t, ld, nbytes in layout:
            alloc = m.managed if self.managed else m.device
            self._tensors[t.slot] = _TensorBuffer(t, alloc(nbytes, f"tensor {t.name}"), ld)
        self._dev_buf = {name: m.device(n, name) for name, n in control}
        self._queue_capacity = max(len(plan.instrs), 1)
        self._counter_capacity = max(plan.n_counters, 1)
        # pinned host mirrors of the control records
        self._status_host_buf = m.pinned(abi.STATUS_DTYPE.itemsize, "status (host)")
        self._sm_state_host_buf = m.pinned(plan.n_sm * abi.SM_STATE_DTYPE.itemsize,
                                           "sm_state (host)")
        self._params_host_buf = m.pinned(abi.PARAMS_DTYPE.itemsize, "params (host)")
        self._abort_word = m.pinned(4, "abort flag (host)")
        self._status_host = self._status_host_buf.array(abi.STATUS_DTYPE, (1,))
        self._sm_state_host = self._sm_state_host_buf.array(abi.SM_STATE_DTYPE, (plan.n_sm,))
        self._params_host = self._params_host_buf.array(abi.PARAMS_DTYPE, (1,))
        self._abort_word.array(np.uint32, (1,))[0] = 1
        self._queue_host_buf: mem.PinnedBuffer | None = None

    def _upload_tables(self) -> None:
        """Tensor table and queues, once; then wait, so the staging can be reused or freed."""
        table = np.zeros(max(self._n_tensors, 1), dtype=abi.TENSOR_DTYPE)
        for slot, tb in self._tensors.items():
            table[slot]["ptr"] = tb.buf.ptr
            table[slot]["rows"] = tb.slot.rows
            table[slot]["cols"] = tb.slot.cols
            table[slot]["ld"] = tb.ld
            table[slot]["dtype"] = dtypes.ABI_CODE[tb.slot.dtype]
        self._table_default = table
        self._table_host_buf = self._memory.pinned(table.nbytes, "tensor table (host)")
        self._table_host = self._table_host_buf.array(abi.TENSOR_DTYPE, table.shape)
        self._table_host[:] = table
        self._table_is_default = True
        mem.htod(self._dev_buf["tensors"].ptr, self._table_host_buf.ptr, table.nbytes, self._h)
        self._write_queues()
        self._wait("uploading the tensor table and queues")
        self._write_params()

    def _write_queues(self) -> None:
        """plan.instrs + plan.queue_start -> pinned staging -> device (stream-ordered)."""
        plan = self.plan
        m = self._memory
        data = plan.encoded()
        qs = np.ascontiguousarray(plan.queue_start, dtype=np.uint32)
        n = len(plan.instrs)
        if n > self._queue_capacity:  # the queues grew (reload after a plan edit)
            m.free(self._dev_buf["instrs"])
            self._dev_buf["instrs"] = m.device(n * abi.INSTR_BYTES, "instrs")
            self._queue_capacity = n
        if plan.n_counters > self._counter_capacity:
            m.free(self._dev_buf["counters"])
            self._dev_buf["counters"] = m.device(plan.n_counters * 4, "counters")
            self._counter_capacity = plan.n_counters
        need = len(data) + qs.nbytes
        if self._queue_host_buf is None or self._queue_host_buf.nbytes < need:
            if self._queue_host_buf is not None:
                m.free(self._queue_host_buf)
                self._queue_host_buf = None
            self._queue_host_buf = m.pinned(need, "queues (host)")
        host = self._queue_host_buf.array(np.uint8, (need,))
        host[:len(data)] = np.frombuffer(data, dtype=np.uint8)
        host[len(data):] = qs.view(np.uint8)
        mem.htod(self._dev_buf["instrs"].ptr, self._queue_host_buf.ptr, len(data), self._h)
        mem.htod(self._dev_buf["queue_start"].ptr, self._queue_host_buf.ptr + len(data),
                 qs.nbytes, self._h)
        self._max_target = counter_max_target(plan)
        self._zero_counters = True
        self.epoch = 0

    def _write_params(self) -> None:
        p = self._params_host[0]
        b = self._dev_buf
        p["instrs"] = b["instrs"].ptr
        p["queue_start"] = b["queue_start"].ptr
        p["tensors"] = b["tensors"].ptr
        p["counters"] = b["counters"].ptr
        p["status"] = b["status"].ptr
        p["sm_state"] = b["sm_state"].ptr
        p["timeout_ns"] = int(self._timeout_s * 1e9)
        p["epoch"] = self.epoch
        p["n_sm"] = self.plan.n_sm
        p["n_tensors"] = self._n_tensors
        p["n_counters"] = self.plan.n_counters
        p["n_pages"] = self.plan.n_pages
        p["debug"] = 1 if self.debug else 0
        p["trace"] = 0   # set per traced run

    # -- public -----------------------------------------------------------------------------------
    def reload_queues(self) -> None:
        """Upload ``plan.instrs`` / ``queue_start`` again (after editing them in place).

        The grid is fixed at construction: ``plan.n_sm`` must not change. Counters restart
        from zero and the epoch from 0.
        """
        with self._lock:
            self._check_usable()
            self._dev.set_current()
            validate_plan(self.plan)
            if self.plan.n_sm != self._grid:
                raise MegakernelError(f"reload_queues(): plan.n_sm changed from {self._grid} "
                                      f"to {self.plan.n_sm}; build a new executor")
            self._write_queues()
            self._wait("uploading the queues")

    def run(self, inputs: dict[int, np.ndarray], outputs: list[int],
            trace: bool = False, external: dict | None = None) -> dict[int, np.ndarray]:
        """Run the plan once: ``inputs`` slot -> array of that slot's shape and dtype;
        returns slot -> a fresh array for every slot in ``outputs``.

        ``external``: slot -> megak.interop.DeviceArray (validated by the caller): GPU memory
        of the caller used in place of megak's buffer for that slot, zero-copy. An external
        input is read where it lies; an external output is written there and is not in the
        returned dict.

        ``trace``: run the MK_TRACE=1 build (compiled on first use) and keep one
        abi.TRACE_DTYPE record per queued instruction, in queue order, in
        ``last_trace_events`` (%globaltimer ns). Untraced runs leave it None.
        """
        with self._lock:
            self._check_usable()
            self._check_io(inputs, outputs)
            self._dev.set_current()
            self.last_trace_events = None
            kernel = self._variant(trace=bool(trace))[2]
            external = external or {}
            outputs = [s for s in outputs if s not in external]
            try:
                self._point_table_at(external)
                self._enqueue(inputs, outputs, kernel, bool(trace))
            except BaseException:
                self._drain_quietly()
                raise
            self._wait("running the megakernel")
            return self._finish(outputs, bool(trace))

    def close(self) -> None:
        """Free every buffer and stream now (idempotent)."""
        with self._lock:
            self._shutdown_now()

    def __enter__(self) -> "CudaExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._finalizer is None or not self._finalizer.alive

    # -- one run ----------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._state["broken"]:
            raise MegakernelError(f"this executor is unusable: {self._state['broken']}")
        if self._state["dead"]:
            raise MegakernelError(f"the CUDA context is unusable after an earlier error: "
                                  f"{self._state['dead']}; restart the process")
        if self.closed:
            raise MegakernelError("this CudaExecutor is closed")

    def _check_io(self, inputs, outputs) -> None:
        # Program.run validates against the graph; this keeps a direct caller from writing
        # out of bounds into pinned or device memory.
        for slot, arr in inputs.items():
            tb = self._tensors.get(slot)
            if tb is None:
                raise GraphError(f"run(): no tensor slot {slot}")
            if not isinstance(arr, np.ndarray) or arr.dtype != tb.np_dtype \
                    or arr.shape != tb.slot.shape:
                got = (f"{arr.shape} {arr.dtype}" if isinstance(arr, np.ndarray)
                       else type(arr).__name__)
                raise GraphError(f"run(): slot {slot} ({tb.slot.name!r}) takes a "
                                 f"{tb.slot.shape} {tb.slot.dtype} array, got {got}")
        for slot in outputs:
            if slot not in self._tensors:
                raise GraphError(f"run(): no tensor slot {slot} to read back")

    def _stage(self, slot: int) -> mem.PinnedBuffer:
        st = self._staging.get(slot)
        if st is None:
            tb = self._tensors[slot]
            st = self._memory.pinned(tb.buf.nbytes, f"staging {tb.slot.name}")
            self._staging[slot] = st
        return st

    def _point_table_at(self, external: dict) -> None:
        """Tensor table for this run: caller-owned GPU memory where given, megak's elsewhere.
        Uploaded (stream-ordered, before the launch) only when it changes."""
        if not external and self._table_is_default:
            return
        self._wait("reusing the tensor table staging")   # the previous upload has landed
        table = self._table_host
        table[:] = self._table_default
        for slot, arr in external.items():
            table[slot]["ptr"] = arr.ptr
            table[slot]["ld"] = arr.row_stride()
        mem.htod(self._dev_buf["tensors"].ptr, self._table_host_buf.ptr, table.nbytes, self._h)
        self._table_is_default = not external

    def _trace_buffers(self) -> tuple[mem.DeviceBuffer, mem.PinnedBuffer]:
        """Device and pinned buffers for one event per queued instruction (grown on demand)."""
        n = max(len(self.plan.instrs), 1)
        have = self._trace_bufs
        if have is None or have[0].nbytes < n * abi.TRACE_DTYPE.itemsize:
            if have is not None:
                self._memory.free(have[0])
                self._memory.free(have[1])
                self._trace_bufs = None
            nbytes = n * abi.TRACE_DTYPE.itemsize
            self._trace_bufs = (self._memory.device(nbytes, "trace"),
                                self._memory.pinned(nbytes, "trace (host)"))
        return self._trace_bufs

    def _enqueue(self, inputs, outputs, kernel, trace: bool) -> None:
        h = self._h
        b = self._dev_buf
        # 1. inputs through pinned staging, rows padded to ld (one linear copy per tensor)
        for slot, arr in inputs.items():
            tb = self._tensors[slot]
            st = self._stage(slot)
            st.array(tb.np_dtype, tb.padded_shape)[:, :tb.slot.cols] = arr
            mem.htod(tb.buf.ptr, st.ptr, tb.slot.rows * tb.ld * tb.np_dtype.itemsize, h)
        # 2. poison what the kernel is supposed to write, so unwritten reads show as NaN
        if self.debug:
            for slot, tb in self._tensors.items():
                if tb.slot.kind != "input":
                    mem.memset32(tb.buf.ptr, tb.poison, tb.buf.nbytes // 4, h)
        if self.managed:
            for tb in self._tensors.values():
                self._memory.prefetch(tb.buf, "device", h)
        # 3. fresh status record; counters from zero after an error or an epoch wrap
        mem.memset32(b["status"].ptr, 0, abi.STATUS_DTYPE.itemsize // 4, h)
        mem.memset32(b["sm_state"].ptr, 0, b["sm_state"].nbytes // 4, h)
        if self._zero_counters:
            mem.memset32(b["counters"].ptr, 0, self._counter_capacity, h)
            self._zero_counters = False
            self.epoch = 0
        self._write_params()
        if trace:   # events of instructions that never ran stay zero
            tdev, _ = self._trace_buffers()
            mem.memset32(tdev.ptr, 0, tdev.nbytes // 4, h)
            self._params_host[0]["trace"] = tdev.ptr
        mem.htod(b["params"].ptr, self._params_host_buf.ptr, abi.PARAMS_DTYPE.itemsize, h)
        # 4. one cooperative launch: co-residency of all blocks is guaranteed or it fails
        from cuda.core import launch
        try:
            launch(self._stream, self._config, kernel, b["params"].ptr)
        except Exception as exc:
            self._zero_counters = True
            raise MegakernelError(f"cuda: cooperative launch of the megakernel failed "
                                  f"(grid {self.plan.n_sm}, block {abi.BLOCK_THREADS}, dynamic smem "
                                  f"{self.smem_bytes:,} B): {exc}") from exc
        # 5. read back; outputs are only used when the status says the run was good
        mem.dtoh(self._status_host_buf.ptr, b["status"].ptr, abi.STATUS_DTYPE.itemsize, h)
        mem.dtoh(self._sm_state_host_buf.ptr, b["sm_state"].ptr, b["sm_state"].nbytes, h)
        if trace:
            tdev, thost = self._trace_bufs
            mem.dtoh(thost.ptr, tdev.ptr, tdev.nbytes, h)
        for slot in outputs:
            tb = self._tensors[slot]
            if self.managed:
                self._memory.prefetch(tb.buf, "host", h)
            else:
                mem.dtoh(self._stage(slot).ptr, tb.buf.ptr,
                         tb.slot.rows * tb.ld * tb.np_dtype.itemsize, h)

    def _finish(self, outputs, trace: bool) -> dict[int, np.ndarray]:
        plan = self.plan
        status = self._status_host[0]
        self.last_status = status_to_dict(status)
        if trace:   # kept after a failed run too: the partial timeline shows where it stopped
            self.last_trace_events = self._trace_bufs[1].array(
                abi.TRACE_DTYPE, (len(plan.instrs),)).copy()
        if self.last_status["error"] != abi.ERRORS["MK_OK"]:
            self._zero_counters = True  # partial counts: restart from zero, epoch 0
            self.epoch = 0
            # plain dicts: raise_for_status takes a list of records, not a numpy array
            raise_for_status(self.last_status, sm_states_to_dicts(self._sm_state_host),
                             plan.op_labels, plan.instrs, plan.queue_start, backend="cuda")
        finished = self.last_status["finished_blocks"]
        if finished != plan.n_sm:
            self._zero_counters = True
            self.epoch = 0
            raise MegakernelError(
                f"cuda: the megakernel reported no error, but {finished} of {plan.n_sm} "
                f"blocks finished their queues", self.last_status, [])
        self.epoch, self._zero_counters = next_epoch(self.epoch, self._max_target)
        result = {}
        for slot in outputs:
            tb = self._tensors[slot]
            if self.managed:
                src = tb.buf.host_view(tb.np_dtype, tb.padded_shape)
            else:
                src = self._staging[slot].array(tb.np_dtype, tb.padded_shape)
            result[slot] = np.array(src[:, :tb.slot.cols], copy=True)
        return result

    # -- waiting --------------------------------------------------------------------------------
    def _poll(self, handle, deadline: float) -> bool:
        """Poll `handle` until it drains (True) or `deadline` passes (False). A CUDA error
        raises `CudaError`; sticky ones mark the context dead."""
        drv = _bindings()
        not_ready = int(drv.CUresult.CUDA_ERROR_NOT_READY)
        start = time.monotonic()
        nap = 5e-5
        while True:
            ret = drv.cuStreamQuery(handle)
            err = int(ret[0] if isinstance(ret, tuple) else ret)
            if err == 0:
                return True
            if err != not_ready:
                try:
                    check(ret, "cuStreamQuery")
                except CudaError as exc:
                    if exc.error_name in _STICKY:
                        self._state["dead"] = str(exc)
                    raise
            now = time.monotonic()
            if now >= deadline:
                return False
            if now - start > _SPIN_S:
                time.sleep(min(nap, max(deadline - now, 0.0)))
                nap = min(nap * 2, _MAX_NAP_S)

    def _wait(self, what: str) -> None:
        """Wait for the stream, bounded by the host watchdog; raise every CUDA error."""
        limit = self.host_timeout_s
        deadline = time.monotonic() + limit if math.isfinite(limit) else math.inf
        try:
            done = self._poll(self._h, deadline)
        except CudaError as exc:
            self._zero_counters = True
            dead = " The CUDA context is now unusable; restart the process." \
                if exc.error_name in _STICKY else ""
            raise MegakernelError(f"cuda: {exc} while {what}.{dead}") from exc
        if not done:
            self._watchdog(what, limit)

    def _watchdog(self, what: str, limit: float) -> None:
        """The device ignored its own deadlines. Raise its abort flag through the copy engine
        (the SMs are all taken) and give the blocks a moment to see it."""
        b = self._dev_buf
        self._zero_counters = True
        self.epoch = 0
        abort_offset = abi.STATUS_DTYPE.fields["abort"][1]
        try:
            mem.htod(b["status"].ptr + abort_offset, self._abort_word.ptr, 4, self._ctl_h)
            stopped = self._poll(self._h, time.monotonic() + self._timeout_s + _ABORT_GRACE_S)
        except CudaError as exc:
            self._mark_broken(f"the watchdog could not stop the megakernel: {exc}")
            raise MegakernelHang(f"cuda: {what} took longer than the host watchdog "
                                 f"({limit:g} s) and could not be stopped: {exc}") from exc
        if not stopped:
            self._mark_broken(f"the megakernel ignored its deadline and the abort flag while "
                              f"{what}; the GPU is still busy")
            raise MegakernelHang(f"cuda: {what} took longer than the host watchdog "
                                 f"({limit:g} s) and did not stop when aborted: the GPU is "
                                 f"stuck; restart the process")
        record = status_to_dict(self._status_host[0])
        raise MegakernelHang(f"cuda: {what} took longer than the host watchdog ({limit:g} s) "
                             f"although every device wait has a {self._timeout_s:g} s deadline; "
                             f"the run was stopped through the abort flag",
                             record, sm_states_to_dicts(self._sm_state_host))

    def _mark_broken(self, reason: str) -> None:
        # Work may still be running on the device: never free its memory (cuMemFree would
        # wait for it, i.e. forever). Leaking is the lesser evil; the process must restart.
        self._state["broken"] = reason
        if self._memory is not None:
            self._memory.abandon()

    def _drain_quietly(self) -> None:
        """After a failure while enqueuing: let queued copies finish before staging is reused."""
        try:
            self._poll(self._h, time.monotonic() + min(self.host_timeout_s, 30.0))
        except Exception:
            pass

    def _shutdown_now(self) -> None:
        if self._finalizer is not None:
            if self._finalizer.alive and not self._state["broken"] and not self._state["dead"]:
                self._drain_quietly()
            self._finalizer()
        else:  # failed during construction, before the finalizer was armed
            _shutdown(self._state, self._memory, self._streams)
            self._memory = None
            self._streams = []
        self._staging = {}
        self._tensors = {}
        self._trace_bufs = None
        self._variants = {}   # unloads the modules once nothing else holds them
