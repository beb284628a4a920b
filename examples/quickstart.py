"""Quickstart: a GEMM -> transpose -> GEMM -> copy pipeline run as one megakernel.

Runs on the GPU when one is usable, else on the CPU simulator (MEGAK_BACKEND=sim|cuda
chooses). Checks each GEMM against float64 on its computed input, within the fp32 error
bound of that GEMM (megak.accuracy derives it), and prints PASS.
"""
import sys

import numpy as np

import megak
from megak.accuracy import check, gemm_expected, report


def main() -> int:
    g = megak.Graph()
    a = g.input("a", (384, 256), "float32")
    b = g.input("b", (256, 300), "float32")
    h = g.gemm(a, b)             # (384, 300), 128 x 128 tiles with edge tiles
    g.output(h, "h")             # also an output: the second GEMM is checked on it
    ht = g.transpose(h)          # (300, 384), 128 x 128 tiles through registers
    y = g.gemm(ht, a)            # (300, 256): each tile waits only on the rows it reads
    g.output(g.copy(y), "y")

    prog = megak.compile(g)
    rng = np.random.default_rng()
    inputs = {"a": rng.uniform(-1, 1, (384, 256)).astype(np.float32),
              "b": rng.uniform(-1, 1, (256, 300)).astype(np.float32)}
    out = prog.run(**inputs)

    print(f"backend={prog.backend} sms={prog.plan.n_sm} pages/SM={prog.plan.n_pages} "
          f"instructions={prog.stats['instructions_per_opcode']}")
    ok = report([
        check(out["h"], gemm_expected(inputs["a"], inputs["b"]), "h = a @ b (fp32, K=256)"),
        # transpose and copy move bits: y is the fp32 GEMM of the computed h
        check(out["y"], gemm_expected(out["h"].T, inputs["a"]), "y = h^T @ a (fp32, K=384)"),
    ])
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
