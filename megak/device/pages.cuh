/* megak: the block's dynamic shared memory: control area, page array, page allocator.
 *
 *   mk_smem (dynamic, 16-B aligned at least)
 *   +------------------------------------------+---------+--------+--------+-----+----------+
 *   | mk_control (<= MK_CONTROL_BYTES)         | slack   | page 0 | page 1 | ... | page n-1 |
 *   |  slot[MK_SLOTS]: record, operands, pages | to next | 16 KiB | 16 KiB |     |          |
 *   |  mbarriers full[MK_SLOTS], empty[...]    | 1 KiB   |        |        |     |          |
 *   |                                          | boundary|        |        |     |          |
 *   |  params copy, allocator bitmask, trace   |         |        |        |     |          |
 *   +------------------------------------------+---------+--------+--------+-----+----------+
 *
 * Page life: the loader warp acquires an instruction's pages (lowest free first, in queue
 * order, waiting while the running instruction still holds them), fills the first stages, and
 * the compute warps hand the pages back in the order the op's page plan declares (an early
 * group after the k loop, the rest after the op). megak/page_plan.py is the same plan in
 * Python; the simulator checks it.
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

/* MK_WGMMA_ONLY=1 (a -D define, a separately compiled variant that runtime/executor.py picks):
 * the megakernel for a program whose every instruction is a wgmma GEMM tile with tensor maps
 * (ops/gemm_wgmma.cuh) or a split-K reduce of such tiles' partials (ops/reduce.cuh). ptxas serialises wgmma.mma_async, each MMA waiting for the one before,
 * in any function that is called (C7510) and wherever MMAs may be in flight at a branch it
 * cannot prove uniform that reads the accumulators or calls a function (C7518). The op bodies
 * are called functions, so the general kernel's MMAs are serialised (the probe: 675 against
 * 753 TFLOP/s on 8192^3). This variant inlines the compute loop and that one body into the
 * kernel entry and ptxas pipelines the MMAs. The one other op is the reduce, a called body
 * on a branch of its own in which no accumulator is live (ptxas still pipelines: the compile
 * test checks the SASS); it lets a split-K GEMM, and the epilogue its reduce runs, take this
 * kernel (measured 1.33x faster than the general one on 128 x 4096 x 4096 + bias + gelu,
 * split in 8). It holds the
 * entry megakernel only; the resident and separate-launch entries are the general kernel's. */
#ifndef MK_WGMMA_ONLY
#define MK_WGMMA_ONLY 0
#endif
/* MK_WGMMA_ONLY=2: the same variant for programs whose every tile is at most MK_WGMMA_NARROW_N
 * (128) columns wide: per k16 step one m64n128k16 on the stage's first B page, whose two
 * boxes are all the loader copies; 64 accumulators per thread. The n256 loop would spend half
 * its tensor time on columns such a tile does not have. */
#define MK_WGMMA_NARROW (MK_WGMMA_ONLY == 2)

/* Base of the block's dynamic shared memory: the control area, then the pages. 16-B alignment
 * is what cp.async of records needs; pages are aligned by hand (mk_page_array). */
extern __shared__ __align__(16) unsigned char mk_smem[];

/* One instruction slot: the record, the descriptors of its operands (resolved from the
 * tensor table by the loader, so ops read them from shared memory instead of paying a global
 * round trip), the pages the instruction holds, and the loader's verdict. The loader fills a
 * slot and arrives on its `full` barrier; the compute warps run it and arrive on `empty`. */
struct mk_slot {
    mk_instr ins;                        /* offset 0: 16-B aligned for cp.async */
    mk_tensor operand[MK_MAX_TENSORS];   /* operand[MK_ARG_x] = tensors[ins.tensor[MK_ARG_x]] */
    mk_u8 page[MK_MAX_PAGES];            /* page indices, in acquisition order */
    mk_u32 preloaded;                    /* leading stages the loader filled (mk_pages) */
    mk_u32 released;                     /* table positions the op handed back early */
    mk_u32 stop;                         /* the loader stopped here (error or abort) */
    mk_u32 pages_in_use;                 /* pages held on the SM once this one acquired (trace) */
    mk_u64 t_loader[3];                  /* MK_TRACE: fetch, waited, acquired (loader clock) */
    mk_u32 stream_pos;                   /* weight stream (stream.cuh): first stage position;
                                            MK_WGMMA_ONLY: the wgmma ring's */
    mk_u32 stream_stages;                /* and stage count of this instruction; 0: none */
};

/* What a stopping block reports about itself. */
struct mk_stop_info {
    mk_u32 error, queue_index, opcode, op_index, counter, expected, observed;
};

/* Instruction q's slot, and the phase of that slot's full and empty barriers that q completes:
 * the slot's (q / MK_SLOTS)-th use. A waiter can be at most one phase off (the slot's previous
 * use completed before the loader refilled it, its next use cannot have begun), so the parity
 * names the phase. */
__device__ __forceinline__ mk_u32 mk_slot_of(mk_u32 q) { return q % (mk_u32)MK_SLOTS; }
__device__ __forceinline__ mk_u32 mk_slot_parity(mk_u32 q) { return (q / (mk_u32)MK_SLOTS) & 1u; }

struct mk_control {
    mk_slot slot[MK_SLOTS];   /* instruction q lives in slot[mk_slot_of(q)] */
    mk_u64 full[MK_SLOTS];    /* mbarrier: slot ready (record, pages, waits, preloaded bytes) */
    mk_u64 empty[MK_SLOTS];   /* mbarrier: the compute warps are done with the slot */
    mk_u64 request_ready;  /* resident kernel, mbarrier: thread 0 has set the block up for
                              the next request (1 arrival) */
    mk_u64 request_done;   /* resident kernel, mbarrier: every other thread of both roles
                              is done with it (MK_JOIN_THREADS - 1 arrivals) */
    mk_params params;    /* copied once: the hot paths read shared, not global, memory and
                            the op code holds no registers for it */
    mk_u32 free_pages;   /* allocator: bit i set = page i free (loader takes, compute gives) */
    mk_stop_info loader_stop;          /* the loader's error details (lane 0) */
    mk_u32 n, q_begin;                 /* this SM's queue: length, first record's index */
    mk_u32 ticket;                     /* this invocation's ticket (mk_finish_invocation) */
    mk_u32 request;                    /* resident kernel: what this block does with the
                                          request just read (MK_REQUEST_*) */
    mk_u64 trace_t[MK_TRACE_PHASES];   /* MK_TRACE: compute-side phase times of the running op */
    /* the weight ring (stream.cuh): slot i's page holds a stage (full), the compute warps are
     * done with it (empty) */
    mk_u64 ring_full[MK_STREAM_MAX_RING];
    mk_u64 ring_empty[MK_STREAM_MAX_RING];
    mk_u32 ring_issued[MK_STREAM_MAX_RING];   /* the position last issued into slot i */
    mk_u32 ring_inited;                /* ring barriers initialised for this invocation */
    mk_u32 ring_stop;                  /* a compute role left early: the streamer drains */
    mk_u32 stream_hold;                /* a streamed instruction's tail: the streamer holds
                                          its next copies (stream.cuh, "The hold") */
    mk_u32 stream_last;                /* gemm_stream: this block finished its band's combine */
    mk_u32 stream_error;               /* gemm_stream: a ring wait passed its deadline */
    mk_stop_info op_stop;              /* an op's failed poll of a flagged word (flag.cuh);
                                          error MK_OK while none failed */
    /* the wgmma GEMM's ring (ops/gemm_wgmma.cuh): stage slot i landed (full), every compute
     * warp is done reading it (empty); initialised again for each instruction by its issuer
     * (the loader warp, or the op's thread 0 in the separate-launch entry), once per queue in
     * MK_WGMMA_ONLY's chained ring */
    mk_u64 wgmma_full[MK_WGMMA_STAGES];
    mk_u64 wgmma_empty[MK_WGMMA_STAGES];
    mk_u32 wgmma_inited;               /* the wgmma barriers are valid (invalidate first) */
    /* the paged transpose (ops/transpose.cuh): the tile of slot i's record has landed;
     * initialised again for each paged record by the loader (bit i of transpose_inited: valid,
     * invalidate first) */
    mk_u64 transpose_full[MK_SLOTS];
    mk_u32 transpose_inited;
    /* MK_WGMMA_ONLY's chained ring (megakernel.cu, mk_loader_ring_pages): the pages it took
     * for the whole queue (held), and the loader's next ring position */
    mk_u32 wgmma_held, wgmma_pos;
    mk_u8 wgmma_page[MK_WGMMA_PAGES];
    /* the first MK_TABLE_HEAD entries of the invocation's tensor table, copied by the loader
     * at a launch's entry (megakernel.cu, mk_loader's first_fetched; the resident kernel reads
     * every descriptor from global memory) */
    alignas(16) mk_tensor table_head[MK_TABLE_HEAD];
    /* their tensor maps' ready words (instr.h), copied with them where the build holds the
     * paged transpose, which checks its A's at L3 (ops/transpose.cuh): a global read there
     * took 0.5 us of every record's path; valid for the first ready_head_n slots (0 in the
     * resident kernel), which only the loader warp reads */
    alignas(16) mk_u32 ready_head[MK_TABLE_HEAD];
    mk_u32 ready_head_n;
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

/* Compute warps only (threads 0 .. MK_THREADS-1): a barrier among them. The loader warp never
 * joins it, so the ops must use this instead of __syncthreads() (barrier 0 counts every
 * thread of the block). In the separate-launch entry the block is exactly the compute warps. */
enum { MK_COMPUTE_BARRIER = 1 };

__device__ __forceinline__ void mk_compute_sync()
{
    asm volatile("bar.sync %0, %1;" : : "n"((int)MK_COMPUTE_BARRIER), "n"((int)MK_THREADS) : "memory");
}

/* The same barrier, returning whether `v` holds in every compute thread: an op whose threads
 * each wait with their own deadline agrees on the outcome here, so all of them go on to its
 * later barriers or none does. */
__device__ __forceinline__ bool mk_compute_sync_all(bool v)
{
    mk_u32 all;
    asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.and.pred q, %2, %3, p;"
                 " selp.u32 %0, 1, 0, q; }"
                 : "=r"(all) : "r"((mk_u32)v), "n"((int)MK_COMPUTE_BARRIER), "n"((int)MK_THREADS)
                 : "memory");
    return all != 0u;
}

/* The pages one instruction holds, as the ops see them: pages[i] is its i-th page.
 *
 * preloaded: how many of the op's leading pipeline stages the loader warp already filled
 *   (mk_<op>_preload); they have landed when the op starts. 0 in the separate-launch entry.
 * release(first, end): the op hands pages [first, end) of its table back early, in the order
 *   its page plan declares (megak/page_plan.py mirrors it), so the loader can give them to the
 *   next instruction while this one finishes. Called by all compute threads right after a
 *   mk_compute_sync() that ended every read and write of those pages; thread 0 does it. The
 *   interpreter releases whatever is left after the op. No-op without a loader. */
struct mk_pages {
    unsigned char* base;   /* page 0 of the page array */
    const mk_u8* idx;      /* the slot's page table */
    mk_u32 preloaded;
    mk_u32* released;      /* the slot's mask of table positions already handed back; or null */
    mk_u32* free_mask;     /* the allocator's mask of free physical pages; or null */
    mk_u32 stream_pos;     /* weight stream: the op's first stage position (stream.cuh) */
    mk_u32 stream_stages;  /* and how many stages the streamer delivers; 0: the op loads B */

    __device__ __forceinline__ float* operator[](int i) const
    {
        return reinterpret_cast<float*>(base + (mk_u32)idx[i] * (mk_u32)MK_PAGE_BYTES);
    }

    __device__ __forceinline__ void release(mk_u32 first, mk_u32 end) const;
};

/* Physical page bits of table positions [first, end). */
__device__ __forceinline__ mk_u32 mk_page_bits(const mk_u8* table, mk_u32 first, mk_u32 end)
{
    mk_u32 bits = 0;
    for (mk_u32 i = first; i < end; ++i)
        bits |= 1u << table[i];
    return bits;
}

/* The allocator mask is shared by two roles: the loader takes pages (atomic and), the compute
 * warps give them back (atomic or). The give-back is a release at block scope and the loader's
 * read an acquire: every compute-warp access to a page (ordered before the or by the compute
 * barrier) happens before the loader's cp.async writes into it for the next instruction. */
__device__ __forceinline__ void mk_pages_give_back(mk_u32* free_mask, mk_u32 bits)
{
    asm volatile("red.release.cta.shared::cta.or.b32 [%0], %1;"
                 : : "r"(mk_smem_addr(free_mask)), "r"(bits) : "memory");
}

__device__ __forceinline__ mk_u32 mk_pages_free_now(const mk_u32* free_mask)
{
    mk_u32 v;
    asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];"
                 : "=r"(v) : "r"(mk_smem_addr(free_mask)) : "memory");
    return v;
}

__device__ __forceinline__ void mk_pages::release(mk_u32 first, mk_u32 end) const
{
    if (threadIdx.x != 0 || released == nullptr || first >= end)
        return;
    const mk_u32 mask = (end >= 32 ? 0xffffffffu : ((1u << end) - 1u)) & ~((1u << first) - 1u);
    const mk_u32 fresh = mask & ~*released;   /* each page once */
    *released |= fresh;
    mk_u32 bits = 0;
    for (mk_u32 i = first; i < end; ++i)
        if ((fresh >> i) & 1u)
            bits |= 1u << idx[i];
    mk_pages_give_back(free_mask, bits);
}

/* What the loader warp preloads for an op (mk_<op>_preload(in, op, pages, lane, parts, q), q
 * the record's position in the queue):
 * the parts of its first pipeline stages that come from operand B (before the dependency wait
 * when the record has MK_FLAG_B_READY: B has no producer in the graph, e.g. weights) and from
 * the other operands (after the wait). The op says how many stages the loader fills with
 * mk_<op>_preload_stages(in, op). It issues cp.async copies (no commit, no wait: the
 * interpreter waits for them before it hands the slot over) and returns 1, or bulk copies that
 * complete on the op's own barriers (the wgmma GEMM, the paged transpose) and returns 0: the
 * interpreter does not wait for those. */
enum mk_preload_parts { MK_PRELOAD_B = 1, MK_PRELOAD_REST = 2 };

/* Loader lane 0. Take the `n` lowest free pages into `table` if that many are free (else
 * nothing is taken and false comes back). Only the loader clears bits and the compute warps
 * only set them, so a plain atomic and after the acquire-read is enough. */
__device__ __forceinline__ bool mk_pages_try_acquire(mk_u32* free_mask, mk_u8* table, mk_u32 n)
{
    mk_u32 f = mk_pages_free_now(free_mask);
    if ((mk_u32)__popc(f) < n)
        return false;
    mk_u32 taken = 0;
    for (mk_u32 i = 0; i < n; ++i) {
        const mk_u32 p = (mk_u32)__ffs(f) - 1u;
        f &= f - 1u;                    /* clear the lowest set bit: page p is taken */
        taken |= 1u << p;
        table[i] = (mk_u8)p;
    }
    atomicAnd(free_mask, ~taken);
    return true;
}

#endif /* MEGAK_PAGES_CUH */
