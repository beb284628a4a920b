/* MK_OP_RMSNORM: for each row r in [row0, row0 + rows) of A (N = cols columns):
 *   out[r, c] = A[r, c] / sqrt(sum_c A[r, c]^2 / N + eps) * W[0, c]
 * eps = param's fp32 bits; W = tensor[MK_ARG_B] (one row). fp32 inside (IEEE sqrt and
 * division), rounded once to OUT's dtype; every tensor fp32 or bf16. Whole rows
 * (rowwise.cuh), no pages. Operands: A, B, OUT.
 *
 * Two passes over the row, a warp per row: the sum of squares, then the outputs. The body is
 * inlined (rowwise.cuh says why).
 */
#ifndef MEGAK_OP_RMSNORM_CUH
#define MEGAK_OP_RMSNORM_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "rowwise.cuh"

__device__ __forceinline__ bool mk_rmsnorm_check(const mk_instr& in)
{
    return mk_rowwise_check(in) && mk_param_ok(in, true);
}

__device__ __forceinline__ bool mk_rmsnorm_check_operands(const mk_instr& in, const mk_tensor* op)
{
    return mk_rowwise_operands_ok(in, op, 1u << MK_ARG_B);
}

/* All 256 threads; in.rows, in.cols >= 1. */
__device__ __forceinline__ void mk_rmsnorm_body(const mk_instr& in, const mk_tensor* op)
{
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const float eps = __uint_as_float(in.param);
    const int cols = in.cols;
    const mk_row w = mk_row_of(op[MK_ARG_B], 0);
    for (int i = warp; i < in.rows; i += MK_ROWWISE_WARPS) {
        const long long r = (long long)in.row0 + i;
        const mk_row x = mk_row_of(op[MK_ARG_A], r), y = mk_row_of(op[MK_ARG_OUT], r);
        float sq = 0.f;
        for (int c = 4 * lane; c < cols; c += 128) {
            const float4 v = x.load(c, cols);   /* zeros past the row's end */
            sq = __fadd_rn(sq, __fadd_rn(__fadd_rn(__fmul_rn(v.x, v.x), __fmul_rn(v.y, v.y)),
                                         __fadd_rn(__fmul_rn(v.z, v.z), __fmul_rn(v.w, v.w))));
        }
        const float ms = __fdiv_rn(mk_warp_sum(sq), (float)cols);
        const float rr = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(ms, eps)));
        for (int c = 4 * lane; c < cols; c += 128) {
            const float4 v = x.load(c, cols), g = w.load(c, cols);
            const float4 o = make_float4(__fmul_rn(__fmul_rn(v.x, rr), g.x),
                                         __fmul_rn(__fmul_rn(v.y, rr), g.y),
                                         __fmul_rn(__fmul_rn(v.z, rr), g.z),
                                         __fmul_rn(__fmul_rn(v.w, rr), g.w));
            y.store(c, cols, o);
        }
    }
}

__device__ __forceinline__ void mk_rmsnorm_run(const mk_instr& in, const mk_tensor* op,
                                               const mk_pages& pages)
{
    (void)pages;
    if (in.rows <= 0 || in.cols <= 0)
        return;
    mk_rmsnorm_body(in, op);
}

#endif /* MEGAK_OP_RMSNORM_CUH */
