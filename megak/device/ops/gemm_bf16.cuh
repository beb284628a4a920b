/* MK_OP_GEMM, bf16 operands on tensor cores (A and B of dtype MK_DTYPE_BF16), fp32 accumulate.
 * Same contract as the fp32 path (gemm.cuh): one 128 x 128 output tile, k in [k0, k0 + klen),
 * epilogue of gemm_epilogue.cuh. mma.sync.m16n8k16 (the Ampere-style warp MMA; Hopper's wgmma
 * would be faster, see the end of this comment).
 *
 * Pages: MK_GEMM_BF16_PAGES = 4, one per pipeline stage; a stage holds one 32-deep k slice:
 *
 *   page s (stage s = kt % 4)
 *   +--------------------------------------+--------------------------------------+
 *   | A slice  128 (m) x 32 (k) bf16       | B slice  32 (k) x 128 (n) bf16       |
 *   | 64 B per row = 4 chunks of 16 B      | 256 B per row = 16 chunks of 16 B    |
 *   | bytes 0 .. 8191                      | bytes 8192 .. 16383                  |
 *   +--------------------------------------+--------------------------------------+
 *
 *   4 stages = 3 slices in flight (cp.async, 16 B per copy, issued 3 k slices ahead) while one
 *   is multiplied: ~96 k of look-ahead, enough to cover HBM latency at the MMA rate.
 *   After the k loop the 4 pages become the fp32 staging tile of the epilogue.
 *
 * Warps: 8 warps as 2 (m) x 4 (n); warp w owns rows 64 (w / 4) .. +63, cols 32 (w % 4) .. +31:
 * 4 x 4 tiles of m16n8 = 64 fp32 accumulators per thread. Per k16 step a warp issues
 * 4 ldmatrix.x4 (A: one per m16 tile) + 2 ldmatrix.x4.trans (B: two n8 tiles each) for 16 MMAs.
 *
 * Swizzles (bank-conflict-free ldmatrix; an ldmatrix phase = 8 lanes x 16 B = 8 rows of one
 * 8x8 matrix, conflict-free iff the 8 chunks fall in 8 different 16-B bank groups, i.e. have
 * 8 different values of (byte address / 16) % 8):
 *   A: chunk c of row r is stored at chunk c ^ ((r >> 1) & 3). Rows are 64 B, so rows 2j and
 *      2j+1 share a 128-B bank line (bank groups 0-3 and 4-7). A phase reads rows r0..r0+7
 *      (r0 % 8 == 0) at the same logical chunk: bank group = 4 (r & 1) + (c ^ ((r >> 1) & 3)),
 *      8 distinct values. Unswizzled it would be 4-way.
 *   B: chunk c of k-row r is stored at chunk c ^ (r & 7). Rows are 256 B (a multiple of the
 *      128-B bank line), so bank group = stored chunk % 8; a phase reads k-rows r0..r0+7 at one
 *      logical chunk: c ^ 0..7, 8 distinct. Unswizzled it would be 8-way.
 *   The cp.async writes (a warp: 8 A rows x 4 chunks, or 2 B rows x 16 chunks, 512 B) are
 *   permutations of whole 128-B lines: no conflict either.
 * ldmatrix.trans turns B's row-major (k, n) 8x8 blocks into the "col" fragment mma wants,
 * so B is never transposed in memory.
 *
 * Edges: every copy is one 16-B chunk (8 elements). Rows/k beyond the region and the part of a
 * chunk beyond the region are zero-filled (cp.async src-size < 16), so partial tiles multiply
 * zeros, never garbage (0 * NaN would poison a valid output). When A's or B's tile origin or
 * leading dimension is not 16-B aligned (ld % 8 != 0: only caller-provided buffers), that
 * operand is loaded with bounds-checked scalar 16-bit loads into the same smem layout instead.
 *
 * Expected speed (not measured here): mma.sync on Hopper runs at well under the wgmma peak
 * (roughly half to two thirds of it in published microbenchmarks), and a 128 x 128 tile with
 * one block per SM and 8 warps leaves little latency slack: expect ~250-400 TFLOP/s on large
 * bf16 GEMMs, not the 650 target. That needs wgmma (m64nNk16 from shared-memory descriptors,
 * async, warpgroup-wide) + TMA, which we did not write blind: its descriptor/swizzle encoding
 * is easy to get subtly wrong and cannot be checked without the hardware.
 */
#ifndef MEGAK_OP_GEMM_BF16_CUH
#define MEGAK_OP_GEMM_BF16_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "gemm_epilogue.cuh"

/* MK_GEMM_BF16_BK, MK_GEMM_BF16_PRELOAD_STAGES: instr.h */
enum {
    MK_GEMM_BF16_STAGES = MK_GEMM_BF16_PAGES,   /* one page each */
    MK_GEMM_BF16_B_OFFSET = 128 * 32 * 2     /* bytes: B slice after the A slice */
};
static_assert(MK_GEMM_BF16_PRELOAD_STAGES < MK_GEMM_BF16_STAGES,
              "the op must find a stage empty to issue its next load into");
static_assert(MK_GEMM_BF16_B_OFFSET + MK_GEMM_BF16_BK * 128 * 2 == MK_PAGE_BYTES,
              "an A slice and a B slice fill one page");
static_assert(MK_THREADS == 256, "8 warps as 2 x 4, 2 A + 2 B chunks per thread per stage");


__device__ __forceinline__ int mk_clamp(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* ---- PTX wrappers (sm_80+) ---------------------------------------------------------------- */

/* 16 B global -> shared, of which the first `bytes` (0..16) are read and the rest zeroed.
 * .cg: L2 only, so data another SM wrote during the kernel is never served from a stale L1. */
__device__ __forceinline__ void mk_cp_async_16_zfill(mk_u32 dst, const void* src, mk_u32 bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 : : "r"(dst), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mk_ldmatrix_x4(mk_u32* r, mk_u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

/* Two 8x8 matrices: lanes 0-7 give the first's row addresses, lanes 8-15 the second's. */
__device__ __forceinline__ void mk_ldmatrix_x2(mk_u32* r0, mk_u32* r1, mk_u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                 : "=r"(*r0), "=r"(*r1) : "r"(addr) : "memory");
}

__device__ __forceinline__ void mk_ldmatrix_x4_trans(mk_u32* r, mk_u32 addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}

/* d += a (16 x 16, row) * b (16 x 8, col), bf16 in, fp32 accumulate. */
__device__ __forceinline__ void mk_mma_bf16_16816(float* d, const mk_u32* a, const mk_u32* b)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* One 16-B chunk (8 bf16) of global row data into shared memory at `dst`, elements at and
 * beyond n zero (n <= 0: all zero). `safe` is a valid address for a zero-byte copy. */
__device__ __forceinline__ void mk_gemm_bf16_chunk(mk_u32 dst, const mk_u16* src, int n, bool vec,
                                                   const mk_u16* safe)
{
    n = mk_clamp(n, 0, 8);
    if (vec) {
        mk_cp_async_16_zfill(dst, n > 0 ? src : safe, 2u * (mk_u32)n);
        return;
    }
    mk_u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const mk_u32 lo = 2 * i < n ? mk_ld_u16(src + 2 * i) : 0u;
        const mk_u32 hi = 2 * i + 1 < n ? mk_ld_u16(src + 2 * i + 1) : 0u;
        w[i] = lo | (hi << 16);
    }
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                 : : "r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}

/* The loader's share (pages.cuh, mk_preload_parts): the first min(3, k slices) stages, when
 * both operands take the 16-B cp.async path (the scalar fallback stays with the compute warps).
 * Same swizzled layout as `load` in mk_gemm_bf16_run; 32 lanes instead of 256 threads, so
 * 16 chunks of A and 16 of B per lane per stage. */
__device__ __forceinline__ mk_u32 mk_gemm_bf16_preload_stages(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const mk_u64 a = TA.ptr + 2 * ((mk_u64)in.row0 * TA.ld + in.k0);
    const mk_u64 b = TB.ptr + 2 * ((mk_u64)in.k0 * TB.ld + in.col0);
    const bool vec = ((a | b) & 15u) == 0 && ((TA.ld | TB.ld) & 7u) == 0;
    const int ntiles = (in.klen + MK_GEMM_BF16_BK - 1) / MK_GEMM_BF16_BK;
    return vec ? (mk_u32)mk_clamp(ntiles, 0, MK_GEMM_BF16_PRELOAD_STAGES) : 0u;
}

__device__ __forceinline__ void mk_gemm_bf16_preload(const mk_instr& in, const mk_tensor* op,
                                                     const mk_pages& pages, mk_u32 lane,
                                                     mk_u32 parts)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const int rows = in.rows, cols = in.cols, klen = in.klen;
    const mk_u16* ga = reinterpret_cast<const mk_u16*>(TA.ptr) + (mk_u64)in.row0 * TA.ld + in.k0;
    const mk_u16* gb = reinterpret_cast<const mk_u16*>(TB.ptr) + (mk_u64)in.k0 * TB.ld + in.col0;
    const int stages = (int)mk_gemm_bf16_preload_stages(in, op);
    /* not unrolled: the loader warp runs with 56 registers (issue rate is not the limit) */
#pragma unroll 1
    for (int st = 0; st < stages; ++st) {
        const mk_u32 base = mk_smem_addr(pages[st]);
        const int kb = st * MK_GEMM_BF16_BK;
#pragma unroll 1
        for (int c = (int)lane; c < 512; c += 32) {
            if (parts & MK_PRELOAD_REST) {   /* A: row r, chunk j (k 8j ..) */
                const int r = c >> 2, j = c & 3;
                const int n = r < rows ? mk_clamp(klen - kb - 8 * j, 0, 8) : 0;
                mk_cp_async_16_zfill(base + r * 64 + ((j ^ ((r >> 1) & 3)) << 4),
                                     n > 0 ? ga + (mk_u64)r * TA.ld + kb + 8 * j : ga, 2u * n);
            }
            if (parts & MK_PRELOAD_B) {      /* B: k-row r, chunk j (n 8j ..) */
                const int r = c >> 4, j = c & 15;
                const int n = kb + r < klen ? mk_clamp(cols - 8 * j, 0, 8) : 0;
                mk_cp_async_16_zfill(base + MK_GEMM_BF16_B_OFFSET + r * 256 + ((j ^ (r & 7)) << 4),
                                     n > 0 ? gb + (mk_u64)(kb + r) * TB.ld + 8 * j : gb, 2u * n);
            }
        }
    }
}

/* All 256 threads; in.rows, in.cols >= 1. Leaves the accumulators in the staging tile and runs
 * the epilogue. */
__device__ __forceinline__ void mk_gemm_bf16_run(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const int rows = in.rows, cols = in.cols, klen = in.klen;
    const mk_u32 lda = TA.ld, ldb = TB.ld;
    /* Tile origins: A[row0][k0], B[k0][col0]. */
    const mk_u16* ga = reinterpret_cast<const mk_u16*>(TA.ptr) + (mk_u64)in.row0 * lda + in.k0;
    const mk_u16* gb = reinterpret_cast<const mk_u16*>(TB.ptr) + (mk_u64)in.k0 * ldb + in.col0;
    const bool a_vec = (((mk_u64)ga & 15u) == 0) && ((lda & 7u) == 0);
    const bool b_vec = (((mk_u64)gb & 15u) == 0) && ((ldb & 7u) == 0);

    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;

    /* Loader roles, per stage: A rows la_r and la_r + 64, chunk la_c (k 8 la_c ..);
     * B k-rows lb_r and lb_r + 16, chunk lb_c (n 8 lb_c ..). Swizzled destinations (bytes in
     * the stage page); adding 64 to an A row or 16 to a B row keeps its swizzle. */
    const int la_r = tid >> 2, la_c = tid & 3;
    const int lb_r = tid >> 4, lb_c = tid & 15;
    const mk_u32 a_dst = (mk_u32)(la_r * 64 + ((la_c ^ ((la_r >> 1) & 3)) << 4));
    const mk_u32 b_dst = (mk_u32)(MK_GEMM_BF16_B_OFFSET + lb_r * 256 + ((lb_c ^ (lb_r & 7)) << 4));
    const mk_u16* a_src = ga + (mk_u64)la_r * lda + 8 * la_c;
    const mk_u16* b_src = gb + (mk_u64)lb_r * ldb + 8 * lb_c;
    const bool a_in0 = la_r < rows, a_in1 = la_r + 64 < rows;
    const int b_n = cols - 8 * lb_c;

    /* k slice kt into stage kt % 4 (one cp.async group per call, committed by the caller). */
    auto load = [&](int kt) {
        const mk_u32 st = mk_smem_addr(pages[kt & (MK_GEMM_BF16_STAGES - 1)]);
        const int kb = kt * MK_GEMM_BF16_BK;
        const int a_n = klen - kb - 8 * la_c;
        mk_gemm_bf16_chunk(st + a_dst, a_src + kb, a_in0 ? a_n : 0, a_vec, ga);
        mk_gemm_bf16_chunk(st + a_dst + 64 * 64, a_src + kb + (mk_u64)64 * lda,
                           a_in1 ? a_n : 0, a_vec, ga);
        const mk_u16* b = b_src + (mk_u64)kb * ldb;
        mk_gemm_bf16_chunk(st + b_dst, b, kb + lb_r < klen ? b_n : 0, b_vec, gb);
        mk_gemm_bf16_chunk(st + b_dst + 16 * 256, b + (mk_u64)16 * ldb,
                           kb + lb_r + 16 < klen ? b_n : 0, b_vec, gb);
    };

    /* ldmatrix roles. A (x4 = rows 0-7/8-15 x k 0-7/8-15 of an m16k16 tile = a0..a3): lane l
     * points at row l % 16 of the tile, logical chunk 2 ks + l / 16 -> stored chunk
     * (l / 16 ^ ((l >> 1) & 3)) ^ 2 ks (the tile's first row is a multiple of 8: same swizzle).
     * B (x4.trans = k 0-7/8-15 x two n8 tiles = b0 b1 of n-tile 2 nj, b0 b1 of 2 nj + 1): lane l
     * points at k-row 16 ks + l % 16, logical chunk 4 wn + 2 nj + l / 16 -> stored chunk
     * ((4 wn + l / 16) ^ (l & 7)) ^ 2 nj. */
    const int wm = warp >> 2, wn = warp & 3;
    const mk_u32 a_frag = (mk_u32)((64 * wm + (lane & 15)) * 64);
    const mk_u32 a_x = (mk_u32)((lane >> 4) ^ ((lane >> 1) & 3));
    const mk_u32 b_frag = (mk_u32)(MK_GEMM_BF16_B_OFFSET + (lane & 15) * 256);
    const mk_u32 b_y = (mk_u32)((4 * wn + (lane >> 4)) ^ (lane & 7));

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc[i][j][e] = 0.f;

    /* m16 / n8 tiles of this warp that hold any of the region (warp-uniform): a short tile
     * (a batch-16 MLP has rows = 16) skips the MMAs and fragment loads of all-zero tiles. */
    const int m_act = mk_clamp((rows - 64 * wm + 15) / 16, 0, 4);
    const int n_act = mk_clamp((cols - 32 * wn + 7) / 8, 0, 4);

    /* One k slice from stage address st: 2 k16 steps of 4 x 4 MMAs. FULL: every tile active
     * (the steady state; straight-line code the scheduler can interleave). A plain bool, not
     * a generic lambda (NVRTC 13.0 rejects those in device code): the lambda is inlined at
     * both call sites with a constant argument, so the tests fold away all the same. */
    auto mma_slice = [&](mk_u32 st, const bool FULL) {
#pragma unroll
        for (int ks = 0; ks < MK_GEMM_BF16_BK / 16; ++ks) {
            mk_u32 af[4][4], bfr[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
                if (FULL || mi < m_act)
                    mk_ldmatrix_x4(af[mi], st + a_frag + mi * 16 * 64 + ((a_x ^ (2 * ks)) << 4));
#pragma unroll
            for (int nj = 0; nj < 2; ++nj) {
                mk_u32 r[4] = {0u, 0u, 0u, 0u};
                if (FULL || 2 * nj < n_act)
                    mk_ldmatrix_x4_trans(r, st + b_frag + ks * 16 * 256 + ((b_y ^ (2 * nj)) << 4));
                bfr[2 * nj][0] = r[0];
                bfr[2 * nj][1] = r[1];
                bfr[2 * nj + 1][0] = r[2];
                bfr[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni)
                    if (FULL || (mi < m_act && ni < n_act))
                        mk_mma_bf16_16816(acc[mi][ni], af[mi], bfr[ni]);
        }
    };

    const int ntiles = (klen + MK_GEMM_BF16_BK - 1) / MK_GEMM_BF16_BK;
    /* Prologue: slices 0..2 in flight (those the loader warp preloaded are already there). Always commit (maybe empty) groups so that
     * wait_group<STAGES - 2> below always means "slice kt has landed". */
#pragma unroll
    for (int s = 0; s < MK_GEMM_BF16_STAGES - 1; ++s) {
        if (s < ntiles && s >= (int)pages.preloaded)   /* the loader's stages have landed */
            load(s);
        mk_cp_async_commit();
    }

    for (int kt = 0; kt < ntiles; ++kt) {
        mk_cp_async_wait_group<MK_GEMM_BF16_STAGES - 2>();
        /* Slice kt visible to all; and every warp is done with slice kt - 1, whose stage the
         * next load overwrites: one barrier per k slice. */
        mk_compute_sync();
        if (kt == 0)
            mk_trace_mark(MK_T_LOADED);
        if (kt + MK_GEMM_BF16_STAGES - 1 < ntiles)
            load(kt + MK_GEMM_BF16_STAGES - 1);
        mk_cp_async_commit();

        const mk_u32 st = mk_smem_addr(pages[kt & (MK_GEMM_BF16_STAGES - 1)]);
        if (m_act == 4 && n_act == 4)
            mma_slice(st, true);
        else if (m_act > 0 && n_act > 0)
            mma_slice(st, false);
    }
    mk_trace_mark(MK_T_COMPUTED);

    /* Every warp is done reading the stages (and no copy is pending: groups after the last
     * slice are empty) before the pages become the staging tile. Fragment (mi, ni): c0 c1 at
     * row g, cols 2q, 2q+1; c2 c3 at row g + 8 (g = lane / 4, q = lane % 4). */
    mk_compute_sync();
    /* Page plan: the staging tile needs only the pages of the region's rows (32 per page);
     * the others go back to the loader now, while this tile's epilogue runs. */
    const int kept = mk_gemm_pages_kept(rows);
    pages.release((mk_u32)kept, MK_GEMM_BF16_PAGES);
    const int g = lane >> 2, q = lane & 3;
    float* const stage[2] = {pages[2 * wm], pages[2 * wm + 1]};   /* rows 64 wm + 0..31, 32..63 */
#pragma unroll
    for (int mi = 0; mi < 4; ++mi) {
        if (2 * wm + (mi >> 1) >= kept)   /* rows past the region, on a released page */
            continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = 64 * wm + 16 * mi + 8 * h + g;
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int c = 32 * wn + 8 * ni + 2 * q;
                *reinterpret_cast<float2*>(mk_gemm_stage_at(stage[mi >> 1], r, c >> 2) + (c & 3)) =
                    make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        }
    }
    mk_compute_sync();
    mk_gemm_epilogue(in, op, pages);
}

#endif /* MEGAK_OP_GEMM_BF16_CUH */
