"""The CUDA driver as megak sees it: is a GPU usable, what is it, and checked driver calls.

Two rules shape this module:

* Detection never goes through cuda.core or cuda.bindings. On a machine without libcuda a
  stray lazy driver call (``ObjectCode.get_kernel()`` above all) can leave the process hung,
  so `gpu_usable()` asks libcuda itself through ctypes and answers False the moment the
  library is missing, `cuInit` fails or no device is visible.
* Every cuda.bindings call returns a ``(CUresult, ...)`` tuple and never raises; `check()`
  turns a failure into a `CudaError` (a `MegakernelError`) naming the call and the error, so
  no failed call goes unnoticed.
"""
from __future__ import annotations

import ctypes
import functools
import sys

from ..errors import MegakernelError

_CUDA_SUCCESS = 0

# Architectures whose feature-specific ("a") variant megak compiles for: wgmma/TMA on
# Hopper, tcgen05 on datacenter Blackwell. Anything else gets the portable sm_XY target.
_ARCH_SPECIFIC = {(9, 0), (10, 0)}


class CudaError(MegakernelError):
    """A CUDA driver call failed. ``call`` is the API name, ``code`` the CUresult value and
    ``error_name`` its name (e.g. ``CUDA_ERROR_OUT_OF_MEMORY``)."""

    def __init__(self, message: str, *, call: str = "", code: int = -1, error_name: str = ""):
        super().__init__(message)
        self.call = call
        self.code = code
        self.error_name = error_name


# -- detection -------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _detect() -> tuple[bool, str]:
    """(usable, reason). Only ctypes: nothing here can wedge the process without a driver."""
    if not sys.platform.startswith("linux"):
        return False, f"megak's CUDA backend supports Linux only (this is {sys.platform})"
    lib = None
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return False, "libcuda.so.1 not found: no NVIDIA driver on this machine"
    try:
        cu_init = lib.cuInit
        cu_init.argtypes = [ctypes.c_uint]
        cu_init.restype = ctypes.c_int
        rc = cu_init(0)
        if rc != _CUDA_SUCCESS:
            return False, f"cuInit(0) failed with CUresult {rc}"
        count = ctypes.c_int(0)
        get_count = lib.cuDeviceGetCount
        get_count.argtypes = [ctypes.POINTER(ctypes.c_int)]
        get_count.restype = ctypes.c_int
        rc = get_count(ctypes.byref(count))
        if rc != _CUDA_SUCCESS:
            return False, f"cuDeviceGetCount failed with CUresult {rc}"
    except AttributeError as exc:  # a libcuda without the entry points we need
        return False, f"libcuda lacks an entry point: {exc}"
    if count.value < 1:
        return False, "the NVIDIA driver sees no CUDA device"
    return True, f"{count.value} CUDA device(s)"


def gpu_usable() -> bool:
    """True when libcuda loads, ``cuInit(0)`` succeeds and at least one device exists.

    Cached for the life of the process. Never touches cuda.core / cuda.bindings, so it is
    safe (and fast) on machines with no driver at all.
    """
    return _detect()[0]


def gpu_unusable_reason() -> str:
    """Why `gpu_usable()` is False ("" when it is True), for skip and error messages."""
    ok, reason = _detect()
    return "" if ok else reason


def require_gpu() -> None:
    if not gpu_usable():
        raise MegakernelError(f"no usable CUDA GPU: {gpu_unusable_reason()} "
                              f"(the CPU simulator runs with backend='sim' / MEGAK_BACKEND=sim)")


# -- checked cuda.bindings calls -------------------------------------------------------------

def _bindings():
    # Imported lazily: importing the module is harmless without a driver, but keeping it out
    # of module scope keeps `import megak.runtime.driver` cheap for CPU-only users.
    from cuda.bindings import driver
    return driver


def error_name(err) -> str:
    """CUresult -> its enum name, without a driver call (works even when the driver is gone)."""
    drv = _bindings()
    try:
        return drv.CUresult(int(err)).name
    except (ValueError, TypeError):
        return f"CUresult {int(err)}"


def _error_string(err) -> str:
    if not gpu_usable():  # a driver call without a driver can wedge the process
        return ""
    drv = _bindings()
    try:
        rc, text = drv.cuGetErrorString(err)
        if int(rc) == _CUDA_SUCCESS and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # a description is a courtesy; never let it hide the real error
        pass
    return ""


def check(ret, call: str):
    """Check a cuda.bindings return value; return its payload.

    ``(CUDA_SUCCESS,)`` -> None, ``(CUDA_SUCCESS, x)`` -> x, ``(CUDA_SUCCESS, x, y)`` -> (x, y).
    Any other CUresult raises `CudaError` naming `call` and the error.
    """
    if isinstance(ret, tuple):
        err, rest = ret[0], ret[1:]
    else:
        err, rest = ret, ()
    if int(err) != _CUDA_SUCCESS:
        name = error_name(err)
        desc = _error_string(err)
        raise CudaError(f"{call} failed: {name}" + (f" ({desc})" if desc else ""),
                        call=call, code=int(err), error_name=name)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def result_ok(ret) -> bool:
    """True when a cuda.bindings return value carries CUDA_SUCCESS (for best-effort calls)."""
    err = ret[0] if isinstance(ret, tuple) else ret
    return int(err) == _CUDA_SUCCESS


# -- device description ------------------------------------------------------------------------

def arch_for(major: int, minor: int) -> str:
    """Compute capability -> the NVRTC arch megak compiles for (sm_90a on H100/H200)."""
    return f"sm_{major}{minor}" + ("a" if (major, minor) in _ARCH_SPECIFIC else "")


def device_attribute(attr_name: str, ordinal: int = 0) -> int:
    """One ``CU_DEVICE_ATTRIBUTE_*`` value (name without the prefix), checked."""
    require_gpu()
    drv = _bindings()
    attr = getattr(drv.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_" + attr_name)
    dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
    return int(check(drv.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr_name})"))


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of the current context's device (``cuMemGetInfo``)."""
    drv = _bindings()
    free, total = check(drv.cuMemGetInfo(), "cuMemGetInfo")
    return int(free), int(total)


def device_info(ordinal: int = 0) -> dict:
    """What megak needs to know about device `ordinal` (makes its primary context current).

    Keys: ordinal, name, sm_count, compute_capability (major, minor), arch, smem_optin,
    smem_per_block, smem_reserved, smem_per_sm, total_mem, free_mem, driver_version (e.g.
    13000), cooperative_launch, concurrent_managed_access, unified_addressing.
    """
    require_gpu()
    from cuda.core import Device
    drv = _bindings()
    dev = Device(ordinal)
    dev.set_current()  # cuMemGetInfo needs a current context
    props = dev.properties
    cc = dev.compute_capability
    major, minor = int(cc[0]), int(cc[1])
    cu_dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
    total = int(check(drv.cuDeviceTotalMem(cu_dev), "cuDeviceTotalMem"))
    free, _ = mem_info()
    return {
        "ordinal": ordinal,
        "name": dev.name,
        "sm_count": int(props.multiprocessor_count),
        "compute_capability": (major, minor),
        "arch": arch_for(major, minor),
        "smem_optin": int(props.max_shared_memory_per_block_optin),
        "smem_per_block": int(props.max_shared_memory_per_block),
        "smem_reserved": int(props.reserved_shared_memory_per_block),
        "smem_per_sm": int(props.max_shared_memory_per_multiprocessor),
        "total_mem": total,
        "free_mem": free,
        "driver_version": int(check(drv.cuDriverGetVersion(), "cuDriverGetVersion")),
        "cooperative_launch": bool(props.cooperative_launch),
        "concurrent_managed_access": bool(props.concurrent_managed_access),
        "unified_addressing": bool(props.unified_addressing),
    }
