#!/usr/bin/env python3
"""Probe: what code an SM keeps fetched, and what fetching it costs while HBM streams.

The streamed GEMM's tail runs code once per instruction, and that code costs more the first
time in a tail than a moment later (benchmarks/ANALYSIS.md: the reduce 1.1-2.6 us as the tail
finds it, 0.54 run again; the busier HBM, the dearer). This probe asks, outside megak, how
much other code an SM can run before a block of code it ran is slow again (the instruction
caches' reach), and what a cold block costs with the SM idle and with a weight-ring-like
stream of bulk copies running beside it.

One block per SM, 64 threads. Warp 0 runs NBLK generated code blocks (each a __noinline__
function of ~4 KiB: STEPS steps of four independent rotate-and-add chains, one SASS
instruction each, constants differing everywhere) and times block 0 (clock64 and %globaltimer, lane 0) twice per launch,
after a --settle-us spin (the stream at its rate):

  first     block 0's first run in the launch (other launches and SMs may have left its
            lines in L2)
  second    block 0 again, right after the first, or after blocks 1 .. k each ran once
            (k = 1, 2, 4, ... NBLK - 1: how much other code evicts it), or after a --wait-us
            spin on the clock that runs no other code

With the stream, warp 1's lane 0 keeps RING bulk copies of 16 KiB in flight from the block's
own --share-kib of a buffer (evict-first, as the weight ring), reissuing each page as it
lands, until warp 0 is done: the SM's share of HBM, pulled as the weight stream pulls it.
Every condition runs idle and with the stream, each in its own launches; per row the median
over SMs of the second run's ns and cycles (medians over --reps launches), and last the
first run's.

    python tools/probe_icache.py [--reps 5] [--wait-us 20] [--compile-only]
"""
import argparse
import ctypes
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megak.runtime.compiler import compile_source  # noqa: E402
from probe_ptx import BULK_PRELUDE, compile_only, on_gpu  # noqa: E402  (tools/, beside this file)

ENTRY = "icache"
THREADS = 64
PAGE = 16384
RING = 8
SMEM = RING * PAGE + 1024
NBLK = 48            # code blocks: block 0 and up to 47 x 4 KiB of other code
STEPS = 64           # 4 instructions (LEA.HI: a rotate and an add) each: ~4 KiB a block
STAT_WORDS = 6       # per block: block 0's two runs (cycles, ns), copies landed, error
# the conditions: (name, blocks run before block 0's timed run, wait in us)
AFTER = [1, 2, 4, 8, 12, 16, 24, 32, 47]


def _blocks_source(seed: int = 7) -> str:
    """NBLK functions blk_i(x): STEPS steps of four chains whose constants differ per step and
    per block (no two blocks' code alike, nothing for the compiler to fold)."""
    rnd = random.Random(seed)
    out = []
    for i in range(NBLK):
        body = []
        for _ in range(STEPS):
            for c in "abcd":
                body.append(f"    {c} = __funnelshift_l({c}, {c}, {rnd.randrange(1, 31)}) + "
                            f"0x{rnd.getrandbits(32):08x}u;")
        out.append(f"__device__ __noinline__ u32 blk_{i}(u32 x)\n{{\n"
                   f"    u32 a = x, b = x ^ 0x9e3779b9u, c = x + 7u, d = x * 3u;\n"
                   + "\n".join(body) + "\n    return a ^ b ^ c ^ d;\n}\n")
    cases = "\n".join(f"    case {i}: return blk_{i}(x);" for i in range(NBLK))
    out.append(f"__device__ __noinline__ u32 run_blk(u32 i, u32 x)\n{{\n    switch (i) {{\n"
               f"{cases}\n    default: return x;\n    }}\n}}\n")
    return "\n".join(out)


SOURCE = BULK_PRELUDE + _blocks_source() + r"""
__device__ __forceinline__ u64 cycles() { u64 c; asm volatile("mov.u64 %0, %clock64;" : "=l"(c)); return c; }

/* Block 0 timed twice (stats 0-1: cycles and ns of its first run, 2-3 of its second), after
 * a settle_ns spin; between the two, blocks 1 .. before and a wait_ns spin. stream: warp 1
 * lane 0 keeps RING copies in flight over this block's `share` bytes of buf until warp 0 is
 * done (stats 4: copies landed; 5: a deadline passed). */
extern "C" __global__ void __launch_bounds__(64, 1)
icache(const unsigned char* buf, u64 share, u32 before, u64 wait_ns, u64 settle_ns,
       u32 stream, u32 seed, u64* stats, u32* sink)
{
    __shared__ u64 full[RING_PAGES];
    __shared__ volatile u32 done;
    unsigned char* pages = smem + (1024u - (sa(smem) & 1023u)) % 1024u;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
    u64* st = stats + (u64)blockIdx.x * STAT_WORDS;
    const u64 deadline = now() + 2000000000ull;   /* 2 s: never a hang */
    if (threadIdx.x == 0) {
        done = 0u;
        for (u32 s = 0; s < RING_PAGES; ++s)
            mbar_init(sa(&full[s]), 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        u32 x = seed + threadIdx.x;
        if (settle_ns != 0u) {                    /* the stream at its rate first */
            const u64 until = now() + settle_ns;
            while (now() < until) {
            }
        }
        __syncwarp();
        const u64 c0 = cycles(), t0 = now();
        x = run_blk(0u, x);                       /* block 0's first run in this launch */
        __syncwarp();
        const u64 c1 = cycles(), t1 = now();
        for (u32 i = 1; i <= before; ++i)
            x = run_blk(i, x);
        if (wait_ns != 0u) {
            const u64 until = now() + wait_ns;
            while (now() < until) {
            }
        }
        __syncwarp();
        const u64 c2 = cycles(), t2 = now();
        x = run_blk(0u, x);                       /* and again */
        __syncwarp();
        const u64 c3 = cycles(), t3 = now();
        if (lane == 0) {
            st[0] = c1 - c0;
            st[1] = t1 - t0;
            st[2] = c3 - c2;
            st[3] = t3 - t2;
            done = 1u;
        }
        atomicAdd(sink, x);
    } else if (warp == 1 && lane == 0 && stream) {
        const u32 landed = stream_lane(buf + (u64)blockIdx.x * share, share, pages, full,
                                       RING_PAGES, &done, deadline);
        st[4] = landed == ~0u ? 0u : landed;
        st[5] = landed == ~0u ? 1u : 0u;
    }
    __syncthreads();
}
""".replace("RING_PAGES", f"{RING}u").replace("STAT_WORDS", f"{STAT_WORDS}u")


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_icache.cu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--wait-us", type=float, default=20.0)
    ap.add_argument("--settle-us", type=float, default=5.0)
    ap.add_argument("--share-kib", type=int, default=4096)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(compile_probe, ENTRY)

    import numpy as np

    from megak.runtime.driver import check

    with on_gpu(compile_probe, ENTRY, SMEM) as (drv, fn, info, h, m):
        grid = info["sm_count"]
        share = args.share_kib * 1024 // PAGE * PAGE
        total = grid * share
        buf = m.device(total, "buf")
        check(drv.cuMemsetD8(buf.ptr, 1, total), "cuMemsetD8")
        stats = m.device(grid * STAT_WORDS * 8, "stats")
        sink = m.device(4, "sink")
        host = np.zeros(grid * STAT_WORDS, dtype=np.uint64)
        seed = [0]

        def cell(before, wait_us, stream):
            """Medians over SMs, then over launches: (first run ns, cycles, second run ns,
            cycles, copies landed)."""
            per = []
            for rep in range(args.reps + 1):
                seed[0] += 1
                vals = [ctypes.c_uint64(buf.ptr), ctypes.c_uint64(share),
                        ctypes.c_uint32(before), ctypes.c_uint64(int(wait_us * 1000)),
                        ctypes.c_uint64(int(args.settle_us * 1000)),
                        ctypes.c_uint32(1 if stream else 0), ctypes.c_uint32(seed[0]),
                        ctypes.c_uint64(stats.ptr), ctypes.c_uint64(sink.ptr)]
                argv_ = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
                check(drv.cuMemsetD8Async(stats.ptr, 0, host.nbytes, h), "cuMemsetD8Async")
                check(drv.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, SMEM, h,
                                         ctypes.addressof(argv_), 0), "cuLaunchKernel")
                check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
                check(drv.cuMemcpyDtoH(host.ctypes.data, stats.ptr, host.nbytes), "cuMemcpyDtoH")
                rows = host.reshape(grid, STAT_WORDS).astype(np.float64)
                if rows[:, 5].any():
                    raise SystemExit("a block's stream passed its deadline")
                if rep:
                    per.append([float(np.median(rows[:, i])) for i in (1, 0, 3, 2, 4)])
            return [statistics.median(col) for col in zip(*per)]

        print(f"{info['name']}: {grid} SMs; block 0 = {4 * STEPS} instructions "
              f"(~{4 * STEPS * 16 // 1024} KiB of code), other blocks the same; runs after a "
              f"{args.settle_us:g}-us settle; medians over SMs, then over {args.reps} launches",
              flush=True)
        print(f"{'block 0, second run':<30} {'idle ns':>8} {'cycles':>7} {'stream ns':>9} "
              f"{'cycles':>7} {'copies':>6}", flush=True)
        firsts = []
        conditions = [("right after the first", 0, 0.0)]
        conditions += [(f"after {k} x 4 KiB of other code", k, 0.0) for k in AFTER]
        conditions += [(f"after a {args.wait_us:g}-us spin", 0, args.wait_us)]
        for name, before, wait_us in conditions:
            idle, busy = cell(before, wait_us, False), cell(before, wait_us, True)
            firsts.append((idle[0], idle[1], busy[0], busy[1]))
            print(f"{name:<30} {idle[2]:>8.0f} {idle[3]:>7.0f} {busy[2]:>9.0f} "
                  f"{busy[3]:>7.0f} {busy[4]:>6.0f}", flush=True)
        f = [statistics.median(col) for col in zip(*firsts)]
        print(f"{'first run in the launch':<30} {f[0]:>8.0f} {f[1]:>7.0f} {f[2]:>9.0f} "
              f"{f[3]:>7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
