"""Command line: `python -m megak info` and `python -m megak demo [--trace DIR]`."""
from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib import metadata


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def info() -> int:
    from . import __version__, pages
    from .program import resolve_backend
    from .runtime import driver
    from .runtime.compiler import default_cache_dir, nvrtc_version

    print(f"megak {__version__}, Python {platform.python_version()}")
    for dist in ("numpy", "cffi", "cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc"):
        print(f"  {dist}: {_version(dist)}")
    try:
        major, minor = nvrtc_version()
        print(f"  NVRTC: {major}.{minor}")
    except Exception as e:  # noqa: BLE001 - informational only
        print(f"  NVRTC: unavailable ({e})")
    print(f"cache dir: {default_cache_dir()}")
    env = os.environ.get("MEGAK_BACKEND")
    print(f"backend: {resolve_backend(None)}" + (f" (MEGAK_BACKEND={env})" if env else ""))
    if driver.gpu_usable():
        d = driver.device_info()
        n_pages = pages.pages_for(d["smem_optin"])
        print(f"GPU: {d['name']} ({d['arch']}), {d['sm_count']} SMs, driver {d.get('driver_version')}")
        print(f"  shared memory: {d['smem_optin']} B opt-in per block -> {n_pages} pages of "
              f"{pages.PAGE_BYTES} B ({pages.smem_bytes(n_pages)} B requested per block)")
        print(f"  memory: {d['free_mem'] / 2**30:.1f} GiB free of {d['total_mem'] / 2**30:.1f} GiB")
    else:
        print(f"GPU: none usable ({driver.gpu_unusable_reason()}); the simulator runs instead, "
              f"{pages.DEFAULT_PAGES} pages/SM as on H100/H200")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megak")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="GPU, SMs, pages, shared memory, cache dir, backend, versions")
    demo = sub.add_parser("demo", help="run the demo pipeline on the best backend")
    demo.add_argument("--trace", metavar="DIR", help="write demo_trace.json and .png here")
    demo.add_argument("--backend", choices=["sim", "cuda"], default=None)
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    from .demo import run_demo
    return 0 if run_demo(backend=args.backend, trace_dir=args.trace) else 1


if __name__ == "__main__":
    sys.exit(main())
