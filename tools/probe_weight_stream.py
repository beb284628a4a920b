#!/usr/bin/env python3
"""Probe: how fast one loader lane per SM streams weights through a ring of pages with TMA.

The mechanism the weight stream is built on, outside megak: a grid of one block per SM; in each
block one lane (warp 8) issues `cp.async.bulk.tensor.2d` copies of 64-column x 128-row bf16
boxes (16 KiB, 128-byte swizzle) of a weight matrix into a ring of R pages, completion on a
per-page `full` mbarrier (expect_tx); 8 consumer warps read each page with ldmatrix.trans and
run the m16n8k16 MMAs of a batch-16 layer on it (each warp one k16 step of the page), then hand
it back on the page's `empty` mbarrier. The layer chain is 8 layers of 4096 x 4096 (268 MB);
every SM streams an equal share of each layer (units of 128 k-rows x 64 columns, in order).

Modes: `sync` = the consumers of layer l + 1 wait until every SM finished layer l (a grid
counter, what a dependent chain does) while the loader lane streams on; `a` = each warp also
reads its k16 slice of a 16-row activation from L2 per page (a=1 just before the page, a=2
four pages ahead in registers, a=3 as 2 but from one of 4 copies of the activation, chosen by
the SM: a quarter of the SMs per L2 line, a=4 through a ring of 8 stages in shared memory that
a second lane (warp 9) fills with TMA copies, layer l's once the grid barrier passed layer
l - 1, every warp reading its slice with ldmatrix); `wide` = that many adjacent 64-column boxes per
k-block (wider row segments in DRAM); `hint` = L2 evict-first on the weights; `cap` = the lane
keeps at most that many copies in flight (it issues page p once page p - cap landed; 0: the
ring is the only bound); `rows` = k-rows per box (128, 64 or 32): a page then holds 128 / rows
adjacent boxes, a unit spans 64 x 128 / rows columns of rows k-rows (row segments of 128,
256 or 512 B in DRAM, and A per page of rows k-values: only warps 0 .. rows / 16 - 1 read it).
Reports TB/s of weights (median of 5).

    python tools/probe_weight_stream.py            # the sweep below
    python tools/probe_weight_stream.py --shapes   # the box shapes, caps and A copies
    python tools/probe_weight_stream.py --layouts  # boxes of 64 / 32 columns against packed

`layout` (--layouts): 0 = the boxes above; 2 = megak's narrow stage (two 32-column x 128-row
boxes, 64-B swizzle, stacked in k: 32 columns x 256 k-rows a page, N / 32 bands); 1 = packed:
every unit's 16 KiB contiguous in memory, in the order the SMs read them (a weight layout made
for the stream), one 1-D bulk copy each (the page's contents are not the boxes' layout: the
MMAs time the same work on other bytes). On the H200 (2026-12-04, two rounds, R = 10,
benchmarks/results/boundary/layouts.log), TB/s of the 268 MB: free-running boxes64 3.53 / 3.57,
narrow32 3.11 / 3.17, packed 3.78 / 3.78; behind the grid barrier between layers 3.21 / 3.19,
3.11 / 3.12, 3.26 / 3.29 (82.4 / 81.7 us packed, 85.9 / 86.2 narrow32).
"""
import ctypes
import statistics

import numpy as np

from megak.runtime import memory as mem
from megak.runtime.compiler import compile_source
from megak.runtime.driver import _bindings, check, device_info

SOURCE = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
#define PAGE 16384
__device__ __forceinline__ u32 sa(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(u64* b, u32 n)
{ asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sa(b)), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_arrive(u64* b)
{ asm volatile("{ .reg .b64 s; mbarrier.arrive.shared::cta.b64 s, [%0]; }" :: "r"(sa(b)) : "memory"); }
__device__ __forceinline__ void mbar_expect(u64* b, u32 tx)
{ asm volatile("{ .reg .b64 s; mbarrier.arrive.expect_tx.shared::cta.b64 s, [%0], %1; }" :: "r"(sa(b)), "r"(tx) : "memory"); }
__device__ __forceinline__ bool mbar_try(u64* b, u32 par)
{ u32 ok; asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
  : "=r"(ok) : "r"(sa(b)), "r"(par) : "memory"); return ok != 0; }
__device__ __forceinline__ void mbar_wait(u64* b, u32 par) { while (!mbar_try(b, par)) {} }

#define ADEPTH 8     /* a=4: stages of the activation ring (4 KiB each, 2 pages) */

extern "C" __global__ void __launch_bounds__(320, 1)
probe(const unsigned char* tmaps, const unsigned short* act, u32* grid_ctr, u32 layers, u32 K,
      u32 N, u32 R, u32 sync, u32 use_a, u32 hint, u32 wide, float* sink, u32 cap, u32 rows,
      const unsigned char* wbytes, u32 layout)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* pages = (unsigned char*)(((unsigned long long)smem + 1023) & ~1023ull);
    u64* full = (u64*)(pages + 13 * PAGE);
    u64* empty = full + 16;
    u64* afull = empty + 16;
    u64* aempty = afull + ADEPTH;
    unsigned char* aring = pages + 11 * PAGE;   /* a=4 (R <= 11): its stages, 2 boxes each */
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        for (u32 i = 0; i < R; ++i) { mbar_init(&full[i], 1); mbar_init(&empty[i], 8); }
        for (u32 i = 0; i < ADEPTH; ++i) { mbar_init(&afull[i], 1); mbar_init(&aempty[i], 8); }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    /* a unit = one page: `boxes` adjacent 64-column boxes of `rows` k-rows */
    const u32 boxes = 128 / rows, bands = N / (64 * boxes), kblocks = K / rows,
              units = layout == 2 ? (N / 32) * (K / 256) : bands * kblocks;
    const void* tmap = tmaps + 128 * (rows == 128 ? 0 : rows == 64 ? 1 : 2);
    const u32 g = gridDim.x, b = blockIdx.x;
    const u32 u0 = (u64)units * b / g, u1 = (u64)units * (b + 1) / g;
#define KROW(u) ((((u) % (kblocks * wide)) / wide) * rows)
    if (warp == 9) {   /* a=4: one lane copies each page's activation slice (TMA, 2 boxes of
                          64 k x 16 rows, 128-B swizzle) into the A ring, layer l's once the
                          grid barrier says layer l - 1 is done, as far ahead as the ring goes */
        if (lane != 0 || use_a != 4) return;
        const void* amap = tmaps + 3 * 128;
        u32 apos = 0;
        for (u32 l = 0; l < layers; ++l) {
            if (sync && l > 0) {
                u32 v; do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(grid_ctr)); } while (v < g * l);
                asm volatile("fence.proxy.async.global;" ::: "memory");   /* generic -> TMA reads */
            }
            for (u32 u = u0; u < u1; ++u, ++apos) {
                const u32 slot = apos % ADEPTH;
                if (apos >= ADEPTH) mbar_wait(&aempty[slot], ((apos / ADEPTH) - 1) & 1);
                mbar_expect(&afull[slot], 4096);
                for (u32 j = 0; j < 2; ++j)
                    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                                 " [%0], [%1, {%2, %3}], [%4];"
                                 :: "r"(sa(aring + slot * 4096 + j * 2048)), "l"(amap),
                                    "r"((int)(KROW(u) + 64 * j)), "r"((int)(l * 16)),
                                    "r"(sa(&afull[slot])) : "memory");
            }
        }
        return;
    }
    if (warp == 8) {
        if (lane != 0) return;
        u64 pol;
        if (hint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        else asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
        u32 pos = 0;
        for (u32 l = 0; l < layers; ++l)
            for (u32 u = u0; u < u1; ++u, ++pos) {
                const u32 slot = pos % R;
                if (pos >= R) mbar_wait(&empty[slot], ((pos / R) - 1) & 1);
                if (cap && pos >= cap) mbar_wait(&full[(pos - cap) % R], ((pos - cap) / R) & 1);
                mbar_expect(&full[slot], PAGE);
                if (layout == 1) {   /* packed: unit u of layer l is 16 KiB at (l units + u) PAGE */
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                                 " [%0], [%1], %2, [%3], %4;"
                                 :: "r"(sa(pages + slot * PAGE)),
                                    "l"(wbytes + ((u64)l * units + u) * PAGE), "r"((u32)PAGE),
                                    "r"(sa(&full[slot])), "l"(pol) : "memory");
                    continue;
                }
                if (layout == 2) {   /* narrow: 32 columns x 256 k-rows, two boxes of 128 */
                    const u32 kb = K / 256, band = u / kb;
                    const int c0 = (int)(band * 32), r0 = (int)(l * K + (u % kb) * 256);
                    for (u32 x = 0; x < 2; ++x)
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                                     " [%0], [%1, {%2, %3}], [%4], %5;"
                                     :: "r"(sa(pages + slot * PAGE + x * (PAGE / 2))), "l"(tmaps + 4 * 128),
                                        "r"(c0), "r"(r0 + (int)(128 * x)), "r"(sa(&full[slot])),
                                        "l"(pol) : "memory");
                    continue;
                }
                const u32 grp = u / (kblocks * wide), in = u % (kblocks * wide);
                const int c0 = (int)((grp * wide + in % wide) * 64 * boxes);
                const int r0 = (int)(l * K + (in / wide) * rows);
                for (u32 x = 0; x < boxes; ++x)
                    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                                 " [%0], [%1, {%2, %3}], [%4], %5;"
                                 :: "r"(sa(pages + slot * PAGE + x * (PAGE / boxes))), "l"(tmap),
                                    "r"(c0 + (int)(64 * x)), "r"(r0), "r"(sa(&full[slot])),
                                    "l"(pol) : "memory");
            }
        return;
    }
    float acc[8][4];
    for (int i = 0; i < 8; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
    u32 a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
    u32 ar[4][4];
    const int gq = lane >> 2, q = lane & 3;
    /* a=3: this SM's copy of the activation (4 copies, layers x 16 x K each) */
    const unsigned short* act_c = act + (use_a == 3 ? (u64)(b & 3) * layers * 16 * K : 0);
    const bool reads_a = 16 * warp < rows;   /* the page's k-rows: warps past them reuse a */
#define LOADA(dst, l_, u_) do { if (!reads_a) break; const unsigned short* ap = act_c + (u64)(l_) * 16 * K + KROW(u_) + 16 * warp; \
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(dst[0]) : "l"(ap + gq * K + 2 * q)); \
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(dst[1]) : "l"(ap + (gq + 8) * K + 2 * q)); \
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(dst[2]) : "l"(ap + gq * K + 2 * q + 8)); \
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(dst[3]) : "l"(ap + (gq + 8) * K + 2 * q + 8)); } while (0)
    u32 pos = 0;
    const int kr = 16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8;   /* ldmatrix row of this lane */
    for (u32 l = 0; l < layers; ++l) {
        if (sync && l > 0) {
            if (tid == 0) {
                u32 v; do { asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(grid_ctr)); } while (v < g * l);
            }
            asm volatile("bar.sync 1, 256;" ::: "memory");
        }
        for (u32 u = u0; u < u1; ++u, ++pos) {
            const u32 slot = pos % R;
            if (use_a == 1)
                LOADA(a, l, u);
            if (use_a >= 2) {   /* 4 pages ahead: a ring of registers (unit index mod 4) */
                if (u == u0)
                    for (u32 v = u0; v < u0 + 4 && v < u1; ++v) {
                        const u32 t = (v - u0) & 3;
                        if (t == 0) LOADA(ar[0], l, v); else if (t == 1) LOADA(ar[1], l, v);
                        else if (t == 2) LOADA(ar[2], l, v); else LOADA(ar[3], l, v);
                    }
                const u32 t = (u - u0) & 3;
#pragma unroll
                for (int i = 0; i < 4; ++i) a[i] = t == 0 ? ar[0][i] : t == 1 ? ar[1][i] : t == 2 ? ar[2][i] : ar[3][i];
                if (u + 4 < u1) { if (t == 0) LOADA(ar[0], l, u + 4); else if (t == 1) LOADA(ar[1], l, u + 4);
                                  else if (t == 2) LOADA(ar[2], l, u + 4); else LOADA(ar[3], l, u + 4); }
            }
            if (use_a == 4) {   /* this warp's k16 slice: box w / 4, chunks 2 (w % 4), + 1 */
                const u32 as = pos % ADEPTH;
                mbar_wait(&afull[as], (pos / ADEPTH) & 1);
                const u32 r = lane & 15, chunk = 2 * (warp & 3) + (lane >> 4);
                const u32 addr = sa(aring + as * 4096 + (warp >> 2) * 2048) + 128 * r +
                                 ((chunk ^ (r & 7)) << 4);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(addr));
                __syncwarp();
                if (lane == 0) mbar_arrive(&aempty[as]);
            }
            mbar_wait(&full[slot], (pos / R) & 1);
            const u32 base = sa(pages + slot * PAGE);
#pragma unroll
            for (int j = 0; j < 4; ++j) {            /* n16 pair j: 16-B chunks 2j, 2j + 1 */
                const u32 chunk = 2 * j + (lane >> 4);
                const u32 addr = base + kr * 128 + ((chunk ^ (kr & 7)) << 4);
                u32 bf[4];
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(bf[0]), "=r"(bf[1]), "=r"(bf[2]), "=r"(bf[3]) : "r"(addr));
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                                 : "+f"(acc[2 * j + h][0]), "+f"(acc[2 * j + h][1]),
                                   "+f"(acc[2 * j + h][2]), "+f"(acc[2 * j + h][3])
                                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),
                                   "r"(bf[2 * h]), "r"(bf[2 * h + 1]));
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
        }
        if (sync) {
            asm volatile("bar.sync 1, 256;" ::: "memory");
            if (tid == 0) { __threadfence(); atomicAdd(grid_ctr, 1u); }
        }
    }
    float s = 0.f;
    for (int i = 0; i < 8; ++i) for (int j = 0; j < 4; ++j) s += acc[i][j];
    if (s == 12345.f) sink[tid] = s;   /* keep the MMAs */
}
"""


def main(shapes: bool = False, layouts: bool = False):
    drv = _bindings()
    from cuda.core import Device, ObjectCode
    dev = Device(0)
    dev.set_current()
    info = device_info(0)
    n_sm = info["sm_count"]
    compiled = compile_source(SOURCE, arch=info["arch"], entry="probe", name="probe_weight_stream.cu")
    print(compiled.log if hasattr(compiled, "log") else "")
    code = ObjectCode.from_cubin(compiled.cubin)
    func = check(drv.cuKernelGetFunction(code.get_kernel("probe").handle), "cuKernelGetFunction")
    smem = 1024 + 13 * 16384 + 512
    check(drv.cuFuncSetAttribute(
        func, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
        "cuFuncSetAttribute")
    layers, K, N = 8, 4096, 4096
    m = mem.Memory(0)
    w = m.device(layers * K * N * 2, "weights")
    act = m.device(4 * layers * 16 * K * 2, "act")   # 4 copies (a=3)
    ctr = m.device(64, "ctr")
    sink = m.device(4096, "sink")
    stream = dev.create_stream()
    h = stream.handle
    mem.memset32(w.ptr, 0x3F803F80, layers * K * N // 2, h)
    mem.memset32(act.ptr, 0x3F803F80, 4 * layers * 16 * K // 2, h)
    T = drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16

    def encode(box_rows, ptr=w.ptr, cols=N, rows=layers * K, box_cols=64):
        swz = (drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if box_cols == 64
               else drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B)
        tm = check(drv.cuTensorMapEncodeTiled(
            T, 2, ptr, [drv.cuuint64_t(cols), drv.cuuint64_t(rows)], [drv.cuuint64_t(cols * 2)],
            [drv.cuuint32_t(box_cols), drv.cuuint32_t(box_rows)], [drv.cuuint32_t(1), drv.cuuint32_t(1)],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            swz,
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "encode")
        return np.array([int(x) for x in tm.opaque], dtype=np.uint64)

    # the weights in boxes of 128, 64 and 32 k-rows; the activation (a=4) in boxes of 16 rows
    tmap = m.device(5 * 128, "tmaps")
    staging = m.pinned(5 * 128, "tmap staging")
    staging.array(np.uint64, (80,))[:] = np.concatenate(
        [encode(r) for r in (128, 64, 32)] + [encode(16, act.ptr, K, layers * 16)]
        + [encode(128, box_cols=32)])
    mem.htod(tmap.ptr, staging.ptr, 5 * 128, h)
    check(drv.cuStreamSynchronize(h), "sync")
    start, end = (check(drv.cuEventCreate(0), "event") for _ in range(2))

    def run(R, sync, use_a, hint, wide=1, cap=0, rows=128, layout=0):
        assert use_a != 4 or (R <= 11 and rows == 128), "a=4: the A ring takes pages 11-12"
        mem.memset32(ctr.ptr, 0, 16, h)
        vals = [ctypes.c_uint64(tmap.ptr), ctypes.c_uint64(act.ptr), ctypes.c_uint64(ctr.ptr),
                ctypes.c_uint32(layers), ctypes.c_uint32(K), ctypes.c_uint32(N),
                ctypes.c_uint32(R), ctypes.c_uint32(sync), ctypes.c_uint32(use_a),
                ctypes.c_uint32(hint), ctypes.c_uint32(wide), ctypes.c_uint64(sink.ptr),
                ctypes.c_uint32(cap), ctypes.c_uint32(rows), ctypes.c_uint64(w.ptr),
                ctypes.c_uint32(layout)]
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        check(drv.cuEventRecord(start, h), "record")
        check(drv.cuLaunchCooperativeKernel(func, n_sm, 1, 1, 320, 1, 1, smem, h,
                                            ctypes.addressof(argv)), "launch")
        check(drv.cuEventRecord(end, h), "record")
        check(drv.cuEventSynchronize(end), "event sync")
        return check(drv.cuEventElapsedTime(start, end), "elapsed") * 1e3   # us

    nbytes = layers * K * N * 2
    print(f"{n_sm} SMs, {layers} x {K} x {N} bf16 = {nbytes / 1e6:.0f} MB of weights")
    if layouts:
        # the same bytes and order per SM as 64-column boxes (megak's wide bands), as two
        # 32-column boxes per page (its narrow bands), or packed (each unit 16 KiB contiguous)
        for rnd in range(2):
            for sync in (0, 1):
                for layout, name in ((0, "boxes64"), (2, "narrow32"), (1, "packed")):
                    ts = [run(10, sync, 0, 1, 1, 0, 128, layout) for _ in range(8)][1:]
                    t = statistics.median(ts)
                    print(f"round {rnd} R=10 sync={sync} {name:9s}: {t:7.1f} us "
                          f"{nbytes / t / 1e6:5.2f} TB/s", flush=True)
        m.close()
        return
    if shapes:
        # every SM a share, layers behind a grid barrier; A none / 4 pages ahead / from copies
        for R in (8, 10):
            for cap in (0, 3, 4, 6):
                for rows in (128, 64, 32):
                    for use_a in (0, 2, 3, 4) if rows == 128 else (0, 2, 3):
                        ts = [run(R, 1, use_a, 1, 1, cap, rows) for _ in range(6)][1:]
                        t = statistics.median(ts)
                        print(f"R={R:2d} cap={cap} rows={rows:3d} a={use_a}: {t:7.1f} us "
                              f"{nbytes / t / 1e6:5.2f} TB/s", flush=True)
        m.close()
        return
    for R in (4, 8, 12):
        for sync, use_a, hint, wide in ((0, 0, 1, 1), (0, 0, 1, 2), (0, 0, 1, 4), (0, 0, 0, 4),
                                        (1, 0, 1, 4), (1, 1, 1, 4), (1, 2, 1, 1), (1, 2, 1, 4)):
            ts = [run(R, sync, use_a, hint, wide) for _ in range(6)][1:]
            t = statistics.median(ts)
            print(f"R={R:2d} sync={sync} a={use_a} evict_first={hint} wide={wide}: {t:7.1f} us "
                  f"{nbytes / t / 1e6:5.2f} TB/s", flush=True)
    m.close()


if __name__ == "__main__":
    import sys
    main(shapes="--shapes" in sys.argv[1:], layouts="--layouts" in sys.argv[1:])
