#!/usr/bin/env python3
"""Probe: does an SM read faster with more lanes issuing its bulk copies?

tools/probe_l2_stream.py (results/issuers/l2stream.log) measured one issuing lane per ring:
L2-resident reads at 5.10 TB/s over 132 SMs (38.6 GB/s an SM) whether 2 or 4 pages were in
flight, and HBM alone at 4.52 TB/s; yet two lanes of one SM, each its own ring, read 7.2-10.1
TB/s together. If one lane lands its copies at a fixed rate, the weight stream (one lane,
stream.cuh) caps every SM at ~39 GB/s, and batch 64, whose two row bands read each weight
page twice (512 KiB an SM a layer, the second read from L2), can take no less than ~13 us a
layer: its measured k loop (12.4-14.1 us) is that. Results: results/issuers/probe-issuers.log
and benchmarks/ANALYSIS.md.

One block per SM (grid = SM count, 208 KiB of dynamic shared memory), up to 4 issuing lanes,
each its own ring of R chunks (a chunk: 1 or 2 pages of 16 KiB, one `cp.async.bulk` each, its
own `full` mbarrier), no consumer (a chunk is reissued once its copy landed and its first word
was checked: the buffers hold their own u32 index, so a probe that copies nothing fails
loudly). The lanes of a block split one source between them, chunk i of the block's source to
lane i % lanes, either from separate warps or as lanes 0..n-1 of one warp:

  source B   1 GiB in HBM, each SM a contiguous share, each share read by 1 or 2 SMs in step
             (2 = megak's two row bands at batch 64: the second read may hit L2), evict-first
  source A   512 KiB, L2-resident after the warm-up, every SM all of it from its own offset,
             16 rounds, evict-last

Each cell: a warm-up launch, then --reps launches; bytes landed over the span from the first
issue to the last landing (%globaltimer, all lanes of all SMs) as TB/s, and the launch by CUDA
events (median). Every spin has a deadline (1 s); a lane past it fails the probe.

    python tools/probe_issuers.py [--reps 5] [--compile-only]
"""
import argparse
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megak.runtime.compiler import compile_source  # noqa: E402
from probe_ptx import BULK_PRELUDE, compile_only, on_gpu  # noqa: E402  (tools/, beside this file)

ENTRY = "issuers"
THREADS = 128
PAGE = 16384
MAX_PAGES = 12
MAX_LANES = 4
SMEM = MAX_PAGES * PAGE + 1024
STAT_WORDS = 4   # per lane: bytes, t_first, t_last, error (1 deadline, 2 wrong bytes)

SOURCE = BULK_PRELUDE + r"""

/* Lane j of n reads chunks j, j + n, ... of its block's source: chunk k's bytes start at
 * src + (start + k * bytes) % wrap. */
extern "C" __global__ void __launch_bounds__(128, 1)
issuers(const unsigned char* base, u64 share, u64 wrap, u32 readers, u32 rotate, u32 rounds,
        u32 lanes, u32 same_warp, u32 r, u32 chunk_pages, u32 evict_last, u64* stats)
{
    u64* full = reinterpret_cast<u64*>(smem);
    unsigned char* pages = smem + 1024;
    const u32 tid = threadIdx.x, blk = blockIdx.x;
    if (tid == 0) {
        for (u32 i = 0; i < lanes * r; ++i)
            mbar_init(sa(&full[i]), 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u32 j = same_warp ? tid : tid / 32u;
    if ((same_warp ? tid < lanes : (tid % 32u == 0u && j < lanes))) {
        const u64 deadline = now() + 1000000000ull;
        const u32 bytes = chunk_pages * PAGE;
        const unsigned char* src = base + (u64)(blk / readers) * share;
        const u64 start = rotate ? (u64)blk * bytes % wrap : 0ull;
        const u32 total = (u32)(wrap / bytes) * rounds;            /* the block's chunks */
        const u32 mine = total / lanes + (j < total % lanes ? 1u : 0u);
        unsigned char* ring = pages + (u64)j * r * bytes;
        u64* bars = full + j * r;
        const u64 pol = policy(evict_last != 0u);
        /* offsets advance by additions: a 64-bit modulo per chunk costs the lane ~0.3 us,
         * which the first build of this probe measured instead of the copies */
        const u64 stride = (u64)lanes * bytes;
        auto step = [&](u64 o) { o += stride; while (o >= wrap) o -= wrap; return o; };
        u64 o_issue = (start + (u64)j * bytes) % wrap, o_land = o_issue;
        u64 landed = 0, t_first = now(), t_last = 0, err = 0;
        u32 c = 0, d = 0;
        while (d < mine && err == 0) {
            if (c < mine && c - d < r) {              /* a free chunk of the ring: issue */
                const u32 s = c % r;
                mbar_expect_tx(sa(&bars[s]), bytes);
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                             ".L2::cache_hint [%0], [%1], %2, [%3], %4;"
                             :: "r"(sa(ring + (u64)s * bytes)), "l"(src + o_issue),
                                "r"(bytes), "r"(sa(&bars[s])), "l"(pol) : "memory");
                ++c;
                o_issue = step(o_issue);
                continue;
            }
            const u32 s = d % r;                      /* else wait for the oldest */
            while (!mbar_try(sa(&bars[s]), (d / r) & 1u))
                if (now() > deadline) { err = 1; break; }
            if (err) break;
            t_last = now();
            const u64 want = ((u64)(blk / readers) * share + o_land) / 4u;
            if (*reinterpret_cast<volatile u32*>(ring + (u64)s * bytes) != (u32)want)
                err = 2;
            o_land = step(o_land);
            landed += bytes;
            ++d;
        }
        for (; d < c; ++d) {                          /* drain after an error */
            const u32 s = d % r;
            while (!mbar_try(sa(&bars[s]), (d / r) & 1u))
                if (now() > deadline) break;
        }
        u64* st = stats + ((u64)blk * MAXL + j) * 4u;
        st[0] = landed; st[1] = t_first; st[2] = t_last; st[3] = err;
    }
    __syncthreads();
}
""".replace("MAXL", str(MAX_LANES))


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_issuers.cu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(compile_probe, ENTRY)

    import numpy as np

    from megak.runtime.driver import check

    with on_gpu(compile_probe, ENTRY, SMEM) as (drv, fn, info, h, m):
        grid = info["sm_count"]
        a_bytes, b_bytes = 512 << 10, 1 << 30
        a = m.device(a_bytes, "A")
        b = m.device(b_bytes, "B")
        for buf, n in ((a, a_bytes), (b, b_bytes)):   # word i holds i
            host = np.arange(n // 4, dtype=np.uint32)
            check(drv.cuMemcpyHtoD(buf.ptr, host.ctypes.data, n), "cuMemcpyHtoD")
        stats = m.device(grid * MAX_LANES * STAT_WORDS * 8, "stats")
        host_stats = np.zeros(grid * MAX_LANES * STAT_WORDS, dtype=np.uint64)
        start, stop = (check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2))

        def cell(source, lanes, same_warp, r, chunk_pages=1, readers=1):
            assert lanes * r * chunk_pages <= MAX_PAGES and lanes <= MAX_LANES
            if source == "B":
                share = b_bytes // (grid // readers) // (2 * PAGE) * (2 * PAGE)
                vals = (b.ptr, share, share, readers, 0, 1)
            else:
                vals = (a.ptr, 0, a_bytes, 1, 1, 16)
            types = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32,
                     ctypes.c_uint32, ctypes.c_uint32)
            cvals = [t(v) for t, v in zip(types, vals)]
            cvals += [ctypes.c_uint32(v) for v in (lanes, same_warp, r, chunk_pages,
                                                   1 if source == "A" else 0)]
            cvals.append(ctypes.c_uint64(stats.ptr))
            argv_ = (ctypes.c_void_p * len(cvals))(*[ctypes.addressof(v) for v in cvals])
            ms, rate = [], []
            for rep in range(args.reps + 1):
                check(drv.cuMemsetD8Async(stats.ptr, 0, host_stats.nbytes, h), "cuMemsetD8Async")
                check(drv.cuEventRecord(start, h), "cuEventRecord")
                check(drv.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, SMEM, h,
                                         ctypes.addressof(argv_), 0), "cuLaunchKernel")
                check(drv.cuEventRecord(stop, h), "cuEventRecord")
                check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
                check(drv.cuMemcpyDtoH(host_stats.ctypes.data, stats.ptr, host_stats.nbytes),
                      "cuMemcpyDtoH")
                rows = host_stats.reshape(grid, MAX_LANES, STAT_WORDS)[:, :lanes]
                if (rows[:, :, 3] == 1).any():
                    raise SystemExit(f"{source} {lanes} lanes: a lane passed its deadline")
                if (rows[:, :, 3] == 2).any():
                    raise SystemExit(f"{source} {lanes} lanes: a page held the wrong bytes")
                if rep == 0:
                    continue
                ms.append(check(drv.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))
                span = int(rows[:, :, 2].max()) - int(rows[:, :, 1].min())
                rate.append(float(rows[:, :, 0].sum()) / span / 1e3)
            where = "one warp" if same_warp else "own warps"
            name = (f"{source} x{readers} SM  {lanes} lane(s), {where}, R {r} of "
                    f"{chunk_pages * 16} KiB")
            per_sm = statistics.median(rate) * 1e3 / grid
            print(f"{name:<48} {statistics.median(ms) * 1e3:>9.1f} {statistics.median(rate):>7.2f}"
                  f" {per_sm:>8.1f}", flush=True)

        print(f"{info['name']}: {grid} SMs; median of {args.reps} launches", flush=True)
        print(f"{'cell':<48} {'us':>9} {'TB/s':>7} {'GB/s/SM':>8}", flush=True)
        for source, readers in (("A", 1), ("B", 2), ("B", 1)):
            cell(source, 1, 0, 2, readers=readers)
            cell(source, 1, 0, 4, readers=readers)
            cell(source, 1, 0, 8, readers=readers)
            cell(source, 1, 0, 4, chunk_pages=2, readers=readers)
            cell(source, 2, 0, 4, readers=readers)
            cell(source, 2, 1, 4, readers=readers)
            cell(source, 4, 0, 3, readers=readers)
            cell(source, 4, 1, 3, readers=readers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
