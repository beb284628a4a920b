"""Child of benchmarks.audit, run under Nsight Compute: one op's `separate` kernel, launched once.

    python -m benchmarks.audit_target copy|transpose|gemm

Builds the one-op graph, uploads fresh inputs (that runs the megakernel, which ncu's
``--kernel-name megak_op`` filter leaves alone), poisons the output, launches the op once as
its own kernel (entry point megak_op: Bench.time_separate(reps=1, warmup=0, flush_l2=False)),
checks the result against float64, and prints one line ``AUDIT_TARGET {json}`` with what the
parent needs (device, launch shape, ptxas figures of the cubin it ran).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

from . import workloads as W

#: case -> workload factory; sizes as the issue asks (8192^2 copy and transpose, 2048^3 GEMM)
CASES = {
    "copy": lambda: W.w5(8192, 8192),
    "transpose": lambda: W.w4(8192),
    "gemm": lambda: W.w3(2048),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CASES:
        print(f"usage: python -m benchmarks.audit_target {{{'|'.join(CASES)}}}", file=sys.stderr)
        return 2
    os.environ.setdefault("CUDA_PYTHON_DISABLE_VERSION_CHECK", "1")
    import megak
    from megak.runtime.bench import Bench
    from megak.runtime.compiler import parse_ptxas_log

    case = argv[0]
    w = CASES[case]()
    rng = np.random.default_rng()
    inputs = w.make_inputs(rng)
    ref = w.reference(inputs, rng)
    with megak.compile(w.build(), backend="cuda") as prog:
        b = Bench(prog)
        try:
            b.upload(**inputs)
            b.poison()
            b.time_separate(reps=1, warmup=0, flush_l2=False)
            err = w.check(ref, b.outputs(), f"{case} (separate kernel)")
        finally:
            b.close()
        ex = prog._executor
        compiled = ex.compiled
        plan = prog.plan
        info = {
            "case": case,
            "workload": w.name,
            "description": w.description,
            "device": ex.info["name"],
            "sm_count": ex.info["sm_count"],
            "arch": ex.info["arch"],
            "driver_api": ex.info["driver_version"],
            "launches": len(plan.op_labels),
            "grid": int(len(plan.instrs)),
            "pages": int(plan.instrs["pages"].max()) if len(plan.instrs) else 0,
            "check": "exact" if err == 0.0 else f"max |err|/bound {err:.2g}",
            "ptxas": {entry: parse_ptxas_log(compiled.log, entry)
                      for entry in ("megak_op", "megakernel")},
        }
    print("AUDIT_TARGET " + json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
