"""A bf16 MLP as one megakernel: per layer h = GELU(x @ W1 + b1), x = h @ W2 + b2 + x.

Both GEMMs of a layer and their epilogues (bias, GELU, residual) are fused instructions on
tensor cores, fp32 accumulation, bf16 activations between layers. With torch on the GPU,
torch tensors go in and come out zero-copy. Every GEMM is checked against float64 on its
computed bf16 input, within the error bound of that GEMM (megak.accuracy derives it): a bound
carried through the layers from the inputs alone would be too loose to catch anything.
Prints PASS. Runs on the GPU when usable, else on the simulator with smaller sizes.
"""
import argparse
import sys

import numpy as np

import megak
from megak.accuracy import check, gemm_expected, report
from megak.dtypes import numpy_dtype
from megak.trace_files import TraceDirError, make_trace_dir, save_trace_files


def build(batch: int, hidden: int, ffn: int, layers: int) -> megak.Graph:
    """Every layer's h and x are outputs too (they live in device memory anyway), so each
    GEMM can be checked on its own input."""
    g = megak.Graph()
    x = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        w1 = g.input(f"w1_{i}", (hidden, ffn), "bfloat16")
        b1 = g.input(f"b1_{i}", (ffn,), "bfloat16")
        w2 = g.input(f"w2_{i}", (ffn, hidden), "bfloat16")
        b2 = g.input(f"b2_{i}", (hidden,), "bfloat16")
        h = g.gemm(x, w1, bias=b1, activation="gelu")
        g.output(h, f"h{i}")
        x = g.gemm(h, w2, bias=b2, residual=x)
        g.output(x, f"x{i + 1}" if i + 1 < layers else "y")
    return g


def check_layers(inputs: dict, out: dict, layers: int) -> list:
    """Layer by layer, each GEMM on what megak computed before it."""
    checks = []
    x = inputs["x"]
    for i in range(layers):
        w1, b1, w2, b2 = (inputs[f"{k}_{i}"] for k in ("w1", "b1", "w2", "b2"))
        h = out[f"h{i}"]
        checks.append(check(h, gemm_expected(x, w1, bias=b1, activation="gelu",
                                             out_dtype="bfloat16"),
                            f"layer {i}: h = GELU(x @ W1 + b1) (bf16, K={w1.shape[0]})"))
        name = f"x{i + 1}" if i + 1 < layers else "y"
        checks.append(check(out[name], gemm_expected(h, w2, bias=b2, residual=x,
                                                     out_dtype="bfloat16"),
                            f"layer {i}: {name} = h @ W2 + b2 + x (bf16, K={w2.shape[0]})"))
        x = out[name]
    return checks


def run(prog, inputs: dict, trace: bool) -> dict:
    """Run once; on the GPU with torch, through torch tensors (zero-copy in and out).
    Returns numpy bf16 arrays."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or prog.backend != "cuda":
        return prog.run(trace=trace, **inputs)
    feed = {k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16).cuda()
            for k, v in inputs.items()}
    out = prog.run(trace=trace, **feed)              # torch in, torch out
    bf16 = numpy_dtype("bfloat16")
    return {k: t.view(torch.int16).cpu().numpy().view(bf16) for k, t in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", metavar="DIR",
                        help="also write mlp_trace.json (and .png with megak[plot]) here")
    args = parser.parse_args()
    if args.trace is not None:
        try:
            make_trace_dir(args.trace)               # before the run: a bad path costs none
        except TraceDirError as e:
            print(f"{parser.prog}: --trace: {e}", file=sys.stderr)
            return 2
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

    out = run(prog, inputs, trace=False)
    if args.trace is not None:
        out = run(prog, inputs, trace=True)          # warm: what a steady run looks like
    print(f"backend={prog.backend} batch={batch} hidden={hidden} ffn={ffn} layers={layers} "
          f"instructions={prog.stats['instructions']}")
    ok = report(check_layers(inputs, out, layers))
    if args.trace is not None:
        for line in save_trace_files(prog.last_trace, args.trace, "mlp_trace"):
            print(line)
        print(prog.last_trace.summary())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
