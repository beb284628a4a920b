/* megak: the block's dynamic shared memory: control area, page array, page allocator.
 *
 *   mk_smem (dynamic, 16-B aligned at least)
 *   +------------------------------------------+---------+--------+--------+-----+----------+
 *   | mk_control (<= MK_CONTROL_BYTES)         | slack   | page 0 | page 1 | ... | page n-1 |
 *   |  slot[0]: record | operands | page table | to next | 16 KiB | 16 KiB |     |          |
 *   |  slot[1]: record | operands | page table | 1 KiB   |        |        |     |          |
 *   |  params copy, allocator bitmask, trace    | boundary|        |        |     |          |
 *   +------------------------------------------+---------+--------+--------+-----+----------+
 *
 * Host side: pages.py smem_bytes(n) = MK_CONTROL_BYTES + MK_PAGE_ALIGN + n * MK_PAGE_BYTES.
 * Static shared memory: none; everything lives in mk_control.
 */
#ifndef MEGAK_PAGES_CUH
#define MEGAK_PAGES_CUH

#include "instr.h"
#include "sync.cuh"

typedef unsigned char mk_u8;

/* MK_TRACE=1 (a -D define, a separately compiled variant) records per-instruction phase
 * timestamps into params->trace; the default build has no trace code at all. */
#ifndef MK_TRACE
#define MK_TRACE 0
#endif

/* Base of the block's dynamic shared memory: the control area, then the pages. 16-B alignment
 * is what cp.async of records needs; pages are aligned by hand (mk_page_array). */
extern __shared__ __align__(16) unsigned char mk_smem[];

/* One instruction slot: the record, the descriptors of its operands (resolved from the
 * tensor table while the previous instruction runs, so ops read them from shared memory
 * instead of paying a global round trip), and the pages the instruction holds. */
struct mk_slot {
    mk_instr ins;                        /* offset 0: 16-B aligned for cp.async */
    mk_tensor operand[MK_MAX_TENSORS];   /* operand[MK_ARG_x] = tensors[ins.tensor[MK_ARG_x]] */
    mk_u8 page[MK_MAX_PAGES];            /* page indices, in acquisition order */
};

struct mk_control {
    mk_slot slot[2];     /* instruction q lives in slot[q & 1] */
    mk_params params;    /* copied once: thread 0's hot path reads shared, not global,
                            memory and the op code holds no registers for it */
    mk_u32 free_pages;   /* allocator: bit i set = page i free (touched by thread 0 only) */
    mk_u64 trace_t[MK_TRACE_PHASES];   /* MK_TRACE: phase times of the running instruction */
};

static_assert(sizeof(mk_instr) == MK_INSTR_BYTES, "mk_instr size");
static_assert(sizeof(mk_slot) % 16 == 0, "slots must keep records 16-B aligned");
static_assert(sizeof(mk_control) <= MK_CONTROL_BYTES, "control area overflows MK_CONTROL_BYTES");
static_assert(MK_MAX_PAGES <= 32, "the allocator is one 32-bit mask");
static_assert(MK_PAGE_BYTES == 64 * 64 * 4, "transpose/gemm tiles assume 16 KiB pages");

/* First MK_PAGE_ALIGN-aligned shared address at or after smem + MK_CONTROL_BYTES. Computed as
 * an offset from the extern __shared__ symbol so NVVM keeps the shared address space and ops
 * get ld.shared/st.shared instead of generic accesses. */
__device__ __forceinline__ unsigned char* mk_page_array(unsigned char* smem)
{
    const mk_u32 a = mk_smem_addr(smem + MK_CONTROL_BYTES);
    const mk_u32 pad = (0u - a) & (mk_u32)(MK_PAGE_ALIGN - 1);
    return smem + MK_CONTROL_BYTES + pad;
}

__device__ __forceinline__ mk_u32 mk_all_pages_mask(mk_u32 n_pages)
{
    return n_pages >= 32 ? 0xffffffffu : ((1u << n_pages) - 1u);
}

__device__ __forceinline__ mk_control& mk_ctl()
{
    return *reinterpret_cast<mk_control*>(mk_smem);
}

/* Ops call this at their phase boundaries (MK_T_LOADED: first operands in shared memory or
 * registers, MK_T_COMPUTED: results in registers); thread 0's clock is the block's. The
 * interpreter fills in boundaries an op does not mark. Compiles to nothing without MK_TRACE. */
__device__ __forceinline__ void mk_trace_mark(int phase)
{
#if MK_TRACE
    if (threadIdx.x == 0)
        mk_ctl().trace_t[phase] = mk_globaltimer();
#else
    (void)phase;
#endif
}

/* The pages one instruction holds, as the ops see them: pages[i] is its i-th page. */
struct mk_pages {
    unsigned char* base;   /* page 0 of the page array */
    const mk_u8* idx;      /* the slot's page table */

    __device__ __forceinline__ float* operator[](int i) const
    {
        return reinterpret_cast<float*>(base + (mk_u32)idx[i] * (mk_u32)MK_PAGE_BYTES);
    }
};

/* Thread 0 only. Take `n` free pages (lowest first) into `table`; false if too few are free
 * (then nothing is taken). With instructions running one after another this cannot fail for
 * a validated record, but the allocator is real so that overlapping slots can share it. */
__device__ __forceinline__ bool mk_pages_acquire(mk_u32* free_mask, mk_u8* table, mk_u32 n)
{
    mk_u32 f = *free_mask;
    if ((mk_u32)__popc(f) < n)
        return false;
    for (mk_u32 i = 0; i < n; ++i) {
        const mk_u32 p = (mk_u32)__ffs(f) - 1u;
        f &= f - 1u;                    /* clear the lowest set bit: page p is taken */
        table[i] = (mk_u8)p;
    }
    *free_mask = f;
    return true;
}

/* Thread 0 only. Give back the first `n` pages of `table` (each exactly once). */
__device__ __forceinline__ void mk_pages_release(mk_u32* free_mask, const mk_u8* table, mk_u32 n)
{
    mk_u32 f = *free_mask;
    for (mk_u32 i = 0; i < n; ++i)
        f |= 1u << table[i];
    *free_mask = f;
}

#endif /* MEGAK_PAGES_CUH */
