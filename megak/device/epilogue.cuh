/* megak: the one fused epilogue, out = act(v + bias) + residual, shared by every op that
 * has one (GEMM, REDUCE) and by the ops folded into one (an add becomes a residual or a bias).
 * Python twin: megak/ops/_epilogue.py (the simulator's semantics).
 *
 * Flags (instr.h): MK_FLAG_BIAS (tensor[MK_ARG_BIAS], 1 x N), MK_FLAG_RESIDUAL
 * (tensor[MK_ARG_RESIDUAL], M x N), the activation (enum mk_activation) in bits
 * MK_FLAG_ACT_SHIFT..; each operand fp32 or bf16, whatever the output's dtype.
 *
 * Precision (the simulator computes in float32 with numpy): bias/residual adds and every
 * operation of the activations are IEEE round-to-nearest single operations in the
 * simulator's order (__fadd_rn / __fmul_rn / __fdiv_rn: no FMA contraction), so the only
 * differences come from tanhf / expf (CUDA: <= 2 ulp; numpy: <= 1 ulp):
 *   GELU  0.5 v (1 + tanhf(0.7978845608 (v + 0.044715 v^3)))   (tanhf, not tanh.approx)
 *   SILU  v / (1 + expf(-v))                                     (expf, not __expf: __expf
 *         is 2 + 1.16|v| ulp, hundreds of ulp for |v| ~ 80)
 *   RELU  v < 0 ? 0 : v                                          (NaN propagates, as np.maximum)
 * Note for tolerances: where tanh(u) ~ -1 (GELU at v < -2), 1 + tanh cancels, so a 1-ulp
 * difference in tanh is an absolute error ~ 0.5 |v| 2^-24 that is many ulp of the tiny result;
 * compare with an absolute tolerance scaled by |v|, not in ulp of the output.
 */
#ifndef MEGAK_EPILOGUE_CUH
#define MEGAK_EPILOGUE_CUH

#include "instr.h"
#include "tensor.cuh"

/* ---- activation ------------------------------------------------------------------------ */

__device__ __forceinline__ float mk_act(float v, mk_u32 act)
{
    if (act == MK_ACT_RELU)
        return v < 0.f ? 0.f : v;
    if (act == MK_ACT_GELU) {
        const float v3 = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v);
        const float t = tanhf(__fmul_rn(0.7978845608f, __fadd_rn(v, v3)));
        return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.f, t));
    }
    if (act == MK_ACT_SILU)
        return __fdiv_rn(v, __fadd_rn(1.f, expf(-v)));
    return v;
}

__device__ __forceinline__ float4 mk_act4(float4 v, mk_u32 act)
{
    return make_float4(mk_act(v.x, act), mk_act(v.y, act), mk_act(v.z, act), mk_act(v.w, act));
}

__device__ __forceinline__ float4 mk_add4(float4 a, float4 b)
{
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                       __fadd_rn(a.w, b.w));
}

/* The epilogue of 4 consecutive values, in the simulator's order: bias, activation,
 * residual. Callers hoist the flag tests (has_bias, act, has_res) out of their loops. */
__device__ __forceinline__ float4 mk_epilogue4(float4 v, float4 bias, float4 res, bool has_bias,
                                               mk_u32 act, bool has_res)
{
    if (has_bias)
        v = mk_add4(v, bias);
    if (act != MK_ACT_NONE)
        v = mk_act4(v, act);
    if (has_res)
        v = mk_add4(v, res);
    return v;
}

/* The same for 2 consecutive values (the streamed GEMM's direct store). */
__device__ __forceinline__ float2 mk_epilogue2(float2 v, float2 bias, float2 res, bool has_bias,
                                               mk_u32 act, bool has_res)
{
    if (has_bias)
        v = make_float2(__fadd_rn(v.x, bias.x), __fadd_rn(v.y, bias.y));
    if (act != MK_ACT_NONE)
        v = make_float2(mk_act(v.x, act), mk_act(v.y, act));
    if (has_res)
        v = make_float2(__fadd_rn(v.x, res.x), __fadd_rn(v.y, res.y));
    return v;
}

__device__ __forceinline__ mk_u32 mk_epilogue_act(mk_u32 flags)
{
    return (flags & MK_FLAG_ACT_MASK) >> MK_FLAG_ACT_SHIFT;
}

/* Record-only: the activation code is one the device knows. */
__device__ __forceinline__ bool mk_epilogue_check(const mk_instr& in)
{
    return mk_epilogue_act(in.flags) < MK_ACT_COUNT;
}

/* The epilogue's operands (GEMM and REDUCE share them): bias a (1 x >= col0 + cols) row when
 * used, residual (>= row0 + rows) x (>= col0 + cols) when used, out (>= out_row0 + rows) x
 * (>= col0 + cols); every tensor fp32 or bf16. */
__device__ __forceinline__ bool mk_epilogue_operands_ok_at(const mk_instr& in, const mk_tensor* op,
                                                           int out_row0)
{
    if ((in.flags & MK_FLAG_BIAS) &&
        !(op[MK_ARG_BIAS].rows == 1 &&
          mk_tensor_region_ok(op[MK_ARG_BIAS], 0, 1, in.col0, in.cols)))
        return false;
    if ((in.flags & MK_FLAG_RESIDUAL) &&
        !mk_tensor_region_ok(op[MK_ARG_RESIDUAL], in.row0, in.rows, in.col0, in.cols))
        return false;
    return mk_tensor_region_ok(op[MK_ARG_OUT], out_row0, in.rows, in.col0, in.cols);
}

__device__ __forceinline__ bool mk_epilogue_operands_ok(const mk_instr& in, const mk_tensor* op)
{
    return mk_epilogue_operands_ok_at(in, op, in.out_row0);
}

#endif /* MEGAK_EPILOGUE_CUH */
