/* MK_OP_TRANSPOSE: out[r, c] = A[c, r] for r in [row0, row0 + rows), c in [col0, col0 + cols)
 * (the region is in OUTPUT coordinates), rows, cols <= MK_TRANSPOSE_TILE = 128. No pages.
 * Operands: A, OUT.
 *
 * Why 128 x 128: a transpose is one memory latency per instruction (load the tile, then store
 * it), so bytes per instruction are bytes in flight per SM. 64 KiB per SM (8.4 MB over 132
 * SMs) is ~2x HBM's bandwidth-delay product, where a 64 x 64 tile (16 KiB) capped the op near
 * 2 TB/s.
 *
 * Why registers and no shared memory: the tile is 1024 blocks of 4 x 4 floats, 4 per thread.
 * A thread loads its blocks' 4 A rows (float4 each), transposes them in registers (renaming
 * and a few moves) and stores 4 output rows (float4 each): 16 loads of 16 B in
 * flight per thread (64 registers: the compute warps have 224 after setmaxnreg), no barrier, no
 * shared-memory hop. The previous shared-memory version (cp.async tile, XOR swizzle, LDS) was
 * conflict-free by address, yet Nsight Compute counted ~6.5% extra LDS wavefronts: the
 * hardware bank-conflict counter also counts arbitration with other traffic on the L1 data
 * banks (cp.async fills, global stores), which no layout removes. Without the hop there is
 * nothing to conflict, and 2 LSU instructions move each 16 B instead of 3.
 *
 * Tile coordinates: S(i, j) = A[col0 + i][row0 + j] = out[row0 + j][col0 + i]. Block (P, Q) =
 * A rows 4P..4P+3 (output columns), A columns 4Q..4Q+3 (output rows), P, Q in 0..31.
 * Thread (warp w, lane l) holds blocks b = 0..3:
 *
 *     P = 8 (w & 3) + 4 (b & 1) + (l >> 3),     Q = 16 (w >> 2) + 8 (b >> 1) + (l & 7)
 *
 *  - load (b, k): A row 4P + k, columns 4Q..4Q+3. A warp instruction covers 4 rows (l >> 3)
 *    x 8 consecutive chunks (l & 7) = 4 whole 128-B lines: 16 sectors per request.
 *  - store (b, m): out row 4Q + m, columns 4P..4P+3 = (x[b][0].m, .., x[b][3].m). A warp
 *    instruction covers 8 rows (l & 7) x 4 consecutive chunks (l >> 3) = 8 x 64 B: 16 sectors
 *    per request; blocks b and b ^ 1 of the same warp complete each 128-B line. (16 sectors
 *    with rows 64-B aligned, ld % 16 == 0 as for 8192 x 8192; a ld only 16-B aligned costs
 *    up to 20 (loads) / 24 (stores) sectors per 512 B, the old 512-B rows 17.)
 *  - edges: rows of A past the region are not loaded, columns past it read as zero
 *    (mk_ld_f4_edge: scalars for a partial chunk or an A that is not 16-B aligned); output
 *    rows past the region are not stored, partial chunks and an unaligned OUT are stored with
 *    scalars (mk_st_f4_edge). Nothing outside the region is read or written.
 */
#ifndef MEGAK_OP_TRANSPOSE_CUH
#define MEGAK_OP_TRANSPOSE_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"

/* MK_TRANSPOSE_PAGES = 0, MK_TRANSPOSE_TILE = 128, MK_TRANSPOSE_OPERANDS come from instr.h. */
static_assert(MK_TRANSPOSE_TILE == 128 && MK_TRANSPOSE_PAGES == 0 && MK_THREADS == 256,
              "the block map below assumes a 128 x 128 tile (32 x 32 blocks of 4 x 4), 8 warps");

__device__ __forceinline__ bool mk_transpose_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 >= 0 && in.rows >= 0 && in.cols >= 0 &&
           in.rows <= MK_TRANSPOSE_TILE && in.cols <= MK_TRANSPOSE_TILE;
}

__device__ __forceinline__ bool mk_transpose_check_operands(const mk_instr& in,
                                                            const mk_tensor* op)
{
    return mk_f32_region_ok(op[MK_ARG_OUT], in.row0, in.rows, in.col0, in.cols) &&
           mk_f32_region_ok(op[MK_ARG_A], in.col0, in.cols, in.row0, in.rows);
}

/* The thread's 4 blocks: all 16 loads, then all 16 stores. FULL: a whole 128 x 128 region with
 * A and OUT 16-B aligned (every interior tile), no checks at all. ni = A rows (output
 * columns), nj = A columns (output rows). */
template <bool FULL>
__device__ __forceinline__ void mk_transpose_blocks(const float* a, mk_u32 lda, float* o,
                                                    mk_u32 ldo, int ni, int nj, bool a_vec,
                                                    bool o_vec)
{
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int p0 = 8 * (warp & 3) + (lane >> 3);    /* P of block 0; + 4 (b & 1) */
    const int q0 = 16 * (warp >> 2) + (lane & 7);   /* Q of block 0; + 8 (b >> 1) */
    float4 x[4][4];                                 /* [b][k]: A row 4P + k, columns 4Q.. */
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        const int p = p0 + 4 * (b & 1), q = q0 + 8 * (b >> 1);
        const float* s = a + (mk_u64)(4 * p) * lda + 4 * q;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (FULL)
                x[b][k] = mk_ld_f4(s + (mk_u64)k * lda);
            else
                x[b][k] = 4 * p + k < ni ? mk_ld_f4_edge(s + (mk_u64)k * lda, nj - 4 * q, a_vec)
                                         : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#pragma unroll
    for (int b = 0; b < 4; ++b) {
        const int p = p0 + 4 * (b & 1), q = q0 + 8 * (b >> 1);
        float* d = o + (mk_u64)(4 * q) * ldo + 4 * p;
        const float4 y[4] = {make_float4(x[b][0].x, x[b][1].x, x[b][2].x, x[b][3].x),
                             make_float4(x[b][0].y, x[b][1].y, x[b][2].y, x[b][3].y),
                             make_float4(x[b][0].z, x[b][1].z, x[b][2].z, x[b][3].z),
                             make_float4(x[b][0].w, x[b][1].w, x[b][2].w, x[b][3].w)};
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            if (FULL)
                mk_st_f4(d + (mk_u64)m * ldo, y[m]);
            else if (4 * q + m < nj)
                mk_st_f4_edge(d + (mk_u64)m * ldo, y[m], ni - 4 * p, o_vec);
        }
    }
}

/* A function of its own, like the GEMM bodies: its registers are allocated apart from the
 * interpreter loop's (inlined there, the two together spill). */
__device__ __noinline__ void mk_transpose_body(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& A = op[MK_ARG_A];
    const mk_tensor& O = op[MK_ARG_OUT];
    const int nj = in.rows;   /* output rows    = columns of the A tile */
    const int ni = in.cols;   /* output columns = rows of the A tile */
    if (nj <= 0 || ni <= 0)
        return;
    const mk_u32 lda = A.ld, ldo = O.ld;
    const float* a = reinterpret_cast<const float*>(A.ptr) + (mk_u64)in.col0 * lda + in.row0;
    float* o = reinterpret_cast<float*>(O.ptr) + (mk_u64)in.row0 * ldo + in.col0;
    const bool a_vec = mk_vec_ok(a, lda);
    const bool o_vec = mk_vec_ok(o, ldo);
    /* No MK_T_LOADED / MK_T_COMPUTED marks: each warp stores as soon as its own loads land,
     * there is no block-wide "loaded" moment (the interpreter's defaults apply, as for copy). */
    if (ni == MK_TRANSPOSE_TILE && nj == MK_TRANSPOSE_TILE && a_vec && o_vec)
        mk_transpose_blocks<true>(a, lda, o, ldo, ni, nj, a_vec, o_vec);
    else
        mk_transpose_blocks<false>(a, lda, o, ldo, ni, nj, a_vec, o_vec);
}

__device__ __forceinline__ void mk_transpose_run(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
{
    (void)pages;
    mk_transpose_body(in, op);
}

#endif /* MEGAK_OP_TRANSPOSE_CUH */
