/* MK_OP_REDUCE: the sum of split-K partials, then the GEMM epilogue.
 *
 *   for i in [0, rows), j in [0, cols)   (rows <= 128, cols <= MK_REDUCE_MAX_COLS = 128):
 *     acc = P[row0 + i, col0 + j]
 *     acc = __fadd_rn(acc, P[s * k0 + row0 + i, col0 + j])   for s = 1 .. klen - 1, in order
 *     out[out_row0 + i, col0 + j] = round_to_out_dtype( act(acc + bias[0, col0 + j])
 *                                                        + residual[row0 + i, col0 + j] )
 *
 * P = tensor[MK_ARG_A] (fp32 or bf16): klen partials stacked by rows, k0 rows apart (the
 * row stride between splits, i.e. the GEMM's M). Bias, activation and residual: the one
 * epilogue (epilogue.cuh, as the GEMM's); each of bias, residual, out fp32 or bf16. No pages (MK_REDUCE_PAGES = 0).
 * Operands: A, OUT, BIAS, RESIDUAL (all four must name valid tensor slots, as for GEMM).
 *
 * Precision: the sum is sequential IEEE fp32 adds in split order (the simulator reproduces
 * it bit for bit); the epilogue's precision notes are gemm_epilogue.cuh's.
 *
 * Layout: warp w handles rows w, w + 8, w + 16, ...; lane l handles columns 4l .. 4l+3 (one
 * 128-column row per warp: coalesced, bias loaded once per thread). Each pass takes R rows
 * per warp (r0 + 8u, u < R) and walks the partials U at a time: R x U = 16 independent loads
 * (float4 where mk_vec4_ok allows) in flight per thread, i.e. 64 KiB per SM for fp32, then
 * the adds in order. R = 4, U = 4, except for a region of at most 16 rows (two a warp: a
 * split-K layer of batch 16), where R = 2, U = 8: its 8 partials (a 1024 x 1024 layer's) come
 * in one round trip instead of two, with no loads spent on rows past the region. Each round
 * trip to L2 is ~1.5 us while the SM's loader streams weights for its next instructions
 * (traced, benchmarks/ANALYSIS.md). Each element is read and written by the same thread, after all its
 * reads: an in-place output (out == residual, or out == partial 0 with out_row0 = row0) is
 * safe. No shared memory, no barrier (threads leave early). The body is __noinline__ like
 * the GEMM bodies: its own register allocation, nothing added to the interpreter's.
 */
#ifndef MEGAK_OP_REDUCE_CUH
#define MEGAK_OP_REDUCE_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../epilogue.cuh"

/* MK_REDUCE_MAX_ROWS, MK_REDUCE_MAX_COLS, MK_REDUCE_PAGES, MK_REDUCE_OPERANDS: instr.h */
enum {
    MK_REDUCE_WARPS = MK_THREADS / 32,
    MK_REDUCE_LOADS = 16,          /* loads in flight per thread: rows per pass x partials */
    MK_REDUCE_SHORT_ROWS = 2 * MK_REDUCE_WARPS   /* a region this short: 2 rows a warp */
};

static_assert(MK_REDUCE_MAX_COLS == 4 * 32, "one lane per 4 columns of a 128-column row");
static_assert(MK_REDUCE_PAGES == 0, "the reduce works in registers");

__device__ __forceinline__ bool mk_reduce_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 >= 0 && in.out_row0 >= 0 && in.rows >= 0 && in.cols >= 0 &&
           in.rows <= MK_REDUCE_MAX_ROWS && in.cols <= MK_REDUCE_MAX_COLS && in.k0 >= 0 &&
           in.klen >= 1 && mk_epilogue_check(in);
}

/* Debug mode: P holds rows up to (klen - 1) * k0 + row0 + rows (k0 >= 0 and row0 >= 0 were
 * checked by mk_reduce_check: the last partial is the furthest), out rows [out_row0,
 * out_row0 + rows); bias and residual as for GEMM; every tensor fp32 or bf16. */
__device__ __forceinline__ bool mk_reduce_check_operands(const mk_instr& in, const mk_tensor* op)
{
    const long long p_row0 = (long long)(in.klen - 1) * in.k0 + in.row0;
    return mk_epilogue_operands_ok(in, op) &&
           mk_tensor_region_ok(op[MK_ARG_A], p_row0, in.rows, in.col0, in.cols);
}

/* All 256 threads; in.rows, in.cols >= 1, in.klen >= 1; ROWS rows per warp a pass, the
 * partials UNROLL at a time. */
template <int ROWS, int UNROLL>
__device__ __noinline__ void mk_reduce_body(const mk_instr& in, const mk_tensor* op)
{
    static_assert(ROWS * UNROLL == MK_REDUCE_LOADS, "the loads in flight per thread");
    const mk_tensor& TP = op[MK_ARG_A];
    const mk_tensor& TO = op[MK_ARG_OUT];
    const mk_tensor& TB = op[MK_ARG_BIAS];
    const mk_tensor& TR = op[MK_ARG_RESIDUAL];
    const mk_u32 flags = in.flags;
    const mk_u32 act = mk_epilogue_act(flags);
    const bool has_bias = (flags & MK_FLAG_BIAS) != 0;
    const bool has_res = (flags & MK_FLAG_RESIDUAL) != 0;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rows = in.rows, klen = in.klen;
    const int nv = in.cols - 4 * lane;   /* valid columns of this lane's 4 (<= 0: none) */
    if (nv <= 0)
        return;

    /* Partial s of region row r: element p_base + s * p_step + r * ld (ld % 4 == 0 whenever
     * p_vec, so every such offset keeps the base's alignment). */
    const mk_u64 p_org = (mk_u64)in.row0 * TP.ld + in.col0;
    const bool p_vec = mk_vec4_ok(TP, p_org);
    const mk_u64 p_base = p_org + 4 * lane;
    const mk_u64 p_step = (mk_u64)in.k0 * TP.ld;
    const mk_u64 o_org = (mk_u64)in.out_row0 * TO.ld + in.col0;
    const bool o_vec = mk_vec4_ok(TO, o_org);
    const mk_u64 o_base = o_org + 4 * lane;
    mk_u64 r_base = 0;
    bool r_vec = false;
    if (has_res) {
        const mk_u64 r_org = (mk_u64)in.row0 * TR.ld + in.col0;
        r_vec = mk_vec4_ok(TR, r_org);
        r_base = r_org + 4 * lane;
    }
    float4 bias = make_float4(0.f, 0.f, 0.f, 0.f);
    if (has_bias)
        bias = mk_ld4_any(TB, (mk_u64)in.col0 + 4 * lane, nv, mk_vec4_ok(TB, in.col0));

    for (int r0 = warp; r0 < rows; r0 += ROWS * MK_REDUCE_WARPS) {
        float4 acc[ROWS], res[ROWS];
        int n_row[ROWS];   /* columns to load for row u (0: past the region) */
#pragma unroll
        for (int u = 0; u < ROWS; ++u) {
            const int r = r0 + u * MK_REDUCE_WARPS;
            n_row[u] = r < rows ? nv : 0;
            acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            res[u] = acc[u];
            if (has_res)   /* in flight with the first partials */
                res[u] = mk_ld4_any(TR, r_base + (mk_u64)r * TR.ld, n_row[u], r_vec);
        }
        for (int s = 0; s < klen; s += UNROLL) {
            float4 x[UNROLL][ROWS];
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const mk_u64 off = p_base + (mk_u64)(s + k) * p_step;
#pragma unroll
                for (int u = 0; u < ROWS; ++u) {
                    const int r = r0 + u * MK_REDUCE_WARPS;
                    x[k][u] = mk_ld4_any(TP, off + (mk_u64)r * TP.ld,
                                         s + k < klen ? n_row[u] : 0, p_vec);
                }
            }
            /* in split order; partial 0 is taken as is (no add: bit-exact, NaNs included) */
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                if (s + k < klen) {
#pragma unroll
                    for (int u = 0; u < ROWS; ++u)
                        acc[u] = s + k == 0 ? x[k][u] : mk_add4(acc[u], x[k][u]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < ROWS; ++u) {
            const int r = r0 + u * MK_REDUCE_WARPS;
            if (r < rows) {
                const float4 v = mk_epilogue4(acc[u], bias, res[u], has_bias, act, has_res);
                mk_st4_any(TO, o_base + (mk_u64)r * TO.ld, v, nv, o_vec);
            }
        }
    }
}

__device__ __forceinline__ void mk_reduce_run(const mk_instr& in, const mk_tensor* op,
                                              const mk_pages& pages)
{
    (void)pages;
    if (in.rows <= 0 || in.cols <= 0 || in.klen <= 0)
        return;
    if (in.rows <= MK_REDUCE_SHORT_ROWS)
        mk_reduce_body<2, MK_REDUCE_LOADS / 2>(in, op);
    else
        mk_reduce_body<4, MK_REDUCE_LOADS / 4>(in, op);
}

#endif /* MEGAK_OP_REDUCE_CUH */
