#!/usr/bin/env python3
"""Probe: does a page hand-back (an atomic or on the allocator mask) reach the loader before
the mbarrier arrival that follows it in the releasing thread?

megak's loader decides "page leak" when the `empty` barrier says every earlier instruction is
done and the mask still lacks pages (megakernel.cu, mk_loader_acquire). Thread 0 of the
compute warps gives the pages back with red.release.cta.shared::cta.or and then arrives on
`empty` (mbarrier.arrive, release); the loader samples the phase (try_wait, acquire), then
reads the mask (ld.acquire). By the PTX memory model the loader must see the pages. With the
hold on every streamed instruction (branch hold-all: the streamer spins on a shared atomic
through each instruction's tail) W7-call-mlp1024 reported MK_ERR_PAGE_LEAK with the mask full
2 us later; instrumenting the hand-back (a read of the mask between the or and the arrival)
made it vanish.

One block per SM (120 KiB of dynamic shared memory), 320 threads, `--iters` rounds:

  releasers  warps 0-7 (256 threads): wait for the round's `full` phase, spin a pseudo-random
             0.2-2 us, meet at a named barrier; threads 1-255 arrive on `empty`; thread 0
             (with --global) fence.acq_rel.gpu + red.add.gpu on a global counter, then lowers
             the hold (atomic exchange), hands bit 0 back (the variant below) and arrives
  checker    warp 8, lane 0 (the loader): per round, polls {idle = try_wait(empty), mask =
             ld.acquire}; takes bit 0 (atomic and) once the mask has it; a round in which it
             saw idle before the bit is a violation (it then times how long the bit takes);
             then arrives on `full` for the next round
  streamer   warp 9, lane 0 (--hammer): spins on atomicOr(hold, 0) while thread 0 holds it
             (raised at the start of each round), else issues a 16 KiB bulk copy into a page
             (expect_tx + cp.async.bulk, complete_tx) and waits for it, as the weight stream
             does

Hand-back variants (--variant, comma list):
  red        red.release.cta.shared::cta.or (megak's mk_pages_give_back)
  red_read   the same, then ld.acquire of the mask by the same thread before the arrival
  atom       atom.release.cta.shared::cta.or with its old value consumed before the arrival
  red_fence  red.relaxed.cta + fence.acq_rel.cta before the arrival

Prints per variant x hammer: violations / rounds, the longest lateness (ns), timeouts.

    python tools/probe_release_order.py [--iters 20000] [--variant red,red_read,atom,red_fence]
"""
import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megak.runtime.compiler import compile_source  # noqa: E402
from probe_ptx import PRELUDE, compile_only, on_gpu  # noqa: E402  (tools/, beside this file)

ENTRY = "release_order"
THREADS = 320
SMEM = 120 * 1024
VARIANTS = ("red", "red_read", "atom", "red_fence")
STAT_WORDS = 4   # violations, max late ns, rounds done, timeouts

SOURCE = PRELUDE + r"""
extern __shared__ __align__(128) unsigned char smem[];

__device__ __forceinline__ u32 ld_acquire(u32* p)
{ u32 v; asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(sa(p)) : "memory"); return v; }

struct ctl_t { u64 full, empty, copied; u32 mask, hold, stop, sink; };

/* variant: 0 red, 1 red_read, 2 atom, 3 red_fence */
__device__ __forceinline__ void give_back(u32* mask, u32 bits, u32 variant, u32* sink)
{
    if (variant == 0u || variant == 1u) {
        asm volatile("red.release.cta.shared::cta.or.b32 [%0], %1;" :: "r"(sa(mask)), "r"(bits) : "memory");
        if (variant == 1u && (ld_acquire(mask) & bits) == 0u)
            *sink = 1u;   /* never: the thread's own or is in the mask */
    } else if (variant == 2u) {
        u32 old;
        asm volatile("atom.release.cta.shared::cta.or.b32 %0, [%1], %2;" : "=r"(old) : "r"(sa(mask)), "r"(bits) : "memory");
        if (old == 0xffffffffu)
            *sink = 1u;
    } else {
        asm volatile("red.relaxed.cta.shared::cta.or.b32 [%0], %1;" :: "r"(sa(mask)), "r"(bits) : "memory");
        asm volatile("fence.acq_rel.cta;" ::: "memory");
    }
}

extern "C" __global__ void __launch_bounds__(320, 1)
release_order(u32 iters, u32 variant, u32 hammer, u32 global_signal, const unsigned char* src,
              u32* counter, u64* stats, u64 timeout_ns)
{
    ctl_t& c = *reinterpret_cast<ctl_t*>(smem);
    unsigned char* page = smem + 1024;
    const u32 tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) {
        mbar_init(sa(&c.full), 1u);
        mbar_init(sa(&c.empty), 256u);
        mbar_init(sa(&c.copied), 1u);
        c.mask = 0u; c.hold = 0u; c.stop = 0u; c.sink = 0u;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const u64 deadline = now() + timeout_ns;
    if (warp < 8) {
        u32 rng = 0x9e3779b9u * (blockIdx.x + 1u);   /* the same in every releaser */
        for (u32 i = 0; i < iters; ++i) {
            bool ok = true;
            while (!mbar_try(sa(&c.full), i & 1u))
                if (now() > deadline) { ok = false; break; }
            if (!ok || *reinterpret_cast<volatile u32*>(&c.stop)) { atomicExch(&c.stop, 1u); break; }
            if (tid == 0 && hammer)
                atomicExch(&c.hold, 1u);
            rng = rng * 1664525u + 1013904223u;
            const u64 until = now() + 200u + (rng >> 21);   /* 0.2 .. 2.2 us of "compute" */
            while (now() < until) { }
            asm volatile("bar.sync 1, 256;" ::: "memory");
            if (tid != 0) {
                mbar_arrive(sa(&c.empty));
                continue;
            }
            if (global_signal) {
                asm volatile("fence.acq_rel.gpu;" ::: "memory");
                asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(counter + blockIdx.x) : "memory");
            }
            if (hammer)
                atomicExch(&c.hold, 0u);
            give_back(&c.mask, 1u, variant, &c.sink);
            mbar_arrive(sa(&c.empty));
        }
    } else if (warp == 8) {
        if (lane == 0) {
            u64 violations = 0, late_max = 0, done = 0, timeouts = 0;
            mbar_arrive(sa(&c.full));   /* round 0 may start */
            for (u32 i = 0; i < iters; ++i) {
                bool saw_idle = false, ok = true;
                for (;;) {
                    const bool idle = mbar_try(sa(&c.empty), i & 1u);
                    const u32 f = ld_acquire(&c.mask);
                    if (f & 1u)
                        break;
                    if (idle && !saw_idle) {
                        saw_idle = true;
                        ++violations;
                        const u64 t0 = now();
                        while (!(ld_acquire(&c.mask) & 1u) && now() <= deadline) { }
                        const u64 late = now() - t0;
                        late_max = late > late_max ? late : late_max;
                    }
                    if (now() > deadline || *reinterpret_cast<volatile u32*>(&c.stop)) { ok = false; break; }
                }
                if (!ok) { ++timeouts; atomicExch(&c.stop, 1u); break; }
                /* the round's phase must complete before the next round's arrivals */
                while (!mbar_try(sa(&c.empty), i & 1u))
                    if (now() > deadline) { ok = false; break; }
                if (!ok) { ++timeouts; atomicExch(&c.stop, 1u); break; }
                atomicAnd(&c.mask, ~1u);
                ++done;
                if (i + 1 < iters)
                    mbar_arrive(sa(&c.full));
            }
            atomicExch(&c.stop, 2u);   /* tells the streamer to finish */
            u64* s = stats + 4u * blockIdx.x;
            s[0] = violations; s[1] = late_max; s[2] = done; s[3] = timeouts;
        }
    } else if (warp == 9 && lane == 0 && hammer) {
        const unsigned char* from = src + (u64)blockIdx.x * 16384u;
        u32 phase = 0;
        while (*reinterpret_cast<volatile u32*>(&c.stop) == 0u && now() <= deadline) {
            if (atomicOr(&c.hold, 0u) != 0u)
                continue;   /* held: spin on the shared atomic, as the weight stream does */
            mbar_expect_tx(sa(&c.copied), 16384u);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(sa(page)), "l"(from), "r"(16384u), "r"(sa(&c.copied)) : "memory");
            while (!mbar_try(sa(&c.copied), phase) && now() <= deadline) { }   /* a copy always lands */
            phase ^= 1u;
        }
    }
    __syncthreads();
}
"""


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_release_order.cu")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--variant", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=3, help="launches per cell")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    variants = [v for v in args.variant.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"--variant: unknown {bad}; known: {', '.join(VARIANTS)}")
    if args.compile_only:
        return compile_only(compile_probe, ENTRY)

    import numpy as np

    from megak.runtime.driver import check

    with on_gpu(compile_probe, ENTRY, SMEM) as (drv, fn, info, h, m):
        grid = info["sm_count"]
        src = m.device(grid * 16384, "source")
        counter = m.device(grid * 4, "counters")
        stats = m.device(grid * STAT_WORDS * 8, "stats")
        host = np.zeros(grid * STAT_WORDS, dtype=np.uint64)
        print(f"{info['name']}: {grid} blocks x {THREADS} threads, {args.iters} rounds per "
              f"launch, {args.reps} launches per cell", flush=True)
        print(f"{'variant':<10} {'streamer':<9} {'global':<7} {'violations':>12} {'rounds':>10} "
              f"{'late max ns':>12} {'timeouts':>9}", flush=True)
        for variant in variants:
            for hammer in (0, 1):
                for global_signal in (0, 1):
                    tot = np.zeros(STAT_WORDS, dtype=np.uint64)
                    late = 0
                    for _ in range(args.reps):
                        vals = [ctypes.c_uint32(args.iters), ctypes.c_uint32(VARIANTS.index(variant)),
                                ctypes.c_uint32(hammer), ctypes.c_uint32(global_signal),
                                ctypes.c_uint64(src.ptr), ctypes.c_uint64(counter.ptr),
                                ctypes.c_uint64(stats.ptr), ctypes.c_uint64(10_000_000_000)]
                        argv_ = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
                        check(drv.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, SMEM, h,
                                                 ctypes.addressof(argv_), 0), "cuLaunchKernel")
                        check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
                        check(drv.cuMemcpyDtoH(host.ctypes.data, stats.ptr, host.nbytes),
                              "cuMemcpyDtoH")
                        rows = host.reshape(grid, STAT_WORDS)
                        tot += rows.sum(axis=0)
                        late = max(late, int(rows[:, 1].max()))
                    print(f"{variant:<10} {'spins' if hammer else 'off':<9} "
                          f"{'yes' if global_signal else 'no':<7} {int(tot[0]):>12} "
                          f"{int(tot[2]):>10} {late:>12} {int(tot[3]):>9}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
