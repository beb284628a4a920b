#!/usr/bin/env python3
"""Probe: compute-sanitizer's racecheck on the weight ring alone, and what it follows.

tools/sanitize_graph.py's ring_graph (streamed GEMMs through the weight ring on 2 SMs),
run as launches and checked against float64, under the device source as built or
text-patched (VARIANTS), so that a racecheck run shows which hazards a change of the
synchronisation clears before the change is made. The variants put back what the source had
before it was made racecheck-clean (benchmarks/ANALYSIS.md has the measured table):

  asbuilt        the source unchanged: racecheck reports nothing
  thread0-arrive the slot's empty barrier completed by compute thread 0 alone after the
                 compute barrier (count 1), and waited for by loader lane 0 alone: racecheck
                 follows an mbarrier thread by thread, so it reports every compute thread's
                 read of a record against the loader's next write into the slot
  issued-plain   ring_issued through st.release / ld.acquire (cta, shared) instead of
                 atomics: racecheck reports the store against the loads

  before         both: the source as it was before

With --graph tiles: sanitize_graph.py's tiles_graph (paged transposes on 2 SMs: the loader's
bulk copies into pages the compute warps of an earlier instruction read), variants of the
hand-off of a page from its readers to the next bulk copy into it:

  asbuilt        the page comes back through the allocator mask (red.release by compute
                 thread 0 after the compute barrier, ld.acquire + atomicAnd by loader lane 0)
  page-atomics   the mask through atomics both ways (atom.release.or, atom.acquire.or 0):
                 whether racecheck follows them as it follows ring_issued's
  prev-wait      every loader lane also waits for the previous instruction's empty phase
                 before the preload (timing changes; racecheck only): whether the reported
                 reads are the previous instruction's

--time W [W ...] times report workloads (benchmarks/workloads.py; W1: 1,000 dependent
one-instruction copies on distinct SMs, W2-1024x16-bf16: the streamed chain of the shortest
instructions) under the variant instead, no checks: what the synchronisation costs them.
--compile-only builds the variant's kernels into the compile cache and stops.

    python3 tools/probe_racecheck.py VARIANT        (plain: checks, fills the compile cache)
    compute-sanitizer --tool racecheck --racecheck-report all \\
        python3 tools/probe_racecheck.py VARIANT
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

import megak  # noqa: E402
from megak.runtime import compiler  # noqa: E402
import sanitize_graph as sg  # noqa: E402

_EMPTY_INIT = ("        mk_mbar_init(&ctl.empty[i], (mk_u32)MK_THREADS);   "
               "/* every compute thread */\n")
_EMPTY_INIT_RESIDENT = "            mk_mbar_init(&ctl.empty[i], (mk_u32)MK_THREADS);\n"
_SIGNAL = ("        if (tid == 0)\n            mk_compute_signal(q);\n        else\n"
           "            mk_mbar_arrive(&ctl.empty[mk_slot_of(q)]);\n")
_LOADER_WAIT = "        if (q >= MK_SLOTS && !mk_mbar_wait(&ctl.empty[mk_slot_of(q)],"
_ISSUED_STORE = "mk_issued_publish(&ctl.ring_issued[slot], pos);"
_ISSUED_LOAD = "mk_issued_read(&ctl.ring_issued[slot])"
_PLAIN = """__device__ __forceinline__ void mkp_issued_release(mk_u32* p, mk_u32 v)
{
    asm volatile("st.release.cta.shared::cta.u32 [%0], %1;"
                 : : "r"((mk_u32)__cvta_generic_to_shared(p)), "r"(v) : "memory");
}
__device__ __forceinline__ mk_u32 mkp_issued_acquire(mk_u32* p)
{
    mk_u32 v;
    asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];"
                 : "=r"(v) : "r"((mk_u32)__cvta_generic_to_shared(p)) : "memory");
    return v;
}
"""

VARIANTS = {
    "asbuilt": [],
    "thread0-arrive": [
        (_EMPTY_INIT, "        mk_mbar_init(&ctl.empty[i], 1u);\n"),
        (_EMPTY_INIT_RESIDENT, "            mk_mbar_init(&ctl.empty[i], 1u);\n"),
        (_SIGNAL, "        if (tid == 0)\n            mk_compute_signal(q);\n"),
        (_LOADER_WAIT, _LOADER_WAIT.replace("q >= MK_SLOTS &&", "q >= MK_SLOTS && lane == 0 &&")),
    ],
    "issued-plain": [
        # the helpers go in front of the stream header's first user of the word
        ("#ifndef MEGAK_STREAM_CUH\n#define MEGAK_STREAM_CUH\n",
         "#ifndef MEGAK_STREAM_CUH\n#define MEGAK_STREAM_CUH\n" + _PLAIN),
        (_ISSUED_STORE, "mkp_issued_release(&ctl.ring_issued[slot], pos);"),
        (_ISSUED_LOAD, "mkp_issued_acquire(&ctl.ring_issued[slot])"),
    ],
}
VARIANTS["before"] = VARIANTS["thread0-arrive"] + VARIANTS["issued-plain"]
_GIVE_BACK = 'asm volatile("red.release.cta.shared::cta.or.b32 [%0], %1;"\n' \
             '                 : : "r"(mk_smem_addr(free_mask)), "r"(bits) : "memory");'
_FREE_NOW = 'asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];"\n' \
            '                 : "=r"(v) : "r"(mk_smem_addr(free_mask)) : "memory");'
_L6 = "        /* L6 */\n        if (stages > 0 && error == MK_OK)\n"
TILE_VARIANTS = {
    "asbuilt": [],
    "page-atomics": [
        (_GIVE_BACK, '{ mk_u32 o; asm volatile("atom.release.cta.shared::cta.or.b32 %0, [%1], %2;"'
                     ' : "=r"(o) : "r"(mk_smem_addr(free_mask)), "r"(bits) : "memory"); }'),
        (_FREE_NOW, 'asm volatile("atom.acquire.cta.shared::cta.or.b32 %0, [%1], 0;"'
                    ' : "=r"(v) : "r"(mk_smem_addr(free_mask)) : "memory");'),
    ],
    "prev-wait": [
        (_L6, "        /* L6 */\n        if (q >= 1 && stages > 0 && error == MK_OK)\n"
              "            mk_mbar_wait(&ctl.empty[(q - 1) & 1], ((q - 1) >> 1) & 1,\n"
              "                         mk_deadline(p.timeout_ns));\n"
              "        if (stages > 0 && error == MK_OK)\n"),
    ],
}
def patched(src: str, variant: str, table: dict = VARIANTS) -> str:
    for old, new in table[variant]:
        n = src.count(old)
        assert n == 1, (variant, old, n)
        src = src.replace(old, new)
    return src


def time_workloads(variant: str, names: list, compile_only: bool) -> int:
    """Each workload's megak figure under the variant: the median of 200 runs (W1 per op)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.workloads import FACTORIES
    from megak.runtime.bench import Bench
    for name in names:
        w = FACTORIES[name]()
        prog = megak.compile(w.build(), backend="cuda")
        if compile_only:      # compile() built and cached the kernel
            prog.close()
            continue
        b = Bench(prog)
        b.upload(**w.make_inputs(np.random.default_rng(3)))
        t = float(np.median(b.time_megakernel(reps=200)))
        b.close()
        prog.close()
        per = f" = {t / w.work:.4f} us/op" if name == "W1" else ""
        print(f"probe_racecheck: {variant}: {name} {t:.2f} us{per} (median of 200)",
              flush=True)
    return 0


def run_tiles(variant: str, runs: int) -> int:
    """tiles_graph as launches, every output compared exactly (x^T, or x for ttt)."""
    rng = np.random.default_rng(7)
    prog = megak.compile(sg.tiles_graph(), backend="cuda", n_sm=sg.TILES_SMS, timeout_s=120.0,
                         debug=True)
    ok = True
    try:
        for run in range(runs):
            x = rng.uniform(-1, 1, sg.TILES_X).astype(np.float32)
            out = prog.run(x=x)
            for name, want in (("tt", x.T), ("tx", x.T), ("ttt", x)):
                good = bool(np.array_equal(out[name], want))
                print(f"{'ok   ' if good else 'FAIL '}run {run}, variant {variant}: {name}",
                      flush=True)
                ok = ok and good
    finally:
        prog.close()
    print(f"probe_racecheck: tiles {variant}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variant", choices=sorted(set(VARIANTS) | set(TILE_VARIANTS)))
    ap.add_argument("--graph", choices=("ring", "tiles"), default="ring")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--time", nargs="+", metavar="W", help="time these workloads instead")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    original = compiler.device_source
    table = TILE_VARIANTS if args.graph == "tiles" else VARIANTS
    if args.variant not in table:
        ap.error(f"variant {args.variant} is not one of --graph {args.graph}'s: {sorted(table)}")
    compiler.device_source = lambda: patched(original(), args.variant, table)
    if args.graph == "tiles":
        return run_tiles(args.variant, args.runs)
    if args.time:
        return time_workloads(args.variant, args.time, args.compile_only)
    rng = np.random.default_rng(7)
    g = sg.ring_graph()
    prog = megak.compile(g, backend="cuda", n_sm=sg.RING_SMS, timeout_s=120.0, debug=True)
    ok = True
    try:
        for run in range(args.runs):
            w = sg.ring_inputs(rng, (0.05, 0.2))
            for good, msg in sg.check_ring(g, w, prog.run(**w),
                                           f"run {run}, variant {args.variant}"):
                print(("ok   " if good else "FAIL ") + msg, flush=True)
                ok = ok and good
    finally:
        prog.close()
    print(f"probe_racecheck: {args.variant}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
