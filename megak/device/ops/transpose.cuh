/* MK_OP_TRANSPOSE: out[r, c] = A[c, r] for r in [row0, row0 + rows), c in [col0, col0 + cols)
 * (the region is in OUTPUT coordinates), rows, cols <= MK_TRANSPOSE_TILE = 128. Four pages.
 * Operands: A, OUT.
 *
 * Why 128 x 128: a transpose is one memory latency per instruction (load the tile, then store
 * it), so bytes per instruction are bytes in flight per SM. 64 KiB per SM (8.4 MB over 132
 * SMs) is ~2x HBM's bandwidth-delay product, where a 64 x 64 tile (16 KiB) capped the op near
 * 2 TB/s; and every row segment, read or written, is 512 contiguous bytes.
 *
 * The tile travels as A's rows, untransposed: S(i, j) = A[col0 + i][row0 + j] = out[row0 + j]
 * [col0 + i], i = A row (output column), j = A column (output row). A row is 128 floats =
 * 512 B = 32 chunks of 16 B; page i >> 5 holds rows 32 (i >> 5) .. + 31. Chunks are
 * XOR-swizzled within their row (there is no room for padding: 4 x 16 KiB exactly):
 *
 *     byte offset of S(i, j) in page i >> 5 =
 *         (i & 31) * 512  +  (((j >> 2) ^ (i >> 2)) & 31) * 16  +  (j & 3) * 4
 *
 * 1. Load: all 16 cp.async of a thread (the whole 64 KiB region per SM) are issued before
 *    anything waits; no registers hold data. Warp w, step k copies A row i = w + 8k (page
 *    k >> 2), lane = chunk q: one warp instruction reads 512 contiguous bytes (4 full lines).
 *    Shared side, conflict-free: a 16-B access is served per 8-lane phase; lanes 8m..8m+7 write
 *    chunks q ^ f (f = (i >> 2) & 31 fixed for the row) of one row; XOR with a constant maps
 *    the aligned group {8m..8m+7} onto an aligned group of 8 chunks = 128 B = all 32 banks once.
 * 2. cp.async.wait_all + barrier: the tile is visible to every thread.
 * 3. Store: a warp task is 4 output rows j (lane & 3 = j & 3) x 8 output chunks p (lane >> 2),
 *    i.e. 4 full 128-B lines of out per warp instruction. Lane (jl, pl) builds out[j][4p..4p+3]
 *    from 4 scalar reads S(4p + k, j), k = 0..3, then one 16-B store. Shared side,
 *    conflict-free: for fixed k the 32 lanes read rows i = 4p + k, so i >> 2 = p; the word
 *    index mod 32 is 4 * (((j >> 2) ^ p) & 7) + (j & 3) (row pitch 512 B and page bases are
 *    multiples of 128 B). j >> 2 is the same for the warp, p & 7 = pl takes 8 distinct values
 *    (p = 8 (warp & 3) + pl), so ((j >> 2) ^ p) & 7 does too, and j & 3 = jl spreads each over
 *    4 words: 32 distinct banks. Warp w always stores output chunks p of page w & 3.
 *  - edges: rows of A past the region are not loaded (nor read back); a partial chunk
 *    (region ends inside it) loads only its valid bytes and zero-fills; an A that is not
 *    16-B aligned (base or leading dimension) goes through 4-byte cp.async (same layout; its
 *    shared writes are 4-way conflicted, a rare path); an unaligned OUT or a partial output
 *    chunk is stored with scalars. Values outside the region are never written.
 */
#ifndef MEGAK_OP_TRANSPOSE_CUH
#define MEGAK_OP_TRANSPOSE_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"

/* MK_TRANSPOSE_PAGES = 4, MK_TRANSPOSE_TILE = 128 come from instr.h. */
enum {
    MK_TRANSPOSE_OPERANDS = (1u << MK_ARG_A) | (1u << MK_ARG_OUT),
    MK_TRANSPOSE_ROWS_PER_PAGE = MK_PAGE_BYTES / (MK_TRANSPOSE_TILE * 4)
};
static_assert(MK_TRANSPOSE_TILE == 128 && MK_TRANSPOSE_ROWS_PER_PAGE == 32 &&
              MK_TRANSPOSE_PAGES == MK_TRANSPOSE_TILE / MK_TRANSPOSE_ROWS_PER_PAGE &&
              MK_THREADS == 256,
              "the swizzle and the warp tasks below assume 128 x 128 fp32 over 4 pages, 8 warps");

__device__ __forceinline__ bool mk_transpose_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 >= 0 && in.rows >= 0 && in.cols >= 0 &&
           in.rows <= MK_TRANSPOSE_TILE && in.cols <= MK_TRANSPOSE_TILE;
}

__device__ __forceinline__ bool mk_transpose_check_operands(const mk_instr& in,
                                                            const mk_tensor* op)
{
    return mk_region_ok(op[MK_ARG_OUT], in.row0, in.rows, in.col0, in.cols) &&
           mk_region_ok(op[MK_ARG_A], in.col0, in.cols, in.row0, in.rows);
}

/* Byte offset of S(i, j) in page i >> 5 (0 <= i, j < 128). */
__device__ __forceinline__ mk_u32 mk_transpose_swz(int i, int j)
{
    return ((mk_u32)(i & 31) << 9) | ((mk_u32)(((j >> 2) ^ (i >> 2)) & 31) << 4) |
           ((mk_u32)(j & 3) << 2);
}

/* Step 1 of a 16-B aligned A: lane q's chunk of rows i = warp + 8k, k = 0..15 (page k >> 2,
 * i & 31 = warp + 8 (k & 3), i >> 2 = 2k + (warp >> 2)). FULL: whole chunks (bytes = 16). */
template <bool FULL>
__device__ __forceinline__ void mk_transpose_load_rows(const mk_u32* page, int warp, int q,
                                                       int ni, const float* src, mk_u64 step,
                                                       mk_u32 bytes)
{
    const int wq = warp >> 2;
#pragma unroll
    for (int k = 0; k < MK_TRANSPOSE_TILE / 8; ++k) {
        if (warp + 8 * k < ni) {
            const mk_u32 dst = page[k / 4] + (mk_u32)(warp + 8 * (k & 3)) * 512u +
                               ((mk_u32)((q ^ (2 * k + wq)) & 31) << 4);
            if (FULL)
                mk_cp_async_f4(dst, src);
            else
                mk_cp_async_f4z(dst, src, bytes);
        }
        src += step;
    }
}

__device__ __forceinline__ void mk_transpose_run(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
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
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;

    mk_u32 page[MK_TRANSPOSE_PAGES];
#pragma unroll
    for (int k = 0; k < MK_TRANSPOSE_PAGES; ++k)
        page[k] = mk_smem_addr(pages[k]);

    /* 1. load: rows i = warp + 8k, chunk q = lane. nq (valid floats of the chunk) is the same
     * for every row, so each lane takes one path for the whole tile. */
    {
        const int q = lane, nq = nj - 4 * q;
        const float* src = a + (mk_u64)warp * lda + 4 * q;
        const mk_u64 step = (mk_u64)8 * lda;
        if (nq >= 4 && a_vec) {
            mk_transpose_load_rows<true>(page, warp, q, ni, src, step, 16u);
        } else if (nq > 0 && a_vec) {   /* the region ends inside this lane's chunk */
            mk_transpose_load_rows<false>(page, warp, q, ni, src, step, 4u * (mk_u32)nq);
        } else if (nq > 0) {   /* A not 16-B aligned: the same layout, 4 bytes at a time */
#pragma unroll 4
            for (int k = 0; k < MK_TRANSPOSE_TILE / 8; ++k) {
                const int i = warp + 8 * k;
                if (i < ni) {
                    const mk_u32 dst = mk_smem_addr(pages[k / 4]) + mk_transpose_swz(i, 4 * q);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (e < nq)
                            mk_cp_async_f(dst + 4u * e, src + e);
                }
                src += step;
            }
        }
    }
    /* 2. the whole tile landed (this thread's copies), then everyone's */
    mk_cp_async_wait_all();
    __syncthreads();
    mk_trace_mark(MK_T_LOADED);
    mk_trace_mark(MK_T_COMPUTED);   /* nothing to compute: the rest is the store */

    /* 3. store: step t writes output row j = 4 (2t + (warp >> 2)) + (lane & 3), chunk p =
     * 8 (warp & 3) + (lane >> 2) (columns i = 4p .. 4p + 3, rows 4p + k of page warp & 3, so
     * the 4 reads are 512 B apart and i >> 2 = p for all of them) */
    {
        const int jl = lane & 3, p = 8 * (warp & 3) + (lane >> 2), i0 = 4 * p;
        const int n = ni - i0;   /* valid floats of the output chunk */
        const mk_u32 row = mk_smem_addr(pages[warp & 3]) + (mk_u32)(i0 & 31) * 512u +
                           (mk_u32)jl * 4u;
        const int j0 = 4 * (warp >> 2) + jl;
        if (n >= 4 && o_vec) {
            /* whole chunks: batches of 4 rows, their 16 shared reads before their 4 stores */
#pragma unroll
            for (int t0 = 0; t0 < MK_TRANSPOSE_TILE / 8; t0 += 4) {
                float4 y[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int j = j0 + 8 * (t0 + u);
                    if (j < nj) {
                        const mk_u32 at = row + ((mk_u32)(((j >> 2) ^ p) & 31) << 4);
                        y[u] = make_float4(mk_lds_f(at), mk_lds_f(at + 512u),
                                           mk_lds_f(at + 1024u), mk_lds_f(at + 1536u));
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int j = j0 + 8 * (t0 + u);
                    if (j < nj)
                        mk_st_f4(o + (mk_u64)j * ldo + i0, y[u]);
                }
            }
        } else if (n > 0) {   /* the region's last chunk, or an OUT not 16-B aligned */
            int j = j0;
            float* dst = o + (mk_u64)j * ldo + i0;
            const mk_u64 step = (mk_u64)8 * ldo;
            for (int t = 0; t < MK_TRANSPOSE_TILE / 8 && j < nj; ++t, j += 8, dst += step) {
                const mk_u32 at = row + ((mk_u32)(((j >> 2) ^ p) & 31) << 4);
                float4 y;
                y.x = mk_lds_f(at);
                y.y = n > 1 ? mk_lds_f(at + 512u) : 0.f;
                y.z = n > 2 ? mk_lds_f(at + 1024u) : 0.f;
                y.w = n > 3 ? mk_lds_f(at + 1536u) : 0.f;
                mk_st_f4_edge(dst, y, n, o_vec);
            }
        }
    }
    /* The interpreter's barrier after the op protects the pages from the next instruction. */
}

#endif /* MEGAK_OP_TRANSPOSE_CUH */
