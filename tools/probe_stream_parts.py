#!/usr/bin/env python3
"""Probe: the streamed GEMM chain (W2) against its split into parts, with traced phases.

For the W2 chains (bf16, x = x @ W_i) it compiles the program with each band split into
`parts` k ranges (the lowering's rule replaced for the probe), times the megakernel (L2
flushed, medians) and runs it once traced: per instruction, the medians of
  detect   fetched -> dependencies met (the loader; includes the previous instruction's run)
  run      dependencies met -> stored and signalled, split into the k loop (A and the
           stages) and the tail (the reduction, the combine, the epilogue, the signal)
and the span of one layer (first instruction's fetch to the last store, median over layers).

    python tools/probe_stream_parts.py
"""
import statistics

import numpy as np

import megak
from megak import abi
from megak.dtypes import numpy_dtype
from megak.ops import gemm
from megak.runtime.bench import Bench

CASES = [(1024, 16, 16, (1, 2, 8)), (4096, 8, 16, (2, 4)), (4096, 8, 64, (1,)),
         (8192, 8, 16, (1,))]


def chain(hidden, layers, batch):
    g = megak.Graph()
    x = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        x = g.gemm(x, g.input(f"w{i}", (hidden, hidden), "bfloat16"))
        g.output(x, f"h{i}")
    return g


def main():
    rng = np.random.default_rng(0)
    bf16 = numpy_dtype("bfloat16")
    rule = gemm.stream_split
    ph = abi.TRACE_PHASES
    for hidden, layers, batch, options in CASES:
        g = chain(hidden, layers, batch)
        scale = np.float32(np.sqrt(3.0 / hidden))
        inputs = {"x": rng.uniform(-1, 1, (batch, hidden)).astype(np.float32).astype(bf16)}
        for i in range(layers):
            inputs[f"w{i}"] = (rng.uniform(-1, 1, (hidden, hidden)).astype(np.float32)
                               * scale).astype(bf16)
        wbytes = layers * hidden * hidden * 2
        for parts in options:
            boxes = -(-hidden // gemm.BOX_ROWS)
            per = -(-boxes // parts)
            gemm.stream_split = (lambda *a, _p=-(-boxes // per), _c=per * gemm.BOX_ROWS: (_p, _c))
            try:
                prog = megak.compile(g, backend="cuda")
            finally:
                gemm.stream_split = rule
            b = Bench(prog)
            b.upload(**inputs)
            t = float(np.median(b.time_megakernel(reps=50)))
            b.close()
            prog.run(**inputs, trace=True)
            ev = prog.last_trace.events
            tt = ev["t"].astype(np.int64)
            detect = tt[:, ph["MK_T_WAITED"]] - tt[:, ph["MK_T_FETCH"]]
            run = tt[:, ph["MK_T_STORED"]] - tt[:, ph["MK_T_WAITED"]]
            kloop = tt[:, ph["MK_T_COMPUTED"]] - tt[:, ph["MK_T_WAITED"]]
            tail = tt[:, ph["MK_T_STORED"]] - tt[:, ph["MK_T_COMPUTED"]]
            spans = []
            for op in np.unique(ev["op_index"]):
                e = tt[ev["op_index"] == op]
                spans.append(e[:, ph["MK_T_STORED"]].max() - e[:, ph["MK_T_FETCH"]].min())
            gaps = []   # last store of layer l -> last store of layer l + 1
            ends = sorted(tt[ev["op_index"] == op][:, ph["MK_T_STORED"]].max()
                          for op in np.unique(ev["op_index"]))
            gaps = np.diff(ends)
            print(f"{hidden}x{layers} batch {batch} parts {parts}: {t:7.1f} us "
                  f"({wbytes / t / 1e6:4.2f} TB/s), ring {prog.plan.stream_pages} pages; "
                  f"per instr detect {np.median(detect) / 1e3:5.2f} us, run "
                  f"{np.median(run) / 1e3:5.2f} us (max {run.max() / 1e3:5.2f}) = k loop "
                  f"{np.median(kloop) / 1e3:5.2f} + tail {np.median(tail) / 1e3:5.2f}; layer "
                  f"span {statistics.median(spans) / 1e3:5.2f} us, step "
                  f"{np.median(gaps) / 1e3 if len(gaps) else 0:5.2f} us", flush=True)
            prog.close()


if __name__ == "__main__":
    main()
