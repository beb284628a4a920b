#!/usr/bin/env python3
"""Probe: what a resident kernel fed through mapped pinned memory can cost per request.

A grid of one block per SM (384 threads, the megakernel's shared memory, cooperative) stays
on the GPU; the host writes request numbers into a word of mapped pinned memory and spins on
a completion word the kernel writes back. Per request every block arrives on one device
counter; the last arrival writes the completion (after a system-scope fence). Modes:

  host-poll   every block polls the host word itself (PCIe read per poll)
  relay       block 0 polls the host word and republishes it in device memory (L2) for the
              others: one decider (what an idle deadline or a close needs), one more hop
  one-block   only block 0 takes part: the PCIe round trip alone

Then, while the kernel sits polling (every SM taken), what other GPU work still runs beside
it: a pinned host-to-device copy, a cuMemsetD32Async, cuMemAlloc/cuMemFree, a module load.

    python tools/probe_resident.py
"""
import ctypes
import statistics
import time

import numpy as np

from megak.runtime import memory as mem
from megak.runtime.compiler import compile_source
from megak.runtime.driver import _bindings, check, device_info

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
__device__ __forceinline__ u32 ld_acquire_sys(const u32* p)
{ u32 v; asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p)
{ u32 v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_release_gpu(u32* p, u32 v)
{ asm volatile("st.release.gpu.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ u64 now_ns()
{ u64 t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

/* ring[0]: request number (host writes); host[0]: completed request (device writes), host[1]:
 * exit reason (1 = all done, 2 = idle deadline). dev[0]: relayed number, dev[1]: arrivals. */
extern "C" __global__ void __launch_bounds__(384, 1)
probe(const u32* ring, volatile u32* host, u32* dev, u32 n_req, u32 mode, u64 idle_ns)
{
    __shared__ u32 quit;
    const u32 b = blockIdx.x;
    for (u32 seq = 1; seq <= n_req; ++seq) {
        if (threadIdx.x == 0) {
            quit = 0;
            const u64 t0 = now_ns();
            if (mode == 0 || (b == 0)) {
                while (ld_acquire_sys(ring) < seq)
                    if (now_ns() - t0 > idle_ns) { quit = 1; break; }
                if (mode == 1 && b == 0)
                    st_release_gpu(&dev[0], quit ? 0xFFFFFFFFu : seq);
            } else if (mode == 1) {
                u32 v;
                while ((v = ld_acquire_gpu(&dev[0])) < seq)
                    if (now_ns() - t0 > 2 * idle_ns) { v = 0xFFFFFFFFu; break; }
                quit = v == 0xFFFFFFFFu;
            }
            if (!quit && (mode != 2 || b == 0)) {
                const u32 parts = mode == 2 ? 1u : gridDim.x;
                __threadfence();
                if (atomicAdd(&dev[1], 1u) == parts * seq - 1u) {
                    __threadfence_system();
                    host[0] = seq;
                }
            }
        }
        __syncthreads();
        if (quit) {
            if (b == 0 && threadIdx.x == 0) { __threadfence_system(); host[1] = 2; }
            return;
        }
    }
    if (b == 0 && threadIdx.x == 0) host[1] = 1;
}

extern "C" __global__ void other(u32* p) { p[threadIdx.x] = threadIdx.x; }
"""


def main():
    drv = _bindings()
    from cuda.core import Device, ObjectCode
    dev = Device(0)
    dev.set_current()
    info = device_info(0)
    n_sm = info["sm_count"]
    compiled = compile_source(SOURCE, arch=info["arch"], entry="probe", name="probe_resident.cu")
    code = ObjectCode.from_cubin(compiled.cubin)
    func = check(drv.cuKernelGetFunction(code.get_kernel("probe").handle), "cuKernelGetFunction")
    smem = 200 * 1024
    check(drv.cuFuncSetAttribute(
        func, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
        "cuFuncSetAttribute")
    m = mem.Memory(0)
    ring = m.mapped(64, "ring")
    host = m.mapped(64, "host")
    devstate = m.device(64, "dev")
    ring_w = ring.array(np.uint32, (16,))
    host_w = host.array(np.uint32, (16,))
    stream = dev.create_stream()
    side = dev.create_stream()
    h, hs = stream.handle, side.handle

    def launch(n_req, mode, idle_s):
        ring_w[0] = 0
        host_w[:] = 0
        mem.memset32(devstate.ptr, 0, 16, h)
        args = [ctypes.c_uint64(ring.device_ptr), ctypes.c_uint64(host.device_ptr),
                ctypes.c_uint64(devstate.ptr), ctypes.c_uint32(n_req), ctypes.c_uint32(mode),
                ctypes.c_uint64(int(idle_s * 1e9))]
        argv = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        check(drv.cuLaunchCooperativeKernel(func, n_sm, 1, 1, 384, 1, 1, smem, h,
                                            ctypes.addressof(argv)), "launch")
        return args, argv

    def finish(deadline_s=10.0):
        t_end = time.monotonic() + deadline_s
        while True:
            ret = drv.cuStreamQuery(h)
            if int(ret[0]) == 0:
                return True
            if time.monotonic() > t_end:
                return False
            time.sleep(1e-4)

    n = 2000
    for mode, name in ((0, "host-poll"), (1, "relay"), (2, "one-block")):
        keep = launch(n, mode, 2.0)
        ts = []
        for i in range(1, n + 1):
            t0 = time.perf_counter_ns()
            ring_w[0] = i
            deadline = time.monotonic() + 2.0
            while host_w[0] < i:
                if time.monotonic() > deadline:
                    break
            ts.append(time.perf_counter_ns() - t0)
        ok = finish()
        ts = ts[100:]
        print(f"{name:10s} request -> completion: median {statistics.median(ts) / 1e3:6.2f} us, "
              f"p90 {np.percentile(ts, 90) / 1e3:6.2f} us (exit {host_w[1]}, stream done {ok})",
              flush=True)
        del keep

    # host cost of the loop itself (numpy word write + read of mapped memory)
    t0 = time.perf_counter_ns()
    for i in range(10000):
        ring_w[1] = i
        _ = host_w[0] < i
    print(f"host loop alone: {(time.perf_counter_ns() - t0) / 10000 / 1e3:.3f} us per request")

    # what runs beside a resident kernel that holds every SM
    keep = launch(1, 1, 1.5)
    time.sleep(0.05)
    pinned = m.pinned(1 << 20, "pinned")
    target = m.device(1 << 20, "target")

    def timed(what, fn):
        t0 = time.perf_counter()
        fn()
        beside = host_w[1] == 0
        print(f"  {what:40s} {1e3 * (time.perf_counter() - t0):8.2f} ms "
              f"({'while the kernel still runs' if beside else 'the kernel had left'})",
              flush=True)

    def sync_side():
        t_end = time.monotonic() + 5
        while int(drv.cuStreamQuery(hs)[0]) != 0 and time.monotonic() < t_end:
            time.sleep(1e-5)

    print("beside the resident kernel (it leaves after 1.5 s idle):")
    timed("htod 1 MiB pinned + stream sync", lambda: (mem.htod(target.ptr, pinned.ptr, 1 << 20, hs), sync_side()))
    timed("dtoh 1 MiB pinned + stream sync", lambda: (mem.dtoh(pinned.ptr, target.ptr, 1 << 20, hs), sync_side()))
    timed("cuMemAlloc 1 MiB", lambda: m.device(1 << 20, "extra"))
    timed("cuMemHostAlloc 1 MiB", lambda: m.pinned(1 << 20, "extra pinned"))
    timed("module load (cubin)", lambda: ObjectCode.from_cubin(compiled.cubin).get_kernel("other"))
    timed("memsetD32 1 MiB + stream sync", lambda: (mem.memset32(target.ptr, 7, 1 << 18, hs), sync_side()))
    extra = m.device(4096, "to free")
    timed("cuMemFree", lambda: m.free(extra))
    print(f"kernel exit reason {host_w[1]}, stream done {finish()}")
    del keep
    m.close()


if __name__ == "__main__":
    main()
