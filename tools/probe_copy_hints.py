#!/usr/bin/env python3
"""Probe: the register copy's cache hints and interleave, against cuMemcpyDtoD, on 1 GiB.

W5 (a 1 GiB fp32 copy) runs at ~3,817 GB/s in megak (ops/copy.cuh: ld.global.cg, plain
st.global, a rolling pipeline of 16 float4 per thread, 1 MiB bands per instruction) where a
device-to-device cuMemcpy reaches ~4,230 and the target is 4,100. tools/probe_bulk_copy.py
found no bulk or register pattern above 3,952 (a grid-stride register copy) and +3% from
interleaving the bands finely. What it did not try, and this probe does: the loads' L2 sector
prefetch (`.L2::256B`: one request fills both 128-B halves of a 256-B DRAM burst), with and
without L1 allocation (`.L1::no_allocate`; not `.nc`, whose loads ptxas moves next to their
stores, since they cannot alias them, leaving a few in flight), streaming stores (`.cs`) and an
evict-first policy on the stores, each on megak's footprint (one block of 256 threads per SM,
16 float4 per thread in flight) and on more (32 per thread), over bands interleaved across the
blocks (band j -> block j % grid) of 4 KiB to 1 MiB.

Kernel `copy_<ld>_<st>_<u>`: block b takes bands b, b + grid, ...; within a band its 256
threads copy U float4 each per step (U loads, then U stores), unit i of the band at thread
i % 256 of step i / (256 U). Every variant: dst poisoned, a warm-up run, dst compared with
src on the device (every 16-B word), then `--reps` timed runs (CUDA events), GB/s = 2 x
bytes / median (read + write). L2 is not flushed (1 GiB >> 60 MB).

    python tools/probe_copy_hints.py [--gib 1] [--reps 20] [--out probe_copy_hints.json]
    python tools/probe_copy_hints.py --occupancy [--bands 65536 1048576]
                                      # the plain copy by 8-32 warps a block, 2-16 float4 a
                                      # thread, one block per SM, its bands dealt out or
                                      # taken in turn (by the block, or by each warp for
                                      # itself), against a one-shot grid
    python tools/probe_copy_hints.py --compile-only      # no GPU: ptxas registers and spills

On the H200 (--occupancy): the one-shot grid 4,242 GB/s; bands dealt out at most 4,005 (16
warps), 3,841 with megak's 8; 64 KiB bands taken in turn 4,118 with 8 warps, 4,178 with 16.
On an H100: cuMemcpyDtoD 3,010; 64 KiB block bands taken 3,020-3,033, warps taking their own
8 KiB bands 3,011, 32 KiB 2,929 (benchmarks/results/warp-takers/occupancy-h100.log).
"""
import argparse
import ctypes
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

from megak.runtime.compiler import compile_source, parse_ptxas_log  # noqa: E402
from probe_bulk_copy import DATA_AND_CHECK, compile_only  # noqa: E402  (tools/, beside this file)
from probe_ptx import kernel_functions, open_gpu  # noqa: E402

LOADS = {"cg": "ld.global.cg.v4.f32",
         "cg256": "ld.global.cg.L2::256B.v4.f32",
         "na256": "ld.global.L1::no_allocate.L2::256B.v4.f32"}
STORES = {"st": "st.global.v4.f32", "cs": "st.global.cs.v4.f32",
          "ef": "st.global.L2::cache_hint.v4.f32"}
UNROLLS = (16, 32)
# --occupancy: the plain copy (cg / st) by one block per SM of w warps, u float4 per thread a
# step, (w, u) below (at most 64 registers a thread at 32 warps: no 16 float4 there), against
# a one-shot grid as torch's elementwise kernels run it (blocks of 128 threads, 2 float4
# each: 4,174 GB/s on the H200, benchmarks/ANALYSIS.md) and the same persistent blocks taking
# their bands in turn from a counter (TAKEN_SHAPES)
OCC_SHAPES = tuple((w, u) for w in (8, 16, 32) for u in (2, 4, 8, 16) if w * u <= 256)


def entry(ld: str, st: str, u: int, threads: int = 256) -> str:
    return f"copy_{ld}_{st}_{u}" + (f"_t{threads}" if threads != 256 else "")


# (warps, unroll) of the copy whose bands are taken in turn from a counter (copy_taken)
TAKEN_SHAPES = ((8, 8), (8, 16), (16, 4), (16, 8))


def taken_entry(w: int, u: int) -> str:
    return f"copy_taken_{u}_t{32 * w}"


# (warps, unroll) of the copy whose warps take their own bands in turn (copy_warp_taken): no
# block barrier, so one warp's loads are in flight while another works out its next band
WARP_TAKEN_SHAPES = ((8, 16), (16, 8))
# the bands a warp takes (bytes): a warp's share of one step of the block, 4x it, 16x it
WARP_BANDS = (8192, 32768, 131072)


def warp_taken_entry(w: int, u: int) -> str:
    return f"copy_warp_taken_{u}_t{32 * w}"


OCC_ENTRIES = tuple(entry("cg", "st", u, 32 * w) for w, u in OCC_SHAPES if (w, u) != (8, 16)) \
    + tuple(taken_entry(w, u) for w, u in TAKEN_SHAPES) \
    + tuple(warp_taken_entry(w, u) for w, u in WARP_TAKEN_SHAPES)
ENTRIES = tuple(entry(ld, st, u) for ld in LOADS for st in STORES for u in UNROLLS) + \
    OCC_ENTRIES + ("oneshot", "fill", "verify")

_BODY = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

template <int LD> __device__ __forceinline__ float4 ld4(const float4* p);
template <int ST> __device__ __forceinline__ void st4(float4* p, float4 v, u64 pol);
%(loads)s
%(stores)s

/* units [b0, end) of a band: T threads copy U float4 each per step (U loads, then U stores) */
template <int LD, int ST, int U, int T>
__device__ __forceinline__ void copy_band(const float4* src, float4* dst, u64 b0, u64 end,
                                          u64 pol)
{
    for (u64 i = b0 + threadIdx.x; i < end; i += (u64)U * T) {
        float4 v[U];
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u64 j = i + (u64)T * k;
            v[k] = j < end ? ld4<LD>(src + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int k = 0; k < U; ++k) {
            const u64 j = i + (u64)T * k;
            if (j < end)
                st4<ST>(dst + j, v[k], pol);
        }
    }
}

/* band j -> block j %% grid; a band is `band` float4 units, its last one may be short; T
 * threads a block */
template <int LD, int ST, int U, int T = 256>
__device__ __forceinline__ void copy_bands(const float4* src, float4* dst, u64 n, u64 band)
{
    u64 pol = 0;
    if (ST == 2)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %%0, 1.0;" : "=l"(pol));
    for (u64 b0 = (u64)blockIdx.x * band; b0 < n; b0 += (u64)gridDim.x * band)
        copy_band<LD, ST, U, T>(src, dst, b0, b0 + band < n ? b0 + band : n, pol);
}

/* the plain copy's bands taken in turn: block b's next band is the one a shared counter
 * hands out (atomicAdd; *next zeroed before the launch), so a block that ran faster takes
 * more of them instead of idling at the end */
template <int U, int T>
__device__ __forceinline__ void copy_taken(const float4* src, float4* dst, u64 n, u64 band,
                                           u64* next)
{
    __shared__ u64 mine;
    for (;;) {
        if (threadIdx.x == 0)
            mine = atomicAdd(next, 1ull);
        __syncthreads();
        const u64 b0 = mine * band;
        __syncthreads();                    /* every thread has read `mine` */
        if (b0 >= n)
            return;
        copy_band<0, 0, U, T>(src, dst, b0, b0 + band < n ? b0 + band : n, 0);
    }
}

/* each warp takes its own bands from the shared counter (lane 0's atomicAdd, a shuffle to
 * the warp): no block barrier, so a warp working out its next band leaves the other warps'
 * loads in flight; within its band lane l copies units l, l + 32, ..., U per step */
template <int U>
__device__ __forceinline__ void copy_warp_taken(const float4* src, float4* dst, u64 n, u64 band,
                                                u64* next)
{
    const u32 lane = threadIdx.x & 31u;
    for (;;) {
        u64 mine = 0;
        if (lane == 0)
            mine = atomicAdd(next, 1ull);
        const u64 b0 = __shfl_sync(0xffffffffu, mine, 0) * band;
        if (b0 >= n)
            return;
        const u64 end = b0 + band < n ? b0 + band : n;
        for (u64 i = b0 + lane; i < end; i += 32ull * U) {
            float4 v[U];
#pragma unroll
            for (int k = 0; k < U; ++k) {
                const u64 j = i + 32ull * k;
                v[k] = j < end ? ld4<0>(src + j) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int k = 0; k < U; ++k) {
                const u64 j = i + 32ull * k;
                if (j < end)
                    st4<0>(dst + j, v[k], 0);
            }
        }
    }
}

%(entries)s

/* torch's elementwise form: one block of 128 threads per 256 float4, each thread 2 */
extern "C" __global__ void __launch_bounds__(128) oneshot(const float4* s, float4* d, u64 n)
{
    const u64 i = (u64)blockIdx.x * 256u + threadIdx.x;
    const float4 a = i < n ? ld4<0>(s + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    const float4 b = i + 128u < n ? ld4<0>(s + i + 128u) : make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < n)
        st4<0>(d + i, a, 0);
    if (i + 128u < n)
        st4<0>(d + i + 128u, b, 0);
}
"""


def source() -> str:
    loads = "\n".join(
        f"template <> __device__ __forceinline__ float4 ld4<{i}>(const float4* p)\n"
        f"{{ float4 v; asm volatile(\"{op} {{%0, %1, %2, %3}}, [%4];\" : \"=f\"(v.x), "
        f"\"=f\"(v.y), \"=f\"(v.z), \"=f\"(v.w) : \"l\"(p)); return v; }}"
        for i, op in enumerate(LOADS.values()))
    stores = []
    for i, op in enumerate(STORES.values()):
        hint = ", %5" if "cache_hint" in op else ""
        stores.append(
            f"template <> __device__ __forceinline__ void st4<{i}>(float4* p, float4 v, u64 pol)\n"
            f"{{ asm volatile(\"{op} [%0], {{%1, %2, %3, %4}}{hint};\" : : \"l\"(p), "
            f"\"f\"(v.x), \"f\"(v.y), \"f\"(v.z), \"f\"(v.w), \"l\"(pol) : \"memory\"); }}")
    entries = "\n".join(
        f"extern \"C\" __global__ void __launch_bounds__(256, 1)\n{entry(ld, st, u)}"
        f"(const float4* s, float4* d, u64 n, u64 band) "
        f"{{ copy_bands<{li}, {si}, {u}>(s, d, n, band); }}"
        for li, ld in enumerate(LOADS) for si, st in enumerate(STORES) for u in UNROLLS) + \
        "\n" + "\n".join(
            f"extern \"C\" __global__ void __launch_bounds__({32 * w}, 1)\n"
            f"{entry('cg', 'st', u, 32 * w)}(const float4* s, float4* d, u64 n, u64 band) "
            f"{{ copy_bands<0, 0, {u}, {32 * w}>(s, d, n, band); }}"
            for w, u in OCC_SHAPES if (w, u) != (8, 16)) + "\n" + "\n".join(
            f"extern \"C\" __global__ void __launch_bounds__({32 * w}, 1)\n"
            f"{taken_entry(w, u)}(const float4* s, float4* d, u64 n, u64 band, u64* next) "
            f"{{ copy_taken<{u}, {32 * w}>(s, d, n, band, next); }}"
            for w, u in TAKEN_SHAPES) + "\n" + "\n".join(
            f"extern \"C\" __global__ void __launch_bounds__({32 * w}, 1)\n"
            f"{warp_taken_entry(w, u)}(const float4* s, float4* d, u64 n, u64 band, u64* next) "
            f"{{ copy_warp_taken<{u}>(s, d, n, band, next); }}"
            for w, u in WARP_TAKEN_SHAPES)
    return (_BODY % {"loads": loads, "stores": "\n".join(stores), "entries": entries}
            + DATA_AND_CHECK)


def compile_probe(arch):
    return compile_source(source(), arch=arch, entry=ENTRIES[0], name="probe_copy_hints.cu")


def run(args):
    import numpy as np

    from megak.runtime import memory as mem
    from megak.runtime.driver import check

    drv, dev, info = open_gpu()
    n_sm = info["sm_count"]
    compiled = compile_probe(info["arch"])
    regs = {e: parse_ptxas_log(compiled.log, e) for e in ENTRIES}
    fn = kernel_functions(drv, compiled.cubin, ENTRIES)
    nbytes = int(args.gib * (1 << 30)) // 16 * 16
    n16 = nbytes // 16
    m = mem.Memory(0)
    src, dst = m.device(nbytes, "src"), m.device(nbytes, "dst")
    res = m.device(16, "verify result")
    counter = m.device(8, "band counter")
    host = m.pinned(16, "readback")
    stream = dev.create_stream()
    h = stream.handle
    keep = []

    def launch(f, grid, block, *vals):
        argv = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        keep.append((vals, argv))
        check(drv.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, h, ctypes.addressof(argv), 0),
              "cuLaunchKernel")

    launch(fn["fill"], 4 * n_sm, 1024, ctypes.c_uint64(src.ptr), ctypes.c_uint64(nbytes // 4))
    check(drv.cuStreamSynchronize(h), "sync")
    ev = [(check(drv.cuEventCreate(0), "event"), check(drv.cuEventCreate(0), "event"))
          for _ in range(args.reps)]

    def measure(name, enqueue):
        mem.memset32(dst.ptr, 0x7FC0DEAD, nbytes // 4, h)
        enqueue()
        mem.memset32(res.ptr, 0, 2, h)
        mem.memset32(res.ptr + 8, 0xFFFFFFFF, 2, h)
        launch(fn["verify"], 4 * n_sm, 1024, ctypes.c_uint64(src.ptr), ctypes.c_uint64(dst.ptr),
               ctypes.c_uint64(n16), ctypes.c_uint64(res.ptr))
        mem.dtoh(host.ptr, res.ptr, 16, h)
        check(drv.cuStreamSynchronize(h), "sync")
        bad = int(host.array(np.uint64, (2,))[0])
        if bad:
            raise RuntimeError(f"{name}: dst differs from src in {bad} of {n16} 16-B words")
        for a, b in ev:
            check(drv.cuEventRecord(a, h), "cuEventRecord")
            enqueue()
            check(drv.cuEventRecord(b, h), "cuEventRecord")
        check(drv.cuStreamSynchronize(h), "sync")
        keep.clear()
        return [check(drv.cuEventElapsedTime(a, b), "cuEventElapsedTime") * 1e3 for a, b in ev]

    def taken(e, w, band):
        """Entry e on one block of w warps per SM, its bands of `band` bytes handed out by
        the counter (zeroed first)."""
        mem.memset32(counter.ptr, 0, 2, h)
        launch(fn[e], n_sm, 32 * w, ctypes.c_uint64(src.ptr), ctypes.c_uint64(dst.ptr),
               ctypes.c_uint64(n16), ctypes.c_uint64(band // 16), ctypes.c_uint64(counter.ptr))

    rows = []

    def record(name, enqueue, **meta):
        ts = measure(name, enqueue)
        med = statistics.median(ts)
        rows.append(dict(variant=name, **meta, median_us=med, min_us=min(ts),
                         gbps=2 * nbytes / med / 1e3, times_us=ts))
        print(f"{name:<36}{med:>10.1f} us{2 * nbytes / med / 1e3:>8.0f} GB/s", flush=True)

    print(f"{info['name']}: {n_sm} SMs; copy of {nbytes / (1 << 30):.3f} GiB; GB/s = 2 x bytes "
          f"/ median of {args.reps}; registers: " + ", ".join(
              f"{e} {regs[e]['registers']}" for e in ENTRIES[:-2]) + "; spills " +
          str(sum(regs[e]["spill_stores"] + regs[e]["spill_loads"] for e in ENTRIES)) + " B",
          flush=True)
    record("cuMemcpyDtoDAsync", lambda: check(drv.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, h),
                                              "cuMemcpyDtoDAsync"), kind="memcpy")
    bands = [int(b) for b in args.bands]
    if args.occupancy:
        record("oneshot (128 threads, 2 float4 each)", lambda: launch(
            fn["oneshot"], (n16 + 255) // 256, 128, ctypes.c_uint64(src.ptr),
            ctypes.c_uint64(dst.ptr), ctypes.c_uint64(n16)), kind="oneshot")
        for band in bands:
            for w, u in OCC_SHAPES:
                e = entry("cg", "st", u, 32 * w)   # (8, 16): the hints' own copy_cg_st_16
                record(f"{w} warps u{u} band {band >> 10} KiB", lambda e=e, w=w, band=band:
                       launch(fn[e], n_sm, 32 * w, ctypes.c_uint64(src.ptr),
                              ctypes.c_uint64(dst.ptr), ctypes.c_uint64(n16),
                              ctypes.c_uint64(band // 16)),
                       kind="reg", load="cg", store="st", unroll=u, warps=w, band_bytes=band)
            for w, u in TAKEN_SHAPES:
                record(f"{w} warps u{u} band {band >> 10} KiB, taken in turn",
                       lambda e=taken_entry(w, u), w=w, band=band: taken(e, w, band),
                       kind="taken", load="cg", store="st", unroll=u, warps=w, band_bytes=band)
        for band in WARP_BANDS:
            for w, u in WARP_TAKEN_SHAPES:
                record(f"{w} warps u{u} warp band {band >> 10} KiB, taken",
                       lambda e=warp_taken_entry(w, u), w=w, band=band: taken(e, w, band),
                       kind="warp_taken", load="cg", store="st", unroll=u, warps=w,
                       band_bytes=band)
        bands = []
    for band in bands:
        for u in UNROLLS:
            for ld in LOADS:
                for st in STORES:
                    name = f"{ld}/{st} u{u} band {band >> 10} KiB"
                    e = entry(ld, st, u)
                    record(name, lambda e=e, band=band: launch(
                        fn[e], n_sm, 256, ctypes.c_uint64(src.ptr), ctypes.c_uint64(dst.ptr),
                        ctypes.c_uint64(n16), ctypes.c_uint64(band // 16)),
                        kind="reg", load=ld, store=st, unroll=u, band_bytes=band)
    memcpy = rows[0]["gbps"]
    best = sorted(rows[1:], key=lambda r: -r["gbps"])[:8]
    print(f"== fastest (x cuMemcpy {memcpy:.0f}; target 4100)", flush=True)
    for r in best:
        print(f"  {r['variant']:<34}{r['gbps']:>6.0f} GB/s {r['gbps'] / memcpy:.3f} x", flush=True)
    if not args.occupancy:
        base = {(r["unroll"], r["band_bytes"]): r["gbps"] for r in rows
                if r.get("load") == "cg" and r.get("store") == "st"}
        print("hints against cg/st at the same unroll and band: " + "; ".join(
            f"{r['variant']} {100 * (r['gbps'] / base[(r['unroll'], r['band_bytes'])] - 1):+.1f}%"
            for r in rows[1:] if (r["load"], r["store"]) != ("cg", "st")), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"device": info["name"], "sm_count": n_sm, "nbytes": nbytes, "reps": args.reps,
             "ptxas": regs, "rows": rows}, indent=1))
        print(f"wrote {args.out}", flush=True)
    for a, b in ev:
        check(drv.cuEventDestroy(a), "cuEventDestroy")
        check(drv.cuEventDestroy(b), "cuEventDestroy")
    stream.close()
    m.close()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="bytes to copy, in GiB (default 1)")
    p.add_argument("--reps", type=int, default=20, help="timed runs per variant (default 20)")
    p.add_argument("--bands", nargs="+", default=["1048576", "65536", "4096"],
                   help="band sizes in bytes, multiples of 16 (default 1 MiB, 64 KiB, 4 KiB)")
    p.add_argument("--occupancy", action="store_true",
                   help="instead of the hints: the plain copy by one block per SM of 8-32 warps, "
                        "2-16 float4 per thread, against torch's one-shot elementwise grid")
    p.add_argument("--out", default="probe_copy_hints.json", help="JSON results ('' = none)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile for --arch with NVRTC (no GPU), print ptxas info, exit")
    p.add_argument("--arch", default="sm_90a", help="arch of --compile-only (default sm_90a)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if any(int(b) < 16 or int(b) % 16 for b in args.bands):
        p.error("--bands: multiples of 16 bytes")
    if args.compile_only:
        return compile_only(args.arch, compile_probe, ENTRIES)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
