#!/usr/bin/env python3
"""Probe: does multicasting each weight page to a cluster of 2 make the batch-64 chain stream
faster, before megak launches clusters?

W2-4096x8-bf16-b64 (8 layers of y = x @ W, x 64 x 4096 bf16, W 4096 x 4096 bf16, 268 MB of
weights) runs at ~149 us on the H200 against a target of <= 80 us; ncu counts 930 MB of
L2-to-SM reads a chain, 1.9x torch's per layer: each 64-column band of W is computed by two SMs (32 rows of x each), and each streams the
band's whole B (512 KiB a layer) and its own 32 rows of A (256 KiB a layer) through its own
ring of pages. The question: with the two SMs of a band one cluster of 2 and every B page
fetched ONCE by `cp.async.bulk ... .multicast::cluster` into both CTAs' shared memory, how fast
does the same pattern stream? Nothing else changes between the variants.

Kernel (one entry per variant): grid = the SM count rounded down to even, one block of 288
threads per SM (all the opt-in dynamic shared memory, whatever the ring), launched by
cuLaunchKernelEx with CLUSTER_DIMENSION (2, 1, 1) and COOPERATIVE for every variant. Cluster c
takes column band c (on the H200 clusters 64 and 65 have no band and do no work), CTA rank r
rows 32r .. 32r + 31. A band is K / 128 stages a layer; a ring slot holds a stage: a 16 KiB B
page (128 k-rows x 64 columns) and beside it an 8 KiB A half-page (the CTA's 32 rows x the
stage's 128 k): 24 KiB, 9 slots in 227 KB. Both buffers are pre-tiled on the host, each page
contiguous (the probe is about bytes, not layout), with a 16-byte chunk XOR swizzle that keeps
ldmatrix free of bank conflicts. The same A (64 x K, L2-resident) serves every layer, so
out = A @ (sum over layers of W_l).

  warp 8, lane 0  the producer: per stage waits on the slot's `empty` mbarrier, publishes the
                  stage in the slot's `issued` word (megak's ring_issued: see wait_stage),
                  arrives on `full` with expect_tx (B + A bytes), and issues
                    own:   its own B copy (16 KiB) and its own A copy (8 KiB)
                    mcast: its own A copy; the B copy once per cluster, by rank = stage parity,
                           with .multicast::cluster, ctaMask 0b11: it lands at the same offset
                           in both CTAs and completes on the `full` barrier at the same offset
  warps 0-7       consumers: warp w takes stages w, w + 8, ...; waits for `issued`, then on
                  `full`, ldmatrix the A half-page and the B page, 2 x 8 x 8 mma.sync.m16n8k16
                  (the band's 32 x 64 outputs over the stage's 128 k) into fp32 registers,
                  then hands the slot back: an arrival on its own `empty` (own: count 1), in
                  mcast also one on the peer CTA's (count 2: a multicast refills a slot only
                  once both CTAs read it). At the end the warps' sums go through shared memory
                  to the CTA's 32 x 64 outputs.
  -noA            the same without A (B bytes only; the MMAs take a constant A of ones).
  mcast-strict    mcast with the remote hand-back release.cluster instead of release.cta:
                  ptxas puts a MEMBAR.ALL.GPU before each one ("Ordering" in the source).
  <variant>+deps  (variants with A; --deps adds one after each) the layers chained as megak's
                  are: layer l + 1's A is layer l's output. A's values stay the same (the
                  check holds), its AVAILABILITY is modelled: a per-layer counter in global
                  memory, to which each CTA with work adds one (red.release.gpu) once all its
                  consumer warps are done with layer l; the producer issues layer l + 1's
                  first A copy only once the counter reaches the CTAs with work (128 on the
                  H200; polled with ld.relaxed.gpu as megak's loader does, then
                  fence.acquire.gpu and fence.proxy.async.global). B never waits: the
                  producer's B cursor keeps filling free slots across the layer boundary while
                  its A cursor waits ("Layer dependencies" in the source). A timing model:
                  the real chain would also write each CTA's 32 x 64 outputs of layer l before
                  signalling, which is left out. The counters are zeroed once and only grow:
                  run e waits for e * 2 * bands (no memset between runs).
  <variant>+deps-relaxed  (own, mcast) +deps with no fence: the layer's signal a relaxed add
                  and no acquire or proxy fence after the poll (the probe writes no outputs
                  and A is never written, so nothing needs ordering); the difference to +deps
                  is what the fences cost, which wait for every bulk copy the SM has in
                  flight (tools/probe_fence_load.py).
  own+deps-pf, own+deps-relaxed-pf  those two (own only) with the boundary's HBM kept busy
                  past the ring: while A waits for its layer and the ring stands full, the
                  producer asks L2 for the next PF_STAGES (8) stages of B
                  (cp.async.bulk.prefetch.L2), so their copies into the ring hit L2.

Each variant: output poisoned (NaN), one checked run against numpy (exact: values are
multiples of 1/64 in [-1, 1]; tolerance 1e-3 of sum |a||w|), then --reps timed runs (CUDA
events per launch), median. Columns: us per chain; weight bytes / time (TB/s); the L2-to-SM
bytes the variant implies (own: B twice + A; mcast: B once + A, a multicast counted once) and
that rate. Every spin has a %globaltimer deadline (1 s): on timeout the thread writes an error
record (code, block, stage, slot) and leaves its loop; every thread still reaches the final
cluster barrier (all waits are bounded), and the host raises with the record. Without +deps
the layers do not wait on each other: those rows measure streaming, not the chain's
dependencies; the noA rows show what A adds, the +deps rows (column +deps: us over the same
variant without) what the layer boundaries cost such a stream.

Result (H200, 2026-12-04, two runs, benchmarks/results/clusters/): own 89.0 / 89.3 us, mcast
79.1 / 79.5 (1.12x), own-noA 71.8 / 70.9, mcast-noA 71.4 / 71.2, mcast-strict 95.4 / 95.8. The
pattern's bytes stream in 89 us where megak's chain takes ~149: B alone is at HBM's pace
(3.8 TB/s) either way, A costs 18 us own and 8 us multicast, and L2 serves 805 MB at 9 TB/s.
So clusters would take ~10 us off batch 64; the rest of its 149 is the chain's own (layer
boundaries, the k loop's waits, the tail), not the bytes an SM takes. With the layers'
dependencies (--deps, one run): own+deps 119.8 us (+30.6 over own's 89.2), mcast+deps 115.1
(+35.3 over 79.8): a whole-layer counter costs this stream ~4 us a layer and multicast keeps
only 4.7 us of its gain, so batch 64's <= 80 us is out of this stream's reach once each
layer's A waits for the whole layer before it (every band of a layer ends at about the same
time, so a finer wait would not take much of those 30 us back: the ring, full at the
boundary, is what limits the stream there). Not the signal's fence: +deps-relaxed (two runs)
118.9 / 119.0 us own, 112.5 / 112.7 mcast. Nor HBM idle past the ring: the L2 prefetch at each
boundary made it slower (own+deps-pf 122.7 / 123.1, own+deps-relaxed-pf 120.6 / 120.8 against
119.3 / 119.5 and 118.3 / 118.9 in the same two runs). --marks (own+deps, two runs): the
last CTA's end waited for 0.38-0.42 us, its end to the producer seeing it 1.34-1.44, then the
next layer's first stage landed 0.45-0.48, its first refill issued 0.96-0.99 later: 3.2-3.3 us
a boundary, the ring held by B pages that wait for their A.

--marks: after the timed runs, one run of each +deps variant stamps its layer boundaries
(%globaltimer per CTA and layer: the CTA's end of a layer, the producer seeing the layer done
everywhere, the first stage of the next landed, its first stage past the ring issued) and the
medians of the steps between are printed (boundary_steps).

    python tools/probe_cluster_stream.py [--layers 8] [--k 4096] [--n 4096] [--ring N]
                                         [--reps 20] [--variants own,mcast,...] [--deps]
                                         [--marks] [--json PATH]
    python tools/probe_cluster_stream.py --compile-only   # no GPU: cubin for sm_90a, ptxas info
    python tools/probe_cluster_stream.py --self-check     # no GPU: tiling, reference, config
"""
import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

from megak.runtime.compiler import compile_report, compile_source  # noqa: E402
from probe_ptx import BULK_PRELUDE, kernel_functions, open_gpu  # noqa: E402  (tools/)

NAME = "cluster_stream"
THREADS = 288                     # 8 consumer warps + the producer warp
STAGE_K = 128                     # k-rows of a stage
BAND_N = 64                       # columns of a band
ROWS = 32                         # rows of A per CTA
B_BYTES = STAGE_K * BAND_N * 2    # 16 KiB
A_BYTES = ROWS * STAGE_K * 2      # 8 KiB
MAX_RING = 16
MAX_LAYERS = 128                  # +deps: a shared word per layer at DONE_OFF
DONE_OFF = 512                    # after full[], empty[] (8 B each), issued[] (4 B each)
RING_OFF = 1024 + ROWS * BAND_N * 4   # barriers, issued, done words (1 KiB), fp32 reduce (8 KiB)
ALIGN_SLACK = 128
H200_SMEM_OPTIN = 232448          # --self-check's stand-in for the device's opt-in limit
# name -> (multicast, with A, cluster-scope release on the hand-back)
VARIANTS = {"own": (False, True, False), "mcast": (True, True, False),
            "own-noA": (False, False, False), "mcast-noA": (True, False, False),
            "mcast-strict": (True, True, True)}
DEPS = "+deps"   # a variant with A, its layers chained: "own+deps" (see "Layer dependencies")
RELAXED = "+deps-relaxed"   # the same with the layer's signal relaxed: what its fence costs
PREFETCH = "-pf"            # +deps(-relaxed)-pf (own): B past the ring prefetched into L2
PF_STAGES = 8               #   at a boundary, this many stages
MARKS = ("done", "seen", "landed", "refill")   # --marks: a boundary's steps (see mark())
# suffix -> the kernel's DEPS form (0: layers independent, 1: release signal, 2: relaxed,
# 3 and 4: those with the prefetch)
DEPS_FORMS = {DEPS: 1, RELAXED: 2, DEPS + PREFETCH: 3, RELAXED + PREFETCH: 4}
ALL_VARIANTS = (tuple(VARIANTS) + tuple(v + DEPS for v, (_, a, _) in VARIANTS.items() if a)
                + tuple(v + RELAXED for v, (_, a, strict) in VARIANTS.items() if a and not strict)
                + ("own" + DEPS + PREFETCH, "own" + RELAXED + PREFETCH))
ERRORS = {1: "bad arguments (ring {}, stages {})",
          2: "a ring of {} bytes does not fit the {} bytes of dynamic shared memory",
          3: "not launched as clusters of 2 (cluster size {}, rank {})",
          4: "a consumer's wait for stage {} (slot {}) passed its deadline",
          5: "the producer's wait on `empty` passed its deadline at stage {} (slot {})",
          6: "the producer's wait for layer {}'s A passed its deadline (the counter of the "
             "layer before read {})"}


def split(variant: str):
    """'own+deps' -> ('own', 1); 'own+deps-relaxed' -> ('own', 2); 'own' -> ('own', 0)."""
    for suffix, form in DEPS_FORMS.items():
        if variant.endswith(suffix):
            return variant[:-len(suffix)], form
    return variant, 0


def entry(variant: str) -> str:
    return f"{NAME}_{variant.replace('-', '_').replace('+', '_').lower()}"


ENTRIES = tuple(entry(v) for v in ALL_VARIANTS)

SOURCE = BULK_PRELUDE + f"""
#define THREADS {THREADS}u
#define CONSUMERS {THREADS // 32 - 1}u
#define B_BYTES {B_BYTES}u
#define A_BYTES {A_BYTES}u
#define MAX_RING {MAX_RING}u
#define MAX_LAYERS {MAX_LAYERS}u
#define PF_STAGES {PF_STAGES}u
#define NMARK {len(MARKS)}u
#define DONE_OFF {DONE_OFF}u
#define RED_OFF 1024u
#define RING_OFF {RING_OFF}u
""" + r"""
enum { E_ARGS = 1, E_FIT = 2, E_CLUSTER = 3, E_FULL = 4, E_EMPTY = 5, E_DEP = 6 };

#define SPECIAL(fn, reg) __device__ __forceinline__ u32 fn() \
    { u32 v; asm volatile("mov.u32 %0, %%" reg ";" : "=r"(v)); return v; }
SPECIAL(cta_rank, "cluster_ctarank") SPECIAL(cluster_ctas, "cluster_nctarank")
SPECIAL(cluster_index, "clusterid.x") SPECIAL(dyn_smem, "dynamic_smem_size")

/* First error wins: err[0] = code, err[1] = block, err[2], err[3] = details. */
__device__ __forceinline__ void fail(u32* err, u32 code, u32 a, u32 b)
{
    if (atomicCAS(err, 0u, code) == 0u) { err[1] = blockIdx.x; err[2] = a; err[3] = b; }
}

/* All threads of both CTAs: release what came before, acquire the peer's. */
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

/* The producer's wait on `empty` in a cluster, whose phase also completes through the peer
 * CTA's arrivals: cluster-scope acquire (ptxas adds a CCTL.IVALL after it, on this lane only). */
__device__ __forceinline__ bool mbar_try_cluster(u32 bar, u32 par)
{
    u32 ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;"
                 " selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(par) : "memory");
    return ok != 0u;
}

template <bool CLUSTER>
__device__ __forceinline__ bool wait_phase(u32 bar, u32 par, u64 timeout_ns)
{
    if (CLUSTER ? mbar_try_cluster(bar, par) : mbar_try(bar, par))
        return true;
    const u64 deadline = now() + timeout_ns;
    while (!(CLUSTER ? mbar_try_cluster(bar, par) : mbar_try(bar, par)))
        if (now() > deadline)
            return false;
    return true;
}

/* +deps: one look at a phase, without the suspension try_wait may take (the deps producer
 * polls two things at once and must not sleep on one). Same scopes as wait_phase. */
template <bool CLUSTER>
__device__ __forceinline__ bool mbar_test(u32 bar, u32 par)
{
    u32 ok;
    if (CLUSTER)
        asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;"
                     " selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(par) : "memory");
    else
        asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;"
                     " selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(par) : "memory");
    return ok != 0u;
}

/* +deps: the per-layer counters in global memory (megak's sync.cuh spellings: a relaxed poll,
 * then fence.acquire.gpu once it saw the target, is an acquire pattern, the same as a last
 * ld.acquire; on sm_90 that appends CCTL.IVALL, which waits for the load: polling with
 * ld.acquire would stall the producer's B step on every look). */
__device__ __forceinline__ u32 ld_relaxed_gpu(const u32* p)
{ u32 v; asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void red_release_gpu(u32* p)
{ asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(p) : "memory"); }

/* issued[slot]: the stage the producer last issued into the slot (megak's ring_issued, with
 * its atomics: release exchange, acquire reads). */
__device__ __forceinline__ void issued_publish(u32 at, u32 pos)
{ u32 old; asm volatile("atom.release.cta.shared::cta.exch.b32 %0, [%1], %2;" : "=r"(old) : "r"(at), "r"(pos) : "memory"); }
__device__ __forceinline__ u32 issued_read(u32 at)
{ u32 v; asm volatile("atom.acquire.cta.shared::cta.or.b32 %0, [%1], 0;" : "=r"(v) : "r"(at) : "memory"); return v; }

/* A consumer warp's wait for stage pos in `slot`, all 32 lanes converged; false past the
 * deadline. A parity wait tells apart only the phase it waits for and the one before, and
 * the warp did not read pos - ring (another warp did), so lane 0 first waits for
 * issued[slot] == pos: then pos - ring was read, hence landed, and pos + ring cannot be
 * issued before this warp's arrival, so the slot's full phase is pos's or the one before.
 * The warp barrier orders lane 0's acquire before every lane's parity wait, which is each
 * lane's own acquire of the page's bytes. */
__device__ __forceinline__ bool wait_stage(u32 issued_at, u32 full, u32 pos, u32 par, u32 lane,
                                           u64 timeout_ns)
{
    u64 deadline = 0;
    while (__shfl_sync(~0u, lane == 0 ? issued_read(issued_at) : 0u, 0) != pos) {
        if (deadline == 0)
            deadline = now() + timeout_ns;
        if (__shfl_sync(~0u, lane == 0 && now() > deadline ? 1u : 0u, 0) != 0u)
            return false;
    }
    __syncwarp();
    return __all_sync(~0u, wait_phase<false>(full, par, timeout_ns));
}

/* The same shared offset in CTA `rank` of the cluster (a shared::cluster address). */
__device__ __forceinline__ u32 peer_addr(u32 local, u32 rank)
{ u32 r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank)); return r; }

/* An arrival on the peer CTA's mbarrier. STRICT: release.cluster, which ptxas (sm_90a) turns
 * into MEMBAR.ALL.GPU + ERRBAR + CGAERRBAR before the arrival; otherwise release.cta: the
 * arrival alone (see "Ordering" below for why that suffices here). */
template <bool STRICT>
__device__ __forceinline__ void mbar_arrive_remote(u32 bar)
{
    if (STRICT)
        asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(bar) : "memory");
    else
        asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" :: "r"(bar) : "memory");
}

/* The generic pointer of a shared address of this CTA (bulk_load takes pointers). */
__device__ __forceinline__ unsigned char* at(u32 shared) { return smem + (shared - sa(smem)); }

/* The same copy into every CTA of `mask`: the bytes land at offset dst of each, and complete
 * on the mbarrier at offset bar of each. */
__device__ __forceinline__ void bulk_copy_multicast(u32 dst, const unsigned char* src, u32 bytes,
                                                    u32 bar, unsigned short mask, u64 pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster.L2::cache_hint [%0], [%1], %2, [%3], %4, %5;"
                 :: "r"(dst), "l"(src), "r"(bytes), "r"(bar), "h"(mask), "l"(pol) : "memory");
}

__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr, bool trans)
{
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct plan {
    const unsigned char* w;     /* [layer][band][stage] B pages */
    const unsigned char* act;   /* [rank][stage] A half-pages */
    float* out;                 /* 64 x (bands * 64) fp32 */
    u32 layers, stages, bands, ring, rank, band, full0, empty0, issued0, ring0;
    u64 timeout_ns;
    u32* err;
    u32* dep;                   /* +deps: [layer] CTAs done with it, never reset (see target) */
    u32 target, done0;          /* +deps: dep[l] when layer l is done this run; done[] words */
    u64* marks;                 /* +deps, --marks: [block][layer][NMARK] %globaltimer, or null */
};

/* --marks (+deps variants): the steps of a layer boundary, per CTA and layer l (the host's
 * MARKS names them): 0 the CTA done with l (its last warp, before the signal), 1 the producer
 * saw layer l - 1 done everywhere (l >= 1), 2 warp 0's first stage of l landed (B and A),
 * 3 the producer issued l's first stage past the ring (its refill from HBM). */
#ifndef MARKED
#define MARKED 0
#endif
__device__ __forceinline__ void mark(const plan& P, u32 l, u32 i)
{
    if (MARKED && P.marks != nullptr && l < MAX_LAYERS)
        P.marks[(blockIdx.x * MAX_LAYERS + l) * NMARK + i] = now();
}

/* Ordering, mcast (own is the one-CTA case of it: empty counts 1, no remote arrival):
 *  - init: thread 0 initialises the barriers, fence.mbarrier_init.release.cluster makes them
 *    visible to the async proxy and to the cluster, and the cluster barrier (release/acquire)
 *    orders every init before the first multicast or remote arrival from either CTA.
 *  - refill: a multicast of stage p into slot s writes the slot of BOTH CTAs. Its issuer waits
 *    (acquire.cluster) on its own empty[s], whose phase for stage p - ring completes only with
 *    two arrivals: its own consumer's and the peer consumer's remote one, each made after that
 *    warp's last ldmatrix of stage p - ring. So neither CTA still reads the page when it is
 *    overwritten. Each producer's own A copy waits on the same barrier. The remote arrival is
 *    release.cluster in mcast-strict (the memory model's spelling: it costs a gpu-scope
 *    MEMBAR per stage and warp) and release.cta in mcast: the only accesses it must order are
 *    the warp's ldmatrix reads of its own CTA's page, and those have returned their data
 *    before the arrival issues (the MMAs before it in program order consume every one of
 *    them, and issue is in order); the established multicast pipelines release this way.
 *  - full: each CTA's producer arrives with expect_tx(B + A) on its own full[s]; the B bytes
 *    may complete there before that arrival (the peer issued first): the tx-count goes
 *    negative, the phase cannot complete while the arrival is pending. They cannot reach a
 *    phase early: the peer issues stage p only after this CTA's consumer released stage
 *    p - ring, i.e. after this CTA's full[s] completed that phase.
 *  - exit: the cluster barrier before exit: no CTA leaves while its peer may still arrive on
 *    it (every multicast into it has landed: its own consumers waited for each).
 * On an error a thread leaves its loop; the others time out in turn (each wait is bounded), so
 * every thread reaches the final cluster barrier. Copies still in flight after an error are
 * not waited for: the host raises and the process should not reuse the GPU. */
template <bool MCAST, bool HAS_A>
__device__ __forceinline__ void produce(const plan& P)
{
    const u32 stage_bytes = HAS_A ? B_BYTES + A_BYTES : B_BYTES;
    const u64 pol_b = policy(false), pol_a = policy(true);   /* megak streams W evict-first */
    const unsigned char* a_rank = P.act + (u64)P.rank * P.stages * A_BYTES;
    const u32 total = P.layers * P.stages;
    u32 slot = 0, lap = 0, s = 0, l = 0;
    for (u32 pos = 0; pos < total; ++pos) {
        const u32 full = P.full0 + 8u * slot, page = P.ring0 + slot * stage_bytes;
        if (pos >= P.ring &&
            !wait_phase<MCAST>(P.empty0 + 8u * slot, (lap - 1u) & 1u, P.timeout_ns)) {
            fail(P.err, E_EMPTY, pos, slot);
            return;
        }
        issued_publish(P.issued0 + 4u * slot, pos);   /* pos - ring was read: see wait_stage */
        mbar_expect_tx(full, stage_bytes);
        const unsigned char* b = P.w + (((u64)l * P.bands + P.band) * P.stages + s) * B_BYTES;
        u64* full_bar = reinterpret_cast<u64*>(at(full));
        if (!MCAST)
            bulk_load(at(page), b, B_BYTES, full_bar, pol_b);
        else if ((pos & 1u) == P.rank)   /* the two producers take turns */
            bulk_copy_multicast(page, b, B_BYTES, full, (unsigned short)3u, pol_b);
        if (HAS_A)
            bulk_load(at(page + B_BYTES), a_rank + (u64)s * A_BYTES, A_BYTES, full_bar, pol_a);
        if (++slot == P.ring) { slot = 0; ++lap; }
        if (++s == P.stages) { s = 0; ++l; }
    }
}

/* Layer dependencies (+deps; variants with A). Layer l + 1's A is layer l's output: its values
 * stay the same A here (the check is unchanged), only its availability is modelled.
 *  - signal: dep[l] counts the CTAs done with layer l (it only grows: a run adds one per CTA
 *    with work, so layer l is done in run `epoch` when dep[l] reaches target = epoch * 2 *
 *    bands). A consumer warp is done with layer l once it handed back its last stage of l (or,
 *    having none left there, reaches a later layer or its end); its lane 0 then adds one to
 *    the CTA's done[l] word (atom.acq_rel.cta), and the warp that brings it to CONSUMERS adds
 *    one to dep[l] (red.release.gpu; cumulative: it orders the other warps' work, which its
 *    acquire observed). Every warp waited on `full` for each of its stages of l, so every
 *    bulk copy of layer l's A into this CTA has read its bytes before the signal: in a chain
 *    that ping-pongs two buffers, layer l + 1's outputs overwrite the A layer l read, and no
 *    CTA computes layer l + 1 before every CTA signalled l. The real chain would also write
 *    the CTA's 32 x 64 outputs of layer l before signalling; the probe leaves that out. The
 *    last layer signals nothing. Idle clusters neither signal nor wait.
 *  - wait: the producer issues layer l + 1's first A copy only once it read dep[l] >= target
 *    (ld.relaxed.gpu, one look per pass of its loop), then fence.acquire.gpu (with that read
 *    an acquire pattern) and fence.proxy.async.global: the acquire makes the generic stores
 *    that precede the signals (the real chain's outputs) visible to this thread, the proxy
 *    fence to the async proxy, whose bulk copies are what read them. Layer 0 waits for
 *    nothing; B never waits (weights have no producer). Every CTA with work waits for every
 *    other, so all must be resident at once: the launch is cooperative (all of them are). */
template <bool MCAST, int DEPS>
__device__ __forceinline__ void produce_deps(const plan& P)
{
    /* DEPS 3 and 4 (own+deps(-relaxed)-pf): while A waits at a boundary and the ring stands
     * full, the B stages past it are asked into L2 (cp.async.bulk.prefetch.L2, PF_STAGES of
     * them, once each), so that HBM keeps working for this SM beyond the ring's depth */
    u32 pf_pos = 0;   /* the stages below it were prefetched, or issued */
    const u32 stage_bytes = B_BYTES + A_BYTES;
    const u64 pol_b = policy(false), pol_a = policy(true);
    const unsigned char* a_rank = P.act + (u64)P.rank * P.stages * A_BYTES;
    const u32 total = P.layers * P.stages;
    /* Two cursors: B runs ahead of A as far as slots free up, A follows as far as B went and
     * its layer's input is ready: at a layer boundary the ring fills with the next layer's B
     * while its A waits. Ordering: a stage's one `full` arrival (expect_tx for B + A) is made
     * with its B issue, and its A is issued after it (a_pos < b_pos), so the phase expects
     * the A bytes before they can land and completes only once both did. A never passes B;
     * B passes A by at most the ring: a slot is refilled only after its stage was read,
     * which needs that stage's A. issued[] is published with the B issue, as before: the
     * consumers' argument (wait_stage) is about the phase, which still needs A. */
    u32 b_pos = 0, b_slot = 0, b_lap = 0, b_s = 0, b_l = 0;   /* the next B to issue */
    u32 a_pos = 0, a_slot = 0, a_s = 0, a_l = 0;              /* the next A: a_pos <= b_pos */
    u32 ready = 1, seen = 0;   /* the layers below `ready` may read their A; dep[] last read */
    u64 deadline = 0;
    while (a_pos < total) {
        /* Between passes a_pos < b_pos only while A waits for dep[a_l - 1] (the A step issues
         * all it may). Then look at it now and use the value after the B step: the relaxed
         * load stalls nothing until then. */
        const bool a_waits = a_pos < b_pos;
        bool look = a_waits;   /* `seen` is dep[a_l - 1] of this pass, not yet used */
        if (a_waits)
            seen = ld_relaxed_gpu(P.dep + a_l - 1u);
        bool moved = false;
        if (b_pos < total) {   /* B: the next stage, once its slot is free */
            const u32 empty = P.empty0 + 8u * b_slot, par = (b_lap - 1u) & 1u;
            bool free = b_pos < P.ring;
            if (!free && !a_waits) {   /* nothing else to do: wait here, as produce does */
                if (!wait_phase<MCAST>(empty, par, P.timeout_ns)) {
                    fail(P.err, E_EMPTY, b_pos, b_slot);
                    return;
                }
                free = true;
            } else if (!free) {   /* A waits for its layer: one look, then back to dep[] */
                free = mbar_test<MCAST>(empty, par);
                if (DEPS >= 3 && !free) {
                    pf_pos = pf_pos > b_pos ? pf_pos : b_pos;
                    for (u32 s = b_s + (pf_pos - b_pos), l = b_l; pf_pos < b_pos + PF_STAGES &&
                                                                 pf_pos < total; ++pf_pos) {
                        if (s >= P.stages) { s -= P.stages; ++l; }
                        const unsigned char* b =
                            P.w + (((u64)l * P.bands + P.band) * P.stages + s) * B_BYTES;
                        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                                     :: "l"(b), "r"((u32)B_BYTES) : "memory");
                        ++s;
                    }
                }
            }
            if (free) {
                const u32 full = P.full0 + 8u * b_slot, page = P.ring0 + b_slot * stage_bytes;
                if (MARKED && b_s == P.ring)
                    mark(P, b_l, 3);
                issued_publish(P.issued0 + 4u * b_slot, b_pos);
                mbar_expect_tx(full, stage_bytes);
                const unsigned char* b =
                    P.w + (((u64)b_l * P.bands + P.band) * P.stages + b_s) * B_BYTES;
                if (!MCAST)
                    bulk_load(at(page), b, B_BYTES, reinterpret_cast<u64*>(at(full)), pol_b);
                else if ((b_pos & 1u) == P.rank)   /* the two producers take turns */
                    bulk_copy_multicast(page, b, B_BYTES, full, (unsigned short)3u, pol_b);
                ++b_pos;
                moved = true;
                if (++b_slot == P.ring) { b_slot = 0; ++b_lap; }
                if (++b_s == P.stages) { b_s = 0; ++b_l; }
            }
        }
        while (a_pos < b_pos) {   /* A: every stage whose B is out, up to a layer not ready */
            if (a_l == ready) {   /* the first A of layer a_l >= 1 */
                if (!look || (int)(seen - P.target) < 0)   /* (a second layer in one pass, */
                    break;                                  /* a ring deeper: the next pass) */
                look = false;
                mark(P, a_l, 1);
                if (DEPS != 2 && DEPS != 4) {   /* the relaxed forms: A is never written */
                    asm volatile("fence.acquire.gpu;" ::: "memory");
                    /* bulk copies (async proxy) will read what generic stores wrote before
                     * the signals that read saw */
                    asm volatile("fence.proxy.async.global;" ::: "memory");
                }
                ready = a_l + 1u;
            }
            bulk_load(at(P.ring0 + a_slot * stage_bytes + B_BYTES), a_rank + (u64)a_s * A_BYTES,
                      A_BYTES, reinterpret_cast<u64*>(at(P.full0 + 8u * a_slot)), pol_a);
            ++a_pos;
            moved = true;
            if (++a_slot == P.ring) a_slot = 0;
            if (++a_s == P.stages) { a_s = 0; ++a_l; }
        }
        /* Not moved: A waits for dep[] (B either moved, or waited above, or is all out). */
        if (moved) {
            deadline = 0;
        } else if (deadline == 0) {
            deadline = now() + P.timeout_ns;
        } else if (now() > deadline) {
            fail(P.err, E_DEP, a_l, seen);
            return;
        }
    }
}

/* +deps: lane 0 of a consumer warp, done with layer l (see "Layer dependencies"). DEPS 2
 * (+deps-relaxed) signals without the release: the probe writes no outputs, so nothing needs
 * ordering before the add, and the difference to DEPS 1 is what the fence costs, which waits
 * for every bulk copy the SM has in flight. */
template <int DEPS>
__device__ __forceinline__ void layer_done(const plan& P, u32 l)   /* DEPS 4: 2 + prefetch */
{
    u32 before;
    asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], 1;"
                 : "=r"(before) : "r"(P.done0 + 4u * l) : "memory");
    if (before == CONSUMERS - 1u) {   /* the CTA's last warp done with l */
        mark(P, l, 0);
        if (DEPS == 2 || DEPS == 4)
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(P.dep + l) : "memory");
        else
            red_release_gpu(P.dep + l);
    }
}

/* Page layouts (the host's tiling, probe_cluster_stream.py b_offset / a_offset): B row k
 * (128 B) holds 8 chunks of 8 columns, chunk c at c ^ (k & 7); A row m (256 B) holds 16
 * chunks of 8 k, chunk c at c ^ (m & 7). An ldmatrix phase (8 lanes, 8 rows, one chunk)
 * then touches 8 distinct 16-B bank groups. */
template <bool MCAST, bool HAS_A, bool STRICT, int DEPS>
__device__ __forceinline__ void consume(const plan& P, u32 warp, u32 lane, float* red)
{
    const u32 stage_bytes = HAS_A ? B_BYTES + A_BYTES : B_BYTES;
    const u32 total = P.layers * P.stages;
    const u32 peer_empty0 = MCAST ? peer_addr(P.empty0, P.rank ^ 1u) : 0u;
    const u32 row = lane & 15u, half = lane >> 4, swz = lane & 7u;   /* this lane's ldmatrix row */
    float acc[2][8][4] = {};
    u32 pos = warp, done = 0;   /* DEPS: the layers below `done` this warp has signalled */
    for (; pos < total; pos += CONSUMERS) {
        if (DEPS) {   /* the warp's stages go up: it is done with the layers below this one */
            const u32 layer = pos / P.stages;
            if (lane == 0)
                for (u32 l = done; l < layer; ++l)
                    layer_done<DEPS>(P, l);
            done = layer > done ? layer : done;
        }
        const u32 slot = pos % P.ring;
        if (!wait_stage(P.issued0 + 4u * slot, P.full0 + 8u * slot, pos, (pos / P.ring) & 1u,
                        lane, P.timeout_ns)) {
            if (lane == 0) fail(P.err, E_FULL, pos, slot);
            break;
        }
        if (MARKED && DEPS && lane == 0 && pos % P.stages == 0u)   /* a layer's first stage */
            mark(P, pos / P.stages, 2);
        const u32 page_b = P.ring0 + slot * stage_bytes, page_a = page_b + B_BYTES;
#pragma unroll
        for (u32 kk = 0; kk < 8; ++kk) {   /* k16 steps of the stage */
            u32 a[2][4];
#pragma unroll
            for (u32 t = 0; t < 2; ++t) {   /* m16 tiles */
                if (HAS_A)
                    ldsm_x4(a[t], page_a + (16u * t + row) * 256u + (((2u * kk + half) ^ swz) << 4),
                            false);
                else   /* bf16 1.0 pairs */
                    a[t][0] = a[t][1] = a[t][2] = a[t][3] = 0x3F803F80u;
            }
#pragma unroll
            for (u32 j = 0; j < 4; ++j) {   /* n16 pairs: n8 tiles 2j, 2j + 1 */
                u32 b[4];
                ldsm_x4(b, page_b + (16u * kk + row) * 128u + (((2u * j + half) ^ swz) << 4), true);
#pragma unroll
                for (u32 h = 0; h < 2; ++h)
#pragma unroll
                    for (u32 t = 0; t < 2; ++t)
                        mma_bf16(acc[t][2 * j + h], a[t], b[2 * h], b[2 * h + 1]);
            }
        }
        __syncwarp();
        if (lane == 0) {
            mbar_arrive(P.empty0 + 8u * slot);
            if (MCAST)
                mbar_arrive_remote<STRICT>(peer_empty0 + 8u * slot);
        }
    }
    if (DEPS && pos >= total && lane == 0)   /* not after an error: the others time out */
        for (u32 l = done; l + 1u < P.layers; ++l)
            layer_done<DEPS>(P, l);
    /* the 8 warps' sums, one warp at a time (shared f32 atomics are CAS loops on sm_90) */
    const u32 g = lane >> 2, q = lane & 3u;
    for (u32 turn = 0; turn < CONSUMERS; ++turn) {
        if (warp == turn)
#pragma unroll
            for (u32 t = 0; t < 2; ++t)
#pragma unroll
                for (u32 n = 0; n < 8; ++n)
#pragma unroll
                    for (u32 h = 0; h < 2; ++h) {   /* rows g, g + 8 */
                        float2* r = reinterpret_cast<float2*>(
                            red + (16u * t + 8u * h + g) * 64u + 8u * n + 2u * q);
                        const float2 was = turn ? *r : make_float2(0.f, 0.f);
                        *r = make_float2(was.x + acc[t][n][2 * h], was.y + acc[t][n][2 * h + 1]);
                    }
        asm volatile("bar.sync 1, 256;" ::: "memory");   /* the consumer warps only */
    }
    const u32 cols = P.bands * 64u;
    for (u32 i = warp * 32u + lane; i < 32u * 64u; i += CONSUMERS * 32u)
        P.out[(u64)(32u * P.rank + i / 64u) * cols + 64u * P.band + i % 64u] = red[i];
}

template <bool MCAST, bool HAS_A, bool STRICT, int DEPS>
__device__ __forceinline__ void cluster_stream(const unsigned char* w, const unsigned char* act,
                                               float* out, u32 layers, u32 stages, u32 bands,
                                               u32 ring, u64 timeout_ns, u32* err, u32* dep,
                                               u32 epoch, u64* marks)
{
    const u32 stage_bytes = HAS_A ? B_BYTES + A_BYTES : B_BYTES;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31u;
    const u32 pad = ((sa(smem) + 127u) & ~127u) - sa(smem);   /* same in both CTAs */
    const u32 base = sa(smem) + pad;   /* full[], empty[], issued[], done[], reduce, the ring */
    plan P = {w, act, out, layers, stages, bands, ring, cta_rank(), cluster_index(), base,
              base + 8u * MAX_RING, base + 16u * MAX_RING, base + RING_OFF, timeout_ns, err,
              dep, epoch * 2u * bands, base + DONE_OFF, marks};
    float* red = reinterpret_cast<float*>(smem + pad + RED_OFF);
    bool ok = false;
    if (cluster_ctas() != 2u || P.rank != (blockIdx.x & 1u)) {
        if (tid == 0) fail(err, E_CLUSTER, cluster_ctas(), P.rank);
    } else if (blockDim.x != THREADS || ring == 0u || ring > MAX_RING || stages == 0u ||
               layers == 0u || (DEPS && (layers > MAX_LAYERS || epoch == 0u))) {
        if (tid == 0) fail(err, E_ARGS, ring, stages);
    } else if (pad + RING_OFF + ring * stage_bytes > dyn_smem()) {
        if (tid == 0) fail(err, E_FIT, pad + RING_OFF + ring * stage_bytes, dyn_smem());
    } else {
        ok = true;
    }
    if (tid == 0) {
        for (u32 i = 0; i < MAX_RING; ++i) {
            mbar_init(P.full0 + 8u * i, 1u);                    /* the producer's expect_tx */
            mbar_init(P.empty0 + 8u * i, MCAST ? 2u : 1u);      /* one reader per CTA */
            issued_publish(P.issued0 + 4u * i, ~0u);             /* no stage yet */
        }
        if (DEPS)
            for (u32 i = 0; i < MAX_LAYERS; ++i)   /* no warp done with any layer yet */
                reinterpret_cast<u32*>(smem + pad + DONE_OFF)[i] = 0u;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    cluster_sync();
    if (ok && P.band < bands) {   /* the clusters past the last band have no work */
        if (warp == CONSUMERS) {
            if (lane == 0) {
                if (DEPS)
                    produce_deps<MCAST, DEPS>(P);
                else
                    produce<MCAST, HAS_A>(P);
            }
        } else {
            consume<MCAST, HAS_A, STRICT, DEPS>(P, warp, lane, red);
        }
    }
    cluster_sync();
}

#define ENTRY(name, MCAST, HAS_A, STRICT, DEPS)                                                \
extern "C" __global__ void __launch_bounds__(THREADS, 1)                                       \
name(const unsigned char* w, const unsigned char* act, float* out, u32 layers, u32 stages,     \
     u32 bands, u32 ring, u64 timeout_ns, u32* err, u32* dep, u32 epoch, u64* marks)           \
{ cluster_stream<MCAST, HAS_A, STRICT, DEPS>(w, act, out, layers, stages, bands, ring,          \
                                             timeout_ns, err, dep, epoch, marks); }
""" + "\n".join("ENTRY({}, {}, {}, {}, {})".format(
    entry(v), *(str(x).lower() for x in VARIANTS[split(v)[0]] + (split(v)[1],)))
    for v in ALL_VARIANTS) + "\n"


def compile_probe(arch, marked: bool = False):
    """The probe's cubin; `marked`: the build whose +deps kernels stamp their boundaries (a
    build of its own: the stamps' code slows the chain by ~5%, so the timed runs never carry
    it)."""
    return compile_source(("#define MARKED 1\n" if marked else "") + SOURCE, arch=arch,
                          entry=ENTRIES[0], name="probe_cluster_stream.cu")


def compile_only(arch: str) -> int:
    """Both builds (plain and --marks') for `arch`; 1 on a spill."""
    problems = []
    for marked in (False, True):
        t0 = time.perf_counter()
        lines, bad = compile_report(compile_probe(arch, marked), ENTRIES,
                                    time.perf_counter() - t0)
        print("\n".join(lines))
        problems += bad
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(f"OK: {NAME} compiled, 0 spills")
    return 0


# ---- host data: tiling as the kernel reads it, and the reference --------------------------------

def b_offset(k, n):
    """Byte offset of B element (k-row k, column n) in a stage's page (the kernel's ldmatrix
    addressing, inverted)."""
    return k * 128 + (((n >> 3) ^ (k & 7)) << 4) + (n & 7) * 2


def a_offset(m, k):
    """Byte offset of A element (row m of the CTA's 32, k of the stage's 128) in a half-page."""
    return m * 256 + (((k >> 3) ^ (m & 7)) << 4) + (k & 7) * 2


def bf16_of_64ths():
    """bf16 bit patterns of k / 64 for k in -64..64, indexed by k + 64 (exact in bf16)."""
    return ((np.arange(-64, 65, dtype=np.float32) / 64).view(np.uint32) >> 16).astype(np.uint16)


def tile_b(bits, stages, bands):
    """(K, N) bf16 bits -> [band][stage] pages of 128 x 64, chunk c of row k at c ^ (k & 7)."""
    x = bits.reshape(stages, STAGE_K, bands, 8, 8).transpose(2, 0, 1, 3, 4)
    r = np.arange(STAGE_K)[:, None]
    x = x[:, :, r, np.arange(8)[None, :] ^ (r & 7), :]
    return np.ascontiguousarray(x).reshape(bands, stages, STAGE_K * BAND_N)


def tile_a(bits, stages):
    """(64, K) bf16 bits -> [rank][stage] half-pages of 32 x 128, chunk c of row m at c ^ (m & 7)"""
    x = bits.reshape(2, ROWS, stages, 16, 8).transpose(0, 2, 1, 3, 4)
    m = np.arange(ROWS)[:, None]
    x = x[:, :, m, np.arange(16)[None, :] ^ (m & 7), :]
    return np.ascontiguousarray(x).reshape(2, stages, ROWS * STAGE_K)


def make_data(layers, k, n, seed=1):
    """Weights and A as multiples of 1/64 in [-1, 1] (integers u / 64), tiled, and what the
    check needs: the exact outputs (float64 of integer sums) and their tolerances, with A and
    with a constant A of ones (the noA variants)."""
    rng = np.random.default_rng(seed)
    stages, bands = k // STAGE_K, n // BAND_N
    lut = bf16_of_64ths()
    a_units = rng.integers(-64, 65, (64, k), dtype=np.int16)
    w_tiled = np.empty((layers, bands, stages, STAGE_K * BAND_N), np.uint16)
    w_sum = np.zeros((k, n), np.int32)
    w_abs = np.zeros((k, n), np.int32)
    for layer in range(layers):
        units = rng.integers(-64, 65, (k, n), dtype=np.int16)
        w_sum += units
        w_abs += np.abs(units)
        w_tiled[layer] = tile_b(lut[units + 64], stages, bands)
    a = a_units.astype(np.float64)
    ref = a @ w_sum.astype(np.float64) / 4096
    tol = 1e-3 * (np.abs(a) @ w_abs.astype(np.float64)) / 4096 + 1e-6
    ref_ones = np.broadcast_to(w_sum.sum(axis=0, dtype=np.float64) / 64, (64, n))
    tol_ones = np.broadcast_to(1e-3 * w_abs.sum(axis=0, dtype=np.float64) / 64 + 1e-6, (64, n))
    return dict(w=w_tiled, a=tile_a(lut[a_units + 64], stages), a_units=a_units,
                ref={True: ref, False: ref_ones}, tol={True: tol, False: tol_ones})


def check_output(out, ref, tol, what):
    bad = ~(np.abs(out - ref) <= tol)   # NaN (the poison) counts as bad
    if bad.any():
        i = tuple(int(x) for x in np.argwhere(bad)[0])
        raise SystemExit(f"{what}: {int(bad.sum())} of {out.size} outputs wrong, first at {i}: "
                         f"{out[i]!r} vs {ref[i]!r} (tolerance {tol[i]:.3g})")
    return float(np.max(np.abs(out - ref) / tol))


def launch_config(drv, grid, smem, stream=0):
    """cuLaunchKernelEx's config: clusters of (2, 1, 1), cooperative, 288 threads a block."""
    cluster = drv.CUlaunchAttribute()
    cluster.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = 2, 1, 1
    coop = drv.CUlaunchAttribute()
    coop.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
    coop.value.cooperative = 1
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = THREADS, 1, 1
    cfg.sharedMemBytes, cfg.hStream = smem, stream
    cfg.attrs, cfg.numAttrs = [cluster, coop], 2
    return cfg


def boundary_steps(marks) -> dict:
    """A layer boundary's steps in us from --marks' stamps (ns; [CTA][layer][MARKS], the CTAs
    with work): per CTA and layer l >= 1, `wait for the last CTA` (the last CTA's end of
    l - 1 minus this CTA's), `poll` (that end to the producer seeing it), `A lands` (seen to
    its first stage of l read), `refill` (that to the first stage past the ring issued) and
    `layer` (end of l - 1 to end of l); medians over CTAs and layers (the last layer's end is
    not stamped: it signals nothing)."""
    done, seen, landed, refill = (marks[:, :, i] for i in range(len(MARKS)))
    last = done.max(axis=0)   # per layer: the last CTA's end
    steps = {"wait for the last CTA": last[None, :-1] - done[:, :-1],
             "poll": seen[:, 1:] - last[None, :-1],
             "A lands": landed[:, 1:] - seen[:, 1:],
             "refill": refill[:, 1:] - landed[:, 1:],
             "layer": done[:, 1:-1] - done[:, :-2]}
    return {k: float(np.median(x)) / 1e3 if x.size else float("nan") for k, x in steps.items()}


def ring_fits(smem, with_a):
    return (smem - ALIGN_SLACK - RING_OFF) // (B_BYTES + (A_BYTES if with_a else 0))


def geometry(args, smem, clusters):
    """(stages, bands, ring) for the arguments, or SystemExit saying why not."""
    if args.k % STAGE_K or args.n % BAND_N or args.layers < 1 or args.k < STAGE_K:
        raise SystemExit(f"--k must be a multiple of {STAGE_K}, --n of {BAND_N}, --layers >= 1")
    stages, bands = args.k // STAGE_K, args.n // BAND_N
    if bands > clusters:
        raise SystemExit(f"{bands} bands need {bands} clusters of 2; the grid has {clusters}")
    if any(split(v)[1] for v in args.variants) and args.layers > MAX_LAYERS:
        raise SystemExit(f"+deps: --layers up to {MAX_LAYERS}")
    with_a = any(VARIANTS[split(v)[0]][1] for v in args.variants)
    fit = min(MAX_RING, ring_fits(smem, with_a))
    ring = args.ring or fit
    if not 1 <= ring <= fit:
        raise SystemExit(f"--ring {ring}: 1 .. {fit} slots fit in {smem} B of shared memory")
    return stages, bands, ring


def implied_l2_bytes(variant, layers, k, bands):
    """L2-to-SM bytes a chain moves: B per band twice (own) or once (mcast, a multicast counted
    once), A per CTA."""
    mcast, with_a, _ = VARIANTS[split(variant)[0]]
    b = layers * bands * k * BAND_N * 2
    return b * (1 if mcast else 2) + (layers * bands * 2 * ROWS * k * 2 if with_a else 0)


def self_check(args) -> int:
    """No GPU: the host tiling against the kernel's addressing, the reference, the config."""
    import cuda.bindings.driver as drv
    layers, k, n = 2, 256, 128
    d = make_data(layers, k, n, seed=7)
    stages, bands = k // STAGE_K, n // BAND_N
    kk, nn = np.meshgrid(np.arange(STAGE_K), np.arange(BAND_N), indexing="ij")
    mm, ka = np.meshgrid(np.arange(ROWS), np.arange(STAGE_K), indexing="ij")
    lut = dict(zip(bf16_of_64ths().tolist(), (np.arange(-64, 65) / 64.0).tolist()))
    as_float = np.vectorize(lambda b: lut[int(b)])
    a_read = np.zeros((64, k))
    for r in range(2):
        for s in range(stages):
            a_read[ROWS * r:ROWS * (r + 1), STAGE_K * s:STAGE_K * (s + 1)] = as_float(
                d["a"][r, s][a_offset(mm, ka) // 2])
    assert np.array_equal(a_read * 64, d["a_units"]), "A tiling vs a_offset"
    w_read = np.zeros((k, n))
    for layer in range(layers):
        for b in range(bands):
            for s in range(stages):
                w_read[STAGE_K * s:STAGE_K * (s + 1), BAND_N * b:BAND_N * (b + 1)] += as_float(
                    d["w"][layer, b, s][b_offset(kk, nn) // 2])
    got = a_read @ w_read   # what the kernel computes from the pages it reads
    check_output(got, d["ref"][True], d["tol"][True], "self-check with A")
    check_output(np.ones((64, k)) @ w_read, d["ref"][False], d["tol"][False], "self-check noA")
    cfg = launch_config(drv, 132, H200_SMEM_OPTIN)
    assert cfg.attrs[0].value.clusterDim.x == 2 and cfg.attrs[1].value.cooperative == 1
    args.variants = list(ALL_VARIANTS)
    st, bd, ring = geometry(args, H200_SMEM_OPTIN, 66)
    assert len(set(map(entry, ALL_VARIANTS))) == len(ALL_VARIANTS)
    assert all(VARIANTS[split(v)[0]][1] for v in ALL_VARIANTS if split(v)[1])
    print(f"default geometry on an H200: {args.layers} layers, {st} stages x {bd} bands, ring "
          f"{ring} (noA alone: {min(MAX_RING, ring_fits(H200_SMEM_OPTIN, False))}); implied "
          "L2->SM MB per chain: " + ", ".join(
              f"{v} {implied_l2_bytes(v, args.layers, args.k, bd) / 1e6:.0f}" for v in VARIANTS))
    # boundary_steps on stamps made up for 2 CTAs and 3 layers (ns): CTA 1 ends each layer
    # 1 us after CTA 0, both see it 0.5 us later, land A 2 us after that, refill 1 us later
    t = np.zeros((2, 3, len(MARKS)), np.int64)
    for l in range(3):
        t[:, l, 0] = [10_000 * l, 10_000 * l + 1_000]
        t[:, l, 1] = 10_000 * (l - 1) + 1_500 if l else 0
        t[:, l, 2] = t[:, l, 1] + 2_000
        t[:, l, 3] = t[:, l, 2] + 1_000
    got = boundary_steps(t)
    assert got == {"wait for the last CTA": 0.5, "poll": 0.5, "A lands": 2.0, "refill": 1.0,
                   "layer": 10.0}, got
    print("OK: self-check (tiling, reference, launch config, boundary steps)")
    return 0


# ---- the GPU run ----------------------------------------------------------------------------

def run(args):
    from megak.runtime import memory as mem
    from megak.runtime.driver import check

    drv, dev, info = open_gpu("clusters and bulk copies")
    grid = info["sm_count"] // 2 * 2
    smem = info["smem_optin"]   # all of it: one block per SM whatever the ring
    stages, bands, ring = geometry(args, smem, grid // 2)
    fns = kernel_functions(drv, compile_probe(info["arch"]).cubin,
                           {entry(v) for v in args.variants}, smem)
    fn = {v: fns[entry(v)] for v in args.variants}
    stream = dev.create_stream()
    h = stream.handle
    cfg = launch_config(drv, grid, smem, h)
    res = drv.cuOccupancyMaxActiveClusters(fn[args.variants[0]], cfg)
    fits = int(res[1]) if int(res[0]) == 0 else "?"   # informative: the launch says for sure
    if fits != "?" and fits < grid // 2:
        raise SystemExit(f"only {fits} clusters of 2 fit at once, the grid has {grid // 2}")

    t0 = time.perf_counter()
    d = make_data(args.layers, args.k, args.n)
    n_out = 64 * args.n
    m = mem.Memory(0)
    w = m.device(d["w"].nbytes, "weights")
    a = m.device(d["a"].nbytes, "A")
    out = m.device(n_out * 4, "out")
    err = m.device(16, "error record")
    dep = m.device(4 * args.layers, "+deps layer counters")   # freed with m; zeroed once:
    mem.memset32(dep.ptr, 0, args.layers, h)                 # each +deps run adds 2 * bands
    for buf, host in ((w, d["w"]), (a, d["a"])):
        check(drv.cuMemcpyHtoD(buf.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
    print(f"{info['name']}: {grid} blocks = {grid // 2} clusters of 2 ({fits} fit), {bands} "
          f"bands x {stages} stages x {args.layers} layers, ring {ring}, {smem} B smem; data "
          f"{time.perf_counter() - t0:.1f} s; median of {args.reps}", flush=True)
    events = [(check(drv.cuEventCreate(0), "cuEventCreate"),
               check(drv.cuEventCreate(0), "cuEventCreate")) for _ in range(args.reps)]
    host_out = np.empty(n_out, np.float32)
    host_err = np.zeros(4, np.uint32)

    epoch = 0   # +deps runs so far: the counters stand at epoch * 2 * bands between runs

    marks = m.device(grid * MAX_LAYERS * len(MARKS) * 8, "boundary marks") if args.marks else None
    marked_variants = [v for v in args.variants if marks is not None and split(v)[1]]
    fns = kernel_functions(drv, compile_probe(info["arch"], marked=True).cubin,
                           {entry(v) for v in marked_variants}, smem) if marked_variants else {}
    fn_marked = {v: fns[entry(v)] for v in marked_variants}

    def launch(variant, marked=False):
        nonlocal epoch
        if split(variant)[1]:
            epoch += 1
        vals = [ctypes.c_uint64(w.ptr), ctypes.c_uint64(a.ptr), ctypes.c_uint64(out.ptr),
                ctypes.c_uint32(args.layers), ctypes.c_uint32(stages), ctypes.c_uint32(bands),
                ctypes.c_uint32(ring), ctypes.c_uint64(int(args.timeout_s * 1e9)),
                ctypes.c_uint64(err.ptr), ctypes.c_uint64(dep.ptr),
                ctypes.c_uint32(epoch & 0xFFFFFFFF),
                ctypes.c_uint64(marks.ptr if marked else 0)]
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        check(drv.cuLaunchKernelEx(cfg, (fn_marked if marked else fn)[variant],
                                   ctypes.addressof(argv), 0), "cuLaunchKernelEx")

    def raise_on_error(variant):
        check(drv.cuMemcpyDtoH(host_err.ctypes.data, err.ptr, 16), "cuMemcpyDtoH")
        if host_err[0]:
            code, block, x, y = (int(v) for v in host_err)
            raise SystemExit(f"{variant}: block {block}: " +
                             ERRORS.get(code, "error {} {} {}").format(x, y, code))

    b_total = args.layers * args.k * args.n * 2
    rows = []
    print(f"{'variant':<18}{'us':>9}{'min':>9}{'max':>9}{'x own':>7}{'+deps':>7}{'W TB/s':>8}"
          f"{'L2->SM MB':>11}{'TB/s':>7}{'err/tol':>9}", flush=True)
    for v in args.variants:
        mem.memset32(out.ptr, 0x7FC0DEAD, n_out, h)   # NaN: an output never written fails
        mem.memset32(err.ptr, 0, 4, h)
        launch(v)
        check(drv.cuStreamSynchronize(h), f"{v} (checked run)")
        raise_on_error(v)
        check(drv.cuMemcpyDtoH(host_out.ctypes.data, out.ptr, n_out * 4), "cuMemcpyDtoH")
        base, deps = split(v)
        with_a = VARIANTS[base][1]
        worst = check_output(host_out.reshape(64, args.n).astype(np.float64),
                             d["ref"][with_a], d["tol"][with_a], v)
        for start, stop in events:
            check(drv.cuEventRecord(start, h), "cuEventRecord")
            launch(v)
            check(drv.cuEventRecord(stop, h), "cuEventRecord")
        check(drv.cuStreamSynchronize(h), f"{v} (timed runs)")
        raise_on_error(v)
        ts = [check(drv.cuEventElapsedTime(s, e), "cuEventElapsedTime") * 1e3 for s, e in events]
        med = statistics.median(ts)
        l2 = implied_l2_bytes(v, args.layers, args.k, bands)
        own = next((r["median_us"] for r in rows if r["variant"] == "own"), None)
        undep = next((r["median_us"] for r in rows if deps and r["variant"] == base), None)
        rows.append(dict(variant=v, multicast=VARIANTS[base][0], with_a=with_a, deps=deps,
                         ring=ring, median_us=med, min_us=min(ts), max_us=max(ts), times_us=ts,
                         weight_tbps=b_total / med / 1e6, l2_to_sm_bytes=l2,
                         l2_to_sm_tbps=l2 / med / 1e6, worst_err_over_tol=worst))
        ratio = f"{own / med:.2f}" if own else "-"
        extra = f"{med - undep:+.1f}" if undep else "-"   # what the chain's waits add, us
        print(f"{v:<18}{med:>9.1f}{min(ts):>9.1f}{max(ts):>9.1f}{ratio:>7}{extra:>7}"
              f"{b_total / med / 1e6:>8.2f}{l2 / 1e6:>11.0f}{l2 / med / 1e6:>7.2f}"
              f"{worst:>9.3f}", flush=True)
    for v in marked_variants:
        mem.memset32(marks.ptr, 0, marks.nbytes // 4, h)
        mem.memset32(err.ptr, 0, 4, h)
        launch(v, marked=True)
        check(drv.cuStreamSynchronize(h), f"{v} (marked run)")
        raise_on_error(v)
        host_marks = np.empty((grid, MAX_LAYERS, len(MARKS)), np.uint64)
        check(drv.cuMemcpyDtoH(host_marks.ctypes.data, marks.ptr, marks.nbytes), "cuMemcpyDtoH")
        steps = boundary_steps(host_marks[:2 * bands, :args.layers].astype(np.int64))
        next(r for r in rows if r["variant"] == v)["boundary_us"] = steps
        print(f"{v} boundary (us, medians over CTAs and layers 1-{args.layers - 1}): " +
              ", ".join(f"{k} {x:.2f}" for k, x in steps.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": info["name"], "grid": grid, "clusters": grid // 2, "bands": bands,
             "stages": stages, "layers": args.layers, "k": args.k, "n": args.n, "ring": ring,
             "smem": smem, "reps": args.reps, "weight_bytes": b_total, "rows": rows}, indent=1))
        print(f"wrote {args.json}", flush=True)
    for ev in (e for pair in events for e in pair):
        check(drv.cuEventDestroy(ev), "cuEventDestroy")
    stream.close()
    m.close()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--k", type=int, default=4096, help="rows of each W (multiple of 128)")
    p.add_argument("--n", type=int, default=4096, help="columns of each W (multiple of 64)")
    p.add_argument("--ring", type=int, default=0, help="slots in flight (default: as many as fit)")
    p.add_argument("--reps", type=int, default=20, help="timed runs per variant (default 20)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma list of " + ", ".join(VARIANTS) + " (default all), each with A "
                   f"also as <variant>{DEPS} and <variant>{RELAXED}")
    p.add_argument("--deps", action="store_true",
                   help=f"after the variants, each one with A again as <variant>{DEPS}: its "
                   "layers chained through a counter in global memory, and (not the strict "
                   f"one) as <variant>{RELAXED}: the same with a relaxed signal")
    p.add_argument("--marks", action="store_true",
                   help="after the timed runs, one run of each +deps variant stamping its "
                   "layer boundaries' steps (%%globaltimer), their medians printed")
    p.add_argument("--timeout-s", type=float, default=1.0, help="device spin deadline (s)")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--compile-only", action="store_true",
                   help="compile for --arch with NVRTC (no GPU), print ptxas info, exit")
    p.add_argument("--arch", default="sm_90a", help="arch of --compile-only (default sm_90a)")
    p.add_argument("--self-check", action="store_true",
                   help="no GPU: host tiling vs the kernel's addressing, reference, config")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.variants or any(v not in ALL_VARIANTS for v in args.variants):
        p.error("--variants: a comma list of " + ", ".join(ALL_VARIANTS))
    if args.deps:
        args.variants += [v + suffix for v in args.variants for suffix in DEPS_FORMS
                          if v + suffix in ALL_VARIANTS and v + suffix not in args.variants]
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.compile_only:
        return compile_only(args.arch)
    if args.self_check:
        return self_check(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
