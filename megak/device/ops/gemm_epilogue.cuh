/* MK_OP_GEMM epilogue, shared by the fp32 (FMA) and bf16 (tensor core) paths:
 *
 *   out[out_row0 + i, n] = round_to_out_dtype( act(acc[i, n] + bias[0, n])
 *                                              + residual[row0 + i, n] )
 *   (i = region row; out_row0 = row0 except for split-K partials)
 *
 * bias and residual are optional (MK_FLAG_BIAS / MK_FLAG_RESIDUAL), each fp32 or bf16
 * whatever the output's dtype; act comes from bits MK_FLAG_ACT_SHIFT.. of the flags.
 *
 * How: once the k loop is done, the op's 4 pages (64 KiB) are free, which is exactly one
 * 128 x 128 fp32 tile. Each path spills its accumulators there (the "staging tile"), and then
 * this single loop walks the tile row by row:
 *
 *   staging tile, rows 32p .. 32p+31 in the op's page p (p = 0..3), 512 B per row; the 16-B
 *   chunk c (columns 4c..4c+3) of row r lives at chunk c ^ (r & 7) of that row
 *
 *   warp w handles rows w, w + 8, w + 16, ...; lane l handles columns 4l .. 4l+3
 *
 * Why:
 *  - one row per warp = 128 contiguous outputs: the residual loads and the output stores are
 *    fully coalesced (512 B per warp for fp32, 256 B for bf16) whatever layout the
 *    accumulators had (the mma fragment layout would give 8-B pieces scattered over 8 rows);
 *  - each lane keeps the same 4 columns in every row, so the bias is loaded once per thread;
 *  - the per-element activation code exists once (a loop, not 64 unrolled copies per path),
 *    and the accumulator registers are dead by then: the epilogue adds no register pressure
 *    to the k loops;
 *  - the XOR swizzle keeps both the fragment writes (8 rows x 8..16 B per warp) and the row
 *    reads at the minimum number of shared-memory wavefronts;
 *  - up to 4 rows per warp are loaded (smem + residual) before any is stored, so 4 residual
 *    loads are in flight per warp; loading before storing is also what makes an in-place
 *    residual (residual == out) safe: every element is read and written by the same thread.
 * The cost is one 64 KiB shared write + read per tile (~1k cycles): noise next to the k loop
 * (>= 8k cycles of MMA per tile for K >= 256), and only valid rows are touched.
 *
 * Precision and the epilogue's semantics: epilogue.cuh (shared with REDUCE).
 */
#ifndef MEGAK_OP_GEMM_EPILOGUE_CUH
#define MEGAK_OP_GEMM_EPILOGUE_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../epilogue.cuh"

enum {
    MK_GEMM_STAGE_LD = 128     /* floats per staging row; MK_GEMM_STAGE_ROWS rows per page */
};
static_assert(MK_GEMM_STAGE_LD * MK_GEMM_STAGE_ROWS * 4 == MK_PAGE_BYTES,
              "32 rows of 128 fp32 are one page");

/* ---- staging tile ---------------------------------------------------------------------- */

/* Chunk c (4 floats) of staging row r, in `page` = pages[r / MK_GEMM_STAGE_ROWS] (callers
 * hoist that shared-memory lookup of the page table). */
__device__ __forceinline__ float* mk_gemm_stage_at(float* page, int r, int c)
{
    return page + (r % MK_GEMM_STAGE_ROWS) * MK_GEMM_STAGE_LD + ((c ^ (r & 7)) << 2);
}

/* Page plan of both GEMM paths: the staging tile holds 32 rows per page, so a region of
 * `rows` rows keeps ceil(rows / 32) pages for the epilogue and hands the others back after
 * the k loop (megak/ops/gemm.py's page plan says the same). */
__device__ __forceinline__ int mk_gemm_pages_kept(int rows)
{
    const int kept = (rows + MK_GEMM_STAGE_ROWS - 1) / MK_GEMM_STAGE_ROWS;
    return kept < 1 ? 1 : (kept > MK_GEMM_PAGES ? MK_GEMM_PAGES : kept);
}

/* All threads, after the staging tile is complete and a barrier: the tile's rows x cols
 * outputs with the epilogue of in.flags, region row i into output row out_row0 + i. No
 * barrier inside (threads may leave early). */
__device__ __forceinline__ void mk_gemm_epilogue_at(const mk_instr& in, const mk_tensor* op,
                                                    const mk_pages& pages, int out_row0)
{
    const mk_tensor& TO = op[MK_ARG_OUT];
    const mk_tensor& TB = op[MK_ARG_BIAS];
    const mk_tensor& TR = op[MK_ARG_RESIDUAL];
    const mk_u32 flags = in.flags;
    const mk_u32 act = mk_epilogue_act(flags);
    const bool has_bias = (flags & MK_FLAG_BIAS) != 0;
    const bool has_res = (flags & MK_FLAG_RESIDUAL) != 0;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rows = in.rows;
    const int nv = in.cols - 4 * lane;   /* valid columns of this lane's 4 (<= 0: none) */
    if (nv <= 0)
        return;

    /* region row i lands in output row out_row0 + i (split-K partials: their split's rows);
     * the residual stays at the logical row0 + i */
    const mk_u64 o_base = (mk_u64)out_row0 * TO.ld + in.col0;
    const bool o_vec = mk_vec4_ok(TO, o_base);
    mk_u64 r_base = 0;
    bool r_vec = false;
    if (has_res) {
        r_base = (mk_u64)in.row0 * TR.ld + in.col0;
        r_vec = mk_vec4_ok(TR, r_base);
    }
    float4 bias = make_float4(0.f, 0.f, 0.f, 0.f);
    if (has_bias)
        bias = mk_ld4_any(TB, (mk_u64)in.col0 + 4 * lane, nv, mk_vec4_ok(TB, in.col0));

    /* 32 rows per pass, all in one page: rows r0 + 8j with r0 % 32 = warp < 8. */
    static_assert(4 * (MK_THREADS / 32) == MK_GEMM_STAGE_ROWS, "one page per pass");
    for (int r0 = warp; r0 < rows; r0 += MK_GEMM_STAGE_ROWS) {
        float* const page = pages[r0 / MK_GEMM_STAGE_ROWS];
        float4 v[4], res[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = r0 + j * (MK_THREADS / 32);
            v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
            res[j] = v[j];
            if (r < rows) {
                v[j] = *reinterpret_cast<const float4*>(mk_gemm_stage_at(page, r, lane));
                if (has_res)
                    res[j] = mk_ld4_any(TR, r_base + (mk_u64)r * TR.ld + 4 * lane, nv, r_vec);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = r0 + j * (MK_THREADS / 32);
            if (r < rows) {
                const float4 x = mk_epilogue4(v[j], bias, res[j], has_bias, act, has_res);
                mk_st4_any(TO, o_base + (mk_u64)r * TO.ld + 4 * lane, x, nv, o_vec);
            }
        }
    }
}

__device__ __forceinline__ void mk_gemm_epilogue(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
{
    mk_gemm_epilogue_at(in, op, pages, in.out_row0);
}

#endif /* MEGAK_OP_GEMM_EPILOGUE_CUH */
