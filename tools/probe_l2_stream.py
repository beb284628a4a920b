#!/usr/bin/env python3
"""Probe: how fast the SMs read L2-resident bytes while they stream weights from HBM, before
a batch-64 streamed GEMM is redesigned around it.

W2-4096x8-bf16-b64 runs at ~174 us, 21.8 us a layer, against ~96 us for torch's graph
(benchmarks/ANALYSIS.md). Per layer megak's two 32-row bands per 64-column block move,
through L2 to the SMs: B (32 MiB of weights) twice, once per band, and A (the 64 x 4096
activation, 512 KiB) once per column block: 128 instructions x 256 KiB = 32 MiB. That is
96 MiB of L2-to-SM traffic a layer (4.6 TB/s at 21.8 us) where HBM supplies at most 32 MiB
(1.5 TB/s). The question a redesign turns on: is the L2-to-SM path the limit? If it is, B
must be read once and A by fewer SMs (wider column tiles, K split across SMs); if not, the
wait is elsewhere.

One block per SM (grid = SM count, plain launch, 208 KiB of dynamic shared memory: one block
per SM), two issuing lanes, each its own ring of 16 KiB pages and `full` mbarriers, no
consumer (a page is reissued as soon as its copy landed):

  lane B  warp 0: streams its share of the B buffer (HBM: 1 GiB, each SM a contiguous share,
          each share read by `--b-readers` SMs: 2 = megak's two bands, the second SM's reads
          of a share may hit L2), evict-first, R_B pages in flight
  lane A  warp 1: reads the A buffer (512 KiB by default, L2-resident after its first read)
          `--a-rounds` times, each SM starting at its own offset (`rotated`) or all at 0
          (`lockstep`: every SM on the same lines at once), evict-last, R_A pages in flight;
          mode `distinct`: each SM reads its own slice of an L2-sized buffer instead

Sections: B alone, A alone (rotated, lockstep, distinct), A with B (the ratio of bytes is
--a-rounds x A per SM against the B share), B read by one and by two SMs. Each cell: a
warm-up launch, then --reps launches; per lane the bytes landed and the span from its first
issue to its last landing (%globaltimer), summed over SMs as TB/s over the grid's span, and
the launch's time by CUDA events (median). Every lane checks the first word of every page
it landed against the source (the buffers hold their own u32 index): a probe that copies
nothing fails loudly. Every spin has a deadline (1 s); a lane past it records an error and
leaves.

    python tools/probe_l2_stream.py [--reps 5] [--compile-only]
"""
import argparse
import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megak.runtime.compiler import compile_source  # noqa: E402
from probe_ptx import BULK_PRELUDE, compile_only, on_gpu  # noqa: E402  (tools/, beside this file)

ENTRY = "l2_stream"
THREADS = 64
PAGE = 16384
MAX_PAGES = 12
SMEM = MAX_PAGES * PAGE + 1024
STAT_WORDS = 8   # per lane: bytes, t_first, t_last, bad pages, errors; 3 spare (kernel: 8)

SOURCE = BULK_PRELUDE + r"""
/* One lane's stream: chunk c (16 KiB) comes from buf + origin + (start + c * PAGE) % wrap,
 * through R pages of its own, chunk c in page c % R, phase (c / R) & 1, until `chunks` were
 * issued or *stop is set; then it drains. Each landed page's first word is checked: the
 * buffers hold their own u32 index. */
struct lane_plan { const unsigned char* buf; u64 origin, start, wrap; u32 chunks; };

__device__ __forceinline__ u64 next_offset(u64 o, u64 wrap) { o += PAGE; return o >= wrap ? o - wrap : o; }

struct lane_stats { u64 bytes, t_first, t_last, bad; };   /* in registers; stored at the end */

__device__ __forceinline__ bool land(const lane_plan& L, unsigned char* pages, u64* full, u32 R,
                                     u32 d, u64 o, u64 deadline, lane_stats& n)
{
    const u32 slot = d % R;
    while (!mbar_try(sa(&full[slot]), (d / R) & 1u))
        if (now() > deadline)
            return false;
    n.t_last = now();
    n.bytes += PAGE;
    if (*reinterpret_cast<volatile u32*>(pages + (u64)slot * PAGE) != (u32)((L.origin + o) / 4u))
        n.bad += 1u;
    return true;
}

__device__ void stream(const lane_plan& L, unsigned char* pages, u64* full, u32 R, u64 pol,
                       const volatile u32* stop, u64 deadline, u64* st)
{
    u64 o_issue = L.start % L.wrap, o_land = o_issue;
    u32 c = 0, d = 0;   /* chunks issued, chunks landed and checked */
    lane_stats n = {0, now(), 0, 0};
    bool ok = true;
    while (c < L.chunks && !(stop != nullptr && *stop != 0u)) {
        if (c >= R) {   /* chunk d = c - R frees the page chunk c takes */
            if (!(ok = land(L, pages, full, R, d, o_land, deadline, n)))
                break;
            ++d;
            o_land = next_offset(o_land, L.wrap);
        }
        const u32 slot = c % R;
        mbar_expect_tx(sa(&full[slot]), PAGE);
        bulk_load(pages + (u64)slot * PAGE, L.buf + L.origin + o_issue, PAGE, &full[slot], pol);
        ++c;
        o_issue = next_offset(o_issue, L.wrap);
    }
    for (; ok && d < c; ++d) {   /* drain: no copy lands after the block has left */
        ok = land(L, pages, full, R, d, o_land, deadline, n);
        o_land = next_offset(o_land, L.wrap);
    }
    st[0] = n.bytes; st[1] = n.t_first; st[2] = n.t_last; st[3] = n.bad; st[4] = ok ? 0u : 1u;
}

/* a_mode: 0 rotated, 1 lockstep, 2 distinct; a_rounds 0: no A lane; b_share 0: no B lane */
extern "C" __global__ void __launch_bounds__(64, 1)
l2_stream(const unsigned char* a, u64 a_bytes, u32 a_mode, u32 a_rounds, u32 r_a,
          const unsigned char* b, u64 b_share, u32 b_readers, u32 r_b, u64* stats)
{
    u64* full = reinterpret_cast<u64*>(smem);            /* 16 barriers: B's, then A's */
    u32* b_done = reinterpret_cast<u32*>(smem + 512);    /* lane B has drained */
    unsigned char* pages = smem + 1024;
    const u32 tid = threadIdx.x, grid = gridDim.x, blk = blockIdx.x;
    if (tid == 0) {
        for (u32 i = 0; i < r_b + r_a; ++i)
            mbar_init(sa(&full[i]), 1u);
        *b_done = 0u;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u64 deadline = now() + 1000000000ull;
    u64* st = stats + (u64)blk * 2u * 8u;
    if (tid == 0 && b_share > 0) {
        /* share blk / b_readers: b_readers SMs read each share, in step */
        const lane_plan L = {b, (u64)(blk / b_readers) * b_share, 0, b_share,
                             (u32)(b_share / PAGE)};
        stream(L, pages, full, r_b, policy(false), nullptr, deadline, st);
        atomicExch(b_done, 1u);
    } else if (tid == 32 && a_rounds > 0) {
        lane_plan L;
        if (a_mode == 2) {   /* each SM its own slice of the buffer, a_rounds times */
            const u64 slice = a_bytes / grid / PAGE * PAGE;
            L = {a, (u64)blk * slice, 0, slice, (u32)(slice / PAGE * a_rounds)};
        } else {             /* every SM the whole buffer, from its own offset or from 0 */
            const u64 start = a_mode == 0 ? (u64)(blk % (u32)(a_bytes / PAGE)) * PAGE : 0ull;
            L = {a, 0, start, a_bytes, (u32)(a_bytes / PAGE * a_rounds)};
        }
        /* beside a B lane: as long as it streams (a_rounds only bounds it) */
        stream(L, pages + (u64)r_b * PAGE, full + r_b, r_a, policy(true),
               b_share > 0 ? b_done : nullptr, deadline, st + 8);
    }
    __syncthreads();
}
"""


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_l2_stream.cu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--a-kib", type=int, default=512, help="the A buffer (L2-resident)")
    ap.add_argument("--a-rounds", type=int, default=16, help="reads of A per SM")
    ap.add_argument("--b-gib", type=float, default=1.0, help="the B buffer (HBM)")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(compile_probe, ENTRY)

    import numpy as np

    from megak.runtime.driver import check

    with on_gpu(compile_probe, ENTRY, SMEM) as (drv, fn, info, h, m):
        grid = info["sm_count"]
        a_bytes = args.a_kib * 1024 // PAGE * PAGE
        b_bytes = int(args.b_gib * (1 << 30)) // PAGE * PAGE
        a_big = 32 << 20   # the `distinct` buffer: L2-sized, each SM its own slice
        a = m.device(max(a_bytes, a_big), "A")
        b = m.device(b_bytes, "B")
        for buf, n in ((a, max(a_bytes, a_big)), (b, b_bytes)):   # word i holds i
            host = np.arange(n // 4, dtype=np.uint32)
            check(drv.cuMemcpyHtoD(buf.ptr, host.ctypes.data, n), "cuMemcpyHtoD")
        stats = m.device(grid * 2 * STAT_WORDS * 8, "stats")   # per block: lane B, lane A
        host_stats = np.zeros(grid * 2 * STAT_WORDS, dtype=np.uint64)
        start, stop = (check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2))

        def cell(name, a_mode, a_rounds, r_a, b_readers, r_b, b_on):
            b_share = (b_bytes // (grid // b_readers) // PAGE * PAGE) if b_on else 0
            vals = [ctypes.c_uint64(a.ptr), ctypes.c_uint64(a_bytes if a_mode != 2 else a_big),
                    ctypes.c_uint32(a_mode), ctypes.c_uint32(a_rounds), ctypes.c_uint32(r_a),
                    ctypes.c_uint64(b.ptr), ctypes.c_uint64(b_share), ctypes.c_uint32(b_readers),
                    ctypes.c_uint32(r_b), ctypes.c_uint64(stats.ptr)]
            argv_ = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            ms, rate_a, rate_b = [], [], []
            for rep in range(args.reps + 1):
                check(drv.cuMemsetD8Async(stats.ptr, 0, host_stats.nbytes, h), "cuMemsetD8Async")
                check(drv.cuEventRecord(start, h), "cuEventRecord")
                check(drv.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, SMEM, h,
                                         ctypes.addressof(argv_), 0), "cuLaunchKernel")
                check(drv.cuEventRecord(stop, h), "cuEventRecord")
                check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
                check(drv.cuMemcpyDtoH(host_stats.ctypes.data, stats.ptr, host_stats.nbytes),
                      "cuMemcpyDtoH")
                rows = host_stats.reshape(grid, 2, STAT_WORDS)
                if rows[:, :, 4].any():
                    raise SystemExit(f"{name}: a lane passed its deadline")
                if rows[:, :, 3].any():
                    raise SystemExit(f"{name}: {int(rows[:, :, 3].sum())} pages held the wrong bytes")
                if rep == 0:
                    continue   # warm-up: A comes into L2, the module loads
                ms.append(check(drv.cuEventElapsedTime(start, stop), "cuEventElapsedTime"))
                for lane, out in ((1, rate_a), (0, rate_b)):
                    used = rows[:, lane, 0] > 0
                    if used.any():
                        span = int(rows[used, lane, 2].max()) - int(rows[used, lane, 1].min())
                        out.append(float(rows[used, lane, 0].sum()) / span / 1e3)   # TB/s
            med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"   # noqa: E731
            print(f"{name:<44} {statistics.median(ms) * 1e3:>10.1f} {med(rate_b):>8} "
                  f"{med(rate_a):>8}", flush=True)

        print(f"{info['name']}: {grid} SMs, A {a_bytes >> 10} KiB x {args.a_rounds} rounds per "
              f"SM, B {b_bytes >> 20} MiB; median of {args.reps} launches", flush=True)
        print(f"{'cell':<44} {'us':>10} {'B TB/s':>8} {'A TB/s':>8}", flush=True)
        cell("B alone, R 8", 0, 0, 0, 1, 8, True)
        cell("B alone, R 8, each share read by 2 SMs", 0, 0, 0, 2, 8, True)
        for r_a in (2, 4):
            cell(f"A alone, rotated, R {r_a}", 0, args.a_rounds, r_a, 1, 0, False)
        cell("A alone, lockstep, R 4", 1, args.a_rounds, 4, 1, 0, False)
        cell("A alone, distinct slices of 32 MiB, R 4", 2, args.a_rounds, 4, 1, 0, False)
        along = 1 << 20   # beside B, A streams until B is done
        cell("A rotated R 4 + B R 8", 0, along, 4, 1, 8, True)
        cell("A rotated R 4 + B R 8, shares read by 2 SMs", 0, along, 4, 2, 8, True)
        cell("A lockstep R 4 + B R 8, shares read by 2 SMs", 1, along, 4, 2, 8, True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
