"""The demo pipeline behind `python -m megak demo` (the README's main job).

GEMM -> transpose -> GEMM -> copy on the best backend, each GEMM checked against float64 on
its computed input (megak.accuracy says why and derives the bounds).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import compile as megak_compile
from .accuracy import check, gemm_expected, report
from .graph import Graph
from .trace_files import save_trace_files


def demo_graph(m: int = 384, k: int = 256, n: int = 300) -> Graph:
    g = Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    h = g.gemm(a, b)              # (m, n)
    g.output(h, "h")              # also an output, so the second GEMM is checked on it
    y = g.gemm(g.transpose(h), a)  # (n, m) @ (m, k)
    g.output(g.copy(y), "y")
    return g


def run_demo(backend: str | None = None, trace_dir: str | Path | None = None,
             seed: int | None = None) -> bool:
    g = demo_graph()
    prog = megak_compile(g, backend=backend)
    rng = np.random.default_rng(seed)
    x = {name: rng.uniform(-1, 1, t.shape).astype(np.float32) for name, t in g.inputs.items()}
    out = prog.run(trace=trace_dir is not None, **x)
    print(f"backend: {prog.backend}, {prog.plan.n_sm} SMs, {prog.plan.n_pages} pages/SM, "
          f"instructions {prog.stats['instructions_per_opcode']}")
    m, k = x["a"].shape
    ok = report([
        check(out["h"], gemm_expected(x["a"], x["b"]), f"h = a @ b (fp32, K={k})"),
        # transpose and copy move bits: y must be the fp32 GEMM of the computed h
        check(out["y"], gemm_expected(out["h"].T, x["a"]),
              f"y = copy(h^T @ a) (fp32, K={m})"),
    ])
    if trace_dir is not None:
        for line in save_trace_files(prog.last_trace, trace_dir, "demo_trace"):
            print(line)
        print(prog.last_trace.summary())
    prog.close()
    print("PASS" if ok else "FAIL")
    return ok
