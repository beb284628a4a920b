"""Program.bind: one program's call on fixed arrays, repeated at the cost of a launch."""
from __future__ import annotations

from . import interop

__all__ = ["Bound"]


class Bound:
    """A call of one program on arrays fixed once (`Program.bind`); ``run()`` and
    ``launch()`` take only the stream.

    A repeated ``Program.run`` reads every torch tensor's address, shape and strides to find
    its checked binding (three accessor calls per tensor, ~0.9 us a tensor on a slow host:
    30 us for a 16-layer chain's 33 tensors). A bound call was checked when it was made and reads
    only each torch tensor's address per call, so it costs one launch on any number of
    tensors, as a CUDA graph's replay does. The contract is a CUDA graph's too: the arrays
    are read and written where they were when bound, with the shapes and strides they had
    then; write new values into them between calls. A torch tensor whose address changed
    (``resize_``, ``set_``, ``.data =``) is seen, and the call is checked and bound again
    (raising GraphError if it no longer fits); a change of shape or strides that keeps the
    address is not: bind again after one. The bound call holds its arrays alive.

    A resident kernel serving the program takes a bound call too: ``r.submit(bound)``
    posts its request without the key (megak.resident).

    Calls with arrays other than GPU torch tensors and nn.Parameters (numpy, host tensors,
    cupy and other GPU arrays) take ``Program.run``'s full path on every call, with the same
    results.
    """

    __slots__ = ("_program", "_inputs", "_out", "_tensors", "_ptrs", "_data_ptr", "_call")

    def __init__(self, program, inputs: dict, out: dict | None, call):
        self._program = program
        self._inputs = inputs
        self._out = out
        self._call = call             # the checked _Call, bound once a launch made its table
        types = interop.torch_tensor_types()
        arrays = (*inputs.values(), *(out or {}).values())
        # exact types, as the call key takes them: another subclass may override data_ptr
        self._tensors = tuple(a for a in arrays if type(a) in types)
        self._data_ptr = types[0].data_ptr if types else None
        self._ptrs = [t.data_ptr() for t in self._tensors]

    @property
    def program(self):
        """The bound program."""
        return self._program

    def run(self, *, stream=None) -> dict:
        """Run the program once on the bound arrays and wait; return what ``Program.run``
        returns (with ``out=`` naming every output: that dict). ``stream`` as for
        ``Program.run``. Raises as ``Program.run`` does."""
        call = self._fast_call()
        if call is None or self._program._resident is not None:
            return self._launch(stream).wait()
        return self._program._run_bound(call, stream, self._out, self._inputs)

    def launch(self, *, stream=None):
        """Enqueue one run on the bound arrays and return its `Handle` at once, as
        ``Program.launch`` does (capturable in a CUDA graph on the fast path)."""
        call = self._fast_call()
        if call is None or self._program._resident is not None:
            return self._launch(stream)
        return self._program._launch_bound(call, stream, self._out, self._inputs)

    def _fast_call(self):
        """The bound _Call when its tensor table is the whole call (a launch, or a resident
        kernel's request, on it): the table still holds these tensors (live) and no torch
        tensor moved; else None."""
        call = self._call
        if call is None or call.binding is None or not call.binding.live:
            return None
        if list(map(self._data_ptr, self._tensors)) != self._ptrs:
            return None
        return call

    def _launch(self, stream):
        """Program.launch's full path: every array checked again and, where the call
        allocates and copies nothing, bound for the next call."""
        prog = self._program
        if prog._resident is not None:
            return prog.launch(out=self._out, stream=stream, **self._inputs)   # it raises
        handle = prog._launch(self._out, stream, False, self._inputs)
        self._adopt(handle._call)
        return handle

    def _adopt(self, call) -> None:
        """The call just checked on the full path (a launch, or a resident kernel's
        request): its table, where it has one, serves the next calls."""
        self._ptrs = [t.data_ptr() for t in self._tensors]
        self._call = call if call.binding is not None else None

    def __repr__(self) -> str:
        names = ", ".join(self._inputs)
        return f"<megak.Bound of {len(self._inputs)} inputs ({names}) on {self._program!r}>"

