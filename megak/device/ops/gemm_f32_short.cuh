/* MK_OP_GEMM, fp32, a short tile: at most MK_GEMM_F32_SHORT_ROWS (16) rows x 128 columns,
 * the shape of a batch-16 layer (a decode step's GEMM, a split-K part of one). Same contract
 * as the 128 x 128 fp32 tile (gemm.cuh), which takes every record this path does not:
 * both operands' origins 16-B aligned with ld % 4 == 0 (mk_gemm_f32_short_ok), so every copy
 * is one 16-B cp.async.
 *
 * Why a path of its own: the 128 x 128 tile's threads own rows 4ty.. and 64 + 4ty.., so with
 * 16 rows 6 of its 8 warps multiply zeros, its k loop runs 8x the FMAs the region needs and
 * its B stream is that loop's (W2-4096x8-fp32: 0.56 TB/s of weights). Here every warp works
 * on the region's rows: the k slice is split over the warps (warp w takes k-rows 4w .. 4w+3
 * of every 32-deep slice, for all 16 rows and all 128 columns), so each B element is read
 * from shared memory once and used for 16 FMAs; the 8 warps' partial tiles are summed at the
 * end. B streams through a 3-stage cp.async ring, two slices in flight while one is
 * multiplied, and the loader warp fills the first two stages before the op starts (B before
 * the dependency wait when it is a graph input, MK_FLAG_B_READY), as the bf16 tile does.
 *
 * Pages (MK_GEMM_PAGES = 4, the fp32 tile's):
 *
 *   page s = 0..2   B slice of stage s: 32 k-rows x 128 n fp32, 512 B per row (16 KiB)
 *   page 3          A slices: stage s at byte 2048 s, 16 rows x 32 k fp32 (128 B per row)
 *
 *   then the 8 warps' partial tiles, 16 x 128 fp32 each (8 KiB): warp w in page w / 2 at
 *   byte 8192 (w % 2); then the staging tile of the epilogue (gemm_epilogue.cuh), rows 0-15
 *   of page 0; pages 1-3 go back once the sums are read (the page plan of megak/ops/gemm.py:
 *   the fp32 tile's with one page kept, plus the loader's stages).
 *
 * Copies (16 B each, zero-filled past the region by cp.async's src-size):
 *   B chunk i (0..1023): k-row i / 32, columns 4 (i % 32) ..; a warp's 32 copies are one
 *   512-B row. A chunk i (0..127): row i / 8, k 4 (i % 8) ... The compute threads copy B
 *   chunks tid + 256 j and A chunk tid (tid < 128); the loader's lanes lane + 32 j.
 * Reads (per warp, per slice): lane l's 4 B float4 (k-rows 4w .. 4w+3, columns 4l ..): one
 *   512-B row per load, 4 wavefronts; then per row m the float4 A[m][4w .. 4w+3], the same
 *   address for the whole warp (a broadcast, 1 wavefront), for 16 FMAs.
 * Weights (B of a MK_FLAG_B_READY record) are copied with an L2 evict-first policy: read
 *   once, they should not push the activations and partials out of L2 (the weight stream's
 *   reason too, stream.cuh).
 */
#ifndef MEGAK_OP_GEMM_F32_SHORT_CUH
#define MEGAK_OP_GEMM_F32_SHORT_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../stream.cuh"
#include "gemm_epilogue.cuh"
/* mk_clamp: */
#include "gemm_bf16.cuh"

/* MK_GEMM_F32_SHORT_ROWS, _STAGES, _PRELOAD_STAGES: instr.h */
enum {
    MK_F32S_COLS = MK_GEMM_TILE_N,                             /* columns of the tile */
    MK_F32S_A_PAGE = MK_GEMM_F32_SHORT_STAGES,                 /* the page of the A slices */
    MK_F32S_A_BYTES = MK_GEMM_F32_SHORT_ROWS * MK_GEMM_BK * 4, /* one stage's A slice */
    MK_F32S_B_CHUNKS = MK_GEMM_BK * MK_F32S_COLS / 4,          /* 16-B copies of a B slice */
    MK_F32S_A_CHUNKS = MK_GEMM_F32_SHORT_ROWS * MK_GEMM_BK / 4,
    MK_F32S_PARTIAL_BYTES = MK_GEMM_F32_SHORT_ROWS * MK_F32S_COLS * 4
};
static_assert(MK_GEMM_BK * MK_F32S_COLS * 4 == MK_PAGE_BYTES, "a B slice is one page");
static_assert(MK_GEMM_F32_SHORT_STAGES + 1 <= MK_GEMM_PAGES, "the B stages and A's page");
static_assert(MK_GEMM_F32_SHORT_STAGES * MK_F32S_A_BYTES <= MK_PAGE_BYTES,
              "every stage's A slice fits one page");
static_assert(MK_GEMM_F32_SHORT_PRELOAD_STAGES < MK_GEMM_F32_SHORT_STAGES,
              "the op must find a stage empty to issue its next copies into");
static_assert(MK_GEMM_BK == 4 * (MK_THREADS / 32), "each warp takes 4 k-rows of a slice");
static_assert((MK_THREADS / 32) * MK_F32S_PARTIAL_BYTES == MK_GEMM_PAGES * MK_PAGE_BYTES,
              "the 8 warps' partial tiles fill the op's pages, two a page");
static_assert(2 * (MK_THREADS / 32) == MK_GEMM_F32_SHORT_ROWS,
              "the sum: rows w and w + 8 for warp w, as the epilogue walks them");
static_assert(MK_F32S_B_CHUNKS % MK_THREADS == 0 && MK_F32S_A_CHUNKS <= MK_THREADS &&
              MK_F32S_B_CHUNKS % 32 == 0 && MK_F32S_A_CHUNKS % 32 == 0, "copy roles");
static_assert(MK_GEMM_F32_SHORT_ROWS <= MK_GEMM_STAGE_ROWS, "the staging rows fit page 0");

/* Whether an fp32 GEMM tile record takes this path (the loader and the compute warps decide
 * alike, so the stages the loader fills are the ones the op expects). */
__device__ __forceinline__ bool mk_gemm_f32_short_ok(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const mk_u64 a = TA.ptr + 4 * ((mk_u64)in.row0 * TA.ld + (mk_u64)in.k0);
    const mk_u64 b = TB.ptr + 4 * ((mk_u64)in.k0 * TB.ld + (mk_u64)in.col0);
    return in.rows <= MK_GEMM_F32_SHORT_ROWS && ((a | b) & 15u) == 0 &&
           ((TA.ld | TB.ld) & 3u) == 0;
}

/* Where one record's copies come from (both roles). */
struct mk_f32s_source {
    const float* a;    /* A[row0][k0] */
    const float* b;    /* B[k0][col0] */
    mk_u32 lda, ldb;
    int rows, cols, klen;
    mk_u64 b_policy;   /* evict-first for weights (B has no producer), else normal */

    __device__ __forceinline__ mk_f32s_source(const mk_instr& in, const mk_tensor* op)
    {
        const mk_tensor& TA = op[MK_ARG_A];
        const mk_tensor& TB = op[MK_ARG_B];
        lda = TA.ld;
        ldb = TB.ld;
        a = reinterpret_cast<const float*>(TA.ptr) + (mk_u64)in.row0 * lda + in.k0;
        b = reinterpret_cast<const float*>(TB.ptr) + (mk_u64)in.k0 * ldb + in.col0;
        rows = in.rows;
        cols = in.cols;
        klen = in.klen;
        b_policy = (in.flags & MK_FLAG_B_READY) ? mk_policy_evict_first()
                                                : mk_policy_evict_normal();
    }

    /* 16 B of B from `src` into shared `dst`, of which the first `bytes` are read (the rest
     * zeroed; 0: `src` is not read, any valid address will do) */
    __device__ __forceinline__ void copy_b16(mk_u32 dst, const float* src, mk_u32 bytes) const
    {
        mk_cp_async_f4z_policy(dst, src, bytes, b_policy);
    }

    /* B chunk i of k slice kt into the slice's page at `page` (a shared address). */
    __device__ __forceinline__ void copy_b(mk_u32 page, int kt, int i) const
    {
        const int r = i >> 5, c = i & 31;
        const int k = kt * MK_GEMM_BK + r;
        const int n = k < klen ? mk_clamp(cols - 4 * c, 0, 4) : 0;
        copy_b16(page + (mk_u32)(r * MK_F32S_COLS + 4 * c) * 4u,
                 n > 0 ? b + (mk_u64)k * ldb + 4 * c : b, 4u * (mk_u32)n);
    }

    /* A chunk i of k slice kt into the stage's A slice at `slice` (a shared address). */
    __device__ __forceinline__ void copy_a(mk_u32 slice, int kt, int i) const
    {
        const int m = i >> 3, j = i & 7;
        const int k = kt * MK_GEMM_BK + 4 * j;
        const int n = m < rows ? mk_clamp(klen - k, 0, 4) : 0;
        const mk_u32 dst = slice + (mk_u32)(m * MK_GEMM_BK + 4 * j) * 4u;
        mk_cp_async_f4z(dst, n > 0 ? a + (mk_u64)m * lda + k : a, 4u * (mk_u32)n);
    }
};

/* The loader's share (pages.cuh, mk_preload_parts): the first stages, when the path applies. */
__device__ __forceinline__ mk_u32 mk_gemm_f32_short_preload_stages(const mk_instr& in,
                                                                   const mk_tensor* op)
{
    if (!mk_gemm_f32_short_ok(in, op))
        return 0u;
    const int ntiles = (in.klen + MK_GEMM_BK - 1) / MK_GEMM_BK;
    return (mk_u32)mk_clamp(ntiles, 0, MK_GEMM_F32_SHORT_PRELOAD_STAGES);
}

__device__ __forceinline__ void mk_gemm_f32_short_preload(const mk_instr& in, const mk_tensor* op,
                                                          const mk_pages& pages, mk_u32 lane,
                                                          mk_u32 parts)
{
    const mk_f32s_source src(in, op);
    const int stages = (int)mk_gemm_f32_short_preload_stages(in, op);
    const mk_u32 a_page = mk_smem_addr(pages[MK_F32S_A_PAGE]);
    /* not unrolled: the loader warp runs with 56 registers (issue rate is not the limit) */
#pragma unroll 1
    for (int st = 0; st < stages; ++st) {
        if (parts & MK_PRELOAD_B) {
            const mk_u32 page = mk_smem_addr(pages[st]);
#pragma unroll 1
            for (int i = (int)lane; i < MK_F32S_B_CHUNKS; i += 32)
                src.copy_b(page, st, i);
        }
        if (parts & MK_PRELOAD_REST) {
#pragma unroll 1
            for (int i = (int)lane; i < MK_F32S_A_CHUNKS; i += 32)
                src.copy_a(a_page + (mk_u32)(st * MK_F32S_A_BYTES), st, i);
        }
    }
}

/* One k slice of warp `warp`: its 4 k-rows of the B slice at `b` and of the A slice at `a`
 * (shared memory), for rows 0 .. M - 1. Straight-line (M a constant: the A loads issue ahead
 * of their FMAs); rows past the region hold zeros (the copies zero-fill them). */
template <int M>
__device__ __forceinline__ void mk_f32s_slice(float (&acc)[MK_GEMM_F32_SHORT_ROWS][4],
                                              const float* b, const float* a, int warp, int lane)
{
    float4 bk[4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
        bk[kk] = *reinterpret_cast<const float4*>(b + (4 * warp + kk) * MK_F32S_COLS + 4 * lane);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float4 av = *reinterpret_cast<const float4*>(a + m * MK_GEMM_BK + 4 * warp);
        const float ak[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            acc[m][0] = fmaf(ak[kk], bk[kk].x, acc[m][0]);
            acc[m][1] = fmaf(ak[kk], bk[kk].y, acc[m][1]);
            acc[m][2] = fmaf(ak[kk], bk[kk].z, acc[m][2]);
            acc[m][3] = fmaf(ak[kk], bk[kk].w, acc[m][3]);
        }
    }
}

/* All 256 threads; 1 <= in.rows <= 16, in.cols >= 1, mk_gemm_f32_short_ok. */
__device__ __forceinline__ void mk_gemm_f32_short_run(const mk_instr& in, const mk_tensor* op,
                                                      const mk_pages& pages)
{
    const mk_f32s_source src(in, op);
    const int rows = in.rows;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int ntiles = (in.klen + MK_GEMM_BK - 1) / MK_GEMM_BK;
    /* (pages[i] reads the slot's page table: a runtime index into an array of pointers
     * would put the array in local memory) */
    const float* const a_slices = pages[MK_F32S_A_PAGE];

    /* k slice kt into stage s (one cp.async group per call, committed by the caller).
     * This thread's B chunks (tid + 256 j: copy_b's chunk numbers) share one column chunk,
     * tid % 32, and lie 8 k-rows apart, and its A chunk (tid < 128) is one row's: their
     * addresses and byte counts are set up once, so that a slice inside K (all but the last)
     * costs a 64-bit add and a copy per chunk; the last slice takes copy_b / copy_a. */
    const int b_row = tid >> 5, b_chunk = tid & 31;
    const mk_u32 b_bytes = 4u * (mk_u32)mk_clamp(src.cols - 4 * b_chunk, 0, 4);
    const float* const b_from = b_bytes != 0 ? src.b + (mk_u64)b_row * src.ldb + 4 * b_chunk
                                             : src.b;
    const mk_u64 b_rows8 = b_bytes != 0 ? (mk_u64)8 * src.ldb : 0;   /* 8 k-rows, in floats */
    const mk_u64 b_slice = b_bytes != 0 ? (mk_u64)MK_GEMM_BK * src.ldb : 0;
    const mk_u32 b_to = (mk_u32)(b_row * MK_F32S_COLS + 4 * b_chunk) * 4u;
    const int a_row = tid >> 3, a_chunk = tid & 7;
    const bool a_copies = tid < MK_F32S_A_CHUNKS;
    const mk_u32 a_bytes = a_copies && a_row < src.rows ? 16u : 0u;
    const float* const a_from = a_bytes != 0 ? src.a + (mk_u64)a_row * src.lda + 4 * a_chunk
                                             : src.a;
    const mk_u32 a_to = mk_smem_addr(a_slices) + (mk_u32)(a_row * MK_GEMM_BK + 4 * a_chunk) * 4u;
    constexpr int B_PER_THREAD = MK_F32S_B_CHUNKS / MK_THREADS;
    static_assert(MK_THREADS / 32 * B_PER_THREAD == MK_GEMM_BK, "rows b_row + 8 j");
    auto load = [&](int kt, int s) {
        if ((kt + 1) * MK_GEMM_BK <= src.klen) {   /* inside K: every row of the slice */
            const mk_u32 dst = mk_smem_addr(pages[s]) + b_to;
            const float* from = b_from + (mk_u64)kt * b_slice;
#pragma unroll
            for (int j = 0; j < B_PER_THREAD; ++j)
                src.copy_b16(dst + (mk_u32)(8 * j * MK_F32S_COLS * 4), from + j * b_rows8,
                             b_bytes);
            if (a_copies)
                mk_cp_async_f4z(a_to + (mk_u32)(s * MK_F32S_A_BYTES),
                                a_bytes != 0 ? a_from + kt * MK_GEMM_BK : a_from, a_bytes);
            return;
        }
        const mk_u32 page = mk_smem_addr(pages[s]);
#pragma unroll
        for (int j = 0; j < B_PER_THREAD; ++j)
            src.copy_b(page, kt, tid + MK_THREADS * j);
        if (a_copies)
            src.copy_a(mk_smem_addr(a_slices) + (mk_u32)(s * MK_F32S_A_BYTES), kt, tid);
    };

    float acc[MK_GEMM_F32_SHORT_ROWS][4];
#pragma unroll
    for (int m = 0; m < MK_GEMM_F32_SHORT_ROWS; ++m)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            acc[m][j] = 0.f;

    /* Prologue: slices 0 .. STAGES - 2 in flight (those the loader preloaded have landed).
     * Always commit (maybe empty) groups, so that wait_group<STAGES - 2> below always means
     * "slice kt has landed". */
#pragma unroll
    for (int s = 0; s < MK_GEMM_F32_SHORT_STAGES - 1; ++s) {
        if (s < ntiles && s >= (int)pages.preloaded)
            load(s, s);
        mk_cp_async_commit();
    }
    if (ntiles == 0)
        mk_trace_mark(MK_T_LOADED);

    int s = 0;   /* the stage of slice kt: kt % STAGES */
    for (int kt = 0; kt < ntiles; ++kt) {
        mk_cp_async_wait_group<MK_GEMM_F32_SHORT_STAGES - 2>();
        /* slice kt visible to all, and every warp done with slice kt - 1, whose stage the
         * next copies overwrite: one barrier per slice */
        mk_compute_sync();
        if (kt == 0)
            mk_trace_mark(MK_T_LOADED);
        if (kt + MK_GEMM_F32_SHORT_STAGES - 1 < ntiles)
            load(kt + MK_GEMM_F32_SHORT_STAGES - 1, s == 0 ? MK_GEMM_F32_SHORT_STAGES - 1 : s - 1);
        mk_cp_async_commit();
        const float* a = a_slices + s * (MK_F32S_A_BYTES / 4);
        if (rows > MK_GEMM_F32_SHORT_ROWS / 2)
            mk_f32s_slice<MK_GEMM_F32_SHORT_ROWS>(acc, pages[s], a, warp, lane);
        else   /* batch 1-8: half the FMAs */
            mk_f32s_slice<MK_GEMM_F32_SHORT_ROWS / 2>(acc, pages[s], a, warp, lane);
        s = s == MK_GEMM_F32_SHORT_STAGES - 1 ? 0 : s + 1;
    }
    mk_trace_mark(MK_T_COMPUTED);

    /* Every warp done with the stages (no copy pending: the groups after the last slice are
     * empty), then each warp's partial tile, rows m < rows, lane l's columns 4l .. */
    mk_compute_sync();
    {
        float* const part = pages[warp >> 1] + (warp & 1) * (MK_F32S_PARTIAL_BYTES / 4);
#pragma unroll
        for (int m = 0; m < MK_GEMM_F32_SHORT_ROWS; ++m)
            if (m < rows)
                *reinterpret_cast<float4*>(part + m * MK_F32S_COLS + 4 * lane) =
                    make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
    }
    mk_compute_sync();
    /* The sums of rows warp and warp + 8, columns 4 lane .., in the order of the warps (the
     * same result run after run). */
    float4 sum[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = warp + 8 * h;
        sum[h] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r >= rows)
            continue;
#pragma unroll
        for (int w = 0; w < MK_THREADS / 32; ++w) {
            const float4 p = *reinterpret_cast<const float4*>(
                pages[w >> 1] + (w & 1) * (MK_F32S_PARTIAL_BYTES / 4) + r * MK_F32S_COLS +
                4 * lane);
            sum[h].x += p.x;
            sum[h].y += p.y;
            sum[h].z += p.z;
            sum[h].w += p.w;
        }
    }
    mk_compute_sync();   /* every partial read: page 0 becomes the staging tile */
    pages.release(1u, MK_GEMM_PAGES);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = warp + 8 * h;
        if (r < rows)
            *reinterpret_cast<float4*>(mk_gemm_stage_at(pages[0], r, lane)) = sum[h];
    }
    mk_compute_sync();
    mk_gemm_epilogue(in, op, pages);
}

#endif /* MEGAK_OP_GEMM_F32_SHORT_CUH */
