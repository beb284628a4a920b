/* megak: memory-ordering and memory-access primitives of the megakernel (docs/ARCHITECTURE.md sections 3, 5).
 *
 * Everything that touches memory shared between SMs goes through these few functions, so the
 * ordering contract is visible in one place:
 *
 *   producer: the compute warps' global writes -> mk_compute_sync() (bar.sync 1, 256) ->
 *             thread 0: mk_fence_release() + mk_red_relaxed_add(counter, 1) per counter
 *             (fence + strong write = a release pattern: one MEMBAR, where red.release would
 *             repeat it per counter)
 *   consumer: the loader warp's 32 lanes poll mk_ld_relaxed(counter) until it is reached, then
 *             mk_fence_acquire() (strong read + fence = an acquire pattern; same as a last
 *             ld.acquire) -> lane 0 arrives on the slot's `full` mbarrier (release, cta) ->
 *             the compute warps wait on it (acquire, cta) -> they read
 *
 * Tensor data that other SMs write during the kernel is read with the weak loads of
 * tensor.cuh (mk_ld_f / mk_ld_f4 / mk_ld4_any): explicit
 * weak `ld.global`, or the equally weak cp.async copies into pages (mk_cp_async_f4 / _f4z / _f).
 * Never `.nc`/__ldg: the read-only path may serve stale lines. Weak loads are
 * safe: the consumer's acquire invalidates the SM's L1 before the barrier that releases
 * the other threads (PTX memory model, causality through bar.sync). We spell the loads in PTX
 * because tensor pointers come out of descriptors (plain u64): NVVM cannot prove they are
 * global (it would emit generic loads) and must never "prove" them read-only (.nc).
 *
 * NVRTC-only: no standard headers; the types come from instr.h.
 */
#ifndef MEGAK_SYNC_CUH
#define MEGAK_SYNC_CUH

#include "instr.h"

/* ---- counters and flags (gpu scope) ---------------------------------------------------- */

__device__ __forceinline__ mk_u32 mk_ld_acquire(const mk_u32* p)
{
    mk_u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* A plain coherent poll (no ordering): the abort flag only tells a spinning block to stop. */
__device__ __forceinline__ mk_u32 mk_ld_relaxed(const mk_u32* p)
{
    mk_u32 v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void mk_st_release(mk_u32* p, mk_u32 v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ mk_u64 mk_ld_relaxed_u64(const mk_u64* p)
{
    mk_u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void mk_st_release_u64(mk_u64* p, mk_u64 v)
{
    asm volatile("st.release.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void mk_fence_acq_rel()
{
    asm volatile("fence.acq_rel.gpu;" : : : "memory");
}

/* The one-way halves (PTX 8.6+, sm_90; NVRTC 13.0 has them). In the PTX model a strong write
 * after fence.release is a release pattern, and a strong read followed by fence.acquire an
 * acquire pattern. On sm_90 fence.release is MEMBAR.ALL.GPU alone and fence.acquire is
 * CCTL.IVALL alone (the L1 invalidation that ld.acquire appends to every load), so a poll loop
 * of relaxed loads pays the acquire once, on success. CCTL.IVALL waits for every load the
 * thread has in flight: nothing useful can be pipelined past it. */
__device__ __forceinline__ void mk_fence_release()
{
    asm volatile("fence.release.gpu;" : : : "memory");
}

__device__ __forceinline__ void mk_fence_acquire()
{
    asm volatile("fence.acquire.gpu;" : : : "memory");
}

__device__ __forceinline__ void mk_red_release_add(mk_u32* p, mk_u32 v)
{
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

/* Strong (gpu scope) but unordered add. Only right after mk_fence_release(): fence + strong
 * write is a release pattern in the PTX model, and red.release would add a second
 * MEMBAR.ALL.GPU per counter (sm_90 SASS) that orders nothing more. */
__device__ __forceinline__ void mk_red_relaxed_add(mk_u32* p, mk_u32 v)
{
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

/* ---- mapped pinned host memory (system scope): the resident kernel's request ring ------ */

/* A read of host memory the host writes (x86 stores reach memory in program order): an
 * acquire at system scope, after which this thread's reads see at least what the host wrote
 * before the word read. */
__device__ __forceinline__ mk_u64 mk_ld_acquire_sys_u64(const mk_u64* p)
{
    mk_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* A write the host reads, ordered after everything this thread read and wrote before. */
__device__ __forceinline__ void mk_st_release_sys(mk_u32* p, mk_u32 v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}

/* Nanoseconds, the same clock on every SM: deadlines of spin loops. */
__device__ __forceinline__ mk_u64 mk_globaltimer()
{
    mk_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* %globaltimer + timeout_ns, saturating: the end of a bounded wait. */
__device__ __forceinline__ mk_u64 mk_deadline(mk_u64 timeout_ns)
{
    const mk_u64 now = mk_globaltimer();
    return now + timeout_ns >= now ? now + timeout_ns : ~0ull;
}

/* How long a role waits for another role of its block, which itself waits at most three of
 * its own deadlines (slot, pages, counters): 3 x timeout + 1 s, saturating. */
__device__ __forceinline__ mk_u64 mk_patience(mk_u64 timeout_ns)
{
    return timeout_ns > (~0ull >> 2) ? ~0ull : 3 * timeout_ns + 1000000000ull;
}

/* SM cycles: short busy delays where %globaltimer is too coarse. */
__device__ __forceinline__ mk_u32 mk_clock()
{
    mk_u32 t;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(t));
    return t;
}

/* Bytes of dynamic shared memory this launch really has: the block checks its pages fit. */
__device__ __forceinline__ mk_u32 mk_dynamic_smem_size()
{
    mk_u32 n;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

__device__ __forceinline__ mk_u32 mk_smem_addr(const void* p)
{
    return (mk_u32)__cvta_generic_to_shared(p);
}

/* ---- asynchronous global -> shared copies (instruction prefetch) ------------------------ *
 * cp.async lets the loader warp start fetching the next record and its operand descriptors without
 * holding registers or stalling while the current instruction runs. Only host-written,
 * read-only data (queues, tensor table) goes through these, so the L1 path is fine.         */

__device__ __forceinline__ void mk_cp_async_16(void* smem, const void* gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 : : "r"(mk_smem_addr(smem)), "l"(gmem) : "memory");
}

__device__ __forceinline__ void mk_cp_async_8(void* smem, const void* gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;"
                 : : "r"(mk_smem_addr(smem)), "l"(gmem) : "memory");
}

__device__ __forceinline__ void mk_cp_async_commit()
{
    asm volatile("cp.async.commit_group;" : : : "memory");
}

template <int N>
__device__ __forceinline__ void mk_cp_async_wait_group()
{
    asm volatile("cp.async.wait_group %0;" : : "n"(N) : "memory");
}

__device__ __forceinline__ void mk_cp_async_wait_all()
{
    asm volatile("cp.async.wait_all;" : : : "memory");
}

/* ---- mbarriers: the hand-over between the loader warp and the compute warps -------------- *
 * Shared-memory arrive/wait barriers with a phase bit (sm_80+; block scope here). Arrive is a
 * release and a successful wait an acquire at block scope, so what the arriving threads wrote
 * before arriving (slot fields, st.shared, cp.async copies it waited for) is visible to the
 * threads that saw the phase flip. */
__device__ __forceinline__ void mk_mbar_init(mk_u64* bar, mk_u32 count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                 : : "r"(mk_smem_addr(bar)), "r"(count) : "memory");
}

/* Before a barrier's memory is initialised again (the resident kernel's next request): PTX
 * leaves mbarrier.init on a valid mbarrier object undefined. */
__device__ __forceinline__ void mk_mbar_inval(mk_u64* bar)
{
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" : : "r"(mk_smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mk_mbar_arrive(mk_u64* bar)
{
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }"
                 : : "r"(mk_smem_addr(bar)) : "memory");
}

/* `count` arrivals at once (the one reader of a ring stage that two warps may share). */
__device__ __forceinline__ void mk_mbar_arrive_count(mk_u64* bar, mk_u32 count)
{
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0], %1; }"
                 : : "r"(mk_smem_addr(bar)), "r"(count) : "memory");
}

/* True once the phase with parity `parity` has completed. try_wait lets the hardware suspend
 * the warp for a while instead of spinning on issue slots. */
__device__ __forceinline__ bool mk_mbar_try_wait(mk_u64* bar, mk_u32 parity)
{
    mk_u32 ok;
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
                 "selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok) : "r"(mk_smem_addr(bar)), "r"(parity) : "memory");
    return ok != 0u;
}

/* Wait for phase `parity` of `bar`, bounded by `deadline` (%globaltimer ns); false past it. */
__device__ __forceinline__ bool mk_mbar_wait(mk_u64* bar, mk_u32 parity, mk_u64 deadline)
{
    while (!mk_mbar_try_wait(bar, parity))
        if (mk_globaltimer() > deadline)
            return false;
    return true;
}

/* ---- fp32 data through pages by cp.async (unused now: the copy keeps its data in registers,
 * the transpose's tiles come by TMA) ---- *
 * cp.async is a weak generic-proxy access like mk_ld_f4 (not the async proxy of TMA), so the
 * consumer contract above covers it: data another SM produced is read only after this block's
 * acquire + barrier. .cg reads at L2 and never allocates in L1. The shared addresses are
 * 32-bit (mk_smem_addr); 16-byte copies need both addresses 16-B aligned. */
__device__ __forceinline__ void mk_cp_async_f4(mk_u32 smem, const float* gmem)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(smem), "l"(gmem) : "memory");
}

/* Reads only the first src_bytes (< 16) and zero-fills the rest; the chunk start must still be
 * 16-B aligned. Costs a few instructions more than mk_cp_async_f4: edges only. */
__device__ __forceinline__ void mk_cp_async_f4z(mk_u32 smem, const float* gmem, mk_u32 src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 : : "r"(smem), "l"(gmem), "r"(src_bytes) : "memory");
}

/* mk_cp_async_f4z with an L2 cache policy (createpolicy: stream.cuh's mk_policy_*). */
__device__ __forceinline__ void mk_cp_async_f4z_policy(mk_u32 smem, const float* gmem,
                                                       mk_u32 src_bytes, mk_u64 policy)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;"
                 : : "r"(smem), "l"(gmem), "r"(src_bytes), "l"(policy) : "memory");
}

__device__ __forceinline__ void mk_cp_async_f(mk_u32 smem, const float* gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" : : "r"(smem), "l"(gmem) : "memory");
}

__device__ __forceinline__ float mk_lds_f(mk_u32 smem)
{
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(smem) : "memory");
    return v;
}

__device__ __forceinline__ float4 mk_lds_f4(mk_u32 smem)
{
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(smem) : "memory");
    return v;
}

__device__ __forceinline__ void mk_sts_f4(mk_u32 smem, float4 v)
{
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
                 : : "r"(smem), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

#endif /* MEGAK_SYNC_CUH */
