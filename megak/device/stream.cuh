/* megak: the weight stream. Operands with no producer in the graph (weights) of the streamed
 * GEMMs (MK_FLAG_STREAM, ops/gemm_stream.cuh) reach shared memory through a ring of pages that
 * one lane keeps full across instruction boundaries, with TMA bulk tensor copies.
 *
 *   pages    the last p.stream_pages (R) pages of the block: ring slot i = page n_pages - R + i;
 *            the allocator never hands them out (it owns pages 0 .. n_pages - R - 1)
 *   stages   the streamed instructions of the block's queue, in queue order, each
 *            ceil(klen / MK_STREAM_BOX_ROWS) boxes of B (64 bf16 columns, or 32 fp32 ones of an
 *            fp32 band (MK_FLAG_STREAM_F32), x 128 k-rows = one page),
 *            or for a narrow band (MK_FLAG_STREAM_NARROW) ceil(klen / 256) pages of two boxes
 *            of 32 columns x 128 k-rows stacked in k; stage position pos counts them from 0
 *            in each invocation; stage pos lives in slot pos % R
 *   streamer warp 10, lane 0 (mk_streamer in megakernel.cu): for each stage, waits until the
 *            slot's previous stage was read (ring_empty), arms ring_full with the stage's
 *            bytes (expect_tx: the page, or its first half where a narrow stage's second box
 *            would start past the k range) and issues the copies (evict-first in L2: weights
 *            are read once)
 *   loader   gives each instruction its first position and stage count (slot.stream_pos,
 *            slot.stream_stages) from the same predicate, on the same record bytes
 *   compute  the op's warps take the instruction's stages in turn, r warps to a stage for
 *            an instruction of r m16 tiles (r = 1: warp w reads stages w, w + 8, ...;
 *            r = 2: warps w and w + 4 read stages w, w + 4, ..., each half of the box's
 *            k-rows; a narrow band's: warps w and w + 4, one box each): each reader waits on
 *            ring_full of its stage, reads it, and arrives on ring_empty once it is done with
 *            the page (a narrow stage's second reader reads nothing where its box was not
 *            copied, and still waits and arrives)
 *
 * The streamer only waits for pages to come back, never for dependencies: while the compute
 * warps wait for a layer's activation, the next layers' weights keep arriving, as far ahead as
 * the ring holds.
 *
 * The hold: a release fence waits for the SM's bulk copies in flight (0.25 us idle, 3.9 us
 * with 10 pages in flight: tools/probe_fence_load.py), so a band that signals its consumers
 * (or, with parts, adds to its combine counter) while the ring refills pays for the refill.
 * A streamed instruction raises stream_hold once every compute warp is done with its k
 * loop; the streamer issues no copy while it is raised, and thread 0 lowers it after the
 * signal's fence (mk_compute_signal). tools/probe_stream_stages.py, one lease each: a narrow
 * band's signal in 4096 x 8 at batch 16 took 2.2 us with the hold off and 0.8 with it on,
 * the chain 125.2 us against 116.8; holding the wide bands as well took 8192 x 8 from 307.0-
 * 307.8 us to 298.5-299.2 and batch 64 from 183.0-184.3 to 180.3-180.9, 1024 x 16 within
 * its noise (variant "holdnarrow" is the narrow-only rule). The word orders nothing: it
 * only delays issues that the protocol below already orders, and the streamer waits for it
 * at most MK_STREAM_HOLD_NS per copy, so a hold left raised (an op that stopped early) costs
 * time, never a hang. Shared atomics both ways: racecheck takes them as synchronisation.
 *
 * Ordering:
 *   - copy -> reader: the bulk copy completes its bytes on ring_full[slot] (complete_tx); a
 *     thread whose try_wait sees that phase complete sees the page's bytes (mbarrier
 *     acquire). One phase per stage: the wait's parity is (pos / R) & 1.
 *   - which phase: a parity wait tells apart only the phase it waits for and the one before,
 *     so the reader of pos must know that pos - R has landed (else the phase of pos - 2 R,
 *     same parity, reads as complete). With every warp reading every stage the reader had
 *     read pos - R itself; with one or two warps per stage it has not, so the streamer
 *     publishes ring_issued[slot] = pos (an atomic exchange with release semantics, cta)
 *     after its wait for pos - R's readers and before the copy, and each reader waits for
 *     that value before the parity wait: lane 0 of the reading warp polls it (atomic reads
 *     with acquire semantics) and a warp barrier orders its read before every lane's
 *     parity wait (ops/gemm_stream.cuh, mk_stream_wait_full). Seeing it, the reader knows
 *     pos - R was read, hence landed; and pos + R cannot be issued before the reader itself
 *     arrives: the slot's phase is that of pos or the one before. Thread 0 sets
 *     every ring_issued to ~0 (no position) in the set-up.
 *   - reader -> next copy into the slot (write after read): a warp that reads a page hands
 *     it back on ring_empty[slot] after its lanes' reads (ldmatrix, generic proxy;
 *     mk_ring_hand_back: every lane's own arrive in a build with MK_BODY_STREAM_PACKED, else
 *     lane 0's after __syncwarp, which orders the warp's reads before it by cumulativity;
 *     the arrive's release either way); the streamer's try_wait of that phase (acquire)
 *     happens before it issues the next copy into the page. A phase is MK_STREAM_READERS
 *     (2) x MK_RING_LANE_ARRIVALS arrivals: each of a stage's two readers once, or twice at
 *     once for its only reader, so it completes only once every warp that reads the page
 *     is done with it.
 *   - generic writes -> copies: a ring page may have been written by generic stores before
 *     this invocation (another program of the resident kernel used the page through the
 *     allocator). The streamer issues fence.proxy.async before its first copy, after the
 *     request hand-off that ordered those stores before it.
 *   - barrier initialisation: thread 0 initialises the ring barriers in the block's set-up
 *     (mk_begin_invocation), then fence.mbarrier_init (the copy engine completes tx on them),
 *     then the set-up barrier every role passes. Positions restart at 0 in each invocation, so
 *     the resident kernel invalidates and initialises them again per request: the previous
 *     invocation's streamer had drained (below) before the roles met.
 *   - leaving: the streamer waits until every copy it issued has landed (the full phases of
 *     the last min(pos, R) stages) before it joins the other roles: no copy writes shared
 *     memory after the block has left or the barriers were reinitialised. A compute role
 *     that stops early sets ring_stop: the streamer stops waiting for pages and drains.
 * megak/runtime/stream_model.py states this protocol in Python and catches its misuses.
 */
#ifndef MEGAK_STREAM_CUH
#define MEGAK_STREAM_CUH

#include "instr.h"
#include "sync.cuh"
#include "pages.cuh"

static_assert(MK_STREAM_BOX_COLS * MK_STREAM_BOX_ROWS * 2 == MK_PAGE_BYTES,
              "one bf16 box of the weight stream fills one page");
static_assert(MK_STREAM_BOX_COLS * 2 == 128, "a box row is the 128-B swizzle span");

static_assert(MK_STREAM_NARROW_COLS * 2 == 64 && 2 * MK_STREAM_NARROW_COLS == MK_STREAM_BOX_COLS,
              "a narrow box row is the 64-B swizzle span; two narrow boxes fill a page");
static_assert(MK_STREAM_NARROW_READY == 65536 + MK_STREAM_BOX_ROWS,
              "a narrow map's ready word names its box rows");

/* The longest a hold delays one copy (see "The hold"). A tail (the k loop's end to the
 * signal's fence, ~1-6 us) longer than this lets one copy through per MK_STREAM_HOLD_NS. */
constexpr mk_u64 MK_STREAM_HOLD_NS = 4000;

/* Byte offset of the tensor maps after a table of n tensors (instr.h, mk_tensor). */
__device__ __forceinline__ mk_u64 mk_tmap_offset(mk_u32 n)
{
    const mk_u64 b = (mk_u64)n * sizeof(mk_tensor);
    return (b + MK_TMAP_BYTES - 1) / MK_TMAP_BYTES * MK_TMAP_BYTES;
}

__device__ __forceinline__ const unsigned char* mk_tmaps(const mk_params& p)
{
    return reinterpret_cast<const unsigned char*>(p.tensors) + mk_tmap_offset(p.n_tensors);
}

/* ready[i]: the box rows of tensor i's map in the table, 0 where it has none (instr.h). */
__device__ __forceinline__ const mk_u32* mk_tmap_ready(const mk_params& p)
{
    return reinterpret_cast<const mk_u32*>(mk_tmaps(p) + (mk_u64)MK_TMAP_BYTES * p.n_tensors);
}

/* Ring slot i's page. */
__device__ __forceinline__ unsigned char* mk_ring_page(const mk_params& p, mk_u32 slot)
{
    return mk_page_array(mk_smem) + (mk_u64)(p.n_pages - p.stream_pages + slot) * MK_PAGE_BYTES;
}

__device__ __forceinline__ void mk_mbar_expect_tx(mk_u64* bar, mk_u32 bytes)
{
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                 : : "r"(mk_smem_addr(bar)), "r"(bytes) : "memory");
}

/* Makes mbarrier initialisations visible to the async proxy (the copy engine's complete_tx). */
__device__ __forceinline__ void mk_fence_mbar_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
}

/* Orders this thread's earlier generic-proxy accesses of shared memory before its later
 * async-proxy ones (bulk copies into the same bytes). */
__device__ __forceinline__ void mk_fence_proxy_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
}

/* An L2 policy for bytes read once: evict them first. */
__device__ __forceinline__ mk_u64 mk_policy_evict_first()
{
    mk_u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

/* The default L2 policy, for a copy that takes one (mk_tma_load_2d). */
__device__ __forceinline__ mk_u64 mk_policy_evict_normal()
{
    mk_u64 pol;
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

/* One box of the tensor `tmap` (global address of a CUtensorMap), at column c0 and row r0 of
 * the tensor, into the page at shared address dst; its bytes complete on `bar`. Rows and
 * columns past the tensor arrive as zeros. */
__device__ __forceinline__ void mk_tma_load_2d(mk_u32 dst, const void* tmap, int c0, int r0,
                                               mk_u64* bar, mk_u64 policy)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;"
                 : : "r"(dst), "l"(tmap), "r"(c0), "r"(r0), "r"(mk_smem_addr(bar)), "l"(policy)
                 : "memory");
}

/* `bytes` contiguous bytes (a multiple of 16) at the 16-B aligned global address src into
 * shared memory at dst, one 1-D bulk copy; they complete on `bar`. */
__device__ __forceinline__ void mk_bulk_load(mk_u32 dst, mk_u64 src, mk_u32 bytes, mk_u64* bar,
                                             mk_u64 policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 : : "r"(dst), "l"(src), "r"(bytes), "r"(mk_smem_addr(bar)), "l"(policy)
                 : "memory");
}

/* One box from the page at shared address src into the tensor `tmap` at column c0 and row
 * r0 (a TMA store): read from shared memory and written to global memory asynchronously, in
 * this thread's bulk async-group (mk_bulk_commit). The page's bytes must have been written
 * before it by the generic proxy with each writer's mk_fence_proxy_async_smem and a barrier. */
__device__ __forceinline__ void mk_tma_store_2d(const void* tmap, int c0, int r0, mk_u32 src)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 : : "l"(tmap), "r"(c0), "r"(r0), "r"(src) : "memory");
}

/* Closes this thread's bulk async-group: the stores issued since the last commit. */
__device__ __forceinline__ void mk_bulk_commit()
{
    asm volatile("cp.async.bulk.commit_group;" : : : "memory");
}

/* Until every bulk store this thread committed has read its shared memory: its pages may be
 * written again (their global writes may still be in flight). */
__device__ __forceinline__ void mk_bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read 0;" : : : "memory");
}

/* Until every bulk store this thread committed has written global memory (visible to this
 * thread), then the async proxy's global writes ordered before this thread's later generic
 * accesses (a release that publishes them: the counters, a request's completion). No-op
 * cost where none is pending. */
__device__ __forceinline__ void mk_bulk_wait_written()
{
    asm volatile("cp.async.bulk.wait_group 0;" : : : "memory");
    asm volatile("fence.proxy.async.global;" : : : "memory");
}

/* Arrivals on ring_empty per reader warp of a stage. Where the build streams packed B by
 * 1-D bulk copies (MK_BODY_STREAM_PACKED), every lane arrives for its own reads: racecheck
 * follows a lane's own release, not lane 0's release on behalf of the warp (cumulativity),
 * and it tracks a bulk copy's writes as the issuing thread's (a tensor copy's not at all), so
 * lane 0's hand-back reads to it as hundreds of thousands of WAR hazards between the readers'
 * ldmatrix and the next copy into the page. Every other build keeps lane 0's single arrive:
 * the 32 cost the input-weight chains 0.7% (benchmarks/ANALYSIS.md "Constant weights"). */
#define MK_RING_LANE_ARRIVALS (MK_BUILT(MK_BODY_STREAM_PACKED) ? 32u : 1u)

/* A reader warp is done with its stage's page (every lane calls it): `readers` of the
 * phase's MK_STREAM_READERS arrivals, MK_RING_LANE_ARRIVALS times over. */
__device__ __forceinline__ void mk_ring_hand_back(mk_u64* empty, mk_u32 readers, int lane)
{
    if (MK_RING_LANE_ARRIVALS == 1u) {
        __syncwarp();   /* every lane's reads of the page before lane 0's release */
        if (lane == 0)
            mk_mbar_arrive_count(empty, readers);
    } else {
        mk_mbar_arrive_count(empty, readers);
    }
}

/* Ring barriers of an invocation: full needs the streamer's arrival plus the copy's bytes,
 * empty MK_STREAM_READERS x MK_RING_LANE_ARRIVALS arrivals (each reader of the stage, or its
 * one reader twice); ring_issued says "no position". Thread 0, in the set-up; `was` = how
 * many were initialised before (the resident kernel's previous request): invalidated
 * first. */
__device__ __forceinline__ void mk_ring_init(mk_control& ctl, mk_u32 was, mk_u32 now)
{
    for (mk_u32 i = 0; i < was; ++i) {
        mk_mbar_inval(&ctl.ring_full[i]);
        mk_mbar_inval(&ctl.ring_empty[i]);
    }
    for (mk_u32 i = 0; i < now; ++i) {
        mk_mbar_init(&ctl.ring_full[i], 1u);
        mk_mbar_init(&ctl.ring_empty[i], (mk_u32)MK_STREAM_READERS * MK_RING_LANE_ARRIVALS);
        ctl.ring_issued[i] = ~0u;
    }
    if (now > 0)
        mk_fence_mbar_init();
    ctl.ring_inited = now;
    ctl.ring_stop = 0;
    ctl.stream_hold = 0;
}

/* ring_issued[slot]: the streamer's publication of the position it issued into the slot,
 * and the reader's wait for it (see "which phase" above). Atomics with release / acquire
 * semantics: the order st.release / ld.acquire would give, and compute-sanitizer's racecheck
 * takes shared-memory atomics as synchronisation where it reports the plain release store
 * against the acquire loads as a race (tools/probe_racecheck.py). */
__device__ __forceinline__ void mk_issued_publish(mk_u32* p, mk_u32 v)
{
    mk_u32 old;
    asm volatile("atom.release.cta.shared::cta.exch.b32 %0, [%1], %2;"
                 : "=r"(old) : "r"(mk_smem_addr(p)), "r"(v) : "memory");
}

__device__ __forceinline__ mk_u32 mk_issued_read(mk_u32* p)
{
    mk_u32 v;
    asm volatile("atom.acquire.cta.shared::cta.or.b32 %0, [%1], 0;"
                 : "=r"(v) : "r"(mk_smem_addr(p)) : "memory");
    return v;
}

/* Whether ring_stop was raised (a compute role left early). */
__device__ __forceinline__ bool mk_ring_stopped()
{
    return *reinterpret_cast<volatile mk_u32*>(&mk_ctl().ring_stop) != 0u;
}

/* The hold (see "The hold" above): raise (1) or lower (0). */
__device__ __forceinline__ void mk_stream_hold(mk_control& ctl, mk_u32 on)
{
    atomicExch(&ctl.stream_hold, on);
}

/* Streamer lane 0, before a copy: wait while the hold is raised, at most MK_STREAM_HOLD_NS. */
__device__ __forceinline__ void mk_stream_hold_wait(mk_control& ctl)
{
    if (atomicOr(&ctl.stream_hold, 0u) == 0u)
        return;
    const mk_u64 until = mk_globaltimer() + MK_STREAM_HOLD_NS;
    while (atomicOr(&ctl.stream_hold, 0u) != 0u && mk_globaltimer() < until && !mk_ring_stopped()) {
    }
}

#endif /* MEGAK_STREAM_CUH */
