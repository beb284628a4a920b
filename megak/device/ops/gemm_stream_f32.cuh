/* MK_OP_GEMM with MK_FLAG_STREAM | MK_FLAG_STREAM_F32: the weight stream's k loops for fp32
 * operands (a layer at batch 1..16 in fp32). Included by gemm_stream.cuh, whose ring, A
 * buffers, reduce, combine and store these loops feed: they leave their sums in the MMA
 * accumulator layout the bf16 loops leave (acc[0][n8][e] of 4 n8 tiles), so everything after
 * the k loop is the bf16 form's.
 *
 * Why fp32 gets the stream: its W2 rows were the slowest against their peers, and what held
 * them (benchmarks/ANALYSIS.md, "The short fp32 tile lands": its traces) is what the ring
 * removes: every instruction's B loads restarting at its start, 0.64 us a 16 KiB slice in the
 * k loop, a reduce instruction and its hop per layer. Here B arrives through the block's ring
 * across instruction boundaries, as the bf16 weights do, and a band of one part stores its
 * sums itself.
 *
 *   band     MK_STREAM_F32_COLS (32) columns, one m16 tile (rows <= 16), `parts` k ranges as
 *            for bf16 (gemm.stream_split); the record check refuses more
 *   stage s  one box: k-rows [k0 + 128 s, + 128) x the band's 32 columns, one page, as the
 *            TMA's 128-B swizzle lays it out: k-row r at byte 128 r, its 16-B chunk c (columns
 *            4c .. 4c + 3) at chunk c ^ (r & 7). The box of a transpose's fp32 map
 *            (MK_TRANSPOSE_READY): the host encodes B's map with it
 *   readers  two warps a stage, as for two m16 tiles in bf16: warps w and w + 4 (w < 4) take
 *            stages s = w, w + 4, ..., warp w k-rows 0-63 of each and w + 4 k-rows 64-127,
 *            each with the A chunk of its k-rows (16 rows x 64 k fp32 = 4 KiB, its buffer in
 *            pages 0-1, gemm_stream.cuh's mk_stream_a_buffer): the same pages, arrivals and
 *            ordering as mk_stream_kloop_ring<2> (see there)
 *
 * The multiply is FMAs, not tensor cores: fp32 operands keep fp32 products (TF32 would round
 * them to 10 bits, an error the fp32 contract does not allow), and at 16 rows the FMAs of a
 * stage (16 x 32 x 128) take ~0.3 us of an SM by count, about half the time its share of HBM
 * takes to bring the page. What bounds them is shared memory: a warp's 16-B load costs four
 * wavefronts (one a quarter warp) however few addresses it names, so the loop is sized by
 * its loads per FMA. Through the ring (mk_stream_f32_fma_split) the warp's k-rows are split
 * across its lanes: G = 8 / H groups of lanes (H = 2 row halves, or 1 where the record has at
 * most 8 rows), lane (h, kg, j) = (lane / 4G, lane / 4 % G, lane % 4) sums rows 8h .. 8h + 7 of
 * columns 4j .. 4j + 3 and 16 + 4j .. 16 + 4j + 3 over the 4-k-row units kg, kg + G, ... of
 * the warp's 64: 8 float4 of A and 8 of B for 256 FMAs (the per-k-row layout below took 10 for
 * 64, 1,300 wavefronts a page, measured). A quarter warp's loads are conflict free: its lanes
 * share h and one A row, units kg and kg + 1 (adjacent bank groups), and B rows 4 apart (chunks
 * j ^ x and j ^ x ^ 4). At the end (mk_stream_f32_split_to_mma) the G partial sums of each
 * element meet by shuffles, halving the rows a lane keeps each round, and pass through the
 * warp's A buffer into the MMA layout. Without the ring (mk_stream_f32_fma) lane (g, t) =
 * (lane / 4, lane % 4) sums rows g and g + 8 of the same columns for every k-row, and a
 * shuffle within each quad moves the sums into the MMA layout (lane (g, t) holds columns
 * 8 n8 + 2t, + 1 of n8 tile n8).
 *
 * Without the ring (no map for B, or the separate-launch entry): the op copies B itself, in
 * stages of 64 k-rows (half a box, 8 KiB, laid out as the TMA would) and their A (16 rows x 64
 * k, 4 KiB), four stages in its 3 pages, three in flight while warp w multiplies k-rows 8w ..
 * 8w + 7 of the fourth (mk_stream_kloop_copied_f32): the bytes in flight of the short fp32
 * tile, which the separate launches of these GEMMs ran before they streamed.
 */
#ifndef MEGAK_OP_GEMM_STREAM_F32_CUH
#define MEGAK_OP_GEMM_STREAM_F32_CUH

enum {
    MK_STREAM_F32_PITCH = 4 * MK_STREAM_BOX_ROWS / MK_STREAM_READERS,  /* a ring chunk's row */
    MK_STREAM_F32_COPIED_K = 64,      /* k-rows of a stage without the ring: half a box */
    MK_STREAM_F32_COPIED_DEPTH = 4,   /* its stages in the op's pages, 3 in flight */
    MK_STREAM_F32_COPIED_B = MK_STREAM_F32_COPIED_K * 128,   /* bytes of a stage's B */
    MK_STREAM_F32_COPIED_A = 16 * 4 * MK_STREAM_F32_COPIED_K /* and of its A */
};
static_assert(16 * MK_STREAM_F32_PITCH == MK_STREAM_A_CHUNK &&
              4 * MK_STREAM_F32_COPIED_K == MK_STREAM_F32_PITCH &&
              16 * (MK_STREAM_F32_PITCH / 16) == MK_THREADS,
              "16 rows x 64 k-rows of fp32: one warp's A chunk, a copied stage's A, one unit a "
              "compute thread");
static_assert(MK_STREAM_F32_COPIED_DEPTH * MK_STREAM_F32_COPIED_A <= MK_PAGE_BYTES &&
              MK_STREAM_F32_COPIED_DEPTH * MK_STREAM_F32_COPIED_B <= 2 * MK_PAGE_BYTES &&
              MK_STREAM_F32_COPIED_K == 8 * MK_STREAM_WARPS,
              "a copied stage: A in a quarter of page 0, B in half of page 1 or 2, 8 k-rows a "
              "warp");
static_assert(MK_STREAM_F32_COLS * 4 * MK_STREAM_BOX_ROWS == MK_PAGE_BYTES &&
              MK_STREAM_F32_COLS * 4 == 128, "an fp32 box is a page of 128-B rows");
static_assert(MK_STREAM_F32_COLS == MK_TRANSPOSE_BOX_COLS &&
              MK_STREAM_BOX_ROWS == MK_TRANSPOSE_TILE, "B's map is a transpose's box");
static_assert(MK_STREAM_READERS == 2 && MK_STREAM_WARPS == 8, "two readers a stage, 4 at once");

/* A's element (row0, k0) of an fp32 record, and whether its units take 16-B copies. */
__device__ __forceinline__ const float* mk_stream_f32_a_origin(const mk_instr& in,
                                                               const mk_tensor& TA)
{
    return reinterpret_cast<const float*>(TA.ptr) + (mk_u64)in.row0 * TA.ld + in.k0;
}

__device__ __forceinline__ bool mk_stream_f32_a_vec(const mk_instr& in, const mk_tensor& TA)
{
    return ((TA.ptr & 15u) == 0) && ((TA.ld & 3u) == 0) && ((in.k0 & 3) == 0);
}

/* One 16-B unit of A into shared memory at dst: row r, k [k, k + 4) relative to the record's
 * origin ga, zeros past `rows` and `klen`. vec: cp.async (the caller commits), else
 * synchronous scalar loads. */
__device__ __forceinline__ void mk_stream_f32_a_unit(mk_u32 dst, const float* ga, mk_u32 lda,
                                                     int r, int k, int rows, int klen, bool vec)
{
    const int n = r < rows ? (klen - k < 4 ? (klen - k > 0 ? klen - k : 0) : 4) : 0;
    const float* src = ga + (mk_u64)r * lda + k;
    if (vec) {
        mk_cp_async_f4z(dst, n > 0 ? src : ga, 4u * (mk_u32)n);
    } else {
        mk_sts_f4(dst, make_float4(n > 0 ? src[0] : 0.f, n > 1 ? src[1] : 0.f,
                                   n > 2 ? src[2] : 0.f, n > 3 ? src[3] : 0.f));
    }
}

/* Units of A's 16 rows x 64 k-rows from k-row kk into buf (a row MK_STREAM_F32_PITCH bytes,
 * unit u of row r at u ^ (r & 7)): N units a thread, units first, first + stride, ... (unit i:
 * row i / 16, k-rows kk + 4 (i % 16) ..; stride a multiple of 16, so one unit column a
 * thread). The caller commits. */
template <int N>
__device__ __forceinline__ void mk_stream_f32_chunk_a(mk_u32 buf, const float* ga, mk_u32 lda,
                                                      int rows, int klen, int kk, bool vec,
                                                      int first, int stride)
{
    constexpr int PER_ROW = MK_STREAM_F32_PITCH / 16;
    const int u = first % PER_ROW;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const int r = first / PER_ROW + n * (stride / PER_ROW);
        mk_stream_f32_a_unit(mk_stream_chunk_at(buf, r, u, MK_STREAM_F32_PITCH), ga, lda, r,
                             kk + 4 * u, rows, klen, vec);
    }
}

/* One ring stage's FMAs, the k-rows split across lanes (see the header): lane (h, kg, j) adds
 * rows 8h + r, columns j and j + 4 of chunks (s[r][c]: chunk j for c < 4, else j + 4) over
 * units kg, kg + G, ... of the A chunk at a and k-rows b_row0 + 4 unit + i of the box at st. */
template <int H>
__device__ __forceinline__ void mk_stream_f32_fma_split(float (&s)[8][8], mk_u32 a, mk_u32 st,
                                                        int b_row0, int lane)
{
    constexpr int G = 8 / H, UNITS = MK_STREAM_F32_PITCH / 16;
    const int j = lane & 3, kg = (lane >> 2) % G, h = (lane >> 2) / G;
#pragma unroll 1
    for (int u = kg; u < UNITS; u += G) {
        float4 x[8];
#pragma unroll
        for (int r = 0; r < 8; ++r)
            x[r] = mk_lds_f4(mk_stream_chunk_at(a, 8 * h + r, u, MK_STREAM_F32_PITCH));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const mk_u32 row = (mk_u32)(b_row0 + 4 * u + i);
            const float4 b0 = mk_lds_f4(st + 128u * row + (((mk_u32)j ^ (row & 7u)) << 4));
            const float4 b1 = mk_lds_f4(st + 128u * row + (((mk_u32)(j + 4) ^ (row & 7u)) << 4));
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                const float xr = i == 0 ? x[r].x : i == 1 ? x[r].y : i == 2 ? x[r].z : x[r].w;
#pragma unroll
                for (int c = 0; c < 8; ++c)
                    s[r][c] = fmaf(xr, b[c], s[r][c]);
            }
        }
    }
}

/* The sums of mk_stream_f32_fma_split into the MMA layout of acc[0] (rows 8-15 left as they are
 * where H = 1). Round m adds lane ^ 4 (G >> (m + 1))'s partials of half the rows a lane still
 * keeps: the lane with that kg bit set keeps the upper half (moved down to s[0]), its partner
 * the lower, so each element is summed on one lane in a fixed order; after log2 G rounds lane
 * (h, kg, j) holds rows 8h + (8 / G) kg + i, i < 8 / G, in full. Those go to the warp's A
 * buffer as a 16 x 32 tile (128-B rows, chunk c of row r at c ^ (r & 7)), read back as lane
 * (g, t)'s columns 8 n8 + 2t, + 1. The buffer is the warp's own: a __syncwarp after the FMAs'
 * reads of A and one between the stores and the reads; the next stage's A is copied only after
 * the next k loop's first __syncwarp. */
template <int H>
__device__ __forceinline__ void mk_stream_f32_split_to_mma(float (&s)[8][8],
                                                           float (&acc)[2][8][4], mk_u32 buf,
                                                           int lane)
{
    constexpr int G = 8 / H, OWN = 8 / G;
    const int j = lane & 3, kg = (lane >> 2) % G, h = (lane >> 2) / G;
#pragma unroll
    for (int m = 0; (G >> (m + 1)) > 0; ++m) {
        const int half = 4 >> m, mask = 4 * (G >> (m + 1));
        const bool upper = (lane & mask) != 0;
#pragma unroll
        for (int r = 0; r < half; ++r)
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                const float give = upper ? s[r][c] : s[r + half][c];
                const float keep = upper ? s[r + half][c] : s[r][c];
                s[r][c] = keep + __shfl_sync(0xffffffffu, give, lane ^ mask);
            }
    }
    __syncwarp();                             /* every lane's FMAs are done with A */
#pragma unroll
    for (int i = 0; i < OWN; ++i) {
        const mk_u32 row = (mk_u32)(8 * h + OWN * kg + i);
        mk_sts_f4(buf + 128u * row + (((mk_u32)j ^ (row & 7u)) << 4),
                  make_float4(s[i][0], s[i][1], s[i][2], s[i][3]));
        mk_sts_f4(buf + 128u * row + (((mk_u32)(j + 4) ^ (row & 7u)) << 4),
                  make_float4(s[i][4], s[i][5], s[i][6], s[i][7]));
    }
    __syncwarp();                             /* the tile's stores visible to every lane */
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int hh = 0; hh < H; ++hh)
#pragma unroll
        for (int n8 = 0; n8 < 4; ++n8) {
            const mk_u32 row = (mk_u32)(g + 8 * hh), chunk = (mk_u32)(2 * n8 + (t >> 1));
            const float4 v = mk_lds_f4(buf + 128u * row + ((chunk ^ (row & 7u)) << 4));
            acc[0][n8][2 * hh] = (t & 1) ? v.z : v.x;
            acc[0][n8][2 * hh + 1] = (t & 1) ? v.w : v.y;
        }
}

/* K4 groups of 4 k-rows: A's from unit u0 of the rows at a (pitch bytes a row), B's from
 * k-row b_row0 of the box page st. c[h][j]: row g + 8h, column 4t + j (j < 4) or
 * 16 + 4t + j - 4. Each FMA adds one product to its sum, in k order. */
template <int K4>
__device__ __forceinline__ void mk_stream_f32_fma(float (&c)[2][8], mk_u32 a, int pitch, int u0,
                                                  mk_u32 st, int b_row0, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll 2
    for (int k4 = 0; k4 < K4; ++k4) {
        const float4 a0 = mk_lds_f4(mk_stream_chunk_at(a, g, u0 + k4, pitch));
        const float4 a1 = mk_lds_f4(mk_stream_chunk_at(a, g + 8, u0 + k4, pitch));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const mk_u32 r = (mk_u32)(b_row0 + 4 * k4 + i);
            const float4 b0 = mk_lds_f4(st + 128u * r + (((mk_u32)t ^ (r & 7u)) << 4));
            const float4 b1 = mk_lds_f4(st + 128u * r + (((mk_u32)(t + 4) ^ (r & 7u)) << 4));
            const float x0 = i == 0 ? a0.x : i == 1 ? a0.y : i == 2 ? a0.z : a0.w;
            const float x1 = i == 0 ? a1.x : i == 1 ? a1.y : i == 2 ? a1.z : a1.w;
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                c[0][j] = fmaf(x0, b[j], c[0][j]);
                c[1][j] = fmaf(x1, b[j], c[1][j]);
            }
        }
    }
}

/* The sums of mk_stream_f32_fma into the MMA accumulator layout of 4 n8 tiles: acc[0][n8][2h
 * + e] = row g + 8h, column 8 n8 + 2t + e, held by lane (g, 2 (n8 % 2) + t / 2) as its
 * c[h][4 (n8 / 2) + 2 (t % 2) + e]. Two shuffles each, the lane keeping the one its t % 2
 * names (a shuffle sends one register of every lane). All 32 lanes, converged. */
__device__ __forceinline__ void mk_stream_f32_to_mma(const float (&c)[2][8], float (&acc)[2][8][4],
                                                     int lane)
{
    const int t = lane & 3;
#pragma unroll
    for (int n8 = 0; n8 < 4; ++n8) {
        const int src = (lane & ~3) | (2 * (n8 & 1) + (t >> 1));
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float lo = __shfl_sync(0xffffffffu, c[h][4 * (n8 >> 1) + e], src);
                const float hi = __shfl_sync(0xffffffffu, c[h][4 * (n8 >> 1) + 2 + e], src);
                acc[0][n8][2 * h + e] = (t & 1) ? hi : lo;
            }
    }
}

/* The ring's k loop for an fp32 band (see the header), H row halves: the stages, waits, A
 * chunks and hand-backs of mk_stream_kloop_ring<2> (gemm_stream.cuh, whose ordering argument
 * holds as written: one A chunk per stage and warp, the page waited for while it flies, the
 * chunk's buffer written again only after a __syncwarp that follows the FMAs' reads). */
template <int H>
__device__ __forceinline__ void mk_stream_kloop_ring_f32(const mk_instr& in, const mk_tensor* op,
                                                         const mk_pages& pages,
                                                         float (&acc)[2][8][4])
{
    constexpr int STAGE_K = MK_STREAM_BOX_ROWS, READ = MK_STREAM_READERS;
    constexpr int kc = STAGE_K / READ, step = MK_STREAM_WARPS / READ;
    static_assert(kc == 4 * (MK_STREAM_F32_PITCH / 16), "a warp's k-rows are its A chunk's");
    mk_control& ctl = mk_ctl();
    const mk_tensor& TA = op[MK_ARG_A];
    const int nst = (in.klen + STAGE_K - 1) / STAGE_K;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const float* ga = mk_stream_f32_a_origin(in, TA);
    const bool a_vec = mk_stream_f32_a_vec(in, TA);
    const mk_u32 buf = mk_stream_a_buffer(pages, warp);
    const mk_u32 ring0 = mk_smem_addr(mk_ring_page(ctl.params, 0));
    const int kb = kc * (warp / step);        /* this warp's k-rows of each of its stages */
    const int first = warp % step;            /* and its first stage */
    float sums[8][8] = {};
#pragma unroll 1
    for (int s = first; s < nst; s += step) {
        const mk_u32 pos = pages.stream_pos + (mk_u32)s;
        const mk_u32 R = ctl.params.stream_pages;
        const mk_u32 slot = pos % R, parity = (pos / R) & 1u;
        const mk_u32 st = ring0 + slot * (mk_u32)MK_PAGE_BYTES;
        __syncwarp();                         /* every lane's reads of the buffer are done */
        mk_stream_f32_chunk_a<4 * H>(buf, ga, TA.ld, in.rows, in.klen, STAGE_K * s + kb, a_vec,
                                     lane, 32);      /* rows [0, 8 H): those the FMAs read */
        mk_cp_async_commit();
        const bool landed = mk_stream_wait_full(ctl, slot, pos, parity);   /* while A flies */
        mk_cp_async_wait_all();
        __syncwarp();                         /* the warp's A copies visible to every lane */
        if (__all_sync(0xffffffffu, landed))  /* uniform: past the deadline, no FMAs */
            mk_stream_f32_fma_split<H>(sums, buf, st, kb, lane);
        mk_ring_hand_back(&ctl.ring_empty[slot], (mk_u32)(MK_STREAM_READERS / READ), lane);
    }
    mk_stream_f32_split_to_mma<H>(sums, acc, buf, lane);
}

/* The k loop without the ring (see the header): `rows` k-rows of B from k_row (a box's, or
 * its first half) into the page part at st, as the TMA lays a box out, zeros past the tensor;
 * all 256 threads, 16 B each a turn, by cp.async (evict-first: weights) where B's rows allow
 * 16-B copies, else synchronous loads and stores. The caller commits. */
__device__ __forceinline__ void mk_stream_f32_fill_box(mk_u32 st, const mk_tensor& TB, int k_row,
                                                       int col0, int rows, bool vec,
                                                       mk_u64 policy)
{
    const float* gb = reinterpret_cast<const float*>(TB.ptr);
#pragma unroll 1
    for (int i = (int)threadIdx.x; i < rows * 8; i += MK_THREADS) {
        const int r = i >> 3, u = i & 7;
        const int k = k_row + r, col = col0 + 4 * u;
        const int nv = k < (int)TB.rows ? (int)TB.cols - col : 0;
        const int n = nv < 4 ? (nv > 0 ? nv : 0) : 4;
        const float* src = gb + (mk_u64)k * TB.ld + col;
        const mk_u32 dst = st + 128u * r + ((mk_u32)(u ^ (r & 7)) << 4);
        if (vec)
            mk_cp_async_f4z_policy(dst, n > 0 ? src : gb, 4u * (mk_u32)n, policy);
        else
            mk_sts_f4(dst, make_float4(n > 0 ? src[0] : 0.f, n > 1 ? src[1] : 0.f,
                                       n > 2 ? src[2] : 0.f, n > 3 ? src[3] : 0.f));
    }
}

/* D = MK_STREAM_F32_COPIED_DEPTH stages in the op's pages: stage s's A in quarter s % D of
 * page 0, its B in half s % 2 of page 1 + (s % D) / 2. Each stage's copies are one cp.async
 * group (maybe empty), issued D - 1 stages ahead, so wait_group D - 1 at stage s means stage
 * s landed (runtime/chunk_model.py's pipeline). Ordering: a stage's copies (each thread's
 * wait, then the barrier) before any warp reads them; every warp's reads of stage s - 1 (the
 * barrier after its FMAs) before stage s + D - 1's copies into the same buffers, issued after
 * that barrier. Nothing is in flight when the loop ends. */
__device__ __forceinline__ void mk_stream_kloop_copied_f32(const mk_instr& in, const mk_tensor* op,
                                                           const mk_pages& pages,
                                                           float (&acc)[2][8][4])
{
    constexpr int STAGE_K = MK_STREAM_F32_COPIED_K, D = MK_STREAM_F32_COPIED_DEPTH;
    constexpr int pitch = MK_STREAM_F32_PITCH;
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const int nst = (in.klen + STAGE_K - 1) / STAGE_K;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const float* ga = mk_stream_f32_a_origin(in, TA);
    const bool a_vec = mk_stream_f32_a_vec(in, TA);
    const bool b_vec = ((TB.ptr & 15u) == 0) && ((TB.ld & 3u) == 0) && ((in.col0 & 3) == 0);
    const mk_u64 policy = (in.flags & MK_FLAG_B_READY) ? mk_policy_evict_first()
                                                       : mk_policy_evict_normal();
    const mk_u32 a_page = mk_smem_addr(pages[0]);
    auto a_at = [&](int s) { return a_page + (mk_u32)(s % D) * MK_STREAM_F32_COPIED_A; };
    auto b_at = [&](int s) {
        const int i = s % D;
        return mk_smem_addr(pages[1 + i / 2]) + (mk_u32)(i & 1) * MK_STREAM_F32_COPIED_B;
    };
    auto issue = [&](int s) {   /* stage s's copies, this thread's share, as one group */
        if (s < nst) {
            mk_stream_f32_chunk_a<1>(a_at(s), ga, TA.ld, in.rows, in.klen, STAGE_K * s, a_vec,
                                     (int)threadIdx.x, MK_THREADS);
            mk_stream_f32_fill_box(b_at(s), TB, in.k0 + STAGE_K * s, in.col0, STAGE_K, b_vec,
                                   policy);
        }
        mk_cp_async_commit();
    };
    float c[2][8] = {};
#pragma unroll 1
    for (int s = 0; s < D - 1; ++s)
        issue(s);
#pragma unroll 1
    for (int s = 0; s < nst; ++s) {
        issue(s + D - 1);                     /* into stage s - 1's buffers */
        mk_cp_async_wait_group<D - 1>();      /* stage s's copies, this thread's */
        mk_compute_sync();   /* every thread's copies of stage s visible to every warp */
        mk_stream_f32_fma<2>(c, a_at(s), pitch, 2 * warp, b_at(s), 8 * warp, lane);
        mk_compute_sync();   /* every warp is done with stage s before s + D's copies */
    }
    mk_cp_async_wait_all();
    mk_stream_f32_to_mma(c, acc, lane);
}

/* The fp32 band's k loop: through the ring where the block has one (rows 8-15 left out where
 * the record has at most 8: half the FMAs and A copies), else copied. */
__device__ __forceinline__ void mk_stream_kloop_f32(const mk_instr& in, const mk_tensor* op,
                                                    const mk_pages& pages, float (&acc)[2][8][4],
                                                    bool ring)
{
    if (ring && in.rows <= 8)
        mk_stream_kloop_ring_f32<1>(in, op, pages, acc);
    else if (ring)
        mk_stream_kloop_ring_f32<2>(in, op, pages, acc);
    else
        mk_stream_kloop_copied_f32(in, op, pages, acc);
}

#endif /* MEGAK_OP_GEMM_STREAM_F32_CUH */
