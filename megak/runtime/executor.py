"""CudaExecutor: runs a Plan as one cooperative megakernel launch on the GPU.

Set up once (``__init__``)::

    device 0 current -> compile (cubin for the device's exact arch, cached) -> load
    -> checks that need the loaded kernel (static smem, opt-in, pages, occupancy, SM count)
    -> buffers: one per tensor slot (rows x ld, ld padded to MK_TENSOR_ALIGN_BYTES),
       tensor table (followed by the TMA operands' tensor maps: tensor_maps.py), queues,
       counters, status, sm_state, params
    -> tensor table + queues uploaded once through pinned staging on the executor's stream

Each ``launch`` enqueues on the caller's stream (``stream``; the executor's own by default)::

    1. numpy inputs -> pinned staging (padded rows) -> device  (+ prefetch when managed)
    2. debug: poison every non-input tensor with NaN
    3. cooperative launch: grid = plan.n_sm, block = MK_BLOCK_THREADS, dynamic smem = pages;
       arguments by value: the params block, the binding's tensor table, the launch's ticket
    4. numpy outputs -> pinned staging (or prefetch managed outputs to the host)

and returns its ticket; ``wait(ticket)`` spins on the mapped host view until the device has
finished that ticket (bounded by a host watchdog), raises a pending error, and for numpy
outputs waits for the stream and copies them out. With caller-owned GPU tensors only (a
"binding": their addresses in a tensor table of its own, uploaded once), steps 1, 2 and 4 are
empty: a launch is one driver call, and it can be captured in a CUDA graph.

The device keeps the run state itself (invocation.py: epoch, counters zeroed after a failure
or before the epoch could wrap, status reset, errors into the mapped host view), so no launch
needs a copy or a memset before it, and an error is held until the host reads it: raised by
``wait`` of any ticket, by ``check()``, or by the next launch.
"""
from __future__ import annotations

import math
import threading
import time
import warnings
import weakref

import numpy as np

from .. import abi, dtypes, pages
from ..errors import GraphError, MegakernelError, MegakernelHang, raise_for_status
from ..ops import bodies as ops_bodies
from ..plan import Plan, TensorSlot
from . import memory as mem
from . import packed_weights, tensor_maps
from .driver import CudaError, _bindings, check, device_info, require_gpu
from .graph_launch import GraphLauncher
from .invocation import HostView


# Errors after which the CUDA context is dead for the rest of the process.
_STICKY = {
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_DEINITIALIZED",
}

_SPIN_S = 0.010        # poll the stream flat out this long: short runs return at once
_CONSTANT_BOUNCE_BYTES = 64 << 20   # pinned staging of the constants' upload, at most
_QUICK_POLLS = 200     # polls of the host view before the clocked spin: ~20-40 us of Python
_MAX_NAP_S = 0.001     # then back off to at most this between polls
_ABORT_GRACE_S = 5.0   # after the watchdog raises the abort flag, this long to stop


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


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


def kernel_handles(kernel) -> tuple:
    """(handle, CUfunction) of a loaded cuda.core kernel. cuda.core loads cubins through the
    library API: the handle is a CUkernel (a bare address is wrapped the same way, should a
    version hand one out), whose function in the current context the launch calls take; a
    module-API handle is already the CUfunction (then both are the same object)."""
    drv = _bindings()
    handle = kernel.handle
    if isinstance(handle, drv.CUfunction):
        return handle, handle
    if not isinstance(handle, drv.CUkernel):
        handle = drv.CUkernel(int(handle))
    return handle, check(drv.cuKernelGetFunction(handle), "cuKernelGetFunction")


def active_blocks(plan: Plan) -> int:
    """Blocks that take part in an invocation (mk_block_active): block 0, and every other
    block with a non-empty queue; the others leave at once and are not waited for."""
    sizes = np.diff(np.asarray(plan.queue_start, dtype=np.int64))
    return 1 + int(np.count_nonzero(sizes[1:]))


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
    if not 0 <= plan.stream_pages <= plan.n_pages:
        raise GraphError(f"plan.stream_pages = {plan.stream_pages} must be in 0 .. "
                         f"plan.n_pages = {plan.n_pages}")


MAX_BINDINGS = 64   # tensor tables kept on the device, one per distinct set of caller tensors


class _Binding:
    """One set of caller-owned GPU tensors (slot -> address, leading dimension) as a tensor
    table of its own in device memory; uploaded once (stream-ordered, so capturable)."""
    __slots__ = ("key", "index", "table_ptr", "uploaded", "last_ticket", "captured", "live",
                 "ready", "wgmma_only")

    def __init__(self, key, index: int, table_ptr: int):
        self.key = key
        self.index = index
        self.table_ptr = table_ptr
        self.live = True          # False once its slot went to another binding
        self.uploaded = False     # a table first written inside a CUDA graph capture is not
        self.last_ticket = 0      # in memory until that graph runs: upload again when used
        self.captured = False     # eagerly; a captured binding is never evicted
        self.ready = None         # its tensor maps' ready words (tensor_maps.ready_view)
        self.wgmma_only = None    # whether the MK_WGMMA_ONLY kernel runs it (None: not known)


class _TensorBuffer:
    __slots__ = ("slot", "buf", "ld", "np_dtype", "poison")

    def __init__(self, slot: TensorSlot, buf: mem.DeviceBuffer, ld: int):
        self.slot = slot
        self.buf = buf
        self.ld = ld
        self.np_dtype = dtypes.numpy_dtype(slot.dtype)
        # flagged words: stamp 0 is "never written", so a poisoned word is polled, not read
        self.poison = 0 if slot.flagged else dtypes.POISON_WORD[slot.dtype]

    @property
    def padded_shape(self) -> tuple[int, int]:
        return (self.slot.rows, self.ld)


def _shutdown(state: dict, memory: mem.Memory | None, streams: list,
              graphs: GraphLauncher | None = None) -> None:
    """Finalizer: destroy the launch graphs, free device memory, then the streams. Holds no
    reference to the executor."""
    if state.get("broken"):
        # A kernel may still be running (the watchdog could not stop it): freeing its memory
        # would block or corrupt. Leak deliberately; the process must restart anyway.
        return
    if graphs is not None:
        try:
            graphs.close()
        except Exception:  # at interpreter exit cuda.bindings may already be gone
            pass
    failures = memory.close() if memory is not None else []
    for s in streams:
        try:
            s.close()
        except Exception:  # at interpreter exit cuda.core may already be gone
            pass
    if failures and not state.get("dead"):
        warnings.warn("megak: some GPU buffers could not be freed: " + "; ".join(failures),
                      RuntimeWarning, stacklevel=2)


def program_bodies(instrs: np.ndarray, packed_forms: dict) -> int:
    """The MK_BODIES a program's kernel is built with: its records' bodies (ops.bodies), and
    the packed stream (MK_BODY_STREAM_PACKED) where it has packed constants (`packed_forms`,
    packed_weights.packed_forms): only a build that holds it streams their pages."""
    return ops_bodies(instrs) | (abi.BODY_STREAM_PACKED if packed_forms else 0)


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
        self.last_status: dict | None = None
        self.last_trace_events: np.ndarray | None = None
        self._trace_bufs: tuple | None = None
        self._pending: dict[int, tuple] = {}   # ticket -> (numpy outputs, traced)
        self._stream_of: dict[int, object] = {}  # ticket -> its stream (for the error query)
        self._state: dict = {"broken": None, "dead": None}
        self._memory: mem.Memory | None = None
        self._streams: list = []
        self._lock = threading.Lock()
        self._tensors: dict[int, _TensorBuffer] = {}
        self._staging: dict[int, mem.PinnedBuffer] = {}
        self._finalizer = None
        self._ticket = 0                 # the last launch's ticket (u32, never 0)
        self._bindings: dict = {}        # binding key -> _Binding, least recently used first
        self._streams_by_handle: dict = {}
        self.graph_launch = True   # run_bound replays a graph (False: launches directly)
        self.last_launch = None    # how the last launch was enqueued: "graph" or "direct"

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
        # (trace, MK_WGMMA_ONLY build: 0 none, 1 n256, 2 n128, MK_BODIES or None: every body)
        # -> (compiled, object code, kernel, info)
        self._variants: dict[tuple[bool, int, int | None], tuple] = {}
        # Constants read only as streamed B get a packed copy (packed_weights.py): their map
        # slot holds the packed pages' address in every table
        self._packed_forms = packed_weights.packed_forms(plan.instrs, plan.constant_values)
        # the op bodies the plan's records run (instr.h, enum mk_bodies): its kernel holds
        # only those, so an SM's instruction cache holds what the program runs
        self.bodies = self._plan_bodies()
        self.compiled, _, _, self.kernel_info = self._variant(trace=False)
        self._wgmma_slots = None   # set with the tables (_upload_tables)
        self._own_wgmma_only = None
        self._grid = plan.n_sm
        # run_bound's launch graphs (graph_launch.py); its argument array comes with the
        # launch arguments (_setup_launch_args), its graphs with the first bound run
        self._graph_launch = GraphLauncher(self._grid, abi.BLOCK_THREADS, self.smem_bytes)

        # -- buffers ------------------------------------------------------------------------------
        try:
            self._streams = [self._dev.create_stream(), self._dev.create_stream()]
            self._stream, self._ctl_stream = self._streams
            self._h = self._stream.handle        # CUstream for cuda.bindings calls
            self._ctl_h = self._ctl_stream.handle
            self._memory = mem.Memory(device)
            self._allocate()
            self._finalizer = weakref.finalize(self, _shutdown, self._state, self._memory,
                                               self._streams, self._graph_launch)
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
    def _variant_defines(self, trace: bool, wgmma_only: int, bodies: int | None,
                         resident: bool) -> dict | None:
        """The compile defines of one build (what _variant compiles and compile_resident
        fills the cache with: one statement of them, so both name the same build)."""
        from .compiler import bodies_defines
        defines = {}
        if trace:
            defines["MK_TRACE"] = 1
        if wgmma_only:
            defines["MK_WGMMA_ONLY"] = wgmma_only
        if bodies is not None:
            defines.update(bodies_defines(bodies, resident))
        return defines or None

    def _variant(self, trace: bool, wgmma_only: int = 0, resident_bodies: int | None = None
                 ) -> tuple:
        """(compiled, object code, kernel, kernel info) of the plain, the MK_TRACE=1 or the
        MK_WGMMA_ONLY=<wgmma_only> build (device/pages.cuh: 1 n256, 2 n128), the first two
        with the plan's bodies (MK_BODIES, self.bodies); with `resident_bodies`, the build of
        those bodies that holds the resident kernel (MK_RESIDENT). Compiled (cached on disk),
        loaded and configured once per executor."""
        resident = resident_bodies is not None
        bodies = resident_bodies if resident else None if wgmma_only else self.bodies
        key = (trace, wgmma_only, bodies, resident)
        if key not in self._variants:
            from cuda.core import ObjectCode

            from .compiler import compile_megakernel
            compiled = compile_megakernel(
                arch=self.info["arch"],
                defines=self._variant_defines(trace, wgmma_only, bodies, resident))
            code = ObjectCode.from_cubin(compiled.cubin)
            kernel = code.get_kernel("megakernel")
            kinfo = self._configure_kernel(kernel)
            self._variants[key] = (compiled, code, kernel, kinfo)
        return self._variants[key]

    def _plan_bodies(self) -> int:
        return program_bodies(self.plan.instrs, self._packed_forms)

    def _use_bodies(self, bodies: int) -> None:
        """Run a build of these op bodies (MK_BODIES) from the next launch on."""
        if bodies != self.bodies:
            self.bodies = bodies
            self._function = self._variant(False)[3]["function"]

    def _find_wgmma_only(self) -> None:
        """Whether the plan as it is now (tensor_maps.wgmma_only_slots) can run on the
        MK_WGMMA_ONLY kernel, and which build (wgmma_only_n: the MMAs' n, 256 or 128), loaded
        here if so; which tables can is decided at their first launch (_function_for)."""
        n = max(self._n_tensors, 1)
        rows, cols = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        for t in self.plan.tensors:
            rows[t.slot], cols[t.slot] = t.rows, t.cols
        self._wgmma_slots = tensor_maps.wgmma_only_slots(self.plan.instrs, rows, cols)
        self._own_wgmma_only = None
        for b in self._bindings.values():
            b.wgmma_only = None
        self._wgmma_function = self.wgmma_only_n = None
        if self._wgmma_slots is not None:
            build = tensor_maps.wgmma_only_build(self.plan.instrs)
            self._wgmma_function = self._variant(False, build)[3]["function"]
            self.wgmma_only_n = 128 if build == 2 else 256

    def _function_for(self, binding: "_Binding | None", trace: bool):
        """The kernel a launch with this table runs: the MK_WGMMA_ONLY one where the plan and
        the table's maps allow it (never traced: its trace marks would serialise the MMAs),
        else the general one. Sets last_variant."""
        wgmma_only = False
        if self._wgmma_slots is not None and not trace:
            if binding is None:
                if self._own_wgmma_only is None:
                    self._own_wgmma_only = tensor_maps.maps_cover(
                        tensor_maps.ready_view(self._table_image, self._n_tensors),
                        self._wgmma_slots)
                wgmma_only = self._own_wgmma_only
            else:
                if binding.wgmma_only is None:
                    binding.wgmma_only = tensor_maps.maps_cover(binding.ready,
                                                                self._wgmma_slots)
                wgmma_only = binding.wgmma_only
        self.last_variant = "wgmma_only" if wgmma_only else "trace" if trace else "general"
        if wgmma_only:
            return self._wgmma_function
        return self._variant(trace)[3]["function"] if trace else self._function

    def _configure_kernel(self, kernel) -> dict:
        """Opt in to the dynamic smem, then check what only the loaded kernel can tell."""
        drv = _bindings()
        info = self.info
        attr = drv.CUfunction_attribute
        max_dyn = attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        handle, func = kernel_handles(kernel)
        if handle is not func:                  # a CUkernel (library API)
            def get(a, what):
                return int(check(drv.cuKernelGetAttribute(a, handle, self._cu_dev),
                                 f"cuKernelGetAttribute({what})"))

            def set_max_dynamic(n):
                check(drv.cuKernelSetAttribute(max_dyn, n, handle, self._cu_dev),
                      "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        else:                                   # a CUfunction (module API)
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
                "max_pages": max_pages, "blocks_per_sm": blocks, "function": func}

    def _allocate(self) -> None:
        plan = self.plan
        m = self._memory
        layout = []
        for t in plan.tensors:
            if t.kind == "unused":   # no instruction touches it: its table entry stays zero
                continue
            itemsize = t.itemsize
            ld = round_up(max(t.cols, 1), abi.TENSOR_ALIGN_BYTES // itemsize)
            layout.append((t, ld, round_up(t.rows * ld * itemsize, mem.DEVICE_ALIGN)))
        tensor_bytes = sum(n for _, _, n in layout)
        n_tensors = (max(t.slot for t in plan.tensors) + 1) if plan.tensors else 0
        self._n_tensors = n_tensors
        # a tensor table is its entries, then the TMA operands' maps and ready words
        # (tensor_maps.py); tables side by side stay 128-B aligned, as the maps must be
        self._table_bytes = round_up(abi.table_bytes(n_tensors), abi.TMAP_BYTES)
        # the slots whose maps every table carries, with their boxes; reload_queues() keeps
        # them, so a TMA operand added later has ready 0 and the device loads it itself;
        # packed constants have none
        self._map_boxes = {s: b for s, b in tensor_maps.map_boxes(plan.instrs).items()
                           if s not in self._packed_forms}
        packed = [(slot, packed_weights.packed_bytes(*plan.constant_values[slot].shape, ready))
                  for slot, ready in self._packed_forms.items()]
        control = [
            ("instrs", max(len(plan.instrs), 1) * abi.INSTR_BYTES),
            ("queue_start", (plan.n_sm + 1) * 4),
            ("tensors", self._table_bytes),
            ("counters", max(plan.n_counters, 1) * 4),
            ("status", abi.STATUS_DTYPE.itemsize),
            ("sm_state", plan.n_sm * abi.SM_STATE_DTYPE.itemsize),
            ("params", abi.PARAMS_DTYPE.itemsize),
        ]
        control_bytes = sum(round_up(n, mem.DEVICE_ALIGN) for _, n in control)
        # one up-front check of the whole request: a clear error before anything is allocated
        packed_total = sum(round_up(n, mem.DEVICE_ALIGN) for _, n in packed)
        m.check_fits(tensor_bytes + control_bytes + packed_total, managed=self.managed,
                     what=f"{len(plan.tensors)} tensors + control data"
                          + (f" + {len(packed)} packed constants" if packed else ""))
        alloc = m.managed if self.managed else m.device
        for t, ld, nbytes in layout:
            self._tensors[t.slot] = _TensorBuffer(t, alloc(nbytes, f"tensor {t.name}"), ld)
        self._packed = {slot: alloc(n, f"packed {plan.tensors[slot].name}")
                        for slot, n in packed}
        self._dev_buf = {name: m.device(n, name) for name, n in control}
        self._queue_capacity = max(len(plan.instrs), 1)
        self._counter_capacity = max(plan.n_counters, 1)
        self._run_state = m.device(abi.RUN_STATE_DTYPE.itemsize, "run state")
        # what the device tells the host, in mapped pinned memory: no copy, no stream sync;
        # memory Python owns, so that a done() racing close() in another thread reads memory
        # that is still there (close() swaps in a host copy, then unregisters this)
        self._host_view_buf = m.mapped(abi.HOST_VIEW_DTYPE.itemsize, "host view")
        self._host_sm_buf = m.mapped(plan.n_sm * abi.SM_STATE_DTYPE.itemsize, "host sm_state")
        self._host = HostView(self._host_view_buf.array(abi.HOST_VIEW_DTYPE, (1,)),
                              self._host_sm_buf.array(abi.SM_STATE_DTYPE, (plan.n_sm,)))
        self._params_host_buf = m.pinned(abi.PARAMS_DTYPE.itemsize, "params (host)")
        self._abort_word = m.pinned(4, "abort flag (host)")
        self._params_host = self._params_host_buf.array(abi.PARAMS_DTYPE, (1,))
        self._abort_word.array(np.uint32, (1,))[0] = 1
        # the bindings' tensor tables: device slots and their pinned sources, all up front
        # (nothing may be allocated while a CUDA graph is being captured)
        self._binding_dev = m.device(MAX_BINDINGS * self._table_bytes, "binding tables")
        self._binding_host = m.pinned(MAX_BINDINGS * self._table_bytes, "binding tables (host)")
        self._free_binding_slots = list(range(MAX_BINDINGS))
        self._queue_host_buf: mem.PinnedBuffer | None = None
        self._poison_src: tuple | None = None     # resident requests' poison (debug)

    def _upload_tables(self) -> None:
        """Tensor table (with the tensor maps of the stream slots, encoded here once), queues,
        params and a zero run state, once; then wait, so the staging can be reused or freed."""
        table = np.zeros(max(self._n_tensors, 1), dtype=abi.TENSOR_DTYPE)
        for slot, tb in self._tensors.items():
            table[slot]["ptr"] = tb.buf.ptr
            table[slot]["rows"] = tb.slot.rows
            table[slot]["cols"] = tb.slot.cols
            table[slot]["ld"] = tb.ld
            table[slot]["dtype"] = (abi.DTYPE_F32_FLAG if tb.slot.flagged
                                    else dtypes.ABI_CODE[tb.slot.dtype])
        image = np.zeros(self._table_bytes, dtype=np.uint8)
        tensor_maps.fill_table(image, self._n_tensors, table, self._map_boxes)
        self._upload_constants(image)
        self._table_image = image     # a binding's table starts from it (same maps elsewhere)
        self._find_wgmma_only()
        self._table_host_buf = self._memory.pinned(self._table_bytes, "tensor table (host)")
        self._table_host_buf.array(np.uint8, image.shape)[:] = image
        mem.htod(self._dev_buf["tensors"].ptr, self._table_host_buf.ptr, self._table_bytes,
                 self._h)
        self._write_queues()
        self._write_params()
        self._wait_stream("uploading the tensor table, queues and params")
        self._setup_launch_args()

    def _upload_constants(self, image: np.ndarray) -> None:
        """The graph's constants into their buffers, once: each row-major (rows padded to
        ld), and the packed ones (packed_weights.py) also in the stream's page order, their
        map slot and ready word in the table image. Through one pinned bounce buffer; waits
        for the copies."""
        plan = self.plan
        if not plan.constant_values:
            return
        maps = tensor_maps.maps_view(image, self._n_tensors)
        ready = tensor_maps.ready_view(image, self._n_tensors)
        jobs = []
        for slot, value in plan.constant_values.items():
            tb = self._tensors.get(slot)
            if tb is None:
                continue
            padded = np.zeros(tb.padded_shape, dtype=tb.np_dtype)
            padded[:, :tb.slot.cols] = value
            jobs.append((tb.buf.ptr, padded.view(np.uint8).reshape(-1)))
            form = self._packed_forms.get(slot)
            if form is not None:
                buf = self._packed[slot]
                jobs.append((buf.ptr, packed_weights.pack(value, form)))
                maps[slot] = packed_weights.descriptor(buf.ptr, *value.shape, form)
                ready[slot] = form
        chunk = min(_CONSTANT_BOUNCE_BYTES, max(len(data) for _, data in jobs))
        bounce = self._memory.pinned(chunk, "constants (host)")
        try:
            host = bounce.array(np.uint8, (chunk,))
            for dst, data in jobs:
                for at in range(0, len(data), chunk):
                    n = min(chunk, len(data) - at)
                    self._wait_stream("uploading the constants")   # the bounce is free
                    host[:n] = data[at:at + n]
                    mem.htod(dst + at, bounce.ptr, n, self._h)
            self._wait_stream("uploading the constants")
        finally:
            self._memory.free(bounce)

    def _write_queues(self) -> None:
        """plan.instrs + plan.queue_start -> pinned staging -> device (stream-ordered); the
        counters and the run state start from zero."""
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
        b = self._dev_buf
        mem.memset32(b["counters"].ptr, 0, self._counter_capacity, self._h)
        mem.memset32(self._run_state.ptr, 0, abi.RUN_STATE_DTYPE.itemsize // 4, self._h)
        # the stamps restart with the run state: no word may keep a stamp it will issue again
        for tb in self._tensors.values():
            if tb.slot.flagged:
                mem.memset32(tb.buf.ptr, 0, tb.buf.nbytes // 4, self._h)
        mem.memset32(b["status"].ptr, 0, abi.STATUS_DTYPE.itemsize // 4, self._h)
        # an inactive block never writes its state: zero reads as "finished an empty queue"
        mem.memset32(b["sm_state"].ptr, 0, plan.n_sm * abi.SM_STATE_DTYPE.itemsize // 4, self._h)

    def _write_params(self, trace_ptr: int = 0) -> None:
        """The params block (host copy) and its stream-ordered upload."""
        p = self._params_host[0]
        b = self._dev_buf
        p["instrs"] = b["instrs"].ptr
        p["queue_start"] = b["queue_start"].ptr
        p["tensors"] = b["tensors"].ptr
        p["counters"] = b["counters"].ptr
        p["status"] = b["status"].ptr
        p["sm_state"] = b["sm_state"].ptr
        p["timeout_ns"] = int(self._timeout_s * 1e9)
        p["epoch"] = 0     # each block reads the run state's
        p["n_sm"] = self.plan.n_sm
        p["n_tensors"] = self._n_tensors
        p["n_counters"] = self.plan.n_counters
        p["n_pages"] = self.plan.n_pages
        p["debug"] = 1 if self.debug else 0
        p["trace"] = trace_ptr
        p["run_state"] = self._run_state.ptr
        p["host_view"] = self._host_view_buf.device_ptr
        p["host_sm_state"] = self._host_sm_buf.device_ptr
        p["max_target"] = self._max_target
        self._n_active = active_blocks(self.plan)   # kept: every wait() reports it
        p["n_active"] = self._n_active
        p["stream_pages"] = self.plan.stream_pages
        mem.htod(b["params"].ptr, self._params_host_buf.ptr, abi.PARAMS_DTYPE.itemsize, self._h)

    def _setup_launch_args(self) -> None:
        """The kernel's five arguments as a void** array, built once: a launch only changes
        the table pointer and the ticket in place (the driver copies them at launch). The
        queue bounds' and the run state's addresses come beside params' (their buffers never
        move), so a block's set-up need not read params first."""
        import ctypes
        self._arg_ptrs = (ctypes.c_uint64 * 2)(self._dev_buf["params"].ptr,
                                               self._dev_buf["tensors"].ptr)
        self._arg_ticket = (ctypes.c_uint32 * 1)(0)
        self._arg_state = (ctypes.c_uint64 * 2)(self._dev_buf["queue_start"].ptr,
                                                self._run_state.ptr)
        base = ctypes.addressof(self._arg_ptrs)
        state = ctypes.addressof(self._arg_state)
        self._argv = (ctypes.c_void_p * 5)(base, base + 8, ctypes.addressof(self._arg_ticket),
                                           state, state + 8)
        self._argv_addr = ctypes.addressof(self._argv)
        # what a resident request names of this program (instr.h mk_request): the same
        # buffers, so that a block reads its queue bounds and the run state beside the params
        self._request_words = (self._dev_buf["params"].ptr, self._dev_buf["queue_start"].ptr,
                               self._run_state.ptr, self.plan.n_sm)
        self._function = self._variant(False)[3]["function"]
        self.last_variant = None   # the kernel of the last launch: "general", "trace" or
                                   # "wgmma_only" (device/pages.cuh, MK_WGMMA_ONLY; its
                                   # build's MMA n in wgmma_only_n)
        self._launch_kernel = _bindings().cuLaunchCooperativeKernel
        self._graph_launch.argv_addr = self._argv_addr
        self.last_binding = None

    # -- public -----------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The device's epoch for the next run (read back: for tests and diagnostics)."""
        with self._lock:
            self._current()
            host = self._memory.pinned(abi.RUN_STATE_DTYPE.itemsize, "run state (host)")
            try:
                mem.dtoh(host.ptr, self._run_state.ptr, abi.RUN_STATE_DTYPE.itemsize, self._h)
                self._wait_stream("reading the run state")
                return int(host.array(abi.RUN_STATE_DTYPE, (1,))[0]["epoch"])
            finally:
                self._memory.free(host)

    def reload_queues(self) -> None:
        """Upload ``plan.instrs`` / ``queue_start`` again (after editing them in place).

        The grid is fixed at construction: ``plan.n_sm`` must not change. Counters restart
        from zero and the epoch from 0.
        """
        with self._lock:
            self._check_usable()
            self._current()
            validate_plan(self.plan)
            if self.plan.n_sm != self._grid:
                raise MegakernelError(f"reload_queues(): plan.n_sm changed from {self._grid} "
                                      f"to {self.plan.n_sm}; build a new executor")
            for h in self._launch_streams():   # no launch reads the queues as they change
                self._wait_stream("finishing earlier runs", h)
            self._write_queues()
            self._write_params()
            self._find_wgmma_only()
            self._wait_stream("uploading the queues")
            self._use_bodies(self._plan_bodies())   # edited records may run others

    def run(self, inputs: dict[int, np.ndarray], outputs: list[int],
            trace: bool = False, external: dict | None = None,
            stream=None) -> dict[int, np.ndarray]:
        """Run the plan once and wait: ``inputs`` slot -> array of that slot's shape and
        dtype; returns slot -> a fresh array for every slot in ``outputs``.

        ``external``: slot -> megak.interop.DeviceArray (validated by the caller): GPU memory
        of the caller used in place of megak's buffer for that slot, zero-copy. An external
        input is read where it lies; an external output is written there and is not in the
        returned dict. ``stream``: a CUstream (or int handle) to run on (default: the
        executor's own).

        ``trace``: run the MK_TRACE=1 build (compiled on first use) and keep one
        abi.TRACE_DTYPE record per queued instruction, in queue order, in
        ``last_trace_events`` (%globaltimer ns). Untraced runs leave it None.
        """
        outputs = [s for s in outputs if s not in (external or {})]
        ticket = self.launch(inputs, outputs, external=external, stream=stream, trace=trace)
        return self.wait(ticket)

    def launch(self, inputs: dict[int, np.ndarray], outputs: list[int], *,
               external: dict | None = None, stream=None, trace: bool = False) -> int:
        """Enqueue one run; returns its ticket for ``wait``. Raises first any error an earlier
        run left unreported (so none is lost). With no numpy inputs or outputs and no trace,
        nothing but the launch itself is enqueued (capturable in a CUDA graph)."""
        with self._lock:
            self._current()
            self._check_usable()
            self._raise_pending()
            if inputs or outputs:
                self._check_io(inputs, outputs)
            h = self._stream_handle(stream)
            binding = self._binding(external or {}, h)
            self.last_trace_events = None
            if inputs or outputs or trace:
                # the staging and trace buffers are shared: earlier launches' copies through
                # them finish (and their numpy results are taken out) before they are reused
                self._settle_pending()
            try:
                if inputs:
                    self._stage_inputs(inputs, h)
                if self.debug:
                    self._poison(h)
                if self.managed:
                    for tb in self._tensors.values():
                        self._memory.prefetch(tb.buf, "device", h)
                if trace:
                    tdev, _ = self._trace_buffers()
                    mem.memset32(tdev.ptr, 0, tdev.nbytes // 4, h)
                    self._write_params(trace_ptr=tdev.ptr)   # on the executor's stream
                    self._wait_stream("writing the traced run's params")
                ticket = self._launch(binding, h, trace)
                self.last_binding = binding
                if trace:
                    tdev, thost = self._trace_bufs
                    mem.dtoh(thost.ptr, tdev.ptr, tdev.nbytes, h)
                    self._write_params()     # untraced again for the next launch
                for slot in outputs:
                    tb = self._tensors[slot]
                    if self.managed:
                        self._memory.prefetch(tb.buf, "host", h)
                    else:
                        mem.dtoh(self._stage(slot).ptr, tb.buf.ptr,
                                 tb.slot.rows * tb.ld * tb.np_dtype.itemsize, h)
            except BaseException:
                self._drain_quietly(h)
                raise
            if outputs or trace:
                self._pending[ticket] = (list(outputs), bool(trace), None)
            self._stream_of[ticket] = h
            if len(self._stream_of) > 256:     # forget launches the device has finished
                for t in [t for t in self._stream_of if self._host.done(t)]:
                    del self._stream_of[t]
            return ticket

    def launch_bound(self, binding: _Binding, stream) -> int:
        """The call path's fast case: the same caller tensors as an earlier launch (its
        binding, still live), no numpy arrays, no trace: raise a pending error, launch."""
        with self._lock:
            ticket, h = self._launch_bound(binding, stream)
            self._stream_of[ticket] = h
            if len(self._stream_of) > 256:
                for t in [t for t in self._stream_of if self._host.done(t)]:
                    del self._stream_of[t]
            return ticket

    def run_bound(self, binding: _Binding, stream) -> None:
        """launch_bound and the wait for it in one step (Program.run's fast case): under one
        lock, with no handle and no record of the launch's stream, since it is waited for
        here. Raises the run's error, or an earlier one not yet reported."""
        with self._lock:
            ticket, h = self._launch_bound(binding, stream, graph=self.graph_launch)
            self._wait_ticket(ticket, h, "running the megakernel")
            self._raise_pending()
            self.last_status = {"error": abi.ERRORS["MK_OK"], "finished_blocks": self._n_active}

    def _launch_bound(self, binding: _Binding, stream, graph: bool = False) -> tuple:
        """(ticket, CUstream) of a launch on a bound table; the caller holds the lock. With
        `graph`, a replay of the launch graph (graph_launch.py: only for a launch waited for
        before the next)."""
        self._current()
        if self._state["broken"] or self._state["dead"] or self._finalizer is None:
            self._check_usable()
        if self._host.error_pending():
            self._raise_pending()
        h = self._streams_by_handle.get(stream)
        if h is None:
            h = self._stream_handle(stream)
        if not binding.uploaded:            # first written inside a graph capture
            self._bindings.pop(binding.key, None)
            self._bindings[binding.key] = binding
            mem.htod(binding.table_ptr,
                     self._binding_host.ptr + binding.index * self._table_bytes,
                     self._table_bytes, h)
            binding.uploaded = not self._capturing(h)
        return self._launch(binding, h, False, graph), h

    # -- requests of a resident kernel (runtime/resident.py) ------------------------------------
    def prepare_request(self, inputs: dict[int, np.ndarray], outputs: list[int], *,
                        external: dict | None = None, binding: _Binding | None = None
                        ) -> tuple[int, int, int, _Binding | None]:
        """Everything a resident kernel's request of this program needs before it is posted:
        a pending error raised, the tensor table bound and in device memory, numpy inputs
        copied in (on this executor's stream, beside the running kernel: copies need no SM).
        ``binding``: the table of an earlier identical call (the fast path), else one is
        found or made for ``external``. Returns (program words, tensor table address,
        ticket, binding); the program words as ResidentKernel.post takes them: the params,
        queue_start and run_state addresses and n_sm."""
        with self._lock:
            self._check_usable()
            if self._host.error_pending():
                self._raise_pending()
            if inputs or outputs:
                self._check_io(inputs, outputs)
            h = self._h
            queued = bool(inputs) or self.debug or binding is None
            if queued or not binding.uploaded:
                self._current()   # driver calls follow; a bound, uploaded request makes none
            if binding is None:
                binding = self._binding(external or {}, h)   # may queue the table's upload
            elif not binding.live:
                raise GraphError("prepare_request(): that tensor table was given to other "
                                 "tensors")
            if binding is not None and not binding.uploaded:
                mem.htod(binding.table_ptr,
                         self._binding_host.ptr + binding.index * self._table_bytes,
                         self._table_bytes, h)
                binding.uploaded = True
                queued = True
            if inputs:
                self._settle_pending()
                self._stage_inputs(inputs, h)
            if self.debug:
                self._poison_by_copy(h)
            # the request is read when the kernel takes it: what was queued above has landed
            if queued:
                self._wait_stream("preparing a resident request", h)
            self._ticket = (self._ticket + 1) & 0xFFFFFFFF or 1
            if binding is not None:
                binding.last_ticket = self._ticket
            table = binding.table_ptr if binding is not None else self._dev_buf["tensors"].ptr
            if outputs:
                self._pending[self._ticket] = (list(outputs), False, None)
            return self._request_words, table, self._ticket, binding

    def finish_request(self, ticket: int) -> dict[int, np.ndarray]:
        """A resident request the device has finished: its error, else its numpy outputs."""
        with self._lock:
            self._check_usable()
            outputs, _, _ = self._pending.pop(ticket, ([], False, None))
            self._raise_pending()
            if not outputs:
                return {}
            self._current()   # the copies back are driver calls
            for slot in outputs:
                tb = self._tensors[slot]
                mem.dtoh(self._stage(slot).ptr, tb.buf.ptr,
                         tb.slot.rows * tb.ld * tb.np_dtype.itemsize, self._h)
            self._wait_stream("reading results back", self._h)
            return self._copy_out(outputs, False)[0]

    def compile_resident(self, bodies: int) -> None:
        """Compile the resident build of `bodies` into the disk cache (NVRTC only, no module
        loaded): what resident_function loads later."""
        from .compiler import compile_megakernel
        compile_megakernel(arch=self.info["arch"],
                           defines=self._variant_defines(False, 0, bodies, True))

    def resident_function(self, smem_bytes: int, bodies: int):
        """The resident entry (megakernel_resident) of a build holding the op bodies `bodies`
        (the union of the programs it serves), opted in to `smem_bytes` of dynamic shared
        memory and checked to fit one block per SM: (function, object code)."""
        drv = _bindings()
        _, code, _, _ = self._variant(False, resident_bodies=bodies)
        _, func = kernel_handles(code.get_kernel("megakernel_resident"))
        check(drv.cuFuncSetAttribute(
            func, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem_bytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        blocks = int(check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            func, abi.BLOCK_THREADS, smem_bytes), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))
        if blocks < 1:
            raise MegakernelError(f"the resident megakernel does not fit an SM with "
                                  f"{smem_bytes:,} B of dynamic shared memory")
        return func, code

    def wait(self, ticket: int) -> dict[int, np.ndarray]:
        """Wait until the device has finished ``ticket`` (bounded by the host watchdog);
        raise its error (or an earlier unreported one); return its numpy outputs."""
        with self._lock:
            self._current()
            self._check_usable()
            outputs, trace, ready = self._pending.get(ticket, ([], False, None))
            h = self._stream_of.get(ticket, self._h)
            try:
                self._wait_ticket(ticket, h, "running the megakernel")
                if ready is None and (outputs or trace):
                    self._wait_stream("reading results back", h)
                    ready = self._copy_out(outputs, trace)
            except Exception:
                self._forget(ticket)     # a failed wait: nothing of that run is read again
                raise
            # (an interrupt above, KeyboardInterrupt, leaves the launch as it was: a later
            # wait finishes it and still gets its results)
            self._forget(ticket)
            if trace:   # kept after a failed run too: the partial timeline shows where it stopped
                self.last_trace_events = ready[1]
            self._raise_pending()
            self.last_status = {"error": abi.ERRORS["MK_OK"],
                                "finished_blocks": self._n_active}
            return ready[0] if ready is not None else {}

    def _forget(self, ticket: int) -> None:
        self._pending.pop(ticket, None)
        self._stream_of.pop(ticket, None)

    def _copy_out(self, outputs, trace: bool) -> tuple[dict, np.ndarray | None]:
        """A finished launch's numpy outputs (and trace) out of the shared staging."""
        result = {}
        for slot in outputs:
            tb = self._tensors[slot]
            if self.managed:
                src = tb.buf.host_view(tb.np_dtype, tb.padded_shape)
            else:
                src = self._staging[slot].array(tb.np_dtype, tb.padded_shape)
            result[slot] = np.array(src[:, :tb.slot.cols], copy=True)
        events = None
        if trace:
            events = self._trace_bufs[1].array(abi.TRACE_DTYPE, (len(self.plan.instrs),)).copy()
        return result, events

    def _settle_pending(self) -> None:
        """Wait for every stream with unfinished launches, and take the numpy results of
        launches not yet waited on out of the staging."""
        for ticket, h in list(self._stream_of.items()):
            if not self._host.done(ticket) or ticket in self._pending:
                self._wait_stream("finishing earlier runs", h)
        for ticket, (outputs, trace, ready) in list(self._pending.items()):
            if ready is None:
                self._pending[ticket] = (outputs, trace, self._copy_out(outputs, trace))

    def done(self, ticket: int) -> bool:
        """True once the device has finished ``ticket`` (its results, or its error, are in)."""
        return self._host.done(ticket)

    def done_soon(self, ticket: int) -> bool:
        """done(), polled _QUICK_POLLS times back to back: no clock read, no closure, so a
        short run is seen finished at the cost of a few polls (the clocked wait follows when
        this says False)."""
        done = self._host.done
        for _ in range(_QUICK_POLLS):
            if done(ticket):
                return True
        return False

    def check(self) -> None:
        """Raise the error a run left unreported, if any (no wait: graph replays report here)."""
        with self._lock:
            self._current()
            self._raise_pending()

    def close(self) -> None:
        """Free every buffer and stream now (idempotent)."""
        with self._lock:
            self._current()
            self._shutdown_now()

    def __enter__(self) -> "CudaExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._finalizer is None or not self._finalizer.alive

    # -- one run ----------------------------------------------------------------------------------
    def _current(self) -> None:
        """This device's primary context current in the calling thread (Memory.make_current):
        every entry point that calls the driver starts here, so that any thread may call it."""
        memory = getattr(self, "_memory", None)   # None once closed
        if memory is not None:
            memory.make_current()

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

    def _stream_handle(self, stream):
        """A CUstream for `stream`: None (the executor's own), a CUstream, or an int handle."""
        if stream is None:
            return self._h
        if isinstance(stream, int):
            h = self._streams_by_handle.get(stream)
            if h is None:
                h = self._streams_by_handle[stream] = _bindings().CUstream(stream)
            return h
        return stream

    def _stage(self, slot: int) -> mem.PinnedBuffer:
        st = self._staging.get(slot)
        if st is None:
            tb = self._tensors[slot]
            st = self._memory.pinned(tb.buf.nbytes, f"staging {tb.slot.name}")
            self._staging[slot] = st
        return st

    def _stage_inputs(self, inputs, h) -> None:
        """numpy inputs through pinned staging, rows padded to ld (one copy per tensor). The
        staging is reused: wait for earlier launches' copies out of it first."""
        self._wait_stream("reusing the input staging", h)
        for slot, arr in inputs.items():
            tb = self._tensors[slot]
            st = self._stage(slot)
            st.array(tb.np_dtype, tb.padded_shape)[:, :tb.slot.cols] = arr
            mem.htod(tb.buf.ptr, st.ptr, tb.slot.rows * tb.ld * tb.np_dtype.itemsize, h)

    def _poison(self, h) -> None:
        """debug: NaN into everything the kernel is supposed to write, so unwritten reads show."""
        for slot, tb in self._tensors.items():
            if tb.slot.kind != "input":
                mem.memset32(tb.buf.ptr, tb.poison, tb.buf.nbytes // 4, h)

    def _poison_by_copy(self, h) -> None:
        """_poison for a resident kernel's request: copies from pinned NaN words, since a
        memset may run as a kernel, which would wait for the resident one to leave."""
        need = max((tb.buf.nbytes for tb in self._tensors.values() if tb.slot.kind != "input"),
                   default=0)
        if need == 0:
            return
        if self._poison_src is None or self._poison_src[0].nbytes < need:
            if self._poison_src is not None:
                for buf in self._poison_src:
                    self._memory.free(buf)
            words = sorted(set(dtypes.POISON_WORD.values()) | {0})
            self._poison_src = tuple(self._memory.pinned(need, "poison (host)") for _ in words)
            for buf, word in zip(self._poison_src, words):
                buf.array(np.uint32, (need // 4,))[:] = word
            self._poison_words = {w: i for i, w in enumerate(words)}
        for tb in self._tensors.values():
            if tb.slot.kind != "input":
                src = self._poison_src[self._poison_words[tb.poison]]
                mem.htod(tb.buf.ptr, src.ptr, tb.buf.nbytes, h)

    def _binding(self, external: dict, h) -> _Binding | None:
        """The tensor table for these caller-owned tensors (None: megak's own). A new one is
        written into a free slot of the preallocated tables and uploaded on `h` (captured
        along with the launch when `h` is capturing)."""
        if not external:
            return None
        key = tuple(sorted((slot, arr.ptr, arr.row_stride()) for slot, arr in external.items()))
        b = self._bindings.pop(key, None)
        if b is None:
            # a new set of addresses: its maps are encoded now, once (host-only driver calls,
            # harmless during a capture); slots not bound here keep megak's maps
            image = self._table_image.copy()
            table = image[:max(self._n_tensors, 1) * abi.TENSOR_DTYPE.itemsize].view(
                abi.TENSOR_DTYPE)
            for slot, arr in external.items():
                table[slot]["ptr"] = arr.ptr
                table[slot]["ld"] = arr.row_stride()
            tensor_maps.write_maps(image, self._n_tensors, table,
                                   {s: b for s, b in self._map_boxes.items() if s in external})
            b = _Binding(key, self._binding_slot(h), 0)
            b.ready = tensor_maps.ready_view(image, self._n_tensors).copy()
            b.table_ptr = self._binding_dev.ptr + b.index * self._table_bytes
            self._binding_host.array(np.uint8, (MAX_BINDINGS * self._table_bytes,))[
                b.index * self._table_bytes:(b.index + 1) * self._table_bytes] = image
        self._bindings[key] = b            # most recently used last
        if not b.uploaded:
            capturing = self._capturing(h)
            mem.htod(b.table_ptr, self._binding_host.ptr + b.index * self._table_bytes,
                     self._table_bytes, h)
            b.uploaded = not capturing
            b.captured |= capturing
        return b

    def _binding_slot(self, h) -> int:
        if self._free_binding_slots:
            return self._free_binding_slots.pop()
        for key, b in self._bindings.items():     # least recently used first
            if not b.captured and self._host.done(b.last_ticket):
                del self._bindings[key]
                b.live = False
                return b.index
        if self._capturing(h):
            raise GraphError(f"more than {MAX_BINDINGS} distinct sets of tensors in use while "
                             f"a CUDA graph is being captured; reuse tensors, or run once "
                             f"before capturing")
        self._wait_stream("freeing a tensor table", h)
        for key, b in self._bindings.items():
            if not b.captured and self._host.done(b.last_ticket):
                del self._bindings[key]
                b.live = False
                return b.index
        raise GraphError(f"more than {MAX_BINDINGS} distinct sets of tensors are held by "
                         f"captured CUDA graphs")

    def _capturing(self, h) -> bool:
        drv = _bindings()
        status = check(drv.cuStreamIsCapturing(h), "cuStreamIsCapturing")
        return int(status) != int(drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)

    def _launch(self, binding: _Binding | None, h, trace: bool, graph: bool = False) -> int:
        """The cooperative launch itself: co-residency of all blocks is guaranteed or it fails.
        With `graph`, a replay of the same launch as a graph's kernel node where one could be
        built (graph_launch.py)."""
        self._ticket = (self._ticket + 1) & 0xFFFFFFFF or 1
        self._arg_ptrs[1] = binding.table_ptr if binding is not None \
            else self._dev_buf["tensors"].ptr
        self._arg_ticket[0] = self._ticket
        func = self._function_for(binding, trace)
        ret = self._graph_launch.launch(func, h) if graph else None
        if ret is None:
            ret = self._launch_kernel(func, self._grid, 1, 1, abi.BLOCK_THREADS, 1, 1,
                                      self.smem_bytes, h, self._argv_addr)
            self.last_launch = "direct"
        else:
            self.last_launch = "graph"
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) != 0:
            how = "cooperative launch" if self.last_launch == "direct" else "graph replay"
            raise MegakernelError(f"cuda: {how} of the megakernel failed "
                                  f"(grid {self.plan.n_sm}, block {abi.BLOCK_THREADS}, dynamic "
                                  f"smem {self.smem_bytes:,} B): {getattr(err, 'name', err)}")
        if binding is not None:
            binding.last_ticket = self._ticket
        return self._ticket

    def _raise_pending(self) -> None:
        """Raise the error the device holds for an earlier run, once."""
        if not self._host.error_pending():
            return
        record, states, ticket, missed = self._host.take_error()
        more = f" ({missed - 1} more run(s) failed since)" if missed > 1 else ""
        self.last_status = record
        if not states:
            raise MegakernelError(f"cuda: {missed} run(s) failed and their record was "
                                  f"overwritten before it was read{more}", record, [])
        raise_for_status(record, states, self.plan.op_labels, self.plan.instrs,
                         self.plan.queue_start, backend="cuda" + more)

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

    def _wait_stream(self, what: str, h=None) -> None:
        """Wait for a stream (the executor's by default), bounded by the host watchdog; raise
        every CUDA error."""
        h = self._h if h is None else h
        limit = self.host_timeout_s
        deadline = time.monotonic() + limit if math.isfinite(limit) else math.inf
        try:
            done = self._poll(h, deadline)
        except CudaError as exc:
            dead = " The CUDA context is now unusable; restart the process." \
                if exc.error_name in _STICKY else ""
            raise MegakernelError(f"cuda: {exc} while {what}.{dead}") from exc
        if not done:
            self._watchdog(what, limit, lambda t: self._poll(h, t))

    def _wait_ticket(self, ticket: int, h, what: str) -> None:
        """Spin on the mapped host view until the device has finished `ticket`: the kernel's
        last block raises ticket_done after a system-scope fence, so no stream sync is needed
        (a torch or CUDA-graph user orders later work by the stream anyway). Every millisecond
        the stream is queried too, so a CUDA error is raised rather than waited out."""
        host = self._host
        if self.done_soon(ticket):   # a short run ends here
            return
        drv = _bindings()
        not_ready = int(drv.CUresult.CUDA_ERROR_NOT_READY)

        def query() -> None:
            ret = drv.cuStreamQuery(h)
            err = int(ret[0] if isinstance(ret, tuple) else ret)
            if err == 0 and not host.done(ticket) and \
                    not self._until(lambda: host.done(ticket), time.monotonic() + 0.1):
                # the stream is idle and the ticket is not in: the launch never ran (a
                # capture that was never replayed) or its last block could not report
                raise MegakernelError(f"cuda: the stream finished without the megakernel "
                                      f"reporting launch {ticket} while {what} (was it "
                                      f"captured in a CUDA graph that has not run?)")
            if err not in (0, not_ready):
                try:
                    check(ret, "cuStreamQuery")
                except CudaError as exc:
                    dead = ""
                    if exc.error_name in _STICKY:
                        self._state["dead"] = str(exc)
                        dead = " The CUDA context is now unusable; restart the process."
                    raise MegakernelError(f"cuda: {exc} while {what}.{dead}") from exc
        self.spin_until(lambda: host.done(ticket), query, lambda: self._stream_idle(h), what)

    def spin_until(self, done, every_ms, ended, what: str) -> None:
        """Spin until `done()`: flat out for the first _SPIN_S, then with growing naps;
        `every_ms()` each millisecond (it raises what it finds wrong); past the host watchdog
        the abort flag goes up (`_watchdog`) and `ended()` says when the run has stopped."""
        limit = self.host_timeout_s
        start = time.monotonic()
        deadline = start + limit if math.isfinite(limit) else math.inf
        next_query = start + 1e-3
        nap = 5e-5
        while not done():
            now = time.monotonic()
            if now >= next_query:
                next_query = now + 1e-3
                every_ms()
            if now >= deadline:
                self._watchdog(what, limit, lambda t: self._until(
                    lambda: done() or ended(), t))
                return
            if now - start > _SPIN_S:
                time.sleep(min(nap, max(deadline - now, 0.0)))
                nap = min(nap * 2, _MAX_NAP_S)

    def _stream_idle(self, h) -> bool:
        ret = _bindings().cuStreamQuery(h)
        return int(ret[0] if isinstance(ret, tuple) else ret) == 0

    @staticmethod
    def _until(cond, deadline: float) -> bool:
        while not cond():
            if time.monotonic() >= deadline:
                return False
            time.sleep(1e-4)
        return True

    def _watchdog(self, what: str, limit: float, stopped_by) -> None:
        """The device ignored its own deadlines. Raise its abort flag through the copy engine
        (the SMs are all taken) and give the blocks a moment to see it; `stopped_by(deadline)`
        says whether the run has ended."""
        b = self._dev_buf
        abort_offset = abi.STATUS_DTYPE.fields["abort"][1]
        try:
            mem.htod(b["status"].ptr + abort_offset, self._abort_word.ptr, 4, self._ctl_h)
            stopped = stopped_by(time.monotonic() + self._timeout_s + _ABORT_GRACE_S)
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
        record, states = {}, []
        if self._host.error_pending():
            record, states, _, _ = self._host.take_error()
        raise MegakernelHang(f"cuda: {what} took longer than the host watchdog ({limit:g} s) "
                             f"although every device wait has a {self._timeout_s:g} s deadline; "
                             f"the run was stopped through the abort flag", record, states)

    def _mark_broken(self, reason: str) -> None:
        # Work may still be running on the device: never free its memory (cuMemFree would
        # wait for it, i.e. forever). Leaking is the lesser evil; the process must restart.
        self._state["broken"] = reason
        if self._memory is not None:
            self._memory.abandon()

    def _launch_streams(self) -> list:
        """The executor's stream, and every other stream a launch not yet finished went to
        (a caller's torch or cupy stream)."""
        busy = {id(h): h for t, h in self._stream_of.items()
                if h is not self._h and not self._host.done(t)}
        return [self._h, *busy.values()]

    def _drain_quietly(self, h=None) -> None:
        """After a failure while enqueuing: let queued copies finish before staging is reused."""
        try:
            self._poll(self._h if h is None else h,
                       time.monotonic() + min(self.host_timeout_s, 30.0))
        except Exception:
            pass

    def _shutdown_now(self) -> None:
        # Nothing may read the freed memory afterwards: the bound calls' tensor tables go (a
        # bound call of the closed program takes the checked path, which raises "closed"),
        # and the host view is read from a host copy (done() and check() of a closed
        # executor), one that counts every launch finished: freeing device memory waits for
        # the work that uses it.
        for b in self._bindings.values():
            b.live = False
        self._bindings = {}
        if self._finalizer is not None:
            if self._finalizer.alive and not self._state["broken"] and not self._state["dead"]:
                for h in self._launch_streams():   # every launch in flight ends first
                    self._drain_quietly(h)
            if self._finalizer.alive:
                self._host = self._host.detached(self._ticket)
            self._finalizer()
        else:  # failed during construction, before the finalizer was armed
            _shutdown(self._state, self._memory, self._streams)
            self._memory = None
            self._streams = []
        self._staging = {}
        self._tensors = {}
        self._trace_bufs = None
        self._variants = {}   # unloads the modules once nothing else holds them
