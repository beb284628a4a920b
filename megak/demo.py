"""The demo pipeline behind `python -m megak demo` (the README's main job).

GEMM -> transpose -> GEMM -> copy, checked against float64, on the best backend.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import compile as megak_compile
from .graph import Graph

U32 = 2.0 ** -24


def demo_graph(m: int = 384, k: int = 256, n: int = 300) -> Graph:
    g = Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    h = g.gemm(a, b)              # (m, n)
    y = g.gemm(g.transpose(h), a)  # (n, m) @ (m, k)
    g.output(g.copy(y), "y")
    return g


def run_demo(backend: str | None = None, trace_dir: str | Path | None = None,
             seed: int | None = None) -> bool:
    g = demo_graph()
    prog = megak_compile(g, backend=backend)
    rng = np.random.default_rng(seed)
    x = {name: rng.uniform(-1, 1, t.shape).astype(np.float32) for name, t in g.inputs.items()}
    y = prog.run(trace=trace_dir is not None, **x)["y"]
    a, b = x["a"].astype(np.float64), x["b"].astype(np.float64)
    ref = (a @ b).T @ a
    bound = 2 * (a.shape[1] + a.shape[0]) * U32 * ((np.abs(a) @ np.abs(b)).T @ np.abs(a))
    ok = bool(y.shape == ref.shape and np.isfinite(y).all() and (np.abs(y - ref) <= bound).all())
    print(f"backend: {prog.backend}, {prog.plan.n_sm} SMs, {prog.plan.n_pages} pages/SM, "
          f"instructions {prog.stats['instructions_per_opcode']}")
    print(f"max |error| {np.abs(y - ref).max():.3e} (fp32 bound {bound.max():.3e})")
    if trace_dir is not None:
        out = Path(trace_dir)
        out.mkdir(parents=True, exist_ok=True)
        tr = prog.last_trace
        tr.save_json(out / "demo_trace.json")
        print(f"trace: {out / 'demo_trace.json'} (open in ui.perfetto.dev)")
        try:
            tr.save_png(out / "demo_trace.png")
            print(f"trace: {out / 'demo_trace.png'}")
        except ImportError as e:
            print(f"trace: no PNG ({e})")
        print(tr.summary())
    prog.close()
    print("PASS" if ok else "FAIL")
    return ok
