/* MK_OP_TRANSPOSE: out[r, c] = A[c, r] for r in [row0, row0 + rows), c in [col0, col0 + cols)
 * (the region is in OUTPUT coordinates), rows, cols <= MK_TRANSPOSE_TILE = 128: one 128 x 128
 * tile per instruction, MK_TRANSPOSE_PAGES = 4 pages (the tile's 64 KiB). Operands: A, OUT.
 *
 * Two paths, picked per record on the device:
 *  - paged (a whole tile, A and OUT both with tensor maps, run by the megakernel's loader):
 *    loader lane 0 copies the tile into the instruction's 4 pages with 4 TMA copies of A's map
 *    (page b: the box of MK_TRANSPOSE_BOX_COLS = 32 A columns x all 128 A rows, with the 128-B
 *    swizzle, completing on ctl.transpose_full[slot]) after the dependency wait (L6), and hands
 *    the slot over without waiting for them (L7). The compute warps wait on that barrier (each
 *    thread acquires the bytes itself), read their 4 x 4 blocks (LDS.128), and after the
 *    compute barrier write them back transposed into the same pages, now as OUT's boxes (page
 *    g: 32 output columns x 128 output rows, same swizzle); after a second barrier thread 0
 *    stores the 4 pages with 4 TMA stores of OUT's map. No compute thread issues a global
 *    store, and the 8 warps' stores become 4 bulk copies. The loader runs up to MK_SLOTS - 1
 *    instructions ahead (a tile per slot: 8 of the 13 pages on two slots), so a tile lands
 *    while the one before is stored;
 *  - registers (tiles at the edges, views TMA cannot describe: no map, the separate-launch
 *    entry): the tile's loads straight from global memory into registers, then its stores.
 *
 * Why pages: a transpose is one memory latency per instruction when each instruction loads
 * its own tile, and between two instructions of an SM nothing is loading (W4 3,309 GB/s in the
 * megakernel, its bubble 15% of each SM's span, with two tiles per instruction in registers).
 * tools/probe_paged_transpose.py on the H200 (16384^2 fp32, one block per SM): that register
 * body 3,347-3,350 GB/s; the tile copied one tile ahead by bulk copies 3,779-3,790 (two
 * tiles of 64 KiB per SM: the one being stored and the one landing; three: 3,712-3,746); the same
 * one-ahead copy by 16-B cp.async from the loader warp 3,354-3,367 (4,096 copies a tile from
 * one warp); a device-to-device copy 4,257.
 *
 * Why a tensor map and not a bulk copy per A row (each row is 512 contiguous bytes, so a plain
 * cp.async.bulk needs no map): a bulk copy's operands must be warp-uniform, so 32 lanes' copies
 * are issued one lane at a time, and the issue of a tile's 128 row copies took 5.3 us in the
 * megakernel (traced at L6, benchmarks/results/three-slots/trace-diag-8192.log): the loader
 * stood there until the tile had nearly landed. Why the 128-B swizzle and TMA stores out: the
 * probe's in-by-swizzled-boxes, out-by-TMA-stores form ran 3,777-3,842 GB/s against 3,747-3,770
 * for the unswizzled tile stored by the compute warps (benchmarks/results/transpose-head/
 * probe-modes-tail.log); the swizzle makes both the reads and the transposed writes of the
 * pages conflict-free (below).
 *
 * Ordering of the paged path:
 *  - A may be another SM's output (generic stores, ordered before this by the dependency wait's
 *    acquire, L5); the pages were last read and written by generic accesses of an earlier
 *    instruction (handed back with a release the loader's page acquire, L3, reads). The
 *    issuing lane runs fence.proxy.async for the global and the shared::cta state spaces after
 *    those acquires and before its copies (async proxy), so both orders carry over to the
 *    copies. A's map is the host's, written before the launch or the resident request that
 *    names its table, as the GEMMs' maps are. Pages the record before still held are written
 *    only after that record's empty phase (racecheck's view of the same order:
 *    mk_transpose_preload);
 *  - the barrier is initialised afresh for each paged record by loader lane 0 (invalidated
 *    first if it was in use), then fence.mbarrier_init so the copy engine's complete_tx sees
 *    the new barrier, then arrive.expect_tx of the tile's bytes: its phase 0 completes when
 *    every byte has landed. Slot q % MK_SLOTS's barrier is free again at L1 of q: the compute
 *    warps waited on it for q - MK_SLOTS before they arrived on its empty barrier;
 *  - the compute threads' own wait (parity 0, bounded) is their acquire of the bytes; past its
 *    deadline the op raises ctl.stream_error and skips the tile, and the interpreter stops the
 *    block with MK_ERR_TIMEOUT after the op. Tiles of records the compute warps never run (a
 *    block that stops) are waited for by the loader when it leaves
 *    (mk_transpose_preload_drain, bounded), so no copy outlives the block;
 *  - the transposed write-back: every thread's reads of the pages end before the compute
 *    barrier, so no write lands on bytes another thread has yet to read; each writer's
 *    fence.proxy.async.shared::cta, then the barrier again, order every generic write before
 *    thread 0's TMA stores (async proxy) read the pages;
 *  - thread 0 waits until its stores have read the pages (cp.async.bulk.wait_group.read)
 *    before the compute barrier after the op, which precedes the pages' hand-back: no later
 *    tile lands in them while a store reads them. Where the record signals counters (a
 *    consumer in this graph), it also waits until the stores have written global memory and
 *    runs fence.proxy.async.global (mk_bulk_wait_written) before that barrier, so the signal's
 *    release (mk_compute_signal) publishes the tile like a generic store. Otherwise the
 *    stores may still be in flight when the next instruction starts: the interpreter's thread
 *    0 runs mk_bulk_wait_written whenever it leaves (megakernel.cu, mk_compute), before the
 *    block reports its invocation done.
 *
 * The register path's layout: the tile is 1024 blocks of 4 x 4 floats, 4 per thread. A
 * thread loads its blocks' 4 A rows (float4 each), transposes them in registers (renaming and
 * a few moves) and stores 4 output rows (float4 each): 16 loads of 16 B per thread (64
 * registers), no barrier inside the op.
 *
 * Tile coordinates: S(i, j) = A[col0 + i][row0 + j] = out[row0 + j][col0 + i]. Block (P, Q) =
 * A rows 4P..4P+3 (output columns), A columns 4Q..4Q+3 (output rows), P, Q in 0..31.
 * Thread (warp w, lane l) holds blocks b = 0..3:
 *
 *     P = 8 (w & 3) + 4 (b & 1) + (l >> 3),     Q = 16 (w >> 2) + 8 (b >> 1) + (l & 7)
 *
 *  - load (b, k): A row 4P + k, columns 4Q..4Q+3. A warp instruction covers 4 rows (l >> 3)
 *    x 8 consecutive chunks (l & 7) = 4 whole 128-B lines: 16 sectors per request from global
 *    memory.
 *  - store (b, m): out row 4Q + m, columns 4P..4P+3 = (x[b][0].m, .., x[b][3].m). A warp
 *    instruction covers 8 rows (l & 7) x 4 consecutive chunks (l >> 3) = 8 x 64 B: 16 sectors
 *    per request; blocks b and b ^ 1 of the same warp complete each 128-B line. (16 sectors
 *    with rows 64-B aligned, ld % 16 == 0 as for 8192 x 8192; a ld only 16-B aligned costs
 *    up to 20 (loads) / 24 (stores) sectors per 512 B.)
 *  - edges (register path): rows of A past the region are not loaded, columns past it read as
 *    zero (mk_ld_f4_edge: scalars for a partial chunk or an A that is not 16-B aligned);
 *    output rows past the region are not stored, partial chunks and an unaligned OUT are
 *    stored with scalars (mk_st_f4_edge). Nothing outside the region is read or written.
 */
#ifndef MEGAK_OP_TRANSPOSE_CUH
#define MEGAK_OP_TRANSPOSE_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../stream.cuh"

/* MK_TRANSPOSE_PAGES = 4, MK_TRANSPOSE_TILE = 128, MK_TRANSPOSE_OPERANDS come from instr.h. */
static_assert(MK_TRANSPOSE_TILE == 128 && MK_THREADS == 256,
              "the block map below assumes a 128 x 128 tile (32 x 32 blocks of 4 x 4), 8 warps");
static_assert(MK_TRANSPOSE_PAGES * MK_PAGE_BYTES == MK_TRANSPOSE_TILE * MK_TRANSPOSE_TILE * 4,
              "the paged tile fills the record's pages");
enum { MK_TRANSPOSE_BOX_ROW_BYTES = MK_TRANSPOSE_BOX_COLS * 4 };   /* one row of a box */
static_assert(MK_TRANSPOSE_BOX_ROW_BYTES == 128,
              "a box row is the 128-B swizzle's span (16-B chunk c of row r at c ^ (r % 8))");
static_assert(MK_TRANSPOSE_BOX_COLS * MK_TRANSPOSE_PAGES == MK_TRANSPOSE_TILE &&
                  MK_TRANSPOSE_TILE * MK_TRANSPOSE_BOX_ROW_BYTES == MK_PAGE_BYTES,
              "a page holds one box: MK_TRANSPOSE_BOX_COLS columns of every row of the tile");
static_assert(MK_TRANSPOSE_READY == 131072 + MK_TRANSPOSE_TILE,
              "the maps' ready word names their box rows");

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

/* The slot whose record `in` is: both roles pass the record in place (the first member of
 * ctl.slot[q % MK_SLOTS]), so its address names the slot, and with it the paged tile's barrier. */
__device__ __forceinline__ mk_u32 mk_transpose_slot(const mk_instr& in)
{
    return (mk_u32)(reinterpret_cast<const mk_slot*>(&in) - mk_ctl().slot);
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
 * 2H + j; nothing outside the region. ni = A rows (output columns) of the region, nj = A
 * columns (output rows). */
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

/* The same halves for a whole aligned tile in global memory: no checks at all. */
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

/* Bounded wait for the phase of `parity` of an mbarrier; false past the deadline. */
__device__ __forceinline__ bool mk_transpose_wait(mk_u64* bar, mk_u32 parity = 0u)
{
    /* the clock read only where the first try fails (a tile has mostly landed by then) */
    return mk_mbar_try_wait(bar, parity) ||
           mk_mbar_wait(bar, parity, mk_deadline(mk_ctl().params.timeout_ns));
}

/* The paged path's layout. Page b holds box b of A's map: A columns 32 b .. 32 b + 31 of the
 * tile, row r (0..127) at byte 128 r, its 16-B chunk c (A columns 32 b + 4 c ..) at chunk
 * c ^ (r % 8) (the 128-B swizzle). Thread (warp w, lane l), i = l & 7, g = l >> 3, holds the
 * blocks P = 8 g + i (A rows 4P..4P+3), Q_b = 8 b + ((i + w) & 7) (A columns 4Q_b..), b = 0..3:
 * over the 8 warps Q_b % 8 takes every value, so the 256 threads hold the 1,024 blocks. Each
 * 8-lane phase of an LDS.128 or STS.128 then touches 8 distinct chunks of 8 rows: no bank
 * conflict either way. The write-back puts output row 4Q_b + e (columns 4P..4P+3) into page g
 * (output columns 32 g .. 32 g + 31: OUT's box g) at chunk i ^ (row % 8). */
__device__ __forceinline__ mk_u32 mk_transpose_swizzled(mk_u32 page, mk_u32 row, mk_u32 chunk)
{
    return page + row * (mk_u32)MK_TRANSPOSE_BOX_ROW_BYTES + 16u * (chunk ^ (row & 7u));
}

/* The paged path (see "Ordering of the paged path"), a function of its own as the register
 * path's is, both called from mk_transpose_run (a body called from a body gets the few
 * registers a call inside a call leaves it). Each thread waits for the tile with its own
 * deadline; the barrier after the reads also agrees on the outcome: where any thread's wait
 * passed its deadline, every thread leaves with ctl.stream_error raised and nothing stored
 * (the interpreter stops the block), so the barriers below always see all 256 threads. */
__device__ __noinline__ void mk_transpose_paged(const mk_instr& in, unsigned char* page_base,
                                                const mk_u8* page_idx, mk_u32 preloaded)
{
    /* the page table by value, as the GEMM bodies take it (a reference puts it on the stack) */
    const mk_pages pages = {page_base, page_idx, preloaded, nullptr, nullptr};
    mk_control& ctl = mk_ctl();
    const bool landed = mk_transpose_wait(&ctl.transpose_full[mk_transpose_slot(in)]);
#if MK_TRACE
    if (threadIdx.x == 0)   /* the tile is in: the op's compute phase starts */
        ctl.trace_t[MK_T_COMPUTED] = mk_globaltimer();
#endif
    const mk_u32 w = threadIdx.x >> 5, l = threadIdx.x & 31u, i = l & 7u, g = l >> 3;
    const mk_u32 P = 8u * g + i, q = (i + w) & 7u;
    /* x[b][k]: A row 4P + k, columns 4Q_b .. 4Q_b + 3. Read whether or not this thread's wait
     * landed (a thread past its deadline discards what it read, at the vote below): the reads
     * under a branch kept x in local memory across the barrier in the builds with the GEMM
     * bodies (224-256 B of spills) */
    float4 x[4][4];
#pragma unroll
    for (mk_u32 b = 0; b < 4u; ++b) {
        const mk_u32 page = mk_smem_addr(pages[b]);
#pragma unroll
        for (mk_u32 k = 0; k < 4u; ++k)
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(x[b][k].x), "=f"(x[b][k].y), "=f"(x[b][k].z), "=f"(x[b][k].w)
                         : "r"(mk_transpose_swizzled(page, 4u * P + k, q)) : "memory");
    }
    if (!mk_compute_sync_all(landed)) {   /* and every thread's reads of the pages done */
        if (threadIdx.x == 0)
            atomicExch(&ctl.stream_error, 1u);
        return;
    }
    const mk_u32 out_page = mk_smem_addr(pages[g]);
#pragma unroll
    for (mk_u32 b = 0; b < 4u; ++b) {
        const mk_u32 r = 4u * (8u * b + q);   /* output rows r .. r + 3, columns 4P .. 4P + 3 */
        const float4 y[4] = {make_float4(x[b][0].x, x[b][1].x, x[b][2].x, x[b][3].x),
                             make_float4(x[b][0].y, x[b][1].y, x[b][2].y, x[b][3].y),
                             make_float4(x[b][0].z, x[b][1].z, x[b][2].z, x[b][3].z),
                             make_float4(x[b][0].w, x[b][1].w, x[b][2].w, x[b][3].w)};
#pragma unroll
        for (mk_u32 e = 0; e < 4u; ++e)
            asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
                         : : "r"(mk_transpose_swizzled(out_page, r + e, i)),
                             "f"(y[e].x), "f"(y[e].y), "f"(y[e].z), "f"(y[e].w) : "memory");
    }
    mk_fence_proxy_async_smem();   /* this thread's writes -> the stores' reads */
    mk_compute_sync();
    if (threadIdx.x == 0) {
        const void* map = mk_tmaps(ctl.params) + (mk_u64)MK_TMAP_BYTES * in.tensor[MK_ARG_OUT];
#pragma unroll
        for (mk_u32 b = 0; b < (mk_u32)MK_TRANSPOSE_PAGES; ++b)
            mk_tma_store_2d(map, in.col0 + (int)(b * MK_TRANSPOSE_BOX_COLS), in.row0,
                            mk_smem_addr(pages[b]));
        mk_bulk_commit();
        mk_bulk_wait_read();   /* the pages may be handed back (and refilled) */
        if (in.n_signals > 0)
            mk_bulk_wait_written();   /* the signal publishes the tile */
    }
}

/* The register path. A function of its own, like the GEMM bodies: its registers are allocated
 * apart from the interpreter loop's (inlined there, the two together spill). */
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
    const bool full = ni == MK_TRANSPOSE_TILE && nj == MK_TRANSPOSE_TILE;
    const mk_transpose_lane t;
    float4 x0[2][4], x1[2][4];
    if (full && a_vec) {
        mk_transpose_load_full<0>(t, a, lda, x0);
        mk_transpose_load_full<1>(t, a, lda, x1);
    } else {
        mk_transpose_load_edge<0>(t, a, lda, ni, nj, a_vec, x0);
        mk_transpose_load_edge<1>(t, a, lda, ni, nj, a_vec, x1);
    }
    if (full && o_vec) {
        mk_transpose_store_full<0>(t, o, ldo, x0);
        mk_transpose_store_full<1>(t, o, ldo, x1);
    } else {
        mk_transpose_store_edge<0>(t, o, ldo, ni, nj, o_vec, x0);
        mk_transpose_store_edge<1>(t, o, ldo, ni, nj, o_vec, x1);
    }
}

__device__ __forceinline__ void mk_transpose_run(const mk_instr& in, const mk_tensor* op,
                                                 const mk_pages& pages)
{
    if (pages.preloaded)   /* the loader copied a whole tile in (mk_transpose_preload) */
        mk_transpose_paged(in, pages.base, pages.idx, pages.preloaded);
    else
        mk_transpose_body(in, op);
}

/* A tensor's ready word (instr.h): from the copy of the table's head where the tensor is in it
 * (the loader's own shared memory), else one global read. */
__device__ __forceinline__ mk_u32 mk_transpose_ready(const mk_control& ctl, mk_u32 tensor)
{
    return tensor < ctl.ready_head_n ? ctl.ready_head[tensor]
                                     : mk_ld_relaxed(mk_tmap_ready(ctl.params) + tensor);
}

/* The loader's share (megakernel.cu, MK_FOR_EACH_OP's preload column): one stage, the whole
 * tile, where a record covers a whole tile of an fp32 A and OUT whose tensor maps are both in
 * the table (ready word MK_TRANSPOSE_READY: runtime/tensor_maps.py encodes it for every
 * transpose's A and OUT that TMA can describe); 0 elsewhere (the op loads from global memory
 * and stores there itself). */
__device__ __forceinline__ mk_u32 mk_transpose_preload_stages(const mk_instr& in,
                                                              const mk_tensor* op)
{
    if (in.rows != MK_TRANSPOSE_TILE || in.cols != MK_TRANSPOSE_TILE ||
        op[MK_ARG_A].dtype != MK_DTYPE_F32 || op[MK_ARG_OUT].dtype != MK_DTYPE_F32 ||
        in.pages < MK_TRANSPOSE_PAGES)
        return 0u;
    const mk_control& ctl = mk_ctl();
    return mk_transpose_ready(ctl, in.tensor[MK_ARG_A]) == (mk_u32)MK_TRANSPOSE_READY &&
                   mk_transpose_ready(ctl, in.tensor[MK_ARG_OUT]) == (mk_u32)MK_TRANSPOSE_READY
               ? 1u
               : 0u;
}

/* Whether a page of `pages` (this record's, `n` of them) is one that `prev`, an earlier record
 * still in its slot, held: lane 0 reads both tables, every lane gets the verdict. */
__device__ __forceinline__ bool mk_transpose_reuses(const mk_pages& pages, mk_u32 n,
                                                    const mk_slot& prev, mk_u32 lane)
{
    bool hit = false;
    if (lane == 0)
        for (mk_u32 i = 0; i < n; ++i)
            for (mk_u32 j = 0; j < prev.ins.pages && j < MK_MAX_PAGES; ++j)
                hit |= pages.idx[i] == prev.page[j];
    return __shfl_sync(0xffffffffu, hit ? 1u : 0u, 0) != 0u;
}

/* L6 (the rest of the first stages, after the dependency wait): the tile into the pages, one
 * box of the A map (MK_TRANSPOSE_BOX_COLS A columns) per page, issued by lane 0 and not waited
 * for here (see "Ordering"). Nothing at L4: the whole tile is one stage. q: this record's
 * position in the queue. */
__device__ __forceinline__ mk_u32 mk_transpose_preload(const mk_instr& in, const mk_tensor* op,
                                                       const mk_pages& pages, mk_u32 lane,
                                                       mk_u32 parts, mk_u32 q)
{
    (void)op;
    if (!(parts & MK_PRELOAD_REST))
        return 0u;
    mk_control& ctl = mk_ctl();
    const mk_u32 slot = mk_transpose_slot(in);
    mk_u64* bar = &ctl.transpose_full[slot];
    /* Pages one of the records before held (those still in their slots; q - MK_SLOTS's slot
     * is this one, and L1 waited for its empty phase): the allocator mask's release and acquire
     * already order their reads before these copies, but racecheck follows mbarriers, not the
     * mask, so every lane first waits for that record's empty phase, which every compute
     * thread arrives on after its reads (complete already, or right after the hand-back: the
     * transpose gives its pages back at its end). A loader ahead of the compute warps takes
     * other pages and never waits here. */
    for (mk_u32 k = 1; k < (mk_u32)MK_SLOTS && k <= q; ++k)
        if (mk_transpose_reuses(pages, (mk_u32)MK_TRANSPOSE_PAGES, ctl.slot[mk_slot_of(q - k)],
                                lane))
            mk_transpose_wait(&ctl.empty[mk_slot_of(q - k)], mk_slot_parity(q - k));
    if (lane == 0) {
        if (ctl.transpose_inited & (1u << slot))
            mk_mbar_inval(bar);
        mk_mbar_init(bar, 1u);
        ctl.transpose_inited |= 1u << slot;
        mk_fence_mbar_init();
        mk_mbar_expect_tx(bar, (mk_u32)(MK_TRANSPOSE_TILE * MK_TRANSPOSE_TILE * 4));
        /* generic accesses -> the copies, per state space: the full fence.proxy.async is a
         * MEMBAR.ALL.GPU in SASS, which waits for every store the SM has in flight (the tile
         * the compute warps are storing) and so would serialise this copy behind it; the
         * .global form is FENCE.VIEW.ASYNC.G alone, the shared::cta form a MEMBAR.ALL.CTA
         * with it */
        asm volatile("fence.proxy.async.global;" : : : "memory");
        asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
        /* A is read once, yet evict-first is slower here: W4 562 us with the normal policy
         * against 583 with evict-first (and 567 with evict-first on the tile's stores too),
         * benchmarks/ANALYSIS.md */
        const mk_u64 policy = mk_policy_evict_normal();
        const void* map = mk_tmaps(ctl.params) + (mk_u64)MK_TMAP_BYTES * in.tensor[MK_ARG_A];
        /* page b: A columns row0 + 32 b .. + 32, rows col0 .. + 128 (S(i, j) above), swizzled */
#pragma unroll
        for (mk_u32 b = 0; b < (mk_u32)MK_TRANSPOSE_PAGES; ++b)
            mk_tma_load_2d(mk_smem_addr(pages[b]), map,
                           in.row0 + (int)(b * MK_TRANSPOSE_BOX_COLS), in.col0, bar, policy);
    }
    return 0u;   /* tensor copies only: the loader's L7 does not wait for them */
}

/* When the loader leaves (its queue done, or stopped): every tile it issued in this invocation
 * has landed (bounded), as the compute warps wait only for the tiles of records they run. A
 * barrier whose tile was consumed has its phase 0 complete: no wait. */
__device__ __forceinline__ void mk_transpose_preload_drain(mk_u32 lane)
{
    (void)lane;
    mk_control& ctl = mk_ctl();
    for (mk_u32 i = 0; i < (mk_u32)MK_SLOTS; ++i)
        if (ctl.transpose_inited & (1u << i))
            mk_transpose_wait(&ctl.transpose_full[i]);
}

/* L8: nothing left to produce while the op runs. */
__device__ __forceinline__ mk_u32 mk_transpose_preload_late(const mk_instr& in,
                                                            const mk_tensor* op,
                                                            const mk_pages& pages, mk_u32 lane)
{
    (void)in;
    (void)op;
    (void)pages;
    (void)lane;
    return MK_OK;
}

#endif /* MEGAK_OP_TRANSPOSE_CUH */
