"""PTX spellings the standalone probes share (tools/probe_*.py build their kernels from source
strings, each its own cubin): the mbarrier operations of the weight ring's protocol, as
megak/device/stream.cuh spells them. Needs `u32` defined before it."""

MBARRIER = r"""
/* ---- mbarriers (sync.cuh / stream.cuh spellings) ---------------------------------------- */
__device__ __forceinline__ void mbar_init(u32 bar, u32 count)
{ asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory"); }
/* The arrival of this phase plus `bytes` of transactions the bulk load will complete. */
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes)
{ asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
               :: "r"(bar), "r"(bytes) : "memory"); }
/* True once the phase of parity `par` completed (acquire, cta scope). */
__device__ __forceinline__ bool mbar_try(u32 bar, u32 par)
{ u32 ok; asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                       "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(bar), "r"(par) : "memory");
  return ok != 0u; }
"""
