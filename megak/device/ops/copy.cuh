/* MK_OP_COPY: out[r, c] = A[r, c] for r in [row0, row0 + rows), c in [col0, col0 + cols).
 * No pages. Operands: MK_ARG_A, MK_ARG_OUT.
 *
 * Pure bandwidth. Why it is shaped like this:
 *  - The region is walked as one linear index space of (row, column-unit) pairs, thread t
 *    taking units t, t + 256, ...: every warp touches 32 consecutive units (512 contiguous
 *    bytes with float4) whatever the region's width, and every thread gets the same share,
 *    so narrow regions (cols = 4) keep all 256 threads busy and wide ones stay coalesced.
 *    (row, col) advance incrementally: no integer division in the loop.
 *  - U independent loads are issued before the first store: 8 x 16 B per thread = 32 KiB in
 *    flight per SM, about what HBM latency x bandwidth / 132 SMs needs.
 *  - Columns split into a scalar head, a float4 body and a scalar tail when A and OUT have the
 *    same 16-byte phase (always the case for megak-owned buffers); otherwise all scalar,
 *    still coalesced, with U = 16 to keep as many bytes in flight.
 */
#ifndef MEGAK_OP_COPY_CUH
#define MEGAK_OP_COPY_CUH

#include "../instr.h"
#include "../sync.cuh"
#include "../pages.cuh"

/* MK_COPY_PAGES (instr.h) = 0. Operand positions read (prefetched and validated): */
enum { MK_COPY_OPERANDS = (1u << MK_ARG_A) | (1u << MK_ARG_OUT) };

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

template <bool VEC> struct mk_copy_unit;
template <> struct mk_copy_unit<false> {
    typedef float T;
    enum { ELEMS = 1 };
    static __device__ __forceinline__ T load(const float* p) { return mk_ld_f(p); }
    static __device__ __forceinline__ void store(float* p, T v) { mk_st_f(p, v); }
};
template <> struct mk_copy_unit<true> {
    typedef float4 T;
    enum { ELEMS = 4 };
    static __device__ __forceinline__ T load(const float* p) { return mk_ld_f4(p); }
    static __device__ __forceinline__ void store(float* p, T v) { mk_st_f4(p, v); }
};

/* Copy a rows x units rectangle (units of 1 or 4 floats). With VEC, src/dst and both leading
 * dimensions must be 16-B aligned. */
template <bool VEC, int U>
__device__ __forceinline__ void mk_copy_rect(const float* src, mk_u32 lds, float* dst,
                                             mk_u32 ldd, int rows, int units)
{
    typedef mk_copy_unit<VEC> Unit;
    if (rows <= 0 || units <= 0)
        return;
    const int dr = MK_THREADS / units;   /* how far one 256-unit step moves: rows ... */
    const int dc = MK_THREADS % units;   /* ... and columns */
    int r = (int)threadIdx.x / units;
    int c = (int)threadIdx.x % units;
    while (r < rows) {
        typename Unit::T x[U];
        int rr[U], cc[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            rr[k] = r;
            cc[k] = c;
            if (r < rows)
                x[k] = Unit::load(src + (mk_u64)r * lds + (mk_u32)c * Unit::ELEMS);
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
                Unit::store(dst + (mk_u64)rr[k] * ldd + (mk_u32)cc[k] * Unit::ELEMS, x[k]);
    }
}

__device__ __forceinline__ void mk_copy_run(const mk_instr& in, const mk_tensor* op,
                                            const mk_pages& /*pages*/)
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
        mk_copy_rect<false, 4>(s, A.ld, d, O.ld, rows, head);
        mk_copy_rect<true, 8>(s + head, A.ld, d + head, O.ld, rows, body);
        mk_copy_rect<false, 4>(s + head + 4 * body, A.ld, d + head + 4 * body, O.ld, rows, tail);
    } else {
        mk_copy_rect<false, 16>(s, A.ld, d, O.ld, rows, cols);   /* 4-B units: more in flight */
    }
}

#endif /* MEGAK_OP_COPY_CUH */
