/* MK_OP_TRANSPOSE: out[r, c] = A[c, r] for r in [row0, row0 + rows), c in [col0, col0 + cols)
 * (the region is in OUTPUT coordinates), rows <= MK_TRANSPOSE_TILE = 128, cols <=
 * MK_TRANSPOSE_MAX_TILES x 128: up to 2 tiles of 128 x 128 side by side. No pages.
 * Operands: A, OUT.
 *
 * Why two tiles per instruction: with one, its loads are in flight only until they land;
 * while the tile is stored and the next instruction is handed over nothing is loading (W4
 * 2.98 TB/s against 3.78 for the copy). With two, each tile is two halves in two register
 * groups, and each half of the second tile is loaded as soon as the same half of the first
 * is stored: loads stay in flight through the stores (W4 3.23 TB/s). Written straight-line:
 * the same pipeline as a loop over up to 4 tiles, or the edge path as a loop, made ptxas
 * spill in the resident kernel's copy of the body (12-120 B, every form tried).
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
static_assert(MK_TRANSPOSE_MAX_TILES == 2, "mk_transpose_tiles is written for two tiles");
static_assert(MK_TRANSPOSE_TILE == 128 && MK_TRANSPOSE_PAGES == 0 && MK_THREADS == 256,
              "the block map below assumes a 128 x 128 tile (32 x 32 blocks of 4 x 4), 8 warps");

__device__ __forceinline__ bool mk_transpose_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 >= 0 && in.rows >= 0 && in.cols >= 0 &&
           in.rows <= MK_TRANSPOSE_TILE && in.cols <= MK_TRANSPOSE_MAX_TILES * MK_TRANSPOSE_TILE;
}

__device__ __forceinline__ bool mk_transpose_check_operands(const mk_instr& in,
                                                            const mk_tensor* op)
{
    return mk_f32_region_ok(op[MK_ARG_OUT], in.row0, in.rows, in.col0, in.cols) &&
           mk_f32_region_ok(op[MK_ARG_A], in.col0, in.cols, in.row0, in.rows);
}

/* This thread's place in a tile: block b at (P, Q) = (p0 + 4 (b & 1), q0 + 8 (b >> 1)). */
struct mk_transpose_lane {
    int p0, q0;
    __device__ __forceinline__ mk_transpose_lane()
    {
        const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
        p0 = 8 * (warp & 3) + (lane >> 3);
        q0 = 16 * (warp >> 2) + (lane & 7);
    }
};

/* Half H of a tile at an edge (blocks b = 2H, 2H + 1, which together complete each 128-B
 * output line of the warp): its 8 loads, x[j][k] = A row 4P + k, columns 4Q..4Q+3 of block
 * 2H + j; nothing outside the region. ni = A rows (output columns) left from this tile on,
 * nj = A columns (output rows). */
template <int H>
__device__ __forceinline__ void mk_transpose_load_edge(const mk_transpose_lane& t, const float* a,
                                                  mk_u32 lda, int ni, int nj, bool a_vec,
                                                  float4 (&x)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int p = t.p0 + 4 * j, q = t.q0 + 8 * H;
        const float* s = a + (mk_u64)(4 * p) * lda + 4 * q;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            x[j][k] = 4 * p + k < ni ? mk_ld_f4_edge(s + (mk_u64)k * lda, nj - 4 * q, a_vec)
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
}

/* Half H's 8 stores at an edge: output row 4Q + m, columns 4P..4P+3 = column m of the block,
 * inside the region only. */
template <int H>
__device__ __forceinline__ void mk_transpose_store_edge(const mk_transpose_lane& t, float* o,
                                                   mk_u32 ldo, int ni, int nj, bool o_vec,
                                                   const float4 (&x)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int p = t.p0 + 4 * j, q = t.q0 + 8 * H;
        float* d = o + (mk_u64)(4 * q) * ldo + 4 * p;
        const float4 y[4] = {make_float4(x[j][0].x, x[j][1].x, x[j][2].x, x[j][3].x),
                             make_float4(x[j][0].y, x[j][1].y, x[j][2].y, x[j][3].y),
                             make_float4(x[j][0].z, x[j][1].z, x[j][2].z, x[j][3].z),
                             make_float4(x[j][0].w, x[j][1].w, x[j][2].w, x[j][3].w)};
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            if (4 * q + m < nj)
                mk_st_f4_edge(d + (mk_u64)m * ldo, y[m], ni - 4 * p, o_vec);
        }
    }
}

/* The same halves for a whole aligned tile: no checks at all. */
template <int H>
__device__ __forceinline__ void mk_transpose_load_full(const mk_transpose_lane& t,
                                                       const float* a, mk_u32 lda,
                                                       float4 (&x)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const float* s = a + (mk_u64)(4 * (t.p0 + 4 * j)) * lda + 4 * (t.q0 + 8 * H);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            x[j][k] = mk_ld_f4(s + (mk_u64)k * lda);
    }
}

template <int H>
__device__ __forceinline__ void mk_transpose_store_full(const mk_transpose_lane& t, float* o,
                                                        mk_u32 ldo, const float4 (&x)[2][4])
{
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        float* d = o + (mk_u64)(4 * (t.q0 + 8 * H)) * ldo + 4 * (t.p0 + 4 * j);
        mk_st_f4(d, make_float4(x[j][0].x, x[j][1].x, x[j][2].x, x[j][3].x));
        mk_st_f4(d + ldo, make_float4(x[j][0].y, x[j][1].y, x[j][2].y, x[j][3].y));
        mk_st_f4(d + 2 * (mk_u64)ldo, make_float4(x[j][0].z, x[j][1].z, x[j][2].z, x[j][3].z));
        mk_st_f4(d + 3 * (mk_u64)ldo, make_float4(x[j][0].w, x[j][1].w, x[j][2].w, x[j][3].w));
    }
}

/* The instruction's one or two tiles, side by side along the output columns (tile 1: output
 * columns 128.., A rows 128..), in two register groups: group 0 holds the first halves of the
 * tiles, group 1 the second halves; a group is stored as soon as its loads land and reloaded
 * with the second tile's half while the other group's loads are in flight. 64 registers of
 * data, as for one tile. cols = output columns of the region, nj = its output rows. */
template <bool FULL>
__device__ __forceinline__ void mk_transpose_tiles(const float* a, mk_u32 lda, float* o,
                                                   mk_u32 ldo, int cols, int nj, bool a_vec,
                                                   bool o_vec)
{
    const mk_transpose_lane t;
    float4 x0[2][4], x1[2][4];
    if (!FULL) {
        /* edge regions (partial tiles, unaligned views): one tile after the other */
        mk_transpose_load_edge<0>(t, a, lda, cols, nj, a_vec, x0);
        mk_transpose_load_edge<1>(t, a, lda, cols, nj, a_vec, x1);
        mk_transpose_store_edge<0>(t, o, ldo, cols, nj, o_vec, x0);
        mk_transpose_store_edge<1>(t, o, ldo, cols, nj, o_vec, x1);
        if (cols > MK_TRANSPOSE_TILE) {   /* the second tile (straight-line: a loop spills) */
            const float* a1 = a + (mk_u64)MK_TRANSPOSE_TILE * lda;
            float* o1 = o + MK_TRANSPOSE_TILE;
            const int n1 = cols - MK_TRANSPOSE_TILE;
            mk_transpose_load_edge<0>(t, a1, lda, n1, nj, a_vec, x0);
            mk_transpose_load_edge<1>(t, a1, lda, n1, nj, a_vec, x1);
            mk_transpose_store_edge<0>(t, o1, ldo, n1, nj, o_vec, x0);
            mk_transpose_store_edge<1>(t, o1, ldo, n1, nj, o_vec, x1);
        }
        return;
    }
    /* whole aligned tiles (MK_TRANSPOSE_MAX_TILES = 2 of them at most), straight-line */
    mk_transpose_load_full<0>(t, a, lda, x0);
    mk_transpose_load_full<1>(t, a, lda, x1);
    if (cols > MK_TRANSPOSE_TILE) {
        const float* a1 = a + (mk_u64)MK_TRANSPOSE_TILE * lda;
        mk_transpose_store_full<0>(t, o, ldo, x0);
        mk_transpose_load_full<0>(t, a1, lda, x0);
        mk_transpose_store_full<1>(t, o, ldo, x1);
        mk_transpose_load_full<1>(t, a1, lda, x1);
        o += MK_TRANSPOSE_TILE;
    }
    mk_transpose_store_full<0>(t, o, ldo, x0);
    mk_transpose_store_full<1>(t, o, ldo, x1);
}

/* A function of its own, like the GEMM bodies: its registers are allocated apart from the
 * interpreter loop's (inlined there, the two together spill). */
__device__ __noinline__ void mk_transpose_body(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& A = op[MK_ARG_A];
    const mk_tensor& O = op[MK_ARG_OUT];
    const int nj = in.rows;   /* output rows    = columns of the A tiles */
    const int ni = in.cols;   /* output columns = rows of the A tiles */
    if (nj <= 0 || ni <= 0)
        return;
    const mk_u32 lda = A.ld, ldo = O.ld;
    const float* a = reinterpret_cast<const float*>(A.ptr) + (mk_u64)in.col0 * lda + in.row0;
    float* o = reinterpret_cast<float*>(O.ptr) + (mk_u64)in.row0 * ldo + in.col0;
    const bool a_vec = mk_vec_ok(a, lda);
    const bool o_vec = mk_vec_ok(o, ldo);
    /* No MK_T_LOADED / MK_T_COMPUTED marks: each warp stores as soon as its own loads land,
     * there is no block-wide "loaded" moment (the interpreter's defaults apply, as for copy). */
    if (ni % MK_TRANSPOSE_TILE == 0 && nj == MK_TRANSPOSE_TILE && a_vec && o_vec)
        mk_transpose_tiles<true>(a, lda, o, ldo, ni, nj, a_vec, o_vec);
    else
        mk_transpose_tiles<false>(a, lda, o, ldo, ni, nj, a_vec, o_vec);
}

__device__ __forceinline__ void mk_transpose_run(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
{
    (void)pages;
    mk_transpose_body(in, op);
}

#endif /* MEGAK_OP_TRANSPOSE_CUH */
