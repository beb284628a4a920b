#!/usr/bin/env python3
"""Probe: a Hopper bf16 GEMM (wgmma + TMA) shaped like megak's pages, before building the op.

megak's bf16 GEMM is mma.sync m16n8k16 + ldmatrix + a 4-stage cp.async ring on 128 x 128
tiles: 168 TFLOP/s on 8192^3 where cuBLAS (torch.matmul) reaches 784-795 on the H200. The
target of a GEMM op inside the megakernel is >= 650. This probe measures the mechanism such an
op would use, standalone, and verifies every variant's output against torch.matmul.

First run (H200, 2026-12-01, every stored variant within tolerance of torch.matmul on every
element): 8192^3 772 TFLOP/s with 4 stages, grouped order (torch 808: 0.96x; both B layouts
alike; 3 stages 746; row-major order 706; the epilogue 2.6% of the kernel); 4096^3 620-687
(torch 738: 0.84-0.93x; there row-major order is faster, and the epilogue from registers is
22% of the kernel); 512 x 4096 x 4096 334 (torch 620: only 64 tiles of 128 x 256 for 132
SMs). ptxas serialises wgmma inside a __noinline__ function (warning C7510): the op's body
must be inlined into its kernel entry, not called like megak's other op bodies.

Second run (same GPU and day), what a body as megak builds it costs: `n128x2` (two
m64n128k16 per k16 step, B's halves in pages that need not be neighbours) and `serial` (the
consumer a function of its own, so ptxas serialises its wgmma), every element verified:
8192^3 n256 770.7, n128x2 764.7, serial 700.4, n128x2 serial 667.3 TFLOP/s (torch 806.7);
4096^3 715.1 / 696.9 / 630.6 / 613.6 (torch 791.7).

What megak's op adds to the serialised MMAs, one knob each (variants `... gmaps`: the maps
read from global memory, as from megak's tensor table; `... restart`: the producer issues a
tile's first stages only once every consumer warp finished the k loop of the tile before, as
megak's one tile per instruction drains the ring; `rowmajor`: the order of megak's list
scheduling), and all three together. Third run (same GPU and day), 8192^3, TFLOP/s: n256
753.1, serialised 674.6, serialised + gmaps 678.1, + restart 645.0, row-major 639.4, all
three 598.5 (torch 789.5); megak's op measured 590 in the same session, i.e. the serialised
MMAs in row-major order (benchmarks/ANALYSIS.md, "The wgmma MMAs pipelined").

The kernel (one source, two entries; one block per SM, grid = min(SMs, tiles), 384 threads):

  tiles      128 (M) x 256 (N), k-blocks of BK = 64. Block b takes tiles b, b + grid, ...
             (static); tile t -> (tm, tn) in grouped order: GROUP_M tile-rows per group,
             tm fastest inside the group, so the ~132 tiles running at once cover GROUP_M
             rows of A x (132 / GROUP_M) columns of B and share them in L2 (group 16 balances
             A's 128-row and B's 256-column bands). `--group 1` = row-major order.
  roles      warpgroup 0: setmaxnreg.dec 40, thread 0 is the producer (TMA), the rest leave;
             warpgroups 1, 2: setmaxnreg.inc 232, the consumers, warpgroup 1 + w owns rows
             64 w .. 64 w + 63 of the tile, one wgmma.m64n256k16 per k16 step (4 per stage),
             128 fp32 accumulators per thread.
  pages      a stage = 3 pages of 16 KiB: page 0 = A box (128 M-rows x 64 k, K-major),
             pages 1-2 = B (64 k x 256 n). Up to 4 stages = 12 pages; the 13th holds the
             mbarriers. The smem request is 1 KiB of alignment slack + 13 pages.
  ring       stage position p (counted over the block's whole tile sequence, so the
             producer runs ahead into the next tile while the consumers store) lives in slot
             p % S, round r = p / S: full[slot] phase r completes when its 48 KiB land,
             empty[slot] phase r when the 8 consumer warps released it.
  epilogue   fp32 -> bf16x2 (cvt.rn) -> st.global straight from the accumulator registers
             (the wgmma D fragment: row 16 w4 + lane/4 (+8), column 8 j + 2 (lane % 4)).

  entries    wgmma_gemm_mn: B as given, K x N row-major = N-major ("MN-major"); four TMA boxes
             {64 n, 64 k} (8 KiB each, 128-B swizzle) per stage, instruction flag tnspB = 1.
             wgmma_gemm_kt: B transposed on the device first (torch, untimed) to N x K
             row-major = K-major like A (the best-documented case); two boxes {64 k, 128 n}
             (one page each), tnspB = 0. Both take A as a K-major box {64 k, 128 m}.

Shared-memory matrix descriptors (PTX ISA "Matrix Descriptor Format"; bits 0-13 start
address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base
offset, 62-63 swizzle: 1 = 128 B). The TMA with 128-B swizzle writes row r of a box (128 B)
at byte 128 r with 16-B chunk c at chunk c ^ (r & 7): a swizzle atom is 8 rows x 128 B =
1 KiB, every atom 1 KiB aligned (the ring is 1 KiB aligned), so base offset 0.
  K-major (A; B of `kt`): atoms stacked along M/N at 1 KiB: SBO = 1024, LBO unused
      (encoded 1, i.e. 16 B, as CUTLASS does); k16 step kk starts 32 kk bytes into the atom
      row (the hardware applies the swizzle to the absolute address bits).
  MN-major (B of `mn`): an atom = 64 n (128 B) x 8 k-rows. Atoms along N are the four TMA
      boxes, 8 KiB apart: LBO = 8192; atoms along K are 8 k-rows = 1 KiB apart: SBO = 1024
      (CUTLASS's canonical MN-major SW128 form ((8,n),(8,k)):((1,LBO),(8,SBO)) in 16-B
      units); k16 step kk starts 16 x 128 = 2048 kk bytes in.

Ordering (what orders what):
  - mbarrier init -> copies: thread 0 initialises full (1 arrival + tx bytes) and empty (8
    arrivals: one per consumer warp), then fence.mbarrier_init.release.cluster (makes the
    initialisation visible to the async proxy that performs complete_tx), then __syncthreads.
  - generic writes -> copies: fence.proxy.async.shared::cta by the producer before its first
    copy. Nothing in this probe writes the ring with generic stores, so it is free here; in
    the megakernel a page may have been written by st.shared of another op (the allocator
    recycles pages), and then it is required.
  - copy -> wgmma (RAW): the producer's arrive.expect_tx(full, 48 KiB) + the copies'
    complete_tx; a consumer's try_wait.parity that sees phase r complete (acquire) sees the
    bytes. wgmma reads shared memory through the async proxy, as the copy wrote it: no
    proxy fence between them.
  - wgmma.fence: orders the warpgroup's earlier register accesses of the accumulators (the
    previous tile's epilogue reads, the zero-init) before the wgmma that accesses them;
    issued before each stage's 4 wgmmas (required before the first; the 4 of a stage and
    consecutive stages of the same shape are ordered among themselves).
  - wgmma.commit_group: closes the stage's 4 wgmmas into one group. wgmma.wait_group 1
    after committing stage p: the group of stage p - 1 has completed, i.e. its shared-memory
    reads are done and its accumulator writes landed; wait_group 0 before the epilogue.
  - wgmma -> next copy into the slot (WAR): after wait_group has retired stage p - 1's group,
    lane 0 of each consumer warp arrives on empty[slot(p - 1)] (8 arrivals = both
    warpgroups, every warp: a per-warp arrival does not assume that one thread's wait_group
    covers its warpgroup's other warps); the producer's try_wait of that phase (acquire)
    happens before it issues the next copy into the slot.
  - accumulators <-> compiler: an empty asm with "+f" on every accumulator after
    wait_group 0 pins the epilogue's reads after the wait (the wait names no register).

Every spin (full, empty) has a deadline: 2 s of %globaltimer from the first failed try. On
timeout the thread writes an error record (code, block, role, tile, k-block, slot, parity,
thread; first error wins) and leaves (a consumer first drains its wgmma groups; the producer
waits, bounded, for the copies it issued); the host raises. A consumer vote (__all_sync) keeps
each warp's decision uniform.

Compile notes (NVRTC 13.5, ptxas -v, checked by --compile-only, which fails on any spill or
C75xx "Potential Performance Loss" line): a wgmma pipeline inside a __noinline__ function
is serialised by ptxas (C7510 "wgmma pipeline crossing function boundary at a function call",
seen with the consumer as a function of its own, and with a minimal kernel whose callee holds
a complete fence/mma/commit/wait_group 0 sequence). So the consumer is inlined into the entry
and allocated under the entry's cap (168 = 65536 / 384); its 128 accumulators + addressing fit
(highest register R155 in the SASS), and setmaxnreg.inc 232 only adds headroom. The producer
stays __noinline__ (no wgmma; ~20 registers, under its 40). Note for megak: mk_compute is
__noinline__, so a wgmma op body there would be serialised unless it is inlined into the entry.
At M = 512, N = 4096 the 128 x 256 tiles are 64: 64 of 132 SMs work (grid column).

Host: bf16 inputs uniform in [-1, 1] (torch, on the GPU), fp32 accumulate, bf16 out. Per size
torch.matmul (cuBLAS) is timed and is the reference. Per variant: the output is poisoned with
NaN, one warm-up run is verified, --reps timed runs (CUDA events around each launch, median),
the output verified again. The check, in fp32 on the GPU, for every element:
|out - ref| <= 2 K 2^-24 (|A| @ |B|) + 2^-8 |ref| (fp32 accumulation error of both sides +
both bf16 roundings); NaN fails. A float64 sample of 256 elements checks the reference itself.
TFLOP/s = 2 M N K / t. Rows: `mn` and `kt` x 4 stages grouped (the main rows), 3 stages,
row-major order, and `mn` with the store skipped (timing only, unverified: the difference to
the stored row is the epilogue's cost, printed per size).

    python tools/probe_wgmma_gemm.py [--sizes 8192 4096 512x4096x4096] [--reps 10]
                                     [--out probe_wgmma_gemm.json] [--group 16]
    python tools/probe_wgmma_gemm.py --compile-only     # no GPU: cubin for sm_90a, ptxas info
"""
import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

from megak.runtime.compiler import (compile_source, compile_report, function_spills,  # noqa: E402
                                    parse_ptxas_log)

PAGE = 16384
BM, BN, BK = 128, 256, 64
THREADS = 384
MAX_STAGES = 4
SMEM = 1024 + 13 * PAGE           # alignment slack + 13 pages (12 for the ring, 1 for barriers)
ENTRIES = ("wgmma_gemm_mn", "wgmma_gemm_kt", "wgmma_gemm_mn_n128", "wgmma_gemm_mn_serial",
           "wgmma_gemm_mn_n128_serial", "wgmma_gemm_mn_serial_gmaps")
SERIAL_ENTRIES = ("wgmma_gemm_mn_serial", "wgmma_gemm_mn_n128_serial",
                  "wgmma_gemm_mn_serial_gmaps")   # C7510 expected
STORE_OUT, STORE_RESTART = 1, 2   # the kernels' `store` bits
DEFAULT_SIZES = ("8192x8192x8192", "4096x4096x4096", "512x4096x4096")
TIMEOUT_NS = 2_000_000_000
ERRORS = {1: "bad arguments", 2: "consumer: full-barrier wait passed its deadline",
          3: "producer: empty-barrier wait passed its deadline",
          4: "producer: draining its copies passed the deadline"}

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

/* CUtensorMap (NVRTC has no cuda.h): 128 opaque bytes; the TMA wants >= 64-B alignment. */
struct __align__(128) TmaMap { u64 opaque[16]; };

#define PAGE 16384u
#define BM 128u
#define BN 256u
#define BK 64u
#define STAGE_BYTES (3u * PAGE)
#define MAX_STAGES 4u
#define PRODUCER_REGS 40
#define CONSUMER_REGS 232
#define TIMEOUT_NS @TIMEOUT_NS@ull
#define STORE_OUT 1u       /* Args.store bits: store the tile */
#define STORE_RESTART 2u   /* the ring drains between tiles (megak's one tile per instruction) */
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= 65536, "setmaxnreg: the file holds both");
static_assert(BM * BK * 2 == PAGE && BK * BN * 2 == 2 * PAGE, "a stage = A page + 2 B pages");

__device__ __forceinline__ u32 sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u64 gtimer()
{ u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

/* ---- mbarriers (sync.cuh / stream.cuh spellings) ----------------------------------------- */
__device__ __forceinline__ void mbar_init(u64* b, u32 n)
{ asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sa(b)), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_arrive(u64* b)
{ asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(sa(b)) : "memory"); }
/* This phase's one arrival plus `tx` bytes the copies will complete. */
__device__ __forceinline__ void mbar_expect_tx(u64* b, u32 tx)
{ asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
               :: "r"(sa(b)), "r"(tx) : "memory"); }
/* True once the phase of parity `par` has completed (acquire, cta scope). */
__device__ __forceinline__ bool mbar_try(u64* b, u32 par)
{ u32 ok; asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                       "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(sa(b)), "r"(par) : "memory");
  return ok != 0u; }
/* Bounded wait: false once TIMEOUT_NS passed since the first failed try. */
__device__ __forceinline__ bool mbar_wait(u64* b, u32 par)
{
    if (mbar_try(b, par))
        return true;
    const u64 deadline = gtimer() + TIMEOUT_NS;
    while (!mbar_try(b, par))
        if (gtimer() > deadline)
            return false;
    return true;
}

/* err[0] code (first error wins), then block, role (0 producer, 1 + w consumer warpgroup w),
 * tile, k-block, slot, parity, thread. */
__device__ __forceinline__ void report(u32* err, u32 code, u32 role, u32 tile, u32 kb, u32 slot,
                                    u32 par)
{
    if (atomicCAS(err, 0u, code) == 0u) {
        err[1] = blockIdx.x; err[2] = role; err[3] = tile; err[4] = kb; err[5] = slot;
        err[6] = par; err[7] = threadIdx.x;
        __threadfence();
    }
}

/* ---- TMA --------------------------------------------------------------------------------- */
/* Box at (c0 = inner/column coordinate, r0 = row) of the map into shared address dst; its
 * bytes complete on bar. */
__device__ __forceinline__ void tma_2d(u32 dst, const TmaMap* map, int c0, int r0, u64* bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 :: "r"(dst), "l"(map), "r"(c0), "r"(r0), "r"(sa(bar)) : "memory");
}

/* ---- wgmma ------------------------------------------------------------------------------- */
/* Shared-memory matrix descriptor, 128-B swizzle, base offset 0. */
__device__ __forceinline__ u64 smem_desc(u32 addr, u32 lbo, u32 sbo)
{
    return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)((lbo >> 4) & 0x3FFFu) << 16) |
           ((u64)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
/* Pin the accumulators: no read or write of them moves across this point. */
__device__ __forceinline__ void fence_acc(float (&d)[128])
{
#pragma unroll
    for (int i = 0; i < 128; ++i)
        asm volatile("" : "+f"(d[i]) :: "memory");
}
/* D (64 x 256 fp32, this warpgroup) (+)= A (64 x 16, K-major) * B (16 x 256); TB = tnspB
 * (1: B N-major). scale_d 0: D = A B (the tile's first step). */
template <int TB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], u64 da, u64 db, u32 scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
                 "{@D_REGS@}, %128, %129, p, 1, 1, 0, %131;\n}\n"
                 : @D_OPS@
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

/* D[OFF .. OFF+63] (64 x 128 fp32) (+)= A (64 x 16, K-major) * B (16 x 128, N-major): half of
 * the n256 tile, for B halves in pages that need not be neighbours (megak's op). */
template <int OFF>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[128], u64 da, u64 db, u32 scale_d)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{@D64_REGS@}, %64, %65, p, 1, 1, 0, 1;\n}\n"
                 : @D64_OPS@
                 : "l"(da), "l"(db), "r"(scale_d));
}

/* ---- tile order -------------------------------------------------------------------------- */
__device__ __forceinline__ void tile_coords(u32 t, u32 tiles_m, u32 tiles_n, u32 group_m,
                                            u32& tm, u32& tn)
{
    if (group_m <= 1u) { tm = t / tiles_n; tn = t % tiles_n; return; }
    const u32 per_group = group_m * tiles_n, g = t / per_group, first = g * group_m;
    const u32 rows = min(tiles_m - first, group_m), r = t % per_group;
    tm = first + r % rows;
    tn = r / rows;
}

struct Args {
    unsigned short* C;
    u32 M, N, K, stages, group_m, store;
    u32* err;
};

/* ---- producer: thread 0 ------------------------------------------------------------------ */
template <bool KT>
__device__ __noinline__ void producer(const TmaMap* mapA, const TmaMap* mapB, unsigned char* ring,
                                      u64* full, u64* empty, const Args a)
{
    asm volatile("prefetch.tensormap [%0];" :: "l"(mapA) : "memory");
    asm volatile("prefetch.tensormap [%0];" :: "l"(mapB) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   /* see the header */
    const u32 tiles_m = a.M / BM, tiles_n = a.N / BN, tiles = tiles_m * tiles_n, nk = a.K / BK;
    const u32 S = a.stages;
    u32 slot = 0, phase = 0, issued = 0, done = 0;
    u64* tile_done = empty + MAX_STAGES;
#pragma unroll 1
    for (u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        u32 tm, tn;
        tile_coords(t, tiles_m, tiles_n, a.group_m, tm, tn);
        /* STORE_RESTART: as megak runs one tile per instruction, the next tile's copies wait
         * until every consumer warp finished the k loop of the one before (the ring drains) */
        if ((a.store & STORE_RESTART) && t != blockIdx.x) {
            if (!mbar_wait(tile_done, done & 1u)) {
                report(a.err, 3u, 0u, t, 0u, 0u, done & 1u);
                return;
            }
            ++done;
        }
#pragma unroll 1
        for (u32 kb = 0; kb < nk; ++kb) {
            /* round >= 1: the slot's previous stage (round - 1) must have been released */
            if (issued >= S && !mbar_wait(&empty[slot], phase ^ 1u)) {
                report(a.err, 3u, 0u, t, kb, slot, phase ^ 1u);
                /* drain: the last min(issued, S) copies land before this thread leaves */
                const u32 first = issued > S ? issued - S : 0u;
                for (u32 q = first; q < issued; ++q)
                    if (!mbar_wait(&full[q % S], (q / S) & 1u)) {
                        report(a.err, 4u, 0u, t, kb, q % S, (q / S) & 1u);
                        return;
                    }
                return;
            }
            unsigned char* st = ring + slot * STAGE_BYTES;
            mbar_expect_tx(&full[slot], STAGE_BYTES);
            tma_2d(sa(st), mapA, (int)(kb * BK), (int)(tm * BM), &full[slot]);
            if (KT) {   /* B^T (N x K): two boxes {64 k, 128 n}, one page each */
                tma_2d(sa(st + PAGE), mapB, (int)(kb * BK), (int)(tn * BN), &full[slot]);
                tma_2d(sa(st + 2u * PAGE), mapB, (int)(kb * BK), (int)(tn * BN + 128u), &full[slot]);
            } else {    /* B (K x N): four boxes {64 n, 64 k}, 8 KiB each */
#pragma unroll
                for (u32 j = 0; j < 4u; ++j)
                    tma_2d(sa(st + PAGE + 8192u * j), mapB, (int)(tn * BN + 64u * j),
                           (int)(kb * BK), &full[slot]);
            }
            ++issued;
            if (++slot == S) { slot = 0; phase ^= 1u; }
        }
    }
    /* Normal end: the consumers wait for every stage, so every copy lands before they (and
     * the block) finish. */
}

/* ---- consumers: warpgroups 1, 2 ---------------------------------------------------------- */
template <bool KT, bool N128>
__device__ __forceinline__ void consumer(u32 wg, unsigned char* ring, u64* full, u64* empty,
                                      const Args a)
{
    const u32 t128 = threadIdx.x - 128u * (wg + 1u), w4 = t128 >> 5, lane = t128 & 31u;
    const u32 tiles_m = a.M / BM, tiles_n = a.N / BN, tiles = tiles_m * tiles_n, nk = a.K / BK;
    const u32 S = a.stages;
    const u32 ring0 = sa(ring);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i)
        acc[i] = 0.f;
    u32 slot = 0, phase = 0, prev = 0;
#pragma unroll 1
    for (u32 t = blockIdx.x; t < tiles; t += gridDim.x) {
        u32 tm, tn;
        tile_coords(t, tiles_m, tiles_n, a.group_m, tm, tn);
#pragma unroll 1
        for (u32 kb = 0; kb < nk; ++kb) {
            if (!__all_sync(0xffffffffu, mbar_wait(&full[slot], phase))) {
                wgmma_wait<0>();   /* no wgmma in flight across the call-free error path */
                if (lane == 0u)
                    report(a.err, 2u, 1u + wg, t, kb, slot, phase);
                return;
            }
            const u32 st = ring0 + slot * STAGE_BYTES;
            /* A: this warpgroup's 64 rows, 8 atoms of 1 KiB from byte 8192 wg */
            const u64 da = smem_desc(st + 8192u * wg, 16u, 1024u);
            const u64 db = KT ? smem_desc(st + PAGE, 16u, 1024u)     /* 32 K-major atoms */
                              : smem_desc(st + PAGE, 8192u, 1024u);  /* MN-major: 4 x 2 atoms */
            wgmma_fence();
#pragma unroll
            for (u32 kk = 0; kk < 4u; ++kk) {  /* +1 in a descriptor = +16 B of start address */
                if (N128 && !KT) {   /* two n128 halves, B boxes 0-1 and 2-3 (16 KiB apart) */
                    wgmma_m64n128k16<0>(acc, da + 2u * kk, db + 128u * kk, (kb | kk) != 0u);
                    wgmma_m64n128k16<64>(acc, da + 2u * kk, db + 1024u + 128u * kk,
                                         (kb | kk) != 0u);
                } else {
                    wgmma_m64n256k16<KT ? 0 : 1>(acc, da + 2u * kk,
                                                 db + (KT ? 2u * kk : 128u * kk), (kb | kk) != 0u);
                }
            }
            wgmma_commit();
            if (kb > 0u) {   /* stage kb - 1's group retired: its slot may be refilled */
                wgmma_wait<1>();
                if (lane == 0u)
                    mbar_arrive(&empty[prev]);
            }
            prev = slot;
            if (++slot == S) { slot = 0; phase ^= 1u; }
        }
        wgmma_wait<0>();
        fence_acc(acc);
        if (lane == 0u) {
            mbar_arrive(&empty[prev]);
            if (a.store & STORE_RESTART)
                mbar_arrive(empty + MAX_STAGES);   /* tile_done: this warp's k loop is over */
        }
        if (a.store & STORE_OUT) {
            const u32 row = tm * BM + 64u * wg + 16u * w4 + (lane >> 2);
            unsigned short* c = a.C + (u64)row * a.N + tn * BN + 2u * (lane & 3u);
#pragma unroll
            for (u32 j = 0; j < 32u; ++j) {
                u32 lo, hi;   /* cvt.rn.bf16x2.f32 d, a, b: a -> upper half, b -> lower */
                asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(acc[4 * j + 1]), "f"(acc[4 * j]));
                asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(acc[4 * j + 3]), "f"(acc[4 * j + 2]));
                *reinterpret_cast<u32*>(c + 8u * j) = lo;
                *reinterpret_cast<u32*>(c + 8u * (u64)a.N + 8u * j) = hi;
            }
        }
        fence_acc(acc);
    }
}

/* The consumer as a function of its own: ptxas serialises its wgmma (C7510), measured here
 * because megak's op bodies are such functions. */
template <bool KT, bool N128>
__device__ __noinline__ void consumer_call(u32 wg, unsigned char* ring, u64* full, u64* empty,
                                           const Args a)
{
    consumer<KT, N128>(wg, ring, full, empty, a);
}

/* ---- entries ----------------------------------------------------------------------------- */
template <bool KT, bool N128 = false, bool SERIAL = false>
__device__ __forceinline__ void gemm_body(const TmaMap* mapA, const TmaMap* mapB, const Args& a)
{
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* ring = reinterpret_cast<unsigned char*>(((u64)smem_raw + 1023u) & ~1023ull);
    u64* full = reinterpret_cast<u64*>(ring + 12u * PAGE);   /* page 12: the barriers */
    u64* empty = full + MAX_STAGES;
    const bool bad = a.stages < 2u || a.stages > MAX_STAGES || a.M % BM || a.N % BN || a.K % BK ||
                     a.K == 0u;
    if (bad) {   /* uniform: every thread leaves before any barrier */
        if (threadIdx.x == 0u)
            report(a.err, 1u, 0u, a.M, a.N, a.K, a.stages);
        return;
    }
    if (threadIdx.x == 0u) {
        for (u32 i = 0; i < a.stages; ++i) {
            mbar_init(&full[i], 1u);    /* the producer's expect_tx arrival (+ tx bytes) */
            mbar_init(&empty[i], 8u);   /* lane 0 of each consumer warp */
        }
        mbar_init(empty + MAX_STAGES, 8u);   /* tile_done (STORE_RESTART) */
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u32 wg = threadIdx.x >> 7;
    if (wg == 0u) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(PRODUCER_REGS));
        if (threadIdx.x == 0u)
            producer<KT>(mapA, mapB, ring, full, empty, a);
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(CONSUMER_REGS));
        if (SERIAL)
            consumer_call<KT, N128>(wg - 1u, ring, full, empty, a);
        else
            consumer<KT, N128>(wg - 1u, ring, full, empty, a);
    }
}

extern "C" __global__ void __launch_bounds__(384, 1)
wgmma_gemm_mn(const __grid_constant__ TmaMap mapA, const __grid_constant__ TmaMap mapB,
              unsigned short* C, u32 M, u32 N, u32 K, u32 stages, u32 group_m, u32 store, u32* err)
{
    const Args a = {C, M, N, K, stages, group_m, store, err};
    gemm_body<false>(&mapA, &mapB, a);
}

#define MN_ENTRY(NAME, N128, SERIAL)                                                         \
extern "C" __global__ void __launch_bounds__(384, 1)                                        \
NAME(const __grid_constant__ TmaMap mapA, const __grid_constant__ TmaMap mapB,              \
     unsigned short* C, u32 M, u32 N, u32 K, u32 stages, u32 group_m, u32 store, u32* err)  \
{                                                                                           \
    const Args a = {C, M, N, K, stages, group_m, store, err};                               \
    gemm_body<false, N128, SERIAL>(&mapA, &mapB, a);                                        \
}
/* The maps in global memory (megak's tensor table) instead of kernel parameters. */
extern "C" __global__ void __launch_bounds__(384, 1)
wgmma_gemm_mn_serial_gmaps(const TmaMap* mapA, const TmaMap* mapB, unsigned short* C, u32 M,
                           u32 N, u32 K, u32 stages, u32 group_m, u32 store, u32* err)
{
    const Args a = {C, M, N, K, stages, group_m, store, err};
    gemm_body<false, false, true>(mapA, mapB, a);
}

MN_ENTRY(wgmma_gemm_mn_n128, true, false)
MN_ENTRY(wgmma_gemm_mn_serial, false, true)
MN_ENTRY(wgmma_gemm_mn_n128_serial, true, true)

extern "C" __global__ void __launch_bounds__(384, 1)
wgmma_gemm_kt(const __grid_constant__ TmaMap mapA, const __grid_constant__ TmaMap mapBt,
              unsigned short* C, u32 M, u32 N, u32 K, u32 stages, u32 group_m, u32 store, u32* err)
{
    const Args a = {C, M, N, K, stages, group_m, store, err};
    gemm_body<true>(&mapA, &mapBt, a);
}
"""
SOURCE = (SOURCE.replace("@D_REGS@", ", ".join(f"%{i}" for i in range(128)))
          .replace("@D_OPS@", ", ".join(f'"+f"(d[{i}])' for i in range(128)))
          .replace("@D64_REGS@", ", ".join(f"%{i}" for i in range(64)))
          .replace("@D64_OPS@", ", ".join(f'"+f"(d[OFF + {i}])' for i in range(64)))
          .replace("@TIMEOUT_NS@", str(TIMEOUT_NS)))


# ---- compile --------------------------------------------------------------------------------

def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRIES[0], name="probe_wgmma_gemm.cu")


def ptxas_summary(compiled):
    """Per entry: ptxas registers / spills / stack, plus the spills of its non-inlined
    functions (producer, consumer, report)."""
    out = {}
    for e in ENTRIES:
        info = parse_ptxas_log(compiled.log, e)
        info["functions"] = function_spills(compiled.log, e)
        out[e] = info
    return out


def compile_warnings(log):
    """ptxas lines that matter for this kernel: wgmma serialisation, ignored setmaxnreg."""
    keys = ("Performance Loss", "serializ", "setmaxnreg", "(C75")
    return [ln.strip() for ln in log.splitlines() if any(k in ln for k in keys)]


def compile_only(arch):
    t0 = time.perf_counter()
    compiled = compile_probe(arch)
    lines, bad = compile_report(compiled, ENTRIES, time.perf_counter() - t0)
    print("\n".join(lines))
    warn = [w for w in compile_warnings(compiled.log)
            if not any(f"'{e}'" in w for e in SERIAL_ENTRIES)]
    for w in warn:
        print("ptxas warning: " + w)
    if warn:
        bad.append("ptxas warned about wgmma / setmaxnreg (serialised wgmma is a slow kernel)")
    if bad:
        print("FAIL: " + "; ".join(bad))
        return 1
    print("OK: both entries compiled, 0 spills, no wgmma / setmaxnreg warnings")
    return 0


# ---- GPU run --------------------------------------------------------------------------------

class DeviceError(RuntimeError):
    """The kernel wrote an error record (a deadline passed, bad arguments)."""


def parse_size(s):
    parts = [int(x) for x in s.lower().split("x")]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"size {s!r}: M x N x K or one number (a cube)")
    m, n, k = parts
    if m % BM or n % BN or k % BK:
        raise argparse.ArgumentTypeError(
            f"size {s!r}: the probe takes whole tiles: M % {BM}, N % {BN}, K % {BK} must be 0")
    return m, n, k


# (name, entry, stages, grouped, store)
VARIANTS = (
    ("mn s4 grouped", "wgmma_gemm_mn", 4, True, True),
    ("kt s4 grouped", "wgmma_gemm_kt", 4, True, True),
    ("mn s3 grouped", "wgmma_gemm_mn", 3, True, True),
    ("mn s4 rowmajor", "wgmma_gemm_mn", 4, False, True),
    ("mn s4 grouped no-store", "wgmma_gemm_mn", 4, True, False),
    ("kt s3 grouped", "wgmma_gemm_kt", 3, True, True),
    ("mn n128x2 s4 grouped", "wgmma_gemm_mn_n128", 4, True, True),
    ("mn serial s4 grouped", "wgmma_gemm_mn_serial", 4, True, True),
    ("mn n128x2 serial s4 grouped", "wgmma_gemm_mn_n128_serial", 4, True, True),
    # what megak's op adds to the serialised MMAs, one thing at a time: maps in global memory,
    # the ring drained between tiles, row-major order; then all three
    ("mn serial s4 grouped gmaps", "wgmma_gemm_mn_serial_gmaps", 4, True, True),
    ("mn serial s4 grouped restart", "wgmma_gemm_mn_serial", 4, True,
     STORE_OUT | STORE_RESTART),
    ("mn serial s4 rowmajor", "wgmma_gemm_mn_serial", 4, False, True),
    ("mn serial s4 rowmajor restart gmaps", "wgmma_gemm_mn_serial_gmaps", 4, False,
     STORE_OUT | STORE_RESTART),
)


def run(args):
    import torch

    from cuda.core import ObjectCode
    from megak.runtime.driver import _bindings, check, device_info

    torch.backends.cuda.matmul.allow_tf32 = False   # the |A| @ |B| bound in true fp32
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)                      # torch's (primary) context first
    drv = _bindings()
    info = device_info(0)
    if info["compute_capability"] != (9, 0):
        raise SystemExit(f"{info['name']}: wgmma / setmaxnreg need sm_90a (Hopper)")
    if info["smem_optin"] < SMEM:
        raise SystemExit(f"{info['name']}: {info['smem_optin']} B of opt-in shared memory, "
                         f"the probe needs {SMEM}")
    n_sm = info["sm_count"]
    t0 = time.perf_counter()
    compiled = compile_probe(info["arch"])
    summary = ptxas_summary(compiled)
    print(f"{info['name']}, {n_sm} SMs, driver {info['driver_version']}; NVRTC -> cubin "
          f"{info['arch']} in {time.perf_counter() - t0:.1f} s"
          f"{' (cache)' if compiled.from_cache else ''}")
    for e, s in summary.items():
        fs = ", ".join(f"{f}: {st}/{ld}" for f, (st, ld) in s["functions"].items())
        print(f"  {e}: {s['registers']} regs at entry, spills {s['spill_stores']}/"
              f"{s['spill_loads']} B (functions, spill st/ld: {fs or '-'})")
    for w in compile_warnings(compiled.log):
        print("  ptxas warning: " + w)
    code = ObjectCode.from_cubin(compiled.cubin)
    fn = {e: check(drv.cuKernelGetFunction(code.get_kernel(e).handle), "cuKernelGetFunction")
          for e in ENTRIES}
    for f in fn.values():
        check(drv.cuFuncSetAttribute(
            f, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM),
            "cuFuncSetAttribute")

    stream = torch.cuda.current_stream()
    hstream = drv.CUstream(stream.cuda_stream)
    err = torch.zeros(8, dtype=torch.int32, device=dev)

    def tmap(t, box_rows):
        """bf16 row-major 2-D tensor t (rows x cols): box {64 cols, box_rows rows}, 128-B
        swizzle (64 bf16 = the 128-B span), zeros out of bounds."""
        rows, cols = t.shape
        u64, u32 = drv.cuuint64_t, drv.cuuint32_t
        m = check(drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, t.data_ptr(),
            [u64(cols), u64(rows)], [u64(2 * t.stride(0))], [u32(64), u32(box_rows)],
            [u32(1), u32(1)], drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            "cuTensorMapEncodeTiled")
        raw = (ctypes.c_uint64 * 16)(*[int(x) for x in m.opaque])
        if ctypes.sizeof(raw) != 128:
            raise RuntimeError("a CUtensorMap of other than 128 bytes")
        return raw

    keep = []

    def launch(entry, grid, maps, c_ptr, m, n, k, stages, group_m, store):
        vals = [maps[0], maps[1], ctypes.c_uint64(c_ptr), ctypes.c_uint32(m), ctypes.c_uint32(n),
                ctypes.c_uint32(k), ctypes.c_uint32(stages), ctypes.c_uint32(group_m),
                ctypes.c_uint32(store), ctypes.c_uint64(err.data_ptr())]
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        keep.append((vals, argv))
        check(drv.cuLaunchKernel(fn[entry], grid, 1, 1, THREADS, 1, 1, SMEM, hstream,
                                 ctypes.addressof(argv), 0), "cuLaunchKernel")

    def check_err(what):
        torch.cuda.synchronize()
        keep.clear()
        e = [int(x) for x in err.cpu()]
        if e[0]:
            err.zero_()
            raise DeviceError(
                f"{what}: device error {e[0]} ({ERRORS.get(e[0], '?')}): block {e[1]}, role "
                f"{e[2]} (0 producer, 1/2 consumer warpgroup), tile {e[3]}, k-block {e[4]}, "
                f"slot {e[5]}, parity {e[6]}, thread {e[7]}")

    def timed(fn_launch, reps):
        ts = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(stream)
            fn_launch()
            e.record(stream)
            ts.append((s, e))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in ts) * 1e3   # us

    names = [v[0] for v in VARIANTS]
    if args.variants:
        want = [x.strip() for x in args.variants.split(",")]
        unknown = [x for x in want if x not in names]
        if unknown:
            raise SystemExit(f"--variants: unknown {unknown}; known: {names}")
        variants = [v for v in VARIANTS if v[0] in want]
    else:
        variants = list(VARIANTS)

    results = {"device": info["name"], "sm_count": n_sm, "arch": info["arch"],
               "driver": info["driver_version"], "reps": args.reps, "group_m": args.group,
               "ptxas": {e: {k: s[k] for k in ("registers", "spill_stores", "spill_loads",
                                                "stack_bytes")} for e, s in summary.items()},
               "rows": []}
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)
    failures = []
    print(f"{'M x N x K':<16}{'variant':<24}{'grid':>5}{'us':>10}{'TFLOP/s':>9}{'/torch':>8}"
          f"  check")
    for (M, N, K) in args.sizes:
        flops = 2.0 * M * N * K
        a = (torch.rand((M, K), generator=gen, device=dev) * 2 - 1).to(torch.bfloat16)
        b = (torch.rand((K, N), generator=gen, device=dev) * 2 - 1).to(torch.bfloat16)
        bt = b.t().contiguous()            # N x K, K-major: the `kt` entry's B (untimed)
        ref = torch.matmul(a, b)
        t_ref = timed(lambda: torch.matmul(a, b, out=ref), args.reps)
        torch.matmul(a, b, out=ref)
        tol = torch.matmul(a.float().abs(), b.float().abs())
        tol.mul_(2.0 * K * 2.0 ** -24).add_(ref.float().abs(), alpha=2.0 ** -8)
        # the reference itself against float64, on a sample of 256 elements
        ri = torch.randint(0, M, (256,), generator=gen, device=dev)
        ci = torch.randint(0, N, (256,), generator=gen, device=dev)
        exact = (a[ri].double() * bt[ci].double()).sum(1)
        ref_err = ((ref[ri, ci].double() - exact).abs() / tol[ri, ci].double()).max().item()
        if not ref_err <= 1.0:
            failures.append(f"{M}x{N}x{K} torch.matmul vs float64 sample: |err|/tol {ref_err:.3g}")
        tiles = (M // BM) * (N // BN)
        grid = min(n_sm, tiles)
        tflops_ref = flops / t_ref / 1e6
        size = f"{M}x{N}x{K}"
        print(f"{size:<16}{'torch.matmul':<24}{'':>5}{t_ref:>10.1f}{tflops_ref:>9.1f}"
              f"{1.0:>8.2f}  reference (vs float64 sample: max |err|/tol {ref_err:.3f})",
              flush=True)
        results["rows"].append({"size": [M, N, K], "variant": "torch.matmul", "us": t_ref,
                                "tflops": tflops_ref, "ref_vs_float64": ref_err})
        maps = {"wgmma_gemm_mn": (tmap(a, 128), tmap(b, 64)),
                "wgmma_gemm_kt": (tmap(a, 128), tmap(bt, 128))}
        for e in ENTRIES[2:]:
            maps[e] = maps["wgmma_gemm_mn"]
        # the gmaps entry reads both maps from global memory, as megak's op does from its
        # tensor table (128-B aligned, side by side)
        raw = bytes(maps["wgmma_gemm_mn"][0]) + bytes(maps["wgmma_gemm_mn"][1])
        gmaps = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(dev)
        maps["wgmma_gemm_mn_serial_gmaps"] = (ctypes.c_uint64(gmaps.data_ptr()),
                                              ctypes.c_uint64(gmaps.data_ptr() + 128))
        out = torch.empty((M, N), dtype=torch.bfloat16, device=dev)
        by_name = {}
        for name, entry, stages, grouped, store in variants:
            group_m = args.group if grouped else 1

            def go():
                launch(entry, grid, maps[entry], out.data_ptr(), M, N, K, stages, group_m,
                       int(store))

            def verify(when):
                d = (out.float() - ref.float()).abs_()
                ratio = d.div_(tol)                 # NaN (poison left) stays NaN
                nbad = int((~(ratio <= 1.0)).sum().item())
                worst = float(torch.nan_to_num(ratio, nan=float("inf")).max().item())
                return nbad, worst, when

            out.fill_(float("nan"))
            checks = []
            try:
                go()
                check_err(f"{size} {name} (warm-up)")
                if store:
                    checks.append(verify("warm-up"))
                t = timed(go, args.reps)
                check_err(f"{size} {name} (timed)")
            except DeviceError as exc:   # every spin is bounded: the kernel has left
                failures.append(str(exc))
                print(f"{size:<16}{name:<24}{grid:>5}  FAIL: {exc}", flush=True)
                results["rows"].append({"size": [M, N, K], "variant": name, "error": str(exc)})
                continue
            except Exception:            # a CUDA error (fault): the context is gone
                print(f"{size:<16}{name:<24}{grid:>5}  the launch failed (CUDA error below)",
                      flush=True)
                raise
            if store:
                checks.append(verify("after reps"))
            tf = flops / t / 1e6
            if store:
                nbad = max(c[0] for c in checks)
                worst = max(c[1] for c in checks)
                ok = nbad == 0
                text = (f"{'ok' if ok else 'FAIL'}: max |diff|/tol {worst:.3g}, "
                        f"{nbad} of {M * N} elements out of tolerance")
                if not ok:
                    failures.append(f"{size} {name}: {text}")
            else:
                nbad, worst, ok = None, None, None
                text = "timing only (store skipped), unverified"
            by_name[name] = t
            print(f"{size:<16}{name:<24}{grid:>5}{t:>10.1f}{tf:>9.1f}{tf / tflops_ref:>8.2f}"
                  f"  {text}", flush=True)
            results["rows"].append({"size": [M, N, K], "variant": name, "entry": entry,
                                    "stages": stages, "group_m": group_m, "store": store,
                                    "grid": grid, "tiles": tiles, "us": t, "tflops": tf,
                                    "vs_torch": tf / tflops_ref, "verified": ok,
                                    "bad_elements": nbad, "max_diff_over_tol": worst})
        if "mn s4 grouped" in by_name and "mn s4 grouped no-store" in by_name:
            dt = by_name["mn s4 grouped"] - by_name["mn s4 grouped no-store"]
            waves = -(-tiles // grid)
            print(f"{size:<16}epilogue (store - no-store): {dt:.1f} us = "
                  f"{100 * dt / by_name['mn s4 grouped']:.1f}% of the kernel, "
                  f"{1e3 * dt / waves:.0f} ns per tile wave ({waves} waves of {grid} tiles)")
            results["rows"].append({"size": [M, N, K], "variant": "epilogue cost",
                                    "us": dt, "waves": waves})
        del a, b, bt, ref, tol, out, maps
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(f"wrote {args.out}")
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS: every stored variant verified against torch.matmul")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=parse_size, default=None,
                   help="M x N x K or one number for a cube (default: "
                        + " ".join(DEFAULT_SIZES) + ")")
    p.add_argument("--reps", type=int, default=10, help="timed runs per variant (default 10)")
    p.add_argument("--out", default="probe_wgmma_gemm.json", help="JSON results ('' = none)")
    p.add_argument("--group", type=int, default=16,
                   help="tile-rows per group of the grouped order (default 16)")
    p.add_argument("--variants", default="",
                   help="comma list of variant names (default all: "
                        + ", ".join(v[0] for v in VARIANTS) + ")")
    p.add_argument("--compile-only", action="store_true",
                   help="compile for --arch with NVRTC (no GPU), print ptxas info, exit 0 only "
                        "with 0 spills")
    p.add_argument("--arch", default="sm_90a", help="arch of --compile-only (default sm_90a)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.group < 1:
        p.error("--group must be >= 1")
    if args.compile_only:
        return compile_only(args.arch)
    if args.sizes is None:
        args.sizes = [parse_size(s) for s in DEFAULT_SIZES]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
