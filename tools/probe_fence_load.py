#!/usr/bin/env python3
"""Probe: what a gpu-scope publish costs while the SM streams weights, fence vs stamped data.

In megak's streamed GEMM chain every SM streams its share of a layer's weights from HBM through
1-D bulk copies into a ring of 16 KiB shared-memory pages; the tail of each layer stores the
outputs, then signals: fence.release.gpu + an atomic add on a counter that consumers on other
SMs poll. That tail costs several microseconds; the signal's fence.release.gpu alone was seen
at ~0.9 us with little in flight and ~2.1 us while the SM's ring streams. The question: is a
gpu-scope fence (or any L2 round trip) slow BECAUSE of the HBM streaming load, and does a
"data as its own flag" publish (megak/device/flag.cuh: every 8-byte word = 32-bit value +
32-bit stamp, st.relaxed.gpu.b64, no fence; the consumer polls ld.relaxed.gpu.b64 until every
word carries the stamp) get around it?

Method: one kernel (`fence_load`), grid = one block per SM (cooperative launch: the ping-pong
blocks spin on each other, so they must be co-resident; 161 KiB of dynamic shared memory, more
than half an SM, keeps it at one block per SM whatever the ring's size), 64 threads:

  warp 0, lane 0   the streamer (when R > 0): R slots of 16 KiB, one `full` mbarrier each;
                   per slot mbarrier.arrive.expect_tx + cp.async.bulk.shared::cluster.global
                   .mbarrier::complete_tx::bytes.L2::cache_hint (evict_first policy) from the
                   block's own contiguous share of a 1 GiB buffer (wrapping around); when a
                   slot's copy lands (try_wait.parity, deadline) it counts the bytes and
                   reissues into that slot. When the measured warp sets the shared `stop` flag
                   it stops reissuing and waits for every copy still in flight (a block never
                   leaves with bulk copies in flight). R = 0: no load.
  warp 1           the measured warp: waits until the streamer has landed 2R pages (the load is
                   up), then runs W warm-up + N timed iterations of one mechanism (a launch
                   argument), each after a short idle gap (--gap-ns):

    fence          32 lanes store 1 KiB (32 B each, st.global.v4) to the block's area,
    fence_sc       __syncwarp, lane 0 times fence.release.gpu / fence.sc.gpu /
    fence_acqrel   fence.acq_rel.gpu alone; second figure: the 1 KiB stores + the fence.
    red_release    the same stores, then lane 0 times red.release.gpu.global.add.u32 on its
                   counter + a dependent atom.relaxed.gpu read-back of that counter (checked:
                   it must be the iteration count); second figure: a plain
                   atom.relaxed.gpu.global.add.u32 round trip on another counter (reference).
    pingpong_counter  blocks in pairs (b, b ^ 1, or b, b + grid/2 with --pair half); the lower
                   block starts: 1 KiB of data (st.global) into the partner's inbox,
                   __syncwarp, fence.release.gpu + red.relaxed.gpu add on the partner's
                   counter; the partner's lane 0 polls its counter (ld.relaxed.gpu), then
                   fence.acquire.gpu, __syncwarp, all lanes read and check the data (value =
                   iteration + 1) and reply the same way. The starter times the round trip;
                   the table shows round trip / 2 = one hop.
    pingpong_flag  the same ping-pong, the 1 KiB as 128 words {value, stamp = iteration + 1}
                   written by st.relaxed.gpu.b64 (4 per lane, scalar: flag.cuh's form), no
                   fence, no counter; the partner's lanes poll their 4 words with
                   ld.relaxed.gpu.b64 until all 128 carry the stamp (warp vote), check the
                   values and reply the same way.
    acquire        the consumer's side with nothing to wait for: lane 0 times a relaxed load
                   of a counter + fence.acquire.gpu (megak's loader), then one
                   ld.acquire.gpu of it (second figure).
    chunk8         a compute warp's 4 KiB A chunk (2048 bf16) read from L2 as stamped words:
    chunk16        1024 {bf16 x2, stamp} (8 KiB) / 2048 {f32, stamp} (16 KiB) by
                   ld.relaxed.gpu.b64, 8 in flight per lane, every stamp checked; second
                   figure: the same 4 KiB as today, by cp.async.cg + wait (chunk8) or
                   ld.global.cg.v4 (chunk16). What stamped activations would cost the k loop.

Timing: clock64 around the timed instructions (the clock read after a dependent result comes
after the instruction that consumes it: in-order issue), converted to ns with the SM's own
clock rate measured over the whole timed loop (clock64 delta / %globaltimer delta); a second
table gives the same from %globaltimer alone (32 ns steps on H100/H200). Entries: median
(p90) over all measured blocks x iterations x --reps launches. Streaming rate per launch:
bytes landed by all streamers / (last landing - first issue, over all blocks), in TB/s.

--copies cpasync streams the same R slots with warp 0's 32 lanes issuing 16-B cp.async.cg copies
(LDGSTS, 32 a lane a slot, one commit group a slot), the copies megak's short fp32 tile and its
loader make for B, where the bulk form's copies do not occupy the SM's load path. The question
it answers: does a compute warp's round trip to L2 (acquire, chunk16's loads) or its release
fence wait behind an SM's cp.async copies the way the fence waits behind its bulk copies?
(the short fp32 tile's traced round trips, benchmarks/ANALYSIS.md: 1.5-3 us each).

Every spin (streamer try_wait, the wait for the load, the counter and stamp polls) has a
%globaltimer deadline (--timeout-ms, 200 ms); on timeout the lane writes an error record into
its block's error word and the warp stops (the measured warp always sets `stop` on its way
out, so the streamer drains and leaves). Data-check failures are error records too. The host
raises on any error record or a timed slot never written, and warns if two blocks shared an SM
(%smid per block).

SASS (NVRTC 13.x, sm_90a; nvdisasm of the cubin): fence.release.gpu = MEMBAR.ALL.GPU + ERRBAR
+ CGAERRBAR; fence.acq_rel.gpu the same + CCTL.IVALL; fence.sc.gpu = MEMBAR.SC.GPU + ERRBAR +
CGAERRBAR + CCTL.IVALL; fence.acquire.gpu = CCTL.IVALL. In this kernel ptxas also puts the
__syncwarp's MEMBAR.ALL.CTA right before the fence, inside the timed window.

First run (H200, 2026-12-02, 132 SMs; ns, medians; hop = round trip / 2):

    R (pages in flight per SM)        0      2      4      6     10
    fence.release.gpu               246    377    905   1970   3851
    fence.sc.gpu / acq_rel.gpu      289    952   2347      -   7400
    ld.relaxed + fence.acquire      158    166    190    387    490
    hop, 1 KiB + fence + counter    969   1770   3420   5335   9223
    hop, 1 KiB stamped words        386    503    666    695    674

    R                                 0      4     10
    A chunk, 4 KiB cp.async + wait  183    559   1107
    A chunk, 8 KiB stamped words    756   2176   4128
    A chunk, 16 KiB stamped words  1863   4568   9695

The release fence waits for the SM's bulk copies in flight (issued by another warp); the
acquire side and a relaxed atomic stay at L2 round-trip cost; stamped words skip the wait,
but reading an A chunk as stamped words costs ~4x its cp.async (benchmarks/ANALYSIS.md).

    python tools/probe_fence_load.py [--sms N] [--ring 0,2,4,10] [--mech fence,...]
                                     [--iters 200] [--reps 3] [--pair xor|half] [--out F.json]
    python tools/probe_fence_load.py --compile-only   # no GPU: cubin for sm_90a, ptxas info
"""
import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

from megak.runtime.compiler import compile_source, compile_report, parse_ptxas_log  # noqa: E402
from probe_ptx import MBARRIER  # noqa: E402  (tools/, the script's own folder)

ENTRY = "fence_load"
PAGE = 16384
MAX_RING = 10
SMEM = 1024 + MAX_RING * PAGE   # dynamic smem, whatever R: > half an SM = one block per SM
THREADS = 64                    # warp 0 streamer, warp 1 measured
INBOX = 1024                    # bytes of data per block (one message)
CHUNK = 16384                   # bytes of stamped words per block (the chunk mechanisms)
CTR_WORDS = 32                  # u32 counters per block: one 128-B line each
DUR_WORDS = 4                   # per iteration: cycles, ns (main figure); cycles, ns (second)
STAT_WORDS = 8                  # per block: see the kernel
NONE = (1 << 64) - 1            # a timed slot never written

# name -> (kernel mech id, row label, label of the second figure or None, hop = round trip / 2)
MECHS = {
    "fence": (0, "fence.release.gpu", "  1 KiB stores + fence.release", False),
    "fence_sc": (1, "fence.sc.gpu", "  1 KiB stores + fence.sc", False),
    "fence_acqrel": (2, "fence.acq_rel.gpu", "  1 KiB stores + fence.acq_rel", False),
    "red_release": (3, "red.release + atom read-back", "atom.relaxed round trip (ref)", False),
    "pingpong_counter": (4, "hop: 1 KiB + fence + counter", None, True),
    "pingpong_flag": (5, "hop: 1 KiB stamped words", None, True),
    "acquire": (6, "ld.relaxed + fence.acquire.gpu", "ld.acquire.gpu", False),
    "chunk8": (7, "A chunk: 8 KiB stamped {bf16 x2, stamp}", "A chunk: 4 KiB cp.async + wait",
               False),
    "chunk16": (8, "A chunk: 16 KiB stamped {f32, stamp}", "A chunk: 4 KiB ld.global.cg v4",
                False),
}
ERRORS = {1: "bad arguments (ring {}, mech {})",
          2: "ring of {} bytes does not fit the {} bytes of dynamic shared memory",
          3: "streamer: a slot's copy did not land by the deadline (slot {}, pages landed {})",
          4: "measured warp: the load did not come up by the deadline (landed {} of {} pages)",
          5: "counter poll passed its deadline (iteration {}, counter {})",
          6: "stamp poll passed its deadline (iteration {}, lanes ready {})",
          7: "data check failed (iteration {}, word seen {:#x})",
          8: "red.release read-back wrong (iteration {}, counter {})",
          9: "atom.relaxed read-back wrong (iteration {}, counter {})",
          10: "counter ran ahead (iteration {}, counter {})"}

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
#define PAGE 16384u
#define MAX_RING 10u
#define INBOX 1024u
#define CHUNK 16384u
#define CTR_WORDS 32u
#define DUR_WORDS 4u
#define STAT_WORDS 8u
#define FULL 0xffffffffu

enum { M_FENCE = 0, M_FENCE_SC = 1, M_FENCE_ACQREL = 2, M_RED_RELEASE = 3, M_PP_COUNTER = 4,
       M_PP_FLAG = 5, M_ACQUIRE = 6, M_CHUNK8 = 7, M_CHUNK16 = 8 };
enum { E_ARGS = 1, E_SMEM = 2, E_STREAM = 3, E_LOAD_UP = 4, E_CTR_POLL = 5, E_FLAG_POLL = 6,
       E_DATA = 7, E_RED = 8, E_ATOM = 9, E_CTR_AHEAD = 10 };

__device__ __forceinline__ u32 sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ u64 gtimer()
{ u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return t; }
/* "memory": the compiler keeps the clock reads where they are among the memory operations. */
__device__ __forceinline__ u64 clk()
{ u64 t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t) :: "memory"); return t; }
__device__ __forceinline__ u32 dyn_smem()
{ u32 n; asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n)); return n; }
__device__ __forceinline__ u32 smid()
{ u32 n; asm volatile("mov.u32 %0, %%smid;" : "=r"(n)); return n; }

""" + MBARRIER + r"""
/* ---- bulk copies (stream.cuh's spelling, with an L2 cache hint) ---------------------- */
__device__ __forceinline__ void bulk_load(u32 dst, const unsigned char* src, u32 bytes, u32 bar,
                                          u64 pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
}

/* ---- gpu-scope memory operations ------------------------------------------------------------ */
template <int K> __device__ __forceinline__ void fence_k();
template <> __device__ __forceinline__ void fence_k<M_FENCE>()
{ asm volatile("fence.release.gpu;" ::: "memory"); }
template <> __device__ __forceinline__ void fence_k<M_FENCE_SC>()
{ asm volatile("fence.sc.gpu;" ::: "memory"); }
template <> __device__ __forceinline__ void fence_k<M_FENCE_ACQREL>()
{ asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void fence_acquire() { asm volatile("fence.acquire.gpu;" ::: "memory"); }

__device__ __forceinline__ void st_v4(u32* p, u32 v)
{ asm volatile("st.global.v4.u32 [%0], {%1, %1, %1, %1};" :: "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ uint4 ld_v4(const u32* p)
{ uint4 v; asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v; }
__device__ __forceinline__ u32 ld_relaxed(const u32* p)
{ u32 v; asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v; }
__device__ __forceinline__ void red_relaxed_add(u32* p, u32 v)
{ asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ void red_release_add(u32* p, u32 v)
{ asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ u32 atom_relaxed_add(u32* p, u32 v)
{ u32 r; asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;"
                      : "=r"(r) : "l"(p), "r"(v) : "memory");
  return r; }
__device__ __forceinline__ u64 ld_flag(const u64* p)
{ u64 w; asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
  return w; }
__device__ __forceinline__ void st_flag(u64* p, u64 w)
{ asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" :: "l"(p), "l"(w) : "memory"); }

/* The first error of a block wins: e[0] = code, e[1], e[2] = details. */
__device__ __forceinline__ void fail(u32* e, u32 code, u32 a, u32 b)
{
    if (atomicCAS(e, 0u, code) == 0u) { e[1] = a; e[2] = b; }
}

struct block_ctl {
    u64 full[MAX_RING];   /* one mbarrier per ring slot */
    u32 landed;           /* pages the streamer has seen land (the measured warp waits on it) */
    u32 stop;             /* set by the measured warp: the streamer stops reissuing */
};

/* ---- the streamer: R bulk copies of 16 KiB always in flight -------------------------------- */
/* Ordering: mbarrier.init -> fence.mbarrier_init (the inits visible to the async proxy) ->
 * the first copy. Slot s is reused only after its phase completed (try_wait by this lane),
 * so a page never has two copies writing it. Nothing reads the pages: the load is the point.
 * Slots are consumed in order 0..R-1, phase flipping on each wrap; once `stop` is seen the lane
 * keeps walking the slots without reissuing until the R copies in flight have landed. A copy
 * that never lands past the deadline cannot be waited for: the lane records the error and
 * leaves (the host raises and the process should not reuse the GPU). */
__device__ void streamer(const unsigned char* src, u64 share, u32 R, block_ctl& ctl,
                         unsigned char* smem, u64 timeout_ns, u32* e, u64* st)
{
    volatile u32* vlanded = &ctl.landed;
    volatile u32* vstop = &ctl.stop;
    const u32 ring = (sa(smem) + 1023u) & ~1023u;   /* 1 KiB aligned pages */
    if (ring - sa(smem) + R * PAGE > dyn_smem()) {
        fail(e, E_SMEM, ring - sa(smem) + R * PAGE, dyn_smem());
        return;
    }
    const u32 bar0 = sa(&ctl.full[0]);
    for (u32 i = 0; i < R; ++i)
        mbar_init(bar0 + 8u * i, 1u);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));

    const unsigned char* base = src + (u64)blockIdx.x * share;
    const u32 npages = (u32)(share / PAGE);
    u32 next = 0;   /* page of the share the next copy reads */
    const u64 t_first = gtimer();
    for (u32 s = 0; s < R; ++s) {
        mbar_expect_tx(bar0 + 8u * s, PAGE);
        bulk_load(ring + s * PAGE, base + (u64)next * PAGE, PAGE, bar0 + 8u * s, pol);
        next = next + 1u == npages ? 0u : next + 1u;
    }
    u32 slot = 0, phase = 0, inflight = R, landed = 0;
    u64 t_last = t_first;
    bool stopping = false;
    while (inflight > 0u) {
        const u32 bar = bar0 + 8u * slot;
        if (!mbar_try(bar, phase)) {
            const u64 deadline = gtimer() + timeout_ns;
            bool ok = false;
            while (!(ok = mbar_try(bar, phase)))
                if (gtimer() > deadline)
                    break;
            if (!ok) {
                fail(e, E_STREAM, slot, landed);
                *vstop = 1u;
                break;
            }
        }
        --inflight;
        t_last = gtimer();
        *vlanded = ++landed;
        if (!stopping && *vstop != 0u)
            stopping = true;
        if (!stopping) {
            mbar_expect_tx(bar, PAGE);
            bulk_load(ring + slot * PAGE, base + (u64)next * PAGE, PAGE, bar, pol);
            next = next + 1u == npages ? 0u : next + 1u;
            ++inflight;
        }
        if (++slot == R) { slot = 0; phase ^= 1u; }
    }
    st[0] = (u64)landed * PAGE;
    st[1] = t_first;
    st[2] = t_last;
}

/* ---- the streamer as cp.async: the same R slots of 16 KiB, copied by warp 0's 32 lanes in
 * 16-B cp.async.cg (LDGSTS) copies, 32 a lane, one commit group per slot (the copies megak's
 * short fp32 tile and its loader issue). The oldest group is retired with wait_group R - 1
 * (each lane's own copies; the __syncwarp after it makes the slot's copies all landed), then
 * the slot is reissued. On `stop` (lane 0 reads it, the warp follows) the lanes wait for every
 * group and leave. wait_group cannot be given a deadline: a copy that never lands hangs the
 * block, as it would hang megak's op. */
template <u32 R>
__device__ void streamer_cpasync_r(const unsigned char* base, u32 npages, u32 ring, u64 pol,
                                   u32 lane, block_ctl& ctl, u64* st)
{
    volatile u32* vlanded = &ctl.landed;
    volatile u32* vstop = &ctl.stop;
    u32 next = 0;
    auto issue = [&](u32 slot) {
        const unsigned char* from = base + (u64)next * PAGE;
        for (u32 j = 0; j < PAGE / (16u * 32u); ++j) {
            const u32 off = 16u * (lane + 32u * j);
            asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;"
                         :: "r"(ring + slot * PAGE + off), "l"(from + off), "l"(pol) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        next = next + 1u == npages ? 0u : next + 1u;
    };
    const u64 t_first = gtimer();
    for (u32 slot = 0; slot < R; ++slot)
        issue(slot);
    u32 slot = 0, landed = 0;
    for (;;) {
        asm volatile("cp.async.wait_group %0;" :: "n"(R - 1) : "memory");
        __syncwarp();
        ++landed;
        u32 stop = 0;
        if (lane == 0u) {
            *vlanded = landed;
            stop = *vstop;
        }
        if (__shfl_sync(0xffffffffu, stop, 0) != 0u)
            break;
        issue(slot);
        slot = slot + 1u == R ? 0u : slot + 1u;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncwarp();
    if (lane == 0u) {
        st[0] = (u64)(landed + R - 1u) * PAGE;
        st[1] = t_first;
        st[2] = gtimer();
    }
}

__device__ void streamer_cpasync(const unsigned char* src, u64 share, u32 R, block_ctl& ctl,
                                 unsigned char* smem, u32 lane, u32* e, u64* st)
{
    const u32 ring = (sa(smem) + 1023u) & ~1023u;
    if (ring - sa(smem) + R * PAGE > dyn_smem()) {
        if (lane == 0u)
            fail(e, E_SMEM, ring - sa(smem) + R * PAGE, dyn_smem());
        return;
    }
    u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    const unsigned char* base = src + (u64)blockIdx.x * share;
    const u32 npages = (u32)(share / PAGE);
    switch (R) {   /* wait_group takes an immediate */
    case 1: streamer_cpasync_r<1>(base, npages, ring, pol, lane, ctl, st); break;
    case 2: streamer_cpasync_r<2>(base, npages, ring, pol, lane, ctl, st); break;
    case 3: streamer_cpasync_r<3>(base, npages, ring, pol, lane, ctl, st); break;
    case 4: streamer_cpasync_r<4>(base, npages, ring, pol, lane, ctl, st); break;
    case 6: streamer_cpasync_r<6>(base, npages, ring, pol, lane, ctl, st); break;
    case 8: streamer_cpasync_r<8>(base, npages, ring, pol, lane, ctl, st); break;
    case 10: streamer_cpasync_r<10>(base, npages, ring, pol, lane, ctl, st); break;
    default: if (lane == 0u) fail(e, E_ARGS, R, 0u); break;
    }
}

/* ---- the measured warp ---------------------------------------------------------------------- */
struct meas {
    u32 lane, warm, iters;
    u64 gap_ns, timeout_ns;
    u32* e;
    u64* dur;   /* this block's [iters][DUR_WORDS] */
    __device__ __forceinline__ void gap() const
    {
        if (gap_ns) {
            const u64 until = gtimer() + gap_ns;
            while (gtimer() < until) { }
        }
    }
    __device__ __forceinline__ void rec(u32 it, u64 c, u64 g, u64 c2, u64 g2) const
    {
        if (it >= warm) {
            u64* d = dur + (u64)(it - warm) * DUR_WORDS;
            d[0] = c; d[1] = g; d[2] = c2; d[3] = g2;
        }
    }
};

/* A warp-uniform flag from lane 0. */
__device__ __forceinline__ bool from_lane0(bool x) { return __shfl_sync(FULL, (u32)x, 0) != 0u; }

/* fence*: 1 KiB of stores, then lane 0 times the fence. The fence waits for the warp's stores
 * (and whatever else the SM has outstanding that it must order): that wait is the figure. */
template <int K>
__device__ void run_fence(const meas& m, u32* area)
{
    u32* mine = area + m.lane * 8u;   /* 32 B per lane */
    for (u32 it = 0; it < m.warm + m.iters; ++it) {
        m.gap();
        const u64 g0 = gtimer();
        const u64 c0 = clk();
        st_v4(mine, it);
        st_v4(mine + 4, it);
        __syncwarp();
        if (m.lane == 0u) {
            const u64 g1 = gtimer();
            const u64 c1 = clk();
            fence_k<K>();
            const u64 c2 = clk();
            const u64 g2 = gtimer();
            m.rec(it, c2 - c1, g2 - g1, c2 - c0, g2 - g0);
        }
        __syncwarp();
    }
}

/* red_release: the release-add and a read-back of the same counter (which the add must have
 * reached: same address, program order), then a plain relaxed atomic round trip. The checks
 * branch on the returned value before the clock is read: the read waits for the result. */
__device__ void run_red(const meas& m, u32* area, u32* ctr)
{
    u32* mine = area + m.lane * 8u;
    bool ok = true;
    for (u32 it = 0; it < m.warm + m.iters && ok; ++it) {
        m.gap();
        st_v4(mine, it);
        st_v4(mine + 4, it);
        __syncwarp();
        if (m.lane == 0u) {
            const u64 g1 = gtimer();
            const u64 c1 = clk();
            red_release_add(ctr + 0, 1u);
            const u32 r = atom_relaxed_add(ctr + 0, 0u);
            if (r != it + 1u) { fail(m.e, E_RED, it, r); ok = false; }
            const u64 c2 = clk();
            const u64 g2 = gtimer();
            const u64 g3 = gtimer();
            const u64 c3 = clk();
            const u32 r2 = atom_relaxed_add(ctr + 1, 1u);
            if (r2 != it) { fail(m.e, E_ATOM, it, r2); ok = false; }
            const u64 c4 = clk();
            const u64 g4 = gtimer();
            m.rec(it, c2 - c1, g2 - g1, c4 - c3, g4 - g3);
        }
        ok = from_lane0(ok);
    }
}

/* acquire: the consumer's side of a counter hop with nothing to wait for. Lane 0 times a
 * relaxed load of its counter followed by fence.acquire.gpu (megak's loader: relaxed polls,
 * then the fence once reached), then, second figure, one ld.acquire.gpu of the same counter.
 * Each checks the value it read before the clock is read (the read waits for it). */
__device__ void run_acquire(const meas& m, u32* ctr)
{
    bool ok = true;
    for (u32 it = 0; it < m.warm + m.iters && ok; ++it) {
        m.gap();
        if (m.lane == 0u) {
            const u64 g1 = gtimer();
            const u64 c1 = clk();
            const u32 r = ld_relaxed(ctr);
            fence_acquire();
            if (r != 0u) { fail(m.e, E_ATOM, it, r); ok = false; }
            const u64 c2 = clk();
            const u64 g2 = gtimer();
            const u64 g3 = gtimer();
            const u64 c3 = clk();
            u32 r2;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(r2) : "l"(ctr) : "memory");
            if (r2 != 0u) { fail(m.e, E_ATOM, it, r2); ok = false; }
            const u64 c4 = clk();
            const u64 g4 = gtimer();
            m.rec(it, c2 - c1, g2 - g1, c4 - c3, g4 - g3);
        }
        ok = from_lane0(ok);
    }
}

/* chunk8 / chunk16: what a compute warp's 4 KiB A chunk (2048 bf16, the streamed GEMM's
 * slice of a stage) costs to read from L2 as stamped words instead of by cp.async after a
 * counter wait. Main figure: every lane loads its WPL words with ld.relaxed.gpu.b64 (8 in
 * flight at a time, coalesced: word 32 j + lane) and checks every stamp (a warp vote before
 * the clock); chunk8: {bf16 x2, stamp} words (1024: 8 KiB), chunk16: {f32, stamp} (2048:
 * 16 KiB). Second figure: the same 4 KiB of bytes as today's A chunk, chunk8 by cp.async.cg
 * (8 x 16 B per lane, commit, wait_all), chunk16 by ld.global.cg.v4 into registers. The
 * words are the partner block's (written by the host: every u32 = 1, so the stamp is 1):
 * L2 hits, as an A chunk just written by other SMs. */
template <int WPL, bool CP_ASYNC>
__device__ void run_chunk(const meas& m, const u64* words, u32 sdst)
{
    const u32 lane = m.lane;
    const unsigned char* bytes = (const unsigned char*)words;
    bool ok = true;
    u32 sink = 0u;
    for (u32 it = 0; it < m.warm + m.iters && ok; ++it) {
        m.gap();
        __syncwarp();
        const u64 g1 = gtimer();
        const u64 c1 = clk();
        u32 bad = 0u;
#pragma unroll 1
        for (int j = 0; j < WPL; j += 8) {
            u64 w[8];
#pragma unroll
            for (int q = 0; q < 8; ++q)
                w[q] = ld_flag(words + (u64)(j + q) * 32u + lane);
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                bad |= (u32)(w[q] >> 32) ^ 1u;
                sink += (u32)w[q];
            }
        }
        ok = __all_sync(FULL, bad == 0u);
        const u64 c2 = clk();
        const u64 g2 = gtimer();
        __syncwarp();
        const u64 g3 = gtimer();
        const u64 c3 = clk();
        if (CP_ASYNC) {
#pragma unroll
            for (u32 q = 0; q < 8u; ++q)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                             :: "r"(sdst + (q * 32u + lane) * 16u),
                                "l"(bytes + (q * 32u + lane) * 16u) : "memory");
            asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory");
            __syncwarp();
        } else {
            uint4 v[8];
#pragma unroll
            for (u32 q = 0; q < 8u; ++q)
                asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(v[q].x), "=r"(v[q].y), "=r"(v[q].z), "=r"(v[q].w)
                             : "l"(bytes + (q * 32u + lane) * 16u) : "memory");
#pragma unroll
            for (u32 q = 0; q < 8u; ++q)
                sink += v[q].x ^ v[q].w;
            ok = __all_sync(FULL, sink != 0xdeadbeefu) && ok;
        }
        const u64 c4 = clk();
        const u64 g4 = gtimer();
        if (lane == 0u)
            m.rec(it, c2 - c1, g2 - g1, c4 - c3, g4 - g3);
        if (!ok && lane == 0u)
            fail(m.e, E_DATA, it, bad);
    }
    if (sink == 0xfeedfaceu && lane == 0u)   /* keeps the loads */
        m.e[3] = sink;
}

/* Ping-pong, counter form. send: the data (weak stores), __syncwarp, lane 0 fence.release.gpu
 * + red.relaxed.gpu on the partner's counter (a release pattern, what megak's signal does).
 * recv: lane 0 polls its counter (relaxed) until it counts this message, fence.acquire.gpu
 * (the acquire pattern), __syncwarp, then every lane reads its 32 B with plain loads (the
 * acquire invalidated L1; the barrier orders the lanes' reads after it) and checks them. */
__device__ __forceinline__ void pp_counter_send(const meas& m, u32* peer_inbox, u32* peer_ctr,
                                                u32 it)
{
    u32* p = peer_inbox + m.lane * 8u;
    st_v4(p, it + 1u);
    st_v4(p + 4, it + 1u);
    __syncwarp();
    if (m.lane == 0u) {
        fence_k<M_FENCE>();
        red_relaxed_add(peer_ctr, 1u);
    }
}
__device__ __forceinline__ bool pp_counter_recv(const meas& m, const u32* my_inbox,
                                                const u32* my_ctr, u32 it)
{
    bool ok = true;
    if (m.lane == 0u) {
        const u32 want = it + 1u;
        u32 v = ld_relaxed(my_ctr);
        if (v < want) {
            const u64 deadline = gtimer() + m.timeout_ns;
            while ((v = ld_relaxed(my_ctr)) < want)
                if (gtimer() > deadline)
                    break;
        }
        if (v < want) { fail(m.e, E_CTR_POLL, it, v); ok = false; }
        else if (v > want) { fail(m.e, E_CTR_AHEAD, it, v); ok = false; }
        fence_acquire();
    }
    if (!from_lane0(ok))   /* includes the warp barrier that orders the reads after the acquire */
        return false;
    const u32* p = my_inbox + m.lane * 8u;
    const uint4 a = ld_v4(p), b = ld_v4(p + 4);
    const u32 w = it + 1u;
    const bool good = a.x == w && a.y == w && a.z == w && a.w == w &&
                      b.x == w && b.y == w && b.z == w && b.w == w;
    const u32 bad = __ballot_sync(FULL, !good);
    if (bad != 0u) {
        if (m.lane == (u32)(__ffs(bad) - 1)) {
            const u32 seen = a.x != w ? a.x : a.y != w ? a.y : a.z != w ? a.z : a.w != w ? a.w :
                             b.x != w ? b.x : b.y != w ? b.y : b.z != w ? b.z : b.w;
            fail(m.e, E_DATA, it, seen);
        }
        return false;
    }
    return true;
}

/* Ping-pong, stamped words: word k of a message = {value(it, k) low, stamp = it + 1 high}, one
 * scalar st.relaxed.gpu.b64 each (single-copy atomic: a poll sees the value with its stamp or
 * the old word). Lane l owns words 4l .. 4l + 3. No fence, no counter. recv: each lane polls
 * its 4 words (ld.relaxed.gpu.b64, served at L2) until all carry the stamp; the warp goes on
 * when every lane's do (vote); then the values are checked. */
__device__ __forceinline__ u32 flag_value(u32 it, u32 k) { return (it + 1u) * 0x9E3779B1u + k; }
__device__ __forceinline__ void pp_flag_send(const meas& m, u64* peer_words, u32 it)
{
    u64* p = peer_words + m.lane * 4u;
    const u64 stamp = (u64)(it + 1u) << 32;
#pragma unroll
    for (u32 k = 0; k < 4u; ++k)
        st_flag(p + k, stamp | flag_value(it, m.lane * 4u + k));
}
__device__ __forceinline__ bool pp_flag_recv(const meas& m, const u64* my_words, u32 it)
{
    const u64* p = my_words + m.lane * 4u;
    const u32 stamp = it + 1u;
    u64 w[4];
#pragma unroll
    for (u32 k = 0; k < 4u; ++k)
        w[k] = ld_flag(p + k);
    bool mine = (u32)(w[0] >> 32) == stamp && (u32)(w[1] >> 32) == stamp &&
                (u32)(w[2] >> 32) == stamp && (u32)(w[3] >> 32) == stamp;
    if (!__all_sync(FULL, mine)) {
        const u64 deadline = gtimer() + m.timeout_ns;
        for (;;) {
#pragma unroll
            for (u32 k = 0; k < 4u; ++k)
                if ((u32)(w[k] >> 32) != stamp)
                    w[k] = ld_flag(p + k);
            mine = (u32)(w[0] >> 32) == stamp && (u32)(w[1] >> 32) == stamp &&
                   (u32)(w[2] >> 32) == stamp && (u32)(w[3] >> 32) == stamp;
            const u32 ready = __ballot_sync(FULL, mine);
            if (ready == FULL)
                break;
            if (from_lane0(gtimer() > deadline)) {
                if (m.lane == 0u)
                    fail(m.e, E_FLAG_POLL, it, __popc(ready));
                return false;
            }
        }
    }
    bool good = true;
    u32 seen = 0;
#pragma unroll
    for (u32 k = 0; k < 4u; ++k)
        if ((u32)w[k] != flag_value(it, m.lane * 4u + k)) { good = false; seen = (u32)w[k]; }
    const u32 bad = __ballot_sync(FULL, !good);
    if (bad != 0u) {
        if (m.lane == (u32)(__ffs(bad) - 1))
            fail(m.e, E_DATA, it, seen);
        return false;
    }
    return true;
}

/* The starter times send + the partner's recv and send + its own recv: a round trip. The
 * final clock read comes after the warp vote that consumes the received data. */
template <bool FLAG>
__device__ void run_pingpong(const meas& m, unsigned char* inbox, u32* ctr, u32 partner)
{
    const bool starter = blockIdx.x < partner;
    unsigned char* my_inbox = inbox + (u64)blockIdx.x * INBOX;
    unsigned char* peer_inbox = inbox + (u64)partner * INBOX;
    u32* my_ctr = ctr + (u64)blockIdx.x * CTR_WORDS + 2u;
    u32* peer_ctr = ctr + (u64)partner * CTR_WORDS + 2u;
    for (u32 it = 0; it < m.warm + m.iters; ++it) {
        u64 g0 = 0, c0 = 0;
        if (starter) {
            m.gap();
            g0 = gtimer();
            c0 = clk();
        }
        else {
            const bool ok = FLAG ? pp_flag_recv(m, (const u64*)my_inbox, it)
                                 : pp_counter_recv(m, (const u32*)my_inbox, my_ctr, it);
            if (!ok)
                return;
        }
        if (FLAG)
            pp_flag_send(m, (u64*)peer_inbox, it);
        else
            pp_counter_send(m, (u32*)peer_inbox, peer_ctr, it);
        if (starter) {
            const bool ok = FLAG ? pp_flag_recv(m, (const u64*)my_inbox, it)
                                 : pp_counter_recv(m, (const u32*)my_inbox, my_ctr, it);
            if (!ok)
                return;
            const u64 c1 = clk();
            const u64 g1 = gtimer();
            if (m.lane == 0u)
                m.rec(it, c1 - c0, g1 - g0, 0ull, 0ull);
        }
    }
}

/* Arguments:
 *   src, share      the streamed buffer; block b streams [b * share, (b + 1) * share)
 *   ring            R pages in flight (0: no load), <= MAX_RING
 *   mech            M_*; warm, iters: untimed and timed iterations
 *   pair_mode       0: partner = b ^ 1; 1: b <-> b + grid / 2 (no partner: the block only streams)
 *   inbox           grid x INBOX bytes (a block's own store area in fence / red modes)
 *   ctr             grid x CTR_WORDS u32: [0] red.release counter, [1] atom counter, [2] the
 *                   ping-pong messages received
 *   dur             grid x iters x DUR_WORDS u64 (host poisons with ~0)
 *   stat            grid x STAT_WORDS u64: [0] bytes streamed, [1] first issue, [2] last landing
 *                   (%globaltimer), [3] %smid, [4] clock64 and [5] %globaltimer at the start of
 *                   the measured loop, [6], [7] the same at its end
 *   err             grid x 4 u32: code, details (first error of the block) */
extern "C" __global__ void __launch_bounds__(64, 1)
fence_load(const unsigned char* src, u64 share, u32 ring, u32 mech, u32 warm, u32 iters,
           u32 pair_mode, u64 gap_ns, u64 timeout_ns, unsigned char* inbox, u32* ctr, u64* dur,
           u64* stat, u32* err, const u64* chunks, u32 cpasync)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ block_ctl ctl;
    u32* e = err + 4u * blockIdx.x;
    u64* st = stat + (u64)STAT_WORDS * blockIdx.x;
    if (threadIdx.x == 0u) {
        ctl.landed = 0u;
        ctl.stop = 0u;
    }
    __syncthreads();
    const u32 warp = threadIdx.x / 32u, lane = threadIdx.x & 31u;
    if (ring > MAX_RING || mech > M_CHUNK16 || iters == 0u || blockDim.x != 64u ||
        (ring > 0u && share < PAGE)) {
        if (threadIdx.x == 0u)
            fail(e, E_ARGS, ring, mech);
        return;
    }
    if (warp == 0u) {
        if (cpasync != 0u && ring > 0u)
            streamer_cpasync(src, share, ring, ctl, smem, lane, e, st);
        else if (lane == 0u && ring > 0u)
            streamer(src, share, ring, ctl, smem, timeout_ns, e, st);
        return;
    }

    /* warp 1: wait for the load to come up (2R pages landed), then measure */
    volatile u32* vlanded = &ctl.landed;
    volatile u32* vstop = &ctl.stop;
    bool up = true;
    if (lane == 0u && ring > 0u) {
        const u64 deadline = gtimer() + timeout_ns;
        while (*vlanded < 2u * ring)
            if (gtimer() > deadline) { up = false; break; }
        if (!up)
            fail(e, E_LOAD_UP, *vlanded, 2u * ring);
    }
    if (!from_lane0(up)) {
        if (lane == 0u)
            *vstop = 1u;
        return;
    }
    meas m;
    m.lane = lane; m.warm = warm; m.iters = iters; m.gap_ns = gap_ns; m.timeout_ns = timeout_ns;
    m.e = e;
    m.dur = dur + (u64)blockIdx.x * iters * DUR_WORDS;
    u32* area = (u32*)(inbox + (u64)blockIdx.x * INBOX);
    u32 partner;
    if (pair_mode == 0u)
        partner = blockIdx.x ^ 1u;
    else {
        const u32 half = gridDim.x / 2u;
        partner = blockIdx.x < half ? blockIdx.x + half : blockIdx.x < 2u * half ? blockIdx.x - half
                                                                              : gridDim.x;
    }
    const u64 cs = clk(), gs = gtimer();
    switch (mech) {
    case M_FENCE: run_fence<M_FENCE>(m, area); break;
    case M_FENCE_SC: run_fence<M_FENCE_SC>(m, area); break;
    case M_FENCE_ACQREL: run_fence<M_FENCE_ACQREL>(m, area); break;
    case M_RED_RELEASE: run_red(m, area, ctr + (u64)blockIdx.x * CTR_WORDS); break;
    case M_PP_COUNTER: if (partner < gridDim.x) run_pingpong<false>(m, inbox, ctr, partner); break;
    case M_ACQUIRE: run_acquire(m, ctr + (u64)blockIdx.x * CTR_WORDS + 4u); break;   /* never written */
    case M_CHUNK8:
    case M_CHUNK16: {
        __shared__ __align__(128) unsigned char chunk_buf[4096];
        const u64* words = chunks + (u64)(partner < gridDim.x ? partner : blockIdx.x) * (CHUNK / 8u);
        const u32 sdst = (u32)__cvta_generic_to_shared(chunk_buf);
        if (mech == M_CHUNK8)
            run_chunk<32, true>(m, words, sdst);
        else
            run_chunk<64, false>(m, words, sdst);
        break;
    }
    default: if (partner < gridDim.x) run_pingpong<true>(m, inbox, ctr, partner); break;
    }
    __syncwarp();
    const u64 ce = clk(), ge = gtimer();
    if (lane == 0u) {
        *vstop = 1u;   /* always, error or not: the streamer drains and leaves */
        st[3] = smid();
        st[4] = cs; st[5] = gs; st[6] = ce; st[7] = ge;
    }
}
"""


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_fence_load.cu")


def compile_only(arch):
    t0 = time.perf_counter()
    compiled = compile_probe(arch)
    lines, bad = compile_report(compiled, (ENTRY,), time.perf_counter() - t0)
    print("\n".join(lines))
    if bad:
        print("FAIL: " + "; ".join(bad))
        return 1
    print(f"OK: {ENTRY} compiled, 0 spills")
    return 0


def parse_list(text, what, known=None):
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise SystemExit(f"--{what}: empty list")
    if known is not None:
        unknown = [x for x in items if x not in known]
        if unknown:
            raise SystemExit(f"--{what}: unknown {unknown}; known: {', '.join(known)}")
    return items


def run(args):
    import numpy as np
    from cuda.core import Device, ObjectCode

    from megak.runtime import memory as mem
    from megak.runtime.driver import _bindings, check, device_info

    t_start = time.perf_counter()
    mechs = parse_list(args.mech, "mech", MECHS)
    try:
        rings = [int(x) for x in parse_list(args.ring, "ring")]
    except ValueError:
        raise SystemExit("--ring: a comma list of integers") from None
    if any(r < 0 or r > MAX_RING for r in rings):
        raise SystemExit(f"--ring: every R in 0..{MAX_RING}")
    if args.copies == "cpasync" and not set(rings) <= {0, 1, 2, 3, 4, 6, 8, 10}:
        raise SystemExit("--copies cpasync: every R in 0-4, 6, 8, 10")

    drv = _bindings()
    dev = Device(0)
    dev.set_current()
    info = device_info(0)
    n_sm = info["sm_count"]
    if info["compute_capability"] < (9, 0):
        raise SystemExit(f"{info['name']}: bulk copies and fence.release/acquire need sm_90")
    if not info["cooperative_launch"]:
        raise SystemExit(f"{info['name']}: no cooperative launch")
    grid = args.sms or n_sm
    if not 2 <= grid <= n_sm:
        raise SystemExit(f"--sms: 2..{n_sm}")

    compiled = compile_probe(info["arch"])
    regs = parse_ptxas_log(compiled.log, ENTRY)
    code = ObjectCode.from_cubin(compiled.cubin)
    fn = check(drv.cuKernelGetFunction(code.get_kernel(ENTRY).handle), "cuKernelGetFunction")
    check(drv.cuFuncSetAttribute(
        fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM),
        "cuFuncSetAttribute")
    per_sm = check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, THREADS, SMEM),
                   "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    if per_sm < 1:
        raise SystemExit(f"a block of {THREADS} threads with {SMEM} B of dynamic smem does not fit")
    if per_sm > 1:
        print(f"note: {per_sm} blocks fit per SM; one per SM is then not forced by smem",
              flush=True)

    m = mem.Memory(0)
    stream = dev.create_stream()
    h = stream.handle
    hung = []   # set when a launch outlived its host-side limit: nothing may wait on it then
    try:
        src_bytes = int(args.src_gib * (1 << 30))
        share = src_bytes // grid // PAGE * PAGE
        if share < PAGE:
            raise SystemExit("--src-gib too small for one page per block")
        iters, warm = args.iters, args.warmup
        src = m.device(share * grid, "streamed source")
        inbox = m.device(grid * INBOX, "inboxes")
        chunks = m.device(grid * CHUNK, "stamped chunks")
        mem.memset32(chunks.ptr, 1, grid * CHUNK // 4, h)   # every u32 = 1: stamp 1
        ctr = m.device(grid * CTR_WORDS * 4, "counters")
        dur_bytes = grid * iters * DUR_WORDS * 8
        dur = m.device(dur_bytes, "durations")
        stat = m.device(grid * STAT_WORDS * 8, "block stats")
        err = m.device(grid * 16, "errors")
        host = m.pinned(max(dur_bytes, grid * STAT_WORDS * 8, grid * 16), "readback")
        mem.memset32(src.ptr, 0, share * grid // 4, h)
        check(drv.cuStreamSynchronize(h), "sync")

        def readback(buf, nbytes, dtype, shape):
            mem.dtoh(host.ptr, buf.ptr, nbytes, h)
            check(drv.cuStreamSynchronize(h), "sync")
            return host.array(dtype, shape).copy()

        def wait(what, limit_s):
            """cuStreamQuery until done: a kernel that hangs despite its deadlines raises
            here instead of blocking the script."""
            t0 = time.perf_counter()
            not_ready = int(drv.CUresult.CUDA_ERROR_NOT_READY)
            while True:
                ret = drv.cuStreamQuery(h)
                e = ret[0] if isinstance(ret, tuple) else ret
                if int(e) == 0:
                    return
                if int(e) != not_ready:
                    check(ret, what)
                if time.perf_counter() - t0 > limit_s:
                    hung.append(what)
                    raise RuntimeError(f"{what}: still running after {limit_s:.0f} s (the "
                                       "kernel's deadlines should have ended it)")
                time.sleep(0.0005)

        def launch(name, R):
            mech_id = MECHS[name][0]
            mem.memset32(inbox.ptr, 0, grid * INBOX // 4, h)
            mem.memset32(ctr.ptr, 0, grid * CTR_WORDS, h)
            mem.memset32(dur.ptr, 0xFFFFFFFF, dur_bytes // 4, h)
            mem.memset32(stat.ptr, 0, grid * STAT_WORDS * 2, h)
            mem.memset32(err.ptr, 0, grid * 4, h)
            vals = [ctypes.c_uint64(src.ptr), ctypes.c_uint64(share), ctypes.c_uint32(R),
                    ctypes.c_uint32(mech_id), ctypes.c_uint32(warm), ctypes.c_uint32(iters),
                    ctypes.c_uint32(1 if args.pair == "half" else 0),
                    ctypes.c_uint64(args.gap_ns), ctypes.c_uint64(int(args.timeout_ms * 1e6)),
                    ctypes.c_uint64(inbox.ptr), ctypes.c_uint64(ctr.ptr),
                    ctypes.c_uint64(dur.ptr), ctypes.c_uint64(stat.ptr), ctypes.c_uint64(err.ptr),
                    ctypes.c_uint64(chunks.ptr),
                    ctypes.c_uint32(1 if args.copies == "cpasync" else 0)]
            argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            check(drv.cuLaunchCooperativeKernel(fn, grid, 1, 1, THREADS, 1, 1, SMEM, h,
                                                ctypes.addressof(argv)),
                  "cuLaunchCooperativeKernel")
            wait(f"{ENTRY} {name} R={R}", 30.0)
            e = readback(err, grid * 16, np.uint32, (grid, 4))
            bad = np.nonzero(e[:, 0])[0]
            if bad.size:
                msgs = []
                for b in bad[:6]:
                    c = int(e[b, 0])
                    what = ERRORS.get(c, "unknown error {} {}").format(int(e[b, 1]), int(e[b, 2]))
                    msgs.append(f"block {b}: error {c}: {what}")
                raise RuntimeError(f"{name} R={R}: {bad.size} block(s) failed: "
                                   + "; ".join(msgs))
            d = readback(dur, dur_bytes, np.uint64, (grid, iters, DUR_WORDS))
            s = readback(stat, grid * STAT_WORDS * 8, np.uint64, (grid, STAT_WORDS))
            return d, s

        # which blocks time something in each mechanism
        if args.pair == "half":
            half = grid // 2
            partner = [b + half if b < half else b - half if b < 2 * half else grid
                       for b in range(grid)]
        else:
            partner = [b ^ 1 for b in range(grid)]
        starters = [b for b in range(grid) if partner[b] < grid and b < partner[b]]

        print(f"{info['name']}: {n_sm} SMs, grid {grid} x {THREADS} threads (cooperative), "
              f"dynamic smem {SMEM} B; {ENTRY}: {regs['registers']} registers, "
              f"{regs['spill_stores'] + regs['spill_loads']} B spills", flush=True)
        print(f"streamed source {share * grid / (1 << 30):.2f} GiB ({share >> 20} MiB per "
              f"block), 16 KiB "
              f"{'slots of 16-B cp.async copies (warp 0)' if args.copies == 'cpasync' else 'bulk copies'}"
              f", evict_first; {warm} warm-up + {iters} timed "
              f"iterations x {args.reps} launches per cell; gap {args.gap_ns} ns; pairs "
              f"{'b <-> b + grid/2' if args.pair == 'half' else 'b <-> b ^ 1'} "
              f"({len(starters)} pairs)", flush=True)

        # one untimed launch: module load, first-touch of everything
        launch("fence", rings[-1])

        cells = {}     # (mech, R) -> dict of sample arrays
        rates = {}     # R -> [TB/s per launch]
        ghz = {}       # R -> [per-block clock GHz]
        smid_dup = set()
        skipped = []
        for R in rings:
            for name in mechs:
                if time.perf_counter() - t_start > args.time_limit:
                    skipped.append(f"{name} R={R}")
                    continue
                hop = MECHS[name][3]
                blocks = starters if hop else list(range(grid))
                acc = {"c": [], "g": [], "c2": [], "g2": []}
                for _ in range(args.reps):
                    d, s = launch(name, R)
                    sm = s[:, 3].astype(np.int64)
                    if len(set(sm.tolist())) != grid:
                        smid_dup.add((name, R))
                    part = d[blocks]
                    if (part[:, :, 0] == NONE).any() or (part[:, :, 1] == NONE).any():
                        raise RuntimeError(f"{name} R={R}: timed slots never written "
                                           "(a block left its loop early without an error)")
                    # each SM's clock rate over its timed loop: cycles per ns
                    rate = (s[:, 6] - s[:, 4]).astype(np.float64) / np.maximum(
                        (s[:, 7] - s[:, 5]).astype(np.float64), 1.0)
                    ghz.setdefault(R, []).extend(rate[blocks].tolist())
                    scale = 0.5 if hop else 1.0
                    cyc_ns = part[:, :, 0].astype(np.float64) / rate[blocks, None] * scale
                    acc["c"].append(cyc_ns.ravel())
                    acc["g"].append(part[:, :, 1].astype(np.float64).ravel() * scale)
                    if MECHS[name][2]:
                        acc["c2"].append((part[:, :, 2].astype(np.float64) /
                                          rate[blocks, None]).ravel())
                        acc["g2"].append(part[:, :, 3].astype(np.float64).ravel())
                    if R > 0:
                        t0, t1 = int(s[:, 1].min()), int(s[:, 2].max())
                        rates.setdefault(R, []).append(float(s[:, 0].sum()) / max(t1 - t0, 1)
                                                       / 1e3)
                cells[(name, R)] = {k: np.concatenate(v) for k, v in acc.items() if v}
                c = cells[(name, R)]["c"]
                tbps = (f", stream {np.median(rates[R][-args.reps:]):.2f} TB/s" if R in rates
                        else "")
                print(f"  {name:<17} R={R:<2}: median {np.median(c):8.0f} ns  p90 "
                      f"{np.percentile(c, 90):8.0f} ns  ({c.size} samples{tbps})", flush=True)

        # ---- the tables ------------------------------------------------------------------
        def cell(name, R, key):
            x = cells.get((name, R), {}).get(key)
            if x is None or x.size == 0:
                return None
            return float(np.median(x)), float(np.percentile(x, 90)), int(x.size)

        rows = []
        for name in mechs:
            _, label, label2, _ = MECHS[name]
            rows.append((label, name, "c", "g"))
            if label2:
                rows.append((label2, name, "c2", "g2"))
        w0, w = 34, 17

        def table(title, ckey_index):
            print(title)
            print(f"{'mechanism':<{w0}}" + "".join(
                f"{('R=' + str(R) + (' (no load)' if R == 0 else '')):>{w}}" for R in rings))
            for label, name, kc, kg in rows:
                key = (kc, kg)[ckey_index]
                line = f"{label:<{w0}}"
                for R in rings:
                    v = cell(name, R, key)
                    line += f"{'-':>{w}}" if v is None else f"{f'{v[0]:.0f} ({v[1]:.0f})':>{w}}"
                print(line)
            line = f"{'stream TB/s (median of launches)':<{w0}}"
            for R in rings:
                line += (f"{'-':>{w}}" if R not in rates else
                         f"{np.median(rates[R]):>{w}.2f}")
            print(line, flush=True)

        print()
        table("ns, median (p90) over blocks x iterations x launches; from clock64, each SM's "
              "cycles converted with its own clock rate; hop rows = round trip / 2", 0)
        print("SM clock GHz (median over blocks): " + ", ".join(
            f"R={R} {np.median(ghz[R]):.3f}" for R in rings if R in ghz))
        print()
        table("the same from %globaltimer alone (coarse: 32 ns steps on H100/H200; includes "
              "the clock reads)", 1)
        steps = np.concatenate([v["g"] for v in cells.values()]) if cells else np.array([])
        steps = steps[steps > 0]
        if steps.size:
            print(f"smallest non-zero %globaltimer interval seen: {steps.min():.0f} ns")
        if smid_dup:
            print("WARNING: two blocks shared an SM in " + ", ".join(
                f"{n} R={R}" for n, R in sorted(smid_dup)) + ": the per-SM load is not what "
                "the table says")
        if skipped:
            print(f"time limit ({args.time_limit:.0f} s) reached: skipped " + ", ".join(skipped))
        print(f"[{time.perf_counter() - t_start:.1f} s]", flush=True)

        if args.out:
            out = {"device": info["name"], "sm_count": n_sm, "grid": grid, "threads": THREADS,
                   "smem": SMEM, "ptxas": regs, "iters": iters, "warmup": warm,
                   "reps": args.reps, "gap_ns": args.gap_ns, "pair": args.pair,
                   "copies": args.copies,
                   "share_bytes": share, "rings": rings, "mechs": mechs,
                   "units": "ns; hop rows = round trip / 2",
                   "cells": {f"{name} R={R}": {
                       k: dict(zip(("median", "p90", "n"), cell(name, R, k)))
                       for k in ("c", "g", "c2", "g2") if cell(name, R, k)}
                       for (name, R) in cells},
                   "keys": {"c": "clock64 -> ns (main figure)", "g": "%globaltimer ns",
                            "c2": "second figure, clock64 -> ns", "g2": "second figure, ns"},
                   "labels": {n: [MECHS[n][1], MECHS[n][2]] for n in mechs},
                   "stream_tbps": {str(R): v for R, v in rates.items()},
                   "sm_clock_ghz_median": {str(R): float(np.median(v)) for R, v in ghz.items()},
                   "smid_shared": sorted(f"{n} R={R}" for n, R in smid_dup),
                   "skipped": skipped}
            Path(args.out).write_text(json.dumps(out, indent=1))
            print(f"wrote {args.out}", flush=True)
    finally:
        if hung:   # a sync or a free would block on the stuck kernel: leave it to process exit
            m.abandon()
        else:
            check(drv.cuStreamSynchronize(h), "sync")
            stream.close()
            m.close()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compile-only", action="store_true",
                   help="compile for --arch with NVRTC (no GPU), print ptxas info, exit")
    p.add_argument("--arch", default="sm_90a", help="arch of --compile-only (default sm_90a)")
    p.add_argument("--sms", type=int, default=0, help="blocks = SMs used (default: all)")
    p.add_argument("--ring", default="0,2,4,10",
                   help=f"comma list of R, pages of 16 KiB in flight per SM (0 = no load, "
                        f"max {MAX_RING}; default 0,2,4,10)")
    p.add_argument("--mech", default=",".join(MECHS),
                   help="comma list of " + ", ".join(MECHS) + " (default all)")
    p.add_argument("--iters", type=int, default=200, help="timed iterations (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed iterations first (default 20)")
    p.add_argument("--reps", type=int, default=3, help="launches per cell, pooled (default 3)")
    p.add_argument("--gap-ns", type=int, default=1000,
                   help="idle time before each iteration (default 1000 ns)")
    p.add_argument("--pair", choices=("xor", "half"), default="xor",
                   help="ping-pong partners: b <-> b ^ 1 (default) or b <-> b + grid / 2")
    p.add_argument("--src-gib", type=float, default=1.0, help="streamed buffer (default 1 GiB)")
    p.add_argument("--timeout-ms", type=float, default=200.0,
                   help="deadline of every device spin (default 200 ms)")
    p.add_argument("--time-limit", type=float, default=150.0,
                   help="skip the remaining cells after this many seconds (default 150)")
    p.add_argument("--copies", choices=("bulk", "cpasync"), default="bulk",
                   help="the streamer's copies: one lane's 16 KiB bulk copies (default), or "
                        "warp 0's 16-B cp.async copies, one commit group a slot (R in 1-4, 6, "
                        "8, 10)")
    p.add_argument("--out", default="", help="JSON of every median / p90 (default: none)")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.reps < 1:
        p.error("--iters and --reps must be >= 1, --warmup >= 0")
    if args.compile_only:
        return compile_only(args.arch)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
