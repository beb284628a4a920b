#!/usr/bin/env python3
"""Probe: what a warp's A chunk costs beside the weight stream, fetched three ways.

In the streamed GEMM's k loop each warp copies its A chunk for a stage (16 rows x 128 k of
bf16, 4 KiB, L2-resident: the previous layer's output) with 256 16-B cp.async (8 a lane)
before it waits for the stage's page. Without those copies (stage probe variant `noA`,
timing only) a stage's wait drops from 1.09 to 0.42 us and the 4096 x 8 chain from 98.7 to
89.6 us (benchmarks/ANALYSIS.md): issuing them holds the warp. This probe asks, outside
megak, how long a warp spends issuing and then waiting for such a chunk, idle and beside a
stream of bulk copies pulling the SM's share of HBM, when the chunk is fetched as

  cpasync   megak's way: 8 `cp.async.cg` of 16 B a lane, one commit, wait_all
  bulk      lane 0 issues 16 bulk copies (`cp.async.bulk`) of 256 B, one per row, on the
            warp's mbarrier (evict-last); the warp waits on the mbarrier
  ldg       8 `ld.global.cg.v4` a lane into registers, then 8 shared stores

One block per SM, 8 reader warps (as the compute warps) and, with the stream, one lane of a
ninth warp keeping 8 bulk copies of 16 KiB in flight from its own share of a buffer
(evict-first, as the weight ring) until the readers are done. Each reader warp fetches
--stages chunks, stage s of warp w at k = 128 (8 s + w) mod K of a 16 x K bf16 A (every SM
reads the same A, as the narrow bands do), and after each spins --mma-ns (its MMAs' time).
Rows land at a pitch of 272 B. Per stage, lane 0 stamps the start, the end of the issue and
the landing (%globaltimer); per cell, the medians over warps and SMs of the mean issue and
issue-to-landing times, the stream's TB/s over the launch (CUDA events), medians over --reps
launches. Each chunk's first and last element are checked against A (which holds its own
index): a probe that fetches nothing fails loudly. Every wait has a deadline.

    python tools/probe_a_chunks.py [--reps 5] [--stages 32] [--mma-ns 400] [--compile-only]
"""
import argparse
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megak.runtime.compiler import compile_source  # noqa: E402
from probe_ptx import BULK_PRELUDE, compile_only, on_gpu  # noqa: E402  (tools/, beside this file)

ENTRY = "a_chunks"
READERS = 8
THREADS = 32 * (READERS + 1)
PAGE = 16384
RING = 8
A_ROWS, A_K = 16, 4096       # a 16-row activation of 4096: 128 KiB of bf16
CHUNK_K = 128                # k per chunk: 256 B a row
PITCH = 272                  # bytes per row in shared memory (16-B aligned, padded)
SMEM = RING * PAGE + READERS * A_ROWS * PITCH + 1024
STAT_WORDS = 4               # per reader warp: issue ns, land ns (sums over stages), bad, error
MODES = {"cpasync": 0, "bulk": 1, "ldg": 2}

SOURCE = BULK_PRELUDE + r"""
typedef unsigned short u16;

__device__ __forceinline__ void cp_async16(u32 dst, const void* src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}

/* A bulk copy on the warp's mbarrier, kept in L2 (an activation is read by every SM). */
__device__ __forceinline__ void bulk_row(u32 dst, const void* src, u32 bytes, u32 bar, u64 pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS_N, 1)
a_chunks(const u16* a, const unsigned char* buf, u64 share, u32 mode, u32 stream, u32 stages,
         u64 mma_ns, u64* stats, u64* copies)
{
    __shared__ u64 full[RING_PAGES];
    __shared__ u64 abar[READERS_N];
    __shared__ u32 finished;
    __shared__ volatile u32 done;
    unsigned char* pages = smem + (1024u - (sa(smem) & 1023u)) % 1024u;
    unsigned char* abuf = pages + RING_PAGES * PAGE;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const u64 deadline = now() + 2000000000ull;   /* 2 s: never a hang */
    if (threadIdx.x == 0) {
        done = 0u;
        finished = 0u;
        for (u32 s = 0; s < RING_PAGES; ++s)
            mbar_init(sa(&full[s]), 1u);
        for (u32 w = 0; w < READERS_N; ++w)
            mbar_init(sa(&abar[w]), 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp < READERS_N) {
        u64* st = stats + ((u64)blockIdx.x * READERS_N + warp) * STAT_WORDS_N;
        const u32 mine = sa(abuf + warp * (A_ROWS_N * PITCH_N));
        const u64 keep = policy(true);
        u64 issue_ns = 0, land_ns = 0;
        u32 bad = 0, err = 0;
        for (u32 s = 0; s < stages && !err; ++s) {
            const u32 k0 = (CHUNK_K_N * (READERS_N * s + warp)) % A_K_N;
            __syncwarp();
            const u64 t0 = now();
            if (mode == 0u) {
#pragma unroll
                for (u32 j = 0; j < 8u; ++j) {
                    const u32 i = lane + 32u * j, r = i >> 4, u = i & 15u;
                    cp_async16(mine + r * PITCH_N + 16u * u, a + (u64)r * A_K_N + k0 + 8u * u);
                }
                asm volatile("cp.async.commit_group;" ::: "memory");
            } else if (mode == 1u) {
                if (lane == 0) {
                    mbar_expect_tx(sa(&abar[warp]), A_ROWS_N * CHUNK_K_N * 2u);
                    for (u32 r = 0; r < A_ROWS_N; ++r)
                        bulk_row(mine + r * PITCH_N, a + (u64)r * A_K_N + k0, CHUNK_K_N * 2u,
                                 sa(&abar[warp]), keep);
                }
            }
            uint4 v[8];
            if (mode == 2u)
#pragma unroll
                for (u32 j = 0; j < 8u; ++j) {
                    const u32 i = lane + 32u * j, r = i >> 4, u = i & 15u;
                    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w)
                                 : "l"(a + (u64)r * A_K_N + k0 + 8u * u));
                }
            __syncwarp();
            const u64 t1 = now();
            if (mode == 0u) {
                asm volatile("cp.async.wait_all;" ::: "memory");
            } else if (mode == 1u) {
                while (!mbar_try(sa(&abar[warp]), s & 1u))
                    if (now() > deadline) { err = 1u; break; }
            } else {
#pragma unroll
                for (u32 j = 0; j < 8u; ++j) {
                    const u32 i = lane + 32u * j, r = i >> 4, u = i & 15u;
                    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                                 :: "r"(mine + r * PITCH_N + 16u * u), "r"(v[j].x), "r"(v[j].y),
                                    "r"(v[j].z), "r"(v[j].w) : "memory");
                }
            }
            __syncwarp();
            const u64 t2 = now();
            if (lane == 0) {
                /* A holds its own index mod 2^16: the chunk's first and last element */
                u16 first, last;
                asm volatile("ld.shared.u16 %0, [%1];" : "=h"(first) : "r"(mine));
                asm volatile("ld.shared.u16 %0, [%1];" : "=h"(last)
                             : "r"(mine + (A_ROWS_N - 1u) * PITCH_N + CHUNK_K_N * 2u - 2u));
                const u32 want_last = (A_ROWS_N - 1u) * A_K_N + k0 + CHUNK_K_N - 1u;
                bad += (first != (u16)k0) + (last != (u16)want_last);
            }
            issue_ns += t1 - t0;
            land_ns += t2 - t0;
            const u64 until = now() + mma_ns;      /* the stage's MMAs */
            while (now() < until) {
            }
        }
        if (lane == 0) {
            st[0] = issue_ns;
            st[1] = land_ns;
            st[2] = bad;
            st[3] = err;
            if (atomicAdd(&finished, 1u) + 1u == READERS_N)
                done = 1u;
        }
    } else if (lane == 0 && stream) {
        const u32 landed = stream_lane(buf + (u64)blockIdx.x * share, share, pages, full,
                                       RING_PAGES, &done, deadline);
        copies[blockIdx.x] = landed;
    }
    __syncthreads();
}
"""
for _name, _value in (("RING_PAGES", RING), ("READERS_N", READERS), ("THREADS_N", THREADS),
                      ("STAT_WORDS_N", STAT_WORDS), ("A_ROWS_N", A_ROWS), ("A_K_N", A_K),
                      ("CHUNK_K_N", CHUNK_K), ("PITCH_N", PITCH)):
    SOURCE = SOURCE.replace(_name, f"{_value}u")


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_a_chunks.cu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--stages", type=int, default=32)
    ap.add_argument("--mma-ns", type=int, default=400)
    ap.add_argument("--share-kib", type=int, default=4096)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(compile_probe, ENTRY)

    import numpy as np

    from megak.runtime.driver import check

    with on_gpu(compile_probe, ENTRY, SMEM) as (drv, fn, info, h, m):
        grid = info["sm_count"]
        share = args.share_kib * 1024 // PAGE * PAGE
        a_host = (np.arange(A_ROWS * A_K, dtype=np.uint32) & 0xFFFF).astype(np.uint16)
        a_dev = m.device(a_host.nbytes, "A")
        check(drv.cuMemcpyHtoD(a_dev.ptr, a_host.ctypes.data, a_host.nbytes), "cuMemcpyHtoD")
        buf = m.device(grid * share, "stream buffer")
        check(drv.cuMemsetD8(buf.ptr, 1, grid * share), "cuMemsetD8")
        stats = m.device(grid * READERS * STAT_WORDS * 8, "stats")
        copies = m.device(grid * 8, "copies")
        host = np.zeros(grid * READERS * STAT_WORDS, dtype=np.uint64)
        host_copies = np.zeros(grid, dtype=np.uint64)
        start, stop = (check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2))

        def cell(mode, stream):
            per = []
            for rep in range(args.reps + 1):
                vals = [ctypes.c_uint64(a_dev.ptr), ctypes.c_uint64(buf.ptr),
                        ctypes.c_uint64(share), ctypes.c_uint32(MODES[mode]),
                        ctypes.c_uint32(1 if stream else 0), ctypes.c_uint32(args.stages),
                        ctypes.c_uint64(args.mma_ns), ctypes.c_uint64(stats.ptr),
                        ctypes.c_uint64(copies.ptr)]
                argv_ = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
                check(drv.cuMemsetD8Async(stats.ptr, 0, host.nbytes, h), "cuMemsetD8Async")
                check(drv.cuMemsetD8Async(copies.ptr, 0, host_copies.nbytes, h),
                      "cuMemsetD8Async")
                check(drv.cuEventRecord(start, h), "cuEventRecord")
                check(drv.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, SMEM, h,
                                         ctypes.addressof(argv_), 0), "cuLaunchKernel")
                check(drv.cuEventRecord(stop, h), "cuEventRecord")
                check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
                check(drv.cuMemcpyDtoH(host.ctypes.data, stats.ptr, host.nbytes), "cuMemcpyDtoH")
                check(drv.cuMemcpyDtoH(host_copies.ctypes.data, copies.ptr, host_copies.nbytes),
                      "cuMemcpyDtoH")
                rows = host.reshape(grid * READERS, STAT_WORDS).astype(np.float64)
                if rows[:, 3].any() or (stream and (host_copies == 0xFFFFFFFF).any()):
                    raise SystemExit(f"{mode}: a wait passed its deadline")
                if rows[:, 2].any():
                    raise SystemExit(f"{mode}: {int(rows[:, 2].sum())} chunks held the wrong A")
                if rep == 0:
                    continue
                ms = check(drv.cuEventElapsedTime(start, stop), "cuEventElapsedTime")
                tbs = float(host_copies.sum()) * PAGE / (ms * 1e-3) / 1e12 if stream else 0.0
                per.append((float(np.median(rows[:, 0])) / args.stages,
                            float(np.median(rows[:, 1])) / args.stages, tbs, ms * 1e3))
            return [statistics.median(col) for col in zip(*per)]

        print(f"{info['name']}: {grid} SMs, {READERS} reader warps, chunks of {A_ROWS} x "
              f"{CHUNK_K} bf16, {args.stages} stages a warp, {args.mma_ns} ns after each; "
              f"medians over warps and SMs, then over {args.reps} launches", flush=True)
        print(f"{'mode':<8} {'stream':>6} {'issue ns':>9} {'land ns':>8} {'stream TB/s':>11} "
              f"{'launch us':>9}", flush=True)
        for mode in MODES:
            for stream in (False, True):
                issue, land, tbs, us = cell(mode, stream)
                print(f"{mode:<8} {'yes' if stream else 'no':>6} {issue:>9.0f} {land:>8.0f} "
                      f"{tbs:>11.2f} {us:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
