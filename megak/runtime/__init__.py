"""The CUDA backend: driver detection, memory, compile (+cache), cooperative launch, status.

Names resolve lazily so that ``import megak.runtime.driver`` (what CPU-only code paths and
the test collector touch) never imports cuda.core.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "gpu_usable": "driver",
    "gpu_unusable_reason": "driver",
    "device_info": "driver",
    "CudaError": "driver",
    "Memory": "memory",
    "CudaExecutor": "executor",
    "compile_megakernel": "compiler",
    "CompiledKernel": "compiler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
