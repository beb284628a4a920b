/* MK_OP_LAYERNORM: for each row r in [row0, row0 + rows) of A (N = cols columns):
 *   mean = sum_c A[r, c] / N,  var = sum_c (A[r, c] - mean)^2 / N   (biased)
 *   out[r, c] = (A[r, c] - mean) / sqrt(var + eps) * W[0, c] + BIAS[0, c]
 * eps = param's fp32 bits; W = tensor[MK_ARG_B], BIAS = tensor[MK_ARG_BIAS] (one row each).
 * fp32 inside (IEEE sqrt and division), rounded once to OUT's dtype; every tensor fp32 or
 * bf16. Whole rows (rowwise.cuh), no pages. Operands: A, B, BIAS, OUT.
 *
 * Three passes over the row, a warp per row: the mean; the squared deviations from it (two
 * passes, so no cancellation: E[x^2] - mean^2 loses every digit when |mean| >> std); the
 * outputs. The body is inlined
 * (rowwise.cuh says why).
 */
#ifndef MEGAK_OP_LAYERNORM_CUH
#define MEGAK_OP_LAYERNORM_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "rowwise.cuh"

__device__ __forceinline__ bool mk_layernorm_check(const mk_instr& in)
{
    return mk_rowwise_check(in) && mk_param_ok(in, true);
}

__device__ __forceinline__ bool mk_layernorm_check_operands(const mk_instr& in,
                                                            const mk_tensor* op)
{
    return mk_rowwise_operands_ok(in, op, (1u << MK_ARG_B) | (1u << MK_ARG_BIAS));
}

/* All 256 threads; in.rows, in.cols >= 1. */
__device__ __forceinline__ void mk_layernorm_body(const mk_instr& in, const mk_tensor* op)
{
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const float eps = __uint_as_float(in.param);
    const int cols = in.cols;
    const float n = (float)cols;
    const mk_row w = mk_row_of(op[MK_ARG_B], 0), b = mk_row_of(op[MK_ARG_BIAS], 0);
    for (int i = warp; i < in.rows; i += MK_ROWWISE_WARPS) {
        const long long r = (long long)in.row0 + i;
        const mk_row x = mk_row_of(op[MK_ARG_A], r), y = mk_row_of(op[MK_ARG_OUT], r);
        float sum = 0.f;
        for (int c = 4 * lane; c < cols; c += 128)
            sum = __fadd_rn(sum, mk_sum4(x.load(c, cols)));   /* zeros past the row's end */
        const float mean = __fdiv_rn(mk_warp_sum(sum), n);
        float sq = 0.f;
        for (int c = 4 * lane; c < cols; c += 128) {
            const float4 v = x.load(c, cols);
            const int k = cols - c;   /* valid of these 4 */
            const float d0 = __fsub_rn(v.x, mean);
            const float d1 = k > 1 ? __fsub_rn(v.y, mean) : 0.f;
            const float d2 = k > 2 ? __fsub_rn(v.z, mean) : 0.f;
            const float d3 = k > 3 ? __fsub_rn(v.w, mean) : 0.f;
            sq = __fadd_rn(sq, __fadd_rn(__fadd_rn(__fmul_rn(d0, d0), __fmul_rn(d1, d1)),
                                         __fadd_rn(__fmul_rn(d2, d2), __fmul_rn(d3, d3))));
        }
        const float var = __fdiv_rn(mk_warp_sum(sq), n);
        const float rstd = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(var, eps)));
        for (int c = 4 * lane; c < cols; c += 128) {
            const float4 v = x.load(c, cols), g = w.load(c, cols), h = b.load(c, cols);
            float4 o;
            o.x = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v.x, mean), rstd), g.x), h.x);
            o.y = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v.y, mean), rstd), g.y), h.y);
            o.z = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v.z, mean), rstd), g.z), h.z);
            o.w = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(v.w, mean), rstd), g.w), h.w);
            y.store(c, cols, o);
        }
    }
}

__device__ __forceinline__ void mk_layernorm_run(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
{
    (void)pages;
    if (in.rows <= 0 || in.cols <= 0)
        return;
    mk_layernorm_body(in, op);
}

#endif /* MEGAK_OP_LAYERNORM_CUH */
