"""compile(graph) -> Program: the host pipeline plus a backend, and input/output checking."""
from __future__ import annotations

import os

import numpy as np

from . import pages, scheduler
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

    def run(self, *, trace: bool = False, **inputs) -> dict[str, np.ndarray]:
        """Run once. With ``trace=True`` the per-instruction timeline of this run is kept in
        ``self.last_trace`` (a megak.Trace); tracing uses a separately compiled variant on the
        GPU, so runs without it pay nothing."""
        plan = self.plan
        missing = sorted(set(plan.inputs) - set(inputs))
        unknown = sorted(set(inputs) - set(plan.inputs))
        if missing or unknown:
            raise GraphError(f"run(): missing inputs {missing}, unknown inputs {unknown}; "
                             f"expected exactly {sorted(plan.inputs)}")
        arrays = {}
        for name, value in inputs.items():
            shape, dtype = plan.input_shapes[name]
            if not isinstance(value, np.ndarray):
                raise GraphError(f"input {name!r}: expected a numpy array of shape {shape} "
                                 f"and dtype {dtype}, got {type(value).__name__}")
            if value.dtype != np.dtype(dtype):
                raise GraphError(f"input {name!r}: expected dtype {dtype}, got {value.dtype} "
                                 f"(megak never casts silently)")
            if value.shape != tuple(shape):
                raise GraphError(f"input {name!r}: expected shape {tuple(shape)}, "
                                 f"got {value.shape}")
            # non-contiguous views are copied; the caller's array is never written
            arrays[plan.inputs[name]] = np.ascontiguousarray(value)
        slots = sorted(set(plan.outputs.values()))
        if trace:
            results = self._executor.run(arrays, slots, trace=True)
            self.last_trace = self._make_trace(self._executor.last_trace_events)
        else:
            results = self._executor.run(arrays, slots)
        return {name: results[slot].copy() for name, slot in plan.outputs.items()}

    def _make_trace(self, events: np.ndarray) -> Trace:
        plan = self.plan
        return Trace(events=events, op_labels=plan.op_labels, op_kinds=plan.op_kinds,
                     op_flops=plan.op_flops, op_bytes=plan.op_bytes, n_sm=plan.n_sm,
                     n_pages=plan.n_pages, own_pages=plan.instrs["pages"].copy(),
                     unit="step" if self.backend == "sim" else "ns")

    def close(self) -> None:
        self._executor.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
