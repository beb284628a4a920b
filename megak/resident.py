"""megak.resident: one megakernel launch that stays on the GPU and runs requests as they come.

    with megak.resident(prog_a, prog_b) as r:
        h = r.submit(prog_a, x=x, out={"y": y})     # returns at once
        h.wait()                                    # outputs, or the request's error

What it means for the GPU: while the kernel is resident it holds every SM (one block each),
so other kernels (torch's included) wait until it leaves: on ``close()``, at the end of the
``with``, after ``idle_s`` seconds with no request (default 1 s; the next ``submit`` launches
it again, transparently), or when the process ends (the driver tears its context down).
Copies, memsets and allocations still run beside it; freeing GPU memory waits for it.

A request reads its tensors when the kernel takes it: data produced by other GPU work must be
complete (that stream synchronised) before ``submit``, and results are there once ``wait()``
returns. Requests run one after another, in submission order. A failed request stops the
kernel: its ``wait()`` raises the error as ``Program.run`` would, and every request after it
raises without having run; the programs stay usable (``run``) once the resident is closed.

On the simulator (``backend="sim"``) the same API runs each request at ``submit``, in order,
with the same failure semantics; there is no kernel to keep, so ``idle_s`` has no effect.
"""
from __future__ import annotations

import math
import threading
import time
import weakref

import numpy as np

from .bound import Bound
from .errors import GraphError, MegakernelError, MegakernelHang
from .program import Program

__all__ = ["Request", "Resident", "resident"]

DEFAULT_IDLE_S = 1.0


def resident(*programs: Program, idle_s: float = DEFAULT_IDLE_S) -> "Resident":
    """Start a resident megakernel serving ``programs`` (compiled programs of one backend and
    device; more can be added with ``add``). ``idle_s``: the kernel leaves after this many
    seconds without a request (a positive number; ``math.inf``: never) and is launched again
    by the next ``submit``."""
    return Resident(programs, idle_s=idle_s)


class Resident:
    """A resident megakernel (`megak.resident`). ``submit`` queues a request, ``add``
    registers another program, ``close`` (or the end of a ``with``) makes the kernel leave.
    ``launches``: how many times the kernel was launched (again after each idle exit)."""

    def __init__(self, programs, *, idle_s: float = DEFAULT_IDLE_S):
        if not programs:
            raise GraphError("megak.resident() needs at least one compiled program")
        idle_s = float(idle_s)
        if not idle_s > 0 or math.isnan(idle_s):
            raise GraphError(f"idle_s must be a positive number of seconds (math.inf: never "
                             f"leave when idle), got {idle_s}")
        first = programs[0]
        if not isinstance(first, Program):
            raise GraphError(f"megak.resident() takes compiled programs (megak.compile), got "
                             f"{type(first).__name__}")
        self.backend = first.backend
        self.idle_s = idle_s
        self._programs: list[Program] = []
        self._lock = threading.Lock()
        self._closed = False
        self._failed: MegakernelError | None = None     # the simulator's stop
        self._kernel = None
        self._finalizer = None
        # per program, the requests in flight through its own (megak-owned) buffers
        self._staged: dict[Program, list[Request]] = {}
        for prog in programs:
            self._check_program(prog)
        if self.backend == "cuda":
            from .runtime.resident import ResidentKernel
            ex = first._executor
            wait_s = max(p._executor.host_timeout_s for p in programs)
            bodies = 0
            for p in programs:
                bodies |= p._executor.bodies
            self._kernel = ResidentKernel(ex, bodies, idle_s=idle_s, wait_s=wait_s,
                                          device=ex.ordinal)
            self._finalizer = weakref.finalize(self, _close_quietly, self._kernel,
                                               self._close_limit())
        for prog in programs:
            self._register(prog)

    # -- programs ---------------------------------------------------------------------------------
    @property
    def programs(self) -> tuple[Program, ...]:
        return tuple(self._programs)

    @property
    def launches(self) -> int:
        """Kernel launches so far (1 + one per relaunch after an idle exit or for a wider
        build); 0 on "sim"."""
        return self._kernel.launches if self._kernel is not None else 0

    @property
    def closed(self) -> bool:
        return self._closed

    def add(self, prog: Program) -> None:
        """Serve ``prog`` too (allowed while the kernel runs: its queues were uploaded when it
        was compiled; compile it before the kernel is resident where possible: a module's load
        waits for the kernel to leave). The kernel runs a build of the op bodies of
        the programs it serves: a program with others makes it compile a wider build while
        it runs, then leave after the requests already submitted; the wider build is loaded
        once it has left and launched for the next request."""
        with self._lock:
            self._check_open()
            self._check_program(prog)
            self._widen(prog)
            self._register(prog)

    def _widen(self, prog: Program) -> None:
        """The kernel's build holds ``prog``'s op bodies (its records' now: reload_queues may
        have changed them), widened if not."""
        if self._kernel is not None and prog._executor.bodies & ~self._kernel.bodies:
            self._kernel.widen(prog._executor.bodies, self._close_limit())

    def _check_program(self, prog: Program) -> None:
        if not isinstance(prog, Program):
            raise GraphError(f"a resident kernel serves compiled programs (megak.compile), "
                             f"got {type(prog).__name__}")
        if prog.backend != self.backend:
            raise GraphError(f"a resident kernel serves programs of one backend: this one "
                             f"runs {self.backend!r}, the program {prog.backend!r}")
        if prog in self._programs:
            raise GraphError("this program is already served by this resident kernel")
        if getattr(prog, "_resident", None) is not None:
            raise GraphError("this program is already served by another open resident "
                             "kernel; close that one first")
        ex = prog._executor
        if ex.closed:
            raise GraphError("this program is closed")
        if self.backend != "cuda":
            return
        if ex.managed:
            raise GraphError("a resident kernel serves programs with device memory; compile "
                             "this one without managed=True")
        kernel = self._kernel
        if kernel is not None:
            if ex.ordinal != kernel.ordinal:
                raise GraphError(f"this program runs on GPU {ex.ordinal}, the resident kernel "
                                 f"on GPU {kernel.ordinal}")
            if ex.plan.n_sm > kernel.grid or ex.smem_bytes > kernel.smem_bytes:
                raise GraphError(f"this program needs {ex.plan.n_sm} SMs and "
                                 f"{ex.smem_bytes:,} B of shared memory per block; the resident "
                                 f"kernel has {kernel.grid} and {kernel.smem_bytes:,} B")
            if ex.host_timeout_s > kernel.wait_s:
                raise GraphError(f"this program's host watchdog ({ex.host_timeout_s:g} s) is "
                                 f"longer than what the resident kernel allows a request "
                                 f"({kernel.wait_s:g} s): list it in megak.resident(...)")

    def _register(self, prog: Program) -> None:
        prog._resident = self
        self._programs.append(prog)

    # -- requests ---------------------------------------------------------------------------------
    def submit(self, prog: "Program | Bound", *, out: dict | None = None,
               **inputs) -> "Request":
        """Queue one run of ``prog`` (inputs and ``out=`` as for ``Program.run``) and return
        its `Request` at once. ``prog`` may be a `megak.Bound` of a served program, with no
        other arguments: its arrays, without the call key's per-tensor reads. Raises
        GraphError for bad arguments, MegakernelError when the kernel has stopped after a
        failed request or is closed.

        numpy inputs and outputs go through the program's own device buffers, which the next
        request of the program overwrites: such a request first waits for the program's
        earlier requests that use those buffers (their results are kept for their wait())."""
        bound = None
        if isinstance(prog, Bound):
            if out is not None or inputs:
                raise GraphError("submit(bound): a bound call brings its own arrays; pass "
                                 "no others")
            bound, prog, out, inputs = prog, prog.program, prog._out, prog._inputs
        if self.backend != "cuda":
            key, call = None, None
        elif bound is not None:
            key, call = None, bound._fast_call()
        else:
            key, call = prog._bound_call(inputs, out)
        staged = call is None and self.backend == "cuda" and _uses_own_buffers(prog, inputs, out)
        if staged:
            self._settle(prog)
        with self._lock:
            self._check_open()
            if prog not in self._programs:
                raise GraphError("this program is not served by this resident kernel: "
                                 "pass it to megak.resident(...) or add() it first")
            if self.backend != "cuda":
                return self._submit_sim(prog, out, inputs)
            kernel = self._kernel
            if kernel.stopped is None:
                self._widen(prog)
            if kernel.stopped is not None:
                raise MegakernelError(f"cuda: the resident kernel has stopped "
                                      f"({kernel.stopped[0]}); close it, then run the programs "
                                      f"directly or start a new one")
            looked_up = call is not None
            call, words, table, ticket = prog._prepare_request(inputs, out, (key, call))
            if bound is not None and not looked_up:
                bound._adopt(call)
            deadline = time.monotonic() + prog._executor.host_timeout_s
            s = kernel.post(words, table, ticket, deadline)
            request = Request(self, prog, call, ticket, s, out, inputs)
            if staged:
                self._staged.setdefault(prog, []).append(request)
            return request

    def _settle(self, prog: Program) -> None:
        """Wait for `prog`'s earlier requests through its own buffers (outside the lock:
        waiting takes it). An error stays with its request, raised by its wait()."""
        for request in self._staged.pop(prog, []):
            try:
                request.wait()
            except MegakernelError:
                pass

    def _submit_sim(self, prog: Program, out, inputs) -> "Request":
        if self._failed is not None:
            raise MegakernelError(f"sim: the resident kernel has stopped after a failed "
                                  f"request ({self._failed}); close it first")
        handle = prog._launch_unguarded(out, inputs)
        if handle._error is not None:
            self._failed = handle._error
        return Request(self, prog, None, None, None, out, inputs, handle=handle)

    # -- closing ----------------------------------------------------------------------------------
    def _close_limit(self) -> float:
        """How long close() waits for the kernel to serve what is queued and leave."""
        if self._kernel is None:
            return 0.0
        return min(self._kernel.wait_s, 600.0) + 10.0

    def close(self) -> None:
        """Let the kernel serve what was submitted, then leave; free its ring and state.
        Calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._kernel is not None:
                    self._finalizer.detach()
                    self._kernel.close(self._close_limit())
            finally:
                for prog in self._programs:
                    prog._resident = None

    def __enter__(self) -> "Resident":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise MegakernelError("this resident kernel is closed")

    # -- waiting ------------------------------------------------------------------------------------
    def _wait(self, request: "Request") -> dict:
        """Wait until the device has finished `request` (bounded by its program's host
        watchdog); raise its error; return its numpy outputs (slot -> array)."""
        ex = request._program._executor
        kernel = self._kernel
        ticket, s = request._ticket, request._seq
        if ex.done_soon(ticket):      # a short request ends here
            return ex.finish_request(ticket)
        with self._lock:
            self._raise_if_gone(ex, ticket)

        def follow() -> None:
            with self._lock:
                if self._closed:     # (closed while this waited) nothing of the kernel is left
                    self._raise_if_gone(ex, ticket)
                    return           # to follow: done, as the spin will see
                kernel.kick()
                kernel._check_stream("running a resident request")
                if not kernel.served(s) and not ex.done(ticket):
                    raise MegakernelError(
                        f"cuda: this request was not run: the resident kernel stopped "
                        f"({kernel.stopped[0]}) before it")
        ex.spin_until(lambda: ex.done(ticket), follow, lambda: not kernel.served(s),
                      "running a resident request")
        return ex.finish_request(ticket)

    def _done(self, request: "Request") -> bool:
        ex = request._program._executor
        if ex.done(request._ticket):
            return True
        with self._lock:
            if self._closed:       # the kernel has left (its memory is freed): it never will
                return True
            self._kernel.kick()
            return not self._kernel.served(request._seq)

    def _raise_if_gone(self, ex, ticket: int) -> None:
        """A request still not done once the kernel was closed never runs: close() waited
        for every request the kernel would still serve, then freed what it used (nothing
        of it may be read after). The caller holds the lock."""
        if self._closed and not ex.done(ticket):
            stopped = self._kernel.stopped
            why = f"stopped ({stopped[0]})" if stopped is not None else "was closed"
            raise MegakernelError(f"cuda: this request was not run: the resident kernel "
                                  f"{why} before it")


class Request:
    """A submitted request (`Resident.submit`). ``wait()`` returns what ``Program.run`` would
    (output name -> array), or raises the request's error; ``done()`` says, without waiting,
    whether it has ended (run, failed, or will never run)."""

    __slots__ = ("_resident", "_program", "_call", "_ticket", "_seq", "_out", "_inputs",
                 "_handle", "_result", "_error")

    def __init__(self, resident_: Resident, program: Program, call, ticket, seq, out, inputs,
                 handle=None):
        self._resident = resident_
        self._program = program
        self._call = call
        self._ticket = ticket
        self._seq = seq
        self._out = out           # kept alive until the request is waited on
        self._inputs = inputs
        self._handle = handle     # the simulator's: it ran at submit
        self._result = None
        self._error = None

    def done(self) -> bool:
        if self._handle is not None or self._result is not None or self._error is not None:
            return True
        return self._resident._done(self)

    def wait(self) -> dict:
        """Wait for the request; return output name -> array (the same dict on every call)."""
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        if self._handle is not None:
            self._result = self._handle.wait()
            return self._result
        try:
            host = self._resident._wait(self)
        except (MegakernelError, MegakernelHang) as exc:
            self._error = exc
            raise
        prog = self._program
        if self._call.all_out and not host:
            self._result = dict(self._out)
        else:
            self._result = prog._finish(self._call, host, self._out, self._inputs)
        self._inputs = None
        return self._result


def _uses_own_buffers(prog: Program, inputs: dict, out) -> bool:
    """Whether a request's inputs or outputs go through the program's own buffers: numpy
    inputs, outputs returned as new arrays (not in out=), numpy ones, or outputs copied out
    of megak's buffer after the run instead of written in place."""
    if any(isinstance(v, np.ndarray) for v in inputs.values()):
        return True
    out = out or {}
    return any(name not in out or isinstance(out[name], np.ndarray)
               or not prog._writes_in_place(name) for name in prog.plan.outputs)


def _close_quietly(kernel, limit: float) -> None:
    """Finalizer of a Resident nobody closed: make the kernel leave before the programs'
    memory is freed (freeing waits for a running kernel)."""
    try:
        kernel.close(limit)
    except Exception:
        pass
