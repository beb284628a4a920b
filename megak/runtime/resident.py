"""The host side of the resident megakernel (megakernel.cu: megakernel_resident, mk_relay).

One cooperative launch stays on the GPU and serves requests the host writes into a ring of
mapped pinned memory; each request is one invocation of a program (its parameter block, a
tensor table and the program's ticket), reported through that program's own host view as a
launch would be. The kernel leaves on a close request, after ``idle_s`` without a request,
after a failed request, or when a request outlives the relay's deadline; it writes why, and
the first request it did not serve, into the resident view.

Host protocol (the device's half, and the ordering argument, are in megakernel.cu):
  - post request s: wait until ring slot s % MK_RING_SLOTS is free (the kernel has taken
    request s - MK_RING_SLOTS), write params, tensors, queue_start, run_state (each tagged
    with s & 0xffff in its top 16 bits) and n_sm (tagged in bits 16-31), then the word
    (ticket, seq = s) last: the relay takes the entry only when all six words name s;
  - ``kick``: when the current launch has left (view.left == its generation): after an idle
    exit with requests still unserved, launch again from view.next; after a failure, a lost
    request or a close, stop: requests from view.next on never run and say so;
  - a launch first resets the device state (go = closed = first - 1, nothing failed, every
    block's seen = first - 1) on the kernel's stream, so it is ordered after the previous
    launch has ended;
  - ``widen``: the kernel runs a build of the op bodies of the programs it serves (instr.h,
    MK_BODIES). A program with others is served by a wider build: compiled while the old one
    runs, then a close request makes the old one leave after the requests before it, then
    the new build is loaded (a module's load waits for a kernel that holds every SM) and
    the next request launches it (from the request after the close).
megak/runtime/resident_model.py runs the same protocol against a model of the device.
"""
from __future__ import annotations

import ctypes
import math
import time

import numpy as np

from .. import abi
from ..errors import MegakernelError, MegakernelHang
from . import memory as mem
from .driver import CudaError, _bindings, check, device_info

RING_SLOTS = abi.RESIDENT["MK_RING_SLOTS"]
TAG_SHIFT = abi.RESIDENT["MK_REQUEST_TAG_SHIFT"]
N_SM_SHIFT = abi.RESIDENT["MK_REQUEST_N_SM_SHIFT"]
MIRROR_SLOTS = abi.RESIDENT["MK_MIRROR_SLOTS"]
REASONS = {abi.RESIDENT["MK_RESIDENT_CLOSED"]: "closed",
           abi.RESIDENT["MK_RESIDENT_IDLE"]: "idle",
           abi.RESIDENT["MK_RESIDENT_FAILED"]: "failed",
           abi.RESIDENT["MK_RESIDENT_LOST"]: "lost"}
IDLE = abi.RESIDENT["MK_RESIDENT_IDLE"]
_MAX_NS = 1 << 62        # "no deadline" on the device, far from u64 overflow when summed
_SPIN_S = 0.010
_MAX_NAP_S = 0.001
_U32 = 0xFFFFFFFF

# word offsets of the structures, for one-index reads and writes of mapped memory
_REQ_WORDS = abi.REQUEST_DTYPE.itemsize // 4
_REQ = {name: abi.REQUEST_DTYPE.fields[name][1] // 4 for name in abi.REQUEST_DTYPE.names}
_VIEW = {name: abi.RESIDENT_VIEW_DTYPE.fields[name][1] // 4
         for name in abi.RESIDENT_VIEW_DTYPE.names}
# a request's 8-byte words, from its slot's first (post writes them on every request)
_PARAMS, _TENSORS, _QUEUE_START, _RUN_STATE, _N_SM, _TICKET = (
    _REQ[name] // 2 for name in ("params", "tensors", "queue_start", "run_state", "n_sm",
                                 "ticket"))


def reached(value: int, s: int) -> bool:
    """`value` has reached request number `s` (u32, wrap-safe, like the device's test)."""
    return ((value - s) & _U32) < 0x80000000


def nanoseconds(seconds: float) -> int:
    return _MAX_NS if math.isinf(seconds) else min(int(seconds * 1e9), _MAX_NS)


class ResidentKernel:
    """The resident megakernel on one device: its launch, the ring and the view.

    ``module_of``: the executor that compiles and loads the resident builds
    (``resident_function``); ``bodies``: the op bodies (instr.h, MK_BODIES) of the programs
    it serves, widened by ``widen``. ``idle_s``: the kernel leaves after this long with no
    request. ``wait_s``: the longest one request may take before the relay gives up.
    Not thread-safe by itself: `megak.Resident` holds a lock around it.
    """

    def __init__(self, module_of, bodies: int, *, idle_s: float, wait_s: float,
                 device: int = 0):
        from cuda.core import Device
        self._dev = Device(device)
        self._dev.set_current()
        self.ordinal = device
        info = device_info(device)
        self.grid = int(info["sm_count"])
        self.smem_bytes = int(module_of.kernel_info["max_dynamic_smem"])
        self._module_of = module_of
        self.bodies = bodies
        self._func, self._code = module_of.resident_function(self.smem_bytes, bodies)
        self.idle_s, self.wait_s = idle_s, wait_s
        self._memory = mem.Memory(device)
        m = self._memory
        try:
            self._ring_buf = m.mapped(RING_SLOTS * abi.REQUEST_DTYPE.itemsize, "request ring")
            self._view_buf = m.mapped(abi.RESIDENT_VIEW_DTYPE.itemsize, "resident view")
            state_bytes = abi.RESIDENT_STATE_DTYPE.itemsize
            self._state = m.device(state_bytes, "resident state")
            self._seen = m.device(self.grid * 4, "resident seen")
            self._init = m.pinned(state_bytes + self.grid * 4, "resident state (host)")
            self._stream = self._dev.create_stream()
        except BaseException:
            m.close()
            raise
        self._h = self._stream.handle
        self._ring64 = memoryview(self._ring_buf.array(np.uint8, (self._ring_buf.nbytes,))).cast("Q")
        self._view = memoryview(self._view_buf.array(np.uint8, (self._view_buf.nbytes,))).cast("I")
        self._args = (ctypes.c_ubyte * abi.RESIDENT_ARGS_DTYPE.itemsize)()
        self._argv = (ctypes.c_void_p * 1)(ctypes.addressof(self._args))
        self.next = 1              # the number the next request gets
        self.resume = 1            # while no launch runs: the first request not yet served
        self.generation = 0
        self.running = False
        self.launches = 0
        self.stopped: tuple[str, int] | None = None   # (why, first request never run)
        self.broken: str | None = None

    # -- requests ---------------------------------------------------------------------------------
    def post(self, program, tensors: int, ticket: int, deadline: float) -> int:
        """Write one request into the ring; returns its number. ``program``: the words that
        name the program, (params, queue_start, run_state, n_sm) device addresses and its
        SM count (Executor.prepare_request), or None: leave. Any thread may call: it writes
        mapped memory only, and what calls the driver (kick's launch, the stream check)
        makes the context current itself."""
        s = self.next
        while not self._slot_free(s):
            self.kick()
            if self.stopped is not None:
                break   # nothing will take it; the caller reports the stop
            self._check_stream("waiting for a free request slot")
            if time.monotonic() > deadline:
                raise MegakernelHang(f"cuda: the resident kernel took no request for the host "
                                     f"watchdog's limit; {RING_SLOTS} requests are waiting")
            time.sleep(5e-5)
        params, queue_start, run_state, n_sm = program if program is not None else (0, 0, 0, 0)
        if (params | tensors | queue_start | run_state) >> TAG_SHIFT:
            raise MegakernelError(f"cuda: a device address above 2^{TAG_SHIFT} "
                                  f"({max(params, tensors, queue_start, run_state):#x}) cannot "
                                  f"be posted: the ring words carry their request number there")
        if n_sm >> N_SM_SHIFT:
            raise MegakernelError(f"cuda: a program on {n_sm} SMs cannot be posted: the ring's "
                                  f"n_sm word carries its request number above bit {N_SM_SHIFT}")
        at = (s % RING_SLOTS) * _REQ_WORDS // 2
        tag = (s & 0xFFFF) << TAG_SHIFT                 # each word names its request
        ring = self._ring64
        ring[at + _PARAMS] = params | tag      # first: the relay's lane 0 reads it with acquire
        ring[at + _TENSORS] = tensors | tag
        ring[at + _QUEUE_START] = queue_start | tag
        ring[at + _RUN_STATE] = run_state | tag
        ring[at + _N_SM] = n_sm | (s & 0xFFFF) << N_SM_SHIFT
        ring[at + _TICKET] = ticket | s << 32   # last: (ticket, seq)
        self.next = (s + 1) & _U32
        self.kick()
        return s

    def _slot_free(self, s: int) -> bool:
        if self.running:
            return reached(self._view[_VIEW["taken"]], (s - RING_SLOTS) & _U32)
        # no kernel: only requests from `resume` on are waiting in the ring
        return reached(self.resume, (s - RING_SLOTS + 1) & _U32)

    def kick(self) -> None:
        """Follow the kernel: notice that it left, and launch it again after an idle exit
        when requests wait in the ring."""
        if self.running and self._view[_VIEW["left"]] == self.generation:
            self.running = False
            reason, nxt = self._view[_VIEW["reason"]], self._view[_VIEW["next"]]
            self.resume = nxt
            if reason != IDLE:
                self.stopped = (REASONS.get(reason, f"reason {reason}"), nxt)
        if not self.running and self.stopped is None and self.resume != self.next:
            self._launch(self.resume)

    def widen(self, bodies: int, limit_s: float) -> None:
        """Serve programs with the op bodies `bodies` too: from the next request on, a build
        of the union (see the module's protocol). The running kernel keeps serving while the
        new build compiles; it then leaves at a close request, after the requests before it,
        and only then is the new build loaded: a module's load waits for a kernel that holds
        every SM (benchmarks/ANALYSIS.md, 2026-12-03)."""
        union = self.bodies | bodies
        if union == self.bodies:
            return
        self._module_of.compile_resident(union)   # NVRTC only: the kernel keeps serving
        # notice an idle exit first: a close posted to a kernel that has left would launch
        # the narrower build once more only to serve that close
        self.kick()
        if self.running and self.stopped is None:
            close = self.post(None, 0, 0, time.monotonic() + limit_s)
            if not self.wait_left(limit_s):
                self.broken = (f"the resident megakernel did not leave within {limit_s:g} s "
                               f"of the close request before a wider build")
                raise MegakernelHang(f"cuda: {self.broken}; the GPU stays busy until it does")
            if self.stopped == ("closed", close):   # our close, not a failure before it
                self.stopped = None
                self.resume = (close + 1) & _U32
        self._func, self._code = self._module_of.resident_function(self.smem_bytes, union)
        self.bodies = union

    def served(self, s: int) -> bool:
        """False once request `s` can no longer run (the kernel stopped before it)."""
        if self.stopped is None:
            return True
        return not reached(s, self.stopped[1])

    def _launch(self, first: int) -> None:
        """Launch the resident kernel to serve requests from `first` on."""
        self._memory.make_current()   # any thread may call (Memory.make_current)
        st = np.zeros(1, dtype=abi.RESIDENT_STATE_DTYPE)
        st[0]["go"] = st[0]["closed"] = (first - 1) & _U32
        init = self._init.array(np.uint8, (self._init.nbytes,))
        n = st.nbytes
        init[:n] = st.view(np.uint8)
        init[n:].view(np.uint32)[:] = (first - 1) & _U32
        mem.htod(self._state.ptr, self._init.ptr, n, self._h)
        mem.htod(self._seen.ptr, self._init.ptr + n, self.grid * 4, self._h)
        self._view[_VIEW["taken"]] = (first - 1) & _U32
        self.generation = (self.generation + 1) & _U32 or 1
        args = np.frombuffer(self._args, dtype=abi.RESIDENT_ARGS_DTYPE, count=1)
        args[0]["ring"] = self._ring_buf.device_ptr
        args[0]["view"] = self._view_buf.device_ptr
        args[0]["state"] = self._state.ptr
        args[0]["seen"] = self._seen.ptr
        args[0]["idle_ns"] = nanoseconds(self.idle_s)
        args[0]["wait_ns"] = nanoseconds(self.wait_s)
        args[0]["first"] = first
        args[0]["generation"] = self.generation
        ret = _bindings().cuLaunchCooperativeKernel(
            self._func, self.grid, 1, 1, abi.BLOCK_THREADS, 1, 1, self.smem_bytes, self._h,
            ctypes.addressof(self._argv))
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) != 0:
            raise MegakernelError(f"cuda: cooperative launch of the resident megakernel failed "
                                  f"(grid {self.grid}, dynamic smem {self.smem_bytes:,} B): "
                                  f"{getattr(err, 'name', err)}")
        self.running = True
        self.launches += 1

    # -- waiting ------------------------------------------------------------------------------------
    def _check_stream(self, what: str) -> None:
        """Raise a CUDA error of the kernel's stream (a crashed kernel never writes `left`)."""
        self._memory.make_current()   # any thread may call (Memory.make_current)
        drv = _bindings()
        ret = drv.cuStreamQuery(self._h)
        err = int(ret[0] if isinstance(ret, tuple) else ret)
        if err in (0, int(drv.CUresult.CUDA_ERROR_NOT_READY)):
            if err == 0 and self.running and self._view[_VIEW["left"]] != self.generation:
                self.kick()
                if self.running and self._view[_VIEW["left"]] != self.generation:
                    self.running = False
                    self.stopped = ("ended without saying so", self.resume)
            return
        try:
            check(ret, "cuStreamQuery")
        except CudaError as exc:
            self.stopped = (f"CUDA error {exc.error_name}", self.resume)
            raise MegakernelError(f"cuda: {exc} while {what}") from exc

    def wait_left(self, limit_s: float) -> bool:
        """Wait until the current launch has left and its stream is idle (bounded)."""
        self._memory.make_current()   # any thread may call (Memory.make_current)
        deadline = time.monotonic() + limit_s
        nap = 5e-5
        while True:
            self.kick()
            ret = _bindings().cuStreamQuery(self._h)
            err = int(ret[0] if isinstance(ret, tuple) else ret)
            if not self.running and err == 0:
                return True
            if err not in (0, int(_bindings().CUresult.CUDA_ERROR_NOT_READY)):
                return True      # the stream failed: nothing runs on it any more
            if time.monotonic() > deadline:
                return False
            time.sleep(nap)
            nap = min(nap * 2, _MAX_NAP_S)

    def close(self, limit_s: float) -> None:
        """Ask the kernel to leave, wait for it (bounded), free what it used."""
        try:
            if self.running and self.broken is None:
                self.post(None, 0, 0, time.monotonic() + limit_s)
            if not self.wait_left(limit_s):
                self.broken = ("the resident megakernel did not leave within "
                               f"{limit_s:g} s of the close request")
        finally:
            if self.broken is not None:
                # it may still run: freeing its memory would block forever
                self._memory.abandon()
            else:
                self._memory.close()
                try:
                    self._stream.close()
                except Exception:
                    pass
        if self.broken is not None:
            raise MegakernelHang(f"cuda: {self.broken}; the GPU stays busy until it does")
