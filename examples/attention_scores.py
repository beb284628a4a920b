"""Attention without softmax for several heads, batched as one graph:
S_h = Q_h @ K_h^T, O_h = S_h @ V_h. The heads are independent chains, so their tiles spread
over the SMs and run concurrently inside the one megakernel.
Each GEMM is checked against float64 on its computed input, within its fp32 error bound
(megak.accuracy); prints PASS. Smaller sizes on the simulator."""
import sys

import numpy as np

import megak
from megak.accuracy import check, gemm_expected


def main() -> int:
    backend = megak.resolve_backend(None)
    heads, seq, dim = (8, 1024, 128) if backend == "cuda" else (3, 130, 64)
    g = megak.Graph()
    for h in range(heads):
        q = g.input(f"q{h}", (seq, dim), "float32")
        k = g.input(f"k{h}", (seq, dim), "float32")
        v = g.input(f"v{h}", (seq, dim), "float32")
        scores = g.gemm(q, g.transpose(k))          # (seq, seq)
        g.output(scores, f"s{h}")                   # also an output: S @ V is checked on it
        g.output(g.gemm(scores, v), f"o{h}")        # (seq, dim)
    prog = megak.compile(g)
    rng = np.random.default_rng()
    x = {name: rng.uniform(-1, 1, t.shape).astype(np.float32) for name, t in g.inputs.items()}
    out = prog.run(**x)
    print(f"backend={prog.backend} heads={heads} seq={seq} dim={dim} "
          f"{prog.stats['instructions_per_opcode']} on {prog.plan.n_sm} SMs")
    checks = []
    for h in range(heads):
        checks.append(check(out[f"s{h}"], gemm_expected(x[f"q{h}"], x[f"k{h}"].T),
                            f"head {h}: S = Q @ K^T (fp32, K={dim})"))
        checks.append(check(out[f"o{h}"], gemm_expected(out[f"s{h}"], x[f"v{h}"]),
                            f"head {h}: O = S @ V (fp32, K={seq})"))
    # one line per kind of GEMM, for its worst head: 16 lines for 8 heads say no more
    ok = all(c.ok for c in checks)
    for kind in (0, 1):
        print(max(checks[kind::2], key=lambda c: c.ratio).line())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
