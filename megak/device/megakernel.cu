/* megak: the megakernel. One block per SM, launched cooperatively; block b interprets queue b.
 *
 *   kernel  extern "C" megakernel(const mk_params* params)
 *   grid    params->n_sm blocks, block MK_BLOCK_THREADS = 384 threads
 *   smem    dynamic MK_CONTROL_BYTES + MK_PAGE_ALIGN + n_pages * MK_PAGE_BYTES (pages.py),
 *           static 0
 *
 * Warp roles (warp specialisation; setmaxnreg moves registers from the loader warpgroup to
 * the compute warps):
 *
 *   warps 0-7  (256 threads, 224 regs)  compute: run instruction q, hand its pages back in
 *                                       the op's release order, signal its counters
 *   warp  8    (32 lanes, 56 regs)      loader: up to MK_SLOTS - 1 instructions ahead: fetch
 *                                       the next record, validate, acquire pages, preload B,
 *                                       wait, preload the rest
 *   warp  10   (lane 0, 56 regs)        streamer: the weight ring of the streamed GEMMs,
 *                                       as far ahead as the ring allows (stream.cuh)
 *   warps 9,11                          leave at once (setmaxnreg works per warpgroup)
 *
 *   loader    | fetch q+1 | acquire | preload B | wait counters | preload A | full[q+1] -->
 *   compute   ...run q .........................| release early pages ...| signal q | empty[q]
 *                                                                         run q+1 (data there)
 *
 * MK_SLOTS slots (instr.h, which says why that many; mk_control.slot[q % MK_SLOTS]) carry
 * record, operand descriptors, page table and the loader's verdict; each has two mbarriers:
 * full (loader -> compute: the slot and the preloaded bytes are ready) and empty (compute ->
 * loader: the slot may be refilled). The loader fetches, checks and fills up to q + MK_SLOTS - 1
 * while q runs; pages still decide how far ahead it gets (a record takes its pages only when
 * the ones before it leave enough).
 *
 * The slot's empty barrier counts MK_THREADS arrivals, one per compute thread after the
 * compute barrier (C4), and every loader lane waits on it before writing the slot (L1). One
 * thread's arrive after the barrier, and one lane's wait followed by __syncwarp, order the
 * same accesses in the PTX memory model (release and acquire are cumulative), but
 * compute-sanitizer's racecheck follows an mbarrier thread by thread and reported every
 * compute thread's read of a record against the loader's next write into it; with each
 * thread's own arrive and wait it reports none. The hop costs the same (W1 0.373 against
 * 0.375 us/op); the chain of the shortest streamed instructions ~2% more (W2-1024x16-bf16:
 * the 256 arrivals per slot; tools/probe_racecheck.py --time, benchmarks/ANALYSIS.md).
 * Pages move through the allocator mask: the loader takes them (atomic and), the compute
 * warps give them back (release-or) as soon as the running op's page plan allows, so the
 * loader of q+1 can fill pages while q still computes. Steps: L1-L7 in mk_loader, C1-C4 in
 * the kernel's loop.
 *
 * Errors never trap: the first one wins status->error (atomicCAS), its block fills the status
 * record and raises status->abort; blocks spinning on a counter see the flag and stop. Every
 * block that stops early writes its mk_sm_state and exits. docs/ARCHITECTURE.md sections 3-5.
 */
#include "instr.h"
#include "sync.cuh"
#include "pages.cuh"
#include "stream.cuh"
#include "flag.cuh"
#include "ops/copy.cuh"
#include "ops/transpose.cuh"
#include "ops/gemm.cuh"
#include "ops/reduce.cuh"
#include "ops/add.cuh"
#include "ops/softmax.cuh"
#include "ops/layernorm.cuh"
#include "ops/rmsnorm.cuh"

/* The op table: the one dispatch list. X(OP, name, PRELOAD) expects mk_<name>_run / _check /
 * _check_operands (the op's header), MK_<OP>_PAGES and MK_<OP>_OPERANDS (instr.h), and with
 * PRELOAD = 1 mk_<name>_preload_stages / _preload: the loader fills the op's first pipeline
 * stages (pages.cuh, mk_preload_parts), mk_<name>_preload_late: what the loader still
 * produces for the op once it runs (the wgmma GEMM's later stages), and
 * mk_<name>_preload_drain: what the loader waits for when it leaves (copies of records the
 * compute warps may never run: the paged transpose's tiles). tests/test_op_contract.py
 * checks this list against the Python registry and instr.h. */
#define MK_FOR_EACH_OP(X)      \
    X(COPY, copy, 0)           \
    X(TRANSPOSE, transpose, 1) \
    X(GEMM, gemm, 1)           \
    X(REDUCE, reduce, 0)       \
    X(ADD, add, 0)             \
    X(SOFTMAX, softmax, 0)     \
    X(LAYERNORM, layernorm, 0) \
    X(RMSNORM, rmsnorm, 0)

/* (an op's entries below are called only where the build holds it: instr.h, MK_BUILT) */
#define MK_OP_BUILT(OP) MK_BUILT(1u << MK_OP_##OP)

/* Operand positions an opcode reads (their descriptors are prefetched and validated). */
__device__ __forceinline__ mk_u32 mk_op_operands(mk_u32 opcode)
{
    switch (opcode) {
#define X(OP, name, PRELOAD) case MK_OP_##OP: return MK_##OP##_OPERANDS;
        MK_FOR_EACH_OP(X)
#undef X
    default: return 0;
    }
}

__device__ __forceinline__ mk_u32 mk_op_pages(mk_u32 opcode)
{
    switch (opcode) {
#define X(OP, name, PRELOAD) case MK_OP_##OP: return MK_##OP##_PAGES;
        MK_FOR_EACH_OP(X)
#undef X
    default: return 0;
    }
}

__device__ __forceinline__ bool mk_op_check(const mk_instr& in)
{
    switch (in.opcode) {
#define X(OP, name, PRELOAD) case MK_OP_##OP: return MK_OP_BUILT(OP) && mk_##name##_check(in);
        MK_FOR_EACH_OP(X)
#undef X
    default: return true;   /* NOP */
    }
}

__device__ __forceinline__ bool mk_op_check_operands(const mk_instr& in, const mk_tensor* op)
{
    switch (in.opcode) {
#define X(OP, name, PRELOAD) \
    case MK_OP_##OP: return MK_OP_BUILT(OP) && mk_##name##_check_operands(in, op);
        MK_FOR_EACH_OP(X)
#undef X
    default: return true;
    }
}

__device__ __forceinline__ void mk_op_run(const mk_instr& in, const mk_tensor* op,
                                          const mk_pages& pages)
{
#if MK_WGMMA_ONLY
    /* every record is a wgmma GEMM tile, its body inline, or a split-K reduce (mk_validate) */
    if (in.opcode == MK_OP_REDUCE)
        mk_reduce_run(in, op, pages);
    else if (in.rows > 0 && in.cols > 0)
        mk_gemm_wgmma_run(in, op, pages);
#else
    switch (in.opcode) {
#define X(OP, name, PRELOAD) \
    case MK_OP_##OP: if (MK_OP_BUILT(OP)) mk_##name##_run(in, op, pages); break;
        MK_FOR_EACH_OP(X)
#undef X
    default: break;   /* NOP */
    }
#endif
}

/* The preloading ops' entries: MK_PRELOAD_<0|1>(name) selects the op's functions or nothing. */
#define MK_PRELOAD_STAGES_0(name, in, op) 0u
#define MK_PRELOAD_STAGES_1(name, in, op) mk_##name##_preload_stages(in, op)
#define MK_PRELOAD_0(name, in, op, pages, lane, parts, q) 0u
#define MK_PRELOAD_1(name, in, op, pages, lane, parts, q) mk_##name##_preload(in, op, pages, lane, parts, q)
#define MK_PRELOAD_LATE_0(name, in, op, pages, lane) MK_OK
#define MK_PRELOAD_LATE_1(name, in, op, pages, lane) mk_##name##_preload_late(in, op, pages, lane)
#define MK_PRELOAD_DRAIN_0(name, lane)
#define MK_PRELOAD_DRAIN_1(name, lane) mk_##name##_preload_drain(lane)

__device__ __forceinline__ mk_u32 mk_op_preload_stages(const mk_instr& in, const mk_tensor* op)
{
    switch (in.opcode) {
#define X(OP, name, PRELOAD) \
    case MK_OP_##OP: return MK_OP_BUILT(OP) ? MK_PRELOAD_STAGES_##PRELOAD(name, in, op) : 0u;
        MK_FOR_EACH_OP(X)
#undef X
    default: return 0;
    }
}

/* Whether the preload issued cp.async copies (the loader waits for them at L7); bulk copies
 * complete on the op's own barriers. */
__device__ __forceinline__ mk_u32 mk_op_preload(const mk_instr& in, const mk_tensor* op,
                                                const mk_pages& pages, mk_u32 lane, mk_u32 parts,
                                                mk_u32 q)
{
    (void)op; (void)pages; (void)lane; (void)parts; (void)q;
    switch (in.opcode) {
#define X(OP, name, PRELOAD) \
    case MK_OP_##OP: return MK_OP_BUILT(OP) ? MK_PRELOAD_##PRELOAD(name, in, op, pages, lane, parts, q) : 0u;
        MK_FOR_EACH_OP(X)
#undef X
    default: return 0u;
    }
}

/* After L7, all 32 lanes: an error code, the same in every lane. */
__device__ __forceinline__ mk_u32 mk_op_preload_late(const mk_instr& in, const mk_tensor* op,
                                                     const mk_pages& pages, mk_u32 lane)
{
    (void)op; (void)pages; (void)lane;
    switch (in.opcode) {
#define X(OP, name, PRELOAD) \
    case MK_OP_##OP: return MK_OP_BUILT(OP) ? MK_PRELOAD_LATE_##PRELOAD(name, in, op, pages, lane) : MK_OK;
        MK_FOR_EACH_OP(X)
#undef X
    default: return MK_OK;
    }
}

/* When the loader leaves, all 32 lanes: no copy it issued may land after the block is gone. */
__device__ __forceinline__ void mk_op_preload_drain(mk_u32 lane)
{
    (void)lane;
#define X(OP, name, PRELOAD) \
    if (MK_OP_BUILT(OP)) { MK_PRELOAD_DRAIN_##PRELOAD(name, lane); }
    MK_FOR_EACH_OP(X)
#undef X
}

/* Step L2. Everything checkable from the record alone (no global loads on the hot path), in
 * the simulator's order: opcode, page budget, descriptor. Loader lane 0 runs this once per instruction: the descriptor checks are one
 * branch-free expression (all its shared loads in flight together) rather than a chain of
 * early returns, each waiting for its own load. Entries past n_waits / n_signals are read
 * and ignored (the record is always 128 bytes). */
__device__ __forceinline__ mk_u32 mk_validate(const mk_instr& in, const mk_params& p,
                                              mk_u32* expected, mk_u32* observed)
{
    if (in.opcode >= MK_OP_COUNT || (in.opcode != MK_OP_NOP && !MK_BUILT(1u << in.opcode)))
        return MK_ERR_BAD_OPCODE;   /* (a GEMM path the build lacks fails mk_gemm_check) */
#if MK_WGMMA_ONLY
    /* the records this variant runs (pages.cuh): wgmma tiles with a register epilogue, and
     * split-K reduces (their body is a call on its own branch, with no accumulator live) */
    if (in.opcode != MK_OP_REDUCE &&
        (in.opcode != MK_OP_GEMM || (in.flags & MK_FLAG_WGMMA) == 0u ||
         (in.flags & (MK_FLAG_ACT_MASK | MK_FLAG_RESIDUAL)) != 0u || in.pages != MK_WGMMA_PAGES ||
         (MK_WGMMA_NARROW && in.cols > MK_WGMMA_NARROW_N)))
        return MK_ERR_BAD_OPCODE;
#endif
    if (in.pages > p.n_pages - p.stream_pages) {   /* the ring's pages are not the allocator's */
        *expected = in.pages;
        *observed = p.n_pages - p.stream_pages;
        return MK_ERR_PAGES;
    }
    const mk_u32 n_waits = in.n_waits, n_signals = in.n_signals, n_counters = p.n_counters;
    bool bad = (n_waits > MK_MAX_WAITS) | (n_signals > MK_MAX_SIGNALS);
#pragma unroll
    for (mk_u32 i = 0; i < MK_MAX_WAITS; ++i)
        bad |= (i < n_waits) & (in.wait_counter[i] >= n_counters);
#pragma unroll
    for (mk_u32 i = 0; i < MK_MAX_SIGNALS; ++i)
        bad |= (i < n_signals) & (in.signal_counter[i] >= n_counters);
    const mk_u32 used = mk_op_operands(in.opcode);
#pragma unroll
    for (mk_u32 i = 0; i < MK_MAX_TENSORS; ++i)
        bad |= (((used >> i) & 1u) != 0u) & (in.tensor[i] >= p.n_tensors);
    /* Region limits, and at least the pages the op writes to: a record that lies about
     * either would make the op scribble over shared memory. */
    /* (a streamed GEMM needs fewer pages than the tiled ones: its op check counts them) */
    bad |= !mk_op_check(in) |
           ((in.pages < mk_op_pages(in.opcode)) & ((in.flags & MK_FLAG_STREAM) == 0u));
    /* a record with a counter of its own names it in out_row0 (instr.h): a streamed band's
     * part where the band has parts (its combine), a copy's taker (its hand-out; a build
     * without its body refuses the record in mk_copy_check) */
    const bool combine = ((in.flags & MK_FLAG_STREAM) != 0u) & ((in.param >> 16) > 1u);
    const bool take = MK_BUILT(MK_BODY_COPY_TAKE) & ((in.flags & MK_FLAG_COPY_TAKE) != 0u);
    bad |= (combine | take) & ((mk_u32)in.out_row0 >= n_counters);
    return bad ? MK_ERR_BAD_DESCRIPTOR : MK_OK;
}

/* L2 reads records and descriptors with plain loads (the record one instruction ahead: its
 * value waits in registers), each waited for by its store into the slot: no cp.async group
 * for L7 to wait for where the op issues none. */
__device__ __forceinline__ uint4 mk_ld_cg_16(const void* p)
{
    uint4 v;
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ mk_u64 mk_ld_ca_8(const void* p)
{
    mk_u64 v;
    asm volatile("ld.global.ca.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}

/* Loader warp: the operand descriptors of slot s's record from the tensor table
 * (lane = 3 * operand + 8-byte part; mk_tensor is 24 bytes): from the table's head in shared
 * memory where it holds the entry (the first head_n), else from global memory. */
__device__ __forceinline__ void mk_load_operands(mk_slot& s, const mk_tensor* tensors,
                                                  mk_u32 n_tensors, const mk_tensor* head,
                                                  mk_u32 head_n, mk_u32 lane)
{
    const mk_u32 operand = lane / 3u, part = lane % 3u;
    if (operand < MK_MAX_TENSORS) {
        const mk_u32 used = s.ins.opcode < MK_OP_COUNT ? mk_op_operands(s.ins.opcode) : 0u;
        const mk_u32 slot = s.ins.tensor[operand];
        mk_u64* to = reinterpret_cast<mk_u64*>(&s.operand[operand]) + part;
        if (((used >> operand) & 1u) && slot < n_tensors) {
            if (slot < head_n)
                *to = reinterpret_cast<const mk_u64*>(&head[slot])[part];
            else
                *to = mk_ld_ca_8(reinterpret_cast<const mk_u64*>(&tensors[slot]) + part);
        }
    }
}

/* Loader warp, at a launch's entry: start copying the first MK_TABLE_HEAD entries of the
 * tensor table into ctl.table_head (16-B pieces: the table is 128-B aligned and at least that
 * long, instr.h), and, where the build holds the paged transpose, their ready words into
 * ctl.ready_head (after the entries: their address needs n_tensors, a load still in flight).
 * Commits one group. */
__device__ __forceinline__ void mk_fetch_table_head(const mk_tensor* tensors, mk_u32 n_tensors,
                                                    mk_u32 lane)
{
    constexpr mk_u32 pieces = MK_TABLE_HEAD * sizeof(mk_tensor) / 16u;
    static_assert(MK_TABLE_HEAD * sizeof(mk_tensor) % 16u == 0, "whole 16-B pieces");
    unsigned char* to = reinterpret_cast<unsigned char*>(mk_ctl().table_head);
    const unsigned char* from = reinterpret_cast<const unsigned char*>(tensors);
    for (mk_u32 i = lane; i < pieces; i += 32u)
        mk_cp_async_16(to + 16u * i, from + 16u * i);
    if (MK_BUILT(1u << MK_OP_TRANSPOSE)) {
        constexpr mk_u32 words = MK_TABLE_HEAD * 4u / 16u;
        static_assert(MK_TABLE_HEAD * 4u % 16u == 0, "whole 16-B pieces of ready words");
        unsigned char* rto = reinterpret_cast<unsigned char*>(mk_ctl().ready_head);
        const unsigned char* rfrom = from + mk_tmap_offset(n_tensors) +
                                     (mk_u64)MK_TMAP_BYTES * n_tensors;
        for (mk_u32 i = lane; i < words; i += 32u)
            mk_cp_async_16(rto + 16u * i, rfrom + 16u * i);
    }
    mk_cp_async_commit();
}

/* Loader warp, at a launch's entry: start copying record 0 (128 B, 8 lanes x 16 B) into slot
 * s. Commits one group. */
__device__ __forceinline__ void mk_fetch_record(mk_slot& s, const mk_instr* rec, mk_u32 lane)
{
    if (rec != nullptr && lane < MK_INSTR_BYTES / 16)
        mk_cp_async_16(reinterpret_cast<unsigned char*>(&s.ins) + 16 * lane,
                       reinterpret_cast<const unsigned char*>(rec) + 16 * lane);
    mk_cp_async_commit();
}

/* Loader warp: a lane's 16 B of a record (lanes 0-7; the others get zeros), a plain load
 * whose value is used one record later (mk_loader, L2). */
__device__ __forceinline__ uint4 mk_record_part(const mk_instr* rec, mk_u32 lane)
{
    return lane < MK_INSTR_BYTES / 16
               ? mk_ld_cg_16(reinterpret_cast<const unsigned char*>(rec) + 16 * lane)
               : make_uint4(0u, 0u, 0u, 0u);
}

/* Loader warp, L2: the record's parts into slot s. */
__device__ __forceinline__ void mk_store_record(mk_slot& s, uint4 part, mk_u32 lane)
{
    if (lane < MK_INSTR_BYTES / 16)
        *reinterpret_cast<uint4*>(reinterpret_cast<unsigned char*>(&s.ins) + 16 * lane) = part;
}


/* One thread (loader lane 0 or compute thread 0): stop this block. Own errors (not MK_ERR_ABORTED) compete for the status record;
 * the winner fills it before raising abort, so the host always sees a complete record. */
__device__ void mk_stop(const mk_params& p, const mk_stop_info& e)
{
    mk_status* st = reinterpret_cast<mk_status*>(p.status);
    if (e.error != MK_ERR_ABORTED) {
        if (atomicCAS(&st->error, 0u, e.error) == 0u) {
            volatile mk_status* v = st;
            v->sm = blockIdx.x;
            v->queue_index = e.queue_index;
            v->opcode = e.opcode;
            v->op_index = e.op_index;
            v->counter = e.counter;
            v->expected = e.expected;
            v->observed = e.observed;
            __threadfence();
        }
        mk_st_release(&st->abort, 1u);
    }
    volatile mk_sm_state* s = reinterpret_cast<mk_sm_state*>(p.sm_state) + blockIdx.x;
    s->queue_index = e.queue_index;
    s->opcode = e.opcode;
    s->op_index = e.op_index;
    s->counter = e.counter;
    s->expected = e.expected;
    s->observed = e.observed;
    s->error = e.error;
}

/* Step L5, loader lane 0: wait until counter - target >= 0 (wrap-safe), bounded by the deadline and
 * by the global abort flag. Returns MK_OK, MK_ERR_TIMEOUT or MK_ERR_ABORTED.
 *
 * Detection latency is on the critical path of every cross-SM hand-off, and a consumer
 * usually waits long (in a chain across SMs its producer is a whole round of SMs behind), so
 * the whole wait is tuned for it, not only its first microsecond:
 *  - one relaxed poll in flight at a time, back to back, and the acquire (fence.acquire, an
 *    L1 invalidation) once, on success. More polls in flight would not help: the acquire
 *    waits for every load the thread has in flight (sync.cuh);
 *  - no sleep: a nanosleep adds its length to the detection. Only a wait older than
 *    MK_WAIT_HOT_NS sleeps a little per poll, to spare L2 when SMs idle for long;
 *  - the abort flag (one word every waiting SM polls) is loaded every MK_WAIT_FLAG_EVERY
 *    polls, in flight together with the poll: the old loop paid a serial round trip for it
 *    on every poll, about half of the hand-off. */
enum { MK_WAIT_HOT_NS = 1000000, MK_WAIT_COLD_SLEEP_NS = 256, MK_WAIT_FLAG_EVERY = 8 };

__device__ __forceinline__ bool mk_reached(mk_u32 v, mk_u32 target)
{
    return (int)(v - target) >= 0;
}

__device__ __forceinline__ mk_u32 mk_wait(const mk_params& p, mk_u32* counter, mk_u32 target,
                                          mk_u32* observed)
{
    mk_u32 v = mk_ld_relaxed(counter);
    if (mk_reached(v, target)) {
        mk_fence_acquire();
        return MK_OK;
    }
    const mk_u64 start = mk_globaltimer();
    const mk_u64 deadline = start + p.timeout_ns >= start ? start + p.timeout_ns : ~0ull;
    const mk_u64 cold = start + MK_WAIT_HOT_NS;
    const mk_u32* abort_flag = &reinterpret_cast<mk_status*>(p.status)->abort;
    for (mk_u32 n = 0;; ++n) {
        const bool check_flag = n % MK_WAIT_FLAG_EVERY == 0;
        const mk_u32 flag = check_flag ? mk_ld_relaxed(abort_flag) : 0u;
        v = mk_ld_relaxed(counter);
        if (mk_reached(v, target)) {
            mk_fence_acquire();
            return MK_OK;
        }
        *observed = v;
        if (flag != 0u)
            return MK_ERR_ABORTED;
        const mk_u64 now = mk_globaltimer();
        if (now > deadline)
            return MK_ERR_TIMEOUT;
        if (now > cold)
            __nanosleep(MK_WAIT_COLD_SLEEP_NS);
    }
}

/* How long the pages may still be missing once every earlier instruction is done before the
 * loader calls it a leak (mk_loader_acquire). */
constexpr mk_u64 MK_LEAK_GRACE_NS = 20000;

/* Step L3, loader lane 0: take the instruction's pages, waiting while the compute warps still
 * hold them (they hand pages back as the running op's page plan frees them). If the compute
 * warps have finished everything before q and the pages stay missing, nobody will ever
 * release them: a leak.
 *
 * "Stay": thread 0 hands pages back (red.release on the mask) and then arrives on empty, and
 * the loader has seen that phase complete while the mask still lacked the pages. In SASS the
 * hand-back is a MEMBAR.CTA and an ATOMS.OR with no result, the arrival a SYNCS.ARRIVE right
 * after it, with nothing between that waits for the atomic. Measured with the streamer held
 * through every streamed instruction's tail (W7-call-mlp1024 back to back,
 * tools/probe_page_leak.py): the pages came up to 352 ns after the phase, 5-35 times a
 * round; reported at once, 4 of 5 megak variants failed per round. So a leak is declared only
 * after MK_LEAK_GRACE_NS of idle. The pages' contents need no grace: the loader takes a page
 * only through the mask's own release / acquire pair (pages.cuh), never through the empty
 * barrier. */
__device__ mk_u32 mk_loader_acquire(mk_control& ctl, mk_slot& s, mk_u32 q, mk_u64 timeout_ns,
                                    mk_u32* observed)
{
    const mk_u32 need = s.ins.pages;
    if (mk_pages_try_acquire(&ctl.free_pages, s.page, need))
        return MK_OK;
    const mk_u64 deadline = mk_deadline(timeout_ns);
    mk_u64 idle_since = 0;
    for (;;) {
        /* sample "all earlier instructions done" before the pages: a release that lands
         * between the two reads is then seen by the retry */
        const bool idle = q == 0 || mk_mbar_try_wait(&ctl.empty[mk_slot_of(q - 1)],
                                                      mk_slot_parity(q - 1));
        if (mk_pages_try_acquire(&ctl.free_pages, s.page, need))
            return MK_OK;
        *observed = (mk_u32)__popc(mk_pages_free_now(&ctl.free_pages));
        const mk_u64 now = mk_globaltimer();
        if (idle) {
            if (idle_since == 0)
                idle_since = now;
            else if (now - idle_since > MK_LEAK_GRACE_NS)
                return MK_ERR_PAGE_LEAK;
        }
        if (now > deadline)
            return MK_ERR_PAGES;   /* the running instruction held them past the deadline */
    }
}

#if MK_WGMMA_ONLY
/* Step L3 of the MK_WGMMA_ONLY kernel (pages.cuh), loader lane 0: the chained ring. The
 * queue's first instruction takes 12 pages as any would and pairs their B pages; every later
 * one runs in the same pages, and none hands them back (released: all of them), so the
 * loader issues an instruction's stages while the one before still computes, as its slots
 * come free (ops/gemm_wgmma.cuh; the protocol: runtime/wgmma_model.py, chained). The pages
 * go back after the queue's last compute barrier (mk_compute). The instruction's first ring
 * position goes to the compute warps in stream_pos. */
__device__ mk_u32 mk_loader_ring_pages(mk_control& ctl, mk_slot& s, mk_u32 q,
                                       mk_u64 timeout_ns, mk_u32* observed)
{
    if (!ctl.wgmma_held) {
        const mk_u32 error = mk_loader_acquire(ctl, s, q, timeout_ns, observed);
        if (error != MK_OK)
            return error;
        mk_wgmma_pair_b_pages(s.page);
        for (mk_u32 i = 0; i < MK_WGMMA_PAGES; ++i)
            ctl.wgmma_page[i] = s.page[i];
        ctl.wgmma_held = 1u;
    } else {
        for (mk_u32 i = 0; i < MK_WGMMA_PAGES; ++i)
            s.page[i] = ctl.wgmma_page[i];
    }
    s.released = (1u << MK_WGMMA_PAGES) - 1u;
    s.stream_pos = ctl.wgmma_pos;
    return MK_OK;
}
#endif

/* Stages of the weight stream record `in` takes (stream.cuh); 0 for every other record. */
__device__ __forceinline__ mk_u32 mk_stream_stages(const mk_instr& in, const mk_params& p,
                                                   mk_packed_b* packed = nullptr)
{
    return MK_BUILT(MK_BODY_GEMM_STREAM) ? mk_gemm_stream_stages(in, p, packed) : 0u;
}

/* Streamer lane 0: wait until the compute warp that reads ring slot `slot`'s previous stage
 * is done with it (phase `parity` of ring_empty). False when the compute role left early
 * (ring_stop) or that warp never came back within `patience` ns: the streamer then stops (a
 * compute warp waiting for a stage that will not come records the timeout itself). The clock
 * (the deadline) is read only once a first try failed: while the ring runs ahead of the k
 * loop the slot is free, and the lane's path per copy sets how fast it refills the ring
 * (batch 64, bound by its lane's ~256 copies an SM: 174 -> 162 us on the H200;
 * benchmarks/ANALYSIS.md, "The streamer's empty wait tries before it reads the clock"). */
__device__ __forceinline__ bool mk_ring_wait_empty(mk_control& ctl, mk_u32 slot, mk_u32 parity,
                                                   mk_u64 patience)
{
    if (mk_mbar_try_wait(&ctl.ring_empty[slot], parity))
        return true;
    const mk_u64 deadline = mk_deadline(patience);
    while (!mk_mbar_try_wait(&ctl.ring_empty[slot], parity)) {
        if (mk_ring_stopped())
            return false;
        if (mk_globaltimer() > deadline) {
            atomicExch(&ctl.ring_stop, 1u);
            return false;
        }
    }
    return true;
}

/* The streamer warp (warp MK_THREADS / 32 + 2; stream.cuh): lane 0 walks the block's queue in
 * order and streams the boxes of every streamed instruction into the ring, as far ahead as
 * the ring's free slots allow, across instruction boundaries and dependency waits; then
 * drains. The other lanes wait at the warp barrier. */
__device__ __noinline__ void mk_streamer(const mk_instr* queue, mk_u32 n, mk_u32 lane)
{
    mk_control& ctl = mk_ctl();
    const mk_params& p = ctl.params;
    if (lane == 0 && p.stream_pages > 0) {
        const mk_u32 R = p.stream_pages;
        const unsigned char* tmaps = mk_tmaps(p);
        const mk_u32 ring0 = mk_smem_addr(mk_ring_page(p, 0));
        const mk_u64 policy = mk_policy_evict_first();
        const mk_u64 patience = mk_patience(p.timeout_ns);
        mk_fence_proxy_async_smem();   /* the ring pages' earlier generic writes, if any */
        mk_u32 pos = 0;
        bool go = true;
        for (mk_u32 q = 0; q < n && go; ++q) {
            const mk_instr& in = queue[q];   /* global: host-written before the invocation */
            mk_packed_b pk;
            const mk_u32 stages = mk_stream_stages(in, p, &pk);
            if (stages == 0)
                continue;
            /* packed != 0: a constant B packed for the stream, each stage one 1-D bulk copy
             * of its page, the record's pages one run from here (whole 16 KiB runs of DRAM
             * instead of a box's 64- or 128-B row segments: 3.78 against 3.11-3.55 TB/s,
             * benchmarks/ANALYSIS.md "The layer boundary") */
            const mk_u64 packed = pk.ptr != 0u ? mk_packed_first(in, pk) : 0u;
            const void* tmap = tmaps + (mk_u64)MK_TMAP_BYTES * in.tensor[MK_ARG_B];
            const int c0 = in.col0, r0 = in.k0;
            /* a narrow band's stage: two boxes of 32 columns, k-rows stacked, in the page's
             * halves, both completing their bytes on the slot's full barrier; the second only
             * where it starts inside the record's k range (its reader skips it otherwise,
             * gemm_stream.cuh: no copy is asked to start past the tensor) */
            const bool narrow = mk_stream_narrow(in);
            const mk_u32 stage_rows = mk_stream_stage_rows(in);
            for (mk_u32 s = 0; s < stages; ++s, ++pos) {
                const mk_u32 slot = pos % R;
                if (pos >= R && !mk_ring_wait_empty(ctl, slot, ((pos / R) - 1u) & 1u, patience)) {
                    go = false;
                    break;
                }
                mk_stream_hold_wait(ctl);   /* stream.cuh, "The hold" */
                const mk_u32 dst = ring0 + slot * (mk_u32)MK_PAGE_BYTES;
                const int k = r0 + (int)(s * stage_rows);
                const bool second = narrow && mk_stream_second_box(in, s);
                mk_issued_publish(&ctl.ring_issued[slot], pos);   /* stream.cuh */
                const mk_u32 bytes = narrow && !second ? MK_PAGE_BYTES / 2 : MK_PAGE_BYTES;
                mk_mbar_expect_tx(&ctl.ring_full[slot], bytes);
                if (packed != 0u) {
                    mk_bulk_load(dst, packed + (mk_u64)s * MK_PAGE_BYTES, bytes,
                                 &ctl.ring_full[slot], policy);
                } else {
                    mk_tma_load_2d(dst, tmap, c0, k, &ctl.ring_full[slot], policy);
                    if (second)
                        mk_tma_load_2d(dst + MK_PAGE_BYTES / 2, tmap, c0, k + MK_STREAM_BOX_ROWS,
                                       &ctl.ring_full[slot], policy);
                }
            }
        }
        /* drain: the last stage issued into each slot has landed (a copy always completes) */
        const mk_u64 deadline = mk_deadline(patience);
        for (mk_u32 i = pos > R ? pos - R : 0u; i < pos; ++i)
            while (!mk_mbar_try_wait(&ctl.ring_full[i % R], (i / R) & 1u) &&
                   mk_globaltimer() <= deadline) {
            }
    }
    __syncwarp();
}

/* The loader warp (warp MK_THREADS / 32; 32 lanes, few registers): runs up to MK_SLOTS - 1
 * instructions ahead of the compute warps.
 *
 *   L1. wait until slot q % MK_SLOTS is empty (the compute warps finished q - MK_SLOTS),
 *       every lane itself: each lane's own acquire of the phase orders the compute threads'
 *       reads of the slot before its writes of the next record (see "The slot's empty
 *       barrier")
 *   L2. fetch record q and its operand descriptors; validate (lane 0)
 *   L3. acquire its pages (waiting for the ones the records before it still hold)
 *   L4. early preload: operand B of the op's first stages, when B has no producer
 *   L5. wait for its counters (relaxed polls, then fence.acquire)
 *   L6. late preload: the rest of the first stages
 *   L7. once its cp.async copies have landed, lane 0 arrives on full[q % MK_SLOTS] (bulk copies
 *       complete on the op's own barriers: not waited for here)
 *   L8. what it still produces for q while q runs (mk_op_preload_late: the wgmma GEMM's
 *       stages past the first four), then on to q + 1
 *
 * An error stops the loader after L7 with slot.stop set: the compute warps finish what they
 * run, read the flag and leave. Lane 0 has written sm_state (and status) through mk_stop. */
/* first_fetched: record 0 and the table's first MK_TABLE_HEAD entries were requested at the
 * launch's entry (their cp.async groups are this lane's oldest) and the head holds the
 * table's; else (the resident kernel) no entry is in the head: every descriptor from global
 * memory. */
__device__ __noinline__ void mk_loader(const mk_instr* queue, mk_u32 n, mk_u32 lane,
                                       bool first_fetched)
{
    /* 56 registers: everything with a fixed shared address is recomputed rather than kept,
     * and the error details live in shared memory (lane 0 only) */
    mk_control& ctl = mk_ctl();
    const mk_params& p = ctl.params;
    mk_stop_info& e = ctl.loader_stop;
    mk_u32 stream_pos = 0;   /* lane 0: the weight stream's next stage position */
    const mk_u32 head_n = first_fetched ? (mk_u32)MK_TABLE_HEAD : 0u;
    if (lane == 0)   /* the ready words came with the head where the build fetched them */
        ctl.ready_head_n = MK_BUILT(1u << MK_OP_TRANSPOSE) ? head_n : 0u;
    /* Record q + 1 is loaded at L2 of q: its round trip (0.4-2 us under a saturated HBM) is
     * spent while q is prepared, not between the two. Loaded at L6 instead, after q's copies,
     * W4 ran 656 us against 616 (benchmarks/results/transpose-head/ab-head.log). The queue does
     * not change while an invocation runs. */
    uint4 next = n > 0 && !first_fetched ? mk_record_part(queue, lane) : make_uint4(0, 0, 0, 0);
    for (mk_u32 q = 0; q < n; ++q) {
        mk_slot& s = ctl.slot[mk_slot_of(q)];
        mk_u32 error = MK_OK;
        /* L1 (past the deadline: MK_ERR_TIMEOUT with expected 0, which no counter wait has:
         * the host reports it as a wait for this SM's own instruction) */
        if (q >= MK_SLOTS && !mk_mbar_wait(&ctl.empty[mk_slot_of(q)], mk_slot_parity(q - MK_SLOTS),
                                           mk_deadline(p.timeout_ns)))
            error = MK_ERR_TIMEOUT;
        error = __shfl_sync(0xffffffffu, error, 0);
        /* L2 */
        if (error == MK_OK) {
            if (q > 0 || !first_fetched)
                mk_store_record(s, next, lane);
            else
                mk_cp_async_wait_all();   /* record 0 and the head, requested at the entry */
            if (q + 1 < n)
                next = mk_record_part(queue + q + 1, lane);
            __syncwarp();   /* every lane's part of the record (and the head) seen by the warp */
            mk_load_operands(s, reinterpret_cast<const mk_tensor*>(p.tensors), p.n_tensors,
                             ctl.table_head, head_n, lane);
            __syncwarp();
        }
        if (lane == 0) {
#if MK_TRACE
            s.t_loader[0] = mk_globaltimer();
#endif
            e = {MK_OK, q, s.ins.opcode, s.ins.op_index, 0, 0, 0};
            s.preloaded = 0;
            /* test hook: the last acquired page is never handed back, by any release */
            s.released = (s.ins.flags & MK_FLAG_DEBUG_LEAK_PAGE) && s.ins.pages > 0 &&
                         s.ins.pages <= 32 ? 1u << (s.ins.pages - 1) : 0u;
            s.stop = 0;
            if (error == MK_OK)
                error = mk_validate(s.ins, p, &e.expected, &e.observed);
            if (error == MK_OK && p.debug && !mk_op_check_operands(s.ins, s.operand))
                error = MK_ERR_BAD_DESCRIPTOR;
            /* the streamer counts the same stages on the same record bytes (stream.cuh).
             * Counted before L3: the count reads the tensor map's entry from global memory,
             * and a streamed GEMM's pages come back only at the end of the one before it,
             * so the read's latency is spent while the pages are awaited, not after. */
            s.stream_pos = stream_pos;
            const mk_u32 streamed = error == MK_OK ? mk_stream_stages(s.ins, p) : 0u;
            /* L3 */
            if (error == MK_OK) {
#if MK_WGMMA_ONLY
                /* a reduce takes no page: the ring stands still across it */
                error = s.ins.opcode == MK_OP_GEMM
                            ? mk_loader_ring_pages(ctl, s, q, p.timeout_ns, &e.observed)
                            : mk_loader_acquire(ctl, s, q, p.timeout_ns, &e.observed);
#else
                error = mk_loader_acquire(ctl, s, q, p.timeout_ns, &e.observed);
#endif
                if (error != MK_OK)
                    e.expected = s.ins.pages;   /* observed: the pages free at the end */
            }
            s.stream_stages = error == MK_OK ? streamed : 0u;
            stream_pos += s.stream_stages;
#if MK_TRACE
            s.t_loader[2] = mk_globaltimer();
            s.pages_in_use = (mk_u32)__popc(mk_all_pages_mask(p.n_pages - p.stream_pages) &
                                            ~mk_pages_free_now(&ctl.free_pages));
#endif
        }
        error = __shfl_sync(0xffffffffu, error, 0);
        __syncwarp();   /* the page table and the record's checks are lane 0's */
        const mk_pages pages = {mk_page_array(mk_smem), s.page, 0u, nullptr, nullptr};
        const mk_u32 stages = error == MK_OK ? mk_op_preload_stages(s.ins, s.operand) : 0u;
        const bool b_early = (s.ins.flags & MK_FLAG_B_READY) != 0;
        /* L4 */
        mk_u32 cp_async = 0;   /* the preloads issued cp.async copies: L7 waits for them */
        if (stages > 0 && b_early)
            cp_async |= mk_op_preload(s.ins, s.operand, pages, lane, MK_PRELOAD_B, q);
        /* L5, all 32 lanes: one load instruction of the warp to one address is one request
         * whose value every lane sees, so the loop stays converged and no lane has to be
         * woken from a warp barrier after the wait (that cost ~0.2 us on the dependent path
         * when lane 0 polled alone). Target is this run's share, (epoch + 1) * t (u32,
         * wraps); t = 0 means "nothing to wait for" (skipped: the signed test would misread a
         * counter past 2^31 as behind). */
        for (mk_u32 i = 0; error == MK_OK && i < s.ins.n_waits; ++i) {
            const mk_u32 t = s.ins.wait_target[i];
            if (t == 0)
                continue;
            const mk_u32 c = s.ins.wait_counter[i];
            const mk_u32 target = (p.epoch + 1u) * t;
            mk_u32 seen = 0;
            error = mk_wait(p, reinterpret_cast<mk_u32*>(p.counters) + c, target, &seen);
            if (error != MK_OK && lane == 0) {
                e.counter = c;
                e.expected = target;
                e.observed = seen;
            }
        }
#if MK_TRACE
        if (lane == 0)
            s.t_loader[1] = mk_globaltimer();
#endif
        error = __shfl_sync(0xffffffffu, error, 0);   /* one verdict, lane 0's */
        /* L6 */
        if (stages > 0 && error == MK_OK)
            cp_async |= mk_op_preload(s.ins, s.operand, pages, lane,
                                      b_early ? (mk_u32)MK_PRELOAD_REST
                                              : (mk_u32)(MK_PRELOAD_B | MK_PRELOAD_REST), q);
        if (lane == 0) {
            s.preloaded = stages;
            if (error != MK_OK) {
                e.error = error;
                mk_stop(p, e);
                s.stop = 1;
            }
        }
        /* L7: the cp.async copies have landed (each lane waits for its own; the warp barrier
         * orders them before lane 0's arrive, a release the compute warps acquire). One
         * arrival: a per-lane arrive (or cp.async.mbarrier.arrive per lane) costs 32 serialised
         * shared atomics on the dependent path. Only where the preloads issued cp.async: TMA
         * copies complete on the op's own barriers, which its compute threads wait on. */
        if (cp_async)
            mk_cp_async_wait_all();
        __syncwarp();
        if (lane == 0)
            mk_mbar_arrive(&ctl.full[mk_slot_of(q)]);
        if (error != MK_OK)
            break;
        /* L8: what the loader still produces while the op runs (the wgmma GEMM's stages) */
        if (stages > 0) {
            error = mk_op_preload_late(s.ins, s.operand, pages, lane);
            if (error != MK_OK) {
                if (lane == 0) {
                    e.error = error;
                    mk_stop(p, e);
                }
                break;
            }
        }
    }
    mk_cp_async_wait_all();   /* no copy may land after the block is gone */
    mk_op_preload_drain(lane);
}

/* C4, after the compute barrier: thread 0 signals the counters (fence.release + red per
 * counter), releases the pages the op still holds, writes the trace event and hands the slot
 * back. */
__device__ __forceinline__ void mk_compute_signal(mk_u32 q)
{
    mk_control& ctl = mk_ctl();
    const mk_params& p = ctl.params;
    mk_slot& s = ctl.slot[mk_slot_of(q)];
#if MK_TRACE
    if (ctl.trace_t[MK_T_LOADED] == 0)
        ctl.trace_t[MK_T_LOADED] = ctl.trace_t[MK_T_FETCH];
    if (ctl.trace_t[MK_T_COMPUTED] == 0)
        ctl.trace_t[MK_T_COMPUTED] = mk_globaltimer();
#endif
    /* Signal first (consumers on other SMs wait for it; the pages are local): the barrier
     * ordered the block's writes before this thread; the fence makes them visible at gpu
     * scope before the counters move (one MEMBAR for all). */
    const mk_u32 n_signals = s.ins.n_signals;
    if (n_signals > 0)
        mk_fence_release();
    if (s.stream_stages > 0)   /* it read the ring, so it raised the hold (stream.cuh) */
        mk_stream_hold(ctl, 0u);   /* the fence has passed: the streamer goes on */
#if MK_TRACE
    /* stored: results visible, counters not yet moved, so no consumer's "waited" can ever
     * read an earlier clock than its producer's "stored" */
    const mk_u64 t_stored = mk_globaltimer();
#endif
    for (mk_u32 i = 0; i < n_signals; ++i)
        mk_red_relaxed_add(reinterpret_cast<mk_u32*>(p.counters) + s.ins.signal_counter[i], 1u);
    /* release what the op still holds */
    const mk_pages pages = {mk_page_array(mk_smem), s.page, 0u, &s.released, &ctl.free_pages};
    pages.release(0, s.ins.pages);
#if MK_TRACE
    mk_trace_event* ev = reinterpret_cast<mk_trace_event*>(p.trace) + ctl.q_begin + q;
    ev->queue_index = q;
    ev->sm = (mk_u16)blockIdx.x;
    ev->slot = (mk_u16)mk_slot_of(q);
    ev->opcode = s.ins.opcode;
    ev->pages_in_use = (mk_u16)s.pages_in_use;
    ev->op_index = s.ins.op_index;
    ev->t[MK_T_FETCH] = s.t_loader[0];
    ev->t[MK_T_WAITED] = s.t_loader[1];
    ev->t[MK_T_ACQUIRED] = s.t_loader[2];
    ev->t[MK_T_LOADED] = ctl.trace_t[MK_T_LOADED];
    ev->t[MK_T_COMPUTED] = ctl.trace_t[MK_T_COMPUTED];
    ev->t[MK_T_STORED] = t_stored;
#endif
    mk_mbar_arrive(&ctl.empty[mk_slot_of(q)]);
}

/* The compute warps (threads 0 .. MK_THREADS-1), per instruction q:
 *   C1. wait for full[q % MK_SLOTS] (all 256 threads: each acquires the slot and the preloads)
 *   C2. run the op; it hands pages back early where its page plan says so
 *   C3. compute barrier: every thread's global writes done, pages no longer read
 *   C4. thread 0: signal, release the remaining pages, arrive on empty[q % MK_SLOTS]; every
 *       other compute thread arrives on it right after the barrier (the phase completes
 *       with thread 0's arrival, the last of its work)
 * A function of its own, called after setmaxnreg.inc: ptxas then allocates it (like the op
 * bodies) with the compute warps' register budget instead of the entry's 168. Inlined into the
 * entry in the MK_WGMMA_ONLY variant, with the wgmma body (pages.cuh). */
#if MK_WGMMA_ONLY
__device__ __forceinline__ void mk_compute()
#else
__device__ __noinline__ void mk_compute()
#endif
{
    mk_control& ctl = mk_ctl();
    const mk_params& p = ctl.params;
    const mk_u32 tid = threadIdx.x, n = ctl.n;
    for (mk_u32 q = 0; q < n; ++q) {
        mk_slot& s = ctl.slot[mk_slot_of(q)];
        /* C1. The loader's waits are bounded, so this one only guards against a lost loader:
         * three of its deadlines (slot, pages, counters) plus a margin. */
        const mk_u64 deadline = mk_deadline(mk_patience(p.timeout_ns));
        const bool ready = mk_mbar_wait(&ctl.full[mk_slot_of(q)], mk_slot_parity(q), deadline);
        if (!ready || s.stop) {
            if (tid == 0) {
                mk_bulk_wait_written();   /* its ops' bulk stores (see the end below) */
                atomicExch(&ctl.ring_stop, 1u);   /* the streamer stops and drains */
                if (!ready) {
                    mk_stop_info e = {MK_ERR_TIMEOUT, q, 0, 0, 0, 0, 0};
                    mk_stop(p, e);
                }
            }
            return;   /* stopped: the loader (or thread 0) has written sm_state and status */
        }
#if MK_TRACE
        if (tid == 0) {
            ctl.trace_t[MK_T_FETCH] = mk_globaltimer();   /* here: when the op starts */
            ctl.trace_t[MK_T_LOADED] = 0;     /* the op may mark these; else defaults */
            ctl.trace_t[MK_T_COMPUTED] = 0;
        }
#endif
        /* C2 */
        const mk_pages pages = {mk_page_array(mk_smem), s.page, s.preloaded, &s.released,
                                &ctl.free_pages, s.stream_pos, s.stream_stages};
        mk_op_run(s.ins, s.operand, pages);
        /* C3 */
        mk_compute_sync();
        if (*reinterpret_cast<volatile mk_u32*>(&ctl.stream_error) != 0u ||
            *reinterpret_cast<volatile mk_u32*>(&ctl.op_stop.error) != (mk_u32)MK_OK) {
            /* a ring wait of the op passed its deadline (the op raised ring_stop), or a poll
             * of a flagged word failed (flag.cuh: its details are in op_stop) */
            if (tid == 0) {
                mk_bulk_wait_written();
                mk_stop_info e = ctl.op_stop;
                if (e.error == MK_OK)
                    e = {MK_ERR_TIMEOUT, 0, 0, 0, 0, 0, 0};
                e.queue_index = q;
                e.opcode = s.ins.opcode;
                e.op_index = s.ins.op_index;
                atomicExch(&ctl.ring_stop, 1u);   /* the streamer stops and drains */
                mk_stop(p, e);
            }
            return;
        }
        /* C4 */
        if (tid == 0)
            mk_compute_signal(q);
        else
            mk_mbar_arrive(&ctl.empty[mk_slot_of(q)]);
    }
    if (tid == 0) {
        /* An op may leave its TMA stores in flight past its end where no counter publishes
         * them (ops/transpose.cuh): thread 0 issued them, and waits for their global writes
         * here, before the block reports its invocation done (finished_blocks, sm_state; a
         * resident request's completion) on every path out. */
        mk_bulk_wait_written();
#if MK_WGMMA_ONLY
        /* the chained ring's pages (mk_loader_ring_pages): every stage issued was waited
         * for, so no copy is in flight, and no MMA reads them after the last barrier */
        if (ctl.wgmma_held) {
            mk_u32 mask = 0;
            for (mk_u32 i = 0; i < MK_WGMMA_PAGES; ++i)
                mask |= 1u << ctl.wgmma_page[i];
            mk_pages_give_back(&ctl.free_pages, mask);
            ctl.wgmma_held = 0;
        }
#endif
        /* A leak is reported against the queue's last instruction, as the simulator does. */
        const mk_u32 free_now = mk_pages_free_now(&ctl.free_pages);
        if (p.debug && free_now != mk_all_pages_mask(p.n_pages - p.stream_pages)) {
            const mk_instr& last = ctl.slot[mk_slot_of(n - 1)].ins;
            mk_stop_info e = {MK_ERR_PAGE_LEAK, n - 1, last.opcode, last.op_index, 0,
                              mk_all_pages_mask(p.n_pages - p.stream_pages), free_now};
            mk_stop(p, e);
            return;
        }
        atomicAdd(&reinterpret_cast<mk_status*>(p.status)->finished_blocks, 1u);
        volatile mk_sm_state* st = reinterpret_cast<mk_sm_state*>(p.sm_state) + blockIdx.x;
        st->queue_index = n;
        st->opcode = 0;
        st->op_index = 0;
        st->counter = 0;
        st->expected = 0;
        st->observed = 0;
        st->error = MK_OK;
    }
}

/* Whether block b takes part in an invocation: block 0 always (it closes an invocation with
 * nothing to run), any other block of the program's grid only with a non-empty queue; the rest
 * leave at once. mk_params.n_active counts them (the host: executor.active_blocks). */
__device__ __forceinline__ bool mk_block_active(mk_u32 b, mk_u32 n_sm, mk_u32 q_begin,
                                                mk_u32 q_end)
{
    return b < n_sm && (b == 0u || q_end != q_begin);
}

/* The end of one invocation, once per active block, by one thread after both of the block's
 * roles are done (the join barrier): the last active block to get here closes the invocation.
 *
 * Ordering. Each block's writes (outputs, status, sm_state) happen before its fence, which
 * happens before its relaxed add to run_state->exited (release pattern). The last block's
 * add reads the value every other block's add wrote (one RMW chain), and its fence after the
 * add orders everything it then reads after all of those writes (acquire pattern). So the last
 * block sees the whole invocation's status record. It then:
 *   - on an error (or blocks that did not finish: the host's watchdog abort), copies the status
 *     and every SM's state into the mapped host view if no unread error is held there, counts
 *     the failure, zeroes the counters and restarts at epoch 0;
 *   - on success, moves to the next epoch, zeroing the counters first where the next epoch's
 *     targets, (epoch + 1) * max_target, would pass 2^31 (the signed wait test);
 *   - stores this invocation's stamp, whatever the outcome (flag.cuh: a stamp is never
 *     reused, so no word a failed invocation left can pass for a later one's);
 *   - resets the device status record for the next invocation;
 *   - after a system-scope fence, raises host_view->ticket_done to its ticket: a host that
 *     sees the ticket sees everything above. The next invocation of the program starts after
 *     this kernel ends (stream order, or one grid per GPU for a cooperative launch that needs
 *     every SM), so it reads the advanced run state and a clean status;
 *   - in the resident kernel (res != null), last, marks request `request` closed (release):
 *     the relay publishes the next request only after reading that, so the next invocation
 *     reads the advanced run state and a clean status there too.
 * Nothing here is per launch on the host side: graph replays advance the state the same way. */
__device__ void mk_finish_invocation(const mk_params& p, mk_u32 ticket, mk_resident_state* res,
                                     mk_u32 request)
{
    mk_run_state* rs = reinterpret_cast<mk_run_state*>(p.run_state);
    /* One active block (a one-instruction graph) is the last by itself: what it and its
     * loader wrote is ordered before this thread by the join barrier. */
    if (p.n_active > 1u) {
        mk_fence_release();     /* + the strong add: a release pattern (sync.cuh) */
        if (atomicAdd(&rs->exited, 1u) != p.n_active - 1u)
            return;
        mk_fence_acquire();     /* the adds are one release sequence: every block's writes */
    }
    volatile mk_status* st = reinterpret_cast<mk_status*>(p.status);
    volatile mk_host_view* hv = reinterpret_cast<mk_host_view*>(p.host_view);
    volatile mk_u32* done = &rs->ticket_done;
    /* three independent reads, in flight together (each is an L2 round trip) */
    const mk_u32 status_error = st->error, finished = st->finished_blocks, done_before = *done;
    mk_u32 error = status_error;
    if (error == MK_OK && finished != p.n_active)
        error = MK_ERR_ABORTED;    /* stopped from outside (the host's watchdog) */
    bool zero = error != MK_OK;
    mk_u32 epoch = 0;
    if (!zero) {
        epoch = p.epoch + 1u;
        if ((mk_u64)(epoch + 1u) * (mk_u64)(p.max_target > 0 ? p.max_target : 1u) > (1ull << 31)) {
            zero = true;
            epoch = 0;
        }
    }
    if (error != MK_OK) {
        if (hv->error_ticket == 0u) {
            hv->status.abort = st->abort;
            hv->status.error = error;
            hv->status.sm = st->sm;
            hv->status.queue_index = st->queue_index;
            hv->status.opcode = st->opcode;
            hv->status.op_index = st->op_index;
            hv->status.counter = st->counter;
            hv->status.expected = st->expected;
            hv->status.observed = st->observed;
            hv->status.finished_blocks = st->finished_blocks;
            const volatile mk_u32* from = reinterpret_cast<const mk_u32*>(p.sm_state);
            volatile mk_u32* to = reinterpret_cast<mk_u32*>(p.host_sm_state);
            for (mk_u32 i = 0; i < p.n_sm * (mk_u32)(sizeof(mk_sm_state) / 4); ++i)
                to[i] = from[i];
            __threadfence_system();
            hv->error_ticket = ticket;
        }
        hv->errors = hv->errors + 1u;
    }
    if (zero) {
        volatile mk_u32* counters = reinterpret_cast<mk_u32*>(p.counters);
        for (mk_u32 c = 0; c < p.n_counters; ++c)
            counters[c] = 0u;
    }
    st->abort = 0u;
    st->error = MK_OK;
    st->finished_blocks = 0u;
    rs->epoch = epoch;
    rs->stamp = p.stamp;   /* advanced whatever the outcome: a stamp is never reused */
    rs->exited = 0u;
    /* a replayed graph carries an older ticket: keep the max */
    const mk_u32 newest = (int)(ticket - done_before) > 0 ? ticket : done_before;
    *done = newest;
    __threadfence_system();
    hv->ticket_done = newest;
    if (res != nullptr)
        mk_st_release_u64(&res->closed, ((mk_u64)(error != MK_OK) << 32) | request);
}

/* The roles of a block meet here: warps 0-7, the loader warp and the streamer warp (warps 9
 * and 11 left after setmaxnreg and take no part). Every call site is reached by all 320
 * threads. */
enum { MK_JOIN_BARRIER = 2, MK_JOIN_THREADS = MK_THREADS + 64,
       MK_LOADER_WARP = MK_THREADS / 32, MK_STREAMER_WARP = MK_THREADS / 32 + 2 };

__device__ __forceinline__ void mk_join_roles()
{
    asm volatile("bar.sync %0, %1;" : : "n"((int)MK_JOIN_BARRIER), "n"((int)MK_JOIN_THREADS) : "memory");
}

/* Thread 0: the block's set-up for one invocation of the program now in ctl.params, on
 * `tensors`, at `epoch` (the program's run state): its queue, a fresh page allocator and slot
 * barriers, and the check that the program's pages fit this launch's shared memory. False
 * (after mk_stop) when the block cannot run it. */
__device__ bool mk_begin_invocation(const mk_tensor* tensors, uint2 run, mk_u32 ticket,
                                    mk_u32 q_begin, mk_u32 q_end)
{
    mk_control& ctl = mk_ctl();
    ctl.params.tensors = reinterpret_cast<mk_u64>(tensors);
    ctl.params.epoch = run.x;
    ctl.params.stamp = mk_next_stamp(run.y);
    ctl.ticket = ticket;
    ctl.n = q_end >= q_begin ? q_end - q_begin : 0u;
    ctl.q_begin = q_begin;
    const mk_u32 n_pages = ctl.params.n_pages;
    const mk_u32 ring = ctl.params.stream_pages;
    const bool ring_ok = ring <= MK_STREAM_MAX_RING && ring < n_pages;
    ctl.free_pages = ring_ok ? mk_all_pages_mask(n_pages - ring) : 0u;
    for (int i = 0; i < MK_SLOTS; ++i) {
        mk_mbar_init(&ctl.full[i], 1u);         /* loader lane 0 */
        mk_mbar_init(&ctl.empty[i], (mk_u32)MK_THREADS);   /* every compute thread */
    }
    mk_ring_init(ctl, ctl.ring_inited, ring_ok ? ring : 0u);
    ctl.stream_error = 0;
    ctl.op_stop.error = MK_OK;
    const unsigned char* page_array = mk_page_array(mk_smem);
    const mk_u64 need = (mk_u64)(page_array - mk_smem) + (mk_u64)n_pages * MK_PAGE_BYTES;
    mk_stop_info e = {MK_OK, 0, 0, 0, 0, 0, 0};
    if (q_end < q_begin) {
        e.error = MK_ERR_BAD_DESCRIPTOR;
    } else if (n_pages > MK_MAX_PAGES || need > mk_dynamic_smem_size() || !ring_ok) {
        e.error = MK_ERR_PAGES;
        e.expected = (mk_u32)need;
        e.observed = mk_dynamic_smem_size();
    }
    if (e.error != MK_OK) {
        mk_stop(ctl.params, e);
        return false;
    }
    return true;
}

/* The epoch of the program's next invocation and the stamp of its last one (flag.cuh), both
 * loads in flight together: its previous invocation's last block wrote them before that
 * kernel ended (or, resident, before it closed the request the relay waited for). */
__device__ __forceinline__ uint2 mk_run_of_state(const mk_run_state* run_state)
{
    const volatile mk_run_state* rs = run_state;
    return make_uint2(rs->epoch, rs->stamp);
}

enum { MK_LOADER_REGS = 56, MK_COMPUTE_REGS = 224 };
static_assert(MK_BLOCK_THREADS == MK_THREADS + 128, "the loader is one warpgroup");
static_assert(MK_LOADER_REGS * 128 + MK_COMPUTE_REGS * MK_THREADS <= 65536,
              "setmaxnreg: the register file holds both roles");

/* setmaxnreg hands the loader warpgroup's registers to the compute warps: the GEMM bodies
 * need ~200 per thread, the loader a few dozen. ptxas allocates a function for the count
 * set on the path that calls it, so each role's calls sit inside its own branch after its
 * own setmaxnreg (a call reached from both paths would get the loader's 56 registers). */
#define MK_LOADER_SETMAXNREG() \
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" : : "n"((int)MK_LOADER_REGS))
#define MK_COMPUTE_SETMAXNREG() \
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" : : "n"((int)MK_COMPUTE_REGS))

/* params: the program's parameter block; tensors: this launch's tensor table (megak's own, or
 * one with caller-owned memory bound in); ticket: the host's number for this launch, written
 * back into the host view when the invocation ends; queue_start, run_state: params->queue_start
 * and params->run_state again, so that the set-up need not read params first. */
extern "C" __global__ void __launch_bounds__(MK_BLOCK_THREADS, 1)
megakernel(const mk_params* params, const mk_tensor* tensors, mk_u32 ticket,
           const mk_u32* queue_start, const mk_run_state* run_state)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const mk_u32 sm = blockIdx.x;
    /* The block's set-up reads its queue bounds, the params and the run state: three loads
     * with no address in common, so in flight together (one round trip, where reaching the
     * bounds and the run state through params->queue_start and params->run_state took three
     * dependent ones). They are the same buffers as params' (host-written before the launch,
     * never moved). The host launches exactly params->n_sm blocks, so queue_start[sm + 1]
     * exists; the check below stays for a grid that disagrees. */
    const mk_u32 n_sm = params->n_sm;
    const mk_u32 q_begin = queue_start[sm], q_end = queue_start[sm + 1];
    const bool loader = warp == MK_LOADER_WARP;
    const mk_u64 instrs = loader ? params->instrs : 0ull;   /* in flight with the rest */
    const mk_u32 n_tensors = loader ? params->n_tensors : 0u;
    uint2 run = make_uint2(0u, 0u);
    if (tid == 0) {
        ctl.params = *params;
        run = mk_run_of_state(run_state);
    }
    if (sm >= n_sm)
        return;   /* more blocks than queues: nothing to run, nowhere to report */
    if (!mk_block_active(sm, n_sm, q_begin, q_end))
        return;   /* an empty queue: this block takes no part in the invocation */

    /* The loader warp requests its first record and the head of the tensor table now, beside
     * thread 0's set-up, so that their round trip overlaps the set-up instead of following it
     * and the first record's operands need none of their own (mk_loader waits for both
     * groups: first_fetched). The set-up writes neither slot 0's record nor the head. */
    if (loader) {
        mk_fetch_record(ctl.slot[0],
                        q_end > q_begin ? reinterpret_cast<const mk_instr*>(instrs) + q_begin
                                        : nullptr, lane);
        mk_fetch_table_head(tensors, n_tensors, lane);
    }

    /* 0. Set up. The stop decision travels by __syncthreads_or (the last use of barrier 0:
     * warps leave after it). */
    int stop = 0;
    if (tid == 0) {
        ctl.ring_inited = 0;   /* fresh shared memory: no ring barrier to invalidate */
        ctl.wgmma_inited = 0;  /* nor a wgmma GEMM's (ops/gemm_wgmma.cuh) */
        ctl.transpose_inited = 0;   /* nor a paged transpose's (ops/transpose.cuh) */
        ctl.wgmma_held = 0;    /* MK_WGMMA_ONLY's chained ring starts empty, at position 0 */
        ctl.wgmma_pos = 0;
        stop = !mk_begin_invocation(tensors, run, ticket, q_begin, q_end);
    }
    if (__syncthreads_or(stop)) {
        if (loader)
            mk_cp_async_wait_all();   /* no copy may land after the block is gone */
        if (tid == 0)
            mk_finish_invocation(ctl.params, ticket, nullptr, 0u);
        return;
    }
    if (warp >= MK_THREADS / 32) {
        MK_LOADER_SETMAXNREG();
        const mk_instr* queue = reinterpret_cast<const mk_instr*>(ctl.params.instrs) + ctl.q_begin;
        if (loader)
            mk_loader(queue, ctl.n, lane, true);
        else if (warp == MK_STREAMER_WARP)
            mk_streamer(queue, ctl.n, lane);
        else
            return;
    } else {
        MK_COMPUTE_SETMAXNREG();
        mk_compute();
    }
    /* one barrier instruction for both roles (an aligned barrier reached from two code
     * sites is a divergence to synccheck) */
    mk_join_roles();
    if (tid == 0)
        mk_finish_invocation(ctl.params, ctl.ticket, nullptr, 0u);
}

/* (the MK_WGMMA_ONLY variant holds the entry megakernel only, pages.cuh; a build of some
 * bodies, instr.h's MK_BODIES, holds the resident kernel only with MK_RESIDENT: a launched
 * program's build need not compile a second copy of the interpreter) */
#if !MK_WGMMA_ONLY && MK_RESIDENT

/* ---- the resident kernel -------------------------------------------------------------------
 *
 * Launched once (cooperatively, one block per SM), it serves requests: each one invocation of
 * a program, as megakernel() would run it, in the order the host numbered them.
 *
 *   host        ring[s % MK_RING_SLOTS] = {params, tensors, queue_start, run_state, n_sm,
 *               (ticket, seq = s)}, each word tagged with s, (ticket, seq) last
 *   relay       the last block, warp 9 (mk_relay): takes request s from the ring once
 *               request s - 1 is closed, republishes it in device memory (mirror, go = s)
 *   every block thread 0 waits for go to reach s, reads the mirror (mk_take_request);
 *               the block runs the invocation if it is active in it, else skips it
 *   last block  of the invocation: mk_finish_invocation, then closed = s
 *
 * One decider, the relay, makes every block see the same sequence of requests and leave at
 * the same one: a close request (params 0), the idle deadline, a failed request, or a request
 * that did not end within wait_ns all become a "leave" entry in the mirror. 132 blocks each
 * polling the host ring over PCIe took 530 us per request (tools/probe_resident.py); one
 * poller and an L2 hop, 4.7 us.
 *
 * Ordering:
 *   - host -> relay: the host writes an entry's six words, (ticket, seq) last, each tagged
 *     with its request (instr.h, mk_request). The relay's warp loads all six in one warp
 *     load (lane i word i), in no guaranteed order, and takes the entry only when every
 *     word names request s: a word read before the host rewrote it names s - MK_RING_SLOTS
 *     (or 0 in a fresh ring), so the relay never mixes two requests' words and polls again
 *     instead. Every lane's load is ld.acquire.sys, lane 0's that of the params word, which
 *     the host writes first: what the host wrote before posting (the tensor table, a
 *     program's params) happens before lane 0's later reads and writes (the mirror, go)
 *     and, through go, the blocks'.
 *   - relay -> blocks: the mirror entry's writes, then st.release go; a block's relaxed poll
 *     of go reaching s, then fence.acquire (which also invalidates its SM's L1: tensor
 *     tables and params the host wrote since are read fresh), then the entry. The entry's
 *     queue_start, run_state and n_sm are the params block's own (the host posts them from
 *     the program that owns it), so a block reads the same buffers a launch does, in one
 *     round trip with the params instead of after them.
 *   - mirror reuse: a block writes seen[b] = s (release) after reading entry s; the relay
 *     overwrites slot s % MK_MIRROR_SLOTS only once every block's seen has reached
 *     s - MK_MIRROR_SLOTS (relaxed reads, then fence.acquire).
 *   - invocation order: request s - 1's last block closes it (mk_finish_invocation: run
 *     state advanced, status reset, then closed = s - 1 with release, in the same 8-byte word
 *     as whether it failed); the relay publishes s only after reading closed == s - 1
 *     (relaxed load, then fence.acquire), so every block of s reads the advanced state.
 *     Thread 0 rewrites ctl for s only after request_done of s - 1 (mk_serve).
 *   - relay -> host: view.taken = s with st.release.sys after the ring entry's reads, so the
 *     host may then reuse the slot; on leaving, view.next and view.reason, then view.left
 *     (release): a host that sees left knows from which request a new launch starts.
 * megak/runtime/resident_model.py is this protocol in Python; its tests drive it through
 * random interleavings and catch the misuses the rules above exclude. */
enum { MK_REQUEST_RUN = 1, MK_REQUEST_SKIP = 2, MK_REQUEST_LEAVE = 3, MK_REQUEST_FAILED = 4 };
static_assert(MK_RING_SLOTS < (1 << 16), "a ring word's 16-bit tag tells its request from the "
              "slot's previous one");

/* Thread 0 of every block: wait for request s, read it, and set the block up for it. */
__device__ void mk_take_request(const mk_resident_args& a, mk_u32 s)
{
    mk_control& ctl = mk_ctl();
    mk_resident_state* res = reinterpret_cast<mk_resident_state*>(a.state);
    /* the relay publishes within the idle deadline, or within wait_ns of the running request */
    const mk_u64 start = mk_globaltimer();
    const mk_u64 deadline = mk_deadline(a.idle_ns + a.wait_ns + 1000000000ull);
    while (!mk_reached(mk_ld_relaxed(&res->go), s)) {
        const mk_u64 now = mk_globaltimer();
        if (now > deadline) {
            ctl.request = MK_REQUEST_LEAVE;   /* the relay is gone */
            return;
        }
        if (now - start > MK_WAIT_HOT_NS)
            __nanosleep(MK_WAIT_COLD_SLEEP_NS);   /* idle: spare L2 */
    }
    mk_fence_acquire();
    const volatile mk_request* m = &res->mirror[s % MK_MIRROR_SLOTS];
    const mk_u64 params = m->params, tensors = m->tensors;
    const mk_u32* queue_start = reinterpret_cast<const mk_u32*>(m->queue_start);
    const mk_run_state* run_state = reinterpret_cast<const mk_run_state*>(m->run_state);
    const mk_u32 n_sm = m->n_sm, ticket = m->ticket;
    mk_u32* seen = reinterpret_cast<mk_u32*>(a.seen) + blockIdx.x;
    if (params == 0ull) {
        mk_st_release(seen, s);
        ctl.request = MK_REQUEST_LEAVE;
        return;
    }
    /* the program's params, this block's queue bounds and the run state: all loads in flight
     * together (the request names all three buffers, instr.h mk_request), one round trip
     * after the mirror's, as a launch's set-up after its kernel parameters. The bounds and
     * the run state are read before the params' copy: loads through generic pointers may
     * not pass its stores into shared memory, which wait for the params' loads. */
    const mk_u32 b = blockIdx.x;
    const mk_u32 q_begin = b < n_sm ? queue_start[b] : 0u;
    const mk_u32 q_end = b < n_sm ? queue_start[b + 1] : 0u;
    const uint2 run = mk_run_of_state(run_state);
    ctl.params = *reinterpret_cast<const mk_params*>(params);
    /* seen[b] after these loads: its release (a gpu-scope membar) waits out their round trip
     * instead of standing in front of it */
    mk_st_release(seen, s);
    if (!mk_block_active(b, n_sm, q_begin, q_end)) {
        ctl.request = MK_REQUEST_SKIP;
        return;
    }
    for (int i = 0; i < MK_SLOTS; ++i) {  /* initialised for the previous request */
        mk_mbar_inval(&ctl.full[i]);
        mk_mbar_inval(&ctl.empty[i]);
    }
    const bool ok = mk_begin_invocation(reinterpret_cast<const mk_tensor*>(tensors), run,
                                        ticket, q_begin, q_end);
    ctl.request = ok ? MK_REQUEST_RUN : MK_REQUEST_FAILED;
}

/* Whether every block has read request `s`: each lane looks at every 32nd block's seen
 * (relaxed loads, all in flight together), the warp votes, one fence.acquire after. */
__device__ __forceinline__ bool mk_all_seen(const mk_u32* seen, mk_u32 grid, mk_u32 lane,
                                            mk_u32 s)
{
    bool ok = true;
    for (mk_u32 b = lane; b < grid; b += 32)
        ok &= mk_reached(mk_ld_relaxed(seen + b), s);
    ok = __all_sync(0xffffffffu, ok);
    mk_fence_acquire();
    return ok;
}

/* The last block, warp 9: the relay (see above); the warp polls the ring together, lane 0
 * publishes, the warp scans seen[]. It
 * lives in the last block because block 0 takes part in every invocation and often closes it.
 * Polls of the host ring over PCIe, from any SM, stretch the closing block's fence.sc.sys
 * (traced on a one-copy request: 1.5 us while the relay polls, 0.5 us without, as in a
 * launched kernel), so while a request runs the relay reads the ring once, then only
 * `closed`: a request posted after that read is taken one PCIe round trip after the close.
 * Leaves after publishing a "leave" entry. */
__device__ __noinline__ void mk_relay(const mk_resident_args& a, mk_u32 lane)
{
    mk_resident_state* res = reinterpret_cast<mk_resident_state*>(a.state);
    const mk_u32* seen = reinterpret_cast<const mk_u32*>(a.seen);
    const mk_u32 grid = gridDim.x;
    mk_u32 safe = a.first - 1u;     /* every block has read the requests up to here */
    for (mk_u32 s = a.first;; ++s) {
        mk_u64 params = 0, tensors = 0, queue_start = 0, run_state = 0;
        mk_u32 ticket = 0, n_sm = 0, reason = 0;
        /* R1. request s from the ring, and request s - 1 closed; the idle clock runs only
         * while nothing is running and nothing is asked. The whole warp polls (its values
         * uniform: the clock and `closed` are lane 0's, shuffled), so that the ring entry's
         * six words are one warp load, lane i < 6 word i: one PCIe round trip a poll. One
         * thread's loads of host memory are served one after another (~0.8 us each on the
         * H200): the six from lane 0 made a poll 5.1 us and a request's hand-over 10.3 us,
         * against 1.3 and 3.0 in one warp load (tools/probe_ring_poll.py). */
        {
            const mk_u64* e = reinterpret_cast<const mk_u64*>(
                reinterpret_cast<const mk_request*>(a.ring) + s % MK_RING_SLOTS);
            static_assert(sizeof(mk_request) == 6 * sizeof(mk_u64), "six ring words");
            const mk_u64 tag = (mk_u64)(s & 0xffffu) << MK_REQUEST_TAG_SHIFT;
            const mk_u64 tag_mask = 0xffffull << MK_REQUEST_TAG_SHIFT;
            const mk_u32 n_sm_tag = (s & 0xffffu) << MK_REQUEST_N_SM_SHIFT;
            bool taken = false, closed = false;
            const mk_u64 start = __shfl_sync(0xffffffffu, mk_globaltimer(), 0);
            mk_u64 idle_since = 0;
            bool first_round = true;
            while (!(taken && closed)) {
                /* every load of this round in flight together: one PCIe round trip for the
                 * ring entry. While request s - 1 runs the ring is read in the first round
                 * only: polls over PCIe beside it stretch its closing fence.sc.sys (see
                 * above) */
                mk_u64 done = 0ull, word = 0ull;
                if (lane == 0 && !closed)
                    done = mk_ld_relaxed_u64(&res->closed);
                const bool read = !taken && (closed || first_round);
                if (read && lane < 6u)
                    word = mk_ld_acquire_sys_u64(e + lane);
                done = __shfl_sync(0xffffffffu, done, 0);
                if (read) {
                    const mk_u64 w0 = __shfl_sync(0xffffffffu, word, 0);   /* params */
                    const mk_u64 w1 = __shfl_sync(0xffffffffu, word, 1);   /* tensors */
                    const mk_u64 w2 = __shfl_sync(0xffffffffu, word, 2);   /* queue_start */
                    const mk_u64 w3 = __shfl_sync(0xffffffffu, word, 3);   /* run_state */
                    const mk_u32 w4 = (mk_u32)__shfl_sync(0xffffffffu, word, 4); /* n_sm | pad */
                    const mk_u64 w5 = __shfl_sync(0xffffffffu, word, 5);   /* ticket | seq */
                    if ((mk_u32)(w5 >> 32) == s && (w0 & tag_mask) == tag &&
                        (w1 & tag_mask) == tag && (w2 & tag_mask) == tag &&
                        (w3 & tag_mask) == tag && (w4 & 0xffff0000u) == n_sm_tag) {
                        params = w0 & ~tag_mask;
                        tensors = w1 & ~tag_mask;
                        queue_start = w2 & ~tag_mask;
                        run_state = w3 & ~tag_mask;
                        n_sm = w4 & 0xffffu;
                        ticket = (mk_u32)w5;
                        taken = true;
                    }
                }
                if (!closed && (mk_u32)done == s - 1u) {
                    mk_fence_acquire();
                    closed = true;
                    if ((mk_u32)(done >> 32) != 0u) {
                        reason = MK_RESIDENT_FAILED;
                        break;
                    }
                }
                first_round = false;
                const mk_u64 now = __shfl_sync(0xffffffffu, mk_globaltimer(), 0);
                if (!closed && now - start > a.wait_ns) {
                    reason = MK_RESIDENT_LOST;
                    break;
                }
                if (closed && !taken) {
                    if (idle_since == 0)
                        idle_since = now;
                    else if (now - idle_since > a.idle_ns) {
                        reason = MK_RESIDENT_IDLE;
                        break;
                    }
                }
            }
            if (reason == 0 && params == 0ull)
                reason = MK_RESIDENT_CLOSED;
        }
        /* R2. mirror slot s % MK_MIRROR_SLOTS is free once every block has read request
         * s - MK_MIRROR_SLOTS. The blocks are rarely behind: look only when `safe` says so,
         * and then ask for s - 1 first (good for the next MK_MIRROR_SLOTS - 1 requests). */
        const mk_u64 start_free = mk_globaltimer();
        while ((int)(safe - (s - MK_MIRROR_SLOTS)) < 0) {
            if (mk_all_seen(seen, grid, lane, s - 1u))
                safe = s - 1u;
            else if (mk_all_seen(seen, grid, lane, s - MK_MIRROR_SLOTS))
                safe = s - MK_MIRROR_SLOTS;
            else if (mk_globaltimer() - start_free > a.wait_ns) {
                reason = MK_RESIDENT_LOST;   /* a block stopped reading requests */
                break;
            }
        }
        if (lane == 0) {
            /* R3. publish */
            volatile mk_request* m = &res->mirror[s % MK_MIRROR_SLOTS];
            m->params = reason != 0 ? 0ull : params;
            m->tensors = tensors;
            m->queue_start = queue_start;
            m->run_state = run_state;
            m->n_sm = n_sm;
            m->ticket = ticket;
            m->seq = s;
            mk_st_release(&res->go, s);
            /* R4. tell the host */
            mk_resident_view* view = reinterpret_cast<mk_resident_view*>(a.view);
            if (reason != 0) {
                volatile mk_resident_view* v = view;
                v->next = s;
                v->reason = reason;
                mk_st_release_sys(&view->left, a.generation);
            } else {
                mk_st_release_sys(&view->taken, s);
            }
        }
        if (reason != 0)
            return;
    }
}

/* One role's loop over requests. Thread 0 (a compute thread) reads request s, sets the block
 * up and arrives on request_ready; the other 319 threads of the three roles wait for it, run
 * the request if the block is active in it, and arrive on request_done, which thread 0 waits
 * for before it counts the block out and rewrites ctl for the next request. Both hand-offs
 * are mbarriers (arrive = release, wait = acquire at CTA scope), not a named barrier: the
 * roles loop in separate code paths, each after its own setmaxnreg, and an aligned barrier
 * must be one instruction for all. Phase k of each barrier is request first + k. */
enum { MK_ROLE_COMPUTE = 0, MK_ROLE_LOADER = 1, MK_ROLE_STREAMER = 2 };

template <int ROLE>
__device__ __forceinline__ void mk_serve(const mk_resident_args& a, mk_u32 tid, mk_u32 lane)
{
    mk_control& ctl = mk_ctl();
    mk_resident_state* res = reinterpret_cast<mk_resident_state*>(a.state);
    /* thread 0 takes at most idle + wait (+ slack) to publish a request */
    const mk_u64 patience = a.idle_ns + a.wait_ns + 2000000000ull;
    for (mk_u32 s = a.first, k = 0;; ++s, ++k) {
        if (ROLE == MK_ROLE_COMPUTE && tid == 0) {
            mk_take_request(a, s);
            mk_mbar_arrive(&ctl.request_ready);
        } else if (!mk_mbar_wait(&ctl.request_ready, k & 1u, mk_deadline(patience))) {
            return;   /* thread 0 is gone: nothing more will be asked of this block */
        }
        __syncwarp();
        const mk_u32 what = ctl.request;
        if (what == MK_REQUEST_LEAVE)
            return;
        if (what == MK_REQUEST_RUN) {
            const mk_instr* queue =
                reinterpret_cast<const mk_instr*>(ctl.params.instrs) + ctl.q_begin;
            if (ROLE == MK_ROLE_LOADER)
                mk_loader(queue, ctl.n, lane, false);
            else if (ROLE == MK_ROLE_STREAMER)
                mk_streamer(queue, ctl.n, lane);
            else
                mk_compute();
        }
        if (ROLE != MK_ROLE_COMPUTE || tid != 0) {
            mk_mbar_arrive(&ctl.request_done);
            continue;
        }
        if (!mk_mbar_wait(&ctl.request_done, k & 1u, mk_deadline(a.wait_ns))) {
            mk_stop_info e = {MK_ERR_TIMEOUT, ctl.n, 0, 0, 0, 0, 0};
            mk_stop(ctl.params, e);   /* a role of this block never came back */
        }
        if (what != MK_REQUEST_SKIP)
            mk_finish_invocation(ctl.params, ctl.ticket, res, s);
    }
}

/* The resident kernel: a = where the ring, the host view and the device state are. */
extern "C" __global__ void __launch_bounds__(MK_BLOCK_THREADS, 1)
megakernel_resident(const mk_resident_args a)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        mk_mbar_init(&ctl.request_ready, 1u);
        mk_mbar_init(&ctl.request_done, MK_JOIN_THREADS - 1u);
        for (int i = 0; i < MK_SLOTS; ++i) {   /* valid from the start: each request invalidates */
            mk_mbar_init(&ctl.full[i], 1u);   /* and initialises them again */
            mk_mbar_init(&ctl.empty[i], (mk_u32)MK_THREADS);
        }
        ctl.ring_inited = 0;   /* each request's set-up initialises the ring it needs */
        ctl.wgmma_inited = 0;  /* the first wgmma GEMM initialises its barriers */
        ctl.transpose_inited = 0;   /* so does the first paged transpose */
    }
    __syncthreads();   /* the barriers are initialised before anyone waits on them */
    if (warp >= MK_THREADS / 32) {
        MK_LOADER_SETMAXNREG();
        if (blockIdx.x == gridDim.x - 1 && warp == MK_THREADS / 32 + 1)
            mk_relay(a, lane);
        if (warp == MK_LOADER_WARP)
            mk_serve<MK_ROLE_LOADER>(a, tid, lane);
        else if (warp == MK_STREAMER_WARP)
            mk_serve<MK_ROLE_STREAMER>(a, tid, lane);
    } else {
        MK_COMPUTE_SETMAXNREG();
        mk_serve<MK_ROLE_COMPUTE>(a, tid, lane);
    }
}

#endif /* !MK_WGMMA_ONLY && MK_RESIDENT */

#if !MK_WGMMA_ONLY
/* The "separate" variant, for benchmarks only: one launch per graph op, block b runs record
 * params->instrs[first + b] with the same op code, no waits and no signals (stream order is
 * the dependency between launches), pages 0..n-1 of its own shared memory. An invalid record
 * is reported through the status record like the megakernel does, and the block exits.
 *
 * Programmatic dependent launch (the graph_pdl variant: launches with the programmatic
 * stream serialization attribute; without it both instructions below are no-ops, so the
 * separate and graph variants run as before). launch_dependents at entry lets the next
 * launch start as soon as every block of this one is running: its blocks are placed and
 * run their set-up while this op computes, then park in their own wait. griddepcontrol.wait
 * returns when every prerequisite grid (the launch before) has completed and its memory
 * operations are visible to this grid, so everything before it reads only what the host
 * wrote (the record, params, the tensor table) and everything after it (the op's operands
 * and outputs, a streamed GEMM's combine counters) is ordered after the op before, as stream
 * order orders it. Every thread of every block waits, the error path too: a grid that could
 * finish without waiting would let the launch after it overtake the launch before. */
extern "C" __global__ void __launch_bounds__(MK_THREADS, 1)
megak_op(const mk_params* params, mk_u32 first)
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    mk_control& ctl = mk_ctl();
    unsigned char* const page_array = mk_page_array(mk_smem);
    mk_slot& s = ctl.slot[0];
    const mk_u32 tid = threadIdx.x;
    const mk_instr* rec = reinterpret_cast<const mk_instr*>(params->instrs) + first + blockIdx.x;
    if (tid < MK_INSTR_BYTES / 4)
        reinterpret_cast<mk_u32*>(&s.ins)[tid] = reinterpret_cast<const mk_u32*>(rec)[tid];
    if (tid == 0) {
        /* the ops read the counters (a streamed GEMM's combine) and epoch from here; no ring:
         * a streamed GEMM loads B itself */
        ctl.params.counters = params->counters;
        ctl.params.epoch = params->epoch;
        /* a wgmma GEMM reads its tensor maps and deadline from here */
        ctl.params.tensors = params->tensors;
        ctl.params.n_tensors = params->n_tensors;
        ctl.params.timeout_ns = params->timeout_ns;
        ctl.wgmma_inited = 0;
        ctl.params.stream_pages = 0;
        /* flagged words: stream order already orders each launch after its producers, so
         * any fixed stamp is this "invocation's" (flag.cuh) */
        ctl.params.stamp = 1u;
        ctl.stream_error = 0;
        ctl.op_stop.error = MK_OK;
        ctl.ring_stop = 0;
    }
    int stop = 0;
    __syncthreads();
    if (tid == 0) {
        mk_stop_info e = {MK_OK, first + blockIdx.x, s.ins.opcode, s.ins.op_index, 0, 0, 0};
        e.error = mk_validate(s.ins, *params, &e.expected, &e.observed);
        const mk_u64 need = (mk_u64)(page_array - mk_smem) + (mk_u64)s.ins.pages * MK_PAGE_BYTES;
        if (e.error == MK_OK && need > mk_dynamic_smem_size()) {
            e.error = MK_ERR_PAGES;
            e.expected = (mk_u32)need;
            e.observed = mk_dynamic_smem_size();
        }
        if (e.error != MK_OK) {
            mk_stop(*params, e);
            stop = 1;
        } else {
            const mk_tensor* tensors = reinterpret_cast<const mk_tensor*>(params->tensors);
            const mk_u32 used = mk_op_operands(s.ins.opcode);
            for (mk_u32 i = 0; i < MK_MAX_TENSORS; ++i)
                if ((used >> i) & 1u)
                    s.operand[i] = tensors[s.ins.tensor[i]];
            for (mk_u32 i = 0; i < s.ins.pages; ++i)
                s.page[i] = (mk_u8)i;
        }
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");   /* the launch before is done */
    if (__syncthreads_or(stop))
        return;
    const mk_pages pages = {page_array, s.page};
    mk_op_run(s.ins, s.operand, pages);
}

#endif /* !MK_WGMMA_ONLY */
