#!/usr/bin/env python3
"""Probe: what an SM holds when its loader reports MK_ERR_PAGE_LEAK (mk_loader_acquire: every
earlier instruction of the SM is done, and the pages the next one needs are still missing).

The device source is patched (as tools/probe_stream_stages.py does) so that the first leak
each SM reports records, into a __device__ array read back once the program closes:

    q               the loader's instruction (queue index) whose pages are missing
    need            the pages it needs
    free            the allocator mask at the report, and again after a 2 us spin (pages that
                    show up late point at an ordering race, pages that never do at a real leak)
    prev            the previous instruction's slot: its page count, page table, `released`
                    bits and stream stages (what its hand-back should have returned)
    empty           the raw mbarrier word of the slot the loader sampled as done
    hold, stop      ctl.stream_hold and ctl.ring_stop at the report

It runs benchmarks.report's W7 workloads (W7-call-copy, then W7-call-mlp1024: every megak
variant), the sequence that failed with the hold on every streamed instruction (branch
hold-all, benchmarks/ANALYSIS.md), `--rounds` times, and prints every record. Run it on the
device code under suspicion (e.g. `git checkout hold-all -- megak/device`).

    python tools/probe_page_leak.py [--rounds 3] [--compile-only]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import megak   # noqa: E402
from megak.runtime import compiler   # noqa: E402
from probe_stream_stages import module_global   # tools/, beside this file  # noqa: E402

NSM, NFIELD = 132, 16
FIELDS = ("q+1", "need", "free", "free_later", "prev_pages", "prev_released", "prev_page_table",
          "prev_stages", "this_released", "empty_word", "hold", "ring_stop", "n", "t_ns")

_ANCHOR = "__device__ mk_u32 mk_loader_acquire(mk_control& ctl, mk_slot& s, mk_u32 q, mk_u64 timeout_ns,\n"
_LEAK = "        if (idle)\n            return MK_ERR_PAGE_LEAK;\n"
_RECORD = f"""        if (idle) {{
            unsigned long long* d = mkp_leak + blockIdx.x * {NFIELD}u;
            if (d[0] == 0ull) {{
                const mk_slot& v = ctl.slot[(q - 1u) & 1u];
                const mk_u32 f0 = mk_pages_free_now(&ctl.free_pages);
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
                d[9] = *reinterpret_cast<volatile mk_u64*>(&ctl.empty[(q - 1u) & 1u]);
                d[10] = *reinterpret_cast<volatile mk_u32*>(&ctl.stream_hold);
                d[11] = *reinterpret_cast<volatile mk_u32*>(&ctl.ring_stop);
                d[12] = ctl.n;
                d[13] = mk_globaltimer();
                d[0] = q + 1u;
            }}
            return MK_ERR_PAGE_LEAK;
        }}
"""


def patched(src: str) -> str:
    for a, b in ((_ANCHOR, f"__device__ unsigned long long mkp_leak[{NSM * NFIELD}u];\n" + _ANCHOR),
                 (_LEAK, _RECORD)):
        n = src.count(a)
        assert n == 1, (a, n)
        src = src.replace(a, b)
    return src


_ORIGINAL = compiler.device_source


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
    args = ap.parse_args()
    compiler.device_source = lambda: patched(_ORIGINAL())
    if args.compile_only:
        k = compiler.compile_megakernel("sm_90a")
        print("cached" if k.from_cache else "compiled", compiler.parse_ptxas_log(k.log))
        return
    from benchmarks import report, workloads
    seen = []
    close = megak.Program.close

    def close_and_read(self):   # the records live in the program's module: read before it goes
        if self._resident is None and not getattr(self._executor, "closed", False):
            try:
                seen.extend(records_of(self))
            except Exception as exc:   # a program of another backend, or a broken context
                print("    (no leak records read:", exc, ")", flush=True)
        close(self)

    megak.Program.close = close_and_read
    env = report.TorchEnv()
    for r in range(args.rounds):
        for name in ("W7-call-copy", "W7-call-mlp1024"):
            _, failures, _ = report.run_call_workload(workloads.get(name), False, env,
                                                      np.random.default_rng(), log=lambda *a: None)
            print(f"round {r} {name}: {len(failures)} failed variants", flush=True)
            for f in failures:
                print("   ", f["variant"], f["error"][:200], flush=True)
            for rec in seen:
                print("    leak record:", rec, flush=True)
            seen.clear()


if __name__ == "__main__":
    main()
