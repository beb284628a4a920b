#!/usr/bin/env python3
"""Probe: a transpose whose tiles a loader warp copies into pages one instruction ahead,
against megak's register transpose, before megak builds one (#12 item 7).

megak's transpose (ops/transpose.cuh) moves each 128 x 128 fp32 tile through registers: an
instruction loads its two tiles from HBM, transposes them in registers and stores them, so
between two instructions of an SM nothing is loading (W4-16384-fp32: 3,309 GB/s, its bubble
15% of each SM's span; the same body as separate launches 3,470; a device copy 4,228). The
question: with the tile copied into shared memory by a loader warp while the compute warps
transpose and store the previous one (the megakernel's page pipeline, which the transpose
does not use), how fast is the same transpose?

Kernels (one block per SM, grid = SM count; tile t of the 16384^2 matrix is output rows
[128 ti, +128) x columns [128 tj, +128), ti = t / nt, tj = t % nt; block b takes tiles
b, b + grid, ...):

  reg      megak's body: 256 threads, "instructions" of two tiles side by side (tj, tj + 1),
           instruction i on block i % grid, each tile in two register halves, the second
           tile's halves loaded as the first's are stored (transpose.cuh's pipeline).
  paged    288 threads: warps 0-7 transpose, warp 8 is the loader. `slots` tile buffers of
           64 KiB (2: megak's one instruction ahead; 3: one more). Loader, tile k of the block:
           wait empty[k % slots] (the compute warps are done with tile k - slots), then
             mode 0 (bulk): lane 0 arrive.expect_tx(full, 64 KiB), each lane 4 bulk copies of
                            one 512-B A row (cp.async.bulk ... complete_tx on full);
             mode 1 (cp.async): 4096 copies of 16 B, 128 per lane, cp.async.wait_all, then
                            lane 0 arrives on full (megak's loader preload, L6-L7).
           Compute warps: wait full (every thread, acquire), read their 16 float4 with
           LDS.128 in the register body's pattern (8 lanes of a phase read one 128-B row
           piece: no bank conflict), __syncwarp, lane 0 arrives on empty (8 arrivals a
           phase: the buffer is free before its tile is stored), then store them transposed
           (STG.128).

Ordering (paged): the bulk copies complete on full[s] (async proxy; the mbarrier's
complete_tx makes the bytes visible to a thread whose try_wait observes the phase: acquire);
cp.async copies are waited for by their own lane (wait_all) and ordered before lane 0's
arrive by __syncwarp; the compute warps' LDS of buffer s happen before their arrive on
empty[s] (release), which the loader's wait acquires before the next copy into s (for the
bulk copies, the async proxy writes after a generic read: the wait's acquire orders them;
megak's weight ring relies on the same). Every wait has a %globaltimer deadline: past it the
thread records an error and leaves its loop (the host raises).

Each variant: the output poisoned, a warm-up run checked against A^T on the device (every
word: a transpose that moves nothing fails), then --reps timed runs (CUDA events), median;
GB/s = 2 x bytes / median. A device-to-device copy of the same bytes is the ceiling.

Run on the H200 (2026-12-03, benchmarks/results/paged-transpose/paged-transpose.log): device
copy 4,257 GB/s; reg 3,347-3,350; paged bulk 3,779-3,790 (2 buffers), 3,712-3,746 (3); paged
cp.async 3,354-3,367 (2), 3,323-3,326 (3). --modes (benchmarks/results/three-slots/
probe-modes.log, same day, another lease): bulk 3,767-3,774 (2) / 3,696-3,737 (3); with a record
read from global memory before each refill 3,759-3,793 / 3,696-3,733; with the buffer handed
back after its stores 3,869-3,872 / 3,743-3,758; both 3,889-3,896 / 3,758-3,781: neither a
dependent global read on the loader's path nor a late hand-back costs the paged form its lead.
Modes 8 and 16 (benchmarks/results/three-slots/probe-waitall.log): cp.async.wait_all in the
loader lanes after their bulk copies 3,938-3,941 / 3,903-3,919, i.e. it does not wait for
them; a record by cp.async + wait_all before the copies 3,489-3,496 / 3,489-3,491. Modes 32,
64, 38 (probe-tmap.log, next lease): the tile by tensor-map copies, 4 boxes of 32 rows
3,763-3,792 / 3,702-3,714, one box of 128 rows 3,725-3,747 / 3,708-3,736, 4 boxes with a record
read and a late hand-back 3,792-3,801 / 3,730-3,746: the same as a bulk copy per row here,
where the loader has nothing else to do. In the megakernel the 128 row copies' issue (one
lane at a time: a bulk copy's operands are warp-uniform) held the loader 5.3 us a tile, and 4
tensor-map copies took W4 from 1,072 to 702 us (three slots) and 639 (two), against the
register body's 649 (branch transpose-tmap; benchmarks/ANALYSIS.md). Modes 128 and 384 (the
tile in by 128-B swizzled boxes, out by TMA stores from the same buffer, so no compute thread
issues a global store: #12 item 7's "TMA store out") are built, not yet run.

    python tools/probe_paged_transpose.py [--n 16384] [--reps 20] [--modes 0 1 2 4 6 8 16 32 64 38 128 384]
    python tools/probe_paged_transpose.py --compile-only      # no GPU: sm_90a, ptxas info
"""
import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from megak.runtime.compiler import compile_source, compile_report  # noqa: E402
from probe_ptx import PRELUDE  # noqa: E402

TILE_BYTES = 128 * 128 * 4
SMEM_REG = 200 * 1024                 # keeps the register kernel at one block per SM
ENTRIES = ("reg_transpose", "paged_transpose", "fill", "verify")
# paged_transpose's mode bits: 1 the loader copies by 16-B cp.async (else bulk copies), 2 each
# refill first reads a word from global memory and the copies' addresses depend on it (as
# megak's loader fetches a record before it can copy), 4 the compute warps hand a buffer back
# after they stored its tile (as megak's pages come back at an instruction's end), 8 each
# loader lane runs cp.async.wait_all after its bulk copies (megak's L7), 16 each refill first
# fetches a 128-B record by cp.async and cp.async.wait_all (megak's L2), 32 loader lane 0 copies
# the tile by 4 tensor-map copies (fp32, box 128 columns x 32 rows), 64 by one (128 x 128), 128
# the tile in by 4 swizzled boxes and out by 4 TMA stores (tma_store_loop), 256 with 128: the
# buffer handed back one tile later
MODES = {0: "bulk", 1: "cp.async", 2: "bulk + record read", 4: "bulk, late hand-back",
         6: "bulk + record read, late hand-back", 8: "bulk, then cp.async.wait_all",
         16: "bulk, record by cp.async + wait_all", 32: "tensor map, 4 boxes of 32 rows",
         64: "tensor map, one 128-row box", 38: "tensor map x4 + record read, late hand-back",
         128: "swizzled maps in, TMA stores out", 384: "swizzled maps in, TMA stores out, late hand-back"}
ERRORS = {1: "bad arguments", 2: "full wait passed its deadline (tile {} of {})",
          3: "empty wait passed its deadline (tile {} of {})"}

SOURCE = PRELUDE + r"""
__device__ __forceinline__ void fail(u32* err, u32 code, u32 a, u32 b)
{ if (atomicCAS(err, 0u, code) == 0u) { err[1] = blockIdx.x; err[2] = a; err[3] = b; } }

__device__ __forceinline__ bool mbar_wait(u32 bar, u32 par, u64 timeout_ns)
{
    if (mbar_try(bar, par)) return true;
    const u64 deadline = now() + timeout_ns;
    for (;;) {
        if (mbar_try(bar, par)) return true;
        if (now() > deadline) return false;
    }
}
__device__ __forceinline__ float4 ldg4(const float* p)
{ float4 v; asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p)); return v; }
__device__ __forceinline__ void stg4(float* p, float4 v)
{ asm volatile("st.global.v4.f32 [%0], {%1,%2,%3,%4};" :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory"); }
__device__ __forceinline__ float4 lds4(u32 a)
{ float4 v; asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory"); return v; }

/* transpose.cuh's lane map: block b of this thread at (P, Q) = (p0 + 4 (b & 1), q0 + 8 (b >> 1)) */
struct lane_map { int p0, q0; };
__device__ __forceinline__ lane_map lmap()
{
    const int w = (int)threadIdx.x >> 5, l = (int)threadIdx.x & 31;
    return { 8 * (w & 3) + (l >> 3), 16 * (w >> 2) + (l & 7) };
}
/* half H of a tile from global: x[j][k] = A row 4P + k, cols 4Q.. of block 2H + j */
template <int H>
__device__ __forceinline__ void load_half(lane_map t, const float* a, u32 lda, float4 (&x)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const float* s = a + (u64)(4 * (t.p0 + 4 * j)) * lda + 4 * (t.q0 + 8 * H);
#pragma unroll
        for (int k = 0; k < 4; ++k) x[j][k] = ldg4(s + (u64)k * lda);
    }
}
template <int H>
__device__ __forceinline__ void lds_half(lane_map t, u32 tile, float4 (&x)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const u32 s = tile + (u32)(4 * (t.p0 + 4 * j)) * 512u + 16u * (u32)(t.q0 + 8 * H);
#pragma unroll
        for (int k = 0; k < 4; ++k) x[j][k] = lds4(s + 512u * k);
    }
}
template <int H>
__device__ __forceinline__ void store_half(lane_map t, float* o, u32 ldo, const float4 (&x)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        float* d = o + (u64)(4 * (t.q0 + 8 * H)) * ldo + 4 * (t.p0 + 4 * j);
        stg4(d, make_float4(x[j][0].x, x[j][1].x, x[j][2].x, x[j][3].x));
        stg4(d + ldo, make_float4(x[j][0].y, x[j][1].y, x[j][2].y, x[j][3].y));
        stg4(d + 2 * (u64)ldo, make_float4(x[j][0].z, x[j][1].z, x[j][2].z, x[j][3].z));
        stg4(d + 3 * (u64)ldo, make_float4(x[j][0].w, x[j][1].w, x[j][2].w, x[j][3].w));
    }
}
/* output tile t: out rows 128 ti.., cols 128 tj.. = A rows 128 tj.., cols 128 ti.. */
__device__ __forceinline__ const float* a_tile(const float* a, u32 n, u32 t)
{ const u32 nt = n / 128u, ti = t / nt, tj = t % nt; return a + (u64)(128u * tj) * n + 128u * ti; }
__device__ __forceinline__ float* o_tile(float* o, u32 n, u32 t)
{ const u32 nt = n / 128u, ti = t / nt, tj = t % nt; return o + (u64)(128u * ti) * n + 128u * tj; }

extern "C" __global__ void __launch_bounds__(256, 1)
reg_transpose(const float* a, float* o, u32 n, u32* err)
{
    if (n % 256u != 0u) { if (threadIdx.x == 0) fail(err, 1u, n, 0); return; }
    const lane_map t = lmap();
    const u32 instrs = (n / 128u) * (n / 128u) / 2u;   /* two tiles (tj, tj + 1) each */
    float4 x0[2][4], x1[2][4];
    for (u32 i = blockIdx.x; i < instrs; i += gridDim.x) {
        const u32 t0 = 2u * i;
        const float* a0 = a_tile(a, n, t0);
        const float* a1 = a0 + (u64)128u * n;          /* tile t0 + 1: A rows + 128 */
        float* o0 = o_tile(o, n, t0);
        load_half<0>(t, a0, n, x0);
        load_half<1>(t, a0, n, x1);
        store_half<0>(t, o0, n, x0);
        load_half<0>(t, a1, n, x0);
        store_half<1>(t, o0, n, x1);
        load_half<1>(t, a1, n, x1);
        store_half<0>(t, o0 + 128, n, x0);
        store_half<1>(t, o0 + 128, n, x1);
    }
}

/* The compute warps' wait for tile k (buffer k % slots, phase (k / slots) & 1): false past the
 * deadline, the error recorded; else `tile` is the buffer's shared address. */
__device__ __forceinline__ bool wait_tile(u64* full, u32 buf0, u32 k, u32 slots, u32 mine,
                                          u64 timeout_ns, u32* err, u32& tile)
{
    if (!mbar_wait(sa(&full[k % slots]), (k / slots) & 1u, timeout_ns)) {
        fail(err, 2u, k, mine);
        return false;
    }
    tile = buf0 + (k % slots) * (u32)(128 * 512);
    return true;
}

/* Mode 128, the compute warps: the tile arrives as 4 boxes of 32 A columns x 128 rows with the
 * 128-B swizzle (16-B chunk c of row r at chunk c ^ (r & 7)); thread (w, l), i = l & 7,
 * g = l >> 3, holds blocks P = 8 g + i (A rows 4P..), Q = 8 b + ((i + w) & 7) (A columns 4Q..),
 * b = 0..3, so the 8 lanes of an LDS.128 / STS.128 phase hit 8 distinct chunks both ways. After
 * every thread's reads (named barrier 1), the transposed rows go back into the same buffer as
 * 4 boxes of 32 output columns x 128 rows, same swizzle; each writer's fence.proxy.async, the
 * barrier again, and thread 0 issues 4 TMA stores (bulk group). Mode 256: thread 0 hands the
 * buffer back one tile later (wait_group.read 1), else at once (wait_group.read 0); 8
 * arrivals on empty either way. */
__device__ __forceinline__ void tma_store_loop(u32 n, u32 slots, u32 mode,
                                               u64 timeout_ns, u32* err, u64* full, u64* empty,
                                               u32 buf0, u32 mine, const void* omap)
{
    const u32 w = threadIdx.x >> 5, l = threadIdx.x & 31u, i = l & 7u, g = l >> 3;
    const u32 P = 8u * g + i;
    for (u32 k = 0; k < mine; ++k) {
        u32 tile;
        if (!wait_tile(full, buf0, k, slots, mine, timeout_ns, err, tile))
            break;
        const u32 s = k % slots;
        float4 x[4][4];   /* x[b][kk]: A row 4P + kk, columns 4Q_b .. 4Q_b + 3 */
#pragma unroll
        for (u32 b = 0; b < 4u; ++b) {
            const u32 q = (i + w) & 7u;   /* Q_b % 8 */
#pragma unroll
            for (u32 kk = 0; kk < 4u; ++kk) {
                const u32 r = 4u * P + kk;
                x[b][kk] = lds4(tile + b * 16384u + r * 128u + 16u * (q ^ (r & 7u)));
            }
        }
        asm volatile("bar.sync 1, 256;" ::: "memory");   /* every read of the buffer done */
#pragma unroll
        for (u32 b = 0; b < 4u; ++b) {
            const u32 Q = 8u * b + ((i + w) & 7u);
#pragma unroll
            for (u32 e = 0; e < 4u; ++e) {
                const u32 r = 4u * Q + e;   /* output row of the tile; output columns 4P.. */
                float4 v;
                v.x = reinterpret_cast<const float*>(&x[b][0])[e];
                v.y = reinterpret_cast<const float*>(&x[b][1])[e];
                v.z = reinterpret_cast<const float*>(&x[b][2])[e];
                v.w = reinterpret_cast<const float*>(&x[b][3])[e];
                asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};"
                             :: "r"(tile + g * 16384u + r * 128u + 16u * (i ^ (r & 7u))),
                                "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
            }
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (threadIdx.x == 0) {
            const u32 t = blockIdx.x + k * gridDim.x, nt = n / 128u;
            const u32 orow = 128u * (t / nt), ocol = 128u * (t % nt);   /* o_tile */
            for (u32 b = 0; b < 4u; ++b)
                asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
                             " [%0, {%1, %2}], [%3];"
                             :: "l"(omap), "r"(ocol + 32u * b), "r"(orow), "r"(tile + b * 16384u)
                             : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            if (mode & 256u) {
                asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
                if (k > 0)
                    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0], 8; }"
                                 :: "r"(sa(&empty[(k - 1) % slots])) : "memory");
            } else {
                asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
                asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0], 8; }"
                             :: "r"(sa(&empty[s])) : "memory");
            }
        }
    }
    if (threadIdx.x == 0)
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(288, 1)
paged_transpose(const float* a, float* o, u32 n, u32 slots, u32 mode, u64 timeout_ns, u32* err,
                const void* tmap, const void* omap)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 full[4], empty[4];
    __shared__ __align__(16) unsigned char rec[128];
    if (slots < 1u || slots > 3u || n % 128u != 0u || mode > 511u ||
        ((mode & 224u) != 0u && tmap == nullptr) || ((mode & 128u) != 0u && omap == nullptr)) {
        if (threadIdx.x == 0) fail(err, 1u, slots, mode);
        return;
    }
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    const u32 buf0 = (sa(smem) + 1023u) & ~1023u;
    if (threadIdx.x == 0) {
        for (u32 s = 0; s < slots; ++s) {
            mbar_init(sa(&full[s]), 1u);
            mbar_init(sa(&empty[s]), 8u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u32 tiles = (n / 128u) * (n / 128u);
    const u32 mine = blockIdx.x < tiles ? (tiles - blockIdx.x + gridDim.x - 1u) / gridDim.x : 0u;
    if (warp == 8u) {                       /* the loader */
        for (u32 k = 0; k < mine; ++k) {
            const u32 s = k % slots, round = k / slots;
            if (k >= slots && !mbar_wait(sa(&empty[s]), (round - 1u) & 1u, timeout_ns)) {
                if (lane == 0) fail(err, 3u, k, mine);
                break;
            }
            const float* src = a_tile(a, n, blockIdx.x + k * gridDim.x);
            /* a "record": 128 B of A at a scattered 16-B aligned place (tile-dependent) */
            const float* rec_src = a + 4u * (((u64)(blockIdx.x + k * gridDim.x) * 4099u) %
                                             ((u64)n * n / 4u - 8u));
            if (mode & 16u) {  /* a record fetched by cp.async, waited for with wait_all */
                if (lane < 8u)
                    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;"
                                 :: "r"(sa(&rec[16u * lane])), "l"(rec_src + 4u * lane)
                                 : "memory");
                asm volatile("cp.async.commit_group;" ::: "memory");
                asm volatile("cp.async.wait_all;" ::: "memory");
                __syncwarp();
            }
            if (mode & 2u) {   /* a record from global memory first, the copies depend on it */
                u32 v = 0, z;
                if (lane == 0)
                    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(rec_src));
                asm volatile("and.b32 %0, %1, 0;" : "=r"(z) : "r"(__shfl_sync(0xffffffffu, v, 0)));
                src += z;
            }
            const u32 dst = buf0 + s * (u32)(128 * 512);
            if (mode & 128u) {  /* lane 0: 4 swizzled boxes of 32 A columns x 128 rows */
                const u32 t = blockIdx.x + k * gridDim.x, nt = n / 128u;
                const u32 col = 128u * (t / nt), row = 128u * (t % nt);
                if (lane == 0) {
                    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                                 :: "r"(sa(&full[s])), "r"(128u * 512u) : "memory");
                    for (u32 b = 0; b < 4u; ++b)
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                                     " [%0], [%1, {%2, %3}], [%4];"
                                     :: "r"(dst + b * 16384u), "l"(tmap), "r"(col + 32u * b),
                                        "r"(row), "r"(sa(&full[s]))
                                     : "memory");
                }
                __syncwarp();
            } else if (mode & 96u) {   /* tensor-map copies from lane 0: 4 boxes of 32 rows, or one */
                const u32 t = blockIdx.x + k * gridDim.x, nt = n / 128u;
                const u32 col = 128u * (t / nt), row = 128u * (t % nt);   /* a_tile: A rows 128 tj.., cols 128 ti.. */
                if (lane == 0) {
                    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                                 :: "r"(sa(&full[s])), "r"(128u * 512u) : "memory");
                    const u32 boxes = (mode & 32u) ? 4u : 1u;
                    for (u32 b = 0; b < boxes; ++b)
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                                     " [%0], [%1, {%2, %3}], [%4];"
                                     :: "r"(dst + b * (128u * 512u / boxes)), "l"(tmap), "r"(col),
                                        "r"(row + b * (128u / boxes)), "r"(sa(&full[s]))
                                     : "memory");
                }
                __syncwarp();
            } else if ((mode & 1u) == 0u) {
                if (lane == 0)
                    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                                 :: "r"(sa(&full[s])), "r"(128u * 512u) : "memory");
                __syncwarp();
#pragma unroll
                for (u32 r = lane; r < 128u; r += 32u)
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                                 " [%0], [%1], 512, [%2];"
                                 :: "r"(dst + 512u * r), "l"(src + (u64)r * n), "r"(sa(&full[s]))
                                 : "memory");
                if (mode & 8u) {   /* megak's L7: the lane waits for its cp.async groups */
                    asm volatile("cp.async.commit_group;" ::: "memory");
                    asm volatile("cp.async.wait_all;" ::: "memory");
                }
            } else {
#pragma unroll 4
                for (u32 u = lane; u < 4096u; u += 32u) {
                    const u32 r = u >> 5, c = u & 31u;
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                                 :: "r"(dst + 512u * r + 16u * c), "l"(src + (u64)r * n + 4u * c)
                                 : "memory");
                }
                asm volatile("cp.async.commit_group;" ::: "memory");
                asm volatile("cp.async.wait_all;" ::: "memory");
                __syncwarp();
                if (lane == 0) mbar_arrive(sa(&full[s]));
            }
        }
        return;
    }
    if (mode & 128u) {
        tma_store_loop(n, slots, mode, timeout_ns, err, full, empty, buf0, mine, omap);
        return;
    }
    const lane_map t = lmap();
    float4 x0[2][4], x1[2][4];
    for (u32 k = 0; k < mine; ++k) {
        u32 tile;
        if (!wait_tile(full, buf0, k, slots, mine, timeout_ns, err, tile))
            break;
        const u32 s = k % slots;
        float* dst = o_tile(o, n, blockIdx.x + k * gridDim.x);
        lds_half<0>(t, tile, x0);
        lds_half<1>(t, tile, x1);
        __syncwarp();
        if (lane == 0 && !(mode & 4u)) mbar_arrive(sa(&empty[s]));   /* every lane's reads done */
        store_half<0>(t, dst, n, x0);
        store_half<1>(t, dst, n, x1);
        __syncwarp();
        if (lane == 0 && (mode & 4u)) mbar_arrive(sa(&empty[s]));    /* late: after the stores */
    }
}

extern "C" __global__ void fill(u32* a, u64 count)
{
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x)
        a[i] = (u32)(i * 2654435761ull) & 0x3fffffffu;   /* finite floats, distinct enough */
}
/* res[0] += mismatches of o == a^T */
extern "C" __global__ void verify(const u32* a, const u32* o, u32 n, unsigned long long* res)
{
    u64 bad = 0;
    const u64 count = (u64)n * n;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / n, c = i % n;
        bad += o[i] != a[c * n + r];
    }
    if (bad) atomicAdd(res, bad);
}
"""


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry="paged_transpose",
                          name="probe_paged_transpose.cu")


def run(args):
    import numpy as np

    from megak.runtime import memory as mem
    from megak.runtime.driver import check
    from probe_ptx import load_kernel

    drv, fn_paged, info, stream = load_kernel(compile_probe, "paged_transpose", 3 * TILE_BYTES + 1024)
    from cuda.core import ObjectCode
    code = ObjectCode.from_cubin(compile_probe(info["arch"]).cubin)
    fn = {e: check(drv.cuKernelGetFunction(code.get_kernel(e).handle), "cuKernelGetFunction")
          for e in ENTRIES}
    for e, smem in (("reg_transpose", SMEM_REG), ("paged_transpose", 3 * TILE_BYTES + 1024)):
        check(drv.cuFuncSetAttribute(
            fn[e], drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem), "cuFuncSetAttribute")
    n_sm = info["sm_count"]
    n = args.n
    nbytes = n * n * 4
    m = mem.Memory(0)
    h = stream.handle
    keep = []
    try:
        a, o = m.device(nbytes, "A"), m.device(nbytes, "out")
        err, res = m.device(16, "err"), m.device(8, "verify")
        host = m.pinned(16, "readback")

        def launch(f, grid, block, smem, *vals):
            argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            keep.append((vals, argv))
            check(drv.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, h,
                                     ctypes.addressof(argv), 0), "cuLaunchKernel")

        def readback(buf, nb):
            mem.dtoh(host.ptr, buf.ptr, nb, h)
            check(drv.cuStreamSynchronize(h), "sync")
            return host.array(np.uint32, (4,)).copy()

        launch(fn["fill"], 4 * n_sm, 1024, 0, ctypes.c_uint64(a.ptr), ctypes.c_uint64(n * n))
        maps = {}
        # A's tensor maps: fp32, box 128 cols x rows, no swizzle (modes 32, 64); A's and the
        # output's with box 32 cols x 128 rows, 128-B swizzle (mode 128)
        for key, ptr, cols, rows, swz in ((32, a.ptr, 128, 32, "NONE"), (128, a.ptr, 128, 128, "NONE"),
                                          ("a_swz", a.ptr, 32, 128, "128B"),
                                          ("o_swz", o.ptr, 32, 128, "128B")):
            u64, u32 = drv.cuuint64_t, drv.cuuint32_t
            tm = check(drv.cuTensorMapEncodeTiled(
                drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, ptr,
                [u64(n), u64(n)], [u64(4 * n)], [u32(cols), u32(rows)], [u32(1), u32(1)],
                drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swz}"),
                drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "encode")
            buf = m.device(128, f"tmap {key}")
            hb = m.pinned(128, f"tmap {key} host")
            ctypes.memmove(hb.ptr, np.array([int(x) for x in tm.opaque], dtype=np.uint64).tobytes(), 128)
            check(drv.cuMemcpyHtoDAsync(buf.ptr, hb.ptr, 128, h), "copy map")
            maps[key] = (buf, hb)
        check(drv.cuStreamSynchronize(h), "sync")
        check(drv.cuStreamSynchronize(h), "sync")
        ev = [(check(drv.cuEventCreate(0), "event"), check(drv.cuEventCreate(0), "event"))
              for _ in range(args.reps)]

        def measure(name, enqueue, checked=True):
            mem.memset32(err.ptr, 0, 4, h)
            mem.memset32(o.ptr, 0x7FC0DEAD, n * n, h)
            enqueue()
            w = readback(err, 16)
            if w[0]:
                raise RuntimeError(f"{name}: device error {int(w[0])} in block {int(w[1])}: "
                                   + ERRORS.get(int(w[0]), "?").format(int(w[2]), int(w[3])))
            if checked:
                mem.memset32(res.ptr, 0, 2, h)
                launch(fn["verify"], 4 * n_sm, 1024, 0, ctypes.c_uint64(a.ptr),
                       ctypes.c_uint64(o.ptr), ctypes.c_uint32(n), ctypes.c_uint64(res.ptr))
                bad = int(readback(res, 8).view(np.uint64)[0])
                if bad:
                    raise RuntimeError(f"{name}: {bad} of {n * n} words differ from A^T")
            for e0, e1 in ev:
                check(drv.cuEventRecord(e0, h), "record")
                enqueue()
                check(drv.cuEventRecord(e1, h), "record")
            check(drv.cuStreamSynchronize(h), "sync")
            ts = [check(drv.cuEventElapsedTime(e0, e1), "elapsed") * 1e3 for e0, e1 in ev]
            w = readback(err, 16)
            if w[0]:
                raise RuntimeError(f"{name}: device error {int(w[0])} in a timed run")
            keep.clear()
            med = statistics.median(ts)
            print(f"{name:<36}{med:>10.1f} us{min(ts):>10.1f} us{2 * nbytes / med / 1e3:>9,.0f} GB/s"
                  f"  {'checked' if checked else ''}", flush=True)
            return med

        print(f"{info['name']}: {n_sm} SMs; transpose of {n} x {n} fp32 ({nbytes / 2**30:.2f} GiB);"
              f" medians of {args.reps}")
        measure("device copy (cuMemcpyDtoDAsync)",
                lambda: check(drv.cuMemcpyDtoDAsync(o.ptr, a.ptr, nbytes, h), "copy"),
                checked=False)
        to = int(args.timeout_s * 1e9)
        for _ in range(2):
            measure("reg (megak's body, 2 tiles/instr)",
                    lambda: launch(fn["reg_transpose"], n_sm, 256, SMEM_REG, ctypes.c_uint64(a.ptr),
                                   ctypes.c_uint64(o.ptr), ctypes.c_uint32(n),
                                   ctypes.c_uint64(err.ptr)))
            for mode, what in [(m, MODES[m]) for m in args.modes]:
                for slots in (2, 3):
                    smem = slots * TILE_BYTES + 1024
                    measure(f"paged {what}, {slots} slots",
                            lambda s=slots, md=mode, sm=smem: launch(
                                fn["paged_transpose"], n_sm, 288, sm, ctypes.c_uint64(a.ptr),
                                ctypes.c_uint64(o.ptr), ctypes.c_uint32(n), ctypes.c_uint32(s),
                                ctypes.c_uint32(md), ctypes.c_uint64(to),
                                ctypes.c_uint64(err.ptr),
                                ctypes.c_uint64(maps["a_swz" if md & 128 else 128 if md & 64
                                                     else 32][0].ptr),
                                ctypes.c_uint64(maps["o_swz"][0].ptr)))
    finally:
        check(drv.cuStreamSynchronize(h), "sync")
        m.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--timeout-s", type=float, default=2.0)
    p.add_argument("--compile-only", action="store_true")
    p.add_argument("--modes", type=int, nargs="+", default=[0, 1], choices=sorted(MODES),
                   help="paged variants: " + ", ".join(f"{k} {v}" for k, v in MODES.items()))
    args = p.parse_args(argv)
    if args.compile_only:
        t0 = time.perf_counter()
        lines, bad = compile_report(compile_probe("sm_90a"), ENTRIES, time.perf_counter() - t0)
        print("\n".join(lines))
        return 1 if bad else 0
    return run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
