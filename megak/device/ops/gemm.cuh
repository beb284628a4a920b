/* MK_OP_GEMM: out[m, n] = act(sum_{k in [k0, k0 + klen)} A[m, k] * B[k, n] + bias[0, n])
 *                         + residual[m, n]
 *   for m in [row0, row0 + rows), n in [col0, col0 + cols); rows, cols <= 128; fp32
 *   accumulate; the result overwrites out row out_row0 + (m - row0) (= m except for split-K
 *   partials, which land in their split's rows of a scratch tensor), rounded to out's dtype.
 *   Operands: A (M x K), B (K x N), OUT (M x N), BIAS (1 x N, with MK_FLAG_BIAS),
 *   RESIDUAL (M x N, with MK_FLAG_RESIDUAL); activation in the flags (gemm_epilogue.cuh).
 *   A and B are both fp32 (this file, FMA pipes; a tile of <= 16 rows: gemm_f32_short.cuh) or
 *   both bf16 (gemm_bf16.cuh, tensor cores);
 *   bias, residual and out are each fp32 or bf16. Four pages either way
 *   (MK_GEMM_PAGES = MK_GEMM_BF16_PAGES). With MK_FLAG_STREAM: a bf16 GEMM of <= 64 rows whose
 *   B is streamed by the weight ring (gemm_stream.cuh, MK_STREAM_PAGES pages).
 *
 * Every slot of MK_GEMM_OPERANDS, bias and residual included, must name a valid tensor (the
 * interpreter prefetches and range-checks all of them); unused ones are ignored (slot 0 is fine).
 *
 * fp32 path: classic register-blocked SGEMM, one 128 x 128 output tile per instruction,
 *   pages As0 Bs0 As1 Bs1 (two stages of a 32-deep k tile):
 *
 *   page 0/2  As[k][m]  32 x 128 fp32 = 16 KiB, A tile transposed (so a k step reads m's
 *                       contiguously), 16-B chunks XOR-swizzled (see below)
 *   page 1/3  Bs[k][n]  32 x 128 fp32 = 16 KiB, B tile as is
 *
 *   thread t: tx = t % 16, ty = t / 16 owns rows {4ty..4ty+3, 64+4ty..64+4ty+3} x
 *   cols {4tx..4tx+3, 64+4tx..64+4tx+3}: 64 accumulators in registers. After the k loop they
 *   go to the staging tile in the same 4 pages and the shared epilogue stores them.
 *
 * Why:
 *  - 8 x 8 outputs per thread: each k step is 4 float4 shared loads for 64 FMAs, so the FMA
 *    pipe, not shared memory, is the limit.
 *  - the 4-row/4-col groups are split by 64 instead of being 8 contiguous: a warp's B reads are
 *    16 consecutive float4 (no conflict).
 *  - As is stored transposed with scalar stores; without a swizzle the 32 lanes of a warp
 *    (4 m values x 8 k chunks) would hit 4 banks (8-way conflict). The chunk holding
 *    m..m+3 at row k moves to chunk (m >> 2) ^ ((k >> 2) & 7): stores become conflict-free,
 *    the compute loop's float4 reads stay contiguous (it XORs its chunk index once per 4 k).
 *  - double buffering with one barrier per k tile: tile kt+1 is loaded into registers before
 *    tile kt is multiplied (the global latency hides behind 2048 FMAs per thread) and stored to
 *    the other stage afterwards.
 *  - float4 global loads where pointer and leading dimension allow; scalar loads with
 *    zero fill at the M/N/K edges, so any shape works and shared memory never holds garbage
 *    (0 * NaN would poison a valid output).
 *  - the op bodies are __noinline__: each gets its own register allocation instead of adding
 *    to the interpreter's (one call per 128 x 128 tile costs nothing measurable).
 */
#ifndef MEGAK_OP_GEMM_CUH
#define MEGAK_OP_GEMM_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../epilogue.cuh"
#include "gemm_epilogue.cuh"
#include "gemm_bf16.cuh"
#include "gemm_f32_short.cuh"
#include "gemm_stream.cuh"
#include "gemm_wgmma.cuh"

/* MK_GEMM_PAGES = 4, MK_GEMM_TILE_M = MK_GEMM_TILE_N = 128, MK_GEMM_BK = 32 and
 * MK_GEMM_OPERANDS come from instr.h. */
enum {
    MK_GEMM_TILE = 128
};

static_assert(MK_GEMM_TILE_M == MK_GEMM_TILE && MK_GEMM_TILE_N == MK_GEMM_TILE &&
              MK_GEMM_PAGES >= 4, "the layout below is a 128 x 128 tile on 4 pages");
static_assert(MK_GEMM_BF16_PAGES <= MK_GEMM_PAGES,
              "records are validated against MK_GEMM_PAGES whatever the operands' dtype");
static_assert(MK_THREADS == 256, "the GEMM thread layout assumes 256 threads");
static_assert(MK_GEMM_BK * MK_GEMM_TILE * 4 == MK_PAGE_BYTES, "a k tile of A or B is one page");

__device__ __forceinline__ bool mk_gemm_check(const mk_instr& in)
{
    /* a path this build lacks (instr.h, enum mk_bodies) fails the check */
    if (in.flags & MK_FLAG_WGMMA)
        return MK_BUILT(MK_BODY_GEMM_WGMMA) && !(in.flags & MK_FLAG_STREAM) &&
               in.pages >= MK_WGMMA_PAGES && mk_gemm_wgmma_check(in);
    if (in.flags & MK_FLAG_STREAM)
        return MK_BUILT(MK_BODY_GEMM_STREAM) && mk_gemm_stream_check(in);
    return MK_BUILT(MK_BODY_GEMM_TILED) && in.row0 >= 0 && in.col0 >= 0 && in.out_row0 >= 0 &&
           in.k0 >= 0 && in.rows >= 0 &&
           in.cols >= 0 && in.klen >= 0 && in.rows <= MK_GEMM_TILE && in.cols <= MK_GEMM_TILE &&
           mk_epilogue_check(in);
}

/* A and B of one dtype, inside their tensors, and the epilogue's operands. */
__device__ __forceinline__ bool mk_gemm_check_operands(const mk_instr& in, const mk_tensor* op)
{
    if (op[MK_ARG_B].dtype != op[MK_ARG_A].dtype)
        return false;
    if (in.flags & MK_FLAG_STREAM) {
        /* out_row0 is the band's combine counter; parts' rows in the partials tensor */
        const mk_u32 parts = mk_stream_parts(in);
        const mk_u32 dtype = mk_stream_f32(in) ? MK_DTYPE_F32 : MK_DTYPE_BF16;
        return op[MK_ARG_A].dtype == dtype && mk_epilogue_operands_ok_at(in, op, in.row0) &&
               mk_tensor_region_ok(op[MK_ARG_A], in.row0, in.rows, in.k0, in.klen) &&
               mk_tensor_region_ok(op[MK_ARG_B], in.k0, in.klen, in.col0, in.cols) &&
               (parts <= 1 || (op[MK_ARG_SPARE].dtype == MK_DTYPE_F32 &&
                               mk_tensor_region_ok(op[MK_ARG_SPARE], 0,
                                                   (parts - 1) * (mk_u32)MK_STREAM_M +
                                                       (mk_u32)in.row0 + (mk_u32)in.rows,
                                                   in.col0, in.cols)));
    }
    if ((in.flags & MK_FLAG_WGMMA) && op[MK_ARG_A].dtype != MK_DTYPE_BF16)
        return false;
    return mk_epilogue_operands_ok(in, op) &&
           mk_tensor_region_ok(op[MK_ARG_A], in.row0, in.rows, in.k0, in.klen) &&
           mk_tensor_region_ok(op[MK_ARG_B], in.k0, in.klen, in.col0, in.cols);
}

/* Global -> registers: this thread's 4 float4 of the A tile and 4 of the B tile. */
struct mk_gemm_stage {
    float4 a[4];
    float4 b[4];
};

/* All 256 threads; in.rows, in.cols >= 1. */
__device__ __forceinline__ void mk_gemm_f32_run(const mk_instr& in, const mk_tensor* op,
                                                const mk_pages& pages)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const int rows = in.rows, cols = in.cols, klen = in.klen;
    const mk_u32 lda = TA.ld, ldb = TB.ld;
    /* Tile origins: A[row0][k0], B[k0][col0]. */
    const float* ga = reinterpret_cast<const float*>(TA.ptr) + (mk_u64)in.row0 * lda + in.k0;
    const float* gb = reinterpret_cast<const float*>(TB.ptr) + (mk_u64)in.k0 * ldb + in.col0;
    const bool a_vec = mk_vec_ok(ga, lda);
    const bool b_vec = mk_vec_ok(gb, ldb);

    const int tid = (int)threadIdx.x;
    const int warp = tid >> 5;
    /* loader roles: A: row m = tid/8 + 32*it, k chunk tid%8; B: row k = tid/32 + 8*it, n chunk tid%32 */
    const int a_row = tid >> 3, a_kq = tid & 7;
    const int b_row = tid >> 5, b_nq = tid & 31;
    /* compute roles */
    const int tx = tid & 15, ty = tid >> 4;

    float* const as0 = pages[0];
    float* const bs0 = pages[1];
    float* const as1 = pages[2];
    float* const bs1 = pages[3];

    const int ntiles = (klen + MK_GEMM_BK - 1) / MK_GEMM_BK;

    mk_gemm_stage st;
    /* Load k tile kt into registers (zero outside the region). */
    auto load = [&](int kt) {
        const int kb = kt * MK_GEMM_BK;
        const int ka = kb + 4 * a_kq;
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int m = a_row + 32 * it;
            const int n = m < rows ? klen - ka : 0;
            st.a[it] = mk_ld_f4_edge(ga + (mk_u64)m * lda + ka, n, a_vec);
        }
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int k = kb + b_row + 8 * it;
            const int n = k < klen ? cols - 4 * b_nq : 0;
            st.b[it] = mk_ld_f4_edge(gb + (mk_u64)k * ldb + 4 * b_nq, n, b_vec);
        }
    };
    /* Registers -> one shared stage. A goes transposed + swizzled: element (m, k) of the tile
     * to As[k][(((m >> 2) ^ ((k >> 2) & 7)) << 2) | (m & 3)]. Here k >> 2 = a_kq and
     * m >> 2 = warp + 8*it, so the XOR only touches the warp bits. */
    auto store = [&](float* as, float* bs) {
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int col = ((((warp ^ a_kq) + 8 * it)) << 2) | (a_row & 3);
            float* p = as + (4 * a_kq) * MK_GEMM_TILE + col;
            p[0 * MK_GEMM_TILE] = st.a[it].x;
            p[1 * MK_GEMM_TILE] = st.a[it].y;
            p[2 * MK_GEMM_TILE] = st.a[it].z;
            p[3 * MK_GEMM_TILE] = st.a[it].w;
        }
#pragma unroll
        for (int it = 0; it < 4; ++it)
            *reinterpret_cast<float4*>(bs + (b_row + 8 * it) * MK_GEMM_TILE + 4 * b_nq) = st.b[it];
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
            acc[i][j] = 0.f;

    if (ntiles > 0) {
        load(0);
        store(as0, bs0);
    }
    mk_compute_sync();
    mk_trace_mark(MK_T_LOADED);

    for (int kt = 0; kt < ntiles; ++kt) {
        const bool odd = kt & 1;
        const float* as = odd ? as1 : as0;
        const float* bs = odd ? bs1 : bs0;
        const bool more = kt + 1 < ntiles;
        if (more)
            load(kt + 1);   /* in flight while this tile is multiplied */

#pragma unroll
        for (int k = 0; k < MK_GEMM_BK; ++k) {
            const int ca = ty ^ ((k >> 2) & 7);   /* swizzled chunk of rows 4ty.. (and +16) */
            const float4 a0 = *reinterpret_cast<const float4*>(as + k * MK_GEMM_TILE + 4 * ca);
            const float4 a1 = *reinterpret_cast<const float4*>(as + k * MK_GEMM_TILE + 4 * ca + 64);
            const float4 b0 = *reinterpret_cast<const float4*>(bs + k * MK_GEMM_TILE + 4 * tx);
            const float4 b1 = *reinterpret_cast<const float4*>(bs + k * MK_GEMM_TILE + 4 * tx + 64);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }

        if (more)
            store(odd ? as0 : as1, odd ? bs0 : bs1);
        mk_compute_sync();   /* stage kt may be overwritten by tile kt + 2 after this */
    }

    mk_trace_mark(MK_T_COMPUTED);

    /* Accumulators to the staging tile (the loop's last barrier freed the pages): rows
     * 4ty + i (+64), chunks tx (+16); then the shared epilogue. Page plan: pages past the
     * region's rows go back to the loader first (see mk_gemm_pages_kept). */
    const int kept = mk_gemm_pages_kept(in.rows);
    pages.release((mk_u32)kept, MK_GEMM_PAGES);
    const int page_of[2] = {ty >> 3, 2 + (ty >> 3)};   /* rows 4ty.., 64 + 4ty.. */
    float* const stage[2] = {pages[page_of[0]], pages[page_of[1] < kept ? page_of[1] : 0]};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (page_of[i >> 2] >= kept)   /* rows past the region, on a released page */
            continue;
        const int m = (i < 4 ? 0 : 64) + 4 * ty + (i & 3);
#pragma unroll
        for (int h = 0; h < 2; ++h)
            *reinterpret_cast<float4*>(mk_gemm_stage_at(stage[i >> 2], m, 16 * h + tx)) =
                make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2],
                            acc[i][4 * h + 3]);
    }
    mk_compute_sync();
    mk_gemm_epilogue(in, op, pages);
}

/* The op bodies are separate functions (see "Why" above); the dtype of A picks the path.
 * The page table travels by value: a reference would put it on the local stack; six
 * arguments still travel in registers (the allocator mask is at a fixed address). */
__device__ __noinline__ void mk_gemm_f32(const mk_instr& in, const mk_tensor* op,
                                         unsigned char* page_base, const mk_u8* page_idx,
                                         mk_u32 preloaded, mk_u32* released)
{
    const mk_pages pages = {page_base, page_idx, preloaded, released, &mk_ctl().free_pages};
    mk_gemm_f32_run(in, op, pages);
}

__device__ __noinline__ void mk_gemm_f32_short(const mk_instr& in, const mk_tensor* op,
                                               unsigned char* page_base, const mk_u8* page_idx,
                                               mk_u32 preloaded, mk_u32* released)
{
    const mk_pages pages = {page_base, page_idx, preloaded, released, &mk_ctl().free_pages};
    mk_gemm_f32_short_run(in, op, pages);
}

__device__ __noinline__ void mk_gemm_bf16(const mk_instr& in, const mk_tensor* op,
                                          unsigned char* page_base, const mk_u8* page_idx,
                                          mk_u32 preloaded, mk_u32* released)
{
    const mk_pages pages = {page_base, page_idx, preloaded, released, &mk_ctl().free_pages};
    mk_gemm_bf16_run(in, op, pages);
}

#if !MK_WGMMA_ONLY   /* there the body is inlined into the entry (pages.cuh) */
/* The Hopper tiles (MK_FLAG_WGMMA), a function of their own like the other bodies. */
__device__ __noinline__ void mk_gemm_wgmma(const mk_instr& in, const mk_tensor* op,
                                           unsigned char* page_base, const mk_u8* page_idx,
                                           mk_u32 preloaded, mk_u32* released)
{
    /* preloaded > 0: the loader produces the stages */
    const mk_pages pages = {page_base, page_idx, preloaded, released, &mk_ctl().free_pages};
    mk_gemm_wgmma_run(in, op, pages);
}
#endif

/* Its own function, like the other GEMM bodies, with their parameter list (another list cost
 * the separate-launch entry a stack frame): `stream` is the first stage position, with bit 31
 * set when the streamer delivers the stages (mk_pages.stream_stages > 0). One function per
 * form the dispatch tells apart (gemm_stream.cuh, mk_stream_form: why). */
template <int FORM>
__device__ __noinline__ void mk_gemm_stream(const mk_instr& in, const mk_tensor* op,
                                            unsigned char* page_base, const mk_u8* page_idx,
                                            mk_u32 stream, mk_u32* released)
{
    const mk_pages pages = {page_base, page_idx, 0u, released, &mk_ctl().free_pages,
                            stream & 0x7fffffffu, stream >> 31};
    mk_gemm_stream_run<FORM>(in, op, pages);
}

__device__ __forceinline__ void mk_gemm_run(const mk_instr& in, const mk_tensor* op,
                                            const mk_pages& pages)
{
    if (in.rows <= 0 || in.cols <= 0)
        return;
    /* (each path is called only where the build holds it: instr.h, enum mk_bodies) */
    if (in.flags & MK_FLAG_WGMMA) {
#if !MK_WGMMA_ONLY
        if (MK_BUILT(MK_BODY_GEMM_WGMMA))
            mk_gemm_wgmma(in, op, pages.base, pages.idx, pages.preloaded, pages.released);
#endif
    }
    else if (in.flags & MK_FLAG_STREAM) {
        if (MK_BUILT(MK_BODY_GEMM_STREAM)) {
            const bool ring = pages.stream_stages > 0;
            const mk_u32 stream = pages.stream_pos | (ring ? 0x80000000u : 0u);
            const mk_stream_form form = mk_gemm_stream_form(in, ring);
            if (form == MK_STREAM_NARROW)
                mk_gemm_stream<MK_STREAM_NARROW>(in, op, pages.base, pages.idx, stream,
                                                 pages.released);
            else if (form == MK_STREAM_ROWS8)
                mk_gemm_stream<MK_STREAM_ROWS8>(in, op, pages.base, pages.idx, stream,
                                                pages.released);
            else if (form == MK_STREAM_F32)
                mk_gemm_stream<MK_STREAM_F32>(in, op, pages.base, pages.idx, stream,
                                              pages.released);
            else if (form == MK_STREAM_DIRECT)
                mk_gemm_stream<MK_STREAM_DIRECT>(in, op, pages.base, pages.idx, stream,
                                                 pages.released);
            else
                mk_gemm_stream<MK_STREAM_ANY>(in, op, pages.base, pages.idx, stream,
                                              pages.released);
        }
    }
    else if (!MK_BUILT(MK_BODY_GEMM_TILED))
        return;
    else if (op[MK_ARG_A].dtype == MK_DTYPE_BF16)
        mk_gemm_bf16(in, op, pages.base, pages.idx, pages.preloaded, pages.released);
    else if (mk_gemm_f32_short_ok(in, op))
        mk_gemm_f32_short(in, op, pages.base, pages.idx, pages.preloaded, pages.released);
    else
        mk_gemm_f32(in, op, pages.base, pages.idx, pages.preloaded, pages.released);
}

/* The loader's share of a GEMM (megakernel.cu, MK_FOR_EACH_PRELOADING_OP): bf16 tiles and
 * short fp32 tiles; the 128 x 128 fp32 tile transposes A on its way into shared memory,
 * through registers. */
__device__ __forceinline__ mk_u32 mk_gemm_preload_stages(const mk_instr& in, const mk_tensor* op)
{
    if (in.flags & MK_FLAG_WGMMA)
        return MK_BUILT(MK_BODY_GEMM_WGMMA) ? mk_gemm_wgmma_preload_stages(in, op) : 0u;
    if (!MK_BUILT(MK_BODY_GEMM_TILED) || in.rows <= 0 || in.cols <= 0 ||
        (in.flags & MK_FLAG_STREAM))
        return 0;   /* a streamed GEMM's B comes through the ring; the op stages A itself */
    if (op[MK_ARG_A].dtype != MK_DTYPE_BF16)
        return mk_gemm_f32_short_preload_stages(in, op);
    return mk_gemm_bf16_preload_stages(in, op);
}

/* L4 (parts MK_PRELOAD_B, B a graph input) and L6 (the rest). A wgmma record's copies are
 * TMA copies tracked on its own barriers: all at L6, none waited for at L7. */
__device__ __forceinline__ mk_u32 mk_gemm_preload(const mk_instr& in, const mk_tensor* op,
                                                  const mk_pages& pages, mk_u32 lane,
                                                  mk_u32 parts, mk_u32 q)
{
    (void)q;
    if (!(in.flags & MK_FLAG_WGMMA)) {
        if (MK_BUILT(MK_BODY_GEMM_TILED)) {
            if (op[MK_ARG_A].dtype == MK_DTYPE_BF16)
                mk_gemm_bf16_preload(in, op, pages, lane, parts);
            else
                mk_gemm_f32_short_preload(in, op, pages, lane, parts);
            return 1u;   /* cp.async copies: the loader waits for them at L7 */
        }
    }
    else if (MK_BUILT(MK_BODY_GEMM_WGMMA) && (parts & MK_PRELOAD_REST))
        mk_gemm_wgmma_preload(in, pages, lane);
    return 0u;
}

/* After L7 (the slot handed over): a wgmma record's remaining stages. */
__device__ __forceinline__ mk_u32 mk_gemm_preload_late(const mk_instr& in, const mk_tensor* op,
                                                       const mk_pages& pages, mk_u32 lane)
{
    (void)op;
    mk_u32 error = MK_OK;
    if (MK_BUILT(MK_BODY_GEMM_WGMMA) && (in.flags & MK_FLAG_WGMMA) && lane == 0)
        error = mk_gemm_wgmma_produce(in, pages.base, pages.idx);
    return __shfl_sync(0xffffffffu, error, 0);
}

/* When the loader leaves: nothing. The bf16 tiles' cp.async copies are waited for at L7 and at
 * the loader's end (cp.async.wait_all); a wgmma record's stages are issued at L6 and L8 and
 * consumed or, past a deadline, waited for by the issuer itself. */
__device__ __forceinline__ void mk_gemm_preload_drain(mk_u32 lane)
{
    (void)lane;
}

#endif /* MEGAK_OP_GEMM_CUH */
