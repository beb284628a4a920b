/* MK_OP_COPY: out[r, c] = A[r, c] for r in [row0, row0 + rows), c in [col0, col0 + cols).
 * No pages (MK_COPY_PAGES = 0). Operands: MK_ARG_A, MK_ARG_OUT.
 *
 * A record with MK_FLAG_COPY_TAKE is taker `param` of k0 sharing its region (megak/ops/copy.py:
 * one per SM). The region's body (its first cols / 4 * 4 columns, as float4 units in row-major
 * order) is bands of MK_COPY_TAKE_UNITS units (8 KiB), handed out in turn by the counter in
 * out_row0 to the taker's warps, each for itself; a warp copies whichever band it is handed
 * until none is left. Why taken: with bands dealt out in advance, the SMs that run slower (the
 * HBM channels they meet, the other work on the SM) set the copy's end while the others idle;
 * taken in turn, an SM that ran ahead takes the next band (benchmarks/ANALYSIS.md: 1 GiB at
 * 3,841 GB/s dealt out, 4,118 taken by blocks, in a probe of this footprint). Why by warps: a
 * block that takes 64 KiB bands passes a barrier at every band, so every warp's loads of the
 * next band wait for the slowest warp's stores and the SM's reads in flight fall to none at
 * each band; a warp that takes its own band leaves the other warps' loads in flight. The
 * hand-out, in order, for each warp:
 *  - lane 0: old = atomicAdd(counter, 1) (relaxed: it publishes no data, each band is written
 *    only by the warp it was handed to; atomicity alone makes every value handed out once);
 *    band = old - epoch * (bands + MK_COPY_TAKE_WARPS * takers). A warp's last take finds
 *    band >= bands, so each warp adds (bands it took + 1) and a run adds exactly bands +
 *    MK_COPY_TAKE_WARPS * takers: the counter starts run `epoch` at epoch times that (runs
 *    never overlap: a launch or a request boundary orders the last run's adds before this
 *    run's, as for the dependency counters), and the host's target for it, the same sum,
 *    keeps the epoch wrap and the zeroing after a failed run (megakernel.cu) right;
 *  - __shfl_sync gives lane 0's value to the warp: a register exchange of the whole warp, no
 *    shared word, no barrier. Take i + 1 is made while band i is copied (lane 0's atomic
 *    right after the band's loads are issued, its round trip under theirs) and exchanged
 *    after the band's stores;
 *  - band >= bands (the same value in every lane): the warp leaves; otherwise lane l copies
 *    units band * MK_COPY_TAKE_UNITS + l + 32 k, k < 16: 16 float4 loads, (lane 0: the next
 *    take), then their stores, straight-line code (a loop around the register pipeline made
 *    ptxas move the build of every body's registers from the fp32 GEMM to the interpreter,
 *    with spills in the GEMM's loops). Where the body is one run of units in both tensors (one
 *    row, or rows without padding: a whole tensor) unit j lies at 4 j floats and the 16 loads
 *    are one address and immediate offsets; otherwise one division per band places a (row,
 *    column) walk (~250 instructions before a band's first load: 1 GiB on an H100 took 728 us
 *    walked, 713 flat, benchmarks/results/takers-flat/).
 * A warp's loop ends after at most bands + 1 takes whatever the counter holds (a stale counter
 * makes `band` wrap past bands: the warp leaves). The tail columns (cols % 4) of a static share
 * of the rows (taker k: rows [k rows / k0, (k + 1) rows / k0)) are each taker's own. Where A or
 * OUT is not 16-B aligned (a caller's tensor), there is no body: each taker copies its static
 * share of the rows as a dealt-out record would and adds, in one add, its share of the run's
 * count (taker 0: bands + MK_COPY_TAKE_WARPS, the others MK_COPY_TAKE_WARPS). The consumers
 * wait for every taker's signal (the op's counter, after the interpreter's compute barrier
 * that ends the op: every warp's stores). megak/runtime/take_model.py checks the hand-out in
 * every interleaving it draws, with the misuses it catches; tests/host_run/copy.cpp runs this
 * code itself on CPU threads (under ThreadSanitizer too).
 *
 * Pure bandwidth. Why it is shaped like this:
 *  - The region is walked as one linear index space of (row, column-unit) pairs, thread t
 *    taking units t, t + 256, ...: every warp touches 32 consecutive units (512 contiguous
 *    bytes with float4) whatever the region's width, and every thread gets the same share,
 *    so narrow regions (cols = 4) keep all 256 threads busy and wide ones stay coalesced.
 *    (row, col) advance incrementally: no integer division in the loop.
 *  - Bytes in flight decide HBM bandwidth (Little: ~2.1 TB/s of reads x ~1 us / 132 SMs =
 *    16 KiB of reads per SM at the unloaded latency, several times that as the latency grows
 *    near saturation). One batch of loads, then its stores, drains to zero before the next
 *    batch (8 float4 per thread: 32 KiB peak, far less on average, 3.6 TB/s measured). So the
 *    float4 body is a rolling pipeline in registers: MK_COPY_GROUPS = 2 groups of
 *    MK_COPY_GROUP_LOADS = 8 float4 per thread; the oldest group is stored as soon as it lands
 *    and reloaded with the units 16 further on while the other group is in flight:
 *    16 x 16 B x 256 threads = 64 KiB of loads in flight per SM almost all the time
 *    (8.4 MB over 132 SMs, ~2x HBM's bandwidth-delay product). A group's stores wait only for
 *    that group's loads (2 x 8, not 16 separate waits: few scoreboards). Not yet measured
 *    against the ring's 3.7 TB/s; MK_COPY_GROUPS = 3 (96 KiB) also compiles without spills.
 *    Measure inside the megakernel too: LDG data lands in L1 first, and 13 pages leave L1
 *    ~28 KB there (cp.async.cg wrote straight into the pages), which may cap loads in flight.
 *  - Why registers and not shared memory: the previous version streamed through a cp.async
 *    ring in 4 pages, each thread reading back its own 16-B slots. That was conflict-free by
 *    address (a warp's LDS.128 covers 512 contiguous bytes: every 8-lane phase 128 B), yet
 *    Nsight Compute counted ~5% extra LDS wavefronts: the cp.async fills land in the same
 *    data banks the LDS reads while the ring runs, and the hardware bank-conflict counter
 *    counts that arbitration, which no layout removes. Registers cost nothing here (the
 *    compute warps have 224 per thread after setmaxnreg; this needs 64 for data), the
 *    pipeline moves 16 B with 2 LSU instructions instead of 3 (LDG + STG vs LDGSTS + LDS +
 *    STG), and the copy holds no pages, which stay free for the instruction in the other slot.
 *  - Small bodies (<= one unit per thread) skip the pipeline: one load, one store, the
 *    shortest dependent path (chains of tiny copies).
 *  - A flagged operand (small intermediates, flag.cuh) takes the elementwise path there: one
 *    element per thread, every thread's first poll issued at once.
 *  - Columns split into a scalar head, a float4 body and a scalar tail when A and OUT have the
 *    same 16-byte phase (always the case for megak-owned buffers); otherwise all scalar,
 *    still coalesced, registers only, with U = 16 loads in flight per thread.
 */
#ifndef MEGAK_OP_COPY_CUH
#define MEGAK_OP_COPY_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"
#include "../tensor.cuh"
#include "../flag.cuh"

/* The register pipeline's shape (MK_COPY_OPERANDS, MK_COPY_PAGES: instr.h). */
enum {
    MK_COPY_GROUPS = 2,        /* groups of loads in flight, each stored then reloaded whole */
    MK_COPY_GROUP_LOADS = 8,   /* float4 per thread per group */
    MK_COPY_STAGES = MK_COPY_GROUPS * MK_COPY_GROUP_LOADS   /* 16 float4 = 64 registers */
};
static_assert(MK_COPY_PAGES == 0, "the copy streams through registers: it needs no pages");

/* Record-only limits, checked before every run (a taker's counter: mk_validate). */
__device__ __forceinline__ bool mk_copy_check(const mk_instr& in)
{
    const bool take = (in.flags & MK_FLAG_COPY_TAKE) != 0u;
    return in.row0 >= 0 && in.col0 >= 0 && in.rows >= 0 && in.cols >= 0 &&
           (!take || (MK_BUILT(MK_BODY_COPY_TAKE) && in.k0 >= 1 && in.param < (mk_u32)in.k0 &&
                      in.cols >= 4 && (mk_u64)in.rows * (mk_u32)(in.cols >> 2) < (1ull << 31)));
}

/* Debug mode: the region lies inside both tensors (each fp32, or flagged: flag.cuh). */
__device__ __forceinline__ bool mk_copy_check_operands(const mk_instr& in, const mk_tensor* op)
{
    const mk_tensor& A = op[MK_ARG_A];
    const mk_tensor& O = op[MK_ARG_OUT];
    return (mk_f32_region_ok(A, in.row0, in.rows, in.col0, in.cols) ||
            mk_flag_region_ok(A, in.row0, in.rows, in.col0, in.cols)) &&
           (mk_f32_region_ok(O, in.row0, in.rows, in.col0, in.cols) ||
            mk_flag_region_ok(O, in.row0, in.rows, in.col0, in.cols));
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
 * floats): unit t, t + 256, ... (a taker's warp: lane l, l + 32, ...). Pointer arithmetic
 * only, no multiply per step. */
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

/* The float4 body as a rolling register pipeline (see the top of the file): MK_COPY_GROUPS
 * groups of MK_COPY_GROUP_LOADS float4 per thread. src/dst and both leading dimensions 16-B
 * aligned. */
__device__ __forceinline__ void mk_copy_stream(const float* src, mk_u32 lds, float* dst,
                                               mk_u32 ldd, int rows, int units)
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
    float4 x[MK_COPY_GROUPS][MK_COPY_GROUP_LOADS];

    /* prologue: every group in flight. Past the end a slot gets zeros (never stored), not
     * "keeps its old value": an `if` around the load made that old value live across the
     * load, and the megakernel (not megak_op) spilled with as little as 2 x 4 float4. */
#pragma unroll
    for (int g = 0; g < MK_COPY_GROUPS; ++g)
#pragma unroll
        for (int u = 0; u < MK_COPY_GROUP_LOADS; ++u) {
            x[g][u] = in.r < rows ? mk_ld_f4(reinterpret_cast<const float*>(in.at))
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
            in.next(dr, dc, units, step_s, wrap_s);
        }
    /* steady state: store group g (its loads are the oldest in flight), reload it with the
     * units MK_COPY_STAGES further on. `in` runs MK_COPY_STAGES units ahead of `out`, so it
     * is past the end whenever `out` is. */
    while (out.r < rows) {
#pragma unroll
        for (int g = 0; g < MK_COPY_GROUPS; ++g) {
#pragma unroll
            for (int u = 0; u < MK_COPY_GROUP_LOADS; ++u) {
                if (out.r < rows)
                    mk_st_f4(reinterpret_cast<float*>(out.at), x[g][u]);
                out.next(dr, dc, units, step_d, wrap_d);
            }
#pragma unroll
            for (int u = 0; u < MK_COPY_GROUP_LOADS; ++u) {
                x[g][u] = in.r < rows ? mk_ld_f4(reinterpret_cast<const float*>(in.at))
                                      : make_float4(0.f, 0.f, 0.f, 0.f);
                in.next(dr, dc, units, step_s, wrap_s);
            }
        }
    }
}

/* Rows [row0, row0 + rows) of the record's columns, fp32 A and OUT. */
__device__ __forceinline__ void mk_copy_rows(const mk_instr& in, const mk_tensor* op, int row0,
                                             int rows)
{
    const mk_tensor& A = op[MK_ARG_A];
    const mk_tensor& O = op[MK_ARG_OUT];
    const int cols = in.cols;
    const float* s = reinterpret_cast<const float*>(A.ptr) + (mk_u64)row0 * A.ld + in.col0;
    float* d = reinterpret_cast<float*>(O.ptr) + (mk_u64)row0 * O.ld + in.col0;

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
             * single row, no loop) */
            const int t = (int)threadIdx.x;
            if (body > 0 && t < rows * body) {
                const int r = rows == 1 ? 0 : t / body, c = t - r * body;
                mk_st_f4(d + head + (mk_u64)r * O.ld + 4 * c,
                         mk_ld_f4(s + head + (mk_u64)r * A.ld + 4 * c));
            }
        } else
            mk_copy_stream(s + head, A.ld, d + head, O.ld, rows, body);
        mk_copy_rect<4>(s + head + 4 * body, A.ld, d + head + 4 * body, O.ld, rows, tail);
    } else {
        mk_copy_rect<16>(s, A.ld, d, O.ld, rows, cols);   /* 4-B units: more in flight */
    }
}

/* Bands of a taker's region: its body's float4 units (< 2^31: mk_copy_check) in bands of
 * MK_COPY_TAKE_UNITS. */
__device__ __forceinline__ mk_u32 mk_copy_bands(const mk_instr& in)
{
    const mk_u32 units = (mk_u32)in.rows * (mk_u32)(in.cols >> 2);
    return (units + (MK_COPY_TAKE_UNITS - 1u)) / MK_COPY_TAKE_UNITS;
}

/* Taker `in.param`'s static share of the rows: [row0 + lo, row0 + hi). */
__device__ __forceinline__ void mk_copy_share(const mk_instr& in, int& lo, int& hi)
{
    const mk_u64 k = in.param, n = (mk_u64)in.k0, rows = (mk_u64)in.rows;
    lo = (int)(k * rows / n);
    hi = (int)((k + 1u) * rows / n);
}

static_assert(MK_COPY_TAKE_WARPS * 32 == MK_THREADS, "every compute warp takes bands");
static_assert(MK_COPY_TAKE_UNITS == 16 * 32, "a warp's band: 16 float4 a lane");

/* The band a warp's take hands out, in every lane: lane 0's counter value `old` (the other
 * lanes pass anything), less the run's base. */
__device__ __forceinline__ mk_u32 mk_copy_band_of(mk_u32 old, mk_u32 base)
{
    return __shfl_sync(0xffffffffu, old, 0) - base;
}

/* One taker (MK_FLAG_COPY_TAKE; the hand-out and why: top of the file) where A and OUT are
 * 16-B aligned: the bands its warps are handed, then its share's tail columns. False, having
 * added its share of the run's count, where they are not: the caller copies its share. */
__device__ __forceinline__ bool mk_copy_take(const mk_instr& in, const mk_tensor* op)
{
    mk_control& ctl = mk_ctl();
    const mk_tensor& A = op[MK_ARG_A];
    const mk_tensor& O = op[MK_ARG_OUT];
    const float* const s = reinterpret_cast<const float*>(A.ptr) + (mk_u64)in.row0 * A.ld + in.col0;
    float* const d = reinterpret_cast<float*>(O.ptr) + (mk_u64)in.row0 * O.ld + in.col0;
    const mk_u32 bands = mk_copy_bands(in);
    mk_u32* const counter = reinterpret_cast<mk_u32*>(ctl.params.counters) + (mk_u32)in.out_row0;
    if ((((mk_u64)s | (mk_u64)d) & 15u) != 0u || ((A.ld | O.ld) & 3u) != 0u) {
        if (threadIdx.x == 0)
            atomicAdd(counter, in.param == 0u ? bands + MK_COPY_TAKE_WARPS : MK_COPY_TAKE_WARPS);
        return false;
    }
    const int rows = in.rows, units = in.cols >> 2;
    const mk_u32 lane = threadIdx.x & 31u;
    const mk_u32 base = ctl.params.epoch * (bands + MK_COPY_TAKE_WARPS * (mk_u32)in.k0);
    const int dr = 32 / units, dc = 32 % units;   /* a warp's step over the (row, unit) grid */
    const mk_u64 step_s = 4ull * ((mk_u64)dr * A.ld + 4u * (mk_u32)dc);
    const mk_u64 step_d = 4ull * ((mk_u64)dr * O.ld + 4u * (mk_u32)dc);
    const mk_u64 wrap_s = 4ull * ((mk_u64)A.ld - 4u * (mk_u32)units);
    const mk_u64 wrap_d = 4ull * ((mk_u64)O.ld - 4u * (mk_u32)units);
    /* the body is one run of units in both tensors: one row, or rows of no padding */
    const bool flat = rows == 1 || (A.ld == 4u * (mk_u32)units && O.ld == 4u * (mk_u32)units);
    const mk_u32 total = (mk_u32)rows * (mk_u32)units;
    /* take 0 here; take i + 1 right after band i's loads are issued, so that its round trip
     * runs under theirs, exchanged after band i's stores */
    mk_u32 band = mk_copy_band_of(lane == 0u ? atomicAdd(counter, 1u) : 0u, base);
    while (band < bands) {
        const mk_u32 first = band * MK_COPY_TAKE_UNITS + lane;
        float4 x[MK_COPY_TAKE_UNITS / 32];
        mk_u32 next = 0;
        if (flat) {   /* one contiguous run of units: unit j at s + 4 j, offsets immediate */
            const float* const from = s + 4ull * first;
            float* const to = d + 4ull * first;
#pragma unroll
            for (int k = 0; k < MK_COPY_TAKE_UNITS / 32; ++k)
                x[k] = first + (mk_u32)(32 * k) < total ? mk_ld_f4(from + 4 * 32 * k)
                                                        : make_float4(0.f, 0.f, 0.f, 0.f);
            if (lane == 0u)
                next = atomicAdd(counter, 1u);
#pragma unroll
            for (int k = 0; k < MK_COPY_TAKE_UNITS / 32; ++k)
                if (first + (mk_u32)(32 * k) < total)
                    mk_st_f4(to + 4 * 32 * k, x[k]);
        } else {
            const int r = (int)(first / (mk_u32)units), c = (int)(first % (mk_u32)units);
            mk_copy_walk in_w = {r, c, (mk_u64)(s + (mk_u64)r * A.ld + 4 * c)};
            mk_copy_walk out_w = {r, c, (mk_u64)(d + (mk_u64)r * O.ld + 4 * c)};
#pragma unroll
            for (int k = 0; k < MK_COPY_TAKE_UNITS / 32; ++k) {
                x[k] = in_w.r < rows ? mk_ld_f4(reinterpret_cast<const float*>(in_w.at))
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
                in_w.next(dr, dc, units, step_s, wrap_s);
            }
            if (lane == 0u)
                next = atomicAdd(counter, 1u);
#pragma unroll
            for (int k = 0; k < MK_COPY_TAKE_UNITS / 32; ++k) {
                if (out_w.r < rows)
                    mk_st_f4(reinterpret_cast<float*>(out_w.at), x[k]);
                out_w.next(dr, dc, units, step_d, wrap_d);
            }
        }
        band = mk_copy_band_of(next, base);
    }
    int lo, hi;
    mk_copy_share(in, lo, hi);
    mk_copy_rect<4>(s + (mk_u64)lo * A.ld + 4 * units, A.ld, d + (mk_u64)lo * O.ld + 4 * units,
                    O.ld, hi - lo, in.cols & 3);
    return true;
}

__device__ __forceinline__ void mk_copy_run(const mk_instr& in, const mk_tensor* op,
                                            const mk_pages& pages)
{
    (void)pages;
    if (in.rows <= 0 || in.cols <= 0)
        return;
    if (mk_flag_any(op, false)) {
        mk_flag_elementwise<false>(in, op);   /* a small tensor whose data is its flag */
        return;
    }
    int row0 = in.row0, rows = in.rows;
    if (MK_BUILT(MK_BODY_COPY_TAKE) && (in.flags & MK_FLAG_COPY_TAKE) != 0u) {
        if (mk_copy_take(in, op))
            return;
        int lo, hi;   /* not aligned: this taker's share, as a dealt-out record */
        mk_copy_share(in, lo, hi);
        row0 += lo;
        rows = hi - lo;
    }
    mk_copy_rows(in, op, row0, rows);
}

#endif /* MEGAK_OP_COPY_CUH */
