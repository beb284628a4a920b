#!/usr/bin/env python3
"""Probe: where a megak call's time goes, for a one-instruction graph ((1, 32) copy).

  host: the call key of a repeated call; the executor's launch (enqueue only)
  gpu:  one invocation, from 1000 back-to-back launches (total / 1000), by grid size
  run:  prog.run + wait, median, by grid size
  and the same for a program with no instruction at all (an output that is its input): what
  an invocation costs with nothing to run (launch, each block's set-up, the end protocol)

    python tools/probe_invocation.py
"""
import statistics
import time

import torch

import megak


def med(fn, n=500):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts) / 1e3


def empty_program():
    """An invocation that runs nothing (a program whose output is its input: no
    instruction), launched by the executor on megak's own buffers: launch, each block's
    set-up and the end protocol, device-bound over 1000 launches."""
    g = megak.Graph()
    g.output(g.input("x", (1, 32)), "x_out")
    prog = megak.compile(g, backend="cuda")
    ex = prog._executor
    for _ in range(20):
        ex.wait(ex.launch({}, []))
    t0 = time.perf_counter_ns()
    tickets = [ex.launch({}, []) for _ in range(1000)]
    ex.wait(tickets[-1])
    per = (time.perf_counter_ns() - t0) / 1000 / 1e3
    one = med(lambda: ex.wait(ex.launch({}, [])), 1000)
    print(f"no instruction (132 SMs): 1000 launches {per:5.2f} us/call, launch+wait median "
          f"{one:5.2f} us")
    prog.close()


def main():
    empty_program()
    g = megak.Graph()
    x = g.input("x", (1, 32))
    g.output(g.copy(x), "y")
    xt = torch.randn(1, 32, device="cuda")
    yt = torch.empty(1, 32, device="cuda")
    for n_sm in (132, 16, 1):
        prog = megak.compile(g, backend="cuda", n_sm=n_sm)
        ex = prog._executor
        for _ in range(20):
            prog.run(out={"y": yt}, x=xt)
        prep = med(lambda: prog._call_key({"x": xt}, {"y": yt}))
        call = prog._calls[prog._call_key({"x": xt}, {"y": yt})]
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(200):
            ex.launch_bound(call.binding, torch.cuda.current_stream().cuda_stream)
        enq = (time.perf_counter_ns() - t0) / 200 / 1e3
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        hs = [prog.launch(out={"y": yt}, x=xt) for _ in range(1000)]
        hs[-1].wait()
        per = (time.perf_counter_ns() - t0) / 1000 / 1e3
        run = med(lambda: prog.run(out={"y": yt}, x=xt), 1000)
        assert torch.equal(yt, xt)
        print(f"n_sm {n_sm:3d}: call key {prep:5.2f} us, launch_bound enqueue {enq:5.2f} us, "
              f"1000 launches {per:5.2f} us/call, run+wait median {run:5.2f} us")
        prog.close()


if __name__ == "__main__":
    main()
