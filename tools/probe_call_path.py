#!/usr/bin/env python3
"""Probe: what one call from Python costs on each path megak's call path could take.

Measured before building the fast path (issue: "a call costs what the GPU costs"). Per
mechanism, the median over N calls of the host time, each on one tiny kernel (one thread
writes a word):

  launch   cuda.core launch() / cuda.bindings cuLaunchKernel and cuLaunchCooperativeKernel
           with the arguments as a (values, types) tuple or a prebuilt void** address
  sync     cuStreamSynchronize, a cuStreamQuery poll, a spin on a word the kernel writes
           into mapped pinned memory (the kernel's completion seen by the host)
  graph    the cooperative launch captured into a CUDA graph: cuGraphLaunch, alone and with
           the spin, and a kernel node's parameter update (graph_paths)
  bind     what reading a torch tensor's identity costs (data_ptr, shape, stride, dtype,
           device), torch.cuda.current_stream(), __cuda_array_interface__, DLPack through
           cuda.core's StridedMemoryView
  peer     torch CUDA graph replay + synchronize of a (1, 32) copy

    python tools/probe_call_path.py [--n 2000] [--json OUT.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import numpy as np

SRC = r"""
extern "C" __global__ void probe(unsigned int* done, unsigned int seq)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        __threadfence_system();
        *(volatile unsigned int*)done = seq;
    }
}
"""


def median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


GRAPH_SEQ = 0x5EED   # the word the captured launch writes (its argument, fixed at capture)


def graph_paths(drv, ok, h, launch_coop, seqv, word, res: dict, n: int) -> None:
    """The same cooperative launch captured once into a CUDA graph and replayed: what
    cuGraphLaunch costs the host against cuLaunchCooperativeKernel. A replay repeats the
    captured arguments, so a call path built on it would need the run's ticket from
    elsewhere (the device's own count of runs) or a parameter update per call, timed here
    as cuGraphExecKernelNodeSetParams."""
    seqv[0] = GRAPH_SEQ
    ok(drv.cuStreamBeginCapture(h, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    launch_coop()
    graph = ok(drv.cuStreamEndCapture(h))
    exe = ok(drv.cuGraphInstantiate(graph, 0))

    def replay():
        ok(drv.cuGraphLaunch(exe, h))

    def replay_spin():
        word[0] = 0
        ok(drv.cuGraphLaunch(exe, h))
        while word[0] != GRAPH_SEQ:
            pass

    res["cuGraphLaunch, one cooperative kernel node (enqueue)"] = median_us(replay, n)
    ok(drv.cuStreamSynchronize(h))
    res["cuGraphLaunch + spin on mapped pinned word"] = median_us(replay_spin, n)
    ok(drv.cuStreamSynchronize(h))
    try:
        err, nodes, _ = drv.cuGraphGetNodes(graph, 1)
        ok(err)
        params = ok(drv.cuGraphKernelNodeGetParams(nodes[0]))

        def set_params():
            ok(drv.cuGraphExecKernelNodeSetParams(exe, nodes[0], params))
        res["cuGraphExecKernelNodeSetParams (same params)"] = median_us(set_params, n)
    except Exception as exc:   # a form the bindings refuse: say so, keep the rest
        print(f"graph node params: {type(exc).__name__}: {exc}")
    ok(drv.cuGraphExecDestroy(exe))
    ok(drv.cuGraphDestroy(graph))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--json")
    args = p.parse_args()
    n = args.n
    from cuda.bindings import driver as drv
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    dev = Device(0)
    dev.set_current()
    arch = f"sm_{dev.compute_capability.major}{dev.compute_capability.minor}"
    obj = Program(SRC, "c++", ProgramOptions(arch=arch)).compile("cubin")
    kernel = obj.get_kernel("probe")
    stream = dev.create_stream()
    h = stream.handle
    res: dict[str, float] = {}

    def ok(r):
        err = r[0] if isinstance(r, tuple) else r
        assert int(err) == 0, r
        return r[1] if isinstance(r, tuple) and len(r) > 1 else None

    flags = drv.CU_MEMHOSTALLOC_DEVICEMAP | drv.CU_MEMHOSTALLOC_PORTABLE
    host = ok(drv.cuMemHostAlloc(4096, flags))
    word = np.ctypeslib.as_array((ctypes.c_uint32 * 1024).from_address(int(host)))
    dptr = int(ok(drv.cuMemHostGetDevicePointer(host, 0)))
    word[0] = 0

    cfg = LaunchConfig(grid=1, block=32)
    res["cuda.core launch (enqueue)"] = median_us(lambda: launch(stream, cfg, kernel, dptr, np.uint32(1)), n)
    stream.sync()

    func = kernel.handle
    if not isinstance(func, drv.CUfunction):
        func = ok(drv.cuKernelGetFunction(func))
    vals = (ctypes.c_uint64 * 1)(dptr)
    seqv = (ctypes.c_uint32 * 1)(0)
    argv = (ctypes.c_void_p * 2)(ctypes.addressof(vals), ctypes.addressof(seqv))
    addr = ctypes.addressof(argv)
    tup = ((dptr, 1), (ctypes.c_void_p, ctypes.c_uint32))

    def launch_tuple():
        ok(drv.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, h, tup, 0))

    def launch_addr():
        ok(drv.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, h, addr, 0))

    def launch_coop_addr():
        ok(drv.cuLaunchCooperativeKernel(func, 1, 1, 1, 32, 1, 1, 0, h, addr))

    for name, fn in (("cuLaunchKernel, args tuple (enqueue)", launch_tuple),
                     ("cuLaunchKernel, args void** address (enqueue)", launch_addr),
                     ("cuLaunchCooperativeKernel, void** address (enqueue)", launch_coop_addr)):
        try:
            res[name] = median_us(fn, n)
        except Exception as exc:  # an argument form the bindings refuse
            res[name] = float("nan")
            print(f"{name}: {type(exc).__name__}: {exc}")
        stream.sync()

    def launch_sync():
        launch_coop_addr()
        ok(drv.cuStreamSynchronize(h))

    def launch_query():
        launch_coop_addr()
        while int(drv.cuStreamQuery(h)[0]) != 0:
            pass

    counter = [0]

    def launch_spin():
        counter[0] += 1
        seqv[0] = counter[0]
        launch_coop_addr()
        target = counter[0]
        while word[0] != target:
            pass

    res["launch + cuStreamSynchronize"] = median_us(launch_sync, n)
    res["launch + cuStreamQuery poll"] = median_us(launch_query, n)
    res["launch + spin on mapped pinned word"] = median_us(launch_spin, n)
    stream.sync()
    try:
        graph_paths(drv, ok, h, launch_coop_addr, seqv, word, res, n)
    except Exception as exc:   # the other figures stand without it
        print(f"graph paths: {type(exc).__name__}: {exc}")

    try:
        import torch
        t = torch.zeros((1, 32), device="cuda")
        res["torch: data_ptr+shape+stride+dtype+device"] = median_us(
            lambda: (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device.index), n)
        res["torch: tuple(shape) == cached"] = median_us(lambda: tuple(t.shape) == (1, 32), n)
        res["torch.cuda.current_stream().cuda_stream"] = median_us(
            lambda: torch.cuda.current_stream().cuda_stream, n)
        res["torch: __cuda_array_interface__"] = median_us(
            lambda: t.__cuda_array_interface__, n)
        try:
            from cuda.core.utils import StridedMemoryView
            res["StridedMemoryView.from_dlpack(torch)"] = median_us(
                lambda: StridedMemoryView.from_dlpack(t, stream_ptr=-1), n)
        except Exception as exc:
            print(f"StridedMemoryView: {type(exc).__name__}: {exc}")
        x = torch.randn((1, 32), device="cuda")
        y = torch.empty_like(x)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(3):
                y.copy_(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y.copy_(x)

        def replay():
            g.replay()
            torch.cuda.synchronize()
        res["torch graph replay + synchronize, (1,32) copy"] = median_us(replay, n)

        def eager():
            y.copy_(x)
            torch.cuda.synchronize()
        res["torch eager copy + synchronize"] = median_us(eager, n)
    except ImportError:
        print("torch: not installed, skipped")

    for k, v in res.items():
        print(f"{k:55s} {v:8.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.name, "n": n, "median_us": res}, f, indent=2)
    ok(drv.cuMemFreeHost(host))


if __name__ == "__main__":
    main()
