"""compile(graph) -> Program: the host pipeline plus a backend, and input/output checking."""
from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from . import abi, interop, pages, scheduler
from .backend_choice import BACKENDS, choose_backend
from .bound import Bound
from .dtypes import numpy_dtype
from .errors import GraphError, MegakernelError
from .graph import Graph
from .options import backend_options, check_count
from .plan import Plan
from .stats import Stats
from .trace import Trace

__all__ = ["BACKENDS", "DEFAULT_SIM_SMS", "Program", "compile", "resolve_backend"]

DEFAULT_SIM_SMS = 132  # an H200's SM count, so the simulator runs the GPU's queue shapes
# kinds of caller arrays a result can be copied into once the run is over
_COPY_TARGETS = ("numpy", "torch", "cupy")
_MAX_CALLS = 64     # checked descriptions of recent calls kept per program


def resolve_backend(backend: str | None) -> str:
    """None -> MEGAK_BACKEND, else "cuda" when a GPU is usable, else "sim"."""
    name = choose_backend(backend, "backend").name
    if name not in BACKENDS:
        raise GraphError(f"unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
    return name


def compile(graph: Graph, backend: str | None = None, *, n_sm: int | None = None,
            n_pages: int | None = None, data_flags: bool = True, weight_stream: bool = True,
            **options) -> "Program":
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
    data_flags: let small fp32 intermediates between copies and adds carry their own flags
        (each element and the run's stamp in one 64-bit word, polled by its readers) instead
        of a counter signalled after a release fence: one L2 round trip per dependent step
        instead of three (README "How it works"). Default True; False: counters everywhere.
    weight_stream: stream the weights of skinny GEMMs (bf16 of at most 64 rows, fp32 of at
        most 16) whose B is a graph input through each SM's weight ring, fetched ahead across
        instructions (README "How it works"). Default True; False: such GEMMs lower as tiles
        (split-K and a reduce where K is long), as they would with a computed B.

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
    if not isinstance(data_flags, bool):
        raise GraphError(f"compile(): data_flags={data_flags!r} must be True or False")
    if not isinstance(weight_stream, bool):
        raise GraphError(f"compile(): weight_stream={weight_stream!r} must be True or False")
    plan = scheduler.build_plan(graph, n_sm=default_sms if n_sm is None else n_sm,
                                n_pages=default_pages if n_pages is None else n_pages,
                                memory_bytes=memory, data_flags=data_flags,
                                weight_stream=weight_stream)
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
        self._calls: OrderedDict = OrderedDict()   # call key -> checked _Call (GPU tensors)
        self._output_names = tuple(plan.outputs)
        self._input_of_slot = {slot: name for name, slot in plan.inputs.items()}
        self._sim_failed: list[Handle] = []         # simulator runs whose error is unreported
        self._resident = None      # the open megak.Resident serving this program, if any
        executor_keywords = dataclasses.asdict(self.options)
        if backend == "sim":
            from .sim import SimExecutor
            self._executor = SimExecutor(plan, **executor_keywords)
        else:
            from .runtime.executor import CudaExecutor
            self._executor = CudaExecutor(plan, **executor_keywords)

    def run(self, *, trace: bool = False, out: dict | None = None, stream=None,
            **inputs) -> dict:
        """Run the program once and wait for it; return a dict of output name -> array.

        inputs: every graph input by name, and nothing else, each with the input's shape and
            dtype exactly (megak never casts). numpy arrays are copied to the device (on the
            GPU through pinned staging, non-contiguous ones made contiguous first) and never
            modified. torch and cupy tensors, and other objects with ``__dlpack__`` /
            ``__cuda_array_interface__``, that live on the GPU are read in place by the
            "cuda" backend (zero-copy; row-major with unit column stride, rows may be
            padded); the simulator copies them to the host.
        out: a dict of output name -> array to write that output into, with the output's
            shape and dtype, writable, no two sharing memory, and a GPU array sharing none
            with a GPU input (it is written while the inputs are read): a numpy array or a
            torch / cupy tensor (the "cuda" backend writes GPU ones in place, and their rows
            may be padded; other GPU arrays only there). The returned dict holds that same object.
            Outputs not named get new arrays.
        stream: the CUDA stream to run on (anything with ``__cuda_stream__``, a torch or
            cupy stream, an int handle). By default torch's current stream when torch
            tensors are passed, cupy's for cupy arrays, else megak's own. The run is ordered
            after the work already queued on that stream, like any CUDA library call: inputs
            produced on another stream must be ready (or that stream synchronised) first.
            The simulator accepts and ignores it.
        trace: keep this run's per-instruction timeline in ``self.last_trace`` (a
            `megak.Trace`); on the GPU a separately compiled variant runs, so untraced runs
            pay nothing. An untraced run leaves ``last_trace`` as it was.

        New outputs are of the inputs' kind: torch tensors when any input is one, else
        cupy arrays when any input is one, else numpy arrays; on the GPU when an input was.
        Each output is its own array, even where two outputs name one tensor.

        Raises GraphError, before anything runs or is written, for missing or unknown
        inputs, a wrong shape, dtype, device or layout, or a bad ``out``; MegakernelError
        (MegakernelHang for a wait that never ends) when this run, or an earlier launch
        whose error was not yet reported, failed.
        """
        if not trace and self._resident is None:
            _, call = self._bound_call(inputs, out)
            if call is not None:
                return self._run_bound(call, stream, out, inputs)
        return self.launch(out=out, stream=stream, _trace=trace, **inputs).wait()

    def launch(self, *, out: dict | None = None, stream=None, _trace: bool = False,
               **inputs) -> "Handle":
        """Enqueue one run and return at once with its `Handle` (``h.wait()`` gives what
        ``run`` returns; ``h.done()`` polls). Arguments as for ``run``.

        With GPU tensors only (inputs and ``out=``), a launch is one kernel launch on the
        stream, nothing else: it can be captured in a CUDA graph (``torch.cuda.graph``,
        cupy or cuda.core capture), and a replay runs the program again on the same tensors.
        A run that fails raises from its ``wait()``, or, if never waited on, from the next
        ``launch`` / ``run`` / ``check`` of this program: an error is never lost, and the
        outputs of a failed run are never returned as valid. The simulator runs the program
        at launch (in launch order) and reports its errors the same way.
        """
        if self._resident is not None:
            raise MegakernelError("this program is served by a resident kernel: submit to it "
                                  "(Resident.submit), or close that first")
        return self._launch(out, stream, _trace, inputs)

    def bind(self, *, out: dict | None = None, **inputs) -> "Bound":
        """Check one call's arrays now and return it as a `megak.Bound`, whose ``run()`` and
        ``launch()`` repeat it on those arrays for the cost of one launch, whatever their
        number (arguments as for ``run``). The arrays stay where they are, as a CUDA graph's
        do: write new values into them between calls; `Bound` says what it notices.

        Raises GraphError, as ``run`` does, for arguments ``run`` would refuse."""
        out = dict(out) if isinstance(out, Mapping) else out
        self._describe(inputs, out)          # every check run() makes, before anything runs
        return Bound(self, inputs, out, None)

    def _launch_unguarded(self, out, inputs) -> "Handle":
        """launch() for a resident kernel's simulator requests."""
        return self._launch(out, None, False, inputs)

    # -- the fast path: a checked call bound to its tensor table (Program.run, Bound) -------
    def _bound_stream(self, call: "_Call", stream):
        """The CUstream of a bound call: the given stream, else the current one of the call's
        array kind (torch's, cupy's) or megak's own."""
        return (interop.current_stream(call.kind, self._executor.ordinal) if stream is None
                else interop.stream_handle(stream))

    def _run_bound(self, call: "_Call", stream, out, inputs: dict) -> dict:
        """One launch on the call's table and its wait, under one executor call (no handle);
        what run() returns."""
        self._executor.run_bound(call.binding, self._bound_stream(call, stream))
        if call.all_out:     # out names every output, and nothing else
            return dict(out)
        return self._finish(call, {}, out, inputs)

    def _launch_bound(self, call: "_Call", stream, out, inputs: dict) -> "Handle":
        """One launch on the call's table, and its handle."""
        ticket = self._executor.launch_bound(call.binding, self._bound_stream(call, stream))
        return Handle(self, call, ticket, False, out, inputs)

    def _launch(self, out, stream, _trace: bool, inputs: dict) -> "Handle":
        key, call = self._bound_call(inputs, out) if not _trace else (None, None)
        if call is not None:
            return self._launch_bound(call, stream, out, inputs)
        h = None if stream is None else interop.stream_handle(stream)
        call = self._describe(inputs, out)
        if self.backend == "sim":
            return self._launch_sim(call, _trace, out)
        if h is None and call.kind in ("torch", "cupy") and call.on_gpu:
            h = interop.current_stream(call.kind, self._executor.ordinal)
        ticket = self._executor.launch(call.arrays, call.slots, external=call.external,
                                       stream=h, trace=_trace)
        if call.cacheable:
            self._bind(call, self._executor.last_binding)
            if key is not None:
                self._remember(key, call, inputs, out)
        return Handle(self, call, ticket, _trace, out, inputs)

    def _bind(self, call: "_Call", binding) -> None:
        """Give a call that allocates and copies nothing the tensor table its launch used:
        a repeat of it is then one launch on that table (the fast path)."""
        call.binding = binding
        # every output written into its out= tensor: the call's result is `out` itself
        call.all_out = all(name in call.in_place for name in self._output_names)

    def _remember(self, key, call: "_Call", inputs: dict, out: dict) -> None:
        """Keep a checked, bound call of GPU tensors for the fast path of the next identical
        one.

        The cache holds no caller tensor alive: the call keeps only their binding and names,
        and a guard per tensor (weakref.finalize) drops the call when one of them is freed,
        before its id can be reused, so equal keys still mean the same tensors."""
        call.forget_arrays()
        me = weakref.ref(self)
        call.guards = tuple(_guard(t, me, key) for t in (*inputs.values(), *out.values()))
        old = self._calls.pop(key, None)
        if old is not None:
            old.release_guards()
        self._calls[key] = call
        if len(self._calls) > _MAX_CALLS:
            self._calls.popitem(last=False)[1].release_guards()

    def _forget_calls(self) -> None:
        while self._calls:
            self._calls.popitem()[1].release_guards()

    def _prepare_request(self, inputs: dict, out, looked_up: tuple | None = None) -> tuple:
        """A resident kernel's request (megak.resident): the checked call, and the program's
        request words (Executor.prepare_request), tensor table and ticket to post, through
        the same call cache as launch().
        ``looked_up``: what _bound_call already said for these arguments."""
        ex = self._executor
        key, call = looked_up if looked_up is not None else self._bound_call(inputs, out)
        if call is not None:
            words, table, ticket, _ = ex.prepare_request({}, [], binding=call.binding)
            return call, words, table, ticket
        call = self._describe(inputs, out)
        words, table, ticket, binding = ex.prepare_request(call.arrays, call.slots,
                                                           external=call.external)
        if call.cacheable:
            self._bind(call, binding)
            if key is not None:
                self._remember(key, call, inputs, out)
        return call, words, table, ticket

    def check(self) -> None:
        """Raise the error of a run that failed and was not reported yet (launches never
        waited on, CUDA graph replays); does nothing otherwise. It does not wait: after graph
        replays, synchronise their stream first."""
        if self.backend == "sim":
            self._raise_sim_pending()
        else:
            self._executor.check()

    # -- the call path ----------------------------------------------------------------------
    def _bound_call(self, inputs: dict, out) -> tuple:
        """(call key, the checked call of these exact GPU tensors if it is still bound to
        its tensor table, else None). A bound call is the fast path: nothing to describe,
        copy or upload."""
        key = self._call_key(inputs, out)
        if key is None:
            return None, None
        call = self._calls.get(key)
        if call is None or call.binding is None or not call.binding.live:
            return key, None
        return key, call

    def _call_key(self, inputs: dict, out):
        """The identity of every array of the call, or None when one has none this cheap
        (numpy arrays, host tensors, other libraries: those are described every call). For
        a torch GPU tensor or nn.Parameter: the object, its address, shape and strides. A
        tensor object keeps its dtype, and moving it to another device changes its address,
        so equal keys mean the same checked binding; the cached call holds the objects, so
        their ids are not reused while it is cached."""
        if self.backend != "cuda" or not isinstance(out, dict):
            return None
        types = interop.torch_tensor_types()
        if not types:
            return None
        parts = []
        for group in (inputs, out):
            for name, t in group.items():
                if type(t) not in types:
                    return None
                parts.append((name, id(t), t.data_ptr(), t.shape, t.stride()))
            parts.append(None)       # inputs | outputs
        return tuple(parts)

    def _describe(self, inputs: dict, out) -> "_Call":
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
        gpu_inputs = {}
        for name, value in inputs.items():
            shape, dtype = plan.input_shapes[name]
            slot = plan.tensors[plan.inputs[name]]
            kinds.add(interop.kind_of(value))
            desc = interop.describe(value)
            if isinstance(desc, interop.DeviceArray):
                on_gpu = True
                interop.check_device_array(desc, name, shape, dtype, device)
                gpu_inputs[name] = desc
                if self.backend == "cuda":
                    external[slot.slot] = desc
                    continue
                desc = interop.to_host(desc)
            arrays[slot.slot] = self._host_input(name, desc, shape, dtype, slot)
        kind = "torch" if "torch" in kinds else "cupy" if "cupy" in kinds else "numpy"
        self._check_no_alias(targets, gpu_inputs)

        # outputs written in place: caller-provided ones, and new ones of the inputs' kind
        in_place: dict[str, tuple] = {}     # output name -> ("out", None) or ("new", array)
        for name, slot in plan.outputs.items():
            target = targets.get(name)
            if target is not None:
                if isinstance(target, interop.DeviceArray) and self._writes_in_place(name):
                    external[slot] = target
                    in_place[name] = ("out", None)
            elif self._writes_in_place(name) and on_gpu and kind in ("torch", "cupy"):
                like = next(iter(external.values()), None)
                new = interop.empty(kind, like, plan.output_shapes[name],
                                    plan.tensors[slot].dtype)
                external[slot] = interop.describe(new)
                in_place[name] = ("new", new)
        slots = sorted({s for s in plan.outputs.values() if s not in external})
        return _Call(arrays, external, slots, kind, on_gpu, targets, in_place)

    def _finish(self, call: "_Call", host: dict, out, inputs) -> dict:
        """The caller's results from a finished run: in-place outputs as given or made, the
        rest from the host copies (an output that is a GPU input: from `inputs`)."""
        plan = self.plan
        results: dict[str, object] = {}
        for name, slot in plan.outputs.items():
            how, new = call.in_place.get(name, (None, None))
            if how == "out":
                results[name] = out[name]
                continue
            if how == "new":
                results[name] = new
                continue
            if slot in host:
                value = host[slot].reshape(plan.output_shapes[name]).copy()
            else:   # an output that is a GPU input, read in place: that input's values
                source = interop.describe(inputs[self._input_of_slot[slot]])
                value = interop.to_host(source).reshape(plan.output_shapes[name])
            if name in call.targets:
                _copy_into(out[name], value)
                results[name] = out[name]
            else:
                results[name] = interop.to_kind(call.kind, value, call.on_gpu)
        return results

    def _launch_sim(self, call: "_Call", trace: bool, out) -> "Handle":
        """The simulator runs at launch; a failure waits for wait() or the next call (a
        closed program raises at once, as the GPU's launch does)."""
        self._executor.check_open()
        self._raise_sim_pending()
        handle = Handle(self, call, None, trace, out, None)
        with self._executor.lock:     # this run's trace, not another thread's
            try:
                handle._host = self._executor.run(call.arrays, call.slots, trace=trace)
            except MegakernelError as exc:
                handle._error = exc
                self._sim_failed.append(handle)
            if trace and handle._error is None:
                self.last_trace = self._make_trace(self._executor.last_trace_events)
        return handle

    def _raise_sim_pending(self) -> None:
        if self._sim_failed:
            handle = self._sim_failed.pop(0)
            handle._reported = True
            raise handle._error

    def _writes_in_place(self, name: str) -> bool:
        """Whether the megakernel can write output `name` straight into a GPU array: only
        on the GPU, and only for a tensor that is neither an input nor another output."""
        return self.backend == "cuda" and self._written_directly(name)

    def _written_directly(self, name: str) -> bool:
        """Whether output `name` is a tensor of its own that the ops write (not an input,
        not shared with another output): the GPU writes it in place into a GPU out= array."""
        plan = self.plan
        slot = plan.outputs[name]
        sharing = sum(1 for s in plan.outputs.values() if s == slot)
        return sharing == 1 and plan.tensors[slot].kind != "input"

    def _check_no_alias(self, targets: dict, gpu_inputs: dict) -> None:
        """GraphError for a GPU out= array that shares memory with a GPU input: the GPU
        writes it in place while other instructions still read the input, so the result
        would depend on timing. Raised on both backends (the simulator copies both and would
        not show it), so code tested there fails the same way on the GPU."""
        for name, target in targets.items():
            if not (isinstance(target, interop.DeviceArray) and self._written_directly(name)):
                continue
            for source, desc in gpu_inputs.items():
                if interop.overlaps(target, desc):
                    raise GraphError(f"run(out=...): output {name!r} shares memory with input "
                                     f"{source!r}; megak reads its inputs while it writes "
                                     f"its outputs, so give the output memory of its own")

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
        "sim", nothing. Calling it again does nothing. A closed program raises
        MegakernelError if run or launched, on either backend, and so does the ``wait()``
        of a launch not waited on before the close. A program served by an open resident
        kernel is not closed: close that first (MegakernelError)."""
        if self._resident is not None:
            raise MegakernelError("this program is served by an open resident kernel; close "
                                  "that first")
        self._forget_calls()
        self._executor.close()

    def __enter__(self) -> "Program":
        """``with megak.compile(g) as prog:`` gives the program itself."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the program when the ``with`` block ends; an exception from the block
        still propagates."""
        self.close()


@dataclasses.dataclass
class _Call:
    """One call's checked description: numpy inputs (slot -> array), caller GPU memory
    (slot -> DeviceArray), the slots read back to the host, the kind of new outputs, the
    out= targets, and which outputs are written in place (the caller's, or new arrays)."""
    arrays: dict
    external: dict
    slots: list
    kind: str
    on_gpu: bool
    targets: dict
    in_place: dict
    binding: object = None      # the executor's tensor table for these tensors, once bound
    guards: tuple = ()          # a cached call's weakref.finalize per caller tensor
    all_out: bool = False       # a cached call whose every output is its out= tensor

    @property
    def cacheable(self) -> bool:
        """Only calls that allocate nothing and copy nothing are reused."""
        return not self.arrays and not self.slots and \
            all(how == "out" for how, _ in self.in_place.values())

    def forget_arrays(self) -> None:
        """Drop the references to the caller's arrays (a cached call must not keep them
        alive): what is left, the binding and the output names, is all a repeat needs."""
        self.external = {}
        self.targets = dict.fromkeys(self.targets)

    def release_guards(self) -> None:
        for guard in self.guards:
            guard.detach()
        self.guards = ()


def _guard(tensor, program_ref, key) -> weakref.finalize:
    guard = weakref.finalize(tensor, _drop_call, program_ref, key)
    guard.atexit = False        # nothing to drop when the interpreter ends
    return guard


def _drop_call(program_ref, key) -> None:
    """A caller tensor of a cached call was freed: the call goes (its id may be reused)."""
    prog = program_ref()
    if prog is not None:
        call = prog._calls.pop(key, None)
        if call is not None:
            call.release_guards()


class Handle:
    """A launched run (`Program.launch`). ``wait()`` returns what ``Program.run`` returns,
    or raises that run's error; ``done()`` says, without waiting, whether it has finished.
    Holds the run's arrays until it is waited on."""

    __slots__ = ("_program", "_call", "_out", "_inputs", "_ticket", "_trace", "_host",
                 "_error", "_reported", "_result")

    def __init__(self, program: Program, call: _Call, ticket: int | None, trace: bool, out,
                 inputs):
        self._program = program
        self._call = call
        self._out = out             # the caller's arrays, kept alive until the run is waited
        self._inputs = inputs       # on (another stream may reuse freed memory at once)
        self._ticket = ticket
        self._trace = trace
        self._host = None           # the simulator's results
        self._error = None          # the simulator's failure
        self._reported = False
        self._result = None

    def done(self) -> bool:
        if self._ticket is None or self._result is not None:
            return True
        return self._program._executor.done(self._ticket)

    def wait(self) -> dict:
        """Wait for the run; return output name -> array (the same dict on every call)."""
        if self._result is not None:
            return self._result
        if self._error is not None and self._ticket is not None:
            raise self._error
        prog = self._program
        if self._ticket is None:                       # simulator: it ran at launch
            prog._executor.check_open()                # closed before the wait: as on the GPU
            if self._error is not None:
                if not self._reported:
                    prog._sim_failed.remove(self)
                    self._reported = True
                raise self._error
            host = self._host
        else:
            try:
                host = prog._executor.wait(self._ticket)
            except MegakernelError as exc:
                self._error = exc        # a second wait() raises it again
                raise
            if self._trace:
                prog.last_trace = prog._make_trace(prog._executor.last_trace_events)
        if self._call.all_out and not host:
            self._result = dict(self._out)
        else:
            self._result = prog._finish(self._call, host, self._out, self._inputs)
        self._inputs = None
        return self._result


def _same_memory(first, first_desc, second, second_desc) -> bool:
    """Whether two out= targets overlap: one object twice, host arrays sharing memory, or
    GPU arrays sharing a byte (interop.overlaps, as for an out= array against an input)."""
    if first is second:
        return True
    if isinstance(first_desc, np.ndarray) and isinstance(second_desc, np.ndarray):
        return bool(np.shares_memory(first_desc, second_desc))
    if isinstance(first_desc, interop.DeviceArray) and \
            isinstance(second_desc, interop.DeviceArray):
        return interop.overlaps(first_desc, second_desc)
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
