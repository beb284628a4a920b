/* MK_OP_ADD: out[r, c] = A[r, c] + B[r', c] for r in [row0, row0 + rows), c in [col0, col0 +
 * cols), with r' = r, or r' = 0 when B has one row (a row vector broadcast over A's rows:
 * decided by B's descriptor, the same rule as the simulator's). fp32 add (__fadd_rn), rounded
 * once to OUT's dtype; A, B, OUT each fp32 or bf16, or flagged fp32 (flag.cuh: small
 * intermediates, one element per thread there). No pages (MK_ADD_PAGES = 0).
 * Operands: A, B, OUT (MK_ADD_OPERANDS).
 *
 * Shape: the region is one index space of (row, 4-column unit) pairs, thread t taking units
 * t, t + 256, ... (like copy.cuh): every warp touches 32 consecutive units whatever the
 * width, and narrow regions keep all 256 threads busy. MK_ADD_UNROLL units per thread are
 * loaded before any is stored (loads in flight); each element is read and written by one
 * thread, so out == A or out == B (in place) is safe. The body is inlined into the
 * interpreter (rowwise.cuh says why).
 */
#ifndef MEGAK_OP_ADD_CUH
#define MEGAK_OP_ADD_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../epilogue.cuh"
#include "../flag.cuh"

enum { MK_ADD_UNROLL = 4 };

__device__ __forceinline__ bool mk_add_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 >= 0 && in.rows >= 0 && in.cols >= 0;
}

/* fp32, bf16 or flagged (flag.cuh) */
__device__ __forceinline__ bool mk_add_region_ok(const mk_tensor& t, long long r0, long long nr,
                                                 long long c0, long long nc)
{
    return mk_tensor_region_ok(t, r0, nr, c0, nc) || mk_flag_region_ok(t, r0, nr, c0, nc);
}

__device__ __forceinline__ bool mk_add_check_operands(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& B = op[MK_ARG_B];
    const bool bcast = B.rows == 1;
    const long long br0 = bcast ? 0 : in.row0, bn = bcast ? 1 : in.rows;
    return mk_add_region_ok(op[MK_ARG_A], in.row0, in.rows, in.col0, in.cols) &&
           mk_add_region_ok(op[MK_ARG_OUT], in.row0, in.rows, in.col0, in.cols) &&
           mk_add_region_ok(B, br0, bn, in.col0, in.cols);
}

/* All 256 threads; in.rows, in.cols >= 1. */
__device__ __forceinline__ void mk_add_body(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const mk_tensor& TO = op[MK_ARG_OUT];
    const bool bcast = TB.rows == 1;
    const int rows = in.rows, cols = in.cols;
    const int units = (cols + 3) >> 2;                 /* 4-column units per row */
    const long long total = (long long)rows * units;
    const mk_u64 a_org = (mk_u64)in.row0 * TA.ld + in.col0;
    const mk_u64 b_org = (bcast ? 0ull : (mk_u64)in.row0 * TB.ld) + in.col0;
    const mk_u64 o_org = (mk_u64)in.row0 * TO.ld + in.col0;
    /* every unit starts 4 columns after the region's origin, so the origin decides */
    const bool a_vec = mk_vec4_ok(TA, a_org), b_vec = mk_vec4_ok(TB, b_org),
               o_vec = mk_vec4_ok(TO, o_org);
    for (long long base = threadIdx.x; base < total; base += (long long)MK_THREADS * MK_ADD_UNROLL) {
        float4 x[MK_ADD_UNROLL], y[MK_ADD_UNROLL];
        int rr[MK_ADD_UNROLL], cc[MK_ADD_UNROLL];
#pragma unroll
        for (int u = 0; u < MK_ADD_UNROLL; ++u) {
            const long long idx = base + (long long)u * MK_THREADS;
            rr[u] = (int)(idx / units);
            cc[u] = 4 * (int)(idx - (long long)rr[u] * units);
            const int n = idx < total ? cols - cc[u] : 0;   /* valid columns of this unit */
            x[u] = mk_ld4_any(TA, a_org + (mk_u64)rr[u] * TA.ld + cc[u], n, a_vec);
            y[u] = mk_ld4_any(TB, b_org + (bcast ? 0ull : (mk_u64)rr[u] * TB.ld) + cc[u], n,
                              b_vec);
        }
#pragma unroll
        for (int u = 0; u < MK_ADD_UNROLL; ++u) {
            const long long idx = base + (long long)u * MK_THREADS;
            if (idx < total)
                mk_st4_any(TO, o_org + (mk_u64)rr[u] * TO.ld + cc[u], mk_add4(x[u], y[u]),
                           cols - cc[u], o_vec);
        }
    }
}

__device__ __forceinline__ void mk_add_run(const mk_instr& in, const mk_tensor* op,
                                           const mk_pages& pages)
{
    (void)pages;
    if (in.rows <= 0 || in.cols <= 0)
        return;
    if (mk_flag_any(op, true))
        mk_flag_elementwise<true>(in, op);   /* a small operand whose data is its flag */
    else
        mk_add_body(in, op);
}

#endif /* MEGAK_OP_ADD_CUH */
