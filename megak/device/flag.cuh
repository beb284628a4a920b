/* megak: data that is its own flag (MK_DTYPE_F32_FLAG), for small fp32 intermediates.
 *
 * A dependent hop through a counter costs three L2 round trips: the producer's release fence
 * (its stores acknowledged before the counter moves), the consumer's poll of the counter, and
 * the consumer's load of the data. When the data is small, the data can carry its own flag:
 *
 *   word      64 bits per element: the fp32 value's bits low, the stamp high. ld counts words.
 *   stamp     one per invocation of the program: params.stamp = run_state.stamp + 1, skipping
 *             0 on the u32 wrap (mk_next_stamp); the last block of every invocation, good or
 *             failed, stores it back (megakernel.cu, mk_finish_invocation). Never reset (the
 *             epoch restarts at 0 after a failure; a stamp never does). The host zeroes the
 *             flagged buffers together with the run state: stamp 0 = never written.
 *   producer  each word is written exactly once per invocation (one instruction owns each
 *             output element), by one st.relaxed.gpu.b64: no fence, no counter.
 *   consumer  polls each word it needs with ld.relaxed.gpu.b64 until the high half is this
 *             invocation's stamp; the low half is then the value.
 *
 * Why that is enough (the ordering argument):
 *  1. An aligned 64-bit relaxed access is single-copy atomic (PTX memory model: morally strong
 *     accesses of one size to one address): a load returns all of one store, never a mix of
 *     two. So a word showing this invocation's stamp holds the value stored with that stamp.
 *     Only scalar b64 accesses are used: a vector access is several accesses, not one.
 *  2. The stamp is this invocation's alone (it repeats only after 2^32 invocations of the
 *     program), and each word is written once per invocation: the value is this invocation's,
 *     from its one producer.
 *  3. Nothing else is inferred from a flagged word: the consumer uses only the value in it.
 *     Every other input of the instruction comes with its own counter wait (acquire) or its
 *     own flagged words. Hence no release on the producer's side and no acquire here.
 *  4. Write after read across invocations: invocation n + 1 starts only after every block has
 *     left invocation n (the kernel boundary; in the resident kernel the relay publishes the
 *     next request only after the last block closed the previous one), so no producer of
 *     n + 1 overwrites a word that a consumer of n still polls.
 *  5. Relaxed gpu-scope loads are served at L2, the GPU's point of coherence, never from a
 *     stale L1 line: a poll sees a store once it has reached L2.
 *
 * The scheduler picks the form (scheduler.py: small fp32 intermediates whose producer and
 * readers all have OpDef.flag_io) and drops the counters of those edges. Polls are bounded:
 * the deadline (params.timeout_ns) and the abort flag, checked every MK_FLAG_CHECK_EVERY
 * polls. A failed poll records itself in ctl.op_stop (counter MK_FLAG_WAIT | tensor slot,
 * expected the stamp, observed the stamp seen); the op goes on without the value, and
 * mk_compute stops the block after the compute barrier. The protocol's model, with every
 * misuse it catches: runtime/flag_model.py; the simulator keeps a stamp per word (sim.py).
 */
#ifndef MEGAK_FLAG_CUH
#define MEGAK_FLAG_CUH

#include "instr.h"
#include "sync.cuh"
#include "pages.cuh"
#include "tensor.cuh"

enum { MK_FLAG_CHECK_EVERY = 16 };

/* The stamp after `last`: never 0 (the value of a word never written). */
__device__ __forceinline__ mk_u32 mk_next_stamp(mk_u32 last)
{
    return last + 1u != 0u ? last + 1u : 1u;
}

__device__ __forceinline__ mk_u64 mk_flag_ld(const mk_u64* p)
{
    mk_u64 w;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    return w;
}

__device__ __forceinline__ void mk_flag_st(mk_u64* p, float v, mk_u32 stamp)
{
    const mk_u64 w = ((mk_u64)stamp << 32) | (mk_u64)__float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" : : "l"(p), "l"(w) : "memory");
}

/* The first failing thread of the compute warps records why (ctl.op_stop). */
__device__ __forceinline__ void mk_flag_fail(mk_u32 error, mk_u32 slot, mk_u32 stamp,
                                             mk_u32 seen)
{
    mk_control& ctl = mk_ctl();
    if (atomicCAS(&ctl.op_stop.error, (mk_u32)MK_OK, error) == (mk_u32)MK_OK) {
        ctl.op_stop.counter = (mk_u32)MK_FLAG_WAIT | slot;
        ctl.op_stop.expected = stamp;
        ctl.op_stop.observed = seen;
    }
}

/* Poll word p (tensor slot `slot`) until it carries `stamp`; w is the first load's word.
 * Returns the word (past the deadline, or on abort, the last one seen: its value unused). */
__device__ __forceinline__ mk_u64 mk_flag_poll(const mk_u64* p, mk_u32 slot, mk_u32 stamp,
                                               mk_u64 w)
{
    mk_control& ctl = mk_ctl();
    const mk_u64 deadline = mk_deadline(ctl.params.timeout_ns);
    const mk_u32* abort_flag = &reinterpret_cast<mk_status*>(ctl.params.status)->abort;
    for (mk_u32 n = 1; (mk_u32)(w >> 32) != stamp; ++n) {
        if (n % MK_FLAG_CHECK_EVERY == 0) {
            if (*reinterpret_cast<volatile mk_u32*>(&ctl.op_stop.error) != (mk_u32)MK_OK)
                break;   /* another thread of the block failed: the invocation is lost */
            if (mk_ld_relaxed(abort_flag) != 0u) {
                mk_flag_fail(MK_ERR_ABORTED, slot, stamp, (mk_u32)(w >> 32));
                break;
            }
            if (mk_globaltimer() > deadline) {
                mk_flag_fail(MK_ERR_TIMEOUT, slot, stamp, (mk_u32)(w >> 32));
                break;
            }
        }
        w = mk_flag_ld(p);
    }
    return w;
}

/* Element `off` of t as fp32: a flagged word (polled until it carries this invocation's
 * stamp), bf16 or fp32. `slot`: t's tensor slot, for the error record. */
__device__ __forceinline__ float mk_ld1_any(const mk_tensor& t, mk_u32 slot, mk_u64 off)
{
    if (t.dtype == MK_DTYPE_F32_FLAG) {
        const mk_u64* p = reinterpret_cast<const mk_u64*>(t.ptr) + off;
        const mk_u32 stamp = mk_ctl().params.stamp;
        mk_u64 w = mk_flag_ld(p);
        if ((mk_u32)(w >> 32) != stamp)
            w = mk_flag_poll(p, slot, stamp, w);
        return __uint_as_float((mk_u32)w);
    }
    if (t.dtype == MK_DTYPE_BF16)
        return mk_bf16_lo(mk_ld_u16(reinterpret_cast<const mk_u16*>(t.ptr) + off));
    return mk_ld_f(reinterpret_cast<const float*>(t.ptr) + off);
}

/* Store v as element `off` of t, in t's form. */
__device__ __forceinline__ void mk_st1_any(const mk_tensor& t, mk_u64 off, float v)
{
    if (t.dtype == MK_DTYPE_F32_FLAG)
        mk_flag_st(reinterpret_cast<mk_u64*>(t.ptr) + off, v, mk_ctl().params.stamp);
    else if (t.dtype == MK_DTYPE_BF16)
        mk_st_u16(reinterpret_cast<mk_u16*>(t.ptr) + off, mk_to_bf16(v));
    else
        mk_st_f(reinterpret_cast<float*>(t.ptr) + off, v);
}

/* Whether an instruction of a flag_io op takes the elementwise path below (a flagged operand
 * among A, B (when `with_b`) and OUT). */
__device__ __forceinline__ bool mk_flag_any(const mk_tensor* op, bool with_b)
{
    return op[MK_ARG_A].dtype == MK_DTYPE_F32_FLAG || op[MK_ARG_OUT].dtype == MK_DTYPE_F32_FLAG ||
           (with_b && op[MK_ARG_B].dtype == MK_DTYPE_F32_FLAG);
}

/* out = A (+ B) over the record's region, one element per thread per step, any form of each
 * operand. Flagged tensors are small (the scheduler's rule), so this path is about latency:
 * every thread issues its first poll at once. B with one row is broadcast over the rows. */
template <bool WITH_B>
__device__ __forceinline__ void mk_flag_elementwise(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& A = op[MK_ARG_A];
    const mk_tensor& O = op[MK_ARG_OUT];
    const long long rows = in.rows, cols = in.cols, total = rows * cols;
    for (long long i = threadIdx.x; i < total; i += MK_THREADS) {
        const long long r = rows == 1 ? 0 : i / cols, c = i - r * cols;
        const mk_u64 row = (mk_u64)(in.row0 + r), col = (mk_u64)(in.col0 + c);
        float v = mk_ld1_any(A, in.tensor[MK_ARG_A], row * A.ld + col);
        if (WITH_B) {
            const mk_tensor& B = op[MK_ARG_B];
            v = __fadd_rn(v, mk_ld1_any(B, in.tensor[MK_ARG_B],
                                        (B.rows == 1 ? 0ull : row * B.ld) + col));
        }
        mk_st1_any(O, row * O.ld + col, v);
    }
}

/* Debug mode: a flagged view, word-aligned, with the region inside it. */
__device__ __forceinline__ bool mk_flag_region_ok(const mk_tensor& t, long long r0, long long nr,
                                                  long long c0, long long nc)
{
    if (t.dtype != MK_DTYPE_F32_FLAG || r0 < 0 || c0 < 0 || nr < 0 || nc < 0)
        return false;
    if (nr == 0 || nc == 0)
        return true;
    return t.ptr != 0 && (t.ptr & 7u) == 0 && t.ld >= t.cols &&
           r0 + nr <= (long long)t.rows && c0 + nc <= (long long)t.cols;
}

#endif /* MEGAK_FLAG_CUH */
