/* megak instruction ABI: the one source of truth shared by Python (cffi, megak/abi.py) and
 * CUDA (NVRTC, megakernel.cu).
 *
 * Rules for this file, so that cffi can read it after abi.py drops every line starting with '#':
 *   - plain C declarations only: typedefs, enums, structs; enum values are integer literals or
 *     expressions of earlier enum constants with + - * << | (cffi evaluates those);
 *   - every constant Python and CUDA share lives in an enum here and nowhere else (cffi reads
 *     enum values without compiling): tile and stage sizes, preload depths, operand masks;
 *   - fixed-width types come from the typedefs below (NVRTC has no <stdint.h>).
 *
 * Record layout (128 bytes, see MK_INSTR_BYTES):
 *
 *   0  opcode  n_waits  n_signals  pages   (u16 x 4)
 *   8  op_index (graph op, for errors/trace)          12 flags (MK_FLAG_*)
 *  16  wait_counter[5]                                 36 wait_target[5]
 *  56  signal_counter[4]                               72 tensor[6] (tensor-table slots)
 *  96  row0 col0 rows cols   (region)                 112 k0 klen (reduction range)
 * 120  out_row0 param (fp32 bits of the op's scalar)
 *
 * Counters are u32 in device memory. A wait (c, t) is satisfied in run `epoch` (0, 1, ...)
 * when counter[c] - (epoch + 1) * t >= 0 (wrap-safe signed difference): every counter receives
 * exactly t signals per run from the instructions that name it, so replays need no reset.
 */
#ifndef MEGAK_INSTR_H
#define MEGAK_INSTR_H

typedef unsigned short mk_u16;
typedef unsigned int mk_u32;
typedef int mk_i32;
typedef unsigned long long mk_u64;

enum mk_limits {
    MK_INSTR_BYTES = 128,      /* sizeof(mk_instr); checked on both sides */
    MK_MAX_WAITS = 5,          /* waits per instruction */
    MK_MAX_SIGNALS = 4,        /* counters signalled per instruction */
    MK_MAX_TENSORS = 6,        /* tensor operands per instruction */
    MK_PAGE_BYTES = 16384,     /* one shared-memory page */
    MK_MAX_PAGES = 32,         /* page bitmask width; real count comes from the device */
    MK_CONTROL_BYTES = 16384,  /* dynamic smem ahead of the pages: slots, page table, scratch */
    MK_PAGE_ALIGN = 1024,      /* page base alignment (swizzled TMA tiles need 1024) */
    MK_THREADS = 256,          /* compute threads: what every op runs on (warps 0-7) */
    MK_BLOCK_THREADS = 384,    /* megakernel block: the compute warps + one warpgroup whose first
                                  warp is the loader (setmaxnreg moves registers per warpgroup) */
    MK_TENSOR_ALIGN_BYTES = 16, /* rows of megak-owned buffers start 16-B aligned (ld padded) */
    MK_SLOTS = 2,              /* instruction slots per block (pages.cuh): the loader fills up
                                  to q + MK_SLOTS - 1 while the compute warps run q. Two: the
                                  paged transpose (W4-16384-fp32) ran 639 us on two and 702 on
                                  three; W1 and the W2 rows within 1% (benchmarks/ANALYSIS.md) */
    MK_TABLE_HEAD = 40         /* tensor table entries a launched block's loader copies to shared
                                  memory at entry (megakernel.cu), with as many ready words;
                                  every table the host makes holds at least this many of
                                  each (abi.table_bytes) */
};

/* Tile shapes, stage sizes and page needs of each op: lowering, page plans (Python) and the
 * device ops read these. */
enum mk_op_shapes {
    MK_GEMM_TILE_M = 128,
    MK_GEMM_TILE_N = 128,
    MK_GEMM_PAGES = 4,         /* fp32: double-buffered A^T and B k-slices, one page each */
    MK_GEMM_BK = 32,           /* fp32: k per stage */
    MK_GEMM_BF16_PAGES = 4,    /* bf16 (tensor cores): 4-stage cp.async ring, a 32-deep k slice
                                  of A and B per page; must stay <= MK_GEMM_PAGES */
    MK_GEMM_BF16_BK = 32,      /* bf16: k per stage (one page) */
    MK_GEMM_BF16_PRELOAD_STAGES = MK_GEMM_BF16_PAGES - 1,
                               /* the loader fills at most this many stages: the op must find one
                                  empty to issue its next load into when it starts */
    MK_GEMM_F32_SHORT_ROWS = 16, /* fp32: a tile of at most this many rows multiplies only its
                                  rows (ops/gemm_f32_short.cuh), B through a cp.async ring */
    MK_GEMM_F32_SHORT_STAGES = 3, /* its B stages, one page each; its A slices share the 4th */
    MK_GEMM_F32_SHORT_PRELOAD_STAGES = MK_GEMM_F32_SHORT_STAGES - 1,
                               /* the loader fills at most this many (as for bf16) */
    MK_GEMM_STAGE_ROWS = 32,   /* epilogue: staging rows of 128 fp32 per page, so a tile of
                                  fewer rows keeps fewer pages for its epilogue */
    MK_TRANSPOSE_TILE = 128,   /* 128 x 128 fp32 output region per instruction (64 KiB) */
    MK_TRANSPOSE_PAGES = 4,    /* the tile, copied in by the loader one instruction ahead */
    MK_TRANSPOSE_BOX_COLS = 32, /* fp32 columns of a box of the tile (128 B: the 128-B swizzle's
                                  span), all MK_TRANSPOSE_TILE rows: one page */
    MK_TRANSPOSE_READY = 131072 + 128, /* the ready word of a transpose's A and OUT maps: 2^17 +
                                  their box rows (MK_TRANSPOSE_TILE); fp32, MK_TRANSPOSE_BOX_COLS
                                  columns, the 128-B swizzle */
    MK_COPY_PAGES = 0,         /* register pipeline: 64 KiB of loads in flight per SM */
    MK_COPY_TAKE_UNITS = 512,  /* a copy taker warp's band (MK_FLAG_COPY_TAKE): float4 units of
                                  the region's body, 16 per lane (8 KiB) */
    MK_COPY_TAKE_WARPS = 8,    /* the warps of a taker that take bands: every compute warp */
    MK_REDUCE_PAGES = 0,       /* global -> registers -> global */
    MK_REDUCE_MAX_ROWS = 128,
    MK_REDUCE_MAX_COLS = 128,  /* one warp row: 32 lanes x 4 columns */
    MK_ADD_PAGES = 0,          /* elementwise, registers only */
    MK_ROWWISE_PAGES = 0,      /* softmax / layernorm / rmsnorm: a warp per row, the row read
                                  from global memory once per pass (any width, no pages) */
    MK_SOFTMAX_PAGES = MK_ROWWISE_PAGES,
    MK_LAYERNORM_PAGES = MK_ROWWISE_PAGES,
    MK_RMSNORM_PAGES = MK_ROWWISE_PAGES,
    /* the weight stream (ops/gemm_stream.cuh): one unit = one TMA box = one page */
    MK_STREAM_BOX_COLS = 64,   /* columns of B per box (128 B of bf16: the 128-B swizzle span) */
    MK_STREAM_BOX_ROWS = 128,  /* k-rows per box: 64 x 128 bf16 = MK_PAGE_BYTES */
    MK_STREAM_M = 64,          /* rows of A a streamed GEMM takes */
    MK_STREAM_TILE_M = 32,     /* rows one streamed instruction takes (2 m16 MMA tiles); a GEMM
                                  of more rows has two row bands, each streaming B */
    MK_STREAM_PAGES = 3,       /* the op's own pages: 0-1 the A ring of the k loop and 2 B's
                                  box where the ring cannot deliver it; then 0 staging and 1-2
                                  the 8 warps' partials */
    MK_STREAM_MIN_RING = 2,    /* a program streams weights only with at least this many ring
                                  pages left over by its other instructions */
    MK_STREAM_MAX_RING = 12,   /* ring pages a block can track (mbarrier pairs in mk_control) */
    MK_STREAM_NARROW_COLS = 32, /* columns of a narrow band (MK_FLAG_STREAM_NARROW): a box row
                                  is 64 B, the 64-B swizzle span; two boxes make a page */
    MK_STREAM_NARROW_READY = 65536 + 128, /* the ready word of a narrow map: 2^16 + its box
                                  rows (MK_STREAM_BOX_ROWS) */
    MK_STREAM_F32_COLS = 32,   /* columns of an fp32 band (MK_FLAG_STREAM_F32): a box row is
                                  128 B of fp32, the 128-B swizzle span; one box of
                                  MK_STREAM_BOX_ROWS k-rows is a page, the transpose's box
                                  (its map's ready word is MK_TRANSPOSE_READY) */
    MK_STREAM_PACKED_READY = 262144 + 128, /* the ready word of a constant B packed for wide
                                  bands (2^18 + box rows): its map slot holds an mk_packed_b, a
                                  band of MK_STREAM_BOX_COLS columns is one run of pages, each
                                  a stage as the 128-B swizzle lays it out */
    MK_STREAM_PACKED_NARROW_READY = 262144 + 65536 + 128, /* the same for narrow bands: pages
                                  of two 32-column boxes stacked, each as the 64-B swizzle
                                  lays it out */
    MK_STREAM_READERS = 2,     /* arrivals that free a ring page: a stage is read by one warp
                                  per m16 tile of its instruction (each its share of the box's
                                  k-rows), or per box of a narrow band's stage; the one reader
                                  of a one-tile stage arrives twice */
    MK_TMAP_BYTES = 128,       /* one CUtensorMap in the binding's table (128-B aligned) */
    /* the Hopper bf16 GEMM (ops/gemm_wgmma.cuh, MK_FLAG_WGMMA): a 128 x 256 tile, k-blocks of
     * 64 through a ring of stages of 3 pages (A's box of 128 rows x 64 k, B's 4 boxes of 64 k
     * x 64 columns), filled by TMA and read by wgmma */
    MK_WGMMA_TILE_M = 128,
    MK_WGMMA_TILE_N = 256,
    MK_WGMMA_NARROW_N = 128,   /* columns of a narrow wgmma tile (the lowering's choice for
                                  GEMMs of few tiles; MK_WGMMA_ONLY=2 builds run them) */
    MK_WGMMA_BK = 64,
    MK_WGMMA_STAGES = 4,
    MK_WGMMA_PAGES = 3 * MK_WGMMA_STAGES,
    MK_WGMMA_B_BOX_ROWS = 64   /* k-rows of B's box (64 x 64 bf16 = 8 KiB); A's box is the
                                  weight stream's (MK_STREAM_BOX_ROWS rows) */
};

enum mk_opcode {
    MK_OP_NOP = 0,
    MK_OP_COPY = 1,
    MK_OP_TRANSPOSE = 2,
    MK_OP_GEMM = 3,
    MK_OP_REDUCE = 4,          /* sum of split-K partials + the GEMM epilogue */
    MK_OP_ADD = 5,             /* out = A + B, B of A's shape or one row broadcast over rows */
    MK_OP_SOFTMAX = 6,         /* row-wise softmax of param * A (MK_FLAG_CAUSAL: j > i masked) */
    MK_OP_LAYERNORM = 7,       /* (A - mean) / sqrt(var + param) * B + BIAS, per row */
    MK_OP_RMSNORM = 8,         /* A / sqrt(mean(A^2) + param) * B, per row */
    MK_OP_COUNT = 9
};

/* Tensor operand positions in mk_instr.tensor[] */
enum mk_operand {
    MK_ARG_A = 0,        /* first input (copy/transpose source, GEMM left) */
    MK_ARG_B = 1,        /* GEMM right */
    MK_ARG_OUT = 2,      /* output */
    MK_ARG_BIAS = 3,     /* GEMM epilogue bias (1 x N), read with MK_FLAG_BIAS */
    MK_ARG_RESIDUAL = 4, /* GEMM epilogue residual (M x N), read with MK_FLAG_RESIDUAL */
    MK_ARG_SPARE = 5
};

/* Operand positions each opcode reads or writes: the loader prefetches and validates exactly
 * these descriptors (every one must name a valid tensor slot, used by the record or not). */
enum mk_op_operands {
    MK_COPY_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_OUT),
    MK_TRANSPOSE_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_OUT),
    MK_GEMM_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_B) | (1 << MK_ARG_OUT) | (1 << MK_ARG_BIAS) |
                       (1 << MK_ARG_RESIDUAL) | (1 << MK_ARG_SPARE),   /* spare: partials of a
                                                                         streamed GEMM */
    MK_REDUCE_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_OUT) | (1 << MK_ARG_BIAS) |
                         (1 << MK_ARG_RESIDUAL),
    MK_ADD_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_B) | (1 << MK_ARG_OUT),
    MK_SOFTMAX_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_OUT),
    MK_LAYERNORM_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_B) | (1 << MK_ARG_BIAS) | (1 << MK_ARG_OUT),
    MK_RMSNORM_OPERANDS = (1 << MK_ARG_A) | (1 << MK_ARG_B) | (1 << MK_ARG_OUT)
};

enum mk_flags {
    MK_FLAG_NONE = 0,
    /* test-only hooks: the simulator and the device both honour them */
    MK_FLAG_DEBUG_LEAK_PAGE = 1,  /* do not release the last acquired page */
    /* GEMM epilogue, fused: out = act(acc + bias) + residual, in fp32, then rounded to the
     * output's dtype. bias = tensor[MK_ARG_BIAS] (1 x N), residual = tensor[MK_ARG_RESIDUAL]
     * (M x N), each fp32 or bf16. */
    MK_FLAG_BIAS = 2,
    MK_FLAG_RESIDUAL = 4,
    MK_FLAG_ACT_SHIFT = 4,        /* activation (enum mk_activation) in bits 4..7 */
    MK_FLAG_ACT_MASK = 240,
    MK_FLAG_B_READY = 256,        /* operand B has no producer in this graph: the loader may load it
                                     before the waits */
    MK_FLAG_CAUSAL = 512,         /* softmax: column j of row i is masked out where j > i */
    MK_FLAG_STREAM = 1024,        /* GEMM, bf16 (fp32 with MK_FLAG_STREAM_F32), B a graph input
                                     (with MK_FLAG_B_READY): B comes through the block's weight
                                     ring (ops/gemm_stream.cuh). Such
                                     a record's param is parts << 16 | part: its k range is part
                                     `part` of `parts` of its column band; with parts > 1,
                                     tensor[MK_ARG_SPARE] is the fp32 partials tensor (part p's
                                     rows at p * MK_STREAM_M + row0) and out_row0 the band's
                                     combine counter (the output rows start at row0) */
    MK_FLAG_WGMMA = 2048,         /* GEMM, bf16: one MK_WGMMA_TILE_M x MK_WGMMA_TILE_N tile on
                                     wgmma, A and B through TMA (ops/gemm_wgmma.cuh); cols <=
                                     MK_WGMMA_TILE_N, MK_WGMMA_PAGES pages */
    MK_FLAG_STREAM_NARROW = 4096, /* with MK_FLAG_STREAM: a band of at most
                                     MK_STREAM_NARROW_COLS columns and one m16 tile, whose ring
                                     stage is two boxes of 32 columns x 128 k-rows (64-B
                                     swizzle) stacked in k, from a map whose ready word is
                                     MK_STREAM_NARROW_READY (else the GEMM loads B itself) */
    MK_FLAG_STREAM_F32 = 8192,    /* with MK_FLAG_STREAM (not _NARROW): an fp32 band of at most
                                     MK_STREAM_F32_COLS columns and one m16 tile, A, B and the
                                     partials fp32, whose ring stage is one box of 32 columns x
                                     128 k-rows (128-B swizzle) from a map whose ready word is
                                     MK_TRANSPOSE_READY (else the GEMM loads B itself); FMAs,
                                     not MMAs (ops/gemm_stream_f32.cuh) */
    MK_FLAG_COPY_TAKE = 16384     /* copy: taker param of k0 sharing its whole region, whose
                                     body is bands of MK_COPY_TAKE_UNITS float4 units handed
                                     out in turn to its warps by counter out_row0; a run adds
                                     bands + MK_COPY_TAKE_WARPS * takers to it (ops/copy.cuh) */
};

/* A build's op bodies: the megakernel compiled with -DMK_BODIES=<mask> holds only the bodies
 * in the mask, so an SM's instruction cache (96-128 KiB, benchmarks/ANALYSIS.md) holds the
 * interpreter and what the program runs, not every op. Bit `opcode` for each opcode (NOP's
 * bit 0 is always built); a GEMM record also needs the bit of its path. A record of an op
 * the build lacks fails validation with MK_ERR_BAD_OPCODE, a GEMM record of a path it lacks
 * its record check (MK_ERR_BAD_DESCRIPTOR). Without MK_BODIES every body is built. The
 * runtime builds each program's kernel with the bodies of its records (ops/<op>.py,
 * OpDef.bodies), and the resident kernel with those of the programs it serves (-DMK_RESIDENT:
 * a build holds megakernel_resident only where asked, or with every body). */
enum mk_bodies {
    MK_BODY_GEMM_TILED = 1 << 16,   /* fp32 and bf16 tiles (ops/gemm.cuh, gemm_bf16.cuh) */
    MK_BODY_GEMM_STREAM = 1 << 17,  /* MK_FLAG_STREAM (ops/gemm_stream.cuh) */
    MK_BODY_GEMM_WGMMA = 1 << 18,   /* MK_FLAG_WGMMA (ops/gemm_wgmma.cuh) */
    MK_BODY_STREAM_PACKED = 1 << 19, /* streamed B packed for the stream (a constant's pages,
                                        mk_packed_b): stages by 1-D bulk copies, every reader
                                        lane handing its page back (stream.cuh). A build
                                        without it streams no packed B: such a record loads
                                        B itself, from the row-major copy */
    MK_BODY_COPY_TAKE = 1 << 20      /* MK_FLAG_COPY_TAKE (ops/copy.cuh): a build without it
                                        refuses a taker's record (its record check) */
};
#ifndef MK_BODIES
#define MK_BODIES 0xffffffffu
#ifndef MK_RESIDENT
#define MK_RESIDENT 1
#endif
#endif
/* whether this build holds the bodies `bits` (code under a false one is never compiled in) */
#define MK_BUILT(bits) (((MK_BODIES) & (bits)) != 0u)

enum mk_activation {
    MK_ACT_NONE = 0,
    MK_ACT_RELU = 1,
    MK_ACT_GELU = 2,              /* tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    MK_ACT_SILU = 3,              /* x / (1 + exp(-x)) */
    MK_ACT_COUNT = 4
};

enum mk_dtype {
    MK_DTYPE_F32 = 0,
    MK_DTYPE_BF16 = 1,            /* GEMM operands on tensor cores, fp32 accumulation */
    MK_DTYPE_F32_FLAG = 2         /* fp32 as data that is its own flag (device/flag.cuh): one
                                     64-bit word per element, the value's bits low, the stamp
                                     of the invocation that wrote it high; ld in words. Only
                                     megak-owned intermediates the scheduler picks, read and
                                     written only by ops with OpDef.flag_io */
};

/* sm_state.counter of a compute warp that polled a flagged word past its deadline: this bit |
 * the tensor slot (expected: the stamp it waited for, observed: the stamp it saw) */
enum mk_flag_wait { MK_FLAG_WAIT = 1073741824 };

enum mk_error {
    MK_OK = 0,
    MK_ERR_TIMEOUT = 1,        /* a wait passed its deadline: a hang */
    MK_ERR_BAD_OPCODE = 2,
    MK_ERR_BAD_DESCRIPTOR = 3, /* tensor slot, region or counter out of range */
    MK_ERR_PAGES = 4,          /* instruction needs more pages than the SM has */
    MK_ERR_PAGE_LEAK = 5,      /* pages still held at the end of a queue */
    MK_ERR_ABORTED = 6         /* this SM stopped because another one failed */
};

typedef struct mk_instr {
    mk_u16 opcode;
    mk_u16 n_waits;
    mk_u16 n_signals;
    mk_u16 pages;
    mk_u32 op_index;
    mk_u32 flags;
    mk_u32 wait_counter[MK_MAX_WAITS];
    mk_u32 wait_target[MK_MAX_WAITS];
    mk_u32 signal_counter[MK_MAX_SIGNALS];
    mk_u32 tensor[MK_MAX_TENSORS];
    mk_i32 row0;
    mk_i32 col0;
    mk_i32 rows;
    mk_i32 cols;
    mk_i32 k0;
    mk_i32 klen;
    mk_i32 out_row0;      /* output row of the region's first row (GEMM, REDUCE); = row0
                             except for split-K partials, which land in their split's rows */
    mk_u32 param;         /* the op's fp32 scalar as bits: softmax scale, norm epsilon */
} mk_instr;

/* A constant B in the weight stream's page order (MK_STREAM_PACKED_READY or
 * MK_STREAM_PACKED_NARROW_READY in ready[i]), in map slot i instead of a CUtensorMap: stage s
 * of column band b (b = col0 / band columns, s from k0 / stage rows) is the MK_PAGE_BYTES
 * page at ptr + (b * stages + s) * MK_PAGE_BYTES, zeros past the tensor. The entry's own ptr
 * stays the row-major copy, which every other reader uses (megak/runtime/packed_weights.py
 * writes both). */
typedef struct mk_packed_b {
    mk_u64 ptr;
    mk_u32 bands;       /* column bands: ceil(cols / band columns) */
    mk_u32 stages;      /* pages per band: ceil(rows / stage rows) */
} mk_packed_b;

/* One entry of the tensor table: a row-major 2-D view with leading dimension ld (elements).
 *
 * A tensor table of n entries is followed, in the same buffer, by the tensor maps of its TMA
 * operands: at byte offset mk_tmap_offset(n) = 24 n rounded up to MK_TMAP_BYTES,
 * CUtensorMap[n] (entry i encodes tensor i: dims {cols, rows}, row stride ld elements, zero
 * fill out of bounds; a GEMM operand's bf16 with box {MK_STREAM_BOX_COLS, box rows} and the
 * 128-B swizzle, a transpose's A and OUT fp32 with box {MK_TRANSPOSE_BOX_COLS, MK_TRANSPOSE_TILE}
 * and the 128-B swizzle), then mk_u32 ready[n]: which box map i was encoded with for this table
 * (MK_STREAM_BOX_ROWS: B of a streamed GEMM or A of a wgmma GEMM; MK_WGMMA_B_BOX_ROWS: B of a
 * wgmma GEMM; MK_STREAM_NARROW_READY: B of a narrow streamed band; MK_TRANSPOSE_READY: A or OUT
 * of a transpose; MK_STREAM_PACKED_READY / MK_STREAM_PACKED_NARROW_READY: a constant B of
 * streamed bands, its slot an mk_packed_b instead of a map), 0 where it was not (not 16-B
 * aligned, or not needed: the op then loads the operand itself). runtime/tensor_maps.py
 * writes them. */
typedef struct mk_tensor {
    mk_u64 ptr;
    mk_u32 rows;
    mk_u32 cols;
    mk_u32 ld;
    mk_u32 dtype;
} mk_tensor;

/* What a block was doing when it stopped; one per SM, written on error or abort. */
typedef struct mk_sm_state {
    mk_u32 queue_index;
    mk_u32 opcode;
    mk_u32 op_index;
    mk_u32 counter;
    mk_u32 expected;
    mk_u32 observed;
    mk_u32 error;
    mk_u32 pad;
} mk_sm_state;

/* The first error wins the record; abort tells every other block to stop. */
typedef struct mk_status {
    mk_u32 abort;
    mk_u32 error;
    mk_u32 sm;
    mk_u32 queue_index;
    mk_u32 opcode;
    mk_u32 op_index;
    mk_u32 counter;
    mk_u32 expected;
    mk_u32 observed;
    mk_u32 finished_blocks;
} mk_status;

/* Kernel parameter block, in device memory, written once per program (and per traced run).
 * The kernel takes a pointer to it, the tensor table of this launch's binding and the launch's
 * ticket, all by value (and queue_start and run_state again, so that a block's set-up need not
 * read this block first): a launch carries no per-run data through memory, so it needs no
 * copy before it and can be captured in a CUDA graph. */
typedef struct mk_params {
    mk_u64 instrs;        /* mk_instr[total]: all queues back to back */
    mk_u64 queue_start;   /* mk_u32[n_sm + 1]: queue s is instrs[start[s] .. start[s+1]) */
    mk_u64 tensors;       /* mk_tensor[n_tensors]: megak's own table (a launch passes its own) */
    mk_u64 counters;      /* mk_u32[n_counters] */
    mk_u64 status;        /* mk_status: the running invocation's, reset by its last block */
    mk_u64 sm_state;      /* mk_sm_state[n_sm] */
    mk_u64 timeout_ns;    /* deadline of every spin loop */
    mk_u32 epoch;         /* 0 from the host: each block sets its copy from run_state */
    mk_u32 n_sm;
    mk_u32 n_tensors;
    mk_u32 n_counters;
    mk_u32 n_pages;       /* pages the host carved; the block checks it fits */
    mk_u32 debug;         /* non-zero: page-leak check at the end of each queue */
    mk_u64 trace;         /* mk_trace_event[total], one per queued instruction; read only by
                             the variant compiled with MK_TRACE=1 */
    mk_u64 run_state;     /* mk_run_state, device memory */
    mk_u64 host_view;     /* mk_host_view, mapped pinned host memory (its device address) */
    mk_u64 host_sm_state; /* mk_sm_state[n_sm], mapped pinned: the failing invocation's */
    mk_u32 max_target;    /* signals per run of the busiest counter (epoch wrap) */
    mk_u32 n_active;      /* blocks that take part in an invocation: block 0 and every block
                             b < n_sm with a non-empty queue (the others leave at once) */
    mk_u32 stream_pages;  /* pages of the weight ring, the last ones of each block (0: the
                             program streams nothing); the allocator has n_pages - this */
    mk_u32 stamp;         /* 0 from the host: each block sets its copy, the stamp of this
                             invocation's flagged words, from run_state (flag.cuh) */
} mk_params;

/* What the device keeps between invocations of one program, in device memory. The last block
 * of each invocation advances it (megakernel.cu, mk_finish_invocation), so replays need no
 * host work: a good invocation moves to the next epoch (counters zeroed first when the next
 * epoch's targets would reach 2^31), a failed one zeroes the counters and restarts at 0. */
typedef struct mk_run_state {
    mk_u32 epoch;         /* the epoch of the next invocation */
    mk_u32 exited;        /* blocks of the running invocation that have finished */
    mk_u32 ticket_done;   /* the device's copy of host_view.ticket_done (no read over PCIe) */
    mk_u32 stamp;         /* the stamp of the last invocation, whatever its outcome (0: none
                             yet); never reset, unlike the epoch (device/flag.cuh) */
} mk_run_state;

/* What the host reads, in mapped pinned memory, written by the last block of each invocation
 * after a system-scope fence (so the host that sees ticket_done sees the rest). */
typedef struct mk_host_view {
    mk_u32 ticket_done;   /* the largest launch ticket finished (any outcome) */
    mk_u32 errors;        /* invocations failed so far */
    mk_u32 error_ticket;  /* the ticket whose record is held below; 0: none (the host clears) */
    mk_u32 pad;
    mk_status status;     /* that invocation's status record */
} mk_host_view;

/* The resident kernel (megakernel_resident): launched once, it serves requests the host
 * writes into a ring in mapped pinned memory, each one invocation of a program, in order, and
 * leaves on a close request, after an idle deadline or after a failed request. Requests are
 * numbered 1, 2, ... (u32, compared wrap-safe); request s lives in ring slot
 * s % MK_RING_SLOTS. The protocol is in megakernel.cu (mk_relay, megakernel_resident) and
 * modelled in megak/runtime/resident_model.py. */
enum mk_resident_limits {
    MK_RING_SLOTS = 64,        /* requests the host may have posted and not yet seen taken */
    MK_MIRROR_SLOTS = 8,       /* requests the relay republishes in device memory */
    MK_RESIDENT_CLOSED = 1,    /* exit reasons (mk_resident_view.reason) */
    MK_RESIDENT_IDLE = 2,
    MK_RESIDENT_FAILED = 3,
    MK_RESIDENT_LOST = 4,      /* a request did not end within the relay's deadline */
    MK_REQUEST_TAG_SHIFT = 48, /* where the ring's address words carry s & 0xffff (below) */
    MK_REQUEST_N_SM_SHIFT = 16 /* where the ring's n_sm word carries it */
};

/* One request: an invocation of a program (its params block) on a tensor table. In the
 * host's ring each 8-byte word names the request it belongs to, so that the relay can read
 * them all in one round trip and know that they belong together (megakernel.cu, mk_relay):
 * the four addresses carry s & 0xffff in their top 16 bits (device addresses stay below
 * 2^48), n_sm carries it in its top 16 bits, and (ticket, seq) is one word. The mirror holds
 * the plain values. queue_start, run_state and n_sm repeat the params block's, so that a
 * block reads its queue bounds and the run state beside the params, not after them. */
typedef struct mk_request {
    mk_u64 params;        /* the program's mk_params (device address); 0: leave */
    mk_u64 tensors;       /* the tensor table of this request */
    mk_u64 queue_start;   /* params->queue_start */
    mk_u64 run_state;     /* params->run_state */
    mk_u32 n_sm;          /* params->n_sm (below 2^16) */
    mk_u32 pad;
    mk_u32 ticket;        /* the program's ticket for it (its host view reports it) */
    mk_u32 seq;           /* the request's number; the host writes it last */
} mk_request;

/* Device memory of a resident kernel; the host writes it before each launch. */
typedef struct mk_resident_state {
    mk_u32 go;            /* the relay: the newest request published in mirror[] */
    mk_u32 pad;
    mk_u64 closed;        /* the newest request whose invocation is over (its last block),
                             low word; the high word non-zero: it failed (the kernel leaves).
                             One word, so the relay reads both in one load. */
    mk_request mirror[MK_MIRROR_SLOTS];   /* request s in mirror[s % MK_MIRROR_SLOTS] */
} mk_resident_state;

/* Mapped pinned host memory, written by the relay: what the host needs to reuse ring
 * slots and to know that the kernel has left (and from which request a new launch starts). */
typedef struct mk_resident_view {
    mk_u32 taken;         /* the newest request taken from the ring */
    mk_u32 reason;        /* MK_RESIDENT_*: why the kernel left */
    mk_u32 next;          /* the first request it did not serve */
    mk_u32 left;          /* the generation of the launch that left, written last */
} mk_resident_view;

/* The resident kernel's one argument, by value. */
typedef struct mk_resident_args {
    mk_u64 ring;          /* mk_request[MK_RING_SLOTS], mapped pinned (device address) */
    mk_u64 view;          /* mk_resident_view, mapped pinned (device address) */
    mk_u64 state;         /* mk_resident_state, device memory */
    mk_u64 seen;          /* mk_u32[grid]: the newest request each block has read */
    mk_u64 idle_ns;       /* leave after this long with no request */
    mk_u64 wait_ns;       /* the longest one request may take before the relay gives up */
    mk_u32 first;         /* the first request this launch serves */
    mk_u32 generation;    /* this launch's number, written into view.left when it leaves */
} mk_resident_args;

/* Phase boundaries of one instruction, %globaltimer ns (logical steps in the simulator). */
enum mk_trace_phase {
    MK_T_FETCH = 0,     /* record in its slot */
    MK_T_WAITED = 1,    /* dependencies satisfied */
    MK_T_ACQUIRED = 2,  /* pages held */
    MK_T_LOADED = 3,    /* first operand tile in shared memory / registers */
    MK_T_COMPUTED = 4,  /* results in registers */
    MK_T_STORED = 5,    /* results in global memory, signals sent */
    MK_TRACE_PHASES = 6
};

typedef struct mk_trace_event {
    mk_u32 queue_index;
    mk_u16 sm;
    mk_u16 slot;
    mk_u16 opcode;
    mk_u16 pages_in_use;  /* pages held on this SM once this instruction acquired its own */
    mk_u32 op_index;
    mk_u64 t[MK_TRACE_PHASES];
} mk_trace_event;

#endif /* MEGAK_INSTR_H */
