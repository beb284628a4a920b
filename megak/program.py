"""compile(graph) -> Program: the host pipeline plus a backend, and input/output checking."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import numpy as np

from . import abi, interop, pages, scheduler
from .dtypes import numpy_dtype
from .errors import GraphError
from .graph import Graph
from .options import backend_options, check_count
from .plan import Plan
from .stats import Stats
from .trace import Trace

__all__ = ["BACKENDS", "DEFAULT_SIM_SMS", "Program", "compile", "resolve_backend"]

BACKENDS = ("sim", "cuda")
DEFAULT_SIM_SMS = 132  # an H200's SM count, so the simulator runs the GPU's queue shapes
# kinds of caller arrays a result can be copied into once the run is over
_COPY_TARGETS = ("numpy", "torch", "cupy")


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
    """Lower, schedule and encode `graph` into per-SM instruction queues, ready to run.

    backend: "cuda" (the graph as one persistent kernel on the GPU) or "sim" (the CPU
        simulator, running the same encoded queues). None picks the MEGAK_BACKEND environment
        variable when it is set, else "cuda" when a GPU is usable, else "sim".
    n_sm: the number of SMs, one instruction queue each, to schedule over: an int >= 1.
        Default: the device's SM count on "cuda" (a plan for more SMs than the device has
        is refused); 132 on "sim", the SM count of an H200.
    n_pages: 16 KiB shared-memory pages per SM: an int from 1 to 32. Default: as many as fit
        in the device's opt-in shared memory per block on "cuda"; 13 on "sim", as on an
        H200. A graph op needing more pages than this is a GraphError.

    Options, keywords: every backend accepts and checks all of them but uses only its own,
    so one call works on whichever backend is picked.

    order: simulator only: how it interleaves the SMs' loader and compute actors,
        "round_robin" (default) or "random" (a different valid interleaving per seed).
    seed: simulator only: a non-negative int seeding order="random"; None (default): a
        fresh seed for each program.
    timeout_s: GPU only: the deadline in seconds (a positive number, default 5) of every
        wait inside the megakernel; a wait past it ends the run with a MegakernelError
        (MegakernelHang for a dependency wait).
    managed: GPU only: keep the graph's tensors in CUDA managed memory instead of device
        memory (default False).
    debug: GPU only: fill every tensor that is not an input with NaN before each run, check
        each instruction's operands and, at the end, that every page came back (default
        False); the simulator always checks pages.

    A bad graph, an unknown backend or option, or a bad value is a GraphError naming it and
    what is allowed, raised before anything is lowered or run.
    """
    if not isinstance(graph, Graph):
        raise GraphError(f"compile() takes a megak.Graph, got {type(graph).__name__}")
    backend = resolve_backend(backend)
    backend_options(backend, options)        # checked before the costly lowering
    n_sm = check_count("n_sm", n_sm)
    n_pages = check_count("n_pages", n_pages, most=abi.MAX_PAGES)
    if backend == "cuda":
        from .runtime.driver import device_info
        info = device_info()
        default_sms, default_pages = info["sm_count"], pages.pages_for(info["smem_optin"])
        memory = info["free_mem"]       # the tensors must fit what the GPU has free now
    else:
        default_sms, default_pages = DEFAULT_SIM_SMS, pages.DEFAULT_PAGES
        memory = None                   # this host's physical memory
    plan = scheduler.build_plan(graph, n_sm=default_sms if n_sm is None else n_sm,
                                n_pages=default_pages if n_pages is None else n_pages,
                                memory_bytes=memory)
    return Program(plan, backend, **options)


class Program:
    """A compiled graph, from `megak.compile`.

    ``run(**inputs)`` runs it; ``plan`` is the encoded plan, ``backend`` "sim" or "cuda",
    ``options`` the backend's typed options (`SimOptions` / `CudaOptions`), ``stats`` what
    the scheduler made of the graph (a dict that prints as a summary), ``last_trace`` the
    timeline of the last ``run(trace=True)``. Holds GPU memory on "cuda": use it as a
    context manager, or call ``close()``.
    """

    def __init__(self, plan: Plan, backend: str, **options):
        """A program for `plan` on `backend` ("sim" or "cuda"); ``options`` as for
        `megak.compile`, which is the usual way to make one."""
        self.options = backend_options(backend, options)
        self.plan = plan
        self.backend = backend
        self.stats = Stats(scheduler.stats(plan))
        self.last_trace: Trace | None = None
        executor_keywords = dataclasses.asdict(self.options)
        if backend == "sim":
            from .sim import SimExecutor
            self._executor = SimExecutor(plan, **executor_keywords)
        else:
            from .runtime.executor import CudaExecutor
            self._executor = CudaExecutor(plan, **executor_keywords)

    def run(self, *, trace: bool = False, out: dict | None = None, **inputs) -> dict:
        """Run the program once; return a dict of output name -> array.

        inputs: every graph input by name, and nothing else, each with the input's shape and
            dtype exactly (megak never casts). numpy arrays are copied to the device (on the
            GPU through pinned staging, non-contiguous ones made contiguous first) and never
            modified. torch and cupy tensors, and other objects with ``__dlpack__`` /
            ``__cuda_array_interface__``, that live on the GPU are read in place by the
            "cuda" backend (zero-copy, once the work their library has queued is done;
            row-major with unit column stride, rows may be padded); the simulator copies
            them to the host.
        out: a dict of output name -> array to write that output into, with the output's
            shape and dtype, writable, no two sharing memory: a numpy array or a torch /
            cupy tensor (the "cuda" backend writes GPU ones in place, and their rows may be
            padded; other GPU arrays only there). The returned dict holds that same object.
            Outputs not named get new arrays.
        trace: keep this run's per-instruction timeline in ``self.last_trace`` (a
            `megak.Trace`); on the GPU a separately compiled variant runs, so untraced runs
            pay nothing. An untraced run leaves ``last_trace`` as it was.

        New outputs are of the inputs' kind: torch tensors when any input is one, else
        cupy arrays when any input is one, else numpy arrays; on the GPU when an input was.
        Each output is its own array, even where two outputs name one tensor.

        Raises GraphError, before anything runs or is written, for missing or unknown
        inputs, a wrong shape, dtype, device or layout, or a bad ``out``; MegakernelError
        (MegakernelHang for a wait that never ends) when the run itself fails.
        """
        plan = self.plan
        missing = sorted(set(plan.inputs) - set(inputs))
        unknown = sorted(set(inputs) - set(plan.inputs))
        if missing or unknown:
            raise GraphError(f"run(): missing inputs {missing}, unknown inputs {unknown}; "
                             f"expected exactly {sorted(plan.inputs)}")
        device = getattr(self._executor, "ordinal", None) if self.backend == "cuda" else None
        out = dict(out) if isinstance(out, Mapping) else out
        targets = self._check_out(out, device)
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
        for name, slot in plan.outputs.items():
            target = targets.get(name)
            if target is not None:
                if isinstance(target, interop.DeviceArray) and self._writes_in_place(name):
                    external[slot] = target
                    results[name] = out[name]
            elif self._writes_in_place(name) and on_gpu and kind in ("torch", "cupy"):
                like = next(iter(external.values()), None)
                new = interop.empty(kind, like, plan.output_shapes[name],
                                    plan.tensors[slot].dtype)
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
            if name in targets:
                _copy_into(out[name], value)
                results[name] = out[name]
            else:
                results[name] = interop.to_kind(kind, value, on_gpu)
        return results

    def _writes_in_place(self, name: str) -> bool:
        """Whether the megakernel can write output `name` straight into a GPU array: only
        on the GPU, and only for a tensor that is neither an input nor another output."""
        plan = self.plan
        slot = plan.outputs[name]
        sharing = sum(1 for s in plan.outputs.values() if s == slot)
        return self.backend == "cuda" and sharing == 1 and plan.tensors[slot].kind != "input"

    def _check_out(self, out, device: int | None) -> dict:
        """``out`` as output name -> numpy array or DeviceArray, after every check that
        could otherwise fail once results are being written."""
        if out is None:
            return {}
        if not isinstance(out, dict):
            raise GraphError(f"run(out=...) takes a dict of output name -> array, got "
                             f"{type(out).__name__}; e.g. out={{'y': y_buffer}}")
        plan = self.plan
        bad_out = sorted(map(str, set(out) - set(plan.outputs)))
        if bad_out:
            raise GraphError(f"run(out=...): unknown outputs {bad_out}; the graph's outputs "
                             f"are {sorted(plan.outputs)}")
        targets = {}
        for name, target in out.items():
            shape = plan.output_shapes[name]
            dtype = plan.tensors[plan.outputs[name]].dtype
            if target is None:
                raise GraphError(f"run(out=...): output {name!r} is None; leave the name out "
                                 f"to get a new array")
            try:
                desc = interop.describe(target)
            except GraphError as exc:
                raise GraphError(f"run(out=...): output {name!r}: {exc}") from None
            if isinstance(desc, interop.DeviceArray):
                interop.check_device_array(desc, name, shape, dtype, device, "output")
            elif tuple(desc.shape) != tuple(shape) or desc.dtype != numpy_dtype(dtype):
                raise GraphError(f"output {name!r}: out= array must have shape {shape} "
                                 f"and dtype {dtype}, got {desc.shape} {desc.dtype}")
            elif not desc.flags.writeable:
                raise GraphError(f"output {name!r}: the out= array is read-only "
                                 f"(flags.writeable is False)")
            in_place = isinstance(desc, interop.DeviceArray) and self._writes_in_place(name)
            if not in_place and interop.kind_of(target) not in _COPY_TARGETS:
                raise GraphError(f"output {name!r}: results can be copied into "
                                 f"{', '.join(_COPY_TARGETS)} arrays here, not "
                                 f"{type(target).__name__}")
            targets[name] = desc
        names = list(out)
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                if _same_memory(out[first], targets[first], out[second], targets[second]):
                    raise GraphError(f"run(out=...): outputs {first!r} and {second!r} are "
                                     f"given overlapping memory; each needs its own array")
        return targets

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
        """Free what the backend holds now: on "cuda", the program's device and pinned
        memory and its streams (otherwise freed when the Program is garbage collected); on
        "sim", nothing. Calling it again does nothing. A closed "cuda" program raises
        MegakernelError if run."""
        self._executor.close()

    def __enter__(self) -> "Program":
        """``with megak.compile(g) as prog:`` gives the program itself."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the program when the ``with`` block ends; an exception from the block
        still propagates."""
        self.close()


def _same_memory(first, first_desc, second, second_desc) -> bool:
    """Whether two out= targets overlap: one object twice, host arrays sharing memory, or
    two GPU arrays starting at the same address of one device."""
    if first is second:
        return True
    if isinstance(first_desc, np.ndarray) and isinstance(second_desc, np.ndarray):
        return bool(np.shares_memory(first_desc, second_desc))
    if isinstance(first_desc, interop.DeviceArray) and \
            isinstance(second_desc, interop.DeviceArray):
        return (first_desc.device, first_desc.ptr) == (second_desc.device, second_desc.ptr)
    return False


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
