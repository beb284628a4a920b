#!/usr/bin/env python3
"""Probe: the weight stream stage by stage. For the W2 chains (bf16, x = x @ W_i) it compiles
the megakernel with %globaltimer marks per ring stage and per instruction, in a __device__
array read back with cuModuleGetGlobal (one run), and prints per chain the medians (over SMs
and stages, or instructions) of

  per stage (lane 0 of the warp that reads it: warp k % 8 for the instruction's stage k):
    B wait          from the warp's start of the stage (its A chunk requested) to the page
                    seen full (ring_issued, then ring_full)
    A wait          then its wait for the A chunk (cp.async)
    mma             then its ldmatrix + MMAs (every chunk), up to its arrive on ring_empty
    issue->land     the streamer's issue of a stage to the warp seeing it full, over the
                    stages the warp waited for (the copy's latency)
  per instruction:
    enter->first    the k loop's entry (dependencies met) to the first page seen, and how
                    many of the stream's stages from there on were issued by the entry
    kloop, reduce, combine, epilogue
                    its phases: the k loop (thread 0's), the 8 warps' partials summed (split
                    at its first barrier: reduce:warps, waiting for the other warps' k loops,
                    then reduce:sum), the parts' combine,
                    the epilogue's stores (the band's last part only); the epilogue split at
                    thread 0's first store (epi:to stores, epi:stores), or, in variant
                    `epi2` / `epiloop` (the epilogue run twice), into its two passes
    gap             its tail's end to the next instruction's k-loop entry on the same SM
                    (the release fence and signal, the next one's dependency wait and
                    hand-over)
  per chain, from a watcher lane's stamp of each stage's landing (warp 11, marked builds):
    land TB/s       the pages landed per microsecond over all SMs, as a rate: p10 / p50 /
                    p90 over the chain, the share of microseconds under half the median,
                    and the whole timeline on a line of its own (where HBM idles)
    issue->land (all), land->seen
                    every stage's copy latency, and how long a landed page waited for its
                    reader

Variants are text replacements of the device source (VARIANTS: `capF`, the streamer keeps
at most F copies in flight; `flagcombine`, a band's parts meet through stamped partials
instead of the combine counter (see _COMBINE_FLAGGED); `noA`, no A staging: the MMAs read
stale A; `Arot`, A's k slices in an order rotated by the SM; `Aregs`, the warp's next
stage's A chunk loaded into registers during this stage (stored at the next stage's
start); `holdA`, the hold kept until the next instruction's first A chunk has landed;
`nodeps`, no dependency wait before a
streamed instruction; `nofence`, no release fence; `relfirst`, the signal's pages handed back
before its fence; `nohold`, the streamer ignores the hold; `holdnarrow`, only a
narrow band holds it; all but `cap`, `flagcombine`, `relfirst`, `nohold` and
`holdnarrow` give wrong results, timing only), each
built twice: marked for the figures, plain (no marks) for the timing (CUDA events, median of
40, the L2 flushed before each run where the report flushes it: --flush). `lean`: the
streamer's per-stage loop without divisions (correct results; see _LEAN), alone, with its
copies in flight capped (`lean-cap6`, `lean-cap8`) or paced (`lean-pace`; `pace` the same
~150 ns sleep before each copy of the loop as built); `relaxedpub`, the streamer's publish of
ring_issued without its release (timing only: the lane's per-copy path without its
MEMBAR.ALL.CTA). Around the tail (correct results unless said): `hpfN` / `hpfr6`, TMA
prefetches into L2 at the hold, `postpfN` the same once the hold is lowered; `holdcapN`,
the hold as a cap of N copies in flight; `l2pf0`, `l2pf6`, `l2pf0L`, LSU prefetches of the
next record's stages by warp 9; `noepi`, no epilogue stores (timing only); `epi2`, the epilogue twice (two copies of its code);
`epiloop`, twice by one loop (the second pass on fetched code); `reduceloop`, the reduce
twice by one loop; `reducerolled`, its sum over the warps a loop; `reducehalf`, a band of
at most 32 columns reduced over its columns only; `holdsleep`, the streamer's wait on a raised hold
sleeping 100 ns per poll; `nofence-nohold` and `nodeps-nofence-nohold`, the ceilings of any
signalling scheme (timing only).
Across a layer boundary (2026-12-04, benchmarks/results/boundary/): `gate` / `gate4` / `gate6`,
the streamer issues the next streamed record's stages (all, or all past its first 4 or 6) only
once the compute warps finished the current record's k loop (so the ring stands free when its
tail starts; correct results), alone, `-nohold` and `-nofence-nohold` (timing only);
`holdshort` / `holdshort1`, the hold raised at the k loop's start where the record's stages are
at most half / all of the ring (correct results); `packed`, every stage one contiguous 1-D bulk
copy of the same bytes per SM (the DRAM pattern of weights packed for the stream; timing
only), and with no synchronisation at all (`packed-nodeps-nofence-nohold`: the ceiling of the
structure). Cases: the W2 chains of the report, batch 1 included (the 1-8 row loop carries the
stage marks too).
`--compile-only` fills the compile cache (XDG_CACHE_HOME) for every build without a GPU (the
build the runtime picks for the chains: their bodies, MK_BODIES, instr.h).
The cache key holds the NVRTC version: filled where NVRTC differs from the GPU machine's, it
misses there, so tools/gpu_checks.sh builds the variants in parallel on the GPU machine's
spare cores while its other steps run.

    python tools/probe_stream_stages.py [--variant asbuilt cap4] [--cases 4096x8-b16]
        [--parts 0 1 8] [--flush report|always] [--compile-only]
"""
import argparse
import statistics
from pathlib import Path

import numpy as np

import megak
from megak import abi
from megak.dtypes import numpy_dtype
from megak.ops import gemm
from megak.runtime import compiler
from probe_stream_parts import chain   # tools/, beside this file

MAXPOS = 1024          # stage positions recorded per SM
NMARK = 20   # per stage: 0 issue, 9 its warp's start, 3 full seen, 2 A landed, 4 done, 16
             # landed (the watcher, below); per instruction, at its first position: 1 k-loop
             # entry, 5 k loop done, 6 reduced, 7 combined, 17 the epilogue's first rows
             # loaded (thread 0, its stores next), 8 epilogue stored (the last part only),
             # 18 the first of two epilogue passes done (variants epi2, epiloop); the
             # interpreter around it: 10 compute barrier passed (C3), 11 signalled (C4),
             # 12 loader: pages taken (L3), 13 loader: handed over (L7), 14 compute:
             # hand-over seen (C1), 15 op entry, 19 the reduce's first barrier passed (every
             # warp's k loop done)
LANDED = 16

# The marked build's watcher: warp 11 (idle otherwise: it leaves after setmaxnreg) follows
# the ring's stage positions as the streamer issues them and stamps each stage's landing
# (its slot's full phase completing), so the chain's HBM delivery can be read over time,
# apart from when a reader first looks. It counts each record's stages only when it gets to
# it (a global read per record, as the streamer does), and for each position first waits for
# the streamer's publication of it (ring_issued): a parity wait tells apart only two laps,
# so a position the ring has already lapped (its slot issued again) is left unstamped rather
# than stamped with a later lap's landing. Timing only, with the streamer's deadline.
_WATCHER = """
__device__ __noinline__ void mkp_watch(const mk_instr* queue, mk_u32 n, mk_u32 lane)
{
    mk_control& ctl = mk_ctl();
    const mk_params& p = ctl.params;
    if (lane != 0 || p.stream_pages == 0)
        return;
    const mk_u32 R = p.stream_pages;
    const mk_u64 deadline = mk_deadline(mk_patience(p.timeout_ns));
    mk_u32 pos = 0;
    for (mk_u32 q = 0; q < n; ++q) {
        const mk_u32 end = pos + mk_stream_stages(queue[q], p);
        for (; pos < end; ++pos) {
            mk_u32* const issued = &ctl.ring_issued[pos % R];
            mk_u32 v;
            while ((v = mk_issued_read(issued)) == ~0u || v < pos)
                if (mk_ring_stopped() || mk_globaltimer() > deadline)
                    return;
            if (v != pos)
                continue;   /* lapped before this lane looked */
            while (!mk_mbar_try_wait(&ctl.ring_full[pos % R], (pos / R) & 1u))
                if (mk_ring_stopped() || mk_globaltimer() > deadline)
                    return;
            const unsigned long long t = mk_globaltimer();
            if (pos < MAXPOS && mk_issued_read(issued) < pos + 2u * R)   /* still pos's parity */
                mk_probe_st[(blockIdx.x * MAXPOS + pos) * NMARK + LANDED] = t;
        }
    }
}

""".replace("LANDED", str(LANDED)).replace("MAXPOS", f"{MAXPOS}u").replace("NMARK", f"{NMARK}u")
_LOADER_DOC = "/* The loader warp (warp MK_THREADS / 32; 32 lanes, few registers): runs up to MK_SLOTS - 1"
_IDLE_WARPS = "            mk_streamer(queue, ctl.n, lane);\n        else\n            return;\n"

_STREAMER_ISSUE = "                mk_mbar_expect_tx(&ctl.ring_full[slot], bytes);\n"


_STREAMER_HOLD = '                mk_stream_hold_wait(ctl);   /* stream.cuh, "The hold" */\n'


def cap(f):
    """The streamer keeps at most f copies in flight: it issues stage pos once pos - f landed
    (waited for before the hold's wait, so that the issue mark follows both)."""
    return [(_STREAMER_HOLD,
             f"                if (pos >= {f}u) {{ const mk_u32 j = pos - {f}u;\n"
             f"                    while (!mk_mbar_try_wait(&ctl.ring_full[j % R], (j / R) & 1u)) {{}} }}\n"
             + _STREAMER_HOLD)]


_NO_A = [("""        if (live)
            mk_stream_chunk_a(buf, ga, TA.ld, in.rows, MTS, in.klen,
                              STAGE_K * s + kb, a_vec);""", "")]

# A's k slices read in an order rotated by the SM (B's order unchanged): at any moment the SMs
# of a layer read different A lines from L2, while they still read the same rows of B from
# DRAM. Against "asbuilt", whether A's cost is the hot spot of every SM reading one line.
_A_ROTATED = [("STAGE_K * s + kb, a_vec);",
               "STAGE_K * ((s + (int)blockIdx.x) % nst) + kb, a_vec);")]

# A's chunk of the warp's next stage loaded into registers (8 x 16 B per lane, through L2:
# ld.global.cg, as cp.async reads) while the warp waits for this stage's page and runs its
# MMAs, and stored into the chunk buffer at the next stage's start: the A latency beside the
# stream (2.6-3.0 us, tools/probe_a_chunks.py) paid once per instruction instead of per stage.
# Correct results (the vector path; an unaligned A keeps cp.async's scalar fallback).
_A_REGS_HELPER = """/* (probe Aregs) a unit at an edge (n < 8 halves): one copy of its code, called */
__device__ __noinline__ uint4 mkp_ld_partial(const mk_u16* src, int n)
{
    return n > 0 ? mk_ld_u16x8(src, n) : make_uint4(0u, 0u, 0u, 0u);
}

/* (probe Aregs) this lane's 8 units of a stage's A chunk (rows [0, 16 mts), k [kk, kk +
 * kc)), zeros past rows and klen, as mk_stream_chunk_a lays them out */
__device__ __forceinline__ void mkp_chunk_load(uint4 (&v)[8], const mk_u16* ga, mk_u32 lda,
                                               int rows, int mts, int klen, int kk)
{
    const int lane = (int)(threadIdx.x & 31u);
    const int shift = mts == 1 ? 4 : 3;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = lane + 32 * j, r = i >> shift, u = i & ((1 << shift) - 1);
        const int k = kk + 8 * u;
        const int n = r < rows ? (klen - k < 8 ? (klen - k > 0 ? klen - k : 0) : 8) : 0;
        const mk_u16* src = ga + (mk_u64)r * lda + k;
        if (n == 8)
            asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[j].x), "=r"(v[j].y), "=r"(v[j].z), "=r"(v[j].w) : "l"(src));
        else
            v[j] = mkp_ld_partial(src, n);
    }
}

__device__ __forceinline__ void mkp_chunk_store(mk_u32 buf, const uint4 (&v)[8], int mts)
{
    const int lane = (int)(threadIdx.x & 31u);
    const int shift = mts == 1 ? 4 : 3;
    const int pitch = 32 << (shift - 1);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = lane + 32 * j, r = i >> shift, u = i & ((1 << shift) - 1);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};"
                     : : "r"(mk_stream_chunk_at(buf, r, u, pitch)), "r"(v[j].x), "r"(v[j].y),
                       "r"(v[j].z), "r"(v[j].w) : "memory");
    }
}

template <int MTS, bool NARROW = false>
__device__ __forceinline__ void mk_stream_kloop_ring("""
_A_REGS = [
    ("template <int MTS, bool NARROW = false>\n__device__ __forceinline__ void mk_stream_kloop_ring(",
     _A_REGS_HELPER),
    ("""#pragma unroll 1
    for (int s = warp % step; s < nst; s += step) {
        const mk_u32 pos = pages.stream_pos + (mk_u32)s;""",
     """    uint4 mkp_a[8];
    if (a_vec && warp % step < nst &&
        (!NARROW || box_at == 0u || mk_stream_second_box(in, (mk_u32)(warp % step))))
        mkp_chunk_load(mkp_a, ga, TA.ld, in.rows, MTS, in.klen, STAGE_K * (warp % step) + kb);
#pragma unroll 1
    for (int s = warp % step; s < nst; s += step) {
        const mk_u32 pos = pages.stream_pos + (mk_u32)s;"""),
    ("""        if (live)
            mk_stream_chunk_a(buf, ga, TA.ld, in.rows, MTS, in.klen,
                              STAGE_K * s + kb, a_vec);
        mk_cp_async_commit();""",
     """        if (live && a_vec) {
            mkp_chunk_store(buf, mkp_a, MTS);
            const int sn = s + step;
            if (sn < nst && (!NARROW || box_at == 0u || mk_stream_second_box(in, (mk_u32)sn)))
                mkp_chunk_load(mkp_a, ga, TA.ld, in.rows, MTS, in.klen, STAGE_K * sn + kb);
        } else if (live)
            mk_stream_chunk_a(buf, ga, TA.ld, in.rows, MTS, in.klen,
                              STAGE_K * s + kb, a_vec);
        mk_cp_async_commit();"""),
]

# No dependency wait before a streamed instruction (the loader skips its counter waits): each
# SM runs its chain of instructions back to back, as if every layer's activation were there.
# The ceiling of any finer dependency between layers (per stage, per band): what a layer costs
# when no SM waits for another's tail. Timing only: the MMAs read A before it is written.
_NO_DEPS = [("            if (t == 0)\n                continue;\n            const mk_u32 c = s.ins.wait_counter[i];",
             "            if (t == 0 || (s.ins.flags & MK_FLAG_STREAM))\n                continue;\n"
             "            const mk_u32 c = s.ins.wait_counter[i];")]

# The signal's pages handed back before its fence (mk_compute_signal): the next instruction on
# the SM waits for them (page 0 of a streamed GEMM), not for the fence that makes this one's
# results visible to other SMs. A correct order: the pages are the block's own.
_SIGNAL_FENCE = "    const mk_u32 n_signals = s.ins.n_signals;\n    if (n_signals > 0)\n        mk_fence_release();\n"
_SIGNAL_RELEASE = ("    /* release what the op still holds */\n"
                   "    const mk_pages pages = {mk_page_array(mk_smem), s.page, 0u, &s.released, &ctl.free_pages};\n"
                   "    pages.release(0, s.ins.pages);\n")
_RELEASE_FIRST = [(_SIGNAL_RELEASE, ""), (_SIGNAL_FENCE, _SIGNAL_RELEASE + _SIGNAL_FENCE)]

# No release fence anywhere (fence.release.gpu: the signal's, the combine's): what the fences
# cost a layer while the GPU streams. Timing only: a consumer may read stale results.
_NO_FENCE = [('    asm volatile("fence.release.gpu;" : : : "memory");',
              '    asm volatile("" : : : "memory");')]

# The band's combine with its partials as stamped words (device/flag.cuh), no counter: the
# parts other than the last store their partial rows as one st.relaxed.gpu.b64 word per element
# (the value and this invocation's stamp) and are done; the last part polls the others' words
# until they carry the stamp, sums in part order (as built: identical results) and runs the
# epilogue. Against "asbuilt" (weak stores, fence.release, the counter's add, fence.acquire,
# the loads): what the two fences and the add cost on the layer's critical path. Timing only:
# it relies on a band's parts running on different SMs (a poll past the deadline gives up and
# the result is wrong) and on rows <= 32 at row0 = 0 (word (r, c) of part p: fp32 elements
# 2 (c % 32), + 1 of partials row 64 p + r + 32 (c / 32)).
_GEMM_STREAM = (Path(__file__).resolve().parents[1] / "megak" / "device" / "ops" /
                "gemm_stream.cuh").read_text()
_COMBINE_AS_BUILT = _GEMM_STREAM[
    _GEMM_STREAM.index("__device__ __forceinline__ bool mk_stream_combine("):
    _GEMM_STREAM.index("/* What the dispatch (ops/gemm.cuh) knows of a record's form")]
_COMBINE_FLAGGED = """__device__ __forceinline__ bool mk_stream_combine(const mk_instr& in, const mk_tensor* op,
                                                  const mk_pages& pages)
{
    mk_control& ctl = mk_ctl();
    const mk_u32 parts = mk_stream_parts(in), part = mk_stream_part(in);
    if (parts <= 1)
        return true;
    const mk_tensor& TS = op[MK_ARG_SPARE];
    const int tid = (int)threadIdx.x, rows = in.rows, cols = in.cols;
    const mk_u32 stamp = ctl.params.stamp;
    float* const gs = reinterpret_cast<float*>(TS.ptr);
    auto word = [&](mk_u32 p, int r, int c) -> mk_u64* {
        return reinterpret_cast<mk_u64*>(
            gs + (mk_u64)(p * (mk_u32)MK_STREAM_M + (mk_u32)in.row0 + r + 32 * (c >> 5)) * TS.ld +
            in.col0 + 2 * (c & 31));
    };
    if (part + 1u != parts) {
        for (int i = tid; i < rows * 64; i += MK_THREADS) {
            const int r = i >> 6, c = i & 63;
            if (c < cols)
                mk_flag_st(word(part, r, c),
                           mk_gemm_stage_at(pages[r / MK_GEMM_STAGE_ROWS], r, c >> 2)[c & 3],
                           stamp);
        }
        return false;
    }
    const mk_u64 deadline = mk_deadline(ctl.params.timeout_ns);
    for (int i = tid; i < rows * 64; i += MK_THREADS) {
        const int r = i >> 6, c = i & 63;
        if (c >= cols)
            continue;
        float* const mine = mk_gemm_stage_at(pages[r / MK_GEMM_STAGE_ROWS], r, c >> 2) + (c & 3);
        float sum = 0.f;
        for (mk_u32 p = 0; p < parts; ++p) {
            if (p == part) {
                sum += *mine;
                continue;
            }
            mk_u64 w = mk_flag_ld(word(p, r, c));
            for (mk_u32 n = 1; (mk_u32)(w >> 32) != stamp; ++n) {
                if ((n & 63u) == 0u && mk_globaltimer() > deadline)
                    break;
                w = mk_flag_ld(word(p, r, c));
            }
            sum += __uint_as_float((mk_u32)w);
        }
        *mine = sum;
    }
    mk_compute_sync();
    return true;
}

"""
_FLAG_COMBINE = [(_COMBINE_AS_BUILT, _COMBINE_FLAGGED)]

# Without the hold (stream.cuh, "The hold"): a streamed instruction still raises it, the streamer
# ignores it, so copies keep coming while its signal fences. Results as built.
_NO_HOLD = [(_STREAMER_HOLD, "")]

# Only a narrow band holds the streamer through its tail, as before the wide bands held it
# too (for those, batch 17-64, 8192 x 8, 1024 x 16: whether the fence's saving still
# outweighs the copies held back). Results as built.
_HOLD_NARROW = [("mk_stream_reduce(pages, acc, in.rows, ring, direct, sums);",
                 "mk_stream_reduce(pages, acc, in.rows,\n"
                 "                     pages.stream_stages > 0 && mk_stream_narrow(in), direct, sums);")]

# The streamer's per-stage path without its divisions and its reload of the record: slot and
# lap counted, klen read once per instruction. Correct results. On the H200
# (results/try-first/): batch 64 faster (158.8 against 173.9 us before the empty wait's first
# try landed), the narrow bands slower (111.3 against 107.6): their k loops take 0.5 us more
# and the ring's copies land later (issue -> land 3.4-4.9 us against 2.4-2.8), not the signal
# step (0.83 us in both). What landed of it is the empty wait's first try before the clock.
_LEAN = [
    ("        mk_u32 pos = 0;\n        bool go = true;\n",
     "        mk_u32 pos = 0, slot = 0, lap = 0;\n        bool go = true;\n"),
    ("            const int c0 = in.col0, r0 = in.k0;\n",
     "            const int c0 = in.col0, r0 = in.k0;\n"
     "            const mk_u32 klen = (mk_u32)in.klen;\n"),
    ("                const mk_u32 slot = pos % R;\n"
     "                if (pos >= R && !mk_ring_wait_empty(ctl, slot, ((pos / R) - 1u) & 1u, patience)) {\n",
     "                if (lap > 0 && !mk_ring_wait_empty(ctl, slot, (lap - 1u) & 1u, patience)) {\n"),
    ("narrow && mk_stream_second_box(in, s);",
     "narrow && klen > 2u * MK_STREAM_BOX_ROWS * s + MK_STREAM_BOX_ROWS;"),
    ("                                       &ctl.ring_full[slot], policy);\n                }\n            }\n",
     "                                       &ctl.ring_full[slot], policy);\n                }\n"
     "                if (++slot == R) {\n                    slot = 0;\n                    ++lap;\n"
     "                }\n            }\n"),
]

# The streamer's publish of ring_issued without its release (a relaxed exchange: no
# MEMBAR.ALL.CTA before it in the lane's path per copy). Timing only: the reader's inference
# that pos - R landed then has no happens-before behind it (stream.cuh, "which phase").
_RELAXED_PUBLISH = [("atom.release.cta.shared::cta.exch.b32", "atom.relaxed.cta.shared::cta.exch.b32")]

# The streamer sleeps ~150 ns before each copy, pacing its issues: in the loop as built slower
# everywhere; on the lean loop the narrow bands' best figure (benchmarks/ANALYSIS.md).
_PACE = [(_STREAMER_HOLD, "                __nanosleep(150);\n" + _STREAMER_HOLD)]

# While the hold is raised, HBM idles (the landing timeline): the streamer, the first time it
# finds the hold raised at position pos, asks L2 for the boxes of positions [pos + a, pos + b)
# (cp.async.bulk.prefetch.tensor: no shared memory, no barrier; the copies after the hold,
# and those the next k loop's freed slots let through, then read L2). a = 0: what the ring
# takes first after the hold; a = R: the stages past the ring's refill. Results as built.
# On the H200 (results/tail-probes/): 4096 x 8 137 us against 107, the signal's fence 1.7-2.0
# us against 0.86 (it waits for the prefetches as for copies).
_PREFETCH_FN = """__device__ __forceinline__ void mkv_tma_prefetch_2d(const void* tmap, int c0, int r0)
{
    asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];"
                 : : "l"(tmap), "r"(c0), "r"(r0) : "memory");
}

/* L2 prefetches of stage positions [from, to); position pos is stage s of record q */
__device__ __noinline__ void mkv_prefetch(const mk_instr* queue, mk_u32 n, const mk_params& p,
                                          const unsigned char* tmaps, mk_u32 q, mk_u32 s,
                                          mk_u32 pos, mk_u32 from, mk_u32 to)
{
    for (; q < n && pos < to; ++q, s = 0) {
        const mk_instr& in = queue[q];
        const mk_u32 stages = mk_stream_stages(in, p);
        if (s >= stages)
            continue;
        if (pos + (stages - s) <= from) {
            pos += stages - s;
            continue;
        }
        if (pos < from) {
            s += from - pos;
            pos = from;
        }
        const void* tmap = tmaps + (mk_u64)MK_TMAP_BYTES * in.tensor[MK_ARG_B];
        const bool narrow = mk_stream_narrow(in);
        const mk_u32 rows = mk_stream_stage_rows(in);
        for (; s < stages && pos < to; ++s, ++pos) {
            const int k = in.k0 + (int)(s * rows);
            mkv_tma_prefetch_2d(tmap, in.col0, k);
            if (narrow && mk_stream_second_box(in, s))
                mkv_tma_prefetch_2d(tmap, in.col0, k + MK_STREAM_BOX_ROWS);
        }
    }
}

"""
_STREAMER_DEF = "__device__ __noinline__ void mk_streamer(const mk_instr* queue, mk_u32 n, mk_u32 lane)\n"


# the prefetch function and the streamer's record of how far it has prefetched (pf_end)
_PREFETCH_SETUP = [(_STREAMER_DEF, _PREFETCH_FN + _STREAMER_DEF),
                   ("        mk_u32 pos = 0;\n        bool go = true;\n",
                    "        mk_u32 pos = 0, pf_end = 0;\n        bool go = true;\n")]


def hold_prefetch(a, b):
    return _PREFETCH_SETUP + [
            (_STREAMER_HOLD,
             f"                if (pf_end < pos + {b} && atomicOr(&ctl.stream_hold, 0u) != 0u) {{\n"
             f"                    const mk_u32 from = pos + {a};\n"
             f"                    mkv_prefetch(queue, n, p, tmaps, q, s, pos, from > pf_end ? from : pf_end, pos + {b});\n"
             f"                    pf_end = pos + {b};\n                }}\n" + _STREAMER_HOLD)]


# The same L2 prefetches issued once the hold has been lowered (after the signal's release
# fence, which then has none to wait for): positions [pos + a, pos + b) past what the
# refilled ring takes, so that HBM works through the layer boundary's hop and the next k
# loop's late copies read L2. Results as built. On the H200 (results/rows8/): 4096 x 8
# 112.8 / 131.7 us against 88.6, 8192 x 8 298 / 310 against 273: the next instruction's
# acquire (the loader's dependency wait) waits for them as the release fence did.
def post_hold_prefetch(a, b):
    return _PREFETCH_SETUP + [
            (_STREAMER_HOLD,
             "                const bool mkv_held = atomicOr(&ctl.stream_hold, 0u) != 0u;\n"
             + _STREAMER_HOLD +
             f"                if (mkv_held && pf_end < pos + {b}) {{\n"
             f"                    const mk_u32 from = pos + {a};\n"
             f"                    mkv_prefetch(queue, n, p, tmaps, q, s, pos, from > pf_end ? from : pf_end, pos + {b});\n"
             f"                    pf_end = pos + {b};\n                }}\n")]


# The hold as a cap instead of a stop: while it is raised, the streamer issues stage pos
# once pos - h has landed (at most h copies in flight), so HBM keeps ~h pages per SM coming
# through the tail (2 pages in flight per SM: ~4 TB/s, tools/probe_bulk_copy.py) while the
# signal's fence waits for at most h (~0.4 us at 2: tools/probe_fence_load.py). Results as
# built. On the H200 no faster at h = 1, 2, 3 (the fence 1.2-1.7 us; the pages landed early
# wait longer for their readers: the ring is full by the k loop's entry either way).
def hold_cap(h):
    return [(_STREAMER_HOLD,
             f"                if (pos >= {h}u && atomicOr(&ctl.stream_hold, 0u) != 0u) {{\n"
             f"                    const mk_u32 j = pos - {h}u;\n"
             "                    const mk_u64 until = mk_globaltimer() + MK_STREAM_HOLD_NS;\n"
             "                    while (!mk_mbar_try_wait(&ctl.ring_full[j % R], (j / R) & 1u) &&\n"
             "                           mk_globaltimer() < until) {\n                    }\n"
             "                }\n")]


# L2 prefetches by a warp of their own (warp 9, idle as built): once the k loop of a streamed
# record has begun (the streamer has issued the position R past its first, or its last),
# the warp's lanes issue prefetch.global.L2 for every k-row segment of the next streamed
# record's stages [a, stages): the lines are in L2 when the ring's copies ask for them, and
# HBM keeps working through the tail while the ring waits. Unlike a TMA prefetch (hpf*) these
# go through the LSU: whether the signal's fence waits for them is what the variant shows.
# Results as built (a prefetch has no effect on memory). On the H200 the fence did not wait
# (0.96-1.0 us against 0.83) but the chains were 20-90% slower: the ring's copies landed at
# ~2 TB/s (tools/probe_l2_prefetch.py: a prefetched line serves a bulk copy at ~4.6 TB/s,
# an L2 hit at ~6; the prefetches add HBM traffic the copies do not save).
_L2PF_FN = """__device__ __noinline__ void mkv_l2pf(const mk_instr* queue, mk_u32 n, mk_u32 lane)
{
    mk_control& ctl = mk_ctl();
    const mk_params& p = ctl.params;
    if (p.stream_pages == 0)
        return;
    const mk_u32 R = p.stream_pages;
    const mk_tensor* tensors = reinterpret_cast<const mk_tensor*>(p.tensors);
    const mk_u64 deadline = mk_deadline(mk_patience(p.timeout_ns));
    mk_u32 first = 0;
    for (mk_u32 q = 0; q < n; ++q) {
        const mk_u32 st = mk_stream_stages(queue[q], p);
        if (st == 0)
            continue;
        /* the next streamed record */
        mk_u32 q2 = q + 1, st2 = 0;
        for (; q2 < n; ++q2)
            if ((st2 = mk_stream_stages(queue[q2], p)) != 0)
                break;
        if (q2 >= n)
            return;
        const mk_u32 T = first + (st - 1u < R ? st - 1u : R);
        if (lane == 0) {
            mk_u32 v;
            while ((v = mk_issued_read(&ctl.ring_issued[T % R])) == ~0u || v < T)
                if (mk_ring_stopped() || mk_globaltimer() > deadline)
                    break;
        }
        __syncwarp();
        if (mk_ring_stopped() || mk_globaltimer() > deadline)
            return;
        const mk_instr& in = queue[q2];
        const mk_tensor& B = tensors[in.tensor[MK_ARG_B]];
        const mk_u32 rows = mk_stream_stage_rows(in);
        const mk_u32 kend = (mk_u32)in.k0 + (mk_u32)in.klen;
        /* every 32-B sector of the stages' k-row segments (64 B narrow, 128 B wide) */
        const mk_u32 spr = mk_stream_narrow(in) ? 2u : 4u;
        const mk_u32 r0 = (mk_u32)in.k0 + PFA * rows;
        const mk_u32 r1 = min((mk_u32)in.k0 + st2 * rows, kend);
        for (mk_u32 i = lane; r0 + i / spr < r1; i += 32u)
            asm volatile("prefetch.global.L2HINT [%0];"
                         : : "l"(B.ptr + ((mk_u64)(r0 + i / spr) * B.ld + (mk_u32)in.col0) * 2u + 32u * (i % spr)));
        first += st;
    }
}

"""
_LOADER_BRANCH = "        if (loader)\n            mk_loader(queue, ctl.n, lane, true);\n"


def l2_prefetch(a, hint=""):
    return [(_STREAMER_DEF, _L2PF_FN.replace("PFA", f"{a}u").replace("L2HINT", "L2" + hint)
             + _STREAMER_DEF),
            (_LOADER_BRANCH, "        if (warp == MK_LOADER_WARP + 1) {\n"
                             "            mkv_l2pf(queue, ctl.n, lane);\n            return;\n        }\n"
             + _LOADER_BRANCH)]


# No epilogue in a streamed GEMM (its stores of the band's outputs): what the epilogue's
# 1.2-1.3 us (a 16 x 32 band: two 8-byte stores per thread of 64) costs the chain, and
# whether its time is the stores'. Timing only: the outputs are never written. On the H200:
# 4096 x 8 92.1 us against 107.3, 1024 x 16 87.5 against 124.1; the epilogue's 1.28 us is
# the same in both chains (loaded and nearly idle HBM alike) and each layer shrinks by it.
_NO_EPILOGUE = [("mk_gemm_epilogue_at(in, op, pages, in.row0);", "(void)op;"),
                ("mk_stream_store_direct(in, op, sums);", "(void)sums;")]


# The epilogue's row loop, from its stores on (ops/gemm_epilogue.cuh): mark 17 goes before.
_EPILOGUE_STORES = ("#pragma unroll\n        for (int j = 0; j < 4; ++j) {\n"
                    "            const int r = r0 + j * (MK_THREADS / 32);\n"
                    "            if (r < rows) {\n                const float4 x = mk_epilogue4(")

# The streamed GEMM's two epilogues (gemm_stream.cuh, mk_gemm_stream_run)
_EPILOGUE_CALLS = ("mk_gemm_epilogue_at(in, op, pages, in.row0);",   # parts > 1
                   "mk_stream_store_direct(in, op, sums);")          # one part


# The epilogue run twice, the second pass storing the same values again (mark 18 between, in
# marked builds): a fixed cost that the second pass does not pay is the first pass's code
# arriving (instruction fetch), one it pays again is the work itself. Results as built.
def _epilogue_twice(call):
    return (call, call + "\n#if defined(MKP_ON)\n"
            "        if (threadIdx.x == 0 && pages.stream_stages > 0) MKP(pages.stream_pos, 18);\n"
            "#endif\n        " + call)


_EPI_TWICE = [_epilogue_twice(c) for c in _EPILOGUE_CALLS]

# The reduce run twice by one loop (same sums, the hold raised twice): mark 19 is then the
# second pass's first barrier, so reduce:warps is the first pass and reduce:sum the second's
# work, on code the first pass fetched.
_REDUCE_LOOP = [("        mk_stream_reduce(pages, acc, in.rows, ring, direct, sums);\n",
                 "    {\n#pragma unroll 1\n"
                 "    for (int mkp_pass = 0; mkp_pass < 2; ++mkp_pass)\n"
                 "        mk_stream_reduce(pages, acc, in.rows, ring, direct, sums);\n"
                 "    }\n"),
                ("        mk_stream_reduce_narrow(pages, acc, true, sums);\n",
                 "    {\n#pragma unroll 1\n"
                 "    for (int mkp_pass = 0; mkp_pass < 2; ++mkp_pass)\n"
                 "        mk_stream_reduce_narrow(pages, acc, true, sums);\n"
                 "    }\n")]

# The reduce's sum over the 8 warps' partials as a loop (one body per column pair instead of
# 8): less code on the tail's cold path, the same sums in the same order. Correct results.
_REDUCE_ROLLED = [("#pragma unroll\n                for (int w = 0; w < MK_STREAM_WARPS; ++w) {\n",
                   "#pragma unroll 1\n                for (int w = 0; w < MK_STREAM_WARPS; ++w) {\n")]

# The reduce of a band of at most 32 columns (every narrow band) without the n8 tiles and
# the column pairs past its width: half the shared stores, loads and adds, and the code they
# take (branched over). Correct results.
_REDUCE_HALF = [
    ("bool direct,\n                                                 float2 (&sums)[2][2])\n",
     "bool direct,\n                                                 float2 (&sums)[2][2], int cols = 64)\n"),
    ("mk_stream_reduce(pages, acc, in.rows, ring, direct, sums);",
     "mk_stream_reduce(pages, acc, in.rows, pages.stream_stages > 0, direct, sums, in.cols);"),
    ("        for (int n8 = 0; n8 < 8; ++n8)\n#pragma unroll\n            for (int h = 0; h < 2; ++h) {\n",
     "        for (int n8 = 0; n8 < 8; ++n8) {\n            if (8 * n8 >= cols)\n                break;\n"
     "#pragma unroll\n            for (int h = 0; h < 2; ++h) {\n"),
    ("make_float2(acc[mt][n8][2 * h], acc[mt][n8][2 * h + 1]);\n            }\n",
     "make_float2(acc[mt][n8][2 * h], acc[mt][n8][2 * h + 1]);\n            }\n        }\n"),
    ("        for (int half = 0; half < 2; ++half) {\n            const int r = tid >> 4,",
     "        for (int half = 0; half < 2; ++half) {\n            if (32 * half >= cols)\n"
     "                break;\n            const int r = tid >> 4,"),
]

# The streamer's wait on a raised hold with a 100-ns sleep per poll instead of back-to-back
# shared atomics (do they slow the compute warps' shared-memory reduce?). Correct results.
_HOLD_SLEEP = [("mk_globaltimer() < until && !mk_ring_stopped()) {\n    }\n",
                "mk_globaltimer() < until && !mk_ring_stopped()) {\n        __nanosleep(100);\n    }\n")]


# The hold kept past the signal until warp 0 of the next streamed instruction has its first
# A chunk (instead of lowered after the signal's fence): the copies the streamer would issue
# into the slots the tail freed wait until the next layer's activation has landed, so A's
# L2 reads at the layer boundary queue behind fewer copies (A lands in 0.7 us idle, 2.8 beside
# the stream: tools/probe_a_chunks.py). Bounded as ever (MK_STREAM_HOLD_NS per copy); results
# as built.
_HOLD_A = [
    ("        mk_stream_hold(ctl, 0u);   /* the fence has passed: the streamer goes on */\n", ""),
    ("""        mk_cp_async_wait_all();
        __syncwarp();                         /* every lane's A copies visible to the warp */
""", """        mk_cp_async_wait_all();
        __syncwarp();                         /* every lane's A copies visible to the warp */
        if (warp == 0 && lane == 0 && s == 0)
            mk_stream_hold(ctl, 0u);          /* (probe holdA) the first A has landed */
"""),
]


# The epilogue run twice by one loop (one copy of its code): the second pass runs code the
# first just fetched, so a fixed cost the second pass does not pay is instruction fetch, one
# it pays again is the work. (epi2's passes are two inlined copies: both cold.)
def _epilogue_loop(call):
    return (call, "{\n#pragma unroll 1\n"
            "        for (int mkp_pass = 0; mkp_pass < 2; ++mkp_pass) {\n"
            "            " + call + "\n"
            "#if defined(MKP_ON)\n"
            "            if (mkp_pass == 0 && threadIdx.x == 0 && pages.stream_stages > 0)\n"
            "                MKP(pages.stream_pos, 18);\n"
            "#endif\n"
            "        }\n        }")


_EPI_LOOP = [_epilogue_loop(c) for c in _EPILOGUE_CALLS]


# The tail gate: the streamer issues stage c of the block's j-th streamed record (j > 0) only once
# the compute warps have finished the k loop of record j - 1 (c >= C; C = 0: none of it), so
# that the ring's slots stand free when that record's tail starts, and HBM fills them while the
# tail, the signal and the dependency wait run (today the ring is full of the next record's
# landed stages by then, and the SM's share of HBM idles through its tail). The compute side
# counts its k loops where it raises the hold (every ring instruction raises it once, after its
# last stage was read). With the release fence kept the copies issued at the tail delay the
# signal (the fence waits for them); `-nofence-nohold` is the fence-free ceiling (timing only).
_TAILGATE_COUNT = [
    ("    mk_u32 stream_error;               /* gemm_stream: a ring wait passed its deadline */\n",
     "    mk_u32 stream_error;               /* gemm_stream: a ring wait passed its deadline */\n"
     "    mk_u32 kloops_done;\n"),
    ("    ctl.stream_error = 0;\n    ctl.op_stop.error = MK_OK;\n    const unsigned char* page_array",
     "    ctl.stream_error = 0;\n    ctl.kloops_done = 0;\n    ctl.op_stop.error = MK_OK;\n"
     "    const unsigned char* page_array"),
    ("    atomicExch(&ctl.stream_hold, on);\n",
     "    atomicExch(&ctl.stream_hold, on);\n    if (on)\n        atomicAdd(&ctl.kloops_done, 1u);\n"),
]


def tail_gate(c):
    return _TAILGATE_COUNT + [
        ("        mk_u32 pos = 0;\n        bool go = true;\n",
         "        mk_u32 pos = 0, jrec = 0;\n        bool go = true;\n"),
        ("            for (mk_u32 s = 0; s < stages; ++s, ++pos) {\n"
         "                const mk_u32 slot = pos % R;\n",
         "            for (mk_u32 s = 0; s < stages; ++s, ++pos) {\n"
         "                const mk_u32 slot = pos % R;\n"
         f"                if (jrec > 0 && s == {c}u) {{\n"
         "                    const mk_u64 until = mk_globaltimer() + patience;\n"
         "                    while (atomicOr(&ctl.kloops_done, 0u) < jrec && mk_globaltimer() < until && !mk_ring_stopped()) {\n"
         "                    }\n"
         "                }\n"),
        ("            const mk_u32 stages = mk_stream_stages(in, p, &pk);\n"
         "            if (stages == 0)\n                continue;\n",
         "            const mk_u32 stages = mk_stream_stages(in, p, &pk);\n"
         "            if (stages == 0)\n                continue;\n"
         "            const mk_u32 jrec_now = jrec;\n"),
        ("                                       &ctl.ring_full[slot], policy);\n                }\n            }\n",
         "                                       &ctl.ring_full[slot], policy);\n                }\n            }\n"
         "            jrec = jrec_now + 1u;\n"),
    ]


# The hold raised at the k loop's start where the instruction's stages are at most num / den of
# the ring (the ring then stands at least one such instruction ahead, the chain waits on its
# dependencies, not on HBM): the copies its k loop frees would otherwise be in flight at its
# signal, whose release fence waits for them (1024 x 16: nofence-nohold 66.8 us against 72.8).
def hold_short(num, den):
    return [("    const int box_row0 = NARROW ? 0 : kb;     /* the share's first k-row in its box */\n",
             "    const int box_row0 = NARROW ? 0 : kb;     /* the share's first k-row in its box */\n"
             f"    if (threadIdx.x == 0 && {den} * nst <= {num} * (int)ctl.params.stream_pages)\n"
             "        mk_stream_hold(ctl, 1u);\n")]


# Weights in a layout made for the stream (timing only): each stage read as ONE contiguous 1-D
# bulk copy of its bytes (16 KiB, or 8 KiB for a narrow stage without its second box) from the
# record's B tensor at (band * stages per band + stage) pages, where a band is the record's
# col0 / box columns: the same bytes per SM in the same order as a packed copy of the weights
# would hold them (page images pre-swizzled on the host), so the DRAM sees whole 16 KiB runs
# instead of 64- or 128-B row segments (tools/probe_weight_stream.py --layouts: 3.78 against
# 3.11 / 3.55 TB/s free-running). The pages hold other bytes: the results are wrong. (What
# landed is g.constant's packed copy, read the same way by a build with
# MK_BODY_STREAM_PACKED: runtime/packed_weights.py.)
_PACKED = [
    ("            const mk_u32 stage_rows = mk_stream_stage_rows(in);\n",
     "            const mk_u32 stage_rows = mk_stream_stage_rows(in);\n"
     "            const mk_tensor* pk_t = reinterpret_cast<const mk_tensor*>(p.tensors) + in.tensor[MK_ARG_B];\n"
     "            const mk_u64 pk_ptr = pk_t->ptr;\n"
     "            const mk_u64 pk_bytes = (mk_u64)pk_t->rows * pk_t->ld * 2u;\n"
     "            const mk_u64 pk_band = (mk_u64)(pk_t->rows + stage_rows - 1) / stage_rows;\n"
     "            const mk_u64 pk_first = ((mk_u64)((mk_u32)c0 / (narrow ? 32u : 64u)) * pk_band\n"
     "                                     + (mk_u32)r0 / stage_rows) * MK_PAGE_BYTES;\n"),
    ("                    mk_tma_load_2d(dst, tmap, c0, k, &ctl.ring_full[slot], policy);\n"
     "                    if (second)\n"
     "                        mk_tma_load_2d(dst + MK_PAGE_BYTES / 2, tmap, c0, k + MK_STREAM_BOX_ROWS,\n"
     "                                       &ctl.ring_full[slot], policy);\n",
     "                {\n"
     "                    const mk_u32 pk_n = narrow && !second ? MK_PAGE_BYTES / 2 : MK_PAGE_BYTES;\n"
     "                    mk_u64 pk_off = pk_first + (mk_u64)s * MK_PAGE_BYTES;\n"
     "                    if (pk_off + pk_n > pk_bytes)\n"
     "                        pk_off = 0;\n"
     "                    (void)tmap; (void)k;\n"
     "                    asm volatile(\"cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes\"\n"
     "                                 \".L2::cache_hint [%0], [%1], %2, [%3], %4;\"\n"
     "                                 : : \"r\"(dst), \"l\"(pk_ptr + pk_off), \"r\"(pk_n),\n"
     "                                     \"r\"(mk_smem_addr(&ctl.ring_full[slot])), \"l\"(policy) : \"memory\");\n"
     "                }\n"),
]


VARIANTS = {"asbuilt": [], "lean": _LEAN,
            "cap2": cap(2), "cap3": cap(3), "cap4": cap(4), "cap6": cap(6),
            "flagcombine": _FLAG_COMBINE, "noA": _NO_A, "noA-cap4": _NO_A + cap(4),
            "Arot": _A_ROTATED, "Aregs": _A_REGS, "Arot-cap4": _A_ROTATED + cap(4),
            "nodeps": _NO_DEPS, "relfirst": _RELEASE_FIRST, "nofence": _NO_FENCE,
            "nodeps-nofence": _NO_DEPS + _NO_FENCE,
            "nohold": _NO_HOLD, "holdnarrow": _HOLD_NARROW,
            "nofence-nohold": _NO_FENCE + _NO_HOLD,
            "noepi": _NO_EPILOGUE,
            "epi2": _EPI_TWICE, "epiloop": _EPI_LOOP,
            "reduceloop": _REDUCE_LOOP, "reducerolled": _REDUCE_ROLLED,
            "reducehalf": _REDUCE_HALF,
            "holdsleep": _HOLD_SLEEP, "holdA": _HOLD_A, "Aregs-holdA": _A_REGS + _HOLD_A,
            "nodeps-nofence-nohold": _NO_DEPS + _NO_FENCE + _NO_HOLD,
            "lean-cap6": _LEAN + cap(6), "lean-cap8": _LEAN + cap(8),
            "pace": _PACE, "lean-pace": _LEAN + _PACE,
            "relaxedpub": _RELAXED_PUBLISH, "lean-relaxedpub": _LEAN + _RELAXED_PUBLISH,
            "hpf8": hold_prefetch("0u", "8u"), "hpf14": hold_prefetch("0u", "14u"),
            "hpfr6": hold_prefetch("R", "R + 6u"),
            "postpf6": post_hold_prefetch("R", "R + 6u"),
            "postpf10": post_hold_prefetch("R", "R + 10u"),
            "holdcap1": hold_cap(1), "holdcap2": hold_cap(2), "holdcap3": hold_cap(3),
            "l2pf0": l2_prefetch(0), "l2pf6": l2_prefetch(6),
            "l2pf0L": l2_prefetch(0, "::evict_last"),
            "gate": tail_gate(0), "gate-nohold": tail_gate(0) + _NO_HOLD,
            "gate-nofence-nohold": tail_gate(0) + _NO_FENCE + _NO_HOLD,
            "gate4-nofence-nohold": tail_gate(4) + _NO_FENCE + _NO_HOLD,
            "gate6-nofence-nohold": tail_gate(6) + _NO_FENCE + _NO_HOLD,
            "holdshort": hold_short(1, 2), "holdshort1": hold_short(1, 1),
            "packed": _PACKED, "packed-nodeps-nofence-nohold": _PACKED + _NO_DEPS + _NO_FENCE + _NO_HOLD}

# the op's tail after its k loop (gemm_stream.cuh, mk_gemm_stream_run)
_RUN_TAIL = """    mk_trace_mark(MK_T_COMPUTED);
    /* an instruction that read the ring holds the streamer from here to its signal's fence
     * (stream.cuh, "The hold") */
    float2 sums[2][2];
    if (MK_NARROW_REDUCE && ring && (narrow || f32) && direct)
        mk_stream_reduce_narrow(pages, acc, true, sums);
    else
        mk_stream_reduce(pages, acc, in.rows, ring, direct, sums);
    pages.release(1, 3);
    if (direct)
        mk_stream_store_direct(in, op, sums);
    else if (mk_stream_combine(in, op, pages))
        mk_gemm_epilogue_at(in, op, pages, in.row0);
"""
# (one part: 7 right after the reduce, the direct store between 7 and 8)
_RUN_TAIL_MARKED = """    const bool mkp_on = pages.stream_stages > 0 && threadIdx.x == 0;
    if (mkp_on) MKP(pages.stream_pos, 5);
    mk_trace_mark(MK_T_COMPUTED);
    float2 sums[2][2];
    if (MK_NARROW_REDUCE && ring && (narrow || f32) && direct)
        mk_stream_reduce_narrow(pages, acc, true, sums);
    else
        mk_stream_reduce(pages, acc, in.rows, ring, direct, sums);
    if (mkp_on) MKP(pages.stream_pos, 6);
    pages.release(1, 3);
    const bool mkp_last = direct || mk_stream_combine(in, op, pages);
    if (mkp_on) MKP(pages.stream_pos, 7);
    if (mkp_last) {
        if (direct)
            mk_stream_store_direct(in, op, sums);
        else
            mk_gemm_epilogue_at(in, op, pages, in.row0);
        if (mkp_on) MKP(pages.stream_pos, 8);
    }
"""

MARKS = [
    # header: after sync.cuh (mk_globaltimer), before the stream header's users
    ("#ifndef MEGAK_STREAM_CUH\n#define MEGAK_STREAM_CUH\n",
     "#ifndef MEGAK_STREAM_CUH\n#define MEGAK_STREAM_CUH\n"
     f"__device__ unsigned long long mk_probe_st[132u * {MAXPOS}u * {NMARK}u];\n"
     "#if MKP_ON\n"
     f"#define MKP(pos, i) do {{ if ((pos) < {MAXPOS}u) mk_probe_st[(blockIdx.x * {MAXPOS}u + (pos)) * {NMARK}u + (i)] = mk_globaltimer(); }} while (0)\n"
     "#else\n#define MKP(pos, i) do { } while (0)\n#endif\n"),
    (_STREAMER_ISSUE, "                MKP(pos, 0);\n" + _STREAMER_ISSUE),
    # the ring's k loop: the entry (thread 0, at the instruction's first position); per stage,
    # lane 0 of its warp (of a two-reader stage, of whichever reader writes last): 9 start,
    # 3 page seen, 2 A landed, 4 done
    ("#pragma unroll 1\n    for (int s = warp % step; s < nst; s += step) {\n"
     "        const mk_u32 pos = pages.stream_pos + (mk_u32)s;\n",
     "    if (threadIdx.x == 0) MKP(pages.stream_pos, 1);\n"
     "#pragma unroll 1\n    for (int s = warp % step; s < nst; s += step) {\n"
     "        const mk_u32 pos = pages.stream_pos + (mk_u32)s;\n"
     "        if (lane == 0) MKP(pos, 9);\n"),
    ("        const bool ok = __all_sync(0xffffffffu, mk_stream_wait_full(ctl, slot, pos, parity));\n",
     "        const bool ok = __all_sync(0xffffffffu, mk_stream_wait_full(ctl, slot, pos, parity));\n"
     "        if (lane == 0) MKP(pos, 3);\n"),
    ("        __syncwarp();                         /* every lane's A copies visible to the warp */\n",
     "        __syncwarp();                         /* every lane's A copies visible to the warp */\n"
     "        if (lane == 0) MKP(pos, 2);\n"),
    ("        /* a phase is MK_STREAM_READERS readers' arrivals, MTS readers per stage */\n",
     "        if (lane == 0) MKP(pos, 4);\n"
     "        /* a phase is MK_STREAM_READERS readers' arrivals, MTS readers per stage */\n"),
    # the same in the 1-8 row loop (its A chunk of the next turn is requested at this turn's
    # start, so "A wait" there is this turn's chunk, requested a turn earlier)
    ("#pragma unroll 1\n    for (int s = s0; s < nst; s += step) {\n"
     "        const mk_u32 pos = pages.stream_pos + (mk_u32)s;\n",
     "    if (threadIdx.x == 0) MKP(pages.stream_pos, 1);\n"
     "#pragma unroll 1\n    for (int s = s0; s < nst; s += step) {\n"
     "        const mk_u32 pos = pages.stream_pos + (mk_u32)s;\n"
     "        if (lane == 0) MKP(pos, 9);\n"),
    ("        const bool landed = __all_sync(~0u, mk_stream_wait_full(ctl, slot, pos, parity));\n",
     "        const bool landed = __all_sync(~0u, mk_stream_wait_full(ctl, slot, pos, parity));\n"
     "        if (lane == 0) MKP(pos, 3);\n"),
    ("        __syncwarp();                         /* every lane's copies of it visible to the warp */\n",
     "        __syncwarp();                         /* every lane's copies of it visible to the warp */\n"
     "        if (lane == 0) MKP(pos, 2);\n"),
    ("        /* one of the stage's two readers: half a phase's arrivals */\n",
     "        if (lane == 0) MKP(pos, 4);\n"
     "        /* one of the stage's two readers: half a phase's arrivals */\n"),
    # the instruction's tail, at its first position (streamed instructions only)
    (_RUN_TAIL, _RUN_TAIL_MARKED),
    ("    mk_compute_sync();   /* every warp is done with the A ring (pages 0-1) and box (page 2) */\n",
     "    mk_compute_sync();   /* every warp is done with the A ring (pages 0-1) and box (page 2) */\n"
     "    if (tid == 0 && pages.stream_stages > 0) MKP(pages.stream_pos, 19);\n"),
    (_EPILOGUE_STORES, "        if (threadIdx.x == 0 && r0 == 0 && pages.stream_stages > 0)\n"
                       "            MKP(pages.stream_pos, 17);\n" + _EPILOGUE_STORES),
    # the watcher (warp 11, marked builds only)
    (_LOADER_DOC, _WATCHER + _LOADER_DOC),
    (_IDLE_WARPS, "            mk_streamer(queue, ctl.n, lane);\n"
                  "        else {\n            if (warp == MK_STREAMER_WARP + 1)\n"
                  "                mkp_watch(queue, ctl.n, lane);\n            return;\n        }\n"),
    # the interpreter between two streamed instructions of a block
    ("        /* C3 */\n        mk_compute_sync();\n",
     "        /* C3 */\n        mk_compute_sync();\n"
     "        if (tid == 0 && s.stream_stages > 0) MKP(s.stream_pos, 10);\n"),
    ("        if (tid == 0)\n            mk_compute_signal(q);\n",
     "        if (tid == 0 && s.stream_stages > 0) { mk_compute_signal(q); MKP(s.stream_pos, 11); }\n"
     "        else if (tid == 0)\n            mk_compute_signal(q);\n"),
    ("            stream_pos += s.stream_stages;\n",
     "            stream_pos += s.stream_stages;\n"
     "            if (s.stream_stages > 0) MKP(s.stream_pos, 12);\n"),
    ("        if (lane == 0)\n            mk_mbar_arrive(&ctl.full[mk_slot_of(q)]);\n",
     "        if (lane == 0 && s.stream_stages > 0) MKP(s.stream_pos, 13);\n"
     "        if (lane == 0)\n            mk_mbar_arrive(&ctl.full[mk_slot_of(q)]);\n"),
    ("        const bool ready = mk_mbar_wait(&ctl.full[mk_slot_of(q)], mk_slot_parity(q), deadline);\n",
     "        const bool ready = mk_mbar_wait(&ctl.full[mk_slot_of(q)], mk_slot_parity(q), deadline);\n"
     "        if (tid == 0 && ready && s.stream_stages > 0) MKP(s.stream_pos, 14);\n"),
    ("    const bool two = in.rows > 16;            /* m16 tiles: checked rows <= 32 */\n",
     "    if (threadIdx.x == 0 && pages.stream_stages > 0) MKP(pages.stream_pos, 15);\n"
     "    const bool two = in.rows > 16;            /* m16 tiles: checked rows <= 32 */\n"),
]


def patched(src, variant, marked):
    """The plain build of "asbuilt" is the device source unchanged (its cubin is the one the
    runtime caches)."""
    for a, b in (MARKS if marked else []) + VARIANTS[variant]:   # marks first: a variant
                                                                  # may change marked text
        n = src.count(a)
        assert n == 1, (a, n)
        src = src.replace(a, b)
    return "#define MKP_ON 1\n" + src if marked else src


_ORIGINAL = compiler.device_source


def use(variant, marked):
    compiler.device_source = lambda: patched(_ORIGINAL(), variant, marked)


CASES = [("4096x8-b16", 4096, 8, 16), ("4096x8-b64", 4096, 8, 64), ("8192x8-b16", 8192, 8, 16),
         ("1024x16-b16", 1024, 16, 16), ("4096x8-b1", 4096, 8, 1)]


def compile_parts(g, hidden, parts):
    """The chain compiled with every band split into `parts` k ranges (0: the rule's)."""
    if not parts:
        return megak.compile(g, backend="cuda")
    rule = gemm.stream_split
    per = -(-(-(-hidden // gemm.BOX_ROWS)) // parts)
    gemm.stream_split = lambda *a: (-(-(-(-hidden // gemm.BOX_ROWS)) // per), per * gemm.BOX_ROWS)
    try:
        return megak.compile(g, backend="cuda")
    finally:
        gemm.stream_split = rule


def module_global(prog, name: bytes, func=None):
    """(driver bindings, device address) of the __device__ variable `name` in the module of
    prog's megakernel (its plain build), or in the module holding kernel `func` (a resident
    kernel's build)."""
    from megak.runtime.driver import _bindings
    from megak.runtime.executor import kernel_handles
    drv = _bindings()
    if func is None:
        _, code, _, _ = prog._executor._variant(False)
        _, func = kernel_handles(code.get_kernel("megakernel"))
    _, mod = drv.cuFuncGetModule(func)
    err, dptr, _ = drv.cuModuleGetGlobal(mod, name)
    assert int(err) == 0, err
    return drv, dptr


def marks_of(prog):
    drv, dptr = module_global(prog, b"mk_probe_st")
    host = np.zeros(132 * MAXPOS * NMARK, dtype=np.uint64)
    drv.cuCtxSynchronize()
    drv.cuMemcpyDtoH(host.ctypes.data, dptr, host.nbytes)
    return host.reshape(132, MAXPOS, NMARK).astype(np.int64), (drv, dptr)


def med(x):
    return statistics.median(x) / 1e3 if len(x) else float("nan")


# the gap's steps, one after the other: the tail's end -> the compute barrier (C3) -> signalled
# (C4) -> the next instruction's pages taken by the loader (L3; its dependency wait follows)
# -> handed over (L7) -> seen by thread 0 (C1) -> the op's entry -> its k loop's entry
GAP_STEPS = ("g:barrier", "g:signal", "g:pages", "g:deps+handover", "g:seen", "g:entry",
             "g:kloop")


def analyse(m):
    """Medians over every (SM, stage) with the marks it needs, in us."""
    issue_land, a_wait, b_wait, mma, enter_first, ahead = [], [], [], [], [], []
    for sm in range(m.shape[0]):
        r = m[sm]
        for pos in np.nonzero(r[:, 4])[0]:
            t = r[pos]
            if t[1]:                      # first stage of an instruction
                enter_first.append(t[3] - t[1])
                ahead.append(int(np.count_nonzero((r[:, 0] != 0) & (r[:, 0] <= t[1])
                                                  & (np.arange(MAXPOS) >= pos))))
            b_wait.append(t[3] - t[9])
            a_wait.append(t[2] - t[3])
            mma.append(t[4] - t[2])
            if t[0] and t[3] - t[9] > 200:   # the warp waited: full seen ~ landed
                issue_land.append(t[3] - t[0])
    tail = {k: [] for k in ("kloop", "reduce", "reduce:warps", "reduce:sum", "combine",
                            "epilogue", "epi:to stores", "epi:stores", "epi:1st pass",
                            "epi:2nd pass", "gap")}
    gap_steps = {k: [] for k in GAP_STEPS}
    for sm in range(m.shape[0]):
        r = m[sm]
        firsts = [p for p in np.nonzero(r[:, 1])[0] if all(r[p, i] for i in range(5, 8))]
        for j, p in enumerate(firsts):
            t = r[p]
            for name, a, b in (("kloop", 1, 5), ("reduce", 5, 6), ("reduce:warps", 5, 19),
                               ("reduce:sum", 19, 6), ("combine", 6, 7), ("epilogue", 7, 8)):
                if t[a] and t[b]:
                    tail[name].append(t[b] - t[a])
            if t[18] and t[8]:            # epi2, epiloop: the two passes (17 is the second's)
                tail["epi:1st pass"].append(t[18] - t[7])
                tail["epi:2nd pass"].append(t[8] - t[18])
            elif t[17] and t[8]:          # to the first store, then the stores
                tail["epi:to stores"].append(t[17] - t[7])
                tail["epi:stores"].append(t[8] - t[17])
            if j + 1 < len(firsts):
                # the tail's end to the next instruction's k-loop entry: the release fence,
                # the signal, the next one's dependency wait and hand-over
                u = r[firsts[j + 1]]
                tail["gap"].append(u[1] - max(t[7], t[8]))
                steps = [max(t[7], t[8]), t[10], t[11], u[12], u[13], u[14], u[15], u[1]]
                if all(steps):
                    for name, a, b in zip(GAP_STEPS, steps, steps[1:]):
                        gap_steps[name].append(b - a)
    out = {k: med(v) for k, v in tail.items() if v or not k.startswith("epi:")}
    out |= {k: med(v) for k, v in gap_steps.items()}
    return out | {"issue->land (waited)": med(issue_land), "A wait": med(a_wait),
            "B wait": med(b_wait),
            "mma": med(mma), "enter->first": med(enter_first),
            "issued ahead at entry": statistics.median(ahead) if ahead else float("nan"),
            "B wait mean": float(np.mean(b_wait)) / 1e3 if b_wait else float("nan"),
            "A wait mean": float(np.mean(a_wait)) / 1e3 if a_wait else float("nan")}


def analyse_layers(m, layers):
    """The chain layer by layer, across SMs, in us (medians over layers 1 ..): the instructions
    sorted by k-loop entry fall into `layers` equal groups. hop = the first entry of layer l + 1
    after the last store of layer l (the signal's fence and add, the consumers' poll, hand-over
    and op entry); skew = its last entry after its first; span = its last store after its last
    entry (the slowest SM's k loop and tail); layer = store to store. first = layer 0's last
    store after its first entry (the ring's first fill: every SM's copies issued at once), chain
    = the last layer's last store after layer 0's first entry: the per-layer medians leave out
    layer 0, where two streamer loops can differ."""
    ins = []
    for sm in range(m.shape[0]):
        r = m[sm]
        for p in np.nonzero(r[:, 1])[0]:
            ins.append((r[p, 1], r[p, 8]))
    ins.sort()
    if layers < 2 or not ins or len(ins) % layers:
        return {}
    per = len(ins) // layers
    groups = [ins[i * per:(i + 1) * per] for i in range(layers)]
    entry_min = [min(e for e, _ in g) for g in groups]
    entry_max = [max(e for e, _ in g) for g in groups]
    stored = [max(d for _, d in g) for g in groups]
    hop = [entry_min[l + 1] - stored[l] for l in range(layers - 1)]
    skew = [entry_max[l] - entry_min[l] for l in range(1, layers)]
    span = [stored[l] - entry_max[l] for l in range(1, layers)]
    layer = [stored[l + 1] - stored[l] for l in range(layers - 1)]
    return {"layer": med(layer), "hop": med(hop), "skew": med(skew), "span": med(span),
            "first": (stored[0] - entry_min[0]) / 1e3, "chain": (stored[-1] - entry_min[0]) / 1e3}


def analyse_landing(m, bin_ns: int = 1000):
    """The GPU's weight delivery over the marked chain, from the watcher's landing stamps:
    every stage is a page (16 KiB), so the stages landed per `bin_ns` over all SMs are a rate.
    land TB/s p10/p50/p90 over the bins from the first k-loop entry to the last landing;
    low bins = the share of them under half the median; issue->land = every stage's copy
    latency (issue to landing, not only the stages a warp waited for); land->seen = landing to
    its reader seeing it full (a large one: pages wait for readers, not readers for pages).
    Returns (figures, the per-bin TB/s for the timeline line)."""
    from megak import pages
    landed, issued, seen = m[:, :, LANDED], m[:, :, 0], m[:, :, 3]
    ok = landed != 0
    if not ok.any() or not (m[:, :, 1] != 0).any():
        return {}, []
    start = int(m[:, :, 1][m[:, :, 1] != 0].min())
    t = np.sort(landed[ok]) - start
    t = t[t >= 0]
    edges = np.arange(0, (int(t[-1]) // bin_ns + 2) * bin_ns, bin_ns)   # the last in a bin
    counts, _ = np.histogram(t, bins=edges)
    tbs = counts * pages.PAGE_BYTES / (bin_ns * 1e-9) / 1e12
    both = ok & (issued != 0)
    read = ok & (seen != 0)
    p50 = float(np.median(tbs))
    return ({"land TB/s p10": float(np.percentile(tbs, 10)), "land TB/s p50": p50,
             "land TB/s p90": float(np.percentile(tbs, 90)),
             "low bins": float(np.mean(tbs < p50 / 2)),
             "issue->land (all)": med((landed - issued)[both]),
             "land->seen": med((seen - landed)[read])}, tbs.tolist())


def flush_for(inputs, args) -> bool:
    """Whether the timed runs flush the L2 first: as benchmarks.report does (only a working
    set the flush can evict, <= L2_FLUSH_BYTES), unless --flush always. A flushed run writes
    the flush's dirty lines back: 4096 x 8 takes ~12 us longer flushed, and the difference
    between two streamer loops showed only unflushed (benchmarks/ANALYSIS.md)."""
    from megak.runtime.bench import L2_FLUSH_BYTES
    return args.flush == "always" or sum(a.nbytes for a in inputs.values()) <= L2_FLUSH_BYTES


# the chains' build: streamed GEMMs only (the executor's MK_BODIES for their plans)
CHAIN_BODIES = compiler.bodies_defines(megak.ops.bodies(np.array(
    [(abi.OPCODE_OF["gemm"], abi.FLAG_STREAM | abi.FLAG_B_READY)],
    dtype=[("opcode", np.uint16), ("flags", np.uint32)])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", nargs="*", default=list(VARIANTS))
    ap.add_argument("--cases", nargs="*", default=[c[0] for c in CASES])
    ap.add_argument("--parts", nargs="*", type=int, default=[0],
                    help="k parts per band (0: the lowering's rule)")
    ap.add_argument("--flush", choices=("report", "always"), default="report",
                    help="L2 flush before each timed run: as the report does, or always")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        for v in args.variant:
            for marked in (False, True):
                use(v, marked)
                k = compiler.compile_megakernel("sm_90a", defines=CHAIN_BODIES)
                print(v, "marked" if marked else "plain", "cached" if k.from_cache else "compiled",
                      compiler.parse_ptxas_log(k.log), flush=True)
        compiler.device_source = _ORIGINAL
        return
    from megak.runtime.bench import Bench
    rng = np.random.default_rng(0)
    bf16 = numpy_dtype("bfloat16")
    for name, hidden, layers, batch in CASES:
        if name not in args.cases:
            continue
        g = chain(hidden, layers, batch)
        inputs = {"x": rng.uniform(-1, 1, (batch, hidden)).astype(np.float32).astype(bf16)}
        for i in range(layers):
            inputs[f"w{i}"] = (rng.uniform(-1, 1, (hidden, hidden)).astype(np.float32)
                               * np.float32(0.03)).astype(bf16)
        for v, parts in [(v, p) for v in args.variant for p in args.parts]:
            use(v, False)
            prog = compile_parts(g, hidden, parts)
            b = Bench(prog)
            b.upload(**inputs)
            t = float(np.median(b.time_megakernel(reps=40, flush_l2=flush_for(inputs, args))))
            b.close()
            prog.close()
            use(v, True)
            prog = compile_parts(g, hidden, parts)
            res = prog.run(**inputs)
            ref = inputs["x"].astype(np.float64)
            for i in range(layers):
                ref = (ref @ inputs[f"w{i}"].astype(np.float64)).astype(np.float32).astype(bf16).astype(np.float64)
            err = float(np.max(np.abs(res[f"h{layers - 1}"].astype(np.float64) - ref)))
            _, (drv, dptr) = marks_of(prog)
            drv.cuMemsetD8(dptr, 0, 132 * MAXPOS * NMARK * 8)
            prog.run(**inputs)
            m, _ = marks_of(prog)
            landing, timeline = analyse_landing(m)
            a = analyse(m) | analyse_layers(m, layers) | landing
            print(f"{name:12s} {v:8s} parts {parts or 'rule'} {t:8.1f} us  max|err| {err:.3g}  " +
                  "  ".join(f"{k} {x:.3f}" for k, x in a.items()), flush=True)
            print(f"{name:12s} {v:8s} land TB/s per us: " +
                  " ".join(f"{x:.1f}" for x in timeline), flush=True)
            prog.close()
    compiler.device_source = _ORIGINAL


if __name__ == "__main__":
    main()
