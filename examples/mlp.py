"""A bf16 MLP as one megakernel: per layer h = GELU(x @ W1 + b1), x = h @ W2 + b2 + x.

Both GEMMs of a layer and their epilogues (bias, GELU, residual) are fused instructions on
tensor cores, fp32 accumulation, bf16 activations between layers. Checked against torch
(GPU or CPU) when torch is importable, else float64 numpy, and prints PASS.
Runs on the GPU when usable, else on the simulator with smaller sizes.
"""
import argparse
from pathlib import Path

import numpy as np

import megak
from megak.dtypes import numpy_dtype


def build(batch: int, hidden: int, ffn: int, layers: int) -> megak.Graph:
    g = megak.Graph()
    x = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        w1 = g.input(f"w1_{i}", (hidden, ffn), "bfloat16")
        b1 = g.input(f"b1_{i}", (ffn,), "bfloat16")
        w2 = g.input(f"w2_{i}", (ffn, hidden), "bfloat16")
        b2 = g.input(f"b2_{i}", (hidden,), "bfloat16")
        h = g.gemm(x, w1, bias=b1, activation="gelu")
        x = g.gemm(h, w2, bias=b2, residual=x)
    g.output(x, "y")
    return g


def reference(inputs: dict, layers: int) -> np.ndarray:
    """The same math in float64, rounding activations to bf16 between GEMMs as megak does."""
    bf16 = numpy_dtype("bfloat16")

    def r(v):   # round to bf16 and back
        return v.astype(np.float32).astype(bf16).astype(np.float64)

    def gelu(v):
        return 0.5 * v * (1 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3)))
    x = inputs["x"].astype(np.float64)
    for i in range(layers):
        f = {k: inputs[f"{k}_{i}"].astype(np.float64) for k in ("w1", "b1", "w2", "b2")}
        h = r(gelu(x @ f["w1"] + f["b1"]))
        x = r(h @ f["w2"] + f["b2"] + x)
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", metavar="DIR", help="also write mlp_trace.{json,png} here")
    args = parser.parse_args()
    backend = megak.resolve_backend(None)
    batch, hidden, ffn, layers = (16, 1024, 4096, 4) if backend == "cuda" else (16, 128, 256, 3)
    g = build(batch, hidden, ffn, layers)
    prog = megak.compile(g)
    rng = np.random.default_rng()
    bf16 = numpy_dtype("bfloat16")
    inputs = {}
    for name, t in g.inputs.items():
        fan_in = t.shape[0] if len(t.shape) == 2 and name != "x" else 1
        inputs[name] = (rng.standard_normal(t.shape) / np.sqrt(fan_in)).astype(np.float32).astype(bf16)

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and backend == "cuda":
        feed = {k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16).cuda()
                for k, v in inputs.items()}
        y = prog.run(**feed)["y"]                      # torch in, torch out, zero-copy
        if args.trace:
            prog.run(trace=True, **feed)
        x = feed["x"].float()
        for i in range(layers):                        # torch's own bf16 MLP, fp32 math
            h = torch.nn.functional.gelu(x @ feed[f"w1_{i}"].float() + feed[f"b1_{i}"].float(),
                                         approximate="tanh").bfloat16().float()
            x = (h @ feed[f"w2_{i}"].float() + feed[f"b2_{i}"].float() + x).bfloat16().float()
        got, want, against = y.float().cpu().numpy(), x.cpu().numpy(), "torch"
    else:
        got = prog.run(trace=bool(args.trace), **inputs)["y"].astype(np.float64)
        want, against = reference(inputs, layers), "float64 numpy"
    # bf16 activations: each layer may round differently by an ulp (2^-8 relative), and
    # the difference propagates; allow a few bf16 ulps of the activations' scale
    err = np.abs(got - want)
    scale = np.abs(want).max()
    tol = 8 * 2.0 ** -8 * scale
    print(f"backend={prog.backend} batch={batch} hidden={hidden} ffn={ffn} layers={layers} "
          f"instructions={prog.stats['instructions']} vs {against}: max|err| {err.max():.3e} "
          f"(tolerance {tol:.3e}, |y| max {scale:.2f})")
    assert got.shape == (batch, hidden) and np.isfinite(got).all()
    assert err.max() <= tol, "MLP result outside tolerance"
    if args.trace:
        out = Path(args.trace)
        out.mkdir(parents=True, exist_ok=True)
        prog.last_trace.save_json(out / "mlp_trace.json")
        prog.last_trace.save_png(out / "mlp_trace.png")
        print(prog.last_trace.summary())
    print("PASS")


if __name__ == "__main__":
    main()
