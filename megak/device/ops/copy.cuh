/* MK_OP_COPY: out[r, c] = A[r, c] for r in [row0, row0 + rows), c in [col0, col0 + cols).
 * MK_COPY_PAGES pages (a staging ring). Operands: MK_ARG_A, MK_ARG_OUT.
 *
 * Pure bandwidth. Why it is shaped like this:
 *  - The region is walked as one linear index space of (row, column-unit) pairs, thread t
 *    taking units t, t + 256, ...: every warp touches 32 consecutive units (512 contiguous
 *    bytes with float4) whatever the region's width, and every thread gets the same share,
 *    so narrow regions (cols = 4) keep all 256 threads busy and wide ones stay coalesced.
 *    (row, col) advance incrementally: no integer division in the loop.
 *  - Bytes in flight decide HBM bandwidth (Little: ~2.1 TB/s of reads x ~1 us / 132 SMs =
 *    16 KiB of reads per SM at the unloaded latency, several times that as the latency grows
 *    near saturation). Loads into registers cannot keep that many steadily: a batch of U
 *    loads drains to zero before its stores and the next batch (8 float4 per thread: 32 KiB
 *    peak, far less on average, 3.6 TB/s measured). So the float4 body streams through a
 *    per-thread ring of cp.async copies in the instruction's pages:
 *
 *        page p, stage k (4 per page):  [ k*4 KiB + 16 * thread ]   (16 B per thread per stage)
 *
 *    MK_COPY_STAGES = 16 stages, one commit group each; stage s is stored once
 *    cp.async.wait_group<15> says its group landed, and its slot is refilled with stage s + 16
 *    right after. 16 x 16 B x 256 threads = 64 KiB of loads in flight per SM continuously
 *    (8.4 MB over 132 SMs, ~2x HBM's bandwidth-delay product), with no register cost and no
 *    barrier: each thread reads back only its own copies, which wait_group makes visible to it.
 *  - Small bodies (<= one unit per thread) skip the ring: one load, one store, no shared
 *    memory hop, the shortest dependent path (chains of tiny copies).
 *  - Columns split into a scalar head, a float4 body and a scalar tail when A and OUT have the
 *    same 16-byte phase (always the case for megak-owned buffers); otherwise all scalar,
 *    still coalesced, registers only, with U = 16 loads in flight per thread.
 */
#ifndef MEGAK_OP_COPY_CUH
#define MEGAK_OP_COPY_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"

/* MK_COPY_PAGES (instr.h). Operand positions read (prefetched and validated): */
enum {
    MK_COPY_OPERANDS = (1u << MK_ARG_A) | (1u << MK_ARG_OUT),
    MK_COPY_STAGE_BYTES = MK_THREADS * 16,                                /* one float4 each */
    MK_COPY_STAGES_PER_PAGE = MK_PAGE_BYTES / MK_COPY_STAGE_BYTES,
    MK_COPY_STAGES = MK_COPY_PAGES * MK_COPY_STAGES_PER_PAGE
};
static_assert(MK_PAGE_BYTES % MK_COPY_STAGE_BYTES == 0 && MK_COPY_PAGES >= 1,
              "the copy ring needs whole stages per page");

/* Record-only limits, checked before every run. */
__device__ __forceinline__ bool mk_copy_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 >= 0 && in.rows >= 0 && in.cols >= 0;
}

/* Debug mode: the region lies inside both tensors. */
__device__ __forceinline__ bool mk_copy_check_operands(const mk_instr& in, const mk_tensor* op)
{
    return mk_region_ok(op[MK_ARG_A], in.row0, in.rows, in.col0, in.cols) &&
           mk_region_ok(op[MK_ARG_OUT], in.row0, in.rows, in.col0, in.cols);
}

/* Copy a rows x cols rectangle of single floats through registers, U loads in flight per
 * thread: the scalar head and tail columns, and regions whose A and OUT disagree on the 16-B
 * phase. */
template <int U>
__device__ __forceinline__ void mk_copy_rect(const float* src, mk_u32 lds, float* dst,
                                             mk_u32 ldd, int rows, int units)
{
    if (rows <= 0 || units <= 0)
        return;
    const int dr = MK_THREADS / units;   /* how far one 256-unit step moves: rows ... */
    const int dc = MK_THREADS % units;   /* ... and columns */
    int r = (int)threadIdx.x / units;
    int c = (int)threadIdx.x % units;
    while (r < rows) {
        float x[U];
        int rr[U], cc[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            rr[k] = r;
            cc[k] = c;
            if (r < rows)
                x[k] = mk_ld_f(src + (mk_u64)r * lds + (mk_u32)c);
            c += dc;
            r += dr;
            if (c >= units) {
                c -= units;
                ++r;
            }
        }
#pragma unroll
        for (int k = 0; k < U; ++k)
            if (rr[k] < rows)
                mk_st_f(dst + (mk_u64)rr[k] * ldd + (mk_u32)cc[k], x[k]);
    }
}

/* A walker over one thread's units of a rows x units float4 grid (leading dimension ld
 * floats): unit t, t + 256, ... Pointer arithmetic only, no multiply per step. */
struct mk_copy_walk {
    int r, c;
    mk_u64 at;   /* byte address of unit (r, c) */
    __device__ __forceinline__ void next(int dr, int dc, int units, mk_u64 step, mk_u64 wrap)
    {
        c += dc;
        r += dr;
        at += step;
        if (c >= units) {
            c -= units;
            ++r;
            at += wrap;
        }
    }
};

/* The float4 body through the page ring (see the top of the file). src/dst and both leading
 * dimensions 16-B aligned. */
__device__ __forceinline__ void mk_copy_ring(const float* src, mk_u32 lds, float* dst,
                                             mk_u32 ldd, int rows, int units,
                                             const mk_pages& pages)
{
    const int dr = MK_THREADS / units, dc = MK_THREADS % units;
    const int t = (int)threadIdx.x, r = t / units, c = t % units;
    /* per step: dr rows and dc units on; past the row end: one more row, back `units` units */
    const mk_u64 step_s = 4ull * ((mk_u64)dr * lds + 4u * (mk_u32)dc);
    const mk_u64 step_d = 4ull * ((mk_u64)dr * ldd + 4u * (mk_u32)dc);
    const mk_u64 wrap_s = 4ull * ((mk_u64)lds - 4u * (mk_u32)units);   /* ld >= 4 units */
    const mk_u64 wrap_d = 4ull * ((mk_u64)ldd - 4u * (mk_u32)units);
    mk_copy_walk in = {r, c, (mk_u64)(src + (mk_u64)r * lds + 4 * c)};    /* next to load */
    mk_copy_walk out = {r, c, (mk_u64)(dst + (mk_u64)r * ldd + 4 * c)};   /* next to store */
    mk_u32 slot[MK_COPY_PAGES];   /* this thread's 16 B in stage 0 of each page */
#pragma unroll
    for (int p = 0; p < MK_COPY_PAGES; ++p)
        slot[p] = mk_smem_addr(pages[p]) + 16u * (mk_u32)t;

    /* prologue: fill every stage (one commit group per stage, empty past the end) */
#pragma unroll
    for (int k = 0; k < MK_COPY_STAGES; ++k) {
        if (in.r < rows)
            mk_cp_async_f4(slot[k / MK_COPY_STAGES_PER_PAGE] +
                               (k % MK_COPY_STAGES_PER_PAGE) * MK_COPY_STAGE_BYTES,
                           reinterpret_cast<const float*>(in.at));
        mk_cp_async_commit();
        in.next(dr, dc, units, step_s, wrap_s);
    }
    /* steady state: store stage s, refill its slot with stage s + MK_COPY_STAGES. `in` runs
     * MK_COPY_STAGES units ahead of `out`, so it is past the end whenever `out` is. */
    while (out.r < rows) {
#pragma unroll
        for (int k = 0; k < MK_COPY_STAGES; ++k) {
            if (out.r < rows) {
                const mk_u32 a = slot[k / MK_COPY_STAGES_PER_PAGE] +
                                 (k % MK_COPY_STAGES_PER_PAGE) * MK_COPY_STAGE_BYTES;
                /* groups committed so far: MK_COPY_STAGES + s; stage s is the (s+1)-th */
                mk_cp_async_wait_group<MK_COPY_STAGES - 1>();
                mk_st_f4(reinterpret_cast<float*>(out.at), mk_lds_f4(a));
                /* the store consumed the shared load's value: the slot is free to refill */
                if (in.r < rows)
                    mk_cp_async_f4(a, reinterpret_cast<const float*>(in.at));
                mk_cp_async_commit();
                in.next(dr, dc, units, step_s, wrap_s);
                out.next(dr, dc, units, step_d, wrap_d);
            }
        }
    }
    mk_cp_async_wait_all();   /* nothing real is pending; no copy may outlive the pages */
}

__device__ __forceinline__ void mk_copy_run(const mk_instr& in, const mk_tensor* op,
                                            const mk_pages& pages)
{
    const mk_tensor& A = op[MK_ARG_A];
    const mk_tensor& O = op[MK_ARG_OUT];
    const int rows = in.rows, cols = in.cols;
    if (rows <= 0 || cols <= 0)
        return;
    const float* s = reinterpret_cast<const float*>(A.ptr) + (mk_u64)in.row0 * A.ld + in.col0;
    float* d = reinterpret_cast<float*>(O.ptr) + (mk_u64)in.row0 * O.ld + in.col0;

    const mk_u32 phase_s = (mk_u32)((mk_u64)s >> 2) & 3u;
    const mk_u32 phase_d = (mk_u32)((mk_u64)d >> 2) & 3u;
    if (phase_s == phase_d && ((A.ld | O.ld) & 3u) == 0) {
        int head = (int)((4u - phase_s) & 3u);
        if (head > cols)
            head = cols;
        const int body = (cols - head) >> 2;
        const int tail = cols - head - 4 * body;
        mk_copy_rect<4>(s, A.ld, d, O.ld, rows, head);
        if ((long long)rows * body <= MK_THREADS) {
            /* one unit per thread at most: the shortest dependent path (no division for a
             * single row, no shared memory hop) */
            const int t = (int)threadIdx.x;
            if (body > 0 && t < rows * body) {
                const int r = rows == 1 ? 0 : t / body, c = t - r * body;
                mk_st_f4(d + head + (mk_u64)r * O.ld + 4 * c,
                         mk_ld_f4(s + head + (mk_u64)r * A.ld + 4 * c));
            }
        } else
            mk_copy_ring(s + head, A.ld, d + head, O.ld, rows, body, pages);
        mk_copy_rect<4>(s + head + 4 * body, A.ld, d + head + 4 * body, O.ld, rows, tail);
    } else {
        mk_copy_rect<16>(s, A.ld, d, O.ld, rows, cols);   /* 4-B units: more in flight */
    }
}

#endif /* MEGAK_OP_COPY_CUH */
