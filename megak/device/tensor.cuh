/* megak: tensors as the ops see them: dtypes, weak global loads and stores of fp32 and bf16
 * elements (scalar, 4-wide, with edges), alignment tests and the debug-mode region checks.
 * Every op that reads or writes a tensor uses these; none restates them.
 *
 * Why spelled in PTX: tensor pointers come out of descriptors (plain u64), so NVVM cannot
 * prove them global (it would emit generic accesses) and must never "prove" them read-only
 * (.nc/__ldg may serve stale lines of data another SM wrote during the kernel). Weak loads are
 * safe after the consumer's acquire (sync.cuh has the ordering contract).
 *
 * NVRTC-only: no standard headers; the types come from instr.h.
 */
#ifndef MEGAK_TENSOR_CUH
#define MEGAK_TENSOR_CUH

#include "instr.h"

/* ---- fp32 data ------------------------------------------------------------------------- */

/* .cg: cached in L2 only. Streaming ops read each byte once, and with 13 pages of shared
 * memory the SM's L1 keeps only ~28 KiB: allocating L1 lines for 64 KiB of loads in flight
 * per SM throttles them (measured on the H200: transpose 2.83 -> 2.93 TB/s). Still a
 * weak load in the memory model, coherent at L2, so data other SMs wrote is read correctly
 * after the acquire. */
__device__ __forceinline__ float mk_ld_f(const float* p)
{
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ float4 mk_ld_f4(const float* p)
{
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void mk_st_f(float* p, float v)
{
    asm volatile("st.global.f32 [%0], %1;" : : "l"(p), "f"(v) : "memory");
}

__device__ __forceinline__ void mk_st_f4(float* p, float4 v)
{
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};"
                 : : "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

/* Up to 4 consecutive floats, zero beyond `n` (n <= 0: all zero). One 16-byte load when the
 * caller says the address is 16-byte aligned and all 4 are in range; scalars at edges. */
__device__ __forceinline__ float4 mk_ld_f4_edge(const float* p, int n, bool vec)
{
    if (vec && n >= 4)
        return mk_ld_f4(p);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (n > 0) v.x = mk_ld_f(p);
    if (n > 1) v.y = mk_ld_f(p + 1);
    if (n > 2) v.z = mk_ld_f(p + 2);
    if (n > 3) v.w = mk_ld_f(p + 3);
    return v;
}

/* Store the first min(n, 4) floats of v. */
__device__ __forceinline__ void mk_st_f4_edge(float* p, float4 v, int n, bool vec)
{
    if (vec && n >= 4) {
        mk_st_f4(p, v);
        return;
    }
    if (n > 0) mk_st_f(p, v.x);
    if (n > 1) mk_st_f(p + 1, v.y);
    if (n > 2) mk_st_f(p + 2, v.z);
    if (n > 3) mk_st_f(p + 3, v.w);
}

/* True when 4 floats at p (and at p + k*ld for every row k) are 16-byte aligned. */
__device__ __forceinline__ bool mk_vec_ok(const float* p, mk_u32 ld)
{
    return ((((mk_u64)p) & 15u) == 0) && ((ld & 3u) == 0);
}

/* ---- dtypes -------------------------------------------------------------------------- */

__device__ __forceinline__ mk_u32 mk_dtype_bytes(mk_u32 dtype)
{
    return dtype == MK_DTYPE_BF16 ? 2u : 4u;
}

__device__ __forceinline__ float mk_bf16_lo(mk_u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float mk_bf16_hi(mk_u32 w) { return __uint_as_float(w & 0xffff0000u); }

/* Round to nearest even; `lo` goes to the low half (the lower address). */
__device__ __forceinline__ mk_u32 mk_pack_bf16x2(float lo, float hi)
{
    mk_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ mk_u16 mk_to_bf16(float v)
{
    mk_u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}

/* Weak global accesses of 16/32-bit words, spelled in PTX for the reasons given in sync.cuh
 * (tensors are written by other SMs during the kernel: never .nc). */
__device__ __forceinline__ mk_u32 mk_ld_u16(const void* p)
{
    mk_u16 v;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 mk_ld_u32x2(const void* p)
{
    uint2 v;
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ void mk_st_u16(void* p, mk_u16 v)
{
    asm volatile("st.global.u16 [%0], %1;" : : "l"(p), "h"(v) : "memory");
}

__device__ __forceinline__ void mk_st_u32x2(void* p, uint2 v)
{
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" : : "l"(p), "r"(v.x), "r"(v.y) : "memory");
}

/* True when 4 consecutive elements at element offset `off` of `t` (and at off + k * ld for
 * every row k) can be moved as one vector: 16 B for fp32, 8 B for bf16. */
__device__ __forceinline__ bool mk_vec4_ok(const mk_tensor& t, mk_u64 off)
{
    const mk_u64 bytes = 4u * mk_dtype_bytes(t.dtype);
    return ((t.ptr + off * mk_dtype_bytes(t.dtype)) & (bytes - 1u)) == 0 && (t.ld & 3u) == 0;
}

/* Up to 4 consecutive elements of any dtype as floats, zero beyond n (n <= 0: all zero). */
__device__ __forceinline__ float4 mk_ld4_any(const mk_tensor& t, mk_u64 off, int n, bool vec)
{
    if (t.dtype != MK_DTYPE_BF16)
        return mk_ld_f4_edge(reinterpret_cast<const float*>(t.ptr) + off, n, vec);
    const mk_u16* p = reinterpret_cast<const mk_u16*>(t.ptr) + off;
    if (vec && n >= 4) {
        const uint2 w = mk_ld_u32x2(p);
        return make_float4(mk_bf16_lo(w.x), mk_bf16_hi(w.x), mk_bf16_lo(w.y), mk_bf16_hi(w.y));
    }
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (n > 0) v.x = mk_bf16_lo(mk_ld_u16(p));
    if (n > 1) v.y = mk_bf16_lo(mk_ld_u16(p + 1));
    if (n > 2) v.z = mk_bf16_lo(mk_ld_u16(p + 2));
    if (n > 3) v.w = mk_bf16_lo(mk_ld_u16(p + 3));
    return v;
}

/* Store the first min(n, 4) of v, rounded to t's dtype. */
__device__ __forceinline__ void mk_st4_any(const mk_tensor& t, mk_u64 off, float4 v, int n,
                                           bool vec)
{
    if (t.dtype != MK_DTYPE_BF16) {
        mk_st_f4_edge(reinterpret_cast<float*>(t.ptr) + off, v, n, vec);
        return;
    }
    mk_u16* p = reinterpret_cast<mk_u16*>(t.ptr) + off;
    if (vec && n >= 4) {
        mk_st_u32x2(p, make_uint2(mk_pack_bf16x2(v.x, v.y), mk_pack_bf16x2(v.z, v.w)));
        return;
    }
    if (n > 0) mk_st_u16(p, mk_to_bf16(v.x));
    if (n > 1) mk_st_u16(p + 1, mk_to_bf16(v.y));
    if (n > 2) mk_st_u16(p + 2, mk_to_bf16(v.z));
    if (n > 3) mk_st_u16(p + 3, mk_to_bf16(v.w));
}

/* The same for 2 consecutive elements (8 B of fp32, 4 B of bf16): the streamed GEMM's direct
 * store, where a thread holds a column pair. */
__device__ __forceinline__ bool mk_vec2_ok(const mk_tensor& t, mk_u64 off)
{
    const mk_u64 bytes = 2u * mk_dtype_bytes(t.dtype);
    return ((t.ptr + off * mk_dtype_bytes(t.dtype)) & (bytes - 1u)) == 0 && (t.ld & 1u) == 0;
}

/* Up to 2 consecutive elements of any dtype as floats, zero beyond n (n <= 0: both zero). */
__device__ __forceinline__ float2 mk_ld2_any(const mk_tensor& t, mk_u64 off, int n, bool vec)
{
    float2 v = make_float2(0.f, 0.f);
    if (t.dtype != MK_DTYPE_BF16) {
        const float* p = reinterpret_cast<const float*>(t.ptr) + off;
        if (vec && n >= 2)
            asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
        else {
            if (n > 0) v.x = mk_ld_f(p);
            if (n > 1) v.y = mk_ld_f(p + 1);
        }
        return v;
    }
    const mk_u16* p = reinterpret_cast<const mk_u16*>(t.ptr) + off;
    if (vec && n >= 2) {
        mk_u32 w;
        asm volatile("ld.global.u32 %0, [%1];" : "=r"(w) : "l"(p));
        return make_float2(mk_bf16_lo(w), mk_bf16_hi(w));
    }
    if (n > 0) v.x = mk_bf16_lo(mk_ld_u16(p));
    if (n > 1) v.y = mk_bf16_lo(mk_ld_u16(p + 1));
    return v;
}

/* Store the first min(n, 2) of v, rounded to t's dtype. */
__device__ __forceinline__ void mk_st2_any(const mk_tensor& t, mk_u64 off, float2 v, int n,
                                           bool vec)
{
    if (t.dtype != MK_DTYPE_BF16) {
        float* p = reinterpret_cast<float*>(t.ptr) + off;
        if (vec && n >= 2)
            asm volatile("st.global.v2.f32 [%0], {%1, %2};" : : "l"(p), "f"(v.x), "f"(v.y)
                         : "memory");
        else {
            if (n > 0) mk_st_f(p, v.x);
            if (n > 1) mk_st_f(p + 1, v.y);
        }
        return;
    }
    mk_u16* p = reinterpret_cast<mk_u16*>(t.ptr) + off;
    if (vec && n >= 2) {
        asm volatile("st.global.u32 [%0], %1;" : : "l"(p), "r"(mk_pack_bf16x2(v.x, v.y))
                     : "memory");
        return;
    }
    if (n > 0) mk_st_u16(p, mk_to_bf16(v.x));
    if (n > 1) mk_st_u16(p + 1, mk_to_bf16(v.y));
}

/* Debug mode: `t` is an fp32 or bf16 view with a sane leading dimension, aligned to its
 * element, and the region [r0, r0 + nr) x [c0, c0 + nc) lies inside it. */
__device__ __forceinline__ bool mk_tensor_region_ok(const mk_tensor& t, long long r0,
                                                    long long nr, long long c0, long long nc)
{
    if (t.dtype != MK_DTYPE_F32 && t.dtype != MK_DTYPE_BF16)
        return false;
    if (r0 < 0 || c0 < 0 || nr < 0 || nc < 0)
        return false;
    if (nr == 0 || nc == 0)
        return true;
    return t.ptr != 0 && (t.ptr & (mk_dtype_bytes(t.dtype) - 1u)) == 0 && t.ld >= t.cols &&
           r0 + nr <= (long long)t.rows && c0 + nc <= (long long)t.cols;
}

/* The same for ops that move 4-byte elements only (copy, transpose). */
__device__ __forceinline__ bool mk_f32_region_ok(const mk_tensor& t, long long r0, long long nr,
                                                 long long c0, long long nc)
{
    return (t.dtype == MK_DTYPE_F32 || nr <= 0 || nc <= 0) &&
           mk_tensor_region_ok(t, r0, nr, c0, nc);
}

#endif /* MEGAK_TENSOR_CUH */
