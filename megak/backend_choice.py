"""Which backend a run would get, and whether it can run, for messages before compile().

megak.compile() picks (program.resolve_backend, built on `choose_backend`): its `backend`
argument, else MEGAK_BACKEND, else "cuda" when a GPU is usable, else "sim"; a "cuda" request
without a usable GPU raises there. The command line asks the same questions first, so that it
can answer in one line instead of a traceback.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

BACKENDS = ("sim", "cuda")


@dataclass
class BackendChoice:
    name: str           # the backend asked for (may be no backend at all: see `valid`)
    source: str         # who asked: "--backend", "MEGAK_BACKEND" or "default"
    gpu_reason: str     # why no GPU is usable ("" when one is)

    @property
    def valid(self) -> bool:
        return self.name in BACKENDS

    @property
    def runnable(self) -> bool:
        return self.valid and (self.name != "cuda" or not self.gpu_reason)

    @property
    def asked_as(self) -> str:
        """How the request reads on the command line: "--backend cuda", "MEGAK_BACKEND=cuda"."""
        if self.source == "--backend":
            return f"--backend {self.name}"
        if self.source == "MEGAK_BACKEND":
            return f"MEGAK_BACKEND={self.name}"
        return "the default"


def choose_backend(backend: str | None = None, source: str = "--backend") -> BackendChoice:
    """The backend compile(backend=...) resolves, and who asked for it (`source` names the
    caller's argument). The GPU is probed only when the answer depends on it."""
    def reason() -> str:
        from .runtime.driver import gpu_unusable_reason, gpu_usable
        return "" if gpu_usable() else (gpu_unusable_reason() or "no reason given")
    if backend:
        return BackendChoice(backend, source, reason() if backend == "cuda" else "")
    env = os.environ.get("MEGAK_BACKEND")
    if env:
        return BackendChoice(env, "MEGAK_BACKEND", reason() if env == "cuda" else "")
    why = reason()
    return BackendChoice("sim" if why else "cuda", "default", why)
