#!/usr/bin/env python3
"""Fill the compile cache with the megakernel builds the GPU tier will ask for, in parallel.

Each program runs a build of its own op bodies (instr.h, MK_BODIES; runtime/executor.py), so
the GPU tier asks for one build per distinct body set among its programs (~100), one at a
time, each 1-10 s of NVRTC on one core. This tool finds those sets first: it runs the tier's
tests (pytest -m gpu) with megak.compile lowering every cuda program as the simulator would
(same lowering, n_sm=132, the H200's) and skipping the test once the program's bodies are
recorded, and with CudaExecutor skipping any test that builds one directly; the GPU is
hidden from it (CUDA_VISIBLE_DEVICES), so a test that touches one before compiling fails at
once instead of running (on the H200 that recording took 115 s with the GPU visible, 12 s
here without one). Then it compiles every set, and the build of every body (the device
compile tests'), in --jobs processes into the cache the tier reads (XDG_CACHE_HOME /
MEGAK_CACHE_DIR). A set it misses (a traced build, a resident kernel's build of its programs'
bodies, a program made another way) is compiled by the tier as before.

    python tools/prebuild_bodies.py [--jobs 15] [--list] [pytest paths...]
"""
import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

os.environ["CUDA_VISIBLE_DEVICES"] = ""   # before anything initialises CUDA (see above)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import megak                        # noqa: E402  (after the path)
from megak.runtime import compiler  # noqa: E402

from ab_trees import H200_SMS as N_SM   # noqa: E402  (the lowering depends on the SMs)


class Recorder:
    """A pytest plugin: records each cuda program's bodies and skips its test."""

    def __init__(self):
        self.bodies: dict[int, int] = {}

    def pytest_configure(self, config):
        from megak.runtime import driver, executor, packed_weights
        compile_ = megak.compile
        recorder = self

        def recording_compile(graph, backend="sim", **options):
            if backend != "cuda":
                return compile_(graph, backend=backend, **options)
            kept = {k: v for k, v in options.items() if k == "n_pages"}
            plan = compile_(graph, backend="sim", n_sm=N_SM, **kept).plan
            mask = executor.program_bodies(
                plan.instrs, packed_weights.packed_forms(plan.instrs, plan.constant_values))
            recorder.bodies[mask] = recorder.bodies.get(mask, 0) + 1
            pytest.skip("bodies recorded")

        def no_executor(*args, **kwargs):
            pytest.skip("no executor while recording")

        megak.compile = recording_compile
        executor.CudaExecutor.__init__ = no_executor
        driver.gpu_usable = lambda: True    # the gpu tests are collected without a GPU too


def build(defines):
    t0 = time.monotonic()
    k = compiler.compile_megakernel("sm_90a", defines=defines)
    return defines, time.monotonic() - t0, k.from_cache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--list", action="store_true", help="print the sets, compile nothing")
    ap.add_argument("paths", nargs="*",
                    default=[str(ROOT / "tests"), str(ROOT / "benchmarks/test_gpu_benchmarks.py")])
    args = ap.parse_args()
    rec = Recorder()
    pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "--benchmark-disable",
                 "--no-header", "-o", "console_output_style=classic", *args.paths],
                plugins=[rec])
    sets = sorted(rec.bodies, key=lambda m: -rec.bodies[m])
    print(f"prebuild_bodies: {len(sets)} body sets over {sum(rec.bodies.values())} programs",
          flush=True)
    if args.list:
        for m in sets:
            print(f"  {m:#x}: {rec.bodies[m]} programs")
        return
    # the build of every body first: the longest
    todo = [None] + [compiler.bodies_defines(m) for m in sets]
    t0 = time.monotonic()
    # spawned, not forked: the recording left CUDA half-initialised in this process (a test's
    # torch call found no device), and a forked child of that dies at its first compile
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(build, todo))
    fresh = [d for d in done if not d[2]]
    print(f"prebuild_bodies: {len(done)} builds ({len(fresh)} compiled, "
          f"{sum(d[1] for d in fresh):.0f} s of NVRTC) in {time.monotonic() - t0:.0f} s "
          f"with {args.jobs} jobs", flush=True)


if __name__ == "__main__":
    main()
