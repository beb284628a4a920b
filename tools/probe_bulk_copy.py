#!/usr/bin/env python3
"""Probe: a device copy through bulk (TMA) copies, one lane per SM, before megak builds one.

megak's copy op moves data through registers (ops/copy.cuh: ld.global.cg / st.global, 64 KiB
of loads in flight per SM): 3,751 GB/s (read + write) on a 1 GiB fp32 copy on the H200, where
a device-to-device cudaMemcpy reaches 4,228 GB/s; the target is >= 4,100 GB/s. The question:
does a copy where ONE lane per SM issues bulk copies through a ring of 16 KiB shared-memory
pages reach that, and with which ring depth, chunk size and cache hints?

The kernel (`bulk_copy`): one block of one warp per SM (grid = SM count, plain launch; the
dynamic shared memory, 193 KiB whatever the ring's size, keeps it at one block per SM, and
nothing relies on co-residency). Block b copies its contiguous share of the buffer: chunks
[total * b / grid, total * (b + 1) / grid) of C bytes (16 or 32 KiB; the last chunk of the
buffer may be shorter). Lane 0 alone runs a ring of R pages of 16 KiB = S = R * 16 KiB / C
slots, one mbarrier `full` per slot; chunk p lives in slot p % S, phase (p / S) & 1:

    load  p: mbarrier.arrive.expect_tx(full[slot], bytes)
             cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes (optionally
             .L2::cache_hint with an evict_first policy)
    store p: try_wait.parity(full[slot]) (deadline), then
             cp.async.bulk.global.shared::cta.bulk_group + cp.async.bulk.commit_group
    reload:  right after store p, chunk p + L (L = S - K loads in flight) goes into the slot
             of chunk p - K; `cp.async.bulk.wait_group.read K` first (K = stores allowed
             still reading their pages), so store p - K has finished reading that page.
    end:     cp.async.bulk.wait_group 0: every store's writes have completed.

Every spin has a %globaltimer deadline (1 s): on timeout the lane writes an error record and
leaves; the host raises. Each variant: dst poisoned, a warm-up run, dst compared with src on
the device (every byte: a probe that copies nothing fails loudly), then `--reps` timed runs
back to back (CUDA events around each launch), the median reported as GB/s = 2 x bytes / t
(read + write). L2 is not flushed: 1 GiB is far beyond the 60 MB L2.

Peers in the same table: cuMemcpyDtoDAsync of the same bytes, and register copies (float4
ld.global.cg / st.global, grid-stride): `reg u8` (256 threads, 8 float4 per thread per step,
a grid of as many blocks as fit) and `reg u16` (one block of 256 threads per SM, 16 float4
per thread: megak's copy footprint, 64 KiB of loads per SM, as batches rather than a rolling
pipeline).

Second run (H200, 1 GiB, every section): no variant reaches 4,100: memcpy 4,258; best bulk
3,903 (interleaved, 1 lane; contiguous 3,853; 2-4 lanes 3,897; 2 blocks/SM 3,900); register
grid-stride 3,952; megak's band pattern 3,817. So megak's copy stays in registers
(benchmarks/ANALYSIS.md).

First run (H200, 1 GiB): memcpy 4228, reg u8 3916, reg u16 3974; bulk_copy plateaus at
3830-3842 for every R >= 4 (0.91 x memcpy), evict_first on loads -5%, the fence free. Depth is
not the limit. The hypothesis this run tests: the ADDRESS PATTERN is (132 SMs each streaming
their own contiguous 8 MiB may spread poorly over HBM channels/banks, where the grid-stride
register copies interleave finely), or one lane's issue rate is. Sections (--sections, default
all; the peers always run):

  contig      bulk_copy's contiguous shares (the first run's table; trimmed to R 4, 8 without
              hints unless --full, which restores R 2..12 x evict_first and the K / hint /
              fence sweep) and one `bulkx ctg` row: bulk_copy_x in the same pattern, which
              should match bulk_copy.
  interleave  bulk_copy_x, chunk c of the buffer -> block c % grid (every block strides through
              the whole buffer), one lane per SM: R in {4, 8} x C in {16, 32} KiB with
              K = S / 2, then R = 12, K = 1, evict_first on loads.
  lanes       bulk_copy_x with 2 or 4 issuing lanes per SM, one per warp (separate warps, so
              their issue is independent), each its own sub-ring of S / lanes slots, own
              mbarriers and own bulk groups; interleaved chunks (chunk c -> block c % grid,
              lane (c / grid) % lanes), and one contiguous row (lanes alternate chunks of the
              block's share). S, K, L in the table are per lane.
  twoblk      bulk_copy_x at 2 blocks per SM: grid 2 x SMs, SMEM_HALF (<= 6 pages) each,
              interleaved; skipped (said so) if the occupancy query says 2 do not fit.
  band        megak's copy pattern in registers (reg_band): SM-count blocks x 256 threads, the
              buffer cut into bands, band j -> block j % grid, thread t of a block takes units
              t, t + 256, ... of the band, through mk_copy_stream's ROLLING pipeline (2 groups
              of 8 float4 per thread; the oldest group stored, then reloaded 16 units on: 64 KiB
              of loads in flight per SM). `megak`: the pipeline fills and drains inside every
              band (one band = one copy instruction), bands of 1 MiB, 64 KiB, 16 KiB. `cont`:
              one pipeline per block runs through all its bands without draining (same
              addresses, no per-band ramp), bands 1 MiB, 64 KiB, 16 KiB and 4 KiB (4 KiB =
              grid-stride order, rolling). 1 MiB bands on 132 blocks leave a tail (1024 bands:
              8 on some blocks, 7 on others); one more row at grid 128 (8 each) shows it.
  share       register copies with one contiguous share per block: reg_share_u8 / _u16 (the
              grid-stride peers' batches, block-stride inside [n b / grid, n (b + 1) / grid))
              and reg_band with one band per block (rolling): contiguous vs interleaved for
              the register path.

At the end: the best row of each family and a "what this says" line (interleaved vs
contiguous bulk, multi-lane vs one, 2 blocks/SM, drained vs continuous bands by size,
contiguous share vs grid-stride for registers, which rows reach 4,100 GB/s). Every variant is
verified on the device (dst poisoned first) and every bulk spin has the deadline.

    python tools/probe_bulk_copy.py [--gib 1] [--reps 10] [--out probe_bulk_copy.json]
                                    [--sections interleave,lanes,...] [--full]
    python tools/probe_bulk_copy.py --compile-only     # no GPU: cubin for sm_90a, ptxas info
"""
import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

from megak.runtime.compiler import compile_source, compile_report, parse_ptxas_log  # noqa: E402
from probe_ptx import MBARRIER, allow_smem, kernel_functions, open_gpu  # noqa: E402  (tools/)

PAGE = 16384
MAX_SLOTS = 12
SMEM = 1024 + MAX_SLOTS * PAGE    # dynamic smem of every one-block-per-SM kernel (> half an SM)
SMEM_HALF = 1024 + 6 * PAGE       # bulk_copy_x at 2 blocks per SM: <= 6 pages each
SECTIONS = ("contig", "interleave", "lanes", "twoblk", "band", "share")
F_HINT_LD, F_HINT_ST, F_FENCE = 1, 2, 4
ERRORS = {1: "bad arguments (slots {}, chunk {})",
          2: "ring of {} bytes does not fit the {} bytes of dynamic shared memory",
          3: "full-barrier wait passed its deadline at chunk {} of the block's {}"}
ENTRIES = ("bulk_copy", "bulk_copy_x", "reg_copy_u8", "reg_copy_u16", "reg_share_u8",
           "reg_share_u16", "reg_band", "fill", "verify")

# the source buffer's fill and the copy's check (every 16-B word), for any copy probe (u32, u64
# typedefs before it)
DATA_AND_CHECK = r"""
/* ---- data and check ------------------------------------------------------------------------ */
/* Word i gets an odd multiple of i: distinct for every i < 2^32, so a chunk copied to the
 * wrong place is caught, not only a missing one. */
extern "C" __global__ void fill(u32* p, u64 nwords)
{
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nwords;
         i += (u64)gridDim.x * blockDim.x)
        p[i] = (u32)i * 2654435761u + 0x9E3779B9u;
}
/* res[0] += mismatching 16-B words; res[1] = min index of one (host sets it to ~0). */
extern "C" __global__ void verify(const uint4* a, const uint4* b, u64 n16, u64* res)
{
    u64 bad = 0, first = ~0ull;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16;
         i += (u64)gridDim.x * blockDim.x) {
        const uint4 x = a[i], y = b[i];
        if (x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w) {
            ++bad;
            if (i < first) first = i;
        }
    }
    if (bad) {
        atomicAdd(&res[0], bad);
        atomicMin(&res[1], first);
    }
}
"""

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
#define PAGE 16384u
#define MAX_SLOTS 12u
#define F_HINT_LD 1u
#define F_HINT_ST 2u
#define F_FENCE 4u

__device__ __forceinline__ u32 sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u64 gtimer()
{ u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ u32 dyn_smem()
{ u32 n; asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n)); return n; }

""" + MBARRIER + r"""

/* ---- bulk copies (async proxy) ------------------------------------------------------------ */
__device__ __forceinline__ void bulk_load(u32 dst, const unsigned char* src, u32 bytes, u32 bar,
                                          u64 pol, bool hint)
{
    if (hint)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                     " [%0], [%1], %2, [%3], %4;"
                     :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
    else
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1], %2, [%3];"
                     :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void bulk_store(unsigned char* dst, u32 src, u32 bytes, u64 pol, bool hint)
{
    if (hint)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;"
                     :: "l"(dst), "r"(src), "r"(bytes), "l"(pol) : "memory");
    else
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     :: "l"(dst), "r"(src), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
/* Until at most n of this thread's newest bulk groups still read their shared memory. n must
 * be an immediate: one case per value. */
#define WAIT_READ_CASE(n) case n: asm volatile("cp.async.bulk.wait_group.read " #n ";" ::: "memory"); break;
__device__ __forceinline__ void bulk_wait_read(u32 n)
{
    switch (n) {
    WAIT_READ_CASE(0) WAIT_READ_CASE(1) WAIT_READ_CASE(2) WAIT_READ_CASE(3)
    WAIT_READ_CASE(4) WAIT_READ_CASE(5) WAIT_READ_CASE(6) WAIT_READ_CASE(7)
    WAIT_READ_CASE(8) WAIT_READ_CASE(9) WAIT_READ_CASE(10)
    default: asm volatile("cp.async.bulk.wait_group.read 11;" ::: "memory"); break;
    }
}

/* First error wins: err[0] = code, err[1] = block, err[2], err[3] = details. */
__device__ __forceinline__ void fail(u32* err, u32 code, u32 a, u32 b)
{
    if (atomicCAS(err, 0u, code) == 0u) { err[1] = blockIdx.x; err[2] = a; err[3] = b; }
}

/* Ordering (one thread issues everything; the pages are touched by the async proxy only):
 *  - mbarrier init (generic proxy) -> the bulk loads' complete_tx on it (async proxy):
 *    fence.mbarrier_init.release.cluster after the inits, before the first load (PTX: the
 *    fence that makes mbarrier.init visible to the async proxy; a one-CTA launch is its own
 *    cluster).
 *  - load p (async-proxy writes of the page) -> store p (async-proxy reads of it): the load's
 *    bytes complete on full[slot] (complete_tx); the lane's try_wait that sees the phase
 *    complete is an acquire, and a bulk op's completion carries an implicit generic-async
 *    proxy fence, so the bytes are visible once the phase is observed; the store is issued
 *    after it in program order. No generic access of the page lies between, so no
 *    fence.proxy.async is needed; F_FENCE adds one per chunk to measure what a page that
 *    generic code wrote before (megak's pages) would cost.
 *  - store p - K (reads the page) -> load p + L into the same page (writes it):
 *    cp.async.bulk.wait_group.read K returns once every group but the newest K (stores
 *    p - K + 1 .. p) finished reading their source; the load is issued after it.
 *  - stores -> kernel end: cp.async.bulk.wait_group 0 (reads and writes complete) before the
 *    lane leaves, so no store still reads shared memory of a finished block.
 *  - dst poisoning (a memset) and src filling are earlier launches on the same stream.
 * Timeout: the lane records the error, waits for the stores it issued, and leaves; loads that
 * never completed cannot be waited for (the process raises and should not reuse the GPU). */
extern "C" __global__ void __launch_bounds__(32, 1)
bulk_copy(const unsigned char* src, unsigned char* dst, u64 nbytes, u32 chunk, u32 slots,
          u32 stores_in_flight, u32 flags, u64 timeout_ns, u32* err)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 full[MAX_SLOTS];
    if (threadIdx.x != 0)
        return;   /* one lane per SM issues every copy */
    const u32 K = stores_in_flight;
    if (slots == 0u || slots > MAX_SLOTS || chunk == 0u || chunk % PAGE != 0u ||
        chunk / PAGE * slots > MAX_SLOTS || K >= slots || (nbytes & 15ull) != 0ull ||
        (((u64)src | (u64)dst) & 15ull) != 0ull) {
        fail(err, 1u, slots, chunk);
        return;
    }
    const u32 ring = (sa(smem) + 1023u) & ~1023u;   /* 1 KiB aligned pages */
    if (ring - sa(smem) + slots * chunk > dyn_smem()) {
        fail(err, 2u, ring - sa(smem) + slots * chunk, dyn_smem());
        return;
    }
    const u64 total = (nbytes + chunk - 1u) / chunk;
    const u64 c0 = total * blockIdx.x / gridDim.x, c1 = total * (blockIdx.x + 1u) / gridDim.x;
    const u32 n = (u32)(c1 - c0);
    const u32 L = slots - K;   /* loads in flight */
    const u32 bar0 = sa(&full[0]);

    for (u32 i = 0; i < slots; ++i)
        mbar_init(bar0 + 8u * i, 1u);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");

    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    const bool hint_ld = (flags & F_HINT_LD) != 0u, hint_st = (flags & F_HINT_ST) != 0u;
    const bool fence = (flags & F_FENCE) != 0u;
    const unsigned char* s = src + c0 * chunk;
    unsigned char* d = dst + c0 * chunk;
    const u64 left = nbytes - c0 * chunk;   /* bytes from this share's start to the end */

    /* prologue: chunks 0 .. L - 1 into slots 0 .. L - 1 (first phase of each) */
    const u32 first = n < L ? n : L;
    for (u32 p = 0; p < first; ++p) {
        const u64 off = (u64)p * chunk;
        const u32 bytes = left - off < chunk ? (u32)(left - off) : chunk;
        mbar_expect_tx(bar0 + 8u * p, bytes);
        bulk_load(ring + p * chunk, s + off, bytes, bar0 + 8u * p, pol, hint_ld);
    }
    u32 slot = 0, phase = 0;       /* of chunk pos */
    u32 lslot = L % slots;         /* slot of chunk pos + L (= that of pos - K) */
    for (u32 pos = 0; pos < n; ++pos) {
        const u64 off = (u64)pos * chunk;
        const u32 bytes = left - off < chunk ? (u32)(left - off) : chunk;
        if (!mbar_try(bar0 + 8u * slot, phase)) {
            const u64 deadline = gtimer() + timeout_ns;
            bool ok = false;
            while (!(ok = mbar_try(bar0 + 8u * slot, phase)))
                if (gtimer() > deadline)
                    break;
            if (!ok) {
                fail(err, 3u, pos, n);
                break;
            }
        }
        if (fence)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bulk_store(d + off, ring + slot * chunk, bytes, pol, hint_st);
        const u32 nxt = pos + L;
        if (nxt < n) {
            const u64 noff = (u64)nxt * chunk;
            const u32 nbytes_ = left - noff < chunk ? (u32)(left - noff) : chunk;
            bulk_wait_read(K);   /* store pos - K has read the page of slot lslot */
            mbar_expect_tx(bar0 + 8u * lslot, nbytes_);
            bulk_load(ring + lslot * chunk, s + noff, nbytes_, bar0 + 8u * lslot, pol, hint_ld);
        }
        if (++slot == slots) { slot = 0; phase ^= 1u; }
        if (++lslot == slots) lslot = 0;
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* ---- bulk_copy_x: bulk_copy with a choice of chunk order, issuing lanes per block -------- */
/* `lanes` = blockDim.x / 32 issuing threads (lane 0 of each warp: separate warps, so each
 * issues on its own), each with its own sub-ring of slots / lanes consecutive slots (and
 * their mbarriers) and its own bulk groups; K and L are per lane. Chunk order:
 *  - interleave = 1: chunk c of the whole buffer goes to block c % grid, lane (c / grid) %
 *    lanes: worker w = lane * grid + block copies chunks w, w + W, w + 2W, ... (W = grid *
 *    lanes), so at any time the grid works in one window of ~W chunks that moves through the
 *    buffer;
 *  - interleave = 0: block b takes its contiguous share [c0, c1) as bulk_copy does, lane l
 *    chunks c0 + l, c0 + l + lanes, ... (lanes = 1: bulk_copy's pattern exactly).
 * Same ring, ordering and deadline as bulk_copy (see there), per lane. */
extern "C" __global__ void __launch_bounds__(128, 1)
bulk_copy_x(const unsigned char* src, unsigned char* dst, u64 nbytes, u32 chunk, u32 slots,
            u32 stores_in_flight, u32 flags, u32 interleave, u64 timeout_ns, u32* err)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) u64 full[MAX_SLOTS];
    if ((threadIdx.x & 31u) != 0u)
        return;   /* lane 0 of each warp issues its share */
    const u32 lanes = blockDim.x / 32u, lane = threadIdx.x / 32u;
    const u32 sl = lanes ? slots / lanes : 0u;   /* this lane's slots */
    const u32 K = stores_in_flight;
    if ((blockDim.x & 31u) != 0u || lanes == 0u || lanes > 4u || slots == 0u ||
        slots > MAX_SLOTS || slots % lanes != 0u || chunk == 0u || chunk % PAGE != 0u ||
        chunk / PAGE * slots > MAX_SLOTS || K >= sl || (nbytes & 15ull) != 0ull ||
        (((u64)src | (u64)dst) & 15ull) != 0ull) {
        fail(err, 1u, slots, chunk);
        return;
    }
    const u32 ring0 = (sa(smem) + 1023u) & ~1023u;   /* 1 KiB aligned pages */
    if (ring0 - sa(smem) + slots * chunk > dyn_smem()) {
        fail(err, 2u, ring0 - sa(smem) + slots * chunk, dyn_smem());
        return;
    }
    const u64 total = (nbytes + chunk - 1u) / chunk;
    u64 cfirst, cstep, n64;
    if (interleave) {
        const u64 W = (u64)gridDim.x * lanes, w = (u64)lane * gridDim.x + blockIdx.x;
        cfirst = w;
        cstep = W;
        n64 = w < total ? (total - w + W - 1u) / W : 0u;
    } else {
        const u64 c0 = total * blockIdx.x / gridDim.x, c1 = total * (blockIdx.x + 1u) / gridDim.x;
        cfirst = c0 + lane;
        cstep = lanes;
        n64 = cfirst < c1 ? (c1 - cfirst + lanes - 1u) / lanes : 0u;
    }
    const u32 n = (u32)n64;
    const u32 L = sl - K;   /* loads in flight, this lane */
    const u32 ring = ring0 + lane * sl * chunk;
    const u32 bar0 = sa(&full[lane * sl]);

    for (u32 i = 0; i < sl; ++i)
        mbar_init(bar0 + 8u * i, 1u);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");

    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    const bool hint_ld = (flags & F_HINT_LD) != 0u, hint_st = (flags & F_HINT_ST) != 0u;
    const bool fence = (flags & F_FENCE) != 0u;
    const u64 step = cstep * chunk;          /* bytes from one of this lane's chunks to the next */
    const u64 base = cfirst * chunk;         /* byte offset of its first chunk */

    const u32 first = n < L ? n : L;
    for (u32 p = 0; p < first; ++p) {
        const u64 off = base + (u64)p * step;
        const u32 bytes = nbytes - off < chunk ? (u32)(nbytes - off) : chunk;
        mbar_expect_tx(bar0 + 8u * p, bytes);
        bulk_load(ring + p * chunk, src + off, bytes, bar0 + 8u * p, pol, hint_ld);
    }
    u32 slot = 0, phase = 0;
    u32 lslot = L % sl;
    for (u32 pos = 0; pos < n; ++pos) {
        const u64 off = base + (u64)pos * step;
        const u32 bytes = nbytes - off < chunk ? (u32)(nbytes - off) : chunk;
        if (!mbar_try(bar0 + 8u * slot, phase)) {
            const u64 deadline = gtimer() + timeout_ns;
            bool ok = false;
            while (!(ok = mbar_try(bar0 + 8u * slot, phase)))
                if (gtimer() > deadline)
                    break;
            if (!ok) {
                fail(err, 3u, pos, n);
                break;
            }
        }
        if (fence)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        bulk_store(dst + off, ring + slot * chunk, bytes, pol, hint_st);
        const u32 nxt = pos + L;
        if (nxt < n) {
            const u64 noff = base + (u64)nxt * step;
            const u32 nb = nbytes - noff < chunk ? (u32)(nbytes - noff) : chunk;
            bulk_wait_read(K);
            mbar_expect_tx(bar0 + 8u * lslot, nb);
            bulk_load(ring + lslot * chunk, src + noff, nb, bar0 + 8u * lslot, pol, hint_ld);
        }
        if (++slot == sl) { slot = 0; phase ^= 1u; }
        if (++lslot == sl) lslot = 0;
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

/* ---- register copies: float4, ld.global.cg / st.global, grid-stride ------------------------ */
__device__ __forceinline__ float4 ldcg4(const float4* p)
{
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ void st4(float4* p, float4 v)
{
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
/* Each step: U loads per thread (a warp's are 512 contiguous bytes each), then U stores. */
template <int U>
__device__ __forceinline__ void reg_copy(const float4* src, float4* dst, u64 n)
{
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += U * stride) {
        float4 v[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u64 j = i + k * stride;
            v[k] = j < n ? ldcg4(src + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u64 j = i + k * stride;
            if (j < n)
                st4(dst + j, v[k]);
        }
    }
}
extern "C" __global__ void __launch_bounds__(256)
reg_copy_u8(const float4* src, float4* dst, u64 n16) { reg_copy<8>(src, dst, n16); }
extern "C" __global__ void __launch_bounds__(256, 1)
reg_copy_u16(const float4* src, float4* dst, u64 n16) { reg_copy<16>(src, dst, n16); }

/* ---- register copies over contiguous pieces ----------------------------------------------- */
/* Block b copies its contiguous share [n * b / grid, n * (b + 1) / grid) of the float4 units,
 * block-stride (a block's 256 threads cover 4 KiB per load), U loads per thread per step as
 * reg_copy: the contiguous-share counterpart of reg_copy_u8 / reg_copy_u16. */
template <int U>
__device__ __forceinline__ void reg_copy_share(const float4* src, float4* dst, u64 n)
{
    const u64 lo = n * blockIdx.x / gridDim.x, hi = n * (blockIdx.x + 1u) / gridDim.x;
    const u64 stride = blockDim.x;
    for (u64 i = lo + threadIdx.x; i < hi; i += U * stride) {
        float4 v[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u64 j = i + k * stride;
            v[k] = j < hi ? ldcg4(src + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u64 j = i + k * stride;
            if (j < hi)
                st4(dst + j, v[k]);
        }
    }
}
extern "C" __global__ void __launch_bounds__(256)
reg_share_u8(const float4* src, float4* dst, u64 n16) { reg_copy_share<8>(src, dst, n16); }
extern "C" __global__ void __launch_bounds__(256, 1)
reg_share_u16(const float4* src, float4* dst, u64 n16) { reg_copy_share<16>(src, dst, n16); }

/* megak's copy pattern: the buffer cut into bands of `band` float4 units, band j -> block
 * j % grid; inside a band thread t takes units t, t + 256, ... (as mk_copy_stream does with a
 * band of whole rows), through mk_copy_stream's rolling register pipeline: 2 groups of 8 float4
 * per thread, the oldest group stored as soon as it is due and reloaded with the units 16
 * further on (64 KiB of loads in flight per block).
 *  - cont = 0 (megak): the pipeline starts and drains inside every band (one band = one copy
 *    instruction);
 *  - cont = 1: one pipeline per block runs through all its bands without draining (the
 *    walker jumps to the block's next band), which isolates the address pattern from the
 *    per-band ramp. Needs band >= 256 units. */
struct band_walk {
    u64 at, end, start;   /* unit to touch next; end of its band (clipped to n); band start */
    __device__ __forceinline__ void next(bool cont, u64 band, u64 jump, u64 n, u32 t)
    {
        at += 256u;
        if (cont && at >= end) {
            start += jump;
            at = start + t;
            end = start + band < n ? start + band : n;
        }
    }
};
template <bool CONT>
__device__ __forceinline__ void band_stream(const float4* src, float4* dst, u64 n, u64 band,
                                            u64 jump, u64 start)
{
    const u32 t = threadIdx.x;
    band_walk in = {start + t, start + band < n ? start + band : n, start};
    band_walk out = in;
    float4 x[2][8];
#pragma unroll
    for (int g = 0; g < 2; ++g)
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            x[g][u] = in.at < in.end ? ldcg4(src + in.at) : make_float4(0.f, 0.f, 0.f, 0.f);
            in.next(CONT, band, jump, n, t);
        }
    while (out.at < out.end) {
#pragma unroll
        for (int g = 0; g < 2; ++g) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                if (out.at < out.end)
                    st4(dst + out.at, x[g][u]);
                out.next(CONT, band, jump, n, t);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                x[g][u] = in.at < in.end ? ldcg4(src + in.at) : make_float4(0.f, 0.f, 0.f, 0.f);
                in.next(CONT, band, jump, n, t);
            }
        }
    }
}
extern "C" __global__ void __launch_bounds__(256, 1)
reg_band(const float4* src, float4* dst, u64 n16, u64 band16, u32 cont)
{
    if (band16 == 0u || blockDim.x != 256u || (cont && band16 < 256u))
        return;   /* the host checks; a copy that copies nothing fails verification */
    const u64 nb = (n16 + band16 - 1u) / band16;
    const u64 jump = (u64)gridDim.x * band16;
    if (cont) {
        if (blockIdx.x < nb)
            band_stream<true>(src, dst, n16, band16, jump, (u64)blockIdx.x * band16);
    } else {
        for (u64 b = blockIdx.x; b < nb; b += gridDim.x)
            band_stream<false>(src, dst, n16, band16, jump, b * band16);
    }
}

""" + DATA_AND_CHECK


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry="bulk_copy", name="probe_bulk_copy.cu")


def ptxas_summary(compiled):
    """One dict per entry: registers, spills, stack, static smem (from ptxas -v)."""
    return {e: parse_ptxas_log(compiled.log, e) for e in ENTRIES}


def compile_only(arch, compile_fn=None, entries=ENTRIES):
    """Compile (this probe's source, or compile_fn(arch)'s) for `arch` with NVRTC and print
    each entry's ptxas line: 0 when every entry compiled without spills (the copy probes'
    --compile-only)."""
    t0 = time.perf_counter()
    compiled = (compile_fn or compile_probe)(arch)
    lines, bad = compile_report(compiled, entries, time.perf_counter() - t0)
    print("\n".join(lines))
    if bad:
        print("FAIL: " + "; ".join(bad))
        return 1
    print("OK: every entry compiled, 0 spills")
    return 0


def run(args):
    import numpy as np

    from megak.runtime import memory as mem
    from megak.runtime.driver import check, device_attribute

    drv, dev, info = open_gpu("bulk copies")
    n_sm = info["sm_count"]
    l2 = device_attribute("L2_CACHE_SIZE")
    compiled = compile_probe(info["arch"])
    regs = ptxas_summary(compiled)
    fn = kernel_functions(drv, compiled.cubin, ENTRIES)
    for e in ("bulk_copy", "bulk_copy_x", "reg_copy_u16", "reg_share_u16", "reg_band"):
        allow_smem(drv, fn[e], SMEM)

    def per_sm(e, block, smem):
        return check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn[e], block, smem),
                     "cuOccupancyMaxActiveBlocksPerMultiprocessor")

    u8_per_sm = per_sm("reg_copy_u8", 256, 0)
    share_u8_per_sm = per_sm("reg_share_u8", 256, 0)
    half_per_sm = per_sm("bulk_copy_x", 32, SMEM_HALF)
    sections = set(args.sections.split(",")) if args.sections != "all" else set(SECTIONS)
    if sections - set(SECTIONS):
        raise SystemExit(f"--sections: unknown {sorted(sections - set(SECTIONS))}; "
                         f"known: {', '.join(SECTIONS)}")

    nbytes = int(args.gib * (1 << 30)) // 16 * 16
    if nbytes < 16:
        raise SystemExit("--gib too small")
    n16 = nbytes // 16
    m = mem.Memory(0)
    src = m.device(nbytes, "src")
    dst = m.device(nbytes, "dst")
    err = m.device(16, "err")
    res = m.device(16, "verify result")
    host = m.pinned(32, "readback")
    stream = dev.create_stream()
    h = stream.handle
    keep = []   # argument blocks alive until the stream has run them

    def launch(f, grid, block, smem, *vals):
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        keep.append((vals, argv))
        check(drv.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, h, ctypes.addressof(argv), 0),
              "cuLaunchKernel")

    launch(fn["fill"], 4 * n_sm, 1024, 0, ctypes.c_uint64(src.ptr), ctypes.c_uint64(nbytes // 4))
    check(drv.cuStreamSynchronize(h), "sync")
    keep.clear()
    POISON = 0x7FC0DEAD

    def poison():
        mem.memset32(dst.ptr, POISON, nbytes // 4, h)

    def readback(buf, nb):
        mem.dtoh(host.ptr, buf.ptr, nb, h)
        check(drv.cuStreamSynchronize(h), "sync")
        return host.array(np.uint64, (4,)).copy()

    def verify(name):
        mem.memset32(res.ptr, 0, 2, h)
        mem.memset32(res.ptr + 8, 0xFFFFFFFF, 2, h)
        launch(fn["verify"], 4 * n_sm, 1024, 0, ctypes.c_uint64(src.ptr),
               ctypes.c_uint64(dst.ptr), ctypes.c_uint64(n16), ctypes.c_uint64(res.ptr))
        bad, first = (int(x) for x in readback(res, 16)[:2])
        keep.clear()
        if bad:
            raise RuntimeError(f"{name}: dst differs from src in {bad} of {n16} 16-byte words "
                               f"(first at byte {first * 16} = {first * 16 / (1 << 20):.1f} MiB)")

    def check_err(name):
        w = readback(err, 16).view(np.uint32)[:4]
        if w[0]:
            what = ERRORS.get(int(w[0]), "unknown error, details {}, {}")
            raise RuntimeError(f"{name}: device error {int(w[0])} in block {int(w[1])}: "
                               + what.format(int(w[2]), int(w[3])))

    n_ev = args.reps
    ev = [(check(drv.cuEventCreate(0), "event"), check(drv.cuEventCreate(0), "event"))
          for _ in range(n_ev)]

    def measure(name, enqueue, uses_err=False):
        """poison, warm-up run, verify, then reps timed runs: per-run microseconds."""
        if uses_err:
            mem.memset32(err.ptr, 0, 4, h)
        poison()
        enqueue()
        if uses_err:
            check_err(name)
        verify(name)
        ts = []
        for a, b in ev:
            check(drv.cuEventRecord(a, h), "cuEventRecord")
            enqueue()
            check(drv.cuEventRecord(b, h), "cuEventRecord")
        check(drv.cuStreamSynchronize(h), "sync")
        for a, b in ev:
            ts.append(check(drv.cuEventElapsedTime(a, b), "cuEventElapsedTime") * 1e3)
        if uses_err:
            check_err(name)
        keep.clear()
        return ts

    timeout_ns = int(args.timeout_s * 1e9)

    def bulk(R, chunk, K, flags):
        slots = R * PAGE // chunk
        return lambda: launch(fn["bulk_copy"], n_sm, 32, SMEM, ctypes.c_uint64(src.ptr),
                              ctypes.c_uint64(dst.ptr), ctypes.c_uint64(nbytes),
                              ctypes.c_uint32(chunk), ctypes.c_uint32(slots),
                              ctypes.c_uint32(K), ctypes.c_uint32(flags),
                              ctypes.c_uint64(timeout_ns), ctypes.c_uint64(err.ptr))

    def bulk_x(R, chunk, K, flags, lanes, interleave, grid, smem):
        slots = R * PAGE // chunk
        return lambda: launch(fn["bulk_copy_x"], grid, 32 * lanes, smem, ctypes.c_uint64(src.ptr),
                              ctypes.c_uint64(dst.ptr), ctypes.c_uint64(nbytes),
                              ctypes.c_uint32(chunk), ctypes.c_uint32(slots),
                              ctypes.c_uint32(K), ctypes.c_uint32(flags),
                              ctypes.c_uint32(interleave), ctypes.c_uint64(timeout_ns),
                              ctypes.c_uint64(err.ptr))

    rows = []
    hdr = (f"{'variant':<40}{'grid':>5}{'thr':>4}{'R':>3}{'C KiB':>6}{'S':>3}{'K':>3}{'L':>3}"
           f"{'hint':>6}{'fnc':>4}{'med us':>9}{'min us':>9}{'GB/s':>7}  check")
    print(f"{info['name']}: {n_sm} SMs, L2 {l2 / 1e6:.0f} MB; copy of {nbytes} bytes "
          f"({nbytes / (1 << 30):.3f} GiB); GB/s = 2 x bytes / median of {args.reps} runs; "
          f"dynamic smem {SMEM} B/block (1 block/SM), {SMEM_HALF} B for the 2-blocks/SM rows "
          f"({half_per_sm} fit per SM); reg u8 {u8_per_sm} blocks/SM, share u8 {share_u8_per_sm}",
          flush=True)
    print("registers: " + ", ".join(f"{e} {regs[e]['registers']}" for e in ENTRIES[:7]) +
          f"; spills {sum(regs[e]['spill_stores'] + regs[e]['spill_loads'] for e in ENTRIES)} B",
          flush=True)
    print("columns: grid = blocks, thr = threads/block; bulk rows: R pages of 16 KiB per block, "
          "C chunk, S slots PER ISSUING LANE, K stores and L = S - K loads in flight per lane",
          flush=True)
    print(hdr, flush=True)

    def record(name, enqueue, uses_err=False, **meta):
        ts = measure(name, enqueue, uses_err)
        med = statistics.median(ts)
        row = dict(variant=name, **meta, median_us=med, min_us=min(ts), max_us=max(ts),
                   gbps=2 * nbytes / med / 1e3, times_us=ts, verified=True)
        rows.append(row)
        hint = {0: "-", F_HINT_LD: "ld", F_HINT_LD | F_HINT_ST: "ld+st"}.get(
            meta.get("flags", 0) & 3, "st")
        sl = meta.get("slots_per_lane", meta.get("slots"))
        cols = (f"{meta['R']:>3}{meta['chunk'] // 1024:>6}{sl:>3}{meta['K']:>3}"
                f"{sl - meta['K']:>3}{hint:>6}{'y' if meta['flags'] & F_FENCE else '-':>4}"
                if "R" in meta else " " * 28)
        gb = f"{meta.get('grid', ''):>5}{meta.get('block', ''):>4}"
        print(f"{name:<40}{gb}{cols}{med:>9.1f}{min(ts):>9.1f}{row['gbps']:>7.0f}  ok", flush=True)
        return row

    def section(title):
        print(f"-- {title}", flush=True)

    def record_bulk(R, chunk, K, flags, tag=""):
        slots = R * PAGE // chunk
        name = (f"bulk R={R} C={chunk // 1024}K K={K}" +
                {0: "", F_HINT_LD: " ef:ld", F_HINT_ST: " ef:st", 3: " ef:ld+st"}[flags & 3] +
                (" fence" if flags & F_FENCE else "") + tag)
        return record(name, bulk(R, chunk, K, flags), True, kind="bulk",
                      family="bulk contiguous, 1 lane", R=R, chunk=chunk,
                      slots=slots, K=K, flags=flags, lanes=1, interleave=False,
                      grid=n_sm, block=32,
                      hint_ld=bool(flags & F_HINT_LD), hint_st=bool(flags & F_HINT_ST),
                      fence=bool(flags & F_FENCE))

    def record_bulk_x(R, chunk, K, flags=0, lanes=1, interleave=True, per_sm=1, tag=""):
        """bulk_copy_x; K per lane; per_sm = 2: grid 2 x SMs with SMEM_HALF each."""
        slots = R * PAGE // chunk
        grid, smem = (n_sm, SMEM) if per_sm == 1 else (2 * n_sm, SMEM_HALF)
        sl = slots // lanes
        if slots % lanes or K >= sl or 1024 + slots * chunk > smem:
            raise ValueError(f"bad bulk_x config R={R} C={chunk} K={K} lanes={lanes}")
        family = ("bulk 2 blocks/SM" if per_sm == 2 else
                  f"bulk {'interleaved' if interleave else 'contiguous'}, "
                  f"{'1 lane' if lanes == 1 else '2-4 lanes'}")
        name = (f"bulkx {'ilv' if interleave else 'ctg'} R={R} C={chunk // 1024}K K={K}" +
                (f" {lanes}ln" if lanes > 1 else "") + (" 2blk/SM" if per_sm == 2 else "") +
                {0: "", F_HINT_LD: " ef:ld", F_HINT_ST: " ef:st", 3: " ef:ld+st"}[flags & 3] +
                (" fence" if flags & F_FENCE else "") + tag)
        return record(name, bulk_x(R, chunk, K, flags, lanes, int(interleave), grid, smem), True,
                      kind="bulk", family=family, R=R, chunk=chunk, slots=slots,
                      slots_per_lane=sl, K=K, flags=flags, lanes=lanes,
                      interleave=bool(interleave), grid=grid, block=32 * lanes, smem=smem,
                      hint_ld=bool(flags & F_HINT_LD), hint_st=bool(flags & F_HINT_ST),
                      fence=bool(flags & F_FENCE))

    def record_band(band_bytes, cont, grid=None, tag="", share=False):
        grid = grid or n_sm
        band16 = max(1, band_bytes // 16)
        if cont and band16 < 256:
            raise ValueError("continuous band pipeline needs bands >= 4 KiB")
        nb = -(-n16 // band16)
        size = (f"{band_bytes >> 20} MiB" if band_bytes % (1 << 20) == 0 else
                f"{band_bytes >> 10} KiB" if band_bytes % 1024 == 0 else f"{band_bytes} B")
        name = f"reg band {size} {'cont' if cont else 'megak'}" + tag
        family = ("reg contiguous share" if share else
                  "reg bands, megak, other grid" if grid != n_sm else
                  "reg bands, continuous" if cont else "reg bands, megak (drain per band)")
        if share:
            name = "reg band share (1 band/block, rolling)"
        return record(name, lambda: launch(fn["reg_band"], grid, 256, SMEM,
                                           ctypes.c_uint64(src.ptr), ctypes.c_uint64(dst.ptr),
                                           ctypes.c_uint64(n16), ctypes.c_uint64(band16),
                                           ctypes.c_uint32(cont)),
                      kind="reg", family=family, band_bytes=band16 * 16, bands=nb,
                      bands_per_block_max=-(-nb // grid), bands_per_block_mean=nb / grid,
                      continuous=bool(cont), pipeline="rolling 2 x 8 float4", grid=grid, block=256)

    t_start = time.perf_counter()
    section("peers")
    record("cuMemcpyDtoDAsync", lambda: check(drv.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, h),
                                              "cuMemcpyDtoDAsync"), kind="memcpy", family="memcpy")
    record("reg u8 grid-stride",
           lambda: launch(fn["reg_copy_u8"], u8_per_sm * n_sm, 256, 0, ctypes.c_uint64(src.ptr),
                          ctypes.c_uint64(dst.ptr), ctypes.c_uint64(n16)),
           kind="reg", family="reg grid-stride", unroll=8, pipeline="batches of 8",
           grid=u8_per_sm * n_sm, block=256)
    record("reg u16 grid-stride",
           lambda: launch(fn["reg_copy_u16"], n_sm, 256, SMEM, ctypes.c_uint64(src.ptr),
                          ctypes.c_uint64(dst.ptr), ctypes.c_uint64(n16)),
           kind="reg", family="reg grid-stride", unroll=16, pipeline="batches of 16",
           grid=n_sm, block=256)

    if "contig" in sections:
        section("bulk, contiguous share per block, one lane (the first run's table"
                f"{'' if args.full else ', trimmed: --full for all of it'})")
        done = set()
        for R in ((2, 4, 8, 12) if args.full else (4, 8)):
            for chunk in (PAGE, 2 * PAGE):
                slots = R * PAGE // chunk
                for flags in ((0, F_HINT_LD) if args.full else (0,)):
                    for K in sorted({min(1, slots - 1), slots // 2} & set(range(slots))):
                        record_bulk(R, chunk, K, flags)
                        done.add((R, chunk, K, flags))
        if args.full:
            best = max((r for r in rows if r["family"] == "bulk contiguous, 1 lane"),
                       key=lambda r: r["gbps"])
            R, chunk, K, flags = best["R"], best["chunk"], best["K"], best["flags"]
            slots = best["slots"]
            section(f"around the fastest contiguous bulk row ({best['variant']}): other K, "
                    "evict_first on stores too, fence.proxy.async per chunk")
            for k in sorted({0, 1, 2, 3, slots // 4, slots // 2, 3 * slots // 4, slots - 1}
                            & set(range(slots))):
                if (R, chunk, k, flags) not in done:
                    record_bulk(R, chunk, k, flags, " (K sweep)")
            record_bulk(R, chunk, K, flags | F_HINT_LD | F_HINT_ST)
            record_bulk(R, chunk, K, flags | F_FENCE)
        # the generalised kernel in bulk_copy's own pattern: should match the rows above
        record_bulk_x(8, PAGE, 4, interleave=False)

    if "interleave" in sections:
        section("bulk, INTERLEAVED: chunk c -> block c % grid (one lane per SM)")
        for R in (4, 8):
            for chunk in (PAGE, 2 * PAGE):
                S = R * PAGE // chunk
                record_bulk_x(R, chunk, S // 2)
        record_bulk_x(12, PAGE, 6)
        record_bulk_x(8, PAGE, 1)
        record_bulk_x(8, PAGE, 4, flags=F_HINT_LD)

    if "lanes" in sections:
        section("bulk, 2 or 4 issuing lanes per SM (one per warp), each its own sub-ring; "
                "S, K, L per lane")
        for lanes, R, chunk in ((2, 8, PAGE), (2, 12, PAGE), (2, 8, 2 * PAGE), (4, 8, PAGE),
                                (4, 12, PAGE), (4, 8, 2 * PAGE)):
            sl = R * PAGE // chunk // lanes
            record_bulk_x(R, chunk, sl // 2, lanes=lanes)
        record_bulk_x(8, PAGE, 2, lanes=2, interleave=False)

    if "twoblk" in sections:
        if half_per_sm >= 2:
            section(f"bulk, 2 blocks per SM (grid {2 * n_sm}, {SMEM_HALF} B each: <= 6 pages), "
                    "interleaved")
            for R, chunk in ((4, PAGE), (6, PAGE), (4, 2 * PAGE), (6, 2 * PAGE)):
                S = R * PAGE // chunk
                record_bulk_x(R, chunk, S // 2, per_sm=2)
            record_bulk_x(6, PAGE, 2, lanes=2, per_sm=2)
        else:
            section(f"bulk, 2 blocks per SM: SKIPPED, only {half_per_sm} block(s) of "
                    f"{SMEM_HALF} B fit per SM")

    if "band" in sections:
        section(f"register copy, megak's pattern: {n_sm} blocks x 256, band j -> block j % "
                f"{n_sm}, rolling pipeline 2 x 8 float4/thread (mk_copy_stream); 'megak' = "
                "drained per band, 'cont' = one pipeline through all the block's bands")
        for band in (1 << 20, 64 << 10, 16 << 10):
            record_band(band, 0)
        for band in (1 << 20, 64 << 10, 16 << 10):
            record_band(band, 1)
        record_band(4 << 10, 1, tag=" (= grid-stride)")
        if n_sm > 128:
            record_band(1 << 20, 0, grid=128, tag=" grid 128")   # 8 bands each, no tail

    if "share" in sections:
        section("register copy, one contiguous share per block (vs the grid-stride peers)")
        record("reg u8 share",
               lambda: launch(fn["reg_share_u8"], share_u8_per_sm * n_sm, 256, 0,
                              ctypes.c_uint64(src.ptr), ctypes.c_uint64(dst.ptr),
                              ctypes.c_uint64(n16)),
               kind="reg", family="reg contiguous share", unroll=8, pipeline="batches of 8",
               grid=share_u8_per_sm * n_sm, block=256)
        record("reg u16 share",
               lambda: launch(fn["reg_share_u16"], n_sm, 256, SMEM, ctypes.c_uint64(src.ptr),
                              ctypes.c_uint64(dst.ptr), ctypes.c_uint64(n16)),
               kind="reg", family="reg contiguous share", unroll=16, pipeline="batches of 16",
               grid=n_sm, block=256)
        record_band(-(-n16 // n_sm) * 16, 0, share=True)

    # ---- what this says ---------------------------------------------------------------------
    memcpy = next(r for r in rows if r["kind"] == "memcpy")
    fams = {}
    for r in rows:
        if r["family"] not in fams or r["gbps"] > fams[r["family"]]["gbps"]:
            fams[r["family"]] = r
    print(f"== best of each family (x cuMemcpy {memcpy['gbps']:.0f}; target 4100)  "
          f"[{time.perf_counter() - t_start:.1f} s]", flush=True)
    for f, r in sorted(fams.items(), key=lambda kv: -kv[1]["gbps"]):
        print(f"  {f:<34}{r['gbps']:>6.0f} GB/s {r['gbps'] / memcpy['gbps']:>6.3f} x  "
              f"{'>= target' if r['gbps'] >= 4100 else '        '}  {r['variant']}", flush=True)

    def g(f):
        return fams[f]["gbps"] if f in fams else None

    says = []
    ctg, ilv = g("bulk contiguous, 1 lane"), g("bulk interleaved, 1 lane")
    if ctg and ilv:
        says.append(f"bulk address pattern: interleaved {ilv:.0f} vs contiguous {ctg:.0f} "
                    f"({100 * (ilv / ctg - 1):+.1f}%)")
    multi = max([x for x in (g("bulk interleaved, 2-4 lanes"), g("bulk contiguous, 2-4 lanes"))
                 if x] or [0]) or None
    if multi and (ilv or ctg):
        one = max(x for x in (ilv, ctg) if x)
        says.append(f"issue rate: 2-4 lanes {multi:.0f} vs 1 lane {one:.0f} "
                    f"({100 * (multi / one - 1):+.1f}%)")
    if g("bulk 2 blocks/SM") and ilv:
        says.append(f"bulk 2 blocks/SM {g('bulk 2 blocks/SM'):.0f} vs 1 block/SM interleaved "
                    f"{ilv:.0f}")
    bands = {(r["band_bytes"], r["continuous"], r["grid"]): r["gbps"] for r in rows
             if "band_bytes" in r and r["family"] != "reg contiguous share"}
    if bands:
        def bw(b, c):
            x = bands.get((b, c, n_sm))
            return f"{x:.0f}" if x else "-"
        says.append("reg bands drained (megak) / continuous, GB/s: " + ", ".join(
            (f"{b >> 20} MiB" if b % (1 << 20) == 0 else f"{b >> 10} KiB") +
            f" {bw(b, False)}/{bw(b, True)}"
            for b in sorted({k[0] for k in bands if k[2] == n_sm}, reverse=True)))
        if (1 << 20, False, 128) in bands and (1 << 20, False, n_sm) in bands:
            says.append(f"1 MiB bands on grid 128 (no tail) {bands[(1 << 20, False, 128)]:.0f} "
                        f"vs {n_sm} ({bands[(1 << 20, False, n_sm)]:.0f})")
    sh, gs = g("reg contiguous share"), g("reg grid-stride")
    if sh and gs:
        says.append(f"reg contiguous share {sh:.0f} vs grid-stride {gs:.0f} "
                    f"({100 * (sh / gs - 1):+.1f}%)")
    hit = [r["variant"] for r in rows if r["kind"] != "memcpy" and r["gbps"] >= 4100]
    says.append(f"target 4100 reached by: {', '.join(hit) if hit else 'none'}")
    print("what this says: " + "; ".join(says), flush=True)

    best = max((r for r in rows if r["kind"] == "bulk"), key=lambda r: r["gbps"], default=None)
    out = {"device": info["name"], "sm_count": n_sm, "l2_bytes": l2, "arch": info["arch"],
           "nbytes": nbytes, "reps": args.reps, "smem_per_block": SMEM,
           "smem_per_block_2_per_sm": SMEM_HALF, "blocks_per_sm_half_smem": half_per_sm,
           "gbps_counts": "2 x bytes / median time (read + write)",
           "ptxas": regs, "rows": rows, "fastest_bulk": best["variant"] if best else None,
           "best_per_family": {f: r["variant"] for f, r in fams.items()}, "says": says}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}", flush=True)
    for a, b in ev:
        check(drv.cuEventDestroy(a), "cuEventDestroy")
        check(drv.cuEventDestroy(b), "cuEventDestroy")
    stream.close()
    m.close()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="bytes to copy, in GiB (default 1)")
    p.add_argument("--reps", type=int, default=10, help="timed runs per variant (default 10)")
    p.add_argument("--out", default="probe_bulk_copy.json", help="JSON results ('' = none)")
    p.add_argument("--timeout-s", type=float, default=1.0, help="device spin deadline (s)")
    p.add_argument("--sections", default="all",
                   help="comma list of " + ", ".join(SECTIONS) + " (default all; the peers "
                        "memcpy / reg u8 / reg u16 always run)")
    p.add_argument("--full", action="store_true",
                   help="the first run's whole contiguous table (R 2..12, evict_first, K sweep, "
                        "fence) instead of its trimmed R 4, 8 rows")
    p.add_argument("--compile-only", action="store_true",
                   help="compile for --arch with NVRTC (no GPU), print ptxas info, exit")
    p.add_argument("--arch", default="sm_90a", help="arch of --compile-only (default sm_90a)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.compile_only:
        return compile_only(args.arch)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
