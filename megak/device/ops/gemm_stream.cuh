/* MK_OP_GEMM with MK_FLAG_STREAM: a bf16 GEMM of at most MK_STREAM_M (64) rows whose B is a
 * graph input (weights): B arrives through the block's weight ring (stream.cuh), A from L2
 * into shared memory by cp.async, fp32 accumulate, the epilogue of gemm_epilogue.cuh. An fp32
 * GEMM of at most 16 rows takes the same ring, reduce, combine and store with a k loop of its
 * own (MK_FLAG_STREAM_F32, gemm_stream_f32.cuh).
 *
 * What it is for: a layer at batch 1..64. Its bytes are B's (M flops per byte: the tensor
 * cores idle, HBM is the limit), so the lowering (megak/ops/gemm.py) cuts B into boxes of
 * 64 columns x 128 k-rows, gives every column band `parts` instructions over equal k ranges
 * (as few as keep a part within the ring, as many as spread a large layer over the SMs:
 * gemm.stream_split), and the last of a band's parts to finish sums the fp32 partials in part
 * order and runs the epilogue. Where that split would combine and narrower bands still fit
 * the SMs (gemm.stream_narrow: one m16 tile, e.g. 4096 x 4096 at batch 16 on 132 SMs), bands
 * of 32 columns take the whole K instead, with no combine (MK_FLAG_STREAM_NARROW). The
 * streamer keeps the next instructions' boxes coming while this one waits for its activation.
 *
 *   stage s = one box: k-rows [k0 + 128 s, k0 + 128 s + 128) x columns [col0, col0 + 64) of B,
 *   one page, as the TMA's 128-B swizzle lays it out: k-row r at byte 128 r, its 16-B chunk c
 *   (columns 8c .. 8c + 7) at chunk c ^ (r & 7)
 *   narrow stage s = two boxes of 32 columns: k-rows [k0 + 256 s, + 128) in the page's first
 *   half and [k0 + 256 s + 128, + 128) in its second (copied only where it starts before the
 *   k range's end), each as the TMA's 64-B swizzle lays it out: k-row r at byte 64 r, chunk c
 *   (c < 4) at chunk c ^ ((r / 2) & 3)
 *
 * Warps, with the ring: with one m16 tile (rows <= 16) warp w takes whole stages, s = w,
 * w + 8, ... of the instruction (all 8 k16 steps of its page, all 8 n8 tiles), so 8 stages
 * are read at once and one warp's waits overlap the others' MMAs; with two (rows <= 32 =
 * MK_STREAM_TILE_M; a GEMM of up to 64 rows has two row bands, each streaming B) warps w and
 * w + 4 share stages s = w, w + 4, ..., each half of the page's k-rows for both tiles, 4
 * stages at once. A narrow band of at most 8 rows (batch 1-8) copies half-height A chunks,
 * two per warp buffer, the next stage's ahead (mk_stream_kloop_ring_rows8). Without the
 * ring (the compute warps copy each box into page 2 themselves, with block barriers) warp w
 * takes k16 step w of every
 * stage. A narrow band's stage is read by warps w and w + 4, one box each (its 4 n8 tiles);
 * without the ring it is copied and multiplied as a 64-column box, the 32 columns past the
 * band never stored. Either way 2 x 8 x 4 fp32 accumulators per thread, summed over the 8
 * warps at the end through shared memory. (Four m16 tiles per instruction made ptxas spill.)
 *
 * Page plan (megak/ops/gemm.py says the same), positions in the op's page table; three pages,
 * so that a block of 13 keeps 10 for the ring:
 *   k loop    B in the ring (not the op's pages), A in pages 0-1 (a 4 KiB chunk per warp);
 *             without the ring (no tensor map for B, or the separate-launch entry) A's ring in
 *             pages 0-1 and the compute warps copy each box into page 2 themselves
 *   reduction per m16 tile: the 8 warps' partials in pages 1-2, their sum into registers
 *             (one part: the direct store below) or the staging rows (page 0); then pages 1
 *             and 2 go
 *   combine   (parts > 1) the staging rows to the partials tensor, the band's counter; the
 *             last part sums every part's rows into the staging rows
 *   epilogue  one part: each thread's sums through the epilogue straight to the output
 *             (mk_stream_store_direct), no shared memory; parts > 1: the last part's staging
 *             rows (page 0) through the generic epilogue. The interpreter frees page 0
 *
 * Why:
 *  - a warp per stage (ring): the k loop with every warp on the same stage cost ~0.7 us per
 *    stage on the H200 with the page already there (A wait, page wait, MMAs, arrive: one
 *    warp's latency chain, repeated in lock step), more than the 0.5 us in which HBM
 *    delivers an SM's page at full rate (tools/probe_stream_stages.py). With 8 stages in
 *    flight, one per warp, each warp's chain is paid once per 8 stages. Each k-row of a page
 *    is read by one warp (ldmatrix.trans through the swizzle: the 8 row addresses of a phase
 *    fall in 8 different bank groups), and each k-slice of A by one warp, so A is read once
 *    per SM;
 *  - A (the previous layer's output, in L2): with the ring, each warp copies its share of
 *    its stage (one 4 KiB chunk) before it waits for the page, so the L2 read (~1-2 us under
 *    the whole GPU's streaming) overlaps the page's wait and the other warps' MMAs; without
 *    the ring it is requested several stages ahead into a ring in pages 0-1 (see below);
 *  - k ranges are whole boxes except at K's end, where the copy fills zeros: no stage mixes
 *    two parts' k-rows, and A past K is zero-filled by its copy (0 x a finite weight);
 *    columns past N arrive as zeros too;
 *  - one part stores from registers: a band's tail (reduce, epilogue) runs once per
 *    instruction while the ring streams, and the staging rows cost a barrier and a second
 *    pass over shared memory, with the generic epilogue's code (4 rows x 4 columns unrolled,
 *    every dtype branch) on the path to the signal; the direct store's loop body is one
 *    column pair's epilogue;
 *  - the combine: every part stores its partial (weak stores), the compute barrier, then
 *    thread 0: fence.release and a strong atomic add on the band's counter (out_row0), a
 *    release pattern (sync.cuh); the part that brings it to (epoch + 1) * parts is the last
 *    (counters advance per run, like the dependency counters, and are zeroed with them). The
 *    adds on one counter form a release sequence, so the last part's add, then fence.acquire
 *    (an acquire pattern), orders every other part's partial before the compute barrier
 *    after which anyone reads them (L2 loads). Not __threadfence: fence.sc.gpu is the heavier
 *    MEMBAR.SC on sm_90, and nothing here needs the single order of SC fences. The sum runs
 *    in part order whichever part is last, so results are identical from run to run. The
 *    consumers wait for every part's signal, so they see the last's output;
 *  - a ring wait has a deadline (the streamer may have stopped): past it the op records
 *    MK_ERR_TIMEOUT (ctl.stream_error), raises ring_stop and skips its remaining waits; every
 *    warp still passes every barrier, and the interpreter stops the block after the op.
 */
#ifndef MEGAK_OP_GEMM_STREAM_CUH
#define MEGAK_OP_GEMM_STREAM_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../stream.cuh"
#include "../tensor.cuh"
#include "gemm_epilogue.cuh"
#include "gemm_bf16.cuh"

#ifndef MK_NARROW_REDUCE
#define MK_NARROW_REDUCE 1   /* probe switch (tools/probe_narrow_reduce.py): 0 = mk_stream_reduce */
#endif

enum {
    MK_STREAM_WARPS = MK_THREADS / 32,
    MK_STREAM_PART_LD = 64,      /* floats per row of a warp's partial (64 columns) */
    MK_STREAM_PART_FLOATS = 16 * MK_STREAM_PART_LD   /* one m16 tile of one warp: 4 KiB */
};
static_assert(MK_STREAM_WARPS * 16 == MK_STREAM_BOX_ROWS, "a warp per k16 step of a box");
static_assert(MK_STREAM_WARPS * MK_STREAM_PART_FLOATS * 4 == 2 * MK_PAGE_BYTES,
              "the 8 warps' partials of one m16 tile fill pages 1 and 2");
static_assert(MK_STREAM_TILE_M == 32 && MK_STREAM_PAGES == 3,
              "staging rows 0-31 in page 0, box page 2");
static_assert(MK_STREAM_BOX_COLS == 64, "8 n8 tiles per box");
static_assert(MK_STREAM_READERS * 16 == MK_STREAM_TILE_M,
              "a ring stage is read by one warp per m16 tile of its instruction");

__device__ __forceinline__ mk_u32 mk_stream_parts(const mk_instr& in) { return in.param >> 16; }
__device__ __forceinline__ mk_u32 mk_stream_part(const mk_instr& in) { return in.param & 0xffffu; }

__device__ __forceinline__ bool mk_stream_narrow(const mk_instr& in)
{
    return (in.flags & MK_FLAG_STREAM_NARROW) != 0u;
}

/* An fp32 band (MK_FLAG_STREAM_F32, ops/gemm_stream_f32.cuh). */
__device__ __forceinline__ bool mk_stream_f32(const mk_instr& in)
{
    return (in.flags & MK_FLAG_STREAM_F32) != 0u;
}

__device__ __forceinline__ bool mk_gemm_stream_check(const mk_instr& in)
{
    const mk_u32 parts = mk_stream_parts(in);
    const bool narrow = mk_stream_narrow(in), f32 = mk_stream_f32(in);
    const int max_cols = narrow ? MK_STREAM_NARROW_COLS : f32 ? MK_STREAM_F32_COLS
                                                              : MK_STREAM_BOX_COLS;
    return in.rows >= 1 && in.rows <= (narrow || f32 ? 16 : MK_STREAM_TILE_M) && in.cols >= 1 &&
           in.cols <= max_cols && in.klen >= 1 && in.k0 >= 0 && in.row0 >= 0 &&
           in.col0 >= 0 && parts >= 1 && mk_stream_part(in) < parts &&
           (!narrow || parts == 1) &&   /* a narrow band stores its sums itself */
           !(narrow && f32) && in.pages >= MK_STREAM_PAGES && mk_epilogue_check(in);
}

/* k-rows of one ring stage of record `in`: one box of 128, or two stacked for a narrow band
 * (boxes of 32 columns: two fill the page). */
__device__ __forceinline__ mk_u32 mk_stream_stage_rows(const mk_instr& in)
{
    return mk_stream_narrow(in) ? 2u * MK_STREAM_BOX_ROWS : (mk_u32)MK_STREAM_BOX_ROWS;
}

/* Whether stage s of a narrow band has its second box: k-rows left past the first (the
 * streamer copies it, its reader reads it; both decide from the record alone). */
__device__ __forceinline__ bool mk_stream_second_box(const mk_instr& in, mk_u32 s)
{
    return (mk_u32)in.klen > 2u * MK_STREAM_BOX_ROWS * s + MK_STREAM_BOX_ROWS;
}

/* Columns of one band of record `in`: a page holds one stage of one band. */
__device__ __forceinline__ mk_u32 mk_stream_band_cols(const mk_instr& in)
{
    return mk_stream_narrow(in) ? (mk_u32)MK_STREAM_NARROW_COLS
         : mk_stream_f32(in)    ? (mk_u32)MK_STREAM_F32_COLS : (mk_u32)MK_STREAM_BOX_COLS;
}

/* B's packed pages (instr.h, mk_packed_b) in map slot b of the table, one 16-B load (the
 * slot is 128-B aligned). */
__device__ __forceinline__ mk_packed_b mk_packed_of(const mk_params& p, mk_u32 b)
{
    const unsigned char* at = mk_tmaps(p) + (mk_u64)MK_TMAP_BYTES * b;
    mk_u64 ptr, geometry;
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];"
                 : "=l"(ptr), "=l"(geometry) : "l"(at) : "memory");
    return {ptr, (mk_u32)geometry, (mk_u32)(geometry >> 32)};
}

/* Stages the streamer delivers for record `in` of this program: the streamer (reading the
 * record from global memory) and the loader (its copy in the slot) call this on the same
 * bytes, so both count the same positions. 0: not streamed (the op loads B itself, from the
 * row-major entry). The checks make the copy safe whatever the record says: a tensor map the
 * host encoded with the box the record's geometry needs (its ready word), or B packed for
 * the record's form with every page the record names inside the packed buffer (a band's
 * first column and the k range's first row on page boundaries; only in a build with
 * MK_BODY_STREAM_PACKED), a page of the ring. `packed` (the streamer's): B's packed pages
 * where the record streams them, else ptr 0; loaded only once the ready word names a packed
 * B, so a record on B's own map pays no second load. */
__device__ __forceinline__ mk_u32 mk_gemm_stream_stages(const mk_instr& in, const mk_params& p,
                                                        mk_packed_b* packed = nullptr)
{
    if (packed != nullptr)
        packed->ptr = 0;
    if (in.opcode != MK_OP_GEMM || !(in.flags & MK_FLAG_STREAM) || p.stream_pages == 0 ||
        !mk_gemm_stream_check(in) || in.tensor[MK_ARG_B] >= p.n_tensors)
        return 0;
    const bool narrow = mk_stream_narrow(in);
    const mk_u32 b = in.tensor[MK_ARG_B];
    const mk_u32 ready = mk_ld_relaxed(mk_tmap_ready(p) + b);
    const mk_u32 rows = mk_stream_stage_rows(in);
    const mk_u32 stages = ((mk_u32)in.klen + rows - 1) / rows;
    if (mk_stream_f32(in))   /* B's fp32 map, a transpose's box; never packed */
        return ready == (mk_u32)MK_TRANSPOSE_READY ? stages : 0u;
    if (ready == (narrow ? (mk_u32)MK_STREAM_NARROW_READY : (mk_u32)MK_STREAM_BOX_ROWS))
        return stages;
    if (!MK_BUILT(MK_BODY_STREAM_PACKED) ||
        ready != (narrow ? (mk_u32)MK_STREAM_PACKED_NARROW_READY
                         : (mk_u32)MK_STREAM_PACKED_READY))
        return 0;
    const mk_packed_b pk = mk_packed_of(p, b);
    const mk_u32 band_cols = mk_stream_band_cols(in);
    const mk_u32 c0 = (mk_u32)in.col0, k0 = (mk_u32)in.k0;
    const bool fits = c0 % band_cols == 0u && c0 / band_cols < pk.bands && k0 % rows == 0u &&
                      k0 / rows <= pk.stages && stages <= pk.stages - k0 / rows;
    if (!fits)
        return 0;
    if (packed != nullptr)
        *packed = pk;
    return stages;
}

/* Where the streamer copies stage 0 of record `in` from when its B is packed
 * (mk_gemm_stream_stages gave `pk`): a page of the band's run; stage s is s pages on. */
__device__ __forceinline__ mk_u64 mk_packed_first(const mk_instr& in, const mk_packed_b& pk)
{
    const mk_u64 page = (mk_u64)((mk_u32)in.col0 / mk_stream_band_cols(in)) * pk.stages
                        + (mk_u32)in.k0 / mk_stream_stage_rows(in);
    return pk.ptr + page * MK_PAGE_BYTES;
}

/* A without the ring, per warp and stage: its k16 slice of every row, 2 chunks of 16 B per
 * row, in a ring that fills pages 0-1 (nothing else lives there during the k loop): with P =
 * 1 or 2 m16 tiles of room (rows <= 16, 32), a warp's slot is 512 P bytes, a stage's 8 slots
 * 4 KiB P, and the ring D = 8 / P stages deep. Stage t's slot of warp w at byte (t % D) 4 KiB
 * P + w 512 P of pages 0-1; row r's chunk c at 32 r + 16 (c ^ ((r >> 2) & 1)), so the 8 row
 * addresses of an ldmatrix phase fall in 8 different bank groups. Deep: an L2 read under the
 * whole GPU's streaming takes ~1-2 us, several stages' time. */
enum {
    MK_STREAM_A_BYTES = 2 * MK_PAGE_BYTES,   /* pages 0-1 */
    MK_STREAM_A_MAX_DEPTH = MK_STREAM_A_BYTES / (MK_STREAM_WARPS * 16 * 32)
};
static_assert(MK_STREAM_A_MAX_DEPTH == 8, "8 stages of one m16 tile fill pages 0-1");

__device__ __forceinline__ mk_u32 mk_stream_a_at(mk_u32 slot, int r, int c)
{
    return slot + 32u * r + ((mk_u32)(c ^ ((r >> 2) & 1)) << 4);
}

/* The first min(n, 8) bf16 at src (scalar loads: no alignment needed), zeros after, packed
 * as 8 halves. Two 64-bit words, not an array indexed by j: a dynamically indexed array lives
 * in local memory. */
__device__ __forceinline__ uint4 mk_ld_u16x8(const mk_u16* src, int n)
{
    mk_u64 lo = 0, hi = 0;
#pragma unroll 1
    for (int j = 0; j < n && j < 8; ++j) {
        const mk_u64 v = (mk_u64)mk_ld_u16(src + j) << (16 * (j & 3));
        if (j < 4)
            lo |= v;
        else
            hi |= v;
    }
    return make_uint4((mk_u32)lo, (mk_u32)(lo >> 32), (mk_u32)hi, (mk_u32)(hi >> 32));
}

/* One 16-B unit of A into shared memory at dst: row r, k-columns [k, k + 8) relative to the
 * tile origin ga, zeros past rows and klen. vec: cp.async (the caller commits), else
 * synchronous scalar loads. Both of A's copies (with and without the ring) go through it. */
__device__ __forceinline__ void mk_stream_a_unit(mk_u32 dst, const mk_u16* ga, mk_u32 lda,
                                                 int r, int k, int rows, int klen, bool vec)
{
    const int n = r < rows ? (klen - k < 8 ? (klen - k > 0 ? klen - k : 0) : 8) : 0;
    const mk_u16* src = ga + (mk_u64)r * lda + k;
    if (vec) {
        mk_cp_async_16_zfill(dst, n > 0 ? src : ga, 2u * (mk_u32)n);
    } else {
        const uint4 w = mk_ld_u16x8(src, n);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                     : : "r"(dst), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
    }
}

/* This warp's A slice of stage t into `slot`: rows [0, 16 mts), k [kk, kk + 16) relative to the
 * tile origin ga (zeros past rows and klen). vec: cp.async (the caller commits), else
 * synchronous scalar loads. */
__device__ __forceinline__ void mk_stream_stage_a(mk_u32 slot, const mk_u16* ga, mk_u32 lda,
                                                  int rows, int mts, int klen, int kk, bool vec)
{
    const int lane = (int)(threadIdx.x & 31u);
#pragma unroll 1
    for (int i = lane; i < 32 * mts; i += 32) {
        const int r = i >> 1, c = i & 1;
        mk_stream_a_unit(mk_stream_a_at(slot, r, c), ga, lda, r, kk + 8 * c, rows, klen, vec);
    }
}

/* Without the ring: all 256 compute threads copy box s into the page at shared address st,
 * laid out as the TMA would (zeros past the tensor), then the caller's barrier. */
__device__ __forceinline__ void mk_stream_fill_box(mk_u32 st, const mk_tensor& TB, int k_row,
                                                   int col0)
{
    const mk_u16* gb = reinterpret_cast<const mk_u16*>(TB.ptr);
    const bool vec = ((TB.ptr & 15u) == 0) && ((TB.ld & 7u) == 0) && ((col0 & 7) == 0);
#pragma unroll 1
    for (int i = (int)threadIdx.x; i < MK_STREAM_BOX_ROWS * 8; i += MK_THREADS) {
        const int r = i >> 3, c = i & 7;
        const int k = k_row + r, col = col0 + 8 * c;
        const int nv = k < (int)TB.rows ? (int)TB.cols - col : 0;
        uint4 w;
        const mk_u16* src = gb + (mk_u64)k * TB.ld + col;
        if (vec && nv >= 8)
            asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "l"(src));
        else
            w = mk_ld_u16x8(src, nv);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                     : : "r"(st + 128u * r + ((mk_u32)(c ^ (r & 7)) << 4)), "r"(w.x), "r"(w.y),
                         "r"(w.z), "r"(w.w) : "memory");
    }
}

/* A reader past its deadline (or told to stop): the error for the block, and the streamer
 * stops and drains. */
__device__ __forceinline__ void mk_stream_give_up(mk_control& ctl)
{
    atomicExch(&ctl.stream_error, (mk_u32)MK_ERR_TIMEOUT);
    atomicExch(&ctl.ring_stop, 1u);
}

/* Wait until the streamer has issued position `pos` into slot `slot` (ring_issued) and its
 * copy has landed (ring_full phase (pos / R) & 1); all 32 lanes, converged. False past the
 * deadline (timeout_ns from the first failed try) or once another warp gave up (the op then
 * skips the stage's MMAs).
 *
 * Lane 0 alone reads ring_issued, for the warp, and the warp barrier after its read orders
 * that acquire before every lane's parity wait (bar.warp.sync orders memory among the lanes
 * that pass it): a lane's wait then knows pos - R has landed as lane 0 does ("which phase",
 * stream.cuh). Every lane still waits on ring_full itself: that wait is its acquire of the
 * page's bytes. One atomic read per warp and stage, not 32 to one word. */
__device__ __forceinline__ bool mk_stream_wait_full(mk_control& ctl, mk_u32 slot, mk_u32 pos,
                                                    mk_u32 parity)
{
    if (mk_ring_stopped())
        return false;
    const bool lane0 = (threadIdx.x & 31u) == 0u;
    mk_u64 deadline = 0;
    mk_u32 n = 0;
    for (;;) {   /* converged: each step's verdict is lane 0's */
        const mk_u32 seen = __shfl_sync(0xffffffffu,
                                        lane0 ? mk_issued_read(&ctl.ring_issued[slot]) : 0u, 0);
        if (seen == pos)
            break;
        if (deadline == 0)
            deadline = mk_deadline(ctl.params.timeout_ns);
        const bool late = (++n & 63u) == 0u && (mk_globaltimer() > deadline || mk_ring_stopped());
        if (__shfl_sync(0xffffffffu, late ? 1u : 0u, 0) != 0u) {
            if (lane0)
                mk_stream_give_up(ctl);
            return false;
        }
    }
    __syncwarp();
    if (mk_mbar_try_wait(&ctl.ring_full[slot], parity))
        return true;
    if (deadline == 0)
        deadline = mk_deadline(ctl.params.timeout_ns);
    for (;;) {
        if (mk_mbar_try_wait(&ctl.ring_full[slot], parity))
            return true;
        if ((++n & 63u) == 0u && (mk_globaltimer() > deadline || mk_ring_stopped())) {
            mk_stream_give_up(ctl);   /* whichever lane gave up */
            return false;
        }
    }
}

/* Ring mode's A: warp w's buffer is bytes [4 KiB w, 4 KiB w + 4 KiB) of pages 0-1, one chunk
 * of its stage at a time: kc = 128 / mts k-rows of all 16 mts rows, 4 KiB whatever the rows.
 * Row r of a chunk is kc / 8 16-B units (pitch 2 kc bytes); unit u at 16 (u ^ (r & 7)), so the
 * 8 rows of an ldmatrix phase (one unit) fall in 8 different bank groups. */
enum { MK_STREAM_A_CHUNK = 4096 };
static_assert(MK_STREAM_WARPS * MK_STREAM_A_CHUNK == MK_STREAM_A_BYTES,
              "a chunk per warp fills pages 0-1");
static_assert(16 * 2 * MK_STREAM_BOX_ROWS == MK_STREAM_A_CHUNK,
              "16 rows x 128 k-rows of bf16, or 32 x 64, is one chunk");

__device__ __forceinline__ mk_u32 mk_stream_chunk_at(mk_u32 buf, int r, int u, int pitch)
{
    return buf + (mk_u32)(r * pitch) + ((mk_u32)(u ^ (r & 7)) << 4);
}

/* A's element (row0, k0) of record `in`, and whether its rows take 16-B copies (both the
 * tensor's base and row pitch, and the k offset, 16-B aligned): every k loop's A copy. */
__device__ __forceinline__ const mk_u16* mk_stream_a_origin(const mk_instr& in, const mk_tensor& TA)
{
    return reinterpret_cast<const mk_u16*>(TA.ptr) + (mk_u64)in.row0 * TA.ld + in.k0;
}

__device__ __forceinline__ bool mk_stream_a_vec(const mk_instr& in, const mk_tensor& TA)
{
    return ((TA.ptr & 15u) == 0) && ((TA.ld & 7u) == 0) && ((in.k0 & 7) == 0);
}

/* Ring mode: warp w's A buffer, 4 KiB of pages 0-1 (above). */
__device__ __forceinline__ mk_u32 mk_stream_a_buffer(const mk_pages& pages, int warp)
{
    return mk_smem_addr(pages[warp >> 2]) + (mk_u32)(warp & 3) * MK_STREAM_A_CHUNK;
}

/* This warp's A chunk: rows [0, 16 mts), k [kk, kk + kc) relative to the tile origin ga, into
 * buf (zeros past rows and klen). vec: cp.async (the caller commits), else synchronous scalar
 * loads. 256 units of 16 B: 8 per lane. */
__device__ __forceinline__ void mk_stream_chunk_a(mk_u32 buf, const mk_u16* ga, mk_u32 lda,
                                                  int rows, int mts, int klen, int kk, bool vec)
{
    const int lane = (int)(threadIdx.x & 31u);
    const int shift = mts == 1 ? 4 : 3;                 /* log2 of the units per row */
    const int pitch = 32 << (shift - 1);                /* 2 kc bytes: 256 or 128 */
#pragma unroll 1
    for (int i = lane; i < 256; i += 32) {
        const int r = i >> shift, u = i & ((1 << shift) - 1);
        mk_stream_a_unit(mk_stream_chunk_at(buf, r, u, pitch), ga, lda, r, kk + 8 * u, rows,
                         klen, vec);
    }
}

/* mk_stream_chunk_a for a narrow band of at most 8 rows (mk_stream_kloop_ring_rows8): rows
 * [0, rows) of k [kk, kk + 128) into the 2 KiB half-chunk at buf (8 rows of 256 B, the same
 * swizzle); the rows past `rows` are left as they are (zeros, stored once by the loop). */
__device__ __forceinline__ void mk_stream_chunk_a8(mk_u32 buf, const mk_u16* ga, mk_u32 lda,
                                                   int rows, int klen, int kk, bool vec)
{
    constexpr int pitch = 2 * MK_STREAM_BOX_ROWS;
    static_assert(MK_STREAM_BOX_ROWS / 8 == 16, "16 units of 16 B per row of a chunk");
    const int lane = (int)(threadIdx.x & 31u);
#pragma unroll 1
    for (int i = lane; i < 16 * rows; i += 32) {
        const int r = i >> 4, u = i & 15;
        mk_stream_a_unit(mk_stream_chunk_at(buf, r, u, pitch), ga, lda, r, kk + 8 * u, rows,
                         klen, vec);
    }
}

/* One k16 step of this warp for MTS m16 tiles (MTS is a template argument: with the tile
 * count known, the step is straight-line code, and ptxas issues the next step's ldmatrix
 * under this step's MMAs; with a run-time count it branched around every MMA pair and paid
 * each ldmatrix's latency in series, ~1.6 us per 64-MMA stage on the H200). A fragments of
 * tile mt from a_at[mt]; B's 8 n8 tiles from the box page st, this lane's ldmatrix row b_row
 * (the page's k-row, in the TMA's 128-B swizzle). */
template <int MTS, bool NARROW = false, bool ROWS8 = false>
__device__ __forceinline__ void mk_stream_k16(float (&acc)[2][8][4], const mk_u32 (&a_at)[MTS],
                                              mk_u32 st, mk_u32 b_row, int lane)
{
    static_assert(!ROWS8 || MTS == 1, "eight rows are one m16 tile's upper half");
    constexpr int NB = NARROW ? 2 : 4;        /* x4 loads of B: 16 columns each */
    mk_u32 a[MTS][4], b[NB][4];
#pragma unroll
    for (int mt = 0; mt < MTS; ++mt) {
        if (ROWS8) {   /* the tile's rows 8-15 are past the band's rows: zero fragments */
            mk_ldmatrix_x2(&a[mt][0], &a[mt][2], a_at[mt]);
            a[mt][1] = a[mt][3] = 0u;
        } else {
            mk_ldmatrix_x4(a[mt], a_at[mt]);
        }
    }
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        const mk_u32 chunk = 2u * j + ((mk_u32)lane >> 4);
        /* 128-B rows, chunk c at c ^ (r & 7); a narrow box's 64-B rows, c at c ^ ((r / 2) & 3)
         * (the TMA's 64-B swizzle): either way the 8 rows of a phase hit 8 bank groups */
        const mk_u32 at = NARROW ? st + 64u * b_row + ((chunk ^ ((b_row >> 1) & 3u)) << 4)
                                 : st + 128u * b_row + ((chunk ^ (b_row & 7u)) << 4);
        mk_ldmatrix_x4_trans(b[j], at);
    }
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int mt = 0; mt < MTS; ++mt) {
            mk_mma_bf16_16816(acc[mt][2 * j], a[mt], b[j]);
            mk_mma_bf16_16816(acc[mt][2 * j + 1], a[mt], b[j] + 2);
        }
}

/* The k loop with the ring: a stage is read by MTS warps, one per m16 tile (MTS = 1: warp w
 * takes stages s = w, w + 8, ...; MTS = 2: warps w and w + 4 take s = w, w + 4, ..., warp w
 * k-rows 0-63 of each and warp w + 4 k-rows 64-127). Stage s is at position
 * pages.stream_pos + s, in slot pos % R with full parity (pos / R) & 1. For each of its
 * stages a warp requests its one A chunk (kc k-rows of the 16 MTS rows: 4 KiB, its whole
 * buffer), waits for the page while the chunk is on its way, then for the chunk, runs its
 * k16 steps' MMAs, and arrives on ring_empty[slot].
 *
 * Ordering (stream.cuh has the ring's): the warp has not read pos - R, so it waits for
 * ring_issued[slot] == pos before the parity wait ("which phase" there). A phase of
 * ring_empty is MK_STREAM_READERS readers' arrivals: each of a stage's two readers arrives
 * once, a stage's only reader twice at once, so the phase completes after every reader's
 * hand-back (mk_ring_hand_back, after every lane's ldmatrix of the page: each lane's release
 * or lane 0's after __syncwarp), which the streamer's wait acquires before its next copy
 * into the slot.
 * The warp's A buffer is written again (next stage) only after the MMAs that used the
 * chunk's fragments were issued, i.e. after its ldmatrix reads returned, and after a
 * __syncwarp: no lane's copy overtakes another lane's read.
 *
 * Why two readers for two m16 tiles: one warp per stage then needs two A chunks of 32 rows
 * x 64 k-rows per stage in its 4 KiB buffer, the second copied and waited for after the
 * first chunk's MMAs: 1.5 us of a 1.95 us warp-stage at batch 64 on the H200
 * (tools/probe_stream_stages.py, "A last chunk"). With the stage's k-rows split between two
 * warps each copies one chunk, under its page wait.
 *
 * NARROW (MK_FLAG_STREAM_NARROW, one m16 tile): a stage is two boxes of 32 columns x 128
 * k-rows stacked in k (256 k-rows, the page's halves), read by warps w and w + 4, warp w the
 * first box and w + 4 the second, each with the A chunk of its box's k-rows (16 rows x 128:
 * 4 KiB) and the 4 n8 tiles of the box's columns; the same two arrivals per phase. */
template <int MTS, bool NARROW = false>
__device__ __forceinline__ void mk_stream_kloop_ring(const mk_instr& in, const mk_tensor* op,
                                                     const mk_pages& pages,
                                                     float (&acc)[2][8][4])
{
    static_assert(!NARROW || MTS == 1, "a narrow band has one m16 tile");
    constexpr int STAGE_K = NARROW ? 2 * MK_STREAM_BOX_ROWS : MK_STREAM_BOX_ROWS;
    constexpr int READ = NARROW ? 2 : MTS;    /* warps reading a stage */
    mk_control& ctl = mk_ctl();
    const mk_tensor& TA = op[MK_ARG_A];
    const int nst = (in.klen + STAGE_K - 1) / STAGE_K;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const mk_u16* ga = mk_stream_a_origin(in, TA);
    const bool a_vec = mk_stream_a_vec(in, TA);
    constexpr int kc = STAGE_K / READ, pitch = 2 * kc;
    const mk_u32 buf = mk_stream_a_buffer(pages, warp);
    const mk_u32 ring0 = mk_smem_addr(mk_ring_page(ctl.params, 0));
    /* ldmatrix rows of this lane: A rows l % 16, unit l / 16 of the k16 step; B k-rows */
    const int a_r = lane & 15, a_c = lane >> 4;
    const mk_u32 b_lane = (lane & 7u) + ((lane >> 3) & 1u) * 8u;
    /* READ readers per stage: this warp's stages and its share of their k-rows (one chunk;
     * a narrow band's share is one box, at its own half of the page) */
    constexpr int step = MK_STREAM_WARPS / READ;
    const int kb = kc * (warp / step);        /* the share's first k-row in the stage */
    const mk_u32 box_at = NARROW ? (mk_u32)(warp / step) * (MK_PAGE_BYTES / 2) : 0u;
    const int box_row0 = NARROW ? 0 : kb;     /* the share's first k-row in its box */
#pragma unroll 1
    for (int s = warp % step; s < nst; s += step) {
        const mk_u32 pos = pages.stream_pos + (mk_u32)s;
        const mk_u32 R = ctl.params.stream_pages;
        const mk_u32 slot = pos % R, parity = (pos / R) & 1u;
        const mk_u32 st = ring0 + slot * (mk_u32)MK_PAGE_BYTES + box_at;
        /* a narrow stage's second box past the k range was not copied: nothing to read */
        const bool live = !NARROW || box_at == 0u || mk_stream_second_box(in, (mk_u32)s);
        __syncwarp();                         /* every lane's reads of the buffer are done */
        if (live)
            mk_stream_chunk_a(buf, ga, TA.ld, in.rows, MTS, in.klen,
                              STAGE_K * s + kb, a_vec);
        mk_cp_async_commit();
        /* the page, while A is on its way */
        const bool ok = __all_sync(0xffffffffu, mk_stream_wait_full(ctl, slot, pos, parity));
        mk_cp_async_wait_all();
        __syncwarp();                         /* every lane's A copies visible to the warp */
        if (ok && live) {                     /* uniform: past the deadline, no MMAs */
#pragma unroll
            for (int ks = 0; ks < kc / 16; ++ks) {
                mk_u32 a_at[MTS];
#pragma unroll
                for (int mt = 0; mt < MTS; ++mt)
                    a_at[mt] = mk_stream_chunk_at(buf, 16 * mt + a_r, 2 * ks + a_c, pitch);
                mk_stream_k16<MTS, NARROW>(acc, a_at, st, (mk_u32)(box_row0 + 16 * ks) + b_lane,
                                           lane);
            }
        }
        /* a phase is MK_STREAM_READERS readers' arrivals, MTS readers per stage */
        mk_ring_hand_back(&ctl.ring_empty[slot], (mk_u32)(MK_STREAM_READERS / READ), lane);
    }
}

/* The ring's k loop for a narrow band of at most 8 rows (a decode step's batch): as
 * mk_stream_kloop_ring<1, true>, but each warp's chunk of a stage is only 8 rows (2 KiB), so
 * its 4 KiB buffer holds two and the warp requests its next stage's chunk while it waits for
 * this stage's page: an L2 read beside the weight stream takes ~2.6-3 us
 * (tools/probe_a_chunks.py), more than a warp's turn, and with one chunk per warp it was paid
 * in every stage. Rows [rows, 8) of both halves are zeroed once per instruction, so a stage
 * copies only the rows there are (16 units at batch 1, not 256); the MMA's rows 8-15 are
 * zero fragments (mk_stream_k16<.., ROWS8>).
 *
 * Ordering, beyond mk_stream_kloop_ring's: the chunk of the warp's turn t (stage s = s0 +
 * t step) goes to half t % 2. Turn t + 1's copy is issued into the half that turn t - 1 read,
 * after a __syncwarp that follows turn t - 1's MMAs (so after their ldmatrix reads
 * returned), and is its own cp.async group; cp.async.wait_group 1 at turn t then waits for
 * turn t's group and everything before it. The zero rows are generic stores of this warp,
 * ordered before its ldmatrix by the __syncwarp after the first wait. Nothing is in flight
 * into pages 0-1 when the loop ends (wait_all), as the reduce's use of the pages needs.
 * megak/runtime/chunk_model.py states this pipeline (and mk_stream_kloop_copied's) with the
 * copies landing in any order; its tests catch a wait of 2, a turn without its (empty)
 * group, and the next chunk into the half being read. */
__device__ __forceinline__ void mk_stream_kloop_ring_rows8(const mk_instr& in, const mk_tensor* op,
                                                           const mk_pages& pages,
                                                           float (&acc)[2][8][4])
{
    constexpr int STAGE_K = 2 * MK_STREAM_BOX_ROWS, kc = MK_STREAM_BOX_ROWS, units = kc / 8;
    constexpr int step = MK_STREAM_WARPS / 2;  /* two readers per stage, a box each */
    constexpr mk_u32 HALF = MK_STREAM_A_CHUNK / 2;
    mk_control& ctl = mk_ctl();
    const mk_tensor& TA = op[MK_ARG_A];
    const int nst = (in.klen + STAGE_K - 1) / STAGE_K;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const mk_u16* ga = mk_stream_a_origin(in, TA);
    const bool a_vec = mk_stream_a_vec(in, TA);
    const mk_u32 buf = mk_stream_a_buffer(pages, warp);
    const mk_u32 ring0 = mk_smem_addr(mk_ring_page(ctl.params, 0));
    const int a_r = lane & 7, a_c = (lane >> 3) & 1;   /* an x2: rows l % 8, unit (l / 8) % 2 */
    const mk_u32 b_lane = (lane & 7u) + ((lane >> 3) & 1u) * 8u;
    const int kb = kc * (warp / step);        /* the warp's box: the stage's first or second */
    const mk_u32 box_at = (mk_u32)(warp / step) * (MK_PAGE_BYTES / 2);
    const int s0 = warp % step;
    /* a stage's second box past the k range was not copied: nothing to read */
    auto live = [&](int s) { return box_at == 0u || mk_stream_second_box(in, (mk_u32)s); };
#pragma unroll 1
    for (int i = lane; i < 2 * 8 * units; i += 32) {
        const int r = (i / units) % 8;
        if (r >= in.rows)
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};"
                         : : "r"(mk_stream_chunk_at(buf + (mk_u32)(i / (8 * units)) * HALF, r,
                                                    i % units, 2 * kc)), "r"(0u) : "memory");
    }
    if (s0 < nst && live(s0))
        mk_stream_chunk_a8(buf, ga, TA.ld, in.rows, in.klen, STAGE_K * s0 + kb, a_vec);
    mk_cp_async_commit();
#pragma unroll 1
    for (int s = s0; s < nst; s += step) {
        const mk_u32 pos = pages.stream_pos + (mk_u32)s;
        const mk_u32 R = ctl.params.stream_pages;
        const mk_u32 slot = pos % R, parity = (pos / R) & 1u;
        const mk_u32 st = ring0 + slot * (mk_u32)MK_PAGE_BYTES + box_at;
        const int turn = s / step;            /* s0 < step */
        __syncwarp();                         /* every lane's reads of the other half are done */
        if (s + step < nst && live(s + step))
            mk_stream_chunk_a8(buf + (mk_u32)((turn + 1) & 1) * HALF, ga, TA.ld, in.rows,
                               in.klen, STAGE_K * (s + step) + kb, a_vec);
        mk_cp_async_commit();
        const bool landed = __all_sync(~0u, mk_stream_wait_full(ctl, slot, pos, parity));
        mk_cp_async_wait_group<1>();          /* this turn's chunk; the next one may fly */
        __syncwarp();                         /* every lane's copies of it visible to the warp */
        if (landed && live(s)) {              /* uniform: past the deadline, no MMAs */
            const mk_u32 chunk = buf + (mk_u32)(turn & 1) * HALF;
#pragma unroll
            for (int ks = 0; ks < kc / 16; ++ks) {
                const mk_u32 a_at[1] = {mk_stream_chunk_at(chunk, a_r, 2 * ks + a_c, 2 * kc)};
                mk_stream_k16<1, true, true>(acc, a_at, st, (mk_u32)(16 * ks) + b_lane, lane);
            }
        }
        /* one of the stage's two readers: half a phase's arrivals */
        mk_ring_hand_back(&ctl.ring_empty[slot], (mk_u32)(MK_STREAM_READERS / 2), lane);
    }
    mk_cp_async_wait_all();
}

/* cp.async groups still in flight once stage s's has landed: D - 1 (immediates only). */
__device__ __forceinline__ void mk_stream_wait_a(int depth)
{
    if (depth >= 8)
        mk_cp_async_wait_group<7>();
    else
        mk_cp_async_wait_group<3>();
}

/* The k loop without the ring: nst stages of B, each copied into page 2 by all 256 threads
 * (block barriers around it); warp w takes k16 step w of every stage; A through this warp's
 * ring, D - 1 stages ahead (cp.async groups: one per stage, maybe empty, so waiting until
 * D - 1 are in flight means "stage s landed"; megak/runtime/chunk_model.py). A body per m16 tile count MTS, as the ring's
 * (mk_gemm_stream is a function of its own: its registers are not the interpreter's). */
template <int MTS>
__device__ __forceinline__ void mk_stream_kloop_copied(const mk_instr& in, const mk_tensor* op,
                                                       const mk_pages& pages,
                                                       float (&acc)[2][8][4])
{
    constexpr int room = MTS;                /* P above */
    constexpr int D = MK_STREAM_A_MAX_DEPTH / room;
    const mk_u32 slot_bytes = 512u * room, stage_bytes = 8u * slot_bytes;
    const mk_tensor& TA = op[MK_ARG_A];
    const int nst = (in.klen + MK_STREAM_BOX_ROWS - 1) / MK_STREAM_BOX_ROWS;
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31u);
    const mk_u16* ga = mk_stream_a_origin(in, TA);
    const bool a_vec = mk_stream_a_vec(in, TA);
    const mk_u32 b_row = 16u * warp + (lane & 7u) + ((lane >> 3) & 1u) * 8u;
    const mk_u32 st = mk_smem_addr(pages[2]);
    /* stage t's slot of this warp */
    auto a_slot = [&](int t) -> mk_u32 {
        const mk_u32 off = (mk_u32)(t & (D - 1)) * stage_bytes + (mk_u32)warp * slot_bytes;
        return mk_smem_addr(pages[off >> 14]) + (off & (MK_PAGE_BYTES - 1));
    };
    /* ldmatrix row of this lane inside an m16 tile: rows l % 16, chunk l / 16 */
    const int a_r = lane & 15, a_c = lane >> 4;

#pragma unroll 1
    for (int t = 0; t < D - 1; ++t) {
        if (t < nst)
            mk_stream_stage_a(a_slot(t), ga, TA.ld, in.rows, MTS, in.klen,
                              MK_STREAM_BOX_ROWS * t + 16 * warp, a_vec);
        mk_cp_async_commit();
    }
#pragma unroll 1
    for (int s = 0; s < nst; ++s) {
        const int ahead = s + D - 1;
        if (ahead < nst)
            mk_stream_stage_a(a_slot(ahead), ga, TA.ld, in.rows, MTS, in.klen,
                              MK_STREAM_BOX_ROWS * ahead + 16 * warp, a_vec);
        mk_cp_async_commit();
        mk_stream_wait_a(D);
        __syncwarp();   /* every lane's copies of stage s visible to the warp's ldmatrix */
        mk_stream_fill_box(st, op[MK_ARG_B], in.k0 + MK_STREAM_BOX_ROWS * s, in.col0);
        mk_compute_sync();
        mk_u32 a_at[MTS];
#pragma unroll
        for (int mt = 0; mt < MTS; ++mt)
            a_at[mt] = mk_stream_a_at(a_slot(s), 16 * mt + a_r, a_c);
        mk_stream_k16<MTS>(acc, a_at, st, b_row, lane);
        mk_compute_sync();   /* every warp is done with page 2 before the next box */
    }
    mk_cp_async_wait_all();
}

/* The fp32 bands' k loops, in the accumulator layout of the ones above. */
#include "gemm_stream_f32.cuh"

/* Rows [16 mt, 16 mt + 16) of the 8 warps' accumulators -> their sum: through pages 1-2
 * (warp w's 16 x 64 partial at page 1 + w / 4, slot w % 4), pair p of row r at pair
 * p ^ 4 (r & 7): the fragment stores and the row reads take the fewest wavefronts. Thread t
 * sums rows 16 mt + t / 16, column pairs t % 16 and t % 16 + 16 (columns 2 pc, 2 pc + 1), into
 * sums[mt][half] when `direct` (mk_stream_store_direct stores them), else into the staging
 * rows (page 0) for the combine and the generic epilogue. */
__device__ __forceinline__ void mk_stream_reduce(const mk_pages& pages, const float (&acc)[2][8][4],
                                                 int rows, bool hold, bool direct,
                                                 float2 (&sums)[2][2])
{
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, q = lane & 3;
    float* const mine = pages[1 + (warp >> 2)] + (warp & 3) * MK_STREAM_PART_FLOATS;
    mk_compute_sync();   /* every warp is done with the A ring (pages 0-1) and box (page 2) */
    if (hold && tid == 0)   /* every stage of this instruction was read: the rest can wait */
        mk_stream_hold(mk_ctl(), 1u);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
        sums[mt][0] = sums[mt][1] = make_float2(0.f, 0.f);
        if (16 * mt >= rows)
            continue;   /* uniform */
#pragma unroll
        for (int n8 = 0; n8 < 8; ++n8)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = g + 8 * h;
                const int pair = (4 * n8 + q) ^ (4 * (r & 7));
                *reinterpret_cast<float2*>(mine + r * MK_STREAM_PART_LD + 2 * pair) =
                    make_float2(acc[mt][n8][2 * h], acc[mt][n8][2 * h + 1]);
            }
        mk_compute_sync();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = tid >> 4, pc = (tid & 15) + 16 * half;   /* pair pc = cols 2pc, 2pc+1 */
            const int row = 16 * mt + r;
            if (row < rows) {
                const int off = r * MK_STREAM_PART_LD + 2 * (pc ^ (4 * (r & 7)));
                float2 v = make_float2(0.f, 0.f);
#pragma unroll
                for (int w = 0; w < MK_STREAM_WARPS; ++w) {
                    const float2 x = *reinterpret_cast<const float2*>(
                        pages[1 + (w >> 2)] + (w & 3) * MK_STREAM_PART_FLOATS + off);
                    v.x += x.x;
                    v.y += x.y;
                }
                if (direct)
                    sums[mt][half] = v;
                else
                    *reinterpret_cast<float2*>(
                        mk_gemm_stage_at(pages[row / MK_GEMM_STAGE_ROWS], row, pc >> 1) +
                        2 * (pc & 1)) = v;
            }
        }
        mk_compute_sync();
    }
}

/* mk_stream_reduce for a narrow band read from the ring (one m16 tile, 32 columns: the 4 n8
 * tiles of acc[0]): the 8 warps' partials, 2 KiB each, go to page 2, which the ring's k loop
 * never touches (A is in pages 0-1), so no barrier comes before they are written; and half
 * the shared-memory traffic of the 64-column reduce, whose second half a narrow band never
 * stores. Row r's pair p at p ^ 4 (r & 3): a half warp's float2 stores (rows g, pairs q) and
 * a warp's row reads each take the fewest wavefronts. Thread t sums row t / 16, pair t % 16
 * (columns 2 (t % 16), + 1) into sums[0][0]. The hold is raised after the barrier, when every
 * warp is done with its k loop (as mk_stream_reduce raises it after its first). */
__device__ __forceinline__ void mk_stream_reduce_narrow(const mk_pages& pages,
                                                        const float (&acc)[2][8][4], bool hold,
                                                        float2 (&sums)[2][2])
{
    enum { LD = MK_STREAM_NARROW_COLS, SLOT = 16 * LD };   /* floats: a row, a warp's tile */
    static_assert(MK_STREAM_WARPS * SLOT * 4 == MK_PAGE_BYTES, "8 partials fill page 2");
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, q = lane & 3;
    float* const part = pages[2];
    float* const mine = part + warp * SLOT;
#pragma unroll
    for (int n8 = 0; n8 < 4; ++n8)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = g + 8 * h;
            const int pair = (4 * n8 + q) ^ (4 * (r & 3));
            *reinterpret_cast<float2*>(mine + r * LD + 2 * pair) =
                make_float2(acc[0][n8][2 * h], acc[0][n8][2 * h + 1]);
        }
    mk_compute_sync();
    if (hold && tid == 0)   /* every stage of this instruction was read: the rest can wait */
        mk_stream_hold(mk_ctl(), 1u);
    const int r = tid >> 4, pc = tid & 15;
    const int off = r * LD + 2 * (pc ^ (4 * (r & 3)));
    float2 v = make_float2(0.f, 0.f);
#pragma unroll
    for (int w = 0; w < MK_STREAM_WARPS; ++w) {
        const float2 x = *reinterpret_cast<const float2*>(part + w * SLOT + off);
        v.x += x.x;
        v.y += x.y;
    }
    sums[0][0] = v;
    sums[0][1] = sums[1][0] = sums[1][1] = make_float2(0.f, 0.f);
    mk_compute_sync();   /* every thread's reads done before page 2 goes back */
}

/* A band of one part (every narrow band, and any band whose k range the lowering did not
 * split): thread t's sums from mk_stream_reduce through the epilogue straight to the output,
 * rows t / 16 and 16 + t / 16, column pairs t % 16 and t % 16 + 16. No staging rows, no
 * barrier, no second pass over shared memory; the loop's body (the epilogue's code) exists
 * once, its four pairs rotated through it. A warp stores two rows of 16 pairs (128 B of
 * fp32, 64 B of bf16 each). Bias and residual are loaded and the output stored by the same
 * thread, the loads first: an in-place residual (residual == out) stays safe. */
__device__ __forceinline__ void mk_stream_store_direct(const mk_instr& in, const mk_tensor* op,
                                                       const float2 (&sums)[2][2])
{
    const mk_tensor& TO = op[MK_ARG_OUT];
    const mk_tensor& TB = op[MK_ARG_BIAS];
    const mk_tensor& TR = op[MK_ARG_RESIDUAL];
    const mk_u32 act = mk_epilogue_act(in.flags);
    const bool has_bias = (in.flags & MK_FLAG_BIAS) != 0;
    const bool has_res = (in.flags & MK_FLAG_RESIDUAL) != 0;
    const int tid = (int)threadIdx.x, r = tid >> 4, pc = tid & 15;
    const mk_u64 o_base = (mk_u64)in.row0 * TO.ld + in.col0;
    const mk_u64 r_base = has_res ? (mk_u64)in.row0 * TR.ld + in.col0 : 0u;
    const bool o_vec = mk_vec2_ok(TO, o_base);
    const bool r_vec = has_res && mk_vec2_ok(TR, r_base);
    const bool b_vec = has_bias && mk_vec2_ok(TB, in.col0);
    float2 v0 = sums[0][0], v1 = sums[0][1], v2 = sums[1][0], v3 = sums[1][1];
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {
        const int row = r + 16 * (i >> 1), col = 2 * pc + 32 * (i & 1);
        const int nv = in.cols - col;
        const float2 v = v0;
        v0 = v1;
        v1 = v2;
        v2 = v3;
        if (row >= in.rows || nv <= 0)
            continue;
        const float2 zero = make_float2(0.f, 0.f);
        const float2 bias = has_bias ? mk_ld2_any(TB, (mk_u64)in.col0 + col, nv, b_vec) : zero;
        const float2 res = has_res
            ? mk_ld2_any(TR, r_base + (mk_u64)row * TR.ld + col, nv, r_vec) : zero;
        mk_st2_any(TO, o_base + (mk_u64)row * TO.ld + col,
                   mk_epilogue2(v, bias, res, has_bias, act, has_res), nv, o_vec);
    }
}

/* The combine of a band's parts (see "Why"). True when this part runs the epilogue. */
__device__ __forceinline__ bool mk_stream_combine(const mk_instr& in, const mk_tensor* op,
                                                  const mk_pages& pages)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 parts = mk_stream_parts(in), part = mk_stream_part(in);
    if (parts <= 1)
        return true;
    const mk_tensor& TS = op[MK_ARG_SPARE];
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int rows = in.rows, nv = in.cols - 4 * (lane & 15);
    const bool vec = ((TS.ptr & 15u) == 0) && ((TS.ld & 3u) == 0) && ((in.col0 & 3) == 0);
    float* const gs = reinterpret_cast<float*>(TS.ptr);
    /* rows r = 2 warp + lane / 16, + 16, ...: 16 rows per pass, a half warp per row */
    const int r0 = 2 * warp + (lane >> 4);
    if (nv > 0)
        for (int r = r0; r < rows; r += 2 * MK_STREAM_WARPS) {
            const float4 v = *reinterpret_cast<const float4*>(
                mk_gemm_stage_at(pages[r / MK_GEMM_STAGE_ROWS], r, lane & 15));
            mk_st_f4_edge(gs + (mk_u64)(part * (mk_u32)MK_STREAM_M + (mk_u32)in.row0 + r) * TS.ld + in.col0 + 4 * (lane & 15),
                          v, nv, vec);
        }
    mk_compute_sync();
    if (tid == 0) {
        mk_u32* counter = reinterpret_cast<mk_u32*>(ctl.params.counters) + (mk_u32)in.out_row0;
        mk_fence_release();               /* + the strong add: a release pattern */
        const mk_u32 old = atomicAdd(counter, 1u);
        const bool last = old + 1u == (ctl.params.epoch + 1u) * parts;
        if (last)
            mk_fence_acquire();           /* the add read + fence: an acquire pattern */
        ctl.stream_last = last ? 1u : 0u;
    }
    mk_compute_sync();
    if (!ctl.stream_last)
        return false;
    if (nv > 0)
        for (int r = r0; r < rows; r += 2 * MK_STREAM_WARPS) {
            float* const mine = mk_gemm_stage_at(pages[r / MK_GEMM_STAGE_ROWS], r, lane & 15);
            float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
            for (mk_u32 p = 0; p < parts; ++p) {
                const float4 x = p == part
                    ? *reinterpret_cast<const float4*>(mine)
                    : mk_ld_f4_edge(gs + (mk_u64)(p * (mk_u32)MK_STREAM_M + (mk_u32)in.row0 + r) * TS.ld + in.col0 +
                                        4 * (lane & 15), nv, vec);
                sum.x += x.x;
                sum.y += x.y;
                sum.z += x.z;
                sum.w += x.w;
            }
            *reinterpret_cast<float4*>(mine) = sum;
        }
    mk_compute_sync();
    return true;
}

/* What the dispatch (ops/gemm.cuh) knows of a record's form: each form it tells apart runs in
 * a function of its own, the body below with that form's facts constant, so its code holds
 * that form's k loop, reduce and store only. Why: a tail's code (the reduce, the store, the
 * signal's path) is fetched again at every instruction (an SM keeps 96-128 KiB of code), and
 * one body of every form made each tail fetch past the others': with the other forms cut
 * out, the W2-1024x16 chain ran 75.4 -> 72.5 us on the H200 (benchmarks/ANALYSIS.md). */
enum mk_stream_form {
    MK_STREAM_ANY = 0,      /* any record: without the ring, or parts that combine */
    MK_STREAM_NARROW = 1,   /* a narrow band of 9-16 rows read from the ring (one part:
                               mk_gemm_stream_check) */
    MK_STREAM_ROWS8 = 2,    /* a narrow band of at most 8 rows read from the ring */
    MK_STREAM_DIRECT = 3,   /* a band of 64 columns and one part read from the ring */
    MK_STREAM_F32 = 4       /* an fp32 band of one part read from the ring
                               (MK_FLAG_STREAM_F32) */
};

__device__ __forceinline__ mk_stream_form mk_gemm_stream_form(const mk_instr& in, bool ring)
{
    if (!ring)
        return MK_STREAM_ANY;
    if (mk_stream_f32(in))
        return mk_stream_parts(in) <= 1 ? MK_STREAM_F32 : MK_STREAM_ANY;
    if (mk_stream_narrow(in))
        return in.rows <= 8 ? MK_STREAM_ROWS8 : MK_STREAM_NARROW;
    return mk_stream_parts(in) <= 1 ? MK_STREAM_DIRECT : MK_STREAM_ANY;
}

/* All 256 compute threads; FORM: what is known of the record (the facts below are constants
 * but for MK_STREAM_ANY). */
template <int FORM>
__device__ __forceinline__ void mk_gemm_stream_run(const mk_instr& in, const mk_tensor* op,
                                                   const mk_pages& pages)
{
    const bool any = FORM == MK_STREAM_ANY;
    const bool ring = !any || pages.stream_stages > 0;
    const bool narrow = FORM == MK_STREAM_NARROW || FORM == MK_STREAM_ROWS8 ||
                        (any && mk_stream_narrow(in));
    const bool f32 = FORM == MK_STREAM_F32 || (any && mk_stream_f32(in));
    const bool rows8 = FORM == MK_STREAM_ROWS8 || (any && in.rows <= 8);
    const bool direct = !any || mk_stream_parts(in) <= 1;
    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc[mt][n][e] = 0.f;
    const bool two = in.rows > 16;            /* m16 tiles: checked rows <= 32 */
    if (f32) {                                /* checked: rows <= 16, one m16 tile */
        mk_stream_kloop_f32(in, op, pages, acc, ring);
    } else if (ring) {
        if (narrow && rows8)
            mk_stream_kloop_ring_rows8(in, op, pages, acc);
        else if (narrow)                      /* checked: rows <= 16 */
            mk_stream_kloop_ring<1, true>(in, op, pages, acc);
        else if (two)
            mk_stream_kloop_ring<2>(in, op, pages, acc);
        else
            mk_stream_kloop_ring<1>(in, op, pages, acc);
    } else {   /* a narrow band is copied as a 64-column box: the 32 past it never stored */
        if (two)
            mk_stream_kloop_copied<2>(in, op, pages, acc);
        else
            mk_stream_kloop_copied<1>(in, op, pages, acc);
    }
    mk_trace_mark(MK_T_COMPUTED);
    /* an instruction that read the ring holds the streamer from here to its signal's fence
     * (stream.cuh, "The hold") */
    float2 sums[2][2];
    if (MK_NARROW_REDUCE && ring && (narrow || f32) && direct)
        mk_stream_reduce_narrow(pages, acc, true, sums);
    else
        mk_stream_reduce(pages, acc, in.rows, ring, direct, sums);
    pages.release(1, 3);
    if (direct)
        mk_stream_store_direct(in, op, sums);
    else if (mk_stream_combine(in, op, pages))
        mk_gemm_epilogue_at(in, op, pages, in.row0);
}

#endif /* MEGAK_OP_GEMM_STREAM_CUH */
