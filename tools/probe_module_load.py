#!/usr/bin/env python3
"""Probe: whether loading a module waits for a kernel that holds every SM.

The resident megakernel stays on the GPU until its idle deadline. In the GPU tier a program
compiled while it ran, and the resident kernel's own wider build loaded while it ran, each
took the whole idle deadline (benchmarks/ANALYSIS.md, 2026-12-03), as if the module's load
waited for the GPU to go idle (the lazy-loading hazard the CUDA programming guide names for
persistent kernels). This probe measures that outside megak.

A spinner (one block of 32 threads per SM, every SM) spins until the host raises a mapped
flag or --spin-ms pass, whichever is first. While it spins the host times, each in turn:

  copy      a 4 KiB host-to-device copy on another stream, waited for (runs beside: the
            control)
  load      a fresh module (a tiny kernel compiled before the spinner started, a constant
            differing per run, so nothing is cached): ObjectCode.from_cubin, get_kernel,
            cuKernelGetFunction, cuFuncSetAttribute, as the executor loads a build
  megak     the same for a small megakernel build (the copy op's bodies): the resident
            kernel's wider build is such a module

and prints each step's wall time and whether the spinner was still running when it
returned. A step that waits for the spinner returns only after --spin-ms. The parent runs
it twice, in child processes with CUDA_MODULE_LOADING=LAZY (the default) and EAGER.

    python tools/probe_module_load.py [--spin-ms 2000] [--compile-only]
"""
import argparse
import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from megak.runtime.compiler import compile_source  # noqa: E402
from probe_ptx import compile_only, on_gpu  # noqa: E402  (tools/, beside this file)

ENTRY = "spin"
SOURCE = r"""
extern "C" __global__ void spin(const volatile unsigned int* stop, volatile unsigned int* running,
                                unsigned long long spin_ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t0));
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *running = 1u;
    do {
        asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    } while (*stop == 0u && t - t0 < spin_ns);
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *running = 0u;
}
"""


def compile_probe(arch):
    return compile_source(SOURCE, arch=arch, entry=ENTRY, name="probe_module_load.cu")


def tiny_source(tag: int) -> str:
    return ('extern "C" __global__ void tiny(unsigned int* p) { p[threadIdx.x] = %du; }\n' % tag)


def measure(spin_ms: float) -> int:
    import numpy as np
    from cuda.core import ObjectCode

    from megak import abi
    from megak.runtime import compiler
    from megak.runtime.driver import check

    def load(cubin: bytes, entry: str):
        code = ObjectCode.from_cubin(cubin)
        fn = check(drv.cuKernelGetFunction(code.get_kernel(entry).handle),
                   "cuKernelGetFunction")
        check(drv.cuFuncSetAttribute(
            fn, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 0),
            "cuFuncSetAttribute")
        return code, fn

    with on_gpu(compile_probe, ENTRY, 0) as (drv, fn, info, h, m):
        arch, grid = info["arch"], info["sm_count"]
        # everything compiled before the spinner starts: only the loads are timed
        tag = int(time.time() * 1000) & 0x7FFFFFFF
        tiny = compile_source(tiny_source(tag), arch=arch, entry="tiny",
                              name=f"tiny{tag}.cu").cubin
        copy_bodies = (1 << abi.OP_NOP) | (1 << abi.OPCODE_OF["copy"])
        mega = compiler.compile_megakernel(arch, defines=compiler.bodies_defines(copy_bodies)).cubin
        flags = m.mapped(8, "flags")
        words = flags.array(np.uint32, (2,))          # [stop, running]
        src = m.pinned(4096, "copy source")
        dst = m.device(4096, "copy target")
        other = check(drv.cuStreamCreate(1), "cuStreamCreate")   # non-blocking
        steps = [("copy", lambda: (check(drv.cuMemcpyHtoDAsync(dst.ptr, src.ptr, 4096, other),
                                         "cuMemcpyHtoDAsync"),
                                   check(drv.cuStreamSynchronize(other), "sync"))),
                 ("load", lambda: load(tiny, "tiny")),
                 ("megak", lambda: load(mega, "megakernel"))]
        mode = os.environ.get("CUDA_MODULE_LOADING", "(unset: lazy)")
        print(f"{info['name']}: {grid} SMs, spinner {spin_ms:g} ms, CUDA_MODULE_LOADING={mode}",
              flush=True)
        kept = []
        for name, step in steps:
            words[:] = 0
            vals = [ctypes.c_uint64(flags.device_ptr), ctypes.c_uint64(flags.device_ptr + 4),
                    ctypes.c_uint64(int(spin_ms * 1e6))]
            argv_ = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
            check(drv.cuLaunchKernel(fn, grid, 1, 1, 32, 1, 1, 0, h, ctypes.addressof(argv_), 0),
                  "cuLaunchKernel")
            t0 = time.monotonic()
            while words[1] == 0 and time.monotonic() - t0 < 5:
                pass
            started = words[1] == 1
            t1 = time.monotonic()
            kept.append(step())
            took = (time.monotonic() - t1) * 1e3
            still = words[1] == 1
            words[0] = 1                                   # let the spinner go
            check(drv.cuStreamSynchronize(h), "cuStreamSynchronize")
            print(f"  {name:<6} {took:9.2f} ms  spinner started {started}, still running "
                  f"when it returned {still}", flush=True)
        check(drv.cuStreamDestroy(other), "cuStreamDestroy")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spin-ms", type=float, default=2000.0)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compile_only:
        return compile_only(compile_probe, ENTRY)
    if args.child:
        return measure(args.spin_ms)
    rc = 0
    for mode in ("LAZY", "EAGER"):
        env = dict(os.environ, CUDA_MODULE_LOADING=mode)
        done = subprocess.run([sys.executable, __file__, "--child", "--spin-ms",
                               str(args.spin_ms)], env=env, timeout=120)
        rc |= done.returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
