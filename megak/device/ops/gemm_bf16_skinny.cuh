/* MK_OP_GEMM, skinny bf16 tiles: rows <= MK_GEMM_SKINNY_M (16) x cols <= MK_GEMM_SKINNY_MAX_N
 * (32) over the whole k range [k0, k0 + klen), fp32 accumulate, epilogue of gemm_epilogue.cuh.
 * Same contract as the 128 x 128 path (gemm_bf16.cuh); mk_gemm_run picks this one by shape.
 *
 * What it is for: a bf16 MLP at batch <= 16. Its GEMMs are pure weight streaming (M flops per
 * byte of B: the tensor cores idle, HBM is the limit), so the lowering gives each SM one narrow
 * column band of B (K x 8/16/32) and the whole K: no split-K, no reduce instruction, every byte
 * of B read once by one SM, about one instruction per SM per layer.
 *
 * Operands: B (the weights: the bytes that matter) streams through the op's 4 pages, a ring of
 * stages; A (16 x K, the previous layer's output, small and in L2) goes straight from global
 * memory into MMA fragments; mma.sync m16n8k16, the 16 rows are exactly one m16 tile and the
 * band is 1..4 n8 tiles ("planes").
 *
 *   stage s = page s % 4: k-rows [s kst, (s + 1) kst) of B's band, one plane per 8 columns
 *   (P = 1, 2 or 4 planes for cols <= 8, 16, 32; kst = 1024 / P k-rows: a full page)
 *
 *   +-------------------------+-------------------------+-----+
 *   | plane 0: cols 0..7      | plane 1: cols 8..15     | ... |   plane = kst x 16 B,
 *   | k-row r at 16 B slot    |                         |     |   16 KiB / P
 *   | r ^ ((r >> 2) & 6)      |                         |     |
 *   +-------------------------+-------------------------+-----+
 *
 *   cols 17..24 (3 n8 tiles, only an edge band) keep P = 4 and never load plane 3.
 *
 * Warps: all 8 split K. Warp w takes the 32-deep k blocks w, w + 8, ... of every stage (4 / P
 * per stage) and keeps a 16 x (8 P) fp32 partial (4 P accumulators per thread); after the
 * k loop the 8 partials are summed through shared memory into the epilogue's staging tile.
 *
 * Page plan (megak/ops/gemm.py's page plan says the same), positions in the op's page table:
 *   loader   B of stages 0 .. min(3, stages) - 1 into pages 0 .. (stage s = page s), when B is
 *            16-B aligned; before the dependency wait with MK_FLAG_B_READY (B has no producer),
 *            else after it. Nothing else: A is never staged.
 *   phase 1  k loop     pages 0..3 (the ring; stage s in page s % 4)   then releases 2, 3
 *   phase 2  reduction  page 1 (the 8 warps' partials), page 0 (staging) then releases 1
 *   phase 3  epilogue   page 0 (rows 0..15 of the staging tile); the interpreter frees it
 *
 * Why:
 *  - one plane per n8 tile, k-rows contiguous in it: an ldmatrix phase reads 8 k-rows x 16 B
 *    of one plane, and a k-row's 8 columns are exactly one 16-B cp.async chunk (B's global
 *    rows are 16..64 B wide: every chunk is a whole or half sector, nothing is read twice).
 *  - the k order inside each 32-deep block is permuted, identically for A and B (a sum does not
 *    care): MMA slot k of lane quad q is real k 8q + {0,1,4,5 | 2,3,6,7}, so a lane's A
 *    fragments for both k16 steps are 8 consecutive k of rows g and g + 8: two 16-B loads
 *    (with the natural order they would be eight 4-B loads of half-used sectors). For B the same
 *    order makes ldmatrix.x4.trans row addresses k-rows 8 (r / 2) + 2 i + r % 2 (lane 8 i + r);
 *    one x4 gives the B fragments of both k16 steps of one plane.
 *  - slot swizzle r ^ ((r >> 2) & 6): those 8 row addresses of one ldmatrix phase fall in 8
 *    different 16-B bank groups (bits 1-2 of the slot = i ^ (r / 2), bit 0 = r % 2); unswizzled
 *    they are 4-way conflicted. A warp's cp.async writes (32 consecutive chunks) stay a
 *    permutation of whole 128-B lines.
 *  - stage = one full page (1024 / P k-rows): the fewest barriers per byte, and 3 stages
 *    (48 KiB) in flight per SM cover the HBM latency at the SM's share of the bandwidth. For
 *    K = 1024, cols = 8 the whole band (16 KiB) is one stage, which the loader warp fetches
 *    before the dependency wait: the op itself only waits on A.
 *  - A is loaded one stage ahead into registers: a k block's fragments for stage s + 1 are
 *    requested as soon as stage s's MMAs have read them (one buffer of 32 registers), so their
 *    L2 latency overlaps the rest of stage s and the wait for B instead of adding to every
 *    stage. Never .nc: the previous layer wrote A during this kernel (sync.cuh).
 *  - zero fill of k-rows past klen up to the end of the 32-k block the MMAs read (st.shared)
 *    and of columns past cols (cp.async src-size): partial bands multiply zeros, never stale
 *    page bytes (0 * NaN). A rows past `rows` and k past klen are zeros in registers.
 *  - partials: 8 warps x 16 rows x 32 fp32 = exactly one page; pair slot pc of row r at
 *    pc ^ 4 (r & 3), so the fragment stores (8 rows x 4 pairs) and the row reads of the
 *    reduction both take the minimum 2 wavefronts.
 *  - B's tile origin or leading dimension not 16-B aligned (caller-provided buffers only): the
 *    compute warps load it with scalar loads into the same layout; the loader then preloads
 *    nothing (mk_gemm_bf16_skinny_preload_stages = 0).
 */
#ifndef MEGAK_OP_GEMM_BF16_SKINNY_CUH
#define MEGAK_OP_GEMM_BF16_SKINNY_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "gemm_epilogue.cuh"
#include "gemm_bf16.cuh"

/* MK_SKINNY_STAGES, MK_SKINNY_AHEAD, MK_SKINNY_STAGE_K(_LOG2): instr.h */
enum {
    MK_SKINNY_WARPS = MK_THREADS / 32,
    MK_SKINNY_PART_LD = 32,          /* floats per row of a warp's partial tile */
    MK_SKINNY_PART_FLOATS = MK_GEMM_SKINNY_M * MK_SKINNY_PART_LD,
    MK_SKINNY_BLOCKS = MK_SKINNY_STAGE_K / 32 / MK_SKINNY_WARPS   /* k blocks per warp per stage,
                                                                      with one plane */
};
static_assert(MK_SKINNY_STAGES <= MK_GEMM_PAGES, "records carry MK_GEMM_PAGES pages");
static_assert(MK_SKINNY_AHEAD == MK_SKINNY_STAGES - 1, "the ring keeps one stage to compute");
static_assert(MK_SKINNY_STAGE_K * 16 == MK_PAGE_BYTES, "a stage of one plane fills a page");
static_assert(MK_GEMM_SKINNY_M == 16, "the rows are one m16 MMA tile");
static_assert(MK_GEMM_SKINNY_MAX_N == 32, "at most 4 planes (n8 tiles)");
static_assert(MK_SKINNY_WARPS * MK_SKINNY_PART_FLOATS * 4 == MK_PAGE_BYTES,
              "the 8 warps' partials fill one page");
static_assert(MK_SKINNY_BLOCKS == 4, "A registers: 4 k blocks per warp per stage at most");

/* The tile shapes this path takes (bf16 operands, rows and cols >= 1). */
__device__ __forceinline__ bool mk_gemm_is_skinny(const mk_instr& in)
{
    return in.rows <= MK_GEMM_SKINNY_M && in.cols <= MK_GEMM_SKINNY_MAX_N;
}

/* log2 of the planes per stage: 1, 2 or 4 planes. */
__device__ __forceinline__ int mk_skinny_lg(int cols)
{
    return cols <= 8 ? 0 : (cols <= 16 ? 1 : 2);
}

__device__ __forceinline__ int mk_skinny_stages(int klen, int lg)
{
    const int kst_log2 = MK_SKINNY_STAGE_K_LOG2 - lg;
    return klen > 0 ? (klen + (1 << kst_log2) - 1) >> kst_log2 : 0;
}

/* Slot of k-row r in its plane (see "slot swizzle" above). */
__device__ __forceinline__ int mk_skinny_slot(int r)
{
    return r ^ ((r >> 2) & 6);
}

/* Stage s of B's band (k-rows from s * kst, gb = B[k0][col0]) into the page at shared address
 * st, by threads first, first + step, ...; chunk t = (k-row t >> lg, plane t & (P - 1)), so
 * consecutive threads read a k-row's columns contiguously. step is a multiple of P: a thread
 * keeps one plane and walks k-rows with a pointer increment (the loader warp runs this with
 * 56 registers). k-rows past klen are zeroed (st.shared: no global address needed) up to the
 * end of the last 32-deep block the MMAs read; planes past cols are not touched. vec: cp.async
 * (no commit here), else scalar loads + st.shared. */
__device__ __forceinline__ void mk_skinny_load_stage(mk_u32 st, int s, const mk_u16* gb,
                                                     mk_u32 ldb, int klen, int cols, int lg,
                                                     int first, int step, bool vec)
{
    const int kst_log2 = MK_SKINNY_STAGE_K_LOG2 - lg;
    const int c = first & ((1 << lg) - 1);
    const int nv = cols - 8 * c;
    if (nv <= 0)
        return;
    const int kb = s << kst_log2;
    const int kst = 1 << kst_log2;
    const int left = klen - kb;                        /* >= 1 for a stage that exists */
    const int zend = ((left + 31) & ~31) < kst ? ((left + 31) & ~31) : kst;
    const int end = left < zend ? left : zend;
    const int rstep = step >> lg;
    const mk_u32 dst = st + ((mk_u32)c << (kst_log2 + 4));
    int r = first >> lg;
    const mk_u16* src = gb + (mk_u64)(kb + r) * ldb + 8 * c;
#pragma unroll 1
    for (; r < end; r += rstep, src += (mk_u64)rstep * ldb)
        mk_gemm_bf16_chunk(dst + ((mk_u32)mk_skinny_slot(r) << 4), src, nv, vec, gb);
#pragma unroll 1
    for (; r < zend; r += rstep)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};"
                     : : "r"(dst + ((mk_u32)mk_skinny_slot(r) << 4)), "r"(0u) : "memory");
}

/* 16 B of global memory, weak and L2-only (sync.cuh: data other SMs wrote in this kernel). */
__device__ __forceinline__ void mk_skinny_ld16(mk_u32* w, const void* p)
{
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
}

/* 8 bf16 of one A row, k .. k + 7 (elements at or past `n` zero), as 4 packed words. The
 * element-wise path (the K edge, or A not 16-B aligned) is a rolled loop: it runs once per
 * GEMM at most on aligned data, and unrolled at every call site it would cost ~60 registers. */
__device__ __forceinline__ void mk_skinny_ld_a8(mk_u32* w, const mk_u16* p, int n, bool vec)
{
    if (vec && n >= 8) {
        mk_skinny_ld16(w, p);
        return;
    }
    mk_u64 lo = 0, hi = 0;
#pragma unroll 1
    for (int j = 0; j < n && j < 8; ++j) {
        const mk_u64 v = mk_ld_u16(p + j);
        if (j < 4)
            lo |= v << (16 * j);
        else
            hi |= v << (16 * (j - 4));
    }
    w[0] = (mk_u32)lo;
    w[1] = (mk_u32)(lo >> 32);
    w[2] = (mk_u32)hi;
    w[3] = (mk_u32)(hi >> 32);
}

/* The loader's share (pages.cuh, mk_preload_parts): B of the first min(3, stages) stages,
 * when B takes the cp.async path. */
__device__ __forceinline__ mk_u32 mk_gemm_bf16_skinny_preload_stages(const mk_instr& in,
                                                                     const mk_tensor* op)
{
    const mk_tensor& TB = op[MK_ARG_B];
    const mk_u64 b = TB.ptr + 2 * ((mk_u64)in.k0 * TB.ld + in.col0);
    if ((b & 15u) != 0 || (TB.ld & 7u) != 0 || in.rows <= 0 || in.cols <= 0)
        return 0;
    const int stages = mk_skinny_stages(in.klen, mk_skinny_lg(in.cols));
    return (mk_u32)(stages < MK_SKINNY_AHEAD ? stages : MK_SKINNY_AHEAD);
}

/* The 32 lanes of the loader warp: cp.async only (the interpreter commits and waits). A has a
 * producer and lives in registers, so MK_PRELOAD_REST has nothing to do. */
__device__ __forceinline__ void mk_gemm_bf16_skinny_preload(const mk_instr& in,
                                                            const mk_tensor* op,
                                                            const mk_pages& pages, mk_u32 lane,
                                                            mk_u32 parts)
{
    if (!(parts & MK_PRELOAD_B))
        return;
    const mk_tensor& TB = op[MK_ARG_B];
    const mk_u16* gb = reinterpret_cast<const mk_u16*>(TB.ptr) + (mk_u64)in.k0 * TB.ld + in.col0;
    const int lg = mk_skinny_lg(in.cols);
    const int stages = (int)mk_gemm_bf16_skinny_preload_stages(in, op);
    for (int s = 0; s < stages; ++s)
        mk_skinny_load_stage(mk_smem_addr(pages[s]), s, gb, TB.ld, in.klen, in.cols, lg,
                             (int)lane, 32, true);
}

/* Where this lane's A fragments come from (see mk_gemm_bf16_skinny_run). */
struct mk_skinny_a {
    const mk_u16* lo;    /* A row g, k 8q of the tile */
    const mk_u16* hi;    /* row g + 8 */
    int klen, q, warp, kst_log2;
    bool in_lo, in_hi, vec;
};

/* A of this warp's k block i of stage s (zeros where it is not live): words 0..3 row g,
 * 4..7 row g + 8. */
__device__ __forceinline__ void mk_skinny_load_a(mk_u32 (&w)[8], const mk_skinny_a& A, int i, int s)
{
    const int kb = (s << A.kst_log2) + 32 * (A.warp + MK_SKINNY_WARPS * i);
    const int n = A.klen - kb - 8 * A.q;
    const bool live = kb < A.klen;
    mk_skinny_ld_a8(w, A.lo + kb, live && A.in_lo ? n : 0, A.vec);
    mk_skinny_ld_a8(w + 4, A.hi + kb, live && A.in_hi ? n : 0, A.vec);
}

/* The k loop for bands of 2^LG planes: NBW = 4 >> LG k blocks per warp per stage. A is a ring
 * of 4 register buffers, 4 k blocks of this warp ahead: block t (= s NBW + i in stage order)
 * lives in slot t % 4, and block t + 4 (stage s + 4 / NBW) is requested as soon as block t's
 * MMAs have read it. So A is 1 stage ahead with one plane, 2 with two and 4 with four: a
 * stage of a wide band is short (its B page is 256 k-rows), and an L2 read of A under the
 * whole GPU's load takes ~2 us (measured): one stage of look-ahead left every stage waiting on
 * A (W2 4096: 27 us per layer against 8 us of weight streaming). The stage loop is unrolled
 * by 4 / NBW so every slot index is a compile-time register index. */
template <int LG>
__device__ __forceinline__ void mk_skinny_kloop(const mk_skinny_a& A, const mk_pages& pages,
                                                float (&acc)[4][4], int nst, int preloaded,
                                                int planes, const mk_u16* gb, mk_u32 ldb, int cols,
                                                mk_u32 b_frag, bool b_vec)
{
    constexpr int NBW = MK_SKINNY_BLOCKS >> LG;   /* k blocks per warp per stage: 4, 2, 1 */
    constexpr int U = MK_SKINNY_BLOCKS / NBW;     /* stages per ring turn: 1, 2, 4 */
    constexpr int kst_log2 = MK_SKINNY_STAGE_K_LOG2 - LG;
    const int tid = (int)threadIdx.x;

    mk_u32 a[4][8];
#pragma unroll
    for (int t = 0; t < 4; ++t)   /* in flight while the first stages of B are issued */
        mk_skinny_load_a(a[t], A, t % NBW, t / NBW);
    /* Prologue: stages 0..2 in flight, minus those the loader warp already filled. Always
     * commit (maybe empty) groups so that wait_group<AHEAD - 1> below means "stage s landed". */
#pragma unroll
    for (int s = 0; s < MK_SKINNY_AHEAD; ++s) {
        if (s < nst && s >= preloaded)
            mk_skinny_load_stage(mk_smem_addr(pages[s]), s, gb, ldb, A.klen, cols, LG, tid,
                                 MK_THREADS, b_vec);
        mk_cp_async_commit();
    }

    for (int s0 = 0; s0 < nst; s0 += U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + u;
            if (s >= nst)
                break;
            mk_cp_async_wait_group<MK_SKINNY_AHEAD - 1>();
            /* Stage s visible to all; every warp is done with stage s - 1, whose page the
             * next load overwrites: one barrier per stage. */
            mk_compute_sync();
            if (s == 0)
                mk_trace_mark(MK_T_LOADED);
            if (s + MK_SKINNY_AHEAD < nst)
                mk_skinny_load_stage(
                    mk_smem_addr(pages[(s + MK_SKINNY_AHEAD) & (MK_SKINNY_STAGES - 1)]),
                    s + MK_SKINNY_AHEAD, gb, ldb, A.klen, cols, LG, tid, MK_THREADS, b_vec);
            mk_cp_async_commit();

            const mk_u32 st = mk_smem_addr(pages[s & (MK_SKINNY_STAGES - 1)]);
#pragma unroll
            for (int i = 0; i < NBW; ++i) {
                const int slot = (u * NBW + i) & 3;
                const int kb = 32 * (A.warp + MK_SKINNY_WARPS * i);   /* inside the stage */
                if ((s << kst_log2) + kb >= A.klen)
                    continue;   /* warp-uniform; and nothing of later stages is live either */
                /* k16 step 0 takes words 0, 1 of each row, step 1 words 2, 3 */
                const mk_u32 a0[4] = {a[slot][0], a[slot][4], a[slot][1], a[slot][5]};
                const mk_u32 a1[4] = {a[slot][2], a[slot][6], a[slot][3], a[slot][7]};
#pragma unroll
                for (int p = 0; p < (1 << LG); ++p) {
                    if (p >= planes)
                        continue;
                    mk_u32 b[4];
                    mk_ldmatrix_x4_trans(b, st + ((mk_u32)p << (kst_log2 + 4)) +
                                                ((mk_u32)kb << 4) + b_frag);
                    mk_mma_bf16_16816(acc[p], a0, b);
                    mk_mma_bf16_16816(acc[p], a1, b + 2);
                }
                if (s + U < nst)
                    mk_skinny_load_a(a[slot], A, i, s + U);
            }
        }
    }
}

/* All 256 compute threads; 1 <= rows <= 16, 1 <= cols <= 32. Runs the epilogue. */
__device__ __forceinline__ void mk_gemm_bf16_skinny_run(const mk_instr& in, const mk_tensor* op,
                                                        const mk_pages& pages)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const int rows = in.rows, cols = in.cols, klen = in.klen > 0 ? in.klen : 0;
    const mk_u32 lda = TA.ld, ldb = TB.ld;
    /* Tile origins: A[row0][k0], B[k0][col0]. */
    const mk_u16* ga = reinterpret_cast<const mk_u16*>(TA.ptr) + (mk_u64)in.row0 * lda + in.k0;
    const mk_u16* gb = reinterpret_cast<const mk_u16*>(TB.ptr) + (mk_u64)in.k0 * ldb + in.col0;
    const bool a_vec = (((mk_u64)ga & 15u) == 0) && ((lda & 7u) == 0);
    const bool b_vec = (((mk_u64)gb & 15u) == 0) && ((ldb & 7u) == 0);

    const int lg = mk_skinny_lg(cols);
    const int kst_log2 = MK_SKINNY_STAGE_K_LOG2 - lg;
    const int nst = mk_skinny_stages(klen, lg);
    const int planes = (cols + 7) >> 3;            /* n8 tiles holding columns: 1..4 */
    const int preloaded = (int)pages.preloaded;

    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, q = lane & 3;

    /* A fragments of this lane: rows g and g + 8, k 8q .. 8q + 7 of each 32-deep block. */
    const mk_u16* a_lo = ga + (mk_u64)g * lda + 8 * q;
    const mk_u16* a_hi = a_lo + (mk_u64)8 * lda;
    const bool a_in_lo = g < rows, a_in_hi = g + 8 < rows;

    /* ldmatrix.x4.trans row of this lane inside a 32-deep block (see "Why"), as a byte offset. */
    const int kr = 8 * ((lane & 7) >> 1) + 2 * (lane >> 3) + (lane & 1);
    const mk_u32 b_frag = (mk_u32)mk_skinny_slot(kr) << 4;

    const mk_skinny_a A = {a_lo, a_hi, klen, q, warp, kst_log2, a_in_lo, a_in_hi, a_vec};

    float acc[4][4];
#pragma unroll
    for (int p = 0; p < 4; ++p)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            acc[p][e] = 0.f;

    /* The k loop, specialised per band width: the A ring's slots must be compile-time
     * register indices (mk_skinny_kloop). */
    if (lg == 0)
        mk_skinny_kloop<0>(A, pages, acc, nst, preloaded, planes, gb, ldb, cols, b_frag, b_vec);
    else if (lg == 1)
        mk_skinny_kloop<1>(A, pages, acc, nst, preloaded, planes, gb, ldb, cols, b_frag, b_vec);
    else
        mk_skinny_kloop<2>(A, pages, acc, nst, preloaded, planes, gb, ldb, cols, b_frag, b_vec);
    mk_trace_mark(MK_T_COMPUTED);

    /* Every warp is done with the ring (and no copy is pending: the groups after the last
     * stage are empty): pages 2 and 3 can go, and page 1 takes the partials. With one stage
     * (K <= 1024 / P, the W2 1024 layers) the ring never touched pages 1..3: no barrier. */
    if (nst > 1)
        mk_compute_sync();
    pages.release(2, 4);

    /* Partials -> page 1: fragment (p, h): row g + 8 h, cols 8 p + 2 q, + 1 = pair 4 p + q. */
    float* const part = pages[1] + warp * MK_SKINNY_PART_FLOATS;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        if (p >= planes)
            continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = g + 8 * h;
            *reinterpret_cast<float2*>(part + r * MK_SKINNY_PART_LD +
                                       2 * ((4 * p + q) ^ ((r & 3) << 2))) =
                make_float2(acc[p][2 * h], acc[p][2 * h + 1]);
        }
    }
    mk_compute_sync();

    /* Sum of the 8 partials in warp order, thread t: row t / 16, pair t % 16 -> staging tile
     * (rows 0..15 of page 0). */
    {
        const int r = tid >> 4, pc = tid & 15;
        if (r < rows && pc < 4 * planes) {
            const float* src = pages[1] + r * MK_SKINNY_PART_LD + 2 * (pc ^ ((r & 3) << 2));
            float2 v = *reinterpret_cast<const float2*>(src);
#pragma unroll
            for (int w = 1; w < MK_SKINNY_WARPS; ++w) {
                const float2 x = *reinterpret_cast<const float2*>(src + w * MK_SKINNY_PART_FLOATS);
                v.x += x.x;
                v.y += x.y;
            }
            *reinterpret_cast<float2*>(mk_gemm_stage_at(pages[0], r, pc >> 1) + 2 * (pc & 1)) = v;
        }
    }
    mk_compute_sync();
    pages.release(1, 2);
    mk_gemm_epilogue(in, op, pages);
}

/* Its own function, like the other GEMM bodies (gemm.cuh): its own register allocation. */
__device__ __noinline__ void mk_gemm_skinny(const mk_instr& in, const mk_tensor* op,
                                            unsigned char* page_base, const mk_u8* page_idx,
                                            mk_u32 preloaded, mk_u32* released)
{
    const mk_pages pages = {page_base, page_idx, preloaded, released, &mk_ctl().free_pages};
    mk_gemm_bf16_skinny_run(in, op, pages);
}

#endif /* MEGAK_OP_GEMM_BF16_SKINNY_CUH */
