"""Memory the CUDA backend owns: device buffers, managed buffers, pinned host staging.

Why raw driver calls rather than cuda.core memory resources: the executor needs exact,
synchronous ownership (free on close, in a known context, also after a failed run), 256-B
aligned bases that `cuMemAlloc` guarantees, and an API that is the same on every cuda-bindings
13.x. Every call goes through `driver.check`.

One `Memory` object owns all allocations of one executor::

    Memory
     |-- device(n)   cuMemAlloc                  tensors, queues, counters, status, params
     |-- managed(n)  cuMemAllocManaged (GLOBAL)   tensors when managed=True; guarded by
     |                                            cuMemGetInfo so the GPU is never oversubscribed
     |-- pinned(n)   cuMemHostAlloc (PORTABLE)    staging for async copies; numpy views on top
     '-- mapped(n)   a numpy array, cuMemHostRegister (DEVICEMAP): what a kernel and the host
                     both read and write; the memory is Python's, so a view of it stays valid
                     after close() (the executor's host view, which done() may read while
                     another thread closes; the resident kernel's request ring and view)

`close()` (or garbage collection, through `weakref.finalize`) frees everything with the
owning context pushed, then releases the retained primary context.
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np

from ..errors import MegakernelError, fmt_bytes
from .driver import CudaError, _bindings, check, mem_info, require_gpu, result_ok

DEVICE_ALIGN = 256                 # cuMemAlloc's base alignment; tensor bases rely on it
MANAGED_MARGIN_MIN = 256 << 20     # never hand the last 256 MiB (or 2 %) to managed memory
MANAGED_MARGIN_FRACTION = 0.02


def managed_margin(total_bytes: int) -> int:
    """Free memory megak leaves untouched when it asks for managed memory."""
    return max(MANAGED_MARGIN_MIN, int(total_bytes * MANAGED_MARGIN_FRACTION))


def host_array(ptr: int, dtype, shape) -> np.ndarray:
    """A numpy view of host-accessible memory at `ptr` (pinned or managed).

    The view does not own the memory: it must not outlive the allocation. megak only uses
    such views internally and hands users copies.
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    raw = (ctypes.c_ubyte * nbytes).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


class DeviceBuffer:
    """Device (or managed) memory: ``ptr`` is a device address; ``nbytes`` what was asked."""
    __slots__ = ("ptr", "nbytes", "managed", "name", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, managed: bool, name: str):
        self.ptr = ptr
        self.nbytes = nbytes
        self.managed = managed
        self.name = name

    def host_view(self, dtype, shape) -> np.ndarray:
        """Host view of a managed buffer (valid while the buffer lives; prefetch first)."""
        if not self.managed:
            raise MegakernelError(f"buffer {self.name!r} is device memory: no host view")
        return host_array(self.ptr, dtype, shape)

    def __repr__(self) -> str:
        kind = "managed" if self.managed else "device"
        return f"DeviceBuffer({self.name!r}, {kind}, {self.nbytes} B at {self.ptr:#x})"


class PinnedBuffer:
    """Page-locked host memory, so that async copies really are asynchronous."""
    __slots__ = ("ptr", "nbytes", "name", "__weakref__")

    def __init__(self, ptr: int, nbytes: int, name: str):
        self.ptr = ptr
        self.nbytes = nbytes
        self.name = name

    def _view_bytes(self, dtype: np.dtype, shape) -> int:
        need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if need > self.nbytes:
            raise MegakernelError(f"{type(self).__name__} {self.name!r}: a {shape} {dtype} view "
                                  f"needs {need} B, the buffer has {self.nbytes} B")
        return need

    def array(self, dtype, shape) -> np.ndarray:
        dtype = np.dtype(dtype)
        self._view_bytes(dtype, shape)
        return host_array(self.ptr, dtype, shape)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.nbytes} B at {self.ptr:#x})"


class MappedBuffer(PinnedBuffer):
    """Mapped host memory that Python owns: ``ptr`` for the host, ``device_ptr`` for kernels.
    ``owner`` is the numpy array registered with the driver, and every view ``array()`` hands
    out is a view of it, so it lives as long as any of them. Once the Memory closes the
    registration is gone (the device no longer writes it) but a view still reads the bytes it
    last held, never freed memory."""
    __slots__ = ("device_ptr", "owner")

    def __init__(self, owner: np.ndarray, nbytes: int, name: str, device_ptr: int):
        super().__init__(int(owner.ctypes.data), nbytes, name)
        self.device_ptr = device_ptr
        self.owner = owner

    def array(self, dtype, shape) -> np.ndarray:
        dtype = np.dtype(dtype)
        need = self._view_bytes(dtype, shape)
        return self.owner[:need].view(dtype).reshape(shape)


_HOST_PAGE = 4096                  # cuMemHostRegister's unit: whole pages, page-aligned


def _release(drv, live: dict, owners: dict, ctx, cu_dev) -> list[str]:
    """Free every live allocation with `ctx` pushed (unregister the registered ones, whose
    numpy owners `owners` keeps alive until then); release the retained primary context.

    Module-level (not a method) so the finalizer holds no reference to the Memory object;
    `drv` is the bindings module the memory came from. Returns the failures instead of
    raising: it also runs at interpreter exit.
    """
    failures = []
    pushed = result_ok(drv.cuCtxPushCurrent(ctx))
    for ptr, (kind, name, _size) in list(live.items()):
        if kind == "registered":
            ret = drv.cuMemHostUnregister(ptr)
        else:
            ret = drv.cuMemFreeHost(ptr) if kind == "pinned" else drv.cuMemFree(ptr)
        if not result_ok(ret):
            err = ret[0] if isinstance(ret, tuple) else ret
            failures.append(f"{kind} buffer {name!r} at {ptr:#x}: {getattr(err, 'name', err)}")
    live.clear()
    owners.clear()
    if pushed:
        drv.cuCtxPopCurrent()
    drv.cuDevicePrimaryCtxRelease(cu_dev)
    return failures


class Memory:
    """Owner of every allocation of one executor on device `ordinal`.

    Allocation happens in the current context, which must be the device's primary context
    (cuda.core ``Device(ordinal).set_current()`` makes it so); that context is retained here
    until everything is freed.
    """

    def __init__(self, ordinal: int = 0):
        require_gpu()
        self._drv = drv = _bindings()
        self.ordinal = ordinal
        self._cu_dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        self._ctx = check(drv.cuDevicePrimaryCtxRetain(self._cu_dev), "cuDevicePrimaryCtxRetain")
        self._live: dict[int, tuple[str, str, int]] = {}  # ptr -> (kind, name, bytes)
        self._owners: dict[int, np.ndarray] = {}          # ptr -> a registered array
        # armed right after the retain, so that nothing below can leak the context
        self._finalizer = weakref.finalize(self, _release, drv, self._live, self._owners,
                                           self._ctx,
                                           self._cu_dev)
        self._ctx_int = int(self._ctx)
        current = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) == 0:  # allocations and cuMemGetInfo need a current context
            check(drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
        # Prefetching needs concurrent managed access; without it managed memory still works
        # (the driver migrates on launch), prefetch just becomes a no-op.
        self.can_prefetch = bool(check(drv.cuDeviceGetAttribute(attr, self._cu_dev),
                                       "cuDeviceGetAttribute(CONCURRENT_MANAGED_ACCESS)"))

    def make_current(self) -> None:
        """Make the device's primary context current in the calling thread. Driver calls act on
        the calling thread's current context: a thread the caller started has none, and
        another device's may be current there. torch and cupy work in the same primary
        contexts, so this changes nothing they rely on. One driver call when it is current."""
        if int(self._drv.cuCtxGetCurrent()[1]) != self._ctx_int:
            check(self._drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    # -- bookkeeping ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _check_open(self) -> None:
        if self.closed:
            raise MegakernelError("this Memory is closed")

    def live_bytes(self) -> dict[str, int]:
        """Bytes currently allocated, per kind (for tests and leak checks)."""
        out = {"device": 0, "managed": 0, "pinned": 0}
        for kind, _name, size in self._live.values():
            out["pinned" if kind == "registered" else kind] += size
        return out

    @property
    def n_live(self) -> int:
        return len(self._live)

    # -- allocation -------------------------------------------------------------------------
    def check_fits(self, nbytes: int, *, managed: bool, what: str = "") -> None:
        """Refuse, before allocating, a request larger than the device's free memory.

        For managed memory the bar is free minus a safety margin: oversubscribing managed
        memory on a device that is also running other work can stall the GPU instead of
        failing cleanly. For device memory the driver would fail cleanly; checking here just
        gives the clearer message before anything was allocated.
        """
        free, total = mem_info()
        margin = managed_margin(total) if managed else 0
        if nbytes > free - margin:
            kind = "managed" if managed else "device"
            extra = f" minus a safety margin of {fmt_bytes(margin)}" if managed else ""
            raise MegakernelError(
                f"not enough GPU memory{' for ' + what if what else ''}: asked for "
                f"{fmt_bytes(nbytes)} of {kind} memory, the device has {fmt_bytes(free)} free "
                f"(of {fmt_bytes(total)}){extra}")

    def device(self, nbytes: int, name: str = "") -> DeviceBuffer:
        self._check_open()
        drv = self._drv
        size = max(int(nbytes), 1)
        try:
            ptr = int(check(drv.cuMemAlloc(size), "cuMemAlloc"))
        except CudaError as exc:
            if exc.error_name == "CUDA_ERROR_OUT_OF_MEMORY":
                free, total = mem_info()
                raise MegakernelError(
                    f"out of GPU memory allocating {name or 'a buffer'}: asked for "
                    f"{fmt_bytes(size)}, {fmt_bytes(free)} free of {fmt_bytes(total)}") from exc
            raise
        self._live[ptr] = ("device", name, size)
        if ptr % DEVICE_ALIGN:  # the driver documents 256-B alignment; the ABI depends on it
            self.free(DeviceBuffer(ptr, size, False, name))
            raise MegakernelError(f"cuMemAlloc returned {ptr:#x}, not {DEVICE_ALIGN}-B aligned")
        return DeviceBuffer(ptr, int(nbytes), False, name)

    def managed(self, nbytes: int, name: str = "") -> DeviceBuffer:
        """Managed memory (``CU_MEM_ATTACH_GLOBAL``), after the free-memory guard."""
        self._check_open()
        drv = self._drv
        size = max(int(nbytes), 1)
        self.check_fits(size, managed=True, what=name)
        flags = int(drv.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL)
        ptr = int(check(drv.cuMemAllocManaged(size, flags), "cuMemAllocManaged"))
        self._live[ptr] = ("managed", name, size)
        if ptr % DEVICE_ALIGN:
            self.free(DeviceBuffer(ptr, size, True, name))
            raise MegakernelError(f"cuMemAllocManaged returned {ptr:#x}, "
                                  f"not {DEVICE_ALIGN}-B aligned")
        return DeviceBuffer(ptr, int(nbytes), True, name)

    def pinned(self, nbytes: int, name: str = "") -> PinnedBuffer:
        """Pinned host memory, zero-filled (padding columns of staging stay deterministic)."""
        self._check_open()
        drv = self._drv
        size = max(int(nbytes), 1)
        ptr = int(check(drv.cuMemHostAlloc(size, drv.CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc"))
        self._live[ptr] = ("pinned", name, size)
        ctypes.memset(ptr, 0, size)
        return PinnedBuffer(ptr, int(nbytes), name)

    def mapped(self, nbytes: int, name: str = "") -> MappedBuffer:
        """Host memory the device reads and writes directly, zero-filled: what the kernel
        tells the host through it needs no copy and no stream sync. A numpy array, page-locked
        and mapped with cuMemHostRegister (DEVICEMAP): close() unregisters it, and its views
        stay readable."""
        self._check_open()
        drv = self._drv
        size = -(-max(int(nbytes), 1) // _HOST_PAGE) * _HOST_PAGE
        raw = np.zeros(size + _HOST_PAGE, dtype=np.uint8)
        skip = (-int(raw.ctypes.data)) % _HOST_PAGE
        owner = raw[skip:skip + size]
        ptr = int(owner.ctypes.data)
        flags = drv.CU_MEMHOSTREGISTER_PORTABLE | drv.CU_MEMHOSTREGISTER_DEVICEMAP
        check(drv.cuMemHostRegister(ptr, size, flags), "cuMemHostRegister(DEVICEMAP)")
        self._live[ptr] = ("registered", name, size)
        self._owners[ptr] = owner
        dev = int(check(drv.cuMemHostGetDevicePointer(ptr, 0), "cuMemHostGetDevicePointer"))
        return MappedBuffer(owner, int(nbytes), name, dev)

    def abandon(self) -> None:
        """Give up on freeing anything (work that uses it may still be running on a stuck
        device, and cuMemFree would wait for it). The memory leaks until the process exits."""
        self._finalizer.detach()

    def free(self, buf: DeviceBuffer | PinnedBuffer) -> None:
        """Free one allocation now (the caller guarantees no queued work still uses it)."""
        drv = self._drv
        entry = self._live.pop(buf.ptr, None)
        if entry is None:
            return
        if entry[0] == "registered":
            check(drv.cuMemHostUnregister(buf.ptr), "cuMemHostUnregister")
            self._owners.pop(buf.ptr, None)
        elif entry[0] == "pinned":
            check(drv.cuMemFreeHost(buf.ptr), "cuMemFreeHost")
        else:
            check(drv.cuMemFree(buf.ptr), "cuMemFree")

    def close(self) -> list[str]:
        """Free everything (idempotent). Returns the frees that failed (normally none; after a
        sticky device error the driver may refuse them, and there is nothing left to do)."""
        if not self._finalizer.alive:
            return []
        return self._finalizer() or []

    # -- transfers (stream-ordered) ---------------------------------------------------------
    def prefetch(self, buf: DeviceBuffer, to: str, stream) -> None:
        """Migrate a managed buffer to ``to`` = "device" or "host" on `stream` (a no-op for
        device memory or where the device cannot prefetch)."""
        if not buf.managed or not self.can_prefetch or buf.nbytes == 0:
            return
        prefetch_managed(buf.ptr, buf.nbytes, to, self.ordinal, stream)


# -- stream-ordered helpers (pointers are ints; `stream` is a CUstream or an int handle) -------

def _location(to: str, ordinal: int):
    drv = _bindings()
    loc = drv.CUmemLocation()
    if to == "device":
        loc.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        loc.id = ordinal
    elif to == "host":
        loc.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
        loc.id = 0  # ignored for HOST
    else:
        raise ValueError(f"prefetch destination must be 'device' or 'host', got {to!r}")
    return loc


def prefetch_managed(ptr: int, nbytes: int, to: str, ordinal: int, stream) -> None:
    """``cuMemPrefetchAsync`` with the CUDA 13 signature (devPtr, count, CUmemLocation,
    flags, hStream); on 12.x bindings the same call is spelled ``cuMemPrefetchAsync_v2``."""
    drv = _bindings()
    fn = drv.cuMemPrefetchAsync
    if "CUmemLocation" not in (fn.__doc__ or "").split("\n", 1)[0]:
        fn = getattr(drv, "cuMemPrefetchAsync_v2", fn)
    check(fn(ptr, nbytes, _location(to, ordinal), 0, stream), "cuMemPrefetchAsync")


def htod(dst: int, src: int, nbytes: int, stream) -> None:
    if nbytes:
        drv = _bindings()
        check(drv.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")


def dtoh(dst: int, src: int, nbytes: int, stream) -> None:
    if nbytes:
        drv = _bindings()
        check(drv.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")


def memset32(dst: int, value: int, nwords: int, stream) -> None:
    if nwords:
        drv = _bindings()
        check(drv.cuMemsetD32Async(dst, int(value) & 0xFFFFFFFF, nwords, stream),
              "cuMemsetD32Async")
