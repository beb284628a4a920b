"""The call cache of Program (GPU tensors: a repeated call reuses its checked binding), run
on the CPU with stand-ins for torch tensors: it keeps no caller tensor alive, drops a call
when one of its tensors is freed (before the tensor's id can be reused), and evicts the oldest
call past _MAX_CALLS. The GPU side is tests/runtime/test_call_path.py."""
import gc
import weakref

import pytest

import megak
from megak import interop, program


class Tensor:
    """What the call key reads of a torch GPU tensor."""

    def __init__(self, ptr: int):
        self.ptr, self.shape = ptr, (4, 8)

    def data_ptr(self) -> int:
        return self.ptr

    def stride(self) -> tuple:
        return (8, 1)


class Binding:
    live = True


@pytest.fixture
def prog(monkeypatch):
    g = megak.Graph()
    g.output(g.copy(g.input("x", (4, 8))), "y")
    p = megak.compile(g, backend="sim")
    monkeypatch.setattr(interop, "torch_tensor_types", lambda: (Tensor,))
    monkeypatch.setattr(p, "backend", "cuda")      # the cache is the GPU path's
    yield p
    monkeypatch.setattr(p, "backend", "sim")
    p.close()


def remember(prog, x, y):
    key, call = prog._bound_call({"x": x}, {"y": y})
    assert call is None and key is not None
    call = program._Call(arrays={}, external={0: object()}, slots=[], kind="torch",
                         on_gpu=True, targets={"y": object()}, in_place={"y": ("out", None)})
    prog._bind(call, Binding())
    prog._remember(key, call, {"x": x}, {"y": y})
    return call


def test_a_cached_call_holds_no_tensor_and_goes_when_one_is_freed(prog):
    x, y = Tensor(1 << 20), Tensor(2 << 20)
    call = remember(prog, x, y)
    assert prog._bound_call({"x": x}, {"y": y})[1] is call and call.all_out
    assert call.external == {} and call.targets == {"y": None}
    freed = weakref.ref(x)
    del x
    gc.collect()
    assert freed() is None, "the cache kept the input alive"
    assert not prog._calls and call.guards == ()
    x2 = Tensor(1 << 20)                              # same address: a new call
    assert prog._bound_call({"x": x2}, {"y": y})[1] is None


def test_eviction_and_close_release_the_guards(prog):
    keep = [(Tensor(i << 12), Tensor((i << 12) + 64)) for i in range(program._MAX_CALLS + 3)]
    calls = [remember(prog, x, y) for x, y in keep]
    assert len(prog._calls) == program._MAX_CALLS
    assert all(c.guards == () for c in calls[:3])     # evicted, the oldest first
    assert all(len(c.guards) == 2 for c in calls[3:])
    del keep[:3]
    gc.collect()                                      # their guards were detached: no-op
    assert len(prog._calls) == program._MAX_CALLS
    prog._forget_calls()
    assert not prog._calls and all(c.guards == () for c in calls)
