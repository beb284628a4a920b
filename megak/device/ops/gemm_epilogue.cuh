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
 * Precision (the simulator computes in float32 with numpy): bias/residual adds and every
 * operation of the activations are IEEE round-to-nearest single operations in the
 * simulator's order (__fadd_rn / __fmul_rn / __fdiv_rn: no FMA contraction), so the only
 * differences come from tanhf / expf (CUDA: <= 2 ulp; numpy: <= 1 ulp):
 *   GELU  0.5 v (1 + tanhf(0.7978845608 (v + 0.044715 v^3)))   (tanhf, not tanh.approx)
 *   SILU  v / (1 + expf(-v))                                     (expf, not __expf: __expf
 *         is 2 + 1.16|v| ulp, hundreds of ulp for |v| ~ 80)
 *   RELU  v < 0 ? 0 : v                                          (NaN propagates, as np.maximum)
 * Note for tolerances: where tanh(u) ~ -1 (GELU at v < -2), 1 + tanh cancels, so a 1-ulp
 * difference in tanh is an absolute error ~ 0.5 |v| 2^-24 that is many ulp of the tiny result;
 * compare with an absolute tolerance scaled by |v|, not in ulp of the output.
 * bf16 output: cvt.rn (round to nearest even), NaN stays NaN.
 */
#ifndef MEGAK_OP_GEMM_EPILOGUE_CUH
#define MEGAK_OP_GEMM_EPILOGUE_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"

enum {
    MK_GEMM_STAGE_LD = 128,    /* floats per staging row */
    MK_GEMM_STAGE_ROWS = 32    /* staging rows per page */
};
static_assert(MK_GEMM_STAGE_LD * MK_GEMM_STAGE_ROWS * 4 == MK_PAGE_BYTES,
              "32 rows of 128 fp32 are one page");

/* ---- dtypes -------------------------------------------------------------------------- */

__device__ __forceinline__ mk_u32 mk_dtype_bytes(mk_u32 dtype)
{
    return dtype == MK_DTYPE_BF16 ? 2u : 4u;
}

__device__ __forceinline__ float mk_bf16_lo(mk_u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float mk_bf16_hi(mk_u32 w) { return __uint_as_float(w & 0xffff0000u); }

/* Round to nearest even; `lo` goes to the low half (the lower address). */
__device__ __forceinline__ mk_u32 mk_pack_bf16x2(float lo, float hi)
{
    mk_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ mk_u16 mk_to_bf16(float v)
{
    mk_u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}

/* Weak global accesses of 16/32-bit words, spelled in PTX for the reasons given in sync.cuh
 * (tensors are written by other SMs during the kernel: never .nc). */
__device__ __forceinline__ mk_u32 mk_ld_u16(const void* p)
{
    mk_u16 v;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 mk_ld_u32x2(const void* p)
{
    uint2 v;
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ void mk_st_u16(void* p, mk_u16 v)
{
    asm volatile("st.global.u16 [%0], %1;" : : "l"(p), "h"(v) : "memory");
}

__device__ __forceinline__ void mk_st_u32x2(void* p, uint2 v)
{
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" : : "l"(p), "r"(v.x), "r"(v.y) : "memory");
}

/* True when 4 consecutive elements at element offset `off` of `t` (and at off + k * ld for
 * every row k) can be moved as one vector: 16 B for fp32, 8 B for bf16. */
__device__ __forceinline__ bool mk_vec4_ok(const mk_tensor& t, mk_u64 off)
{
    const mk_u64 bytes = 4u * mk_dtype_bytes(t.dtype);
    return ((t.ptr + off * mk_dtype_bytes(t.dtype)) & (bytes - 1u)) == 0 && (t.ld & 3u) == 0;
}

/* Up to 4 consecutive elements of any dtype as floats, zero beyond n (n <= 0: all zero). */
__device__ __forceinline__ float4 mk_ld4_any(const mk_tensor& t, mk_u64 off, int n, bool vec)
{
    if (t.dtype != MK_DTYPE_BF16)
        return mk_ld_f4_edge(reinterpret_cast<const float*>(t.ptr) + off, n, vec);
    const mk_u16* p = reinterpret_cast<const mk_u16*>(t.ptr) + off;
    if (vec && n >= 4) {
        const uint2 w = mk_ld_u32x2(p);
        return make_float4(mk_bf16_lo(w.x), mk_bf16_hi(w.x), mk_bf16_lo(w.y), mk_bf16_hi(w.y));
    }
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (n > 0) v.x = mk_bf16_lo(mk_ld_u16(p));
    if (n > 1) v.y = mk_bf16_lo(mk_ld_u16(p + 1));
    if (n > 2) v.z = mk_bf16_lo(mk_ld_u16(p + 2));
    if (n > 3) v.w = mk_bf16_lo(mk_ld_u16(p + 3));
    return v;
}

/* Store the first min(n, 4) of v, rounded to t's dtype. */
__device__ __forceinline__ void mk_st4_any(const mk_tensor& t, mk_u64 off, float4 v, int n,
                                           bool vec)
{
    if (t.dtype != MK_DTYPE_BF16) {
        mk_st_f4_edge(reinterpret_cast<float*>(t.ptr) + off, v, n, vec);
        return;
    }
    mk_u16* p = reinterpret_cast<mk_u16*>(t.ptr) + off;
    if (vec && n >= 4) {
        mk_st_u32x2(p, make_uint2(mk_pack_bf16x2(v.x, v.y), mk_pack_bf16x2(v.z, v.w)));
        return;
    }
    if (n > 0) mk_st_u16(p, mk_to_bf16(v.x));
    if (n > 1) mk_st_u16(p + 1, mk_to_bf16(v.y));
    if (n > 2) mk_st_u16(p + 2, mk_to_bf16(v.z));
    if (n > 3) mk_st_u16(p + 3, mk_to_bf16(v.w));
}

/* ---- activation ------------------------------------------------------------------------ */

__device__ __forceinline__ float mk_act(float v, mk_u32 act)
{
    if (act == MK_ACT_RELU)
        return v < 0.f ? 0.f : v;
    if (act == MK_ACT_GELU) {
        const float v3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v);
        const float t = tanhf(__fmul_rn(0.7978845608f, __fadd_rn(v, v3)));
        return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.f, t));
    }
    if (act == MK_ACT_SILU)
        return __fdiv_rn(v, __fadd_rn(1.f, expf(-v)));
    return v;
}

__device__ __forceinline__ float4 mk_act4(float4 v, mk_u32 act)
{
    return make_float4(mk_act(v.x, act), mk_act(v.y, act), mk_act(v.z, act), mk_act(v.w, act));
}

__device__ __forceinline__ float4 mk_add4(float4 a, float4 b)
{
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}

/* ---- staging tile ---------------------------------------------------------------------- */

/* Chunk c (4 floats) of staging row r, in `page` = pages[r / MK_GEMM_STAGE_ROWS] (callers
 * hoist that shared-memory lookup of the page table). */
__device__ __forceinline__ float* mk_gemm_stage_at(float* page, int r, int c)
{
    return page + (r % MK_GEMM_STAGE_ROWS) * MK_GEMM_STAGE_LD + ((c ^ (r & 7)) << 2);
}

/* Page plan of both GEMM paths: the staging tile holds 32 rows per page, so a region of
 * `rows` rows keeps ceil(rows / 32) pages for the epilogue and hands the others back after
 * the k loop (megak/page_plan.py mirrors this). */
__device__ __forceinline__ int mk_gemm_pages_kept(int rows)
{
    const int kept = (rows + MK_GEMM_STAGE_ROWS - 1) / MK_GEMM_STAGE_ROWS;
    return kept < 1 ? 1 : (kept > 4 ? 4 : kept);
}

/* All threads, after the staging tile is complete and a barrier: the tile's rows x cols
 * outputs with the epilogue of in.flags. No barrier inside (threads may leave early). */
__device__ __forceinline__ void mk_gemm_epilogue(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
{
    const mk_tensor& TO = op[MK_ARG_OUT];
    const mk_tensor& TB = op[MK_ARG_BIAS];
    const mk_tensor& TR = op[MK_ARG_RESIDUAL];
    const mk_u32 flags = in.flags;
    const mk_u32 act = (flags & MK_FLAG_ACT_MASK) >> MK_FLAG_ACT_SHIFT;
    const bool has_bias = (flags & MK_FLAG_BIAS) != 0;
    const bool has_res = (flags & MK_FLAG_RESIDUAL) != 0;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rows = in.rows;
    const int nv = in.cols - 4 * lane;   /* valid columns of this lane's 4 (<= 0: none) */
    if (nv <= 0)
        return;

    /* region row i lands in output row out_row0 + i (split-K partials: their split's rows);
     * the residual stays at the logical row0 + i */
    const mk_u64 o_base = (mk_u64)in.out_row0 * TO.ld + in.col0;
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
                float4 x = v[j];
                if (has_bias)
                    x = mk_add4(x, bias);
                if (act != MK_ACT_NONE)
                    x = mk_act4(x, act);
                if (has_res)
                    x = mk_add4(x, res[j]);
                mk_st4_any(TO, o_base + (mk_u64)r * TO.ld + 4 * lane, x, nv, o_vec);
            }
        }
    }
}

#endif /* MEGAK_OP_GEMM_EPILOGUE_CUH */
