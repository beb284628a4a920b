"""compile(graph) -> Program: the host pipeline plus a backend, and input/output checking."""
from __future__ import annotations

import os

import numpy as np

from . import pages, scheduler
from . import interop
from .dtypes import numpy_dtype
from .errors import GraphError
from .graph import Graph
from .plan import Plan
from .trace import Trace

BACKENDS = ("sim", "cuda")
DEFAULT_SIM_SMS = 132  # an H200's SM count, so the simulator runs the GPU's queue shapes


def resolve_backend(backend: str | None) -> str:
    """None -> MEGAK_BACKEND, else "cuda" when a GPU is usable, else "sim"."""
    if backend is None:
        backend = os.environ.get("MEGAK_BACKEND") or None
    if backend is None:
        from .runtime.driver import gpu_usable
        backend = "cuda" if gpu_usable() else "sim"
    if backend not in BACKENDS:
        raise GraphError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    return backend


def compile(graph: Graph, backend: str | None = None, *, n_sm: int | None = None,
            n_pages: int | None = None, **options) -> "Program":
    """Lower, schedule and encode `graph`, ready to run on `backend`.

    Options go to the backend: for "sim" ``order`` ("round_robin" | "random") and ``seed``;
    for "cuda" ``managed`` (bool), ``timeout_s`` (spin deadline, default 5 s) and ``debug``.
    """
    if not isinstance(graph, Graph):
        raise GraphError(f"compile() takes a megak.Graph, got {type(graph).__name__}")
    backend = resolve_backend(backend)
    if backend == "cuda":
        from .runtime.driver import device_info
        info = device_info()
        n_sm = n_sm or info["sm_count"]
        n_pages = n_pages or pages.pages_for(info["smem_optin"])
    else:
        n_sm = n_sm or DEFAULT_SIM_SMS
        n_pages = n_pages or pages.DEFAULT_PAGES
    plan = scheduler.build_plan(graph, n_sm=n_sm, n_pages=n_pages)
    return Program(plan, backend, **options)


class Program:
    """A compiled graph. ``run(**inputs)`` -> dict of output name -> numpy array."""

    def __init__(self, plan: Plan, backend: str, **options):
        self.plan = plan
        self.backend = backend
        self.stats = scheduler.stats(plan)
        self.last_trace: Trace | None = None
        if backend == "sim":
            from .sim import SimExecutor
            self._executor = SimExecutor(plan, **options)
        else:
            from .runtime.executor import CudaExecutor
            self._executor = CudaExecutor(plan, **options)

    def run(self, *, trace: bool = False, out: dict | None = None, **inputs) -> dict:
        """Run once: inputs by name; returns output name -> array.

        Inputs may be numpy arrays (copied through pinned staging; non-contiguous ones are
        copied first; never modified), or torch / cupy tensors and other objects with
        ``__dlpack__`` / ``__cuda_array_interface__``: on the GPU these are used in place,
        zero-copy, and outputs come back as the same kind. ``out={"name": tensor}`` writes
        an output into a caller-provided tensor. ``trace=True`` keeps this run's
        per-instruction timeline in ``self.last_trace`` (a separately compiled variant on the
        GPU, so untraced runs pay nothing).
        """
        plan = self.plan
        missing = sorted(set(plan.inputs) - set(inputs))
        unknown = sorted(set(inputs) - set(plan.inputs))
        if missing or unknown:
            raise GraphError(f"run(): missing inputs {missing}, unknown inputs {unknown}; "
                             f"expected exactly {sorted(plan.inputs)}")
        out = dict(out or {})
        bad_out = sorted(set(out) - set(plan.outputs))
        if bad_out:
            raise GraphError(f"run(out=...): unknown outputs {bad_out}; the graph's outputs "
                             f"are {sorted(plan.outputs)}")
        device = getattr(self._executor, "ordinal", None) if self.backend == "cuda" else None
        arrays, external, kinds, on_gpu = {}, {}, set(), False
        for name, value in inputs.items():
            shape, dtype = plan.input_shapes[name]
            slot = plan.tensors[plan.inputs[name]]
            kinds.add(interop.kind_of(value))
            desc = interop.describe(value)
            if isinstance(desc, interop.DeviceArray):
                on_gpu = True
                interop.check_device_array(desc, name, shape, dtype, device)
                if self.backend == "cuda":
                    interop.synchronize_producer(desc)
                    external[slot.slot] = desc
                    continue
                desc = interop.to_host(desc)
            arrays[slot.slot] = self._host_input(name, desc, shape, dtype, slot)
        kind = "torch" if "torch" in kinds else "cupy" if "cupy" in kinds else "numpy"

        # outputs written in place: caller-provided ones, and new ones of the inputs' kind
        results: dict[str, object] = {}
        slot_users: dict[int, list[str]] = {}
        for name, slot in plan.outputs.items():
            slot_users.setdefault(slot, []).append(name)
        for name, slot in plan.outputs.items():
            in_place_ok = (self.backend == "cuda" and len(slot_users[slot]) == 1
                           and plan.tensors[slot].kind != "input")
            dtype = plan.tensors[slot].dtype
            shape = plan.output_shapes[name]
            target = out.get(name)
            if target is not None:
                desc = interop.describe(target)
                if isinstance(desc, interop.DeviceArray):
                    interop.check_device_array(desc, name, shape, dtype, device, "output")
                    if in_place_ok:
                        external[slot] = desc
                        results[name] = target
                elif tuple(desc.shape) != tuple(shape) or desc.dtype != numpy_dtype(dtype):
                    raise GraphError(f"output {name!r}: out= array must have shape {shape} "
                                     f"and dtype {dtype}, got {desc.shape} {desc.dtype}")
            elif in_place_ok and on_gpu and kind in ("torch", "cupy"):
                like = next(iter(external.values()), None)
                new = interop.empty(kind, like, shape, dtype)
                external[slot] = interop.describe(new)
                results[name] = new

        slots = sorted({s for s in plan.outputs.values() if s not in external})
        if trace:
            host = self._executor.run(arrays, slots, trace=True, **self._ext(external))
            self.last_trace = self._make_trace(self._executor.last_trace_events)
        else:
            host = self._executor.run(arrays, slots, **self._ext(external))
        for name, slot in plan.outputs.items():
            if name in results:
                continue
            value = host[slot].reshape(plan.output_shapes[name]).copy()
            target = out.get(name)
            if target is None:
                results[name] = interop.to_kind(kind, value, on_gpu)
            else:
                _copy_into(target, value)
                results[name] = target
        return results

    def _ext(self, external: dict) -> dict:
        return {"external": external} if external else {}

    def _host_input(self, name, value, shape, dtype, slot) -> np.ndarray:
        if value.dtype != numpy_dtype(dtype):
            raise GraphError(f"input {name!r}: expected dtype {dtype}, got {value.dtype} "
                             f"(megak never casts silently)")
        if value.shape != tuple(shape):
            raise GraphError(f"input {name!r}: expected shape {tuple(shape)}, "
                             f"got {value.shape}")
        # non-contiguous views are copied; the caller's array is never written
        return np.ascontiguousarray(value).reshape(slot.shape)

    def _make_trace(self, events: np.ndarray) -> Trace:
        plan = self.plan
        return Trace(events=events, op_labels=plan.op_labels, op_kinds=plan.op_kinds,
                     op_flops=plan.op_flops, op_bytes=plan.op_bytes, n_sm=plan.n_sm,
                     n_pages=plan.n_pages, own_pages=plan.instrs["pages"].copy(),
                     op_dtypes=plan.op_dtypes,
                     unit="step" if self.backend == "sim" else "ns")

    def close(self) -> None:
        self._executor.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _copy_into(target, value: np.ndarray) -> None:
    """Write a host result into a caller's array of any supported kind."""
    kind = interop.kind_of(target)
    if kind == "numpy":
        target[...] = value
    elif kind == "torch":
        target.copy_(interop.to_kind("torch", value, on_gpu=False))
    elif kind == "cupy":
        target.set(value)
    else:
        raise GraphError(f"out=: cannot write into {type(target).__name__} on this path")
