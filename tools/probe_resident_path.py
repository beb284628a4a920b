#!/usr/bin/env python3
"""Probe: where a resident request's time goes (megak.resident), for the (1, 32) copy, a
program with no instruction, and the hidden-1024 x 16 bf16 chain.

  post+spin   the ring write and a spin on the program's host view, nothing else: the
              device's round trip for one request (relay, blocks, the end of the invocation)
  pipelined   1000 requests posted back to back, one wait: device time per request
  submit      r.submit() alone (host), and its parts: call key, prepare, post
  submit+wait r.submit(...).wait(), as the benchmark times it
  and, beside them, prog.run on the same tensors.

--split: instead, for the copy and the program with no instruction, one request's round trip
split where the host can see it (medians of 2,700 requests, the first 300 of 3,000 dropped):
the host's ring write (ResidentKernel.post, Python), post -> the relay's `view.taken` seen
(its poll seeing the entry, its mirror and `go`, `taken` crossing PCIe), `taken` -> done seen
(the request on the device and its completion word crossing PCIe); then post + spin on the
completion alone after a pause of 0, 20 and 100 us between requests (the relay idle-polling
for that long).

    python tools/probe_resident_path.py [--split]
"""
import argparse
import statistics
import time

import numpy as np
import torch

import megak


def med(fn, n=1000):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts[n // 10:]) / 1e3


def in_place_outputs(prog):
    """A torch tensor for every output the program writes in place (its out=)."""
    return {k: torch.empty(prog.plan.output_shapes[k], device="cuda",
                           dtype=torch.bfloat16 if prog.plan.tensors[s].dtype == "bfloat16"
                           else torch.float32)
            for k, s in prog.plan.outputs.items() if prog._writes_in_place(k)}


def poster(prog, r, tin, outs):
    """After one submit of the call on resident `r`: a function that posts it again raw
    (ResidentKernel.post, none of submit's Python) and returns (ticket, request number)."""
    ex, k = prog._executor, r._kernel
    r.submit(prog, out=outs, **tin).wait()
    _, words, table, _ = prog._prepare_request(tin, outs)

    def post():
        t = ex._ticket = (ex._ticket + 1) & 0xFFFFFFFF or 1
        return t, k.post(words, table, t, time.monotonic() + 10)
    return post


def probe(name, g, make):
    prog = megak.compile(g, backend="cuda")
    tin = make(g)
    outs = in_place_outputs(prog)
    torch.cuda.synchronize()
    run = med(lambda: prog.run(out=outs, **tin), 300)
    ex = prog._executor
    with megak.resident(prog, idle_s=10) as r:
        post = poster(prog, r, tin, outs)

        def post_spin():
            t, _ = post()
            while not ex.done(t):
                pass
        raw = med(post_spin)
        key = med(lambda: prog._call_key(tin, outs))

        def prep():
            return prog._prepare_request(tin, outs)
        prepare = med(prep)
        t0 = time.perf_counter_ns()
        hs = [r.submit(prog, out=outs, **tin) for _ in range(1000)]
        t_submit = (time.perf_counter_ns() - t0) / 1000 / 1e3
        hs[-1].wait()
        t_pipe = (time.perf_counter_ns() - t0) / 1000 / 1e3
        for h in hs:
            h.wait()
        both = med(lambda: r.submit(prog, out=outs, **tin).wait())
        launches = r.launches
    print(f"{name:10s} run {run:7.2f} | resident: post+spin {raw:7.2f}, submit+wait {both:7.2f}, "
          f"pipelined {t_pipe:7.2f} us/request (submit alone {t_submit:6.2f}: key {key:5.2f}, "
          f"prepare incl. key {prepare:5.2f}); launches {launches}", flush=True)
    prog.close()


def split(name, g, make):
    """--split: one request's round trip, split at the relay's view.taken."""
    from megak.runtime.resident import _VIEW
    prog = megak.compile(g, backend="cuda")
    tin, outs = make(g), in_place_outputs(prog)
    torch.cuda.synchronize()
    ex = prog._executor
    with megak.resident(prog, idle_s=10) as r:
        k = r._kernel
        post = poster(prog, r, tin, outs)
        rows = []
        for _ in range(3000):
            t0 = time.perf_counter_ns()
            t, s = post()
            t1 = time.perf_counter_ns()
            while k._view[_VIEW["taken"]] != s:
                pass
            t2 = time.perf_counter_ns()
            while not ex.done(t):
                pass
            rows.append((t1 - t0, t2 - t1, time.perf_counter_ns() - t2))
        a = np.array(rows[300:]) / 1e3
        total = a.sum(axis=1)
        print(f"{name}: post {np.median(a[:, 0]):.2f}  post->taken seen {np.median(a[:, 1]):.2f}  "
              f"taken->done seen {np.median(a[:, 2]):.2f}  total {np.median(total):.2f} us "
              f"(p10 {np.percentile(total, 10):.2f} p90 {np.percentile(total, 90):.2f})",
              flush=True)
        for pause_us in (0, 20, 100):
            ts = []
            for _ in range(1500):
                t0 = time.perf_counter_ns()
                t, _ = post()
                while not ex.done(t):
                    pass
                ts.append(time.perf_counter_ns() - t0)
                end = time.perf_counter_ns() + pause_us * 1000
                while time.perf_counter_ns() < end:
                    pass
            print(f"{name}: post+spin after a {pause_us} us pause: "
                  f"{statistics.median(ts[150:]) / 1e3:.2f} us", flush=True)
    prog.close()


def copy_graph(g=None):
    g = megak.Graph()
    g.output(g.copy(g.input("x", (1, 32))), "y")
    return g


def empty_graph():
    g = megak.Graph()
    g.output(g.input("x", (1, 32)), "x_out")
    return g


def chain(hidden=1024, layers=16, batch=16):
    g = megak.Graph()
    h = g.input("x", (batch, hidden), "bfloat16")
    for i in range(layers):
        h = g.gemm(h, g.input(f"w{i}", (hidden, hidden), "bfloat16"))
        g.output(h, f"y{i}")
    return g


def tensors(g):
    return {n: (torch.randn(t.shape, device="cuda") * 0.03).to(
        torch.bfloat16 if t.dtype == "bfloat16" else torch.float32) for n, t in g.inputs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", action="store_true",
                    help="a request's round trip split at the relay's view.taken")
    if ap.parse_args().split:
        split("copy", copy_graph(), tensors)
        split("empty", empty_graph(), tensors)
        return
    probe("copy", copy_graph(), tensors)

    probe("mlp1024", chain(), tensors)


if __name__ == "__main__":
    main()
