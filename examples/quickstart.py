"""Quickstart: a GEMM -> transpose -> GEMM -> copy pipeline run as one megakernel.

Runs on the GPU when one is usable, else on the CPU simulator (MEGAK_BACKEND=sim|cuda
chooses). Checks the result against float64 numpy and prints PASS.
"""
import numpy as np

import megak


def main() -> None:
    g = megak.Graph()
    a = g.input("a", (384, 256), "float32")
    b = g.input("b", (256, 300), "float32")
    h = g.gemm(a, b)             # (384, 300), 128 x 128 tiles with edge tiles
    ht = g.transpose(h)          # (300, 384), 128 x 128 tiles through registers
    y = g.gemm(ht, a)            # (300, 256): each tile waits only on the rows it reads
    g.output(g.copy(y), "y")

    prog = megak.compile(g)
    rng = np.random.default_rng()
    inputs = {"a": rng.uniform(-1, 1, (384, 256)).astype(np.float32),
              "b": rng.uniform(-1, 1, (256, 300)).astype(np.float32)}
    out = prog.run(**inputs)["y"]

    a64, b64 = inputs["a"].astype(np.float64), inputs["b"].astype(np.float64)
    ref = (a64 @ b64).T @ a64
    # fp32 bound for two chained dot products (K = 256, then 384), u = 2^-24
    mag = (np.abs(a64) @ np.abs(b64)).T @ np.abs(a64)
    bound = 2 * (256 + 384) * 2.0**-24 * mag
    err = np.abs(out - ref)
    print(f"backend={prog.backend} sms={prog.plan.n_sm} pages/SM={prog.plan.n_pages} "
          f"instructions={prog.stats['instructions_per_opcode']} "
          f"max|err|={err.max():.2e} (bound {bound.max():.2e})")
    assert out.shape == (300, 256) and out.dtype == np.float32
    assert (err <= bound).all(), "result outside the fp32 error bound"
    print("PASS")


if __name__ == "__main__":
    main()
