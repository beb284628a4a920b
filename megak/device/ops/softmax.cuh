/* MK_OP_SOFTMAX: for each row r in [row0, row0 + rows) of A, with v_c = param * A[r, c]
 * (param = the scale's fp32 bits) and the columns C = [0, cols), or [0, min(cols, r + 1)) with
 * MK_FLAG_CAUSAL (column c masked out where c > r):
 *   out[r, c] = exp(v_c - m) / sum_{c' in C} exp(v_c' - m)  for c in C, m = max_{c in C} v_c
 *   out[r, c] = 0                                          for masked c
 * fp32 inside (expf: <= 2 ulp), rounded once to OUT's dtype; A and OUT fp32 or bf16. Whole rows
 * (rowwise.cuh), no pages. Operands: A, OUT.
 *
 * Two passes over the row, a warp per row: (1) each lane keeps an online (max, sum of
 * exp(v - max)) over its columns, rescaling its sum when the max grows, and the warp merges
 * the lanes' pairs; (2) the outputs. One read of the row for the statistics instead of two
 * (max, then sum). The body is inlined
 * (rowwise.cuh says why).
 */
#ifndef MEGAK_OP_SOFTMAX_CUH
#define MEGAK_OP_SOFTMAX_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "rowwise.cuh"

__device__ __forceinline__ bool mk_softmax_check(const mk_instr& in)
{
    return mk_rowwise_check(in) && mk_param_ok(in, false);
}

__device__ __forceinline__ bool mk_softmax_check_operands(const mk_instr& in, const mk_tensor* op)
{
    return mk_rowwise_operands_ok(in, op, 0u);
}

/* The online pair (m, s): s = sum of exp(v - m) over what was seen, m its max (-inf, the
 * bits 0xff800000, before any: NVRTC has no INFINITY). */
struct mk_softmax_acc {
    float m, s;
    __device__ __forceinline__ void add(float v)
    {
        if (v > m) {
            s = __fadd_rn(__fmul_rn(s, expf(__fsub_rn(m, v))), 1.f);   /* exp(-inf) = 0 */
            m = v;
        } else {
            s = __fadd_rn(s, expf(__fsub_rn(v, m)));
        }
    }
    /* merge another pair; an empty one (m = -inf, s = 0) changes nothing */
    __device__ __forceinline__ void merge(float m2, float s2)
    {
        const float mm = fmaxf(m, m2);
        const float a = m == __int_as_float(0xff800000) ? 0.f : __fmul_rn(s, expf(__fsub_rn(m, mm)));
        const float b = m2 == __int_as_float(0xff800000) ? 0.f : __fmul_rn(s2, expf(__fsub_rn(m2, mm)));
        s = __fadd_rn(a, b);
        m = mm;
    }
};

/* All 256 threads; in.rows, in.cols >= 1. */
__device__ __forceinline__ void mk_softmax_body(const mk_instr& in, const mk_tensor* op)
{
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const float scale = __uint_as_float(in.param);
    const bool causal = (in.flags & MK_FLAG_CAUSAL) != 0;
    const int cols = in.cols;
    for (int i = warp; i < in.rows; i += MK_ROWWISE_WARPS) {
        const long long r = (long long)in.row0 + i;
        const mk_row x = mk_row_of(op[MK_ARG_A], r), y = mk_row_of(op[MK_ARG_OUT], r);
        /* columns that take part: c < valid */
        const int valid = causal && r + 1 < cols ? (int)(r + 1) : cols;
        mk_softmax_acc acc = {__int_as_float(0xff800000), 0.f};
        for (int c = 4 * lane; c < valid; c += 128) {
            const float4 v = x.load(c, valid);
            acc.add(__fmul_rn(scale, v.x));
            if (c + 1 < valid) acc.add(__fmul_rn(scale, v.y));
            if (c + 2 < valid) acc.add(__fmul_rn(scale, v.z));
            if (c + 3 < valid) acc.add(__fmul_rn(scale, v.w));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, acc.m, o);
            const float s2 = __shfl_xor_sync(0xffffffffu, acc.s, o);
            acc.merge(m2, s2);
        }
        for (int c = 4 * lane; c < cols; c += 128) {
            const float4 v = x.load(c, valid);   /* masked columns load nothing */
            float4 e;
            e.x = c < valid ? __fdiv_rn(expf(__fsub_rn(__fmul_rn(scale, v.x), acc.m)), acc.s) : 0.f;
            e.y = c + 1 < valid ? __fdiv_rn(expf(__fsub_rn(__fmul_rn(scale, v.y), acc.m)), acc.s) : 0.f;
            e.z = c + 2 < valid ? __fdiv_rn(expf(__fsub_rn(__fmul_rn(scale, v.z), acc.m)), acc.s) : 0.f;
            e.w = c + 3 < valid ? __fdiv_rn(expf(__fsub_rn(__fmul_rn(scale, v.w), acc.m)), acc.s) : 0.f;
            y.store(c, cols, e);
        }
    }
}

__device__ __forceinline__ void mk_softmax_run(const mk_instr& in, const mk_tensor* op,
                                               const mk_pages& pages)
{
    (void)pages;
    if (in.rows <= 0 || in.cols <= 0)
        return;
    mk_softmax_body(in, op);
}

#endif /* MEGAK_OP_SOFTMAX_CUH */
