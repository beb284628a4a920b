/* megak: the megakernel. One block per SM, launched cooperatively; block b interprets queue b.
 *
 *   kernel  extern "C" megakernel(const mk_params* params)
 *   grid    params->n_sm blocks, block MK_THREADS threads
 *   smem    dynamic MK_CONTROL_BYTES + MK_PAGE_ALIGN + n_pages * MK_PAGE_BYTES (pages.py),
 *           static 0
 *
 * Per instruction q (slot q & 1 of the control area, see pages.cuh):
 *
 *   warp 0           thread 0 of warp 0               all 256 threads
 *   ------           ------------------               ---------------
 *   1. prefetch record q+1 (cp.async)
 *                    2. validate record q
 *                    3. acquire its pages (free: instructions run one at a time)
 *                    4. wait for its counters (relaxed polls, then fence.acquire)
 *   (operands of q landed)            ---- barrier B ----
 *                                                      5. run the op
 *   (record q+1 landed;
 *    fetch operand descriptors of q+1) ---- barrier A ----
 *                    6. signal counters (fence.release + red per counter)
 *                    7. release pages
 *
 * Errors never trap: the first one wins status->error (atomicCAS), its block fills the status
 * record and raises status->abort; blocks spinning on a counter see the flag and stop. Every
 * block that stops early writes its mk_sm_state and exits. DESIGN.md sections 3-5.
 */
#include "instr.h"
#include "sync.cuh"
#include "pages.cuh"
#include "ops/copy.cuh"
#include "ops/transpose.cuh"
#include "ops/gemm.cuh"
#include "ops/reduce.cuh"

/* The op table. Adding an op: its header + one line here. X(OPCODE, name) expects
 * mk_<name>_run / _check / _check_operands, MK_<OPCODE>_PAGES (instr.h) and
 * MK_<OPCODE>_OPERANDS (the op's header). */
#define MK_FOR_EACH_OP(X)      \
    X(COPY, copy)              \
    X(TRANSPOSE, transpose)    \
    X(GEMM, gemm)              \
    X(REDUCE, reduce)

/* Operand positions an opcode reads (their descriptors are prefetched and validated). */
__device__ __forceinline__ mk_u32 mk_op_operands(mk_u32 opcode)
{
    switch (opcode) {
#define X(OP, name) case MK_OP_##OP: return MK_##OP##_OPERANDS;
        MK_FOR_EACH_OP(X)
#undef X
    default: return 0;
    }
}

__device__ __forceinline__ mk_u32 mk_op_pages(mk_u32 opcode)
{
    switch (opcode) {
#define X(OP, name) case MK_OP_##OP: return MK_##OP##_PAGES;
        MK_FOR_EACH_OP(X)
#undef X
    default: return 0;
    }
}

__device__ __forceinline__ bool mk_op_check(const mk_instr& in)
{
    switch (in.opcode) {
#define X(OP, name) case MK_OP_##OP: return mk_##name##_check(in);
        MK_FOR_EACH_OP(X)
#undef X
    default: return true;   /* NOP */
    }
}

__device__ __forceinline__ bool mk_op_check_operands(const mk_instr& in, const mk_tensor* op)
{
    switch (in.opcode) {
#define X(OP, name) case MK_OP_##OP: return mk_##name##_check_operands(in, op);
        MK_FOR_EACH_OP(X)
#undef X
    default: return true;
    }
}

__device__ __forceinline__ void mk_op_run(const mk_instr& in, const mk_tensor* op,
                                          const mk_pages& pages)
{
    switch (in.opcode) {
#define X(OP, name) case MK_OP_##OP: mk_##name##_run(in, op, pages); break;
        MK_FOR_EACH_OP(X)
#undef X
    default: break;   /* NOP */
    }
}

/* Step 2. Everything checkable from the record alone (no global loads on the hot path), in
 * the simulator's order: opcode, page budget, descriptor. Thread 0 runs this while the other
 * 255 threads wait at barrier B, once per instruction: so the descriptor checks are one
 * branch-free expression (all its shared loads in flight together) rather than a chain of
 * early returns, each waiting for its own load. Entries past n_waits / n_signals are read
 * and ignored (the record is always 128 bytes). */
__device__ __forceinline__ mk_u32 mk_validate(const mk_instr& in, const mk_params& p,
                                              mk_u32* expected, mk_u32* observed)
{
    if (in.opcode >= MK_OP_COUNT)
        return MK_ERR_BAD_OPCODE;
    if (in.pages > p.n_pages) {
        *expected = in.pages;
        *observed = p.n_pages;
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
    bad |= !mk_op_check(in) | (in.pages < mk_op_pages(in.opcode));
    return bad ? MK_ERR_BAD_DESCRIPTOR : MK_OK;
}

/* Warp 0: copy the operand descriptors of slot s's record from the tensor table
 * (lane = 3 * operand + 8-byte part; mk_tensor is 24 bytes). Commits one group per lane. */
__device__ __forceinline__ void mk_fetch_operands(mk_slot& s, const mk_tensor* tensors,
                                                  mk_u32 n_tensors, mk_u32 lane)
{
    const mk_u32 operand = lane / 3u, part = lane % 3u;
    if (operand < MK_MAX_TENSORS) {
        const mk_u32 used = s.ins.opcode < MK_OP_COUNT ? mk_op_operands(s.ins.opcode) : 0u;
        const mk_u32 slot = s.ins.tensor[operand];
        if (((used >> operand) & 1u) && slot < n_tensors)
            mk_cp_async_8(reinterpret_cast<mk_u64*>(&s.operand[operand]) + part,
                          reinterpret_cast<const mk_u64*>(&tensors[slot]) + part);
    }
    mk_cp_async_commit();
}

/* Warp 0: start copying record q (128 B, 8 lanes x 16 B) into slot s. Commits one group. */
__device__ __forceinline__ void mk_fetch_record(mk_slot& s, const mk_instr* rec, mk_u32 lane)
{
    if (rec != nullptr && lane < MK_INSTR_BYTES / 16)
        mk_cp_async_16(reinterpret_cast<unsigned char*>(&s.ins) + 16 * lane,
                       reinterpret_cast<const unsigned char*>(rec) + 16 * lane);
    mk_cp_async_commit();
}

/* What a stopping block reports about itself. */
struct mk_stop_info {
    mk_u32 error, queue_index, opcode, op_index, counter, expected, observed;
};

/* Thread 0: stop this block. Own errors (not MK_ERR_ABORTED) compete for the status record;
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

/* Step 4, thread 0: wait until counter - target >= 0 (wrap-safe), bounded by the deadline and
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

extern "C" __global__ void __launch_bounds__(MK_THREADS, 1) megakernel(const mk_params* params)
{
    mk_control& ctl = mk_ctl();
    unsigned char* const page_array = mk_page_array(mk_smem);
    const mk_params& p = ctl.params;   /* valid after the first barrier */
    const mk_u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const mk_u32 sm = blockIdx.x;
    if (sm >= params->n_sm)
        return;   /* more blocks than queues: nothing to run, nowhere to report */

    /* Host-written before launch, read-only here: plain loads are fine. */
    const mk_u32* queue_start = reinterpret_cast<const mk_u32*>(params->queue_start);
    const mk_u32 q_begin = queue_start[sm], q_end = queue_start[sm + 1];
    const mk_u32 n = q_end >= q_begin ? q_end - q_begin : 0u;
    const mk_instr* queue = reinterpret_cast<const mk_instr*>(params->instrs) + q_begin;

    /* 0. Set up: the pages the host carved must fit in what this launch really has. The stop
     * decision travels by __syncthreads_or, never a shared flag: thread 0 may set the next
     * stop before a slow warp has read this one. */
    int stop = 0;
    if (tid == 0) {
        ctl.params = *params;
        const mk_u32 n_pages = params->n_pages;
        ctl.free_pages = mk_all_pages_mask(n_pages);
        const mk_u64 need = (mk_u64)(page_array - mk_smem) + (mk_u64)n_pages * MK_PAGE_BYTES;
        mk_stop_info e = {MK_OK, 0, 0, 0, 0, 0, 0};
        if (q_end < q_begin) {
            e.error = MK_ERR_BAD_DESCRIPTOR;
        } else if (n_pages > MK_MAX_PAGES || need > mk_dynamic_smem_size()) {
            e.error = MK_ERR_PAGES;
            e.expected = (mk_u32)need;
            e.observed = mk_dynamic_smem_size();
        }
        if (e.error != MK_OK) {
            mk_stop(*params, e);
            stop = 1;
        }
    }
    if (warp == 0 && n > 0) {   /* record 0, then its operands */
        mk_fetch_record(ctl.slot[0], queue, lane);
        mk_cp_async_wait_all();
        __syncwarp();
        mk_fetch_operands(ctl.slot[0], reinterpret_cast<const mk_tensor*>(params->tensors),
                          params->n_tensors, lane);
    }
    if (__syncthreads_or(stop)) {
        if (warp == 0)
            mk_cp_async_wait_all();
        return;
    }

    mk_u32 q = 0;
    for (; q < n; ++q) {
        mk_slot& s = ctl.slot[q & 1];
        mk_trace_mark(MK_T_FETCH);

        if (warp == 0) {
            /* 1. fetch: record q+1 streams into the other slot while q runs. Always commit
             * a group (maybe empty) so that "all but the newest group" means "q's operands". */
            mk_fetch_record(ctl.slot[(q & 1) ^ 1], q + 1 < n ? queue + q + 1 : nullptr, lane);
            if (p.debug) {   /* the operand check below reads other lanes' copies */
                mk_cp_async_wait_group<1>();
                __syncwarp();
            }
            if (lane == 0) {
                mk_stop_info e = {MK_OK, q, s.ins.opcode, s.ins.op_index, 0, 0, 0};
                /* 2. validate (debug: also the regions against the tensors' shapes) */
                e.error = mk_validate(s.ins, p, &e.expected, &e.observed);
                if (e.error == MK_OK && p.debug && !mk_op_check_operands(s.ins, s.operand))
                    e.error = MK_ERR_BAD_DESCRIPTOR;
                /* 3. acquire pages, before the wait: they do not depend on it, and a dozen
                 * dependent bit operations here would otherwise sit between a producer's
                 * signal and this instruction's first load */
                if (e.error == MK_OK && !mk_pages_acquire(&ctl.free_pages, s.page, s.ins.pages)) {
                    e.error = MK_ERR_PAGES;
                    e.expected = s.ins.pages;
                    e.observed = (mk_u32)__popc(ctl.free_pages);
                }
                /* 4. wait: target is this run's share, (epoch + 1) * t (u32, wraps). t = 0
                 * means "nothing to wait for" (skipped: the signed test would misread a
                 * counter past 2^31 as behind). */
                for (mk_u32 i = 0; e.error == MK_OK && i < s.ins.n_waits; ++i) {
                    const mk_u32 t = s.ins.wait_target[i];
                    if (t == 0)
                        continue;
                    const mk_u32 c = s.ins.wait_counter[i];
                    const mk_u32 target = (p.epoch + 1u) * t;
                    mk_u32 seen = 0;
                    e.error = mk_wait(p, reinterpret_cast<mk_u32*>(p.counters) + c, target, &seen);
                    if (e.error != MK_OK) {
                        e.counter = c;
                        e.expected = target;
                        e.observed = seen;
                    }
                }
                mk_trace_mark(MK_T_WAITED);
                mk_trace_mark(MK_T_ACQUIRED);   /* held since step 3 */
                if (e.error != MK_OK) {
                    mk_stop(p, e);
                    stop = 1;
                }
#if MK_TRACE
                ctl.trace_t[MK_T_LOADED] = 0;     /* the op may mark these; else defaults */
                ctl.trace_t[MK_T_COMPUTED] = 0;
#endif
            }
            mk_cp_async_wait_group<1>();   /* q's operand descriptors are in the slot */
        }
        /* B: record, operands and page table visible to all; everyone learns thread 0's verdict */
        if (__syncthreads_or(stop))
            break;
#if MK_TRACE
        const mk_u64 t_run = tid == 0 ? mk_globaltimer() : 0;
#endif

        /* 5. run */
        const mk_pages pages = {page_array, s.page};
        mk_op_run(s.ins, s.operand, pages);

        if (warp == 0) {
            /* record q+1 has landed; its operand descriptors travel while the block passes
             * barrier A and thread 0 releases and signals (a fence: hundreds of ns) */
            mk_cp_async_wait_all();
            __syncwarp();
            if (q + 1 < n)
                mk_fetch_operands(ctl.slot[(q & 1) ^ 1],
                                  reinterpret_cast<const mk_tensor*>(p.tensors), p.n_tensors, lane);
        }
        __syncthreads();   /* A: every thread's global writes done, pages no longer read */

        if (tid == 0) {
#if MK_TRACE
            if (ctl.trace_t[MK_T_LOADED] == 0)
                ctl.trace_t[MK_T_LOADED] = t_run;
            if (ctl.trace_t[MK_T_COMPUTED] == 0)
                ctl.trace_t[MK_T_COMPUTED] = mk_globaltimer();
            const mk_u32 in_use = (mk_u32)__popc(mk_all_pages_mask(p.n_pages) & ~ctl.free_pages);
#endif
            /* 6. signal, first (consumers on other SMs wait for it; the pages are local):
             * the barrier ordered the block's writes before this thread; the fence makes
             * them visible at gpu scope before the counters move (one MEMBAR for all). */
            const mk_u32 n_signals = s.ins.n_signals;
            if (n_signals > 0)
                mk_fence_release();
#if MK_TRACE
            /* stored: results visible, counters not yet moved, so no consumer's "waited"
             * can ever read an earlier clock than its producer's "stored" */
            const mk_u64 t_stored = mk_globaltimer();
#endif
            for (mk_u32 i = 0; i < n_signals; ++i)
                mk_red_relaxed_add(reinterpret_cast<mk_u32*>(p.counters) +
                                   s.ins.signal_counter[i], 1u);
            /* 7. release pages (test hook: keep the last one) */
            mk_u32 keep = (s.ins.flags & MK_FLAG_DEBUG_LEAK_PAGE) && s.ins.pages > 0 ? 1u : 0u;
            mk_pages_release(&ctl.free_pages, s.page, s.ins.pages - keep);
#if MK_TRACE
            mk_trace_event* ev = reinterpret_cast<mk_trace_event*>(p.trace) + q_begin + q;
            ev->queue_index = q;
            ev->sm = (mk_u16)sm;
            ev->slot = (mk_u16)(q & 1);
            ev->opcode = s.ins.opcode;
            ev->pages_in_use = (mk_u16)in_use;
            ev->op_index = s.ins.op_index;
            for (int ph = 0; ph < MK_T_STORED; ++ph)
                ev->t[ph] = ctl.trace_t[ph];
            ev->t[MK_T_STORED] = t_stored;
#endif
        }
        if (warp == 0)
            __syncwarp();   /* lane 0 is done reading slot q before record q+2 lands in it */
    }

    if (warp == 0)
        mk_cp_async_wait_all();   /* no copy may land after the block is gone */
    if (q < n)
        return;   /* stopped: thread 0 has written sm_state (and status, if it failed) */

    if (tid == 0) {
        /* A leak is reported against the queue's last instruction, as the simulator does. */
        if (p.debug && ctl.free_pages != mk_all_pages_mask(p.n_pages)) {
            const mk_instr& last = ctl.slot[(n - 1) & 1].ins;
            mk_stop_info e = {MK_ERR_PAGE_LEAK, n - 1, last.opcode, last.op_index, 0,
                              mk_all_pages_mask(p.n_pages), ctl.free_pages};
            mk_stop(p, e);
            return;
        }
        atomicAdd(&reinterpret_cast<mk_status*>(p.status)->finished_blocks, 1u);
        volatile mk_sm_state* st = reinterpret_cast<mk_sm_state*>(p.sm_state) + sm;
        st->queue_index = n;
        st->opcode = 0;
        st->op_index = 0;
        st->counter = 0;
        st->expected = 0;
        st->observed = 0;
        st->error = MK_OK;
    }
}

/* The "separate" variant, for benchmarks only: one launch per graph op, block b runs record
 * params->instrs[first + b] with the same op code, no waits and no signals (stream order is
 * the dependency between launches), pages 0..n-1 of its own shared memory. An invalid record
 * is reported through the status record like the megakernel does, and the block exits. */
extern "C" __global__ void __launch_bounds__(MK_THREADS, 1)
megak_op(const mk_params* params, mk_u32 first)
{
    mk_control& ctl = mk_ctl();
    unsigned char* const page_array = mk_page_array(mk_smem);
    mk_slot& s = ctl.slot[0];
    const mk_u32 tid = threadIdx.x;
    const mk_instr* rec = reinterpret_cast<const mk_instr*>(params->instrs) + first + blockIdx.x;
    if (tid < MK_INSTR_BYTES / 4)
        reinterpret_cast<mk_u32*>(&s.ins)[tid] = reinterpret_cast<const mk_u32*>(rec)[tid];
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
    if (__syncthreads_or(stop))
        return;
    const mk_pages pages = {page_array, s.page};
    mk_op_run(s.ins, s.operand, pages);
}
