"""Arrays from other libraries: torch and cupy tensors, and anything with ``__dlpack__`` or
``__cuda_array_interface__``.

GPU arrays become `DeviceArray` descriptors (pointer, shape, row stride, dtype, device) that
the CUDA backend puts straight into its tensor table: zero-copy. Host arrays become numpy
arrays. Outputs are returned as the kind the inputs came as.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import ITEMSIZE, name_of, numpy_dtype
from .errors import GraphError


@dataclass(frozen=True)
class DeviceArray:
    obj: Any              # the caller's object (kept alive while megak uses its memory)
    kind: str             # "torch", "cupy" or "cuda" (any other GPU array)
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]   # in elements
    dtype: str | None     # megak's dtype name, or None if not one megak knows
    device: int

    def row_stride(self) -> int:
        return self.strides[0] if len(self.shape) == 2 else max(self.shape[-1], 1)


def kind_of(obj) -> str:
    mod = type(obj).__module__.split(".")[0]
    if isinstance(obj, np.ndarray):
        return "numpy"
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    if hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__"):
        return "cuda"
    return "unknown"


def describe(obj) -> DeviceArray | np.ndarray:
    """A GPU array's descriptor, or a numpy array for host data. Raises GraphError for
    anything else."""
    kind = kind_of(obj)
    if kind == "numpy":
        return obj
    if kind == "torch":
        if not obj.is_cuda:
            return _torch_to_numpy(obj)
        return DeviceArray(obj, "torch", int(obj.data_ptr()), tuple(obj.shape),
                           tuple(int(s) for s in obj.stride()), name_of(obj.dtype),
                           int(obj.device.index or 0))
    if kind == "cupy":
        item = obj.dtype.itemsize
        return DeviceArray(obj, "cupy", int(obj.data.ptr), tuple(obj.shape),
                           tuple(int(s) // item for s in obj.strides), name_of(obj.dtype),
                           int(obj.device.id))
    if hasattr(obj, "__cuda_array_interface__"):
        cai = obj.__cuda_array_interface__
        dt = np.dtype(cai["typestr"])
        shape = tuple(int(s) for s in cai["shape"])
        if cai.get("strides") is None:
            strides = tuple(int(np.prod(shape[i + 1:], dtype=np.int64))
                            for i in range(len(shape)))
        else:
            strides = tuple(int(s) // dt.itemsize for s in cai["strides"])
        return DeviceArray(obj, "cuda", int(cai["data"][0]), shape, strides, name_of(dt),
                           _pointer_device(int(cai["data"][0])))
    if hasattr(obj, "__dlpack__"):
        from cuda.core.utils import StridedMemoryView
        view = StridedMemoryView.from_dlpack(obj, -1)
        if not view.is_device_accessible:
            return np.from_dlpack(obj)
        shape = tuple(view.shape)
        strides = tuple(view.strides) if view.strides is not None else \
            tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
        return DeviceArray(obj, "cuda", int(view.ptr), shape, strides, name_of(view.dtype),
                           int(view.device_id))
    raise GraphError(f"expected a numpy array, a torch or cupy tensor, or an object with "
                     f"__dlpack__ / __cuda_array_interface__; got {type(obj).__name__}")


def check_device_array(arr: DeviceArray, name: str, shape, dtype: str, device: int | None,
                       what: str = "input") -> None:
    """GraphError unless `arr` is usable in place as a `shape` `dtype` tensor on `device`."""
    if device is not None and arr.device != device:
        raise GraphError(f"{what} {name!r}: on GPU {arr.device}, the program runs on GPU "
                         f"{device}")
    if arr.dtype != dtype:
        raise GraphError(f"{what} {name!r}: expected dtype {dtype}, got {arr.dtype} "
                         f"(megak never casts silently)")
    if tuple(arr.shape) != tuple(shape):
        raise GraphError(f"{what} {name!r}: expected shape {tuple(shape)}, got {arr.shape}")
    cols = shape[-1]
    rows = shape[0] if len(shape) == 2 else 1
    ok = len(shape) == 1 and (arr.strides[0] == 1 or cols == 1)
    if len(shape) == 2:
        ok = (arr.strides[1] == 1 or cols == 1) and (arr.strides[0] >= cols or rows == 1)
    if not ok or arr.ptr % ITEMSIZE[dtype]:
        raise GraphError(f"{what} {name!r}: strides {arr.strides} (elements) are not "
                         f"row-major with unit column stride; pass a .contiguous() tensor")


def overlaps(a: DeviceArray, b: DeviceArray) -> bool:
    """Whether two row-major GPU arrays (each row `cols` elements, rows `row_stride()` apart,
    as check_device_array accepts them) share a byte: exact, so views of one buffer that
    interleave without touching (the two halves of its columns) do not count."""
    if a.device != b.device:
        return False

    def rows(x: DeviceArray):
        item = ITEMSIZE[x.dtype]
        n = x.shape[0] if len(x.shape) == 2 else 1
        starts = x.ptr + np.arange(n, dtype=np.int64) * (x.row_stride() * item)
        return starts, starts + x.shape[-1] * item

    a_start, a_end = rows(a)
    b_start, b_end = rows(b)
    # b's rows are disjoint and in address order: of those starting before a row of a ends,
    # only the last can reach into that row
    last = np.searchsorted(b_start, a_end, side="left") - 1
    hit = last >= 0
    return bool((b_end[last[hit]] > a_start[hit]).any())


def empty(kind: str, like: DeviceArray | None, shape, dtype: str):
    """A new output array of `kind` (on like's device for GPU kinds)."""
    if kind == "torch":
        import torch
        tdt = getattr(torch, dtype)
        dev = torch.device("cuda", like.device) if like is not None else "cpu"
        return torch.empty(shape, dtype=tdt, device=dev)
    if kind == "cupy":
        import cupy
        with cupy.cuda.Device(like.device):
            return cupy.empty(shape, dtype=numpy_dtype(dtype))
    return np.empty(shape, dtype=numpy_dtype(dtype))


def to_kind(kind: str, arr: np.ndarray, on_gpu: bool):
    """A host result as `kind` (used by the simulator backend, and for host torch tensors)."""
    if kind == "torch":
        import torch
        if arr.dtype == numpy_dtype("bfloat16"):
            t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(arr)
        return t.cuda() if on_gpu else t
    if kind == "cupy" and on_gpu:
        import cupy
        return cupy.asarray(arr)
    return arr


def to_host(arr: DeviceArray) -> np.ndarray:
    """Copy a GPU array to a numpy array (the simulator's path)."""
    if arr.kind == "torch":
        return _torch_to_numpy(arr.obj.detach().cpu())
    if arr.kind == "cupy":
        return arr.obj.get()
    raise GraphError("the simulator backend takes numpy, torch or cupy arrays")


def _torch_to_numpy(t) -> np.ndarray:
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return t.numpy()


def _pointer_device(ptr: int) -> int:
    from .runtime.driver import _bindings, check
    drv = _bindings()
    attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(drv.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute"))


def stream_handle(stream) -> int:
    """The CUstream handle (an int) of `stream`: an int, anything with ``__cuda_stream__``
    (cuda.core streams, recent torch and cupy), a torch stream (``cuda_stream``), a cupy
    stream (``ptr``) or a cuda.core / bindings object with ``handle``."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        return int(proto()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if value is not None:
            return int(value)
    raise GraphError(f"stream= takes a CUDA stream (anything with __cuda_stream__, a torch or "
                     f"cupy stream, or an int handle), got {type(stream).__name__}")


def current_stream(kind: str, device: int) -> int | None:
    """The caller's library's current stream on `device` for `kind` ("torch" or "cupy"), as
    a handle: work megak enqueues there is ordered after what that library queued."""
    if kind == "torch":
        import torch
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:        # the public call costs ~4 us per call on an H200 host
            return int(raw(device))
        return int(torch.cuda.current_stream(device).cuda_stream)
    if kind == "cupy":
        import cupy
        return int(cupy.cuda.get_current_stream().ptr)
    return None


def torch_tensor_types() -> tuple:
    """The exact types whose data_ptr(), shape and stride() are torch.Tensor's own, read by
    the call key: torch.Tensor and nn.Parameter (weights) when torch is imported (it is never
    imported for this), else (). torch.Tensor comes first."""
    torch = sys.modules.get("torch")
    tensor = getattr(torch, "Tensor", None)
    if tensor is None:
        return ()
    parameter = getattr(getattr(torch, "nn", None), "Parameter", None)
    return (tensor, parameter) if parameter is not None else (tensor,)
