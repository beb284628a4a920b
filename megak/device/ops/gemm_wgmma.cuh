/* MK_OP_GEMM with MK_FLAG_WGMMA: a bf16 GEMM tile on Hopper's warpgroup MMA.
 *
 *   out[m, n] = act(sum_{k in [k0, k0 + klen)} A[m, k] B[k, n] + bias[0, n]) + residual[m, n]
 *   for one region of rows <= 128 and cols <= 256 (gemm.cuh has the contract); fp32 accumulate.
 *
 * Shape (fitted to the pages): a 128 x 256 output tile, k-blocks of MK_WGMMA_BK = 64, a ring of
 * MK_WGMMA_STAGES = 4 stages of 3 pages = the op's 12 pages:
 *
 *   stage page 0   A box: 128 rows x 64 k (K-major), one TMA copy from A's map (box rows 128)
 *         page 1   B boxes 0, 1: 64 k x 64 columns each (N-major), columns 0..127 of the tile
 *         page 2   B boxes 2, 3: columns 128..255 (B's map has box rows MK_WGMMA_B_BOX_ROWS)
 *
 *   warpgroup w (warps 4w .. 4w+3) owns tile rows 64 w .. 64 w + 63 (128 fp32 accumulators
 *   per thread): per k16 step one wgmma.mma_async m64n256k16 when every stage's two B pages
 *   are neighbours in shared memory (the allocator hands out the lowest free pages, so they
 *   usually are), else two m64n128k16, one per B page (same accumulator layout: columns
 *   0..127 in registers 0..63). A descriptor never spans two pages that are not adjacent.
 *
 * The copies are issued by the loader warp (lane 0): the barriers and the first min(4, nk)
 * stages at its step L6, the rest at L8, stage kb as soon as every compute warp released
 * stage kb - 4 (mk_gemm_wgmma_preload*, at the end of this file), so that no compute warp
 * stops its warpgroup's MMAs to issue copies. In the separate-launch entry (no loader) the
 * op's thread 0 issues them, two k-blocks behind the MMAs (mk_pages.preloaded == 0).
 *
 * The body is a function of its own like the other GEMM bodies (its registers do not depend
 * on the interpreter around it), so ptxas serialises its wgmma (warning C7510: each waits for
 * the one before). tools/probe_wgmma_gemm.py measured what that costs: 8192^3 770 -> 700
 * TFLOP/s with n256 (n128 x 2: 765 -> 667), against cuBLAS 807. Inlining the k loop into the
 * general kernel's entry avoids it, but then every op body below mk_compute spills
 * (ANALYSIS.md). The MK_WGMMA_ONLY build (pages.cuh) inlines it into a kernel with no other
 * op, and there the ring is chained across the queue (below).
 *
 * Narrow tiles (the lowering's 128 x 128, for GEMMs of few tiles, and any tile of <= 128
 * columns) are the same records; the MK_WGMMA_ONLY=2 build (pages.cuh, MK_WGMMA_NARROW) copies
 * only B's first two boxes per stage and issues one m64n128k16 per k16 step on page 1.
 *
 * After the k loop an epilogue of at most a bias stores straight from the accumulators (the
 * pages already handed back); any other goes through the first 8 pages as two 128 x 128
 * fp32 staging tiles (gemm_epilogue.cuh's layout) and the shared epilogue: bias,
 * activation, residual and the output dtype exactly as the other GEMM paths apply them.
 *
 * Tensor maps: A's and B's come with the tensor table (runtime/tensor_maps.py); ready[slot]
 * says which box each was encoded with. A record whose maps are missing (a tensor TMA cannot
 * describe: base or row stride not 16-B aligned), or whose k range ends inside a k-block short
 * of A's end (the box would read past it), fills its stages with the threads' own loads
 * instead (mk_wgmma_fill_generic): same results, slower.
 *
 * Shared-memory matrix descriptors (PTX ISA, "Matrix Descriptor Format"): start address >> 4
 * in bits 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle
 * mode in 62-63 (1 = 128 B). The TMA's 128-B swizzle writes box row r (128 B) at byte 128 r
 * with 16-B chunk c at chunk c ^ (r & 7): a swizzle atom is 8 rows x 128 B, 1 KiB aligned
 * (pages are MK_PAGE_ALIGN = 1024 aligned).
 *   A (K-major): atoms stacked along M every 1 KiB, SBO = 1024 (LBO unused, 16); warpgroup w's
 *     rows start 8 KiB w in; k16 step kk starts 32 kk bytes into the atom row.
 *   B (N-major, "transposed" to wgmma: imm-trans-b 1): an atom is 64 columns x 8 k-rows;
 *     atoms along N are the page's two boxes, LBO = 8192; along K every 1 KiB, SBO = 1024;
 *     k16 step kk starts 16 rows = 2048 kk bytes in.
 *
 * Ordering (what orders what):
 *   - barriers: the issuer invalidates (if they were in use) and initialises full[4] (1
 *     arrival + the stage's bytes) and empty[4] (8 arrivals: lane 0 of each compute warp)
 *     for each instruction, then fence.mbarrier_init (the copy engine completes tx on them),
 *     before the slot is handed over (the loader's full[q] arrive, or the compute barrier
 *     without a loader), so no thread waits on them first. The loader initialises them only
 *     once it holds this instruction's 12 pages: the instruction before gave its pages back
 *     after its compute barrier, i.e. after its last wait, arrival and consumed copy.
 *   - generic writes -> copies: the pages were written with generic stores before (another
 *     op, a staged epilogue); those writes precede the issuer's fence.proxy.async (the
 *     compute barrier and the allocator's release/acquire order them before the loader took
 *     the pages). The same fence covers global memory: A may be another SM's output, made
 *     visible to the loader by its acquire of the counter, so the copies read it after.
 *   - copy -> wgmma: the issuer's arrive.expect_tx + the copies' complete_tx on full[slot];
 *     a thread whose try_wait sees phase kb / 4 complete sees the bytes; wgmma reads shared
 *     memory through the async proxy, as the copy wrote it.
 *   - wgmma -> next copy into the slot (write after read): wgmma.wait_group 1 after stage
 *     kb's commit retires stage kb - 1 (its shared-memory reads are done); then each warp's
 *     lane 0 arrives on empty[slot(kb - 1)]; the issuer's try_wait of that phase (acquire)
 *     precedes the copy of stage kb + 3 into the slot.
 *   - wgmma.fence before each stage's MMAs orders the warpgroup's earlier accumulator
 *     accesses (the zero-init) before them; wait_group 0 + an empty asm pinning the
 *     accumulators before the epilogue reads them.
 *   - pages back: a compute barrier after the k loop (both warpgroups' MMAs done reading
 *     every page, every copy consumed), then either the staging stores or, for an epilogue
 *     of at most a bias, pages.release of all 12 before the stores from registers.
 * The chained ring (MK_WGMMA_ONLY; megakernel.cu mk_loader_ring_pages): one ring for the
 * queue, the same argument per ring position instead of per k-block. Record t's stage kb is
 * position P_t + kb (P_t = the stages of the records before it), slot pos % 4, full phase
 * pos / 4. The barriers are initialised once, at the queue's first L6, before its hand-over;
 * the pages are taken at the first L3 and given back by thread 0 after the queue's last
 * compute barrier (every issued position was waited for on full: no copy in flight, no MMA
 * reading). Write after read across records: the warps arrive on empty for every position,
 * a record's last one included (after wait_group 0), and the loader issues position pos >= 4
 * only after empty[pos % 4] completed phase pos / 4 - 1, whichever record read it. No generic
 * write touches the ring's pages (register epilogues only), so no proxy fence is needed for
 * them; fence.proxy.async still runs at every record's L6, after its dependency wait, for
 * A in global memory. A split-K reduce between two tiles of the queue (the variant's one
 * other record) takes no page and no position: the ring stands still across it, its
 * barriers' phases where the tile before left them.
 * Every wait has a deadline (mk_patience of the params' timeout). A consumer that passes it
 * raises ctl.stream_error (the interpreter stops the block with MK_ERR_TIMEOUT after the
 * op); an issuer that passes one stops (the loader with MK_ERR_TIMEOUT) after waiting,
 * bounded, for the copies it issued.
 * megak/runtime/wgmma_model.py states this protocol in Python and catches its misuses.
 */
#ifndef MEGAK_OP_GEMM_WGMMA_CUH
#define MEGAK_OP_GEMM_WGMMA_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../stream.cuh"
#include "gemm_epilogue.cuh"

enum {
    MK_WGMMA_STAGE_BYTES = 3 * MK_PAGE_BYTES,
    MK_WGMMA_B_BOX_BYTES = MK_WGMMA_B_BOX_ROWS * MK_STREAM_BOX_COLS * 2
};
static_assert(MK_WGMMA_TILE_M * MK_WGMMA_BK * 2 == MK_PAGE_BYTES, "A's box fills one page");
static_assert(MK_WGMMA_BK == MK_STREAM_BOX_COLS, "A's box is the stream map's (64 k wide)");
static_assert(MK_WGMMA_BK == MK_WGMMA_B_BOX_ROWS, "B's box is one k-block deep");
static_assert(2 * MK_WGMMA_B_BOX_BYTES == MK_PAGE_BYTES, "two B boxes per page");
static_assert(MK_WGMMA_TILE_N == 4 * MK_STREAM_BOX_COLS, "four B boxes per stage");
static_assert(MK_WGMMA_PAGES <= MK_MAX_PAGES && MK_WGMMA_STAGES <= 4, "ring in mk_control");
static_assert(MK_THREADS == 256, "two consumer warpgroups");
static_assert(2 * MK_GEMM_PAGES <= MK_WGMMA_PAGES, "two staging tiles of 4 pages");

/* Record-only limits of a wgmma tile (gemm.cuh's mk_gemm_check calls this). */
__device__ __forceinline__ bool mk_gemm_wgmma_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 >= 0 && in.out_row0 >= 0 && in.k0 >= 0 && in.rows >= 0 &&
           in.cols >= 0 && in.klen >= 0 && in.rows <= MK_WGMMA_TILE_M &&
           in.cols <= MK_WGMMA_TILE_N && mk_epilogue_check(in);
}

/* Whether the TMA path can run this record: both maps in the table with the boxes this op
 * reads, and a k range that ends on a k-block boundary or at A's (and B's) end, where the
 * boxes' zero fill stands for the missing k. */
__device__ __forceinline__ bool mk_gemm_wgmma_tma_ok(const mk_instr& in, const mk_tensor* op,
                                                     const mk_params& p)
{
    const mk_u32* ready = mk_tmap_ready(p);
    const mk_u32 end = (mk_u32)(in.k0 + in.klen);
    return mk_ld_relaxed(ready + in.tensor[MK_ARG_A]) == (mk_u32)MK_STREAM_BOX_ROWS &&
           mk_ld_relaxed(ready + in.tensor[MK_ARG_B]) == (mk_u32)MK_WGMMA_B_BOX_ROWS &&
           (in.klen % MK_WGMMA_BK == 0 || (end == op[MK_ARG_A].cols && end == op[MK_ARG_B].rows));
}

/* ---- wgmma ---------------------------------------------------------------------------- */
__device__ __forceinline__ mk_u64 mk_wgmma_desc(mk_u32 addr, mk_u32 lbo, mk_u32 sbo)
{
    return (mk_u64)((addr & 0x3FFFFu) >> 4) | ((mk_u64)((lbo >> 4) & 0x3FFFu) << 16) |
           ((mk_u64)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void mk_wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;" : : : "memory");
}

__device__ __forceinline__ void mk_wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;" : : : "memory");
}

template <int N>
__device__ __forceinline__ void mk_wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" : : "n"(N) : "memory");
}

/* Accumulators in use per thread: the narrow build's tiles have columns 0..127 only, in
 * registers 0..63 (the n128 MMA on the first B page); the others stay 0 and are never stored,
 * so ptxas keeps no register for them. */
enum { MK_WGMMA_ACC = MK_WGMMA_NARROW ? 64 : 128 };

/* No read or write of the accumulators moves across this point (the wait names no register). */
__device__ __forceinline__ void mk_wgmma_pin(float (&d)[128])
{
#pragma unroll
    for (int i = 0; i < MK_WGMMA_ACC; ++i)
        asm volatile("" : "+f"(d[i]) : : "memory");
}

/* The accumulator operands of an MMA's inline asm: 8 and 64 consecutive registers of d from o. */
#define MK_WGMMA_D8(d, o) "+f"(d[(o) + 0]), "+f"(d[(o) + 1]), "+f"(d[(o) + 2]), "+f"(d[(o) + 3]), \
                          "+f"(d[(o) + 4]), "+f"(d[(o) + 5]), "+f"(d[(o) + 6]), "+f"(d[(o) + 7])
#define MK_WGMMA_D64(d, o) MK_WGMMA_D8(d, (o) + 0), MK_WGMMA_D8(d, (o) + 8),              \
                           MK_WGMMA_D8(d, (o) + 16), MK_WGMMA_D8(d, (o) + 24),            \
                           MK_WGMMA_D8(d, (o) + 32), MK_WGMMA_D8(d, (o) + 40),            \
                           MK_WGMMA_D8(d, (o) + 48), MK_WGMMA_D8(d, (o) + 56)

/* D (64 x 256 fp32, this warpgroup) (+)= A (64 x 16, K-major) B (16 x 256, N-major);
 * accumulate 0: D = A B. */
__device__ __forceinline__ void mk_wgmma_m64n256k16(float (&d)[128], mk_u64 da, mk_u64 db,
                                                    mk_u32 accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                 " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                 " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                 " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
                 " %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
                 " %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
                 " %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
                 " %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
                 : MK_WGMMA_D64(d, 0), MK_WGMMA_D64(d, 64)
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* Columns 128 H .. 128 H + 127 of the same tile: D = registers 64 H .. 64 H + 63. */
template <int H>
__device__ __forceinline__ void mk_wgmma_m64n128k16(float (&d)[128], mk_u64 da, mk_u64 db,
                                                    mk_u32 accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                 " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                 " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                 " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 1;\n}\n"
                 : MK_WGMMA_D64(d, 64 * H)
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* ---- the issuer (loader lane 0; compute thread 0 where there is no loader) ------------- */
__device__ __forceinline__ void mk_wgmma_tma(mk_u32 dst, const void* map, int c0, int r0, mk_u64* bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];"
                 : : "r"(dst), "l"(map), "r"(c0), "r"(r0), "r"(mk_smem_addr(bar)) : "memory");
}

/* Stage kb of the tile, ring position pos (kb, or P + kb in the chained ring), into ring slot
 * pos % 4: A's box and B's four (the narrow build: B's first two, its tiles' 128 columns). */
__device__ __forceinline__ void mk_wgmma_issue(const mk_instr& in, const unsigned char* maps,
                                            unsigned char* base, const mk_u8* idx, mk_u32 kb,
                                            mk_u32 pos)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 slot = pos % MK_WGMMA_STAGES;
    mk_u64* bar = &ctl.wgmma_full[slot];
    const void* map_a = maps + (mk_u64)MK_TMAP_BYTES * in.tensor[MK_ARG_A];
    const void* map_b = maps + (mk_u64)MK_TMAP_BYTES * in.tensor[MK_ARG_B];
    const int k = in.k0 + (int)(kb * MK_WGMMA_BK);
    const mk_u32 a = mk_smem_addr(base + (mk_u32)idx[3 * slot] * (mk_u32)MK_PAGE_BYTES);
    const mk_u32 boxes = MK_WGMMA_NARROW ? 2u : 4u;
    mk_mbar_expect_tx(bar, (mk_u32)MK_PAGE_BYTES + boxes * (mk_u32)MK_WGMMA_B_BOX_BYTES);
    mk_wgmma_tma(a, map_a, k, in.row0, bar);
#pragma unroll
    for (mk_u32 j = 0; j < boxes; ++j) {
        const mk_u32 b = mk_smem_addr(base + (mk_u32)idx[3 * slot + 1 + j / 2] * (mk_u32)MK_PAGE_BYTES)
                         + (j & 1u) * (mk_u32)MK_WGMMA_B_BOX_BYTES;
        mk_wgmma_tma(b, map_b, in.col0 + (int)(j * MK_STREAM_BOX_COLS), k, bar);
    }
}

/* The issuer's start: fresh barriers, the proxy fence, the first min(4, nk) stages. */
__device__ __forceinline__ void mk_wgmma_begin(const mk_instr& in, unsigned char* base,
                                            const mk_u8* idx, mk_u32 nk)
{
    mk_control& ctl = mk_ctl();
    for (mk_u32 i = 0; i < MK_WGMMA_STAGES; ++i) {
        if (ctl.wgmma_inited) {
            mk_mbar_inval(&ctl.wgmma_full[i]);
            mk_mbar_inval(&ctl.wgmma_empty[i]);
        }
        mk_mbar_init(&ctl.wgmma_full[i], 1u);
        mk_mbar_init(&ctl.wgmma_empty[i], MK_THREADS / 32);
    }
    ctl.wgmma_inited = 1u;
    mk_fence_mbar_init();
    asm volatile("fence.proxy.async;" : : : "memory");   /* generic writes -> copies (header) */
    const unsigned char* maps = mk_tmaps(ctl.params);
    for (mk_u32 kb = 0; kb < nk && kb < MK_WGMMA_STAGES; ++kb)
        mk_wgmma_issue(in, maps, base, idx, kb, kb);
}

/* The chained ring's L6 (MK_WGMMA_ONLY): the barriers once, for the queue's first
 * instruction (shared memory is fresh at launch: nothing to invalidate), then the proxy fence
 * every instruction (its A may be another SM's generic stores, ordered before this by the
 * dependency wait). */
__device__ __forceinline__ void mk_wgmma_chain_begin()
{
    mk_control& ctl = mk_ctl();
    if (!ctl.wgmma_inited) {
        for (mk_u32 i = 0; i < MK_WGMMA_STAGES; ++i) {
            mk_mbar_init(&ctl.wgmma_full[i], 1u);
            mk_mbar_init(&ctl.wgmma_empty[i], MK_THREADS / 32);
        }
        ctl.wgmma_inited = 1u;
        mk_fence_mbar_init();
    }
    asm volatile("fence.proxy.async;" : : : "memory");
}

/* The issuer, after a consumer passed a deadline: the copies it issued land before the pages
 * go back (bounded: a copy the engine never completes is the only way past it). */
__device__ __forceinline__ void mk_wgmma_drain(mk_u32 issued)
{
    mk_control& ctl = mk_ctl();
    const mk_u64 deadline = mk_deadline(mk_patience(ctl.params.timeout_ns));
    for (mk_u32 i = issued > MK_WGMMA_STAGES ? issued - MK_WGMMA_STAGES : 0u; i < issued; ++i)
        while (!mk_mbar_try_wait(&ctl.wgmma_full[i % MK_WGMMA_STAGES],
                                 (i / MK_WGMMA_STAGES) & 1u) &&
               mk_globaltimer() <= deadline) {
        }
}

/* Bounded wait on a ring barrier; false past the deadline. */
__device__ __forceinline__ bool mk_wgmma_wait_bar(mk_u64* bar, mk_u32 parity, mk_u64 patience)
{
    if (mk_mbar_try_wait(bar, parity))
        return true;
    const mk_u64 deadline = mk_deadline(patience);
    while (!mk_mbar_try_wait(bar, parity))
        if (mk_globaltimer() > deadline)
            return false;
    return true;
}

/* ---- after the k loop --------------------------------------------------------------- */

/* The two 128-column halves of the staged tile through the shared epilogue. */
__device__ __forceinline__ void mk_gemm_wgmma_epilogue(const mk_instr& in, const mk_tensor* op,
                                                    unsigned char* base, const mk_u8* idx)
{
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
        mk_instr half = in;
        half.col0 = in.col0 + h * MK_GEMM_TILE_N;
        half.cols = min(in.cols - h * MK_GEMM_TILE_N, (int)MK_GEMM_TILE_N);
        if (half.cols <= 0)
            break;
        const mk_pages pages = {base, idx + h * MK_GEMM_PAGES};
        mk_gemm_epilogue_at(half, op, pages, in.out_row0);
    }
}

/* ---- the op: all compute threads ------------------------------------------------------ */

/* Whether every stage's two B pages are neighbours (one n256 descriptor spans both). */
__device__ __forceinline__ bool mk_wgmma_b_pages_adjacent(const mk_u8* idx)
{
    bool adjacent = true;
#pragma unroll
    for (int st = 0; st < MK_WGMMA_STAGES; ++st)
        adjacent &= idx[3 * st + 2] == idx[3 * st + 1] + 1;
    return adjacent;
}

/* The k loop: stage kb at ring position p0 + kb (p0 = 0 but in the chained ring), slot
 * (p0 + kb) % 4; N256 picks the instruction shape (header). Returns false when a wait passed
 * its deadline (the accumulators are then garbage). `issued` is thread 0's count of stages
 * issued. In the chained ring every stage is released on its empty barrier, the last one
 * too: the next instruction's stages refill the slots. */
template <bool N256>
__device__ __forceinline__ bool mk_wgmma_k_loop(const mk_instr& in, const mk_pages& pages,
                                                float (&d)[128], mk_u32 nk, mk_u32& issued,
                                                bool self_issue, mk_u32 p0)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 tid = threadIdx.x, wg = tid >> 7, lane = tid & 31u;
    const mk_u64 patience = mk_patience(ctl.params.timeout_ns);
    const mk_u32 page0 = mk_smem_addr(pages.base);
#pragma unroll 1
    for (mk_u32 kb = 0; kb < nk; ++kb) {
        const mk_u32 pos = p0 + kb, slot = pos % MK_WGMMA_STAGES;
        if (!__all_sync(0xffffffffu, mk_wgmma_wait_bar(&ctl.wgmma_full[slot],
                                                         (pos / MK_WGMMA_STAGES) & 1u, patience)))
            return false;
        if (kb == 0)
            mk_trace_mark(MK_T_LOADED);
        /* without a loader (the separate-launch entry) thread 0 issues: it refills the slot
         * of stage kb - 2 with k-block kb + 2 (every warp arrived on its empty barrier an
         * iteration ago, so the wait is (almost) never a stall) */
        if (self_issue && tid == 0 && kb >= 2 && issued < nk) {
            const mk_u32 done = (kb - 2) % MK_WGMMA_STAGES;
            if (mk_wgmma_wait_bar(&ctl.wgmma_empty[done], ((kb - 2) / MK_WGMMA_STAGES) & 1u,
                                  patience))
            {
                mk_wgmma_issue(in, mk_tmaps(ctl.params), pages.base, pages.idx, issued, issued);
                ++issued;
            }
            else
                atomicExch(&ctl.stream_error, 1u);   /* the consumers will time out too */
        }
        const mk_u32 a = page0 + (mk_u32)pages.idx[3 * slot] * (mk_u32)MK_PAGE_BYTES;
        const mk_u32 b0 = page0 + (mk_u32)pages.idx[3 * slot + 1] * (mk_u32)MK_PAGE_BYTES;
        const mk_u32 b1 = page0 + (mk_u32)pages.idx[3 * slot + 2] * (mk_u32)MK_PAGE_BYTES;
        const mk_u64 da = mk_wgmma_desc(a + 8192u * wg, 16u, 1024u);
        const mk_u64 db0 = mk_wgmma_desc(b0, 8192u, 1024u);
        const mk_u64 db1 = mk_wgmma_desc(b1, 8192u, 1024u);
        mk_wgmma_fence();
#pragma unroll
        for (mk_u32 kk = 0; kk < 4; ++kk) {   /* +1 in a descriptor = +16 B of start address */
            if (MK_WGMMA_NARROW) {
                mk_wgmma_m64n128k16<0>(d, da + 2u * kk, db0 + 128u * kk, (kb | kk) != 0u);
            } else if (N256) {
                mk_wgmma_m64n256k16(d, da + 2u * kk, db0 + 128u * kk, (kb | kk) != 0u);
            } else {
                mk_wgmma_m64n128k16<0>(d, da + 2u * kk, db0 + 128u * kk, (kb | kk) != 0u);
                mk_wgmma_m64n128k16<1>(d, da + 2u * kk, db1 + 128u * kk, (kb | kk) != 0u);
            }
        }
        mk_wgmma_commit();
        if (kb > 0) {   /* stage kb - 1 retired: its slot may be refilled */
            mk_wgmma_wait<1>();
            if (lane == 0)
                mk_mbar_arrive(&ctl.wgmma_empty[(pos - 1) % MK_WGMMA_STAGES]);
        }
    }
    mk_wgmma_wait<0>();
    if (MK_WGMMA_ONLY && nk > 0 && lane == 0)   /* the chained ring: the last stage too */
        mk_mbar_arrive(&ctl.wgmma_empty[(p0 + nk - 1) % MK_WGMMA_STAGES]);
    mk_wgmma_pin(d);
    mk_trace_mark(MK_T_COMPUTED);
    return true;
}

/* ---- without tensor maps ------------------------------------------------------------------
 * A record whose maps are missing (a tensor TMA cannot describe: base or row stride not
 * 16-B aligned), or whose k range ends inside a k-block short of A's end (a box would read
 * k past it), fills its stages with the compute threads' own loads, one element at a time
 * with bounds checks, into the layout the TMA would have written (the 128-B swizzle), stage
 * by stage in ring slot 0: slow, and the same results. Generic stores then wgmma's async-proxy
 * reads: each thread's fence.proxy.async after its stores, then the compute barrier. */
__device__ __forceinline__ void mk_wgmma_fill_generic(const mk_instr& in, const mk_tensor* op,
                                                      const mk_pages& pages, mk_u32 kb)
{
    const mk_tensor& TA = op[MK_ARG_A];
    const mk_tensor& TB = op[MK_ARG_B];
    const int k_end = in.k0 + in.klen, kb0 = in.k0 + (int)(kb * MK_WGMMA_BK);
    const mk_u16* ga = reinterpret_cast<const mk_u16*>(TA.ptr);
    const mk_u16* gb = reinterpret_cast<const mk_u16*>(TB.ptr);
    unsigned char* pa = reinterpret_cast<unsigned char*>(pages[0]);
    /* A: 128 rows x 64 k; element (r, k) at byte 128 r + 16 ((k / 8) ^ (r & 7)) + 2 (k % 8) */
    for (int e = (int)threadIdx.x; e < MK_WGMMA_TILE_M * MK_WGMMA_BK; e += MK_THREADS) {
        const int r = e / MK_WGMMA_BK, k = e % MK_WGMMA_BK;
        const int gr = in.row0 + r, gk = kb0 + k;
        mk_u16 v = 0;
        if (gr < (int)TA.rows && gk < k_end)
            v = ga[(mk_u64)gr * TA.ld + gk];
        *reinterpret_cast<mk_u16*>(pa + 128 * r + 16 * ((k >> 3) ^ (r & 7)) + 2 * (k & 7)) = v;
    }
    /* B: 64 k-rows x 256 columns in 4 boxes of 64; box j in page 1 + j / 2 at 8 KiB (j % 2) */
    for (int e = (int)threadIdx.x; e < MK_WGMMA_BK * MK_WGMMA_TILE_N; e += MK_THREADS) {
        const int k = e / MK_WGMMA_TILE_N, n = e % MK_WGMMA_TILE_N;
        const int j = n >> 6, c = n & 63;
        const int gk = kb0 + k, gn = in.col0 + n;
        mk_u16 v = 0;
        if (gk < k_end && gn < (int)TB.cols)
            v = gb[(mk_u64)gk * TB.ld + gn];
        unsigned char* pb = reinterpret_cast<unsigned char*>(pages[1 + (j >> 1)]) +
                            MK_WGMMA_B_BOX_BYTES * (j & 1);
        *reinterpret_cast<mk_u16*>(pb + 128 * k + 16 * ((c >> 3) ^ (k & 7)) + 2 * (c & 7)) = v;
    }
    asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
}

/* The k loop without maps: fill slot 0, barrier, MMAs, wait for them, barrier (the next fill
 * overwrites the slot). Always two n128 MMAs (the B pages need not be neighbours). */
__device__ __forceinline__ void mk_wgmma_k_loop_generic(const mk_instr& in, const mk_tensor* op,
                                                        const mk_pages& pages, float (&d)[128],
                                                        mk_u32 nk)
{
    const mk_u32 wg = threadIdx.x >> 7;
    const mk_u32 page0 = mk_smem_addr(pages.base);
    const mk_u32 a = page0 + (mk_u32)pages.idx[0] * (mk_u32)MK_PAGE_BYTES;
    const mk_u32 b0 = page0 + (mk_u32)pages.idx[1] * (mk_u32)MK_PAGE_BYTES;
    const mk_u32 b1 = page0 + (mk_u32)pages.idx[2] * (mk_u32)MK_PAGE_BYTES;
    const mk_u64 da = mk_wgmma_desc(a + 8192u * wg, 16u, 1024u);
    const mk_u64 db0 = mk_wgmma_desc(b0, 8192u, 1024u);
    const mk_u64 db1 = mk_wgmma_desc(b1, 8192u, 1024u);
#pragma unroll 1
    for (mk_u32 kb = 0; kb < nk; ++kb) {
        mk_wgmma_fill_generic(in, op, pages, kb);
        mk_compute_sync();
        mk_wgmma_fence();
#pragma unroll
        for (mk_u32 kk = 0; kk < 4; ++kk) {
            mk_wgmma_m64n128k16<0>(d, da + 2u * kk, db0 + 128u * kk, (kb | kk) != 0u);
            mk_wgmma_m64n128k16<1>(d, da + 2u * kk, db1 + 128u * kk, (kb | kk) != 0u);
        }
        mk_wgmma_commit();
        mk_wgmma_wait<0>();
        mk_compute_sync();
    }
    mk_wgmma_pin(d);
}

/* ---- the epilogue from registers ------------------------------------------------------
 * A record whose epilogue is at most a bias (no activation, no residual: the plain layers and
 * every split-K partial) stores straight from the accumulators: each thread's fragment is 2
 * columns x 2 rows per 8-column step (rows r, r + 8 of its warp's 16, columns 8 j + 2 (lane %
 * 4) + 0, 1), written as one 4-byte (bf16) or 8-byte (fp32) store per row where aligned. The
 * pages are then free before the epilogue: the op hands all 12 back right after its k loop
 * (page plan WGMMA_REGISTER_PLAN), so the next tile's loader takes them and its copies are in
 * flight while this tile stores. Other epilogues go through the staging tiles (below). */
__device__ __forceinline__ bool mk_wgmma_register_epilogue(const mk_instr& in)
{
    return (in.flags & (MK_FLAG_ACT_MASK | MK_FLAG_RESIDUAL)) == 0u;
}

/* Stores that happen only where `on`: predicated PTX stores, not branches. The register
 * epilogue reads every accumulator on every path and leaves the choices to the predicates,
 * since a read of them in a branch ptxas cannot prove uniform serialises the MMAs (C7518,
 * pages.cuh). */
__device__ __forceinline__ void mk_st_u32_if(bool on, mk_u64 p, mk_u32 v)
{
    asm volatile("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q st.global.u32 [%0], %1; }"
                 : : "l"(p), "r"(v), "r"((mk_u32)on) : "memory");
}

__device__ __forceinline__ void mk_st_u16_if(bool on, mk_u64 p, mk_u16 v)
{
    asm volatile("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q st.global.u16 [%0], %1; }"
                 : : "l"(p), "h"(v), "r"((mk_u32)on) : "memory");
}

__device__ __forceinline__ void mk_st_f32_if(bool on, mk_u64 p, float v)
{
    asm volatile("{ .reg .pred q; setp.ne.u32 q, %2, 0; @q st.global.f32 [%0], %1; }"
                 : : "l"(p), "f"(v), "r"((mk_u32)on) : "memory");
}

__device__ __forceinline__ void mk_st_f32x2_if(bool on, mk_u64 p, float v0, float v1)
{
    asm volatile("{ .reg .pred q; setp.ne.u32 q, %3, 0; @q st.global.v2.f32 [%0], {%1, %2}; }"
                 : : "l"(p), "f"(v0), "f"(v1), "r"((mk_u32)on) : "memory");
}

/* Elements off and off + 1 of `t` (row-major offsets), the second only where n >= 2, neither
 * where !row_ok or n <= 0: one 4- or 8-byte store where aligned, else one per element. */
__device__ __forceinline__ void mk_wgmma_st2(const mk_tensor& t, mk_u64 off, float v0, float v1,
                                             int n, bool row_ok)
{
    const bool bf16 = t.dtype == MK_DTYPE_BF16;
    const mk_u64 p = t.ptr + off * (bf16 ? 2u : 4u);
    const bool one = row_ok & (n >= 1), two = row_ok & (n >= 2);
    const bool pair = two & ((p & (bf16 ? 3u : 7u)) == 0u);
    mk_st_u32_if(bf16 & pair, p, mk_pack_bf16x2(v0, v1));
    mk_st_u16_if(bf16 & one & !pair, p, mk_to_bf16(v0));
    mk_st_u16_if(bf16 & two & !pair, p + 2u, mk_to_bf16(v1));
    mk_st_f32x2_if(!bf16 & pair, p, v0, v1);
    mk_st_f32_if(!bf16 & one & !pair, p, v0);
    mk_st_f32_if(!bf16 & two & !pair, p + 4u, v1);
}

__device__ __forceinline__ float mk_wgmma_ld1(const mk_tensor& t, mk_u64 off)
{
    return t.dtype == MK_DTYPE_BF16
               ? mk_bf16_lo(mk_ld_u16(reinterpret_cast<const mk_u16*>(t.ptr) + off))
               : mk_ld_f(reinterpret_cast<const float*>(t.ptr) + off);
}

/* The accumulators + bias straight to the output (no activation, no residual). Fragment:
 * register 4 j + e is row 16 w4 + lane / 4 (+ 8 for e >= 2) of the warpgroup's 64, column
 * 8 j + 2 (lane % 4) + e % 2. Branch-free in the accumulators (mk_st_*_if). */
__device__ __forceinline__ void mk_wgmma_store_registers(const mk_instr& in, const mk_tensor* op,
                                                         float (&d)[128])
{
    const mk_u32 tid = threadIdx.x, wg = tid >> 7, w4 = (tid >> 5) & 3u, lane = tid & 31u;
    const mk_tensor& TO = op[MK_ARG_OUT];
    const mk_tensor& TB = op[MK_ARG_BIAS];
    const bool has_bias = (in.flags & MK_FLAG_BIAS) != 0u;
    const int r_lo = (int)(64u * wg + 16u * w4 + (lane >> 2)), c_in = (int)(2u * (lane & 3u));
    const bool row_lo = r_lo < in.rows, row_hi = r_lo + 8 < in.rows;
    const mk_u64 o_lo = (mk_u64)(in.out_row0 + r_lo) * TO.ld + in.col0;
    const mk_u64 o_hi = o_lo + 8u * (mk_u64)TO.ld;
#pragma unroll
    for (int j = 0; j < MK_WGMMA_ACC / 4; ++j) {
        const int c = 8 * j + c_in, n = in.cols - c;   /* valid columns of this pair */
        float b0 = 0.f, b1 = 0.f;
        if (has_bias && n >= 1) {
            b0 = mk_wgmma_ld1(TB, (mk_u64)in.col0 + c);
            if (n >= 2)
                b1 = mk_wgmma_ld1(TB, (mk_u64)in.col0 + c + 1);
        }
        mk_wgmma_st2(TO, o_lo + c, __fadd_rn(d[4 * j], b0), __fadd_rn(d[4 * j + 1], b1), n,
                     row_lo);
        mk_wgmma_st2(TO, o_hi + c, __fadd_rn(d[4 * j + 2], b0), __fadd_rn(d[4 * j + 3], b1), n,
                     row_hi);
    }
}

/* After the k loop: the accumulators into the staging tiles of pages 0-7 (half h, columns
 * 128 h .., in pages 4 h .. 4 h + 3, 32 rows per page; register 4 j + e of the fragment is row
 * (e >= 2 ? 8 : 0) + this thread's, column 8 j + 2 (lane % 4) + e % 2 of the half), then the
 * shared epilogue. All compute threads, every MMA retired. */
__device__ __forceinline__ void mk_wgmma_store(const mk_instr& in, const mk_tensor* op,
                                               const mk_pages& pages, float (&d)[128])
{
    const mk_u32 tid = threadIdx.x, wg = tid >> 7, w4 = (tid >> 5) & 3u, lane = tid & 31u;
    mk_compute_sync();   /* every warpgroup's MMAs are done reading the pages */
    const int r_lo = (int)(64u * wg + 16u * w4 + (lane >> 2));
    const int c_in = (int)(2u * (lane & 3u));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float* const p_lo = pages[h * MK_GEMM_PAGES + r_lo / MK_GEMM_STAGE_ROWS];
        float* const p_hi = pages[h * MK_GEMM_PAGES + (r_lo + 8) / MK_GEMM_STAGE_ROWS];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int c = 8 * j + c_in, chunk = c >> 2, off = c & 3;
            const float* v = d + 64 * h + 4 * j;
            *reinterpret_cast<float2*>(mk_gemm_stage_at(p_lo, r_lo, chunk) + off) =
                make_float2(v[0], v[1]);
            *reinterpret_cast<float2*>(mk_gemm_stage_at(p_hi, r_lo + 8, chunk) + off) =
                make_float2(v[2], v[3]);
        }
    }
    mk_compute_sync();   /* the staging tiles are complete */
    mk_gemm_wgmma_epilogue(in, op, pages.base, pages.idx);
}

/* The tile without tensor maps (mk_wgmma_k_loop_generic), a function of its own so that its
 * fill loops do not add to the TMA path's registers. */
__device__ __noinline__ void mk_gemm_wgmma_generic(const mk_instr& in, const mk_tensor* op,
                                                   unsigned char* page_base,
                                                   const mk_u8* page_idx)
{
    const mk_pages pages = {page_base, page_idx};
    const mk_u32 nk = ((mk_u32)in.klen + MK_WGMMA_BK - 1) / MK_WGMMA_BK;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i)
        d[i] = 0.f;   /* nk = 0 (K = 0): the epilogue of zeros */
    mk_wgmma_k_loop_generic(in, op, pages, d, nk);
    mk_wgmma_store(in, op, pages, d);
}

/* All 256 compute threads; in.rows, in.cols >= 1. */
__device__ __forceinline__ void mk_gemm_wgmma_run(const mk_instr& in, const mk_tensor* op,
                                                  const mk_pages& pages)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 tid = threadIdx.x, lane = tid & 31u;
#if MK_WGMMA_ONLY
    /* The host runs this variant only where every record has its maps, so the loader
     * produces every stage, and the loader pairs the B pages (mk_wgmma_pair_b_pages): the
     * variant has the n256 k loop only (with the n128 one beside it ptxas runs out of
     * registers for the MMA pipeline, C7511). Anything else is refused, not run slowly. */
    if (pages.preloaded == 0 || !mk_wgmma_b_pages_adjacent(pages.idx)) {
        if (tid == 0)
            ctl.op_stop.error = pages.preloaded == 0 ? MK_ERR_BAD_DESCRIPTOR : MK_ERR_PAGES;
        return;
    }
#else
    if (!mk_gemm_wgmma_tma_ok(in, op, ctl.params)) {
        mk_gemm_wgmma_generic(in, op, pages.base, pages.idx);
        return;
    }
#endif
    const mk_u32 nk = ((mk_u32)in.klen + MK_WGMMA_BK - 1) / MK_WGMMA_BK;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i)
        d[i] = 0.f;   /* nk = 0 (K = 0): the epilogue of zeros */
    /* the loader warp produces the stages (mk_gemm_wgmma_preload*: pages.preloaded > 0); the
     * separate-launch entry has none, and thread 0 issues them */
    const bool self_issue = !MK_WGMMA_ONLY && pages.preloaded == 0;
    mk_u32 issued = min(nk, (mk_u32)MK_WGMMA_STAGES);   /* thread 0's count */
    if (self_issue) {
        if (tid == 0)
            mk_wgmma_begin(in, pages.base, pages.idx, nk);
        mk_compute_sync();   /* barriers initialised before anyone waits */
    }
    /* the chained ring's first position (MK_WGMMA_ONLY: mk_loader_ring_pages), else 0 */
    const mk_u32 p0 = MK_WGMMA_ONLY ? pages.stream_pos : 0u;
    const bool ok = MK_WGMMA_ONLY || mk_wgmma_b_pages_adjacent(pages.idx)
                        ? mk_wgmma_k_loop<true>(in, pages, d, nk, issued, self_issue, p0)
                        : mk_wgmma_k_loop<false>(in, pages, d, nk, issued, self_issue, p0);
    if (!ok) {
        mk_wgmma_wait<0>();   /* no MMA in flight when the pages go back */
        if (lane == 0)
            atomicExch(&ctl.stream_error, 1u);
        if (self_issue && tid == 0)
            mk_wgmma_drain(issued);   /* (the loader drains its own) */
        return;
    }
    /* (MK_WGMMA_ONLY runs register epilogues only: a branch between the two would serialise
     * its MMAs, C7518; mk_validate refuses the others there) */
    if (MK_WGMMA_ONLY || mk_wgmma_register_epilogue(in)) {
        if (!MK_WGMMA_ONLY) {   /* (the chained ring keeps its pages) */
            mk_compute_sync();   /* every warpgroup's MMAs are done reading the pages */
            pages.release(0, MK_WGMMA_PAGES);
        }
        mk_wgmma_store_registers(in, op, d);
        return;
    }
    mk_wgmma_store(in, op, pages, d);
}

/* ---- the loader warp's share (megakernel.cu, L6 and after L7) ----------------------------
 * The loader issues a TMA record's stages, so that no compute thread stops its warpgroup's
 * MMAs to issue copies: at L6 (after the dependency wait, before the slot is handed over)
 * it initialises the barriers and issues the first min(4, nk) stages; after L7 it issues
 * stage kb (kb >= 4) as soon as every warp released stage kb - 4 (empty), then goes on with
 * the next instruction. The barriers are free to initialise at L6: the loader holds this
 * instruction's 12 pages, so every earlier wgmma instruction has given its pages back, after
 * its compute barrier, i.e. after its warps' last barrier operations. */

/* Stages the loader produces for this record: all of them (MK_WGMMA_STAGES as the marker the
 * op reads in mk_pages.preloaded), or 0 where the op loads them itself (no maps). */
__device__ __forceinline__ mk_u32 mk_gemm_wgmma_preload_stages(const mk_instr& in,
                                                               const mk_tensor* op)
{
    return in.rows > 0 && in.cols > 0 && mk_gemm_wgmma_tma_ok(in, op, mk_ctl().params)
               ? (mk_u32)MK_WGMMA_STAGES : 0u;
}

/* Lane 0, before the first copy: the instruction's page table (12 pages, ascending as the
 * allocator took them) rearranged so that each stage's two B pages are neighbours where the
 * pages allow it, and one n256 MMA then spans both (mk_wgmma_b_pages_adjacent). Neighbours
 * are paired from the start of each run of consecutive pages, which gives the most pairs: 12
 * of 13 pages are at most two runs, so there are always 4 (5 or 6). Without 4 pairs the table
 * stays as it was (two n128 MMAs per step). The table is the loader's until L7. */
__device__ __forceinline__ void mk_wgmma_pair_b_pages(mk_u8* table)
{
    mk_u32 pages = 0;   /* physical pages as bits (at most 32 pages) */
    for (mk_u32 i = 0; i < MK_WGMMA_PAGES; ++i)
        pages |= 1u << table[i];
    mk_u32 left = pages, firsts = 0, n = 0;   /* firsts: p for each pair (p, p + 1) */
    while (left != 0u && n < MK_WGMMA_STAGES) {
        const mk_u32 p = (mk_u32)__ffs(left) - 1u;
        if (left & (2u << p)) {
            firsts |= 1u << p;
            left &= ~(3u << p);
            ++n;
        } else {
            left &= ~(1u << p);
        }
    }
    if (n < MK_WGMMA_STAGES)
        return;
    mk_u32 singles = pages & ~(firsts | (firsts << 1));
    for (mk_u32 st = 0; st < MK_WGMMA_STAGES; ++st) {
        const mk_u32 b = (mk_u32)__ffs(firsts) - 1u, a = (mk_u32)__ffs(singles) - 1u;
        firsts &= firsts - 1u;
        singles &= singles - 1u;
        table[3 * st] = (mk_u8)a;
        table[3 * st + 1] = (mk_u8)b;
        table[3 * st + 2] = (mk_u8)(b + 1u);
    }
}

/* L6, lane 0: the B pages paired, fresh barriers, the proxy fence (the loader's dependency
 * wait ordered A's producers' stores before it), the first stages. In the chained ring
 * (MK_WGMMA_ONLY, below) only the proxy fence, and the barriers for the queue's first
 * instruction: the pages were paired when the ring took them, and every stage is issued
 * after L7. */
__device__ __forceinline__ void mk_gemm_wgmma_preload(const mk_instr& in, const mk_pages& pages,
                                                      mk_u32 lane)
{
    if (lane != 0)
        return;
#if MK_WGMMA_ONLY
    (void)in;
    (void)pages;
    mk_wgmma_chain_begin();
#else
    mk_wgmma_pair_b_pages(const_cast<mk_u8*>(pages.idx));   /* the loader's (above) */
    mk_wgmma_begin(in, pages.base, pages.idx, ((mk_u32)in.klen + MK_WGMMA_BK - 1) / MK_WGMMA_BK);
#endif
}

/* After L7, lane 0: stage kb = first .. nk - 1 at ring position p0 + kb, each once its slot
 * is empty (position >= 4: every warp released position - 4). MK_OK, or MK_ERR_TIMEOUT when a
 * slot never came back (the copies issued have landed by then). The per-instruction ring
 * issues the first 4 at L6 (first = 4, p0 = 0); the chained one all of them (first = 0, p0
 * the instruction's first position), and moves the ring on by nk. */
__device__ __noinline__ mk_u32 mk_gemm_wgmma_produce(const mk_instr& in, unsigned char* base,
                                                     const mk_u8* idx)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 nk = ((mk_u32)in.klen + MK_WGMMA_BK - 1) / MK_WGMMA_BK;
    const mk_u64 patience = mk_patience(ctl.params.timeout_ns);
    const unsigned char* maps = mk_tmaps(ctl.params);
#if MK_WGMMA_ONLY
    const mk_u32 first = 0u, p0 = ctl.wgmma_pos;
    ctl.wgmma_pos = p0 + nk;
#else
    const mk_u32 first = MK_WGMMA_STAGES, p0 = 0u;
#endif
    for (mk_u32 kb = first; kb < nk; ++kb) {
        const mk_u32 pos = p0 + kb, slot = pos % MK_WGMMA_STAGES;
        if (pos >= MK_WGMMA_STAGES &&
            !mk_wgmma_wait_bar(&ctl.wgmma_empty[slot], ((pos / MK_WGMMA_STAGES) - 1u) & 1u,
                               patience)) {
            mk_wgmma_drain(pos);
            return MK_ERR_TIMEOUT;
        }
        mk_wgmma_issue(in, maps, base, idx, kb, pos);
    }
    return MK_OK;
}

#endif /* MEGAK_OP_GEMM_WGMMA_CUH */
