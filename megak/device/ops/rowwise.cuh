/* What the row-wise ops (softmax.cuh, layernorm.cuh, rmsnorm.cuh) share: a warp per row, each
 * lane taking 4-column units lane, lane + 32, ... of the row (128 contiguous columns per warp
 * step: coalesced for fp32 and bf16), warp-wide sums and maxima by butterfly shuffles (every
 * lane ends with the same value: the combining steps are commutative), and the region checks.
 *
 * A record covers whole rows: col0 = 0 and cols = the row's width (mk_rowwise_check; the
 * debug check asserts the width). Each pass reads the row from global memory (L1/L2 after the
 * first), so any width works with no pages (MK_ROWWISE_PAGES = 0). Results are the same on
 * every run: each lane sums its columns in order, then the fixed butterfly.
 *
 * These bodies (and add.cuh's) are inlined into the interpreter's compute loop, unlike the GEMM
 * and REDUCE bodies: they need few registers, and four more __noinline__ call sites in
 * mk_compute made ptxas spill inside the GEMM bodies (it allocates those around what the
 * caller keeps live across its calls; measured with tests/test_device_compile.py).
 */
#ifndef MEGAK_OP_ROWWISE_CUH
#define MEGAK_OP_ROWWISE_CUH

#include "../instr.h"
#include "../tensor.cuh"

enum { MK_ROWWISE_WARPS = MK_THREADS / 32 };

__device__ __forceinline__ bool mk_rowwise_check(const mk_instr& in)
{
    return in.row0 >= 0 && in.col0 == 0 && in.rows >= 0 && in.cols >= 0;
}

/* The record's fp32 scalar (softmax scale, norm epsilon) is finite, and with `positive` > 0.
 * The loader reads it here, so the compute warps' read of it follows the loader's on the
 * slot's hand-over chain like every other record field (compute-sanitizer's racecheck
 * flagged the first read of a record byte that only the compute warps read). */
__device__ __forceinline__ bool mk_param_ok(const mk_instr& in, bool positive)
{
    const float v = __uint_as_float(in.param);
    return (in.param & 0x7f800000u) != 0x7f800000u && (!positive || v > 0.f);
}

/* Debug mode: X and OUT hold the region's rows whole; each per-column vector is one row. */
__device__ __forceinline__ bool mk_rowwise_operands_ok(const mk_instr& in, const mk_tensor* op,
                                                       mk_u32 vectors)
{
    bool ok = mk_tensor_region_ok(op[MK_ARG_A], in.row0, in.rows, 0, in.cols) &&
              mk_tensor_region_ok(op[MK_ARG_OUT], in.row0, in.rows, 0, in.cols) &&
              (in.rows == 0 || (op[MK_ARG_A].cols == (mk_u32)in.cols &&
                                op[MK_ARG_OUT].cols == (mk_u32)in.cols));
    for (mk_u32 i = 0; i < MK_MAX_TENSORS; ++i)
        if ((vectors >> i) & 1u)
            ok = ok && op[i].rows == 1 && mk_tensor_region_ok(op[i], 0, 1, 0, in.cols);
    return ok;
}

__device__ __forceinline__ float mk_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float mk_sum4(float4 v)
{
    return __fadd_rn(__fadd_rn(__fadd_rn(v.x, v.y), v.z), v.w);
}

/* One row of a tensor as a lane walks it: 4-wide units at lane, lane + 32, ... */
struct mk_row {
    const mk_tensor* t;
    mk_u64 org;      /* element offset of the row's first column */
    bool vec;
    __device__ __forceinline__ float4 load(int c, int cols) const
    {
        return mk_ld4_any(*t, org + (mk_u64)c, cols - c, vec);
    }
    __device__ __forceinline__ void store(int c, int cols, float4 v) const
    {
        mk_st4_any(*t, org + (mk_u64)c, v, cols - c, vec);
    }
};

__device__ __forceinline__ mk_row mk_row_of(const mk_tensor& t, long long row)
{
    const mk_u64 org = (mk_u64)row * t.ld;
    return {&t, org, mk_vec4_ok(t, org)};
}

#endif /* MEGAK_OP_ROWWISE_CUH */
