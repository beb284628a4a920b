#!/usr/bin/env python3
"""Probe: what an SM holds when its loader reports MK_ERR_PAGE_LEAK (mk_loader_acquire: every
earlier instruction of the SM is done, and the pages the next one needs are still missing),
and how often the pages come after the barrier phase that says they are back.

The device source is patched (as tools/probe_stream_stages.py does) so that the first leak
each SM reports records, into a __device__ array read back once the program closes:

    q               the loader's instruction (queue index) whose pages are missing
    need            the pages it needs
    free            the allocator mask at the report, and again after a 2 us spin (pages that
                    show up late point at an ordering race, pages that never do at a real leak)
    prev            the previous instruction's slot: its page count, page table, `released`
                    bits and stream stages (what its hand-back should have returned)
    empty           the raw word of the `empty` mbarrier the loader sampled (a plain load of
                    an mbarrier is not defined by PTX: a plausible state, or stale bytes)
    hold, stop      ctl.stream_hold and ctl.ring_stop at the report

It also counts the takes whose pages came after the phase (within the loader's grace,
MK_LEAK_GRACE_NS), and the longest such wait. `--marks` adds the loader's idle sample (barrier
word, mask, time) and thread 0's hand-back times at the signal; they change the timing they
measure (with them the failure did not show).

It runs benchmarks.report's W7 workloads (W7-call-copy, then W7-call-mlp1024: every megak
variant), the sequence that failed with the hold on every streamed instruction and no grace
(benchmarks/ANALYSIS.md), `--rounds` times, and prints every record.

    python tools/probe_page_leak.py [--rounds 3] [--marks] [--workloads W ...] [--compile-only]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import megak   # noqa: E402
from megak.runtime import compiler   # noqa: E402
from probe_stream_stages import module_global   # tools/, beside this file  # noqa: E402

NSM, NFIELD = 132, 32
FIELDS = ("q+1", "need", "free", "free_later", "prev_pages", "prev_released", "prev_page_table",
          "prev_stages", "this_released", "empty_word", "hold", "ring_stop", "n", "t_ns",
          "idle_empty_word", "idle_free", "polls", "sig_q", "sig_t_release", "sig_free",
          "sig_t_arrive", "later_sig_q", "later_sig_t_release", "later_sig_free",
          "later_sig_t_arrive", "epoch", "ticket", "full_words", "pages_ring", "t_idle")

_ANCHOR = "__device__ mk_u32 mk_loader_acquire(mk_control& ctl, mk_slot& s, mk_u32 q, mk_u64 timeout_ns,\n"
# the leak's return, after MK_LEAK_GRACE_NS of idle
_LEAK = ("            else if (now - idle_since > MK_LEAK_GRACE_NS)\n"
         "                return MK_ERR_PAGE_LEAK;\n")
_RECORD_BODY = f"""            unsigned long long* d = mkp_leak + blockIdx.x * {NFIELD}u;
            if (d[0] == 0ull) {{
                const mk_slot& v = ctl.slot[(q - 1u) & 1u];
                const mk_u32 f0 = mk_pages_free_now(&ctl.free_pages);
                const volatile unsigned long long* m = mkp_sig + blockIdx.x * 4u;
                for (mk_u32 i = 0; i < 4u; ++i)
                    d[17 + i] = m[i];
                const mk_u64 until = mk_globaltimer() + 2000u;
                while (mk_globaltimer() < until) {{
                }}
                mk_u32 table = 0;
                for (mk_u32 i = 0; i < 4u && i < v.ins.pages; ++i)
                    table |= (mk_u32)v.page[i] << (8u * i);
                d[1] = need;
                d[2] = f0;
                d[3] = mk_pages_free_now(&ctl.free_pages);
                d[4] = v.ins.pages;
                d[5] = v.released;
                d[6] = table;
                d[7] = v.stream_stages;
                d[8] = s.released;
                d[9] = *reinterpret_cast<volatile mk_u64*>(&ctl.empty[mk_slot_of(q - 1u)]);
                d[10] = *reinterpret_cast<volatile mk_u32*>(&ctl.stream_hold);
                d[11] = *reinterpret_cast<volatile mk_u32*>(&ctl.ring_stop);
                d[12] = ctl.n;
                d[13] = mk_globaltimer();
                d[14] = mkp_w;
                d[15] = mkp_f;
                d[16] = mkp_polls;
                for (mk_u32 i = 0; i < 4u; ++i)
                    d[21 + i] = m[i];
                d[25] = ctl.params.epoch;
                d[26] = ctl.ticket;
                d[27] = *reinterpret_cast<volatile mk_u32*>(&ctl.full[0]) |
                        ((mk_u64)*reinterpret_cast<volatile mk_u32*>(&ctl.full[1]) << 32);
                d[28] = ctl.params.n_pages | ((mk_u64)ctl.params.stream_pages << 32);
                d[29] = mkp_t;
                d[0] = q + 1u;
            }}
"""
_RECORD = ("            else if (now - idle_since > MK_LEAK_GRACE_NS) {\n" + _RECORD_BODY +
           "                return MK_ERR_PAGE_LEAK;\n            }\n")
# how often the pages came after the phase (count, longest wait in ns)
_TAKEN = ("        if (mk_pages_try_acquire(&ctl.free_pages, s.page, need))\n"
          "            return MK_OK;\n        *observed")
_TAKEN_COUNTED = f"""        if (mk_pages_try_acquire(&ctl.free_pages, s.page, need)) {{
            if (idle_since != 0) {{
                unsigned long long* g = mkp_late + blockIdx.x * 2u;
                const mk_u64 w = mk_globaltimer() - idle_since;
                g[0] += 1u;
                g[1] = w > g[1] ? w : g[1];
            }}
            return MK_OK;
        }}
        *observed"""


# what the loader saw when it sampled "idle": the raw barrier word, the allocator mask, the time
_IDLE = ("        const bool idle = q == 0 || mk_mbar_try_wait(&ctl.empty[mk_slot_of(q - 1)],\n"
         "                                                      mk_slot_parity(q - 1));\n")
_IDLE_SAMPLED = _IDLE + """        const mk_u64 mkp_w = q == 0 ? 0ull : *reinterpret_cast<volatile mk_u64*>(&ctl.empty[mk_slot_of(q - 1u)]);
        const mk_u32 mkp_f = mk_pages_free_now(&ctl.free_pages);
        const mk_u64 mkp_t = mk_globaltimer();
        ++mkp_polls;
"""
_LOOP = "    for (;;) {\n        /* sample"
_LOOP_COUNTED = "    mk_u32 mkp_polls = 0;\n" + _LOOP
# thread 0's hand-back at the signal: when it released, what the mask was after, when it arrived
_RELEASE = "    pages.release(0, s.ins.pages);\n"
_RELEASE_MARKED = f"""    volatile unsigned long long* mkp_m = mkp_sig + blockIdx.x * 4u;
    mkp_m[1] = mk_globaltimer();
    pages.release(0, s.ins.pages);
    mkp_m[2] = mk_pages_free_now(&ctl.free_pages) | ((mk_u64)s.released << 32);
    mkp_m[0] = ((mk_u64)ctl.ticket << 32) | (q + 1u);
"""
_ARRIVE = "    mk_mbar_arrive(&ctl.empty[mk_slot_of(q)]);\n}\n"
_ARRIVE_MARKED = "    mkp_m[3] = mk_globaltimer();\n" + _ARRIVE
_DECLS = (f"__device__ unsigned long long mkp_leak[{NSM * NFIELD}u];\n"
          f"__device__ unsigned long long mkp_sig[{NSM * 4}u];\n"
          f"__device__ unsigned long long mkp_late[{NSM * 2}u];\n")


# without the marks: the idle sample's fields stay 0 and the signal's are never written
_UNMARKED = ((_LOOP, "    const mk_u32 mkp_polls = 0;\n" + _LOOP),
             (_IDLE, _IDLE + "        const mk_u64 mkp_w = 0, mkp_t = 0;\n"
                             "        const mk_u32 mkp_f = 0;\n"))


def patched(src: str, marks: bool) -> str:
    """The device source with the leak record; with `marks`, also the idle sample and the
    signal's marks (which change the timing they measure: the failure may not show)."""
    edits = [(_ANCHOR, _DECLS + _ANCHOR), (_LEAK, _RECORD), (_TAKEN, _TAKEN_COUNTED)]
    edits += ([(_LOOP, _LOOP_COUNTED), (_IDLE, _IDLE_SAMPLED), (_RELEASE, _RELEASE_MARKED),
               (_ARRIVE, _ARRIVE_MARKED)] if marks else list(_UNMARKED))
    for a, b in edits:
        n = src.count(a)
        assert n == 1, (a, n)
        src = src.replace(a, b)
    return src


_ORIGINAL = compiler.device_source


def late_of(prog) -> tuple[int, int]:
    """With the leak grace: how often any SM's pages came after the phase, and the longest
    such wait (ns), in prog's module; then cleared."""
    drv, dptr = module_global(prog, b"mkp_late")
    host = np.zeros(NSM * 2, dtype=np.uint64)
    drv.cuCtxSynchronize()
    drv.cuMemcpyDtoH(host.ctypes.data, dptr, host.nbytes)
    drv.cuMemsetD8(dptr, 0, host.nbytes)
    rows = host.reshape(NSM, 2)
    return int(rows[:, 0].sum()), int(rows[:, 1].max())


def records_of(prog) -> list[dict]:
    """The leak records of prog's module (every SM that reported one), then cleared."""
    drv, dptr = module_global(prog, b"mkp_leak")
    host = np.zeros(NSM * NFIELD, dtype=np.uint64)
    drv.cuCtxSynchronize()
    drv.cuMemcpyDtoH(host.ctypes.data, dptr, host.nbytes)
    drv.cuMemsetD8(dptr, 0, host.nbytes)
    rows = host.reshape(NSM, NFIELD)
    return [{"sm": sm, **{f: int(x) for f, x in zip(FIELDS, rows[sm])}}
            for sm in range(NSM) if rows[sm, 0]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--marks", action="store_true",
                    help="also sample the loader's idle decision and the signal's hand-back")
    ap.add_argument("--workloads", nargs="+", default=["W7-call-copy", "W7-call-mlp1024"],
                    help="run in this order, each round")
    args = ap.parse_args()
    compiler.device_source = lambda: patched(_ORIGINAL(), args.marks)
    if args.compile_only:
        k = compiler.compile_megakernel("sm_90a")
        print("cached" if k.from_cache else "compiled", compiler.parse_ptxas_log(k.log))
        return
    from benchmarks import report, workloads
    seen = []
    late = [0, 0]   # pages seen after their phase: count, longest wait (ns)
    close = megak.Program.close

    def close_and_read(self):   # the records live in the program's module: read before it goes
        if self._resident is None and not getattr(self._executor, "closed", False):
            try:
                seen.extend(records_of(self))
                n, longest = late_of(self)
                late[0] += n
                late[1] = max(late[1], longest)
            except Exception as exc:   # a program of another backend, or a broken context
                print("    (no leak records read:", exc, ")", flush=True)
        close(self)

    megak.Program.close = close_and_read
    env = report.TorchEnv()
    for r in range(args.rounds):
        for name in args.workloads:
            _, failures, _ = report.run_call_workload(workloads.get(name), False, env,
                                                      np.random.default_rng(), log=lambda *a: None)
            print(f"round {r} {name}: {len(failures)} failed variants", flush=True)
            for f in failures:
                print("   ", f["variant"], f["error"][:200], flush=True)
            for rec in seen:
                print("    leak record:", rec, flush=True)
            if late[0]:
                print(f"    pages later than their phase: {late[0]} times, longest {late[1]} ns",
                      flush=True)
            seen.clear()
            late[:] = [0, 0]


if __name__ == "__main__":
    main()
