#!/usr/bin/env python3
"""Probe: do bytes an SM asked L2 to prefetch reach its later bulk copies from L2, and how fast?

The weight stream idles HBM through each layer's tail (benchmarks/ANALYSIS.md, the landing
timeline): the ring holds 10 of an SM's 16 pages of a 4096 x 4096 layer, and the signal's
release fence waits for the SM's bulk copies in flight, so the streamer is held from the
reduce to the fence. Two ways of using L2 as the ring's extension were tried in the chain and
made it slower: TMA prefetches at the hold (the fence then waited for them), and LSU
prefetches (`prefetch.global.L2`) of the next record's stages from an idle warp (the fence did
not wait, but the ring's copies landed at ~2 TB/s instead of ~4, the chain 20-90% slower). This
probe asks, outside megak, whether a prefetched line serves a later bulk copy at all.

One block per SM (208 KiB of dynamic shared memory), 64 threads. Each block owns a contiguous
region of `--share-kib` (256: an SM's share of a 4096 x 4096 bf16 layer, 33 MB over 132 SMs)
of a 1 GiB buffer, at an origin that moves every launch (no launch finds its bytes in L2 from
the one before). Per cell, a launch:

  1. prefetch  warp 1's 32 lanes ask L2 for the region (mode below), then the block waits
               until --delay-us after the last lane's last prefetch was issued
  2. copy      warp 0 lane 0 copies the region into a ring of 8 pages with 16 KiB bulk copies
               (`cp.async.bulk`, L2 policy evict-first as the weight ring's, or evict-normal),
               checking each landed page's first word (the buffer holds its own u32 index)

Modes: cold (no step 1), lsu32 (`prefetch.global.L2` per 32-B sector), lsu128 (per 128-B
line), lsu32L (`prefetch.global.L2::evict_last` per sector), tma (`cp.async.bulk.prefetch.L2`,
16 KiB each), warm (step 1 is a full bulk copy of the region, evict-normal: the L2 hit's rate).
Per cell: the copy's TB/s over the grid (bytes / (last landing - first issue)), the prefetch
step's issue time, and the launch's time (CUDA events), medians over --reps launches.

    python tools/probe_l2_prefetch.py [--reps 5] [--share-kib 256] [--compile-only]
"""
import argparse
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megak.runtime.compiler import compile_source  # noqa: E402
from probe_ptx import BULK_PRELUDE, compile_only, on_gpu  # noqa: E402  (tools/, beside this file)

ENTRY = "l2_prefetch"
THREADS = 64
PAGE = 16384
RING = 8
SMEM = (RING + 4) * PAGE + 1024
STAT_WORDS = 8   # per block: bytes, t_first, t_last, bad pages, error, prefetch issue ns
MODES = {"cold": 0, "lsu32": 1, "lsu128": 2, "lsu32L": 3, "tma": 4, "warm": 5}

SOURCE = BULK_PRELUDE + r"""
__device__ __forceinline__ u64 policy_normal()
{
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* Chunk d of a region copy (the lap0 + d-th use of the ring) has landed: wait for it, then
 * check its page's first word against its index. False past the deadline. */
__device__ bool landed(const unsigned char* pages, u64* full, u32 R, u32 lap0, u32 d, u64 origin,
                       u64 deadline, u64* st)
{
    const u32 k = lap0 + d;
    while (!mbar_try(sa(&full[k % R]), (k / R) & 1u))
        if (now() > deadline)
            return false;
    if (*reinterpret_cast<const volatile u32*>(pages + (u64)(k % R) * PAGE) !=
        (u32)((origin + (u64)d * PAGE) / 4u))
        st[3] += 1u;
    return true;
}

/* Copy [buf + origin, + bytes) through R pages; count bytes, stamp first issue / last landing,
 * check each page's first word against its index. False past the deadline. */
__device__ bool copy_region(const unsigned char* buf, u64 origin, u64 bytes, unsigned char* pages,
                            u64* full, u32 R, u32 lap0, u64 pol, u64 deadline, u64* st)
{
    const u32 chunks = (u32)(bytes / PAGE);
    u32 c = 0, d = 0;
    st[1] = now();
    for (; c < chunks; ++c) {
        for (; d + R <= c; ++d)   /* chunk c takes the page of chunk c - R */
            if (!landed(pages, full, R, lap0, d, origin, deadline, st))
                return false;
        const u32 k = lap0 + c;
        mbar_expect_tx(sa(&full[k % R]), PAGE);
        bulk_load(pages + (u64)(k % R) * PAGE, buf + origin + (u64)c * PAGE, PAGE, &full[k % R], pol);
    }
    for (; d < c; ++d)
        if (!landed(pages, full, R, lap0, d, origin, deadline, st))
            return false;
    st[2] = now();
    st[0] = (u64)chunks * PAGE;
    return true;
}

extern "C" __global__ void __launch_bounds__(64, 1)
l2_prefetch(const unsigned char* buf, u64 origin0, u64 share, u32 mode, u64 delay_ns,
            u32 normal_copy, u64* stats)
{
    u64* full = reinterpret_cast<u64*>(smem);
    u64* done = reinterpret_cast<u64*>(smem + 512);   /* the prefetch step's end (ns) */
    unsigned char* pages = smem + 1024;
    const u32 tid = threadIdx.x, lane = tid & 31u;
    const u64 origin = origin0 + (u64)blockIdx.x * share;
    u64* st = stats + (u64)blockIdx.x * 8u;
    if (tid == 0) {
        for (u32 i = 0; i < RING_PAGES; ++i)
            mbar_init(sa(&full[i]), 1u);
        *done = 0;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u64 deadline = now() + 1000000000ull;
    const unsigned char* base = buf + origin;
    const u64 t0 = now();
    bool ok = true;
    if (mode == 5) {            /* warm: a full copy first, evict-normal */
        if (tid == 0) {
            u64 scratch[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            ok = copy_region(buf, origin, share, pages, full, RING_PAGES, 0u, policy_normal(),
                             deadline, scratch);
            if (scratch[3] != 0u)
                st[3] += scratch[3];
        }
    } else if (mode == 4) {     /* TMA bulk prefetch, 16 KiB each, one lane */
        if (tid == 32)
            for (u64 o = 0; o < share; o += PAGE)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                             :: "l"(base + o), "r"(PAGE) : "memory");
    } else if (mode >= 1 && tid >= 32) {   /* warp 1: LSU prefetches */
        const u32 step = mode == 2 ? 128u : 32u;
        for (u64 o = (u64)lane * step; o < share; o += 32u * step) {
            if (mode == 3)
                asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(base + o));
            else
                asm volatile("prefetch.global.L2 [%0];" :: "l"(base + o));
        }
    }
    __syncthreads();
    if (tid == 0) {
        *done = now();
        st[5] = *done - t0;
        while (now() < *done + delay_ns) {
        }
        const u32 lap0 = mode == 5 ? (u32)(share / PAGE) : 0u;   /* the warm pass's phases */
        ok = ok && copy_region(buf, origin, share, pages, full, RING_PAGES, lap0,
                               normal_copy ? policy_normal() : policy(false), deadline, st);
        st[4] = ok ? 0u : 1u;
    }
    __syncthreads();
}
""".replace("RING_PAGES", f"{RING}u")


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_l2_prefetch.cu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--share-kib", type=int, default=256)
    ap.add_argument("--delays-us", default="0,5,20")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(compile_probe, ENTRY)

    import numpy as np

    from megak.runtime.driver import check

    with on_gpu(compile_probe, ENTRY, SMEM) as (drv, fn, info, h, m):
        grid = info["sm_count"]
        share = args.share_kib * 1024 // PAGE * PAGE
        total = 1 << 30
        buf = m.device(total, "buf")
        host = np.arange(total // 4, dtype=np.uint32)   # word i holds i
        check(drv.cuMemcpyHtoD(buf.ptr, host.ctypes.data, total), "cuMemcpyHtoD")
        stats = m.device(grid * STAT_WORDS * 8, "stats")
        host_stats = np.zeros(grid * STAT_WORDS, dtype=np.uint64)
        start, stop = (check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2))
        span_bytes = grid * share
        slots = (total - span_bytes) // (64 << 20)   # origins 64 MiB apart: never in L2
        launch_no = [0]

        def cell(mode, delay_us, normal_copy):
            ms, rates, issue = [], [], []
            for rep in range(args.reps + 1):
                origin = (launch_no[0] % slots) * (64 << 20)
                launch_no[0] += 1
                vals = [ctypes.c_uint64(buf.ptr), ctypes.c_uint64(origin), ctypes.c_uint64(share),
                        ctypes.c_uint32(MODES[mode]), ctypes.c_uint64(int(delay_us * 1000)),
                        ctypes.c_uint32(1 if normal_copy else 0), ctypes.c_uint64(stats.ptr)]
                argv_ = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
                check(drv.cuMemsetD8Async(stats.ptr, 0, host_stats.nbytes, h), "cuMemsetD8Async")
                check(drv.cuEventRecord(start, h), "cuEventRecord")
                check(drv.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, SMEM, h,
                                         ctypes.addressof(argv_), 0), "cuLaunchKernel")
                check(drv.cuEventRecord(stop, h), "cuEventRecord")
                check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
                check(drv.cuMemcpyDtoH(host_stats.ctypes.data, stats.ptr, host_stats.nbytes),
                      "cuMemcpyDtoH")
                rows = host_stats.reshape(grid, STAT_WORDS)
                if rows[:, 4].any():
                    raise SystemExit(f"{mode}: a block passed its deadline")
                if rows[:, 3].any():
                    raise SystemExit(f"{mode}: {int(rows[:, 3].sum())} pages held the wrong bytes")
                if (rows[:, 0] != share).any():
                    raise SystemExit(f"{mode}: a block copied {rows[:, 0].min()} bytes, not {share}")
                if rep == 0:
                    continue
                ms.append(check(drv.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))
                span = int(rows[:, 2].max()) - int(rows[:, 1].min())
                rates.append(float(rows[:, 0].sum()) / span / 1e3)
                issue.append(float(np.median(rows[:, 5])) / 1e3)
            print(f"{mode:<8} {delay_us:>6.0f} {'normal' if normal_copy else 'first':>7} "
                  f"{statistics.median(rates):>9.2f} {statistics.median(issue):>9.2f} "
                  f"{statistics.median(ms) * 1e3:>9.1f}", flush=True)

        print(f"{info['name']}: {grid} SMs, {share >> 10} KiB per SM ({span_bytes / 1e6:.1f} MB "
              f"in all), ring of {RING} pages; medians of {args.reps} launches", flush=True)
        print(f"{'mode':<8} {'delay':>6} {'copy L2':>7} {'copy TB/s':>9} {'step1 us':>9} "
              f"{'launch us':>9}", flush=True)
        delays = [float(x) for x in args.delays_us.split(",")]
        cell("cold", 0, False)
        cell("warm", 0, False)
        for mode in ("lsu32", "lsu128", "lsu32L", "tma"):
            for d in delays:
                cell(mode, d, False)
        cell("lsu32", delays[-1], True)
        cell("cold", 0, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
