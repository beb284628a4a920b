"""(A @ B)^T @ C as one megakernel: the transpose moves 128 x 128 tiles through registers,
and each tile of the second GEMM waits only on the transpose tiles it reads.
Each GEMM is checked against float64 on its computed input, within its fp32 error bound
(megak.accuracy); prints PASS. Smaller sizes on the simulator."""
import sys

import numpy as np

import megak
from megak.accuracy import check, gemm_expected, report


def main() -> int:
    backend = megak.resolve_backend(None)
    m, k, n, p = (2048, 1024, 1536, 512) if backend == "cuda" else (300, 129, 200, 65)
    g = megak.Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    c = g.input("c", (m, p), "float32")
    ab = g.gemm(a, b)                         # (m, n)
    g.output(ab, "ab")                        # also an output: the second GEMM is checked on it
    g.output(g.gemm(g.transpose(ab), c), "y")  # (n, p)
    prog = megak.compile(g)
    rng = np.random.default_rng()
    x = {name: rng.uniform(-1, 1, t.shape).astype(np.float32) for name, t in g.inputs.items()}
    out = prog.run(**x)
    print(f"backend={prog.backend} (A[{m}x{k}] @ B[{k}x{n}])^T @ C[{m}x{p}]: "
          f"{prog.stats['instructions_per_opcode']}")
    ok = report([
        check(out["ab"], gemm_expected(x["a"], x["b"]), f"ab = a @ b (fp32, K={k})"),
        check(out["y"], gemm_expected(out["ab"].T, x["c"]), f"y = ab^T @ c (fp32, K={m})"),
    ])
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
