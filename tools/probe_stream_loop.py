#!/usr/bin/env python3
"""Probe: what bounds the streamed GEMM's k loop. The W2-4096x8 chain (batch 16, parts 2) is
timed and traced as built, then with parts of the loop cut out of the device source (results
wrong, timing only): no A staging (the MMAs read stale shared memory), no MMAs, and neither.
The k loop's median per stage says which one the loop waits for.

    python tools/probe_stream_loop.py
"""
import numpy as np

import megak
from megak import abi
from megak.dtypes import numpy_dtype
from megak.runtime import compiler
from megak.runtime.bench import Bench

CUTS = {
    "as built": [],
    "no A staging": [("""        if (live)
            mk_stream_chunk_a(buf, ga, TA.ld, in.rows, MTS, in.klen,
                              STAGE_K * s + kb, a_vec);""", "")],
    "no ring wait": [("__all_sync(0xffffffffu, mk_stream_wait_full(ctl, slot, pos, parity))",
                      "true")],
}


def main():
    rng = np.random.default_rng(0)
    bf16 = numpy_dtype("bfloat16")
    hidden, layers, batch = 4096, 8, 16
    g = megak.Graph()
    x = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        x = g.gemm(x, g.input(f"w{i}", (hidden, hidden), "bfloat16"))
        g.output(x, f"h{i}")
    inputs = {"x": rng.uniform(-1, 1, (batch, hidden)).astype(np.float32).astype(bf16)}
    for i in range(layers):
        inputs[f"w{i}"] = (rng.uniform(-1, 1, (hidden, hidden)).astype(np.float32)
                           * np.float32(0.03)).astype(bf16)
    original = compiler.device_source
    ph = abi.TRACE_PHASES
    for name, cuts in CUTS.items():
        def source(_cuts=cuts):
            src = original()
            for a, b in _cuts:
                assert a in src, a
                src = src.replace(a, b)
            return src
        compiler.device_source = source
        try:
            prog = megak.compile(g, backend="cuda")
            b = Bench(prog)
            b.upload(**inputs)
            t = float(np.median(b.time_megakernel(reps=30)))
            b.close()
            prog.run(**inputs, trace=True)
        finally:
            compiler.device_source = original
        tt = prog.last_trace.events["t"].astype(np.int64)
        kloop = tt[:, ph["MK_T_COMPUTED"]] - tt[:, ph["MK_T_WAITED"]]
        stages = int(np.median(prog.plan.instrs["klen"])) // 128
        print(f"{name:14s}: {t:7.1f} us, k loop {np.median(kloop) / 1e3:6.2f} us for "
              f"{stages} stages ({np.median(kloop) / 1e3 / stages:5.2f} us per stage)",
              flush=True)
        prog.close()


if __name__ == "__main__":
    main()
