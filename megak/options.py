"""compile()'s settings, typed and checked: the plan's shape (``n_sm``, ``n_pages``) and each
backend's options, as frozen dataclasses.

Every backend accepts every option and checks its value, but uses only its own: the backend
is often picked at run time (MEGAK_BACKEND, or whether a GPU is usable), so one compile()
call has to work on both. GPU settings have no effect on the simulator, and the simulator's
interleaving settings have none on the GPU, where the hardware decides the order.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import numpy as np

from .errors import GraphError

__all__ = [
    "OPTION_NAMES",
    "SIM_ORDERS",
    "CudaOptions",
    "SimOptions",
    "backend_options",
    "check_count",
]

SIM_ORDERS = ("round_robin", "random")


@dataclass(frozen=True)
class SimOptions:
    """Options of the CPU simulator.

    ``order``: how the simulator interleaves the SMs' loader and compute actors,
    "round_robin" (default) or "random" (a different valid interleaving per seed, to shake
    out ordering bugs). ``seed``: a non-negative int seeding the "random" order, or None
    (default) for a fresh seed; unused by "round_robin". No effect on the GPU.
    """
    order: str = "round_robin"
    seed: int | None = None

    def __post_init__(self):
        if not isinstance(self.order, str) or self.order not in SIM_ORDERS:
            raise GraphError(f"compile(): order={self.order!r} is not a simulator order; "
                             f"allowed: {', '.join(SIM_ORDERS)}")
        if self.seed is not None and not (_is_int(self.seed) and self.seed >= 0):
            raise GraphError(f"compile(): seed={self.seed!r} must be a non-negative int or "
                             f"None")
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))


@dataclass(frozen=True)
class CudaOptions:
    """Options of the CUDA backend.

    ``timeout_s``: deadline in seconds of every wait inside the megakernel (default 5); a
    wait past it ends the run with a `megak.MegakernelError` (`megak.MegakernelHang` for a
    dependency wait). ``managed``: keep the graph's
    tensors in CUDA managed memory instead of device memory (default False). ``debug``: fill
    every tensor that is not an input with NaN before each run, check each instruction's
    operands and, at the end, that every page came back (default False). No effect on the
    simulator, which always checks pages.
    """
    timeout_s: float = 5.0
    managed: bool = False
    debug: bool = False

    def __post_init__(self):
        ok = isinstance(self.timeout_s, numbers.Real) and not _is_bool(self.timeout_s)
        if not (ok and self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise GraphError(f"compile(): timeout_s={self.timeout_s!r} must be a positive "
                             f"number of seconds")
        object.__setattr__(self, "timeout_s", float(self.timeout_s))
        for name in ("managed", "debug"):
            value = getattr(self, name)
            if not _is_bool(value):
                raise GraphError(f"compile(): {name}={value!r} must be True or False")
            object.__setattr__(self, name, bool(value))


_BY_BACKEND = {"sim": SimOptions, "cuda": CudaOptions}
OPTION_NAMES = tuple(f.name for cls in _BY_BACKEND.values() for f in dataclasses.fields(cls))
_ALLOWED = "; ".join(f"{', '.join(f.name for f in dataclasses.fields(cls))} ({backend})"
                     for backend, cls in _BY_BACKEND.items())


def backend_options(backend: str, options: dict) -> SimOptions | CudaOptions:
    """Check every one of compile()'s ``**options`` and return `backend`'s own, typed."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise GraphError(f"compile(): unknown option(s) {', '.join(map(repr, unknown))}; "
                         f"allowed: {_ALLOWED}")
    chosen = None
    for name, cls in _BY_BACKEND.items():
        own = {f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options}
        parsed = cls(**own)          # checks the other backend's options too
        if name == backend:
            chosen = parsed
    if chosen is None:
        raise GraphError(f"unknown backend {backend!r}; allowed: {', '.join(_BY_BACKEND)}")
    return chosen


def check_count(name: str, value, most: int | None = None) -> int | None:
    """``value`` as a positive int (at most ``most``); None stays None (the default)."""
    if value is None:
        return None
    if not _is_int(value) or value < 1 or (most is not None and value > most):
        allowed = f"an int from 1 to {most}" if most is not None else "an int >= 1"
        raise GraphError(f"compile(): {name}={value!r} is not a valid count; allowed: "
                         f"{allowed}, or None for the default")
    return int(value)


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_int(value) -> bool:
    # bool is an int subclass, but True SMs or pages is a mistake, not a count
    return isinstance(value, numbers.Integral) and not _is_bool(value)
