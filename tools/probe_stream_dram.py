#!/usr/bin/env python3
"""Probe: the DRAM bytes a W2 bf16 chain reads per run, megak's megakernel against torch's
matmuls of the same layers, for ncu.

Why: at batch 64 the weight stream has two row bands of 32 rows per 64-column band, and each
streams the band's B into its SM (evict-first in L2). Whether the two SMs' copies of the same
box meet in L2 (one DRAM read) or each go to DRAM (two) decides what a 64-row band could
gain: DRAM bytes per run against the weights' bytes answer it. Batch 16 (one band per
column block) is the control.

Compiles each chain (the report's W2 workload), checks it against float64 layer by layer,
prints its median (CUDA events, 20 runs, no flush), then runs one megakernel launch and the
torch chain (torch.mm per layer, the report's torch case) between cudaProfilerStart / Stop. Under ncu:

    ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum,\\
        lts__t_sectors_op_read.sum,gpu__time_duration.sum \\
        python tools/probe_stream_dram.py --batches 16 64
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

import megak  # noqa: E402
from benchmarks.workloads import w2  # noqa: E402
from megak.runtime.bench import Bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    import torch
    rng = np.random.default_rng(0)
    runs = []
    for batch in args.batches:
        work = w2(args.hidden, args.layers, batch, "bfloat16")
        prog = megak.compile(work.build(), backend="cuda")
        inputs = work.make_inputs(rng)
        ratio = work.check(work.reference(inputs, rng), prog.run(**inputs), f"b{batch}")
        b = Bench(prog)
        b.upload(**inputs)
        t = float(np.median(b.time_megakernel(reps=20, flush_l2=False)))
        case = work.torch_case(inputs, torch, "cuda")
        print(f"{args.hidden}x{args.layers} batch {batch}: megak {t:.1f} us, weights "
              f"{work.weight_bytes / 1e6:.1f} MB; max |err|/bound {ratio:.3f}", flush=True)
        runs.append((b, case))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for b, case in runs:
        b.time_megakernel(reps=1, warmup=0, flush_l2=False)
        case.run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for b, _ in runs:
        b.close()


if __name__ == "__main__":
    main()
