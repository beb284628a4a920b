/* MK_OP_TRANSPOSE: out[r, c] = A[c, r] for r in [row0, row0 + rows), c in [col0, col0 + cols)
 * (the region is in OUTPUT coordinates), rows, cols <= 64. One page. Operands: A, OUT.
 *
 * The tile goes through the page as S[j][i] = A[col0 + i][row0 + j] = out[row0 + j][col0 + i],
 * i.e. already in output order, 64 x 64 fp32 = exactly 16 KiB, so there is no room for a
 * padding column. Instead the 16-byte chunks of each row are XOR-swizzled:
 *
 *     S[j][i] lives at float  j * 64 + (((i >> 2) ^ (j >> 2)) << 2) + (i & 3)
 *
 *  - read phase: a warp loads 4 rows of A x 8 float4 (4 fully used 128-B lines) and each lane
 *    scatters its 4 values into 4 rows j of S. Lanes differ in (i & 3) and (j >> 2) & 7, which
 *    the swizzle maps onto 32 distinct banks: conflict-free scalar stores.
 *  - write phase: each lane reads one float4 S[j][4p..4p+3] (contiguous: the swizzle moves
 *    whole chunks) and stores it to out row j. Each 8-lane phase of the 128-bit shared load
 *    reads 8 different chunks of one row, which the XOR keeps in 8 different bank groups:
 *    conflict-free, and the global stores are again full 128-B lines.
 *  - all four loads of a thread are issued before any store (the whole 16 KiB tile in flight).
 *  - edges: scalar loads/stores for partial chunks, rows or unaligned tensors; values
 *    outside the region are never written.
 */
#ifndef MEGAK_OP_TRANSPOSE_CUH
#define MEGAK_OP_TRANSPOSE_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"

/* MK_TRANSPOSE_PAGES = 1, MK_TRANSPOSE_TILE = 64 come from instr.h. */
enum { MK_TRANSPOSE_OPERANDS = (1u << MK_ARG_A) | (1u << MK_ARG_OUT) };
static_assert(MK_TRANSPOSE_TILE == 64 && MK_TRANSPOSE_PAGES >= 1 &&
              MK_TRANSPOSE_TILE * MK_TRANSPOSE_TILE * 4 == MK_PAGE_BYTES,
              "the swizzle below assumes one 64 x 64 fp32 tile per page");

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

/* Float offset of S[j][i] in the page. */
__device__ __forceinline__ int mk_transpose_swz(int j, int i)
{
    return j * MK_TRANSPOSE_TILE + ((((i >> 2) ^ (j >> 2)) << 2) | (i & 3));
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
    float* s = pages[0];

    /* A warp task covers 4 rows x 8 chunks; 32 tasks tile 64 rows x 16 chunks. */
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    const int sub_row = lane >> 3, sub_chunk = lane & 7;

    float4 x[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int task = warp + 8 * t;
        const int i = 4 * (task >> 1) + sub_row;          /* row of the A tile */
        const int q = 8 * (task & 1) + sub_chunk;         /* chunk: j = 4q .. 4q+3 */
        const int n = i < ni ? nj - 4 * q : 0;
        x[t] = mk_ld_f4_edge(a + (mk_u64)i * lda + 4 * q, n, a_vec);
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int task = warp + 8 * t;
        const int i = 4 * (task >> 1) + sub_row;
        const int q = 8 * (task & 1) + sub_chunk;
        s[mk_transpose_swz(4 * q + 0, i)] = x[t].x;
        s[mk_transpose_swz(4 * q + 1, i)] = x[t].y;
        s[mk_transpose_swz(4 * q + 2, i)] = x[t].z;
        s[mk_transpose_swz(4 * q + 3, i)] = x[t].w;
    }
    __syncthreads();
    mk_trace_mark(MK_T_LOADED);
    mk_trace_mark(MK_T_COMPUTED);   /* nothing to compute: the rest is the store */

#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int task = warp + 8 * t;
        const int j = 4 * (task >> 1) + sub_row;          /* output row */
        const int p = 8 * (task & 1) + sub_chunk;         /* chunk: i = 4p .. 4p+3 */
        if (j < nj) {
            const float4 y = *reinterpret_cast<const float4*>(s + mk_transpose_swz(j, 4 * p));
            mk_st_f4_edge(o + (mk_u64)j * ldo + 4 * p, y, ni - 4 * p, o_vec);
        }
    }
    /* The interpreter's barrier after the op protects the page from the next instruction. */
}

#endif /* MEGAK_OP_TRANSPOSE_CUH */
