#!/usr/bin/env python3
"""Probe: how fast one GPU thread sees a request the host writes into mapped pinned memory,
by how it polls the entry.

The resident kernel's relay (megakernel.cu, mk_relay) reads a request ring entry of six
8-byte words, each tagged with its request number, and takes the entry once all six name
the request it waits for. Measured on the H200 (benchmarks/ANALYSIS.md), a posted request
took 7-9 us to be taken and announced back (its `taken` word seen by the host), where a
one-block round trip of one word (tools/probe_resident.py) takes 3.4 us. This probe times
the host's write of an entry -> the device's completion word seen by the host, one block,
one polling thread, for each way of polling:

  one-word     ld.acquire.sys of the (ticket, seq) word alone; once it names the request,
               the other five words (a second round trip, once per request)
  six-words    all six words every round, five ld.relaxed.sys and the (ticket, seq) word
               ld.acquire.sys, all in flight together (the relay as built)
  three-v2     the same bytes as three 16-byte loads (ld.relaxed.sys.v2.u64, the last
               ld.acquire.sys.v2.u64)
  six-volatile six ld.volatile.global loads
  warp-v2      lanes 0-2 one 16-byte ld.acquire.sys each, in one warp instruction, the words
               gathered by shuffles
  warp-u64     lanes 0-5 one 8-byte ld.acquire.sys each, in one warp instruction

and, per mode, the device's own time per polling round (%globaltimer over the rounds it
polled before the request arrived): whether the six loads of a round are in flight together
(one PCIe round trip) or one after another. --l2: the same polls of an entry in device
memory that never names a request, for 2 ms each: a round's time on L2.

    python tools/probe_ring_poll.py [--n 2000] [--l2]
    python tools/probe_ring_poll.py --compile-only   # no GPU: cubin for sm_90a, ptxas info
"""
import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

from megak.runtime import memory as mem  # noqa: E402
from megak.runtime.compiler import compile_source  # noqa: E402
from megak.runtime.driver import _bindings, check, device_info  # noqa: E402
from probe_ptx import PRELUDE, compile_only  # noqa: E402  (tools/, beside this file)

MODES = ("one-word", "six-words", "three-v2", "six-volatile", "warp-v2", "warp-u64")

SOURCE = PRELUDE + r"""
__device__ __forceinline__ u64 ld_relaxed_sys(const u64* p)
{ u64 v; asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u64 ld_acquire_sys(const u64* p)
{ u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u64 ld_volatile(const u64* p)
{ u64 v; asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void ld_relaxed_sys_v2(const u64* p, u64& a, u64& b)
{ asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory"); }
__device__ __forceinline__ void ld_acquire_sys_v2(const u64* p, u64& a, u64& b)
{ asm volatile("ld.acquire.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory"); }

/* entry: 6 u64 words; words 0-4 carry the request number in their top 16 bits, word 5 is
 * (ticket | seq << 32). host[0]: the last request seen (device writes), host[1]: exit
 * (1 done, 2 idle), host[2..3]: rounds polled and us spent polling, summed over requests. */
extern "C" __global__ void poll(const u64* entry, volatile u32* host, u32 n_req, u32 mode,
                                u64 idle_ns)
{
    const u32 lane = threadIdx.x;
    if (blockIdx.x != 0 || (mode < 4 && lane != 0) || lane >= 32)
        return;
    u64 rounds = 0, polled_ns = 0, sink = 0;
    for (u32 s = 1; s <= n_req; ++s) {
        const u64 tag = (u64)(s & 0xffffu) << 48, mask = 0xffffull << 48;
        const u64 t0 = now();
        bool taken = false;
        u64 n = 0;
        while (!taken) {
            u64 w[6];
            if (mode == 0) {
                w[5] = ld_acquire_sys(entry + 5);
                if ((u32)(w[5] >> 32) == s) {
                    for (int i = 0; i < 5; ++i)
                        w[i] = ld_relaxed_sys(entry + i);
                }
                else {
                    for (int i = 0; i < 5; ++i)
                        w[i] = 0;
                }
            } else if (mode == 1) {
                for (int i = 0; i < 5; ++i)
                    w[i] = ld_relaxed_sys(entry + i);
                w[5] = ld_acquire_sys(entry + 5);
            } else if (mode == 2) {
                ld_relaxed_sys_v2(entry, w[0], w[1]);
                ld_relaxed_sys_v2(entry + 2, w[2], w[3]);
                ld_acquire_sys_v2(entry + 4, w[4], w[5]);
            } else if (mode == 3) {
                for (int i = 0; i < 6; ++i)
                    w[i] = ld_volatile(entry + i);
            } else if (mode == 4) {
                /* lanes 0-2 one 16-B acquire load each, in one warp instruction */
                u64 a = 0, b = 0;
                if (lane < 3)
                    ld_acquire_sys_v2(entry + 2 * lane, a, b);
                for (int i = 0; i < 3; ++i) {
                    w[2 * i] = __shfl_sync(0xffffffffu, a, i);
                    w[2 * i + 1] = __shfl_sync(0xffffffffu, b, i);
                }
            } else {
                /* lanes 0-5 one 8-B acquire load each, in one warp instruction */
                u64 a = 0;
                if (lane < 6)
                    a = ld_acquire_sys(entry + lane);
                for (int i = 0; i < 6; ++i)
                    w[i] = __shfl_sync(0xffffffffu, a, i);
            }
            ++n;
            taken = (u32)(w[5] >> 32) == s;
            for (int i = 0; i < 5; ++i)
                taken = taken && (w[i] & mask) == tag;
            if (taken)
                sink += w[0] + w[1] + w[2] + w[3] + w[4];
            if (!taken && now() - t0 > idle_ns) {
                if (lane == 0) {   /* what it polled, for --l2: a request never comes */
                    host[2] = (u32)(rounds + n);
                    host[3] = (u32)((polled_ns + now() - t0) / 1000u);
                    __threadfence_system();
                    host[1] = 2;
                }
                return;
            }
        }
        rounds += n;
        polled_ns += now() - t0;
        if (lane == 0) {
            __threadfence_system();
            host[0] = s;
        }
    }
    if (lane != 0)
        return;
    host[2] = (u32)rounds;
    host[3] = (u32)(polled_ns / 1000u);
    host[4] = (u32)sink;
    __threadfence_system();
    host[1] = 1;
}
"""


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry="poll", name="probe_ring_poll.cu")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--l2", action="store_true",
                    help="also poll an entry in device memory (L2) that never names a request, "
                         "for each mode's time a round: whether one thread's strong loads of L2 "
                         "are served one after another too")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile for sm_90a with NVRTC (no GPU), print ptxas info, exit")
    a = ap.parse_args(argv)
    if a.compile_only:
        return compile_only(compile_probe, "poll")
    drv = _bindings()
    from cuda.core import Device, ObjectCode
    dev = Device(0)
    dev.set_current()
    info = device_info(0)
    compiled = compile_probe(info["arch"])
    code = ObjectCode.from_cubin(compiled.cubin)
    func = check(drv.cuKernelGetFunction(code.get_kernel("poll").handle), "cuKernelGetFunction")
    m = mem.Memory(0)
    entry = m.mapped(64, "entry")
    host = m.mapped(64, "host")
    words = memoryview(entry.array(np.uint8, (64,))).cast("Q")
    host_w = host.array(np.uint32, (16,))
    stream = dev.create_stream()
    h = stream.handle

    def launch(entry_ptr: int, n_req: int, mode: int, idle_ns: int) -> None:
        """One block of 32 threads polling `entry_ptr` for n_req requests; host[] cleared."""
        host_w[:] = 0
        args = [ctypes.c_uint64(entry_ptr), ctypes.c_uint64(host.device_ptr),
                ctypes.c_uint32(n_req), ctypes.c_uint32(mode), ctypes.c_uint64(idle_ns)]
        argv_ = (ctypes.c_void_p * len(args))(*[ctypes.addressof(x) for x in args])
        check(drv.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, h, ctypes.addressof(argv_), 0),
              "cuLaunchKernel")

    def finished() -> None:
        t_end = time.monotonic() + 5
        while int(drv.cuStreamQuery(h)[0]) != 0 and time.monotonic() < t_end:
            time.sleep(1e-4)

    def ns_a_round() -> tuple[float, int]:
        rounds, polled_us = int(host_w[2]), int(host_w[3])
        return (1e3 * polled_us / rounds if rounds else float("nan")), rounds

    for mode, name in enumerate(MODES):
        for i in range(8):
            words[i] = 0
        launch(entry.device_ptr, a.n, mode, int(2e9))
        time.sleep(0.01)
        ts = []
        for s in range(1, a.n + 1):
            tag = (s & 0xFFFF) << 48
            t0 = time.perf_counter_ns()
            for i in range(5):
                words[i] = (i + 1) | tag
            words[5] = 7 | s << 32            # last, as ResidentKernel.post writes it
            deadline = time.monotonic() + 2.0
            while host_w[0] < s:
                if time.monotonic() > deadline:
                    break
            ts.append(time.perf_counter_ns() - t0)
        finished()
        ts = ts[100:]
        per_round, rounds = ns_a_round()
        print(f"{name:12s} write -> completion seen: median {statistics.median(ts) / 1e3:6.2f} us, "
              f"p10 {np.percentile(ts, 10) / 1e3:6.2f}, p90 {np.percentile(ts, 90) / 1e3:6.2f}; "
              f"device: {rounds / a.n:5.2f} rounds a request, {per_round:7.1f} ns a round "
              f"(exit {host_w[1]})", flush=True)
    if a.l2:
        dev_entry = m.device(64, "entry (device)")
        mem.memset32(dev_entry.ptr, 0, 16, h)
        for mode, name in enumerate(MODES):
            launch(dev_entry.ptr, 1, mode, 2_000_000)
            finished()
            per_round, rounds = ns_a_round()
            print(f"{name:12s} L2 entry (2 ms of polls): {per_round:7.1f} ns a round "
                  f"({rounds} rounds, exit {host_w[1]})", flush=True)
    m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
