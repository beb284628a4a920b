"""Command line: `python -m megak info` and `python -m megak demo [--trace DIR] [--backend B]`.

What a user can fix (no GPU for the backend asked for, a MEGAK_BACKEND that names no backend,
a --trace path that is a file) is one line on stderr and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata

from .backend_choice import BACKENDS, BackendChoice, choose_backend

EXIT_FAILED = 1   # the run failed, or cannot run on this machine
EXIT_USAGE = 2    # an argument or MEGAK_BACKEND value that is wrong on any machine
ALLOWED = ", ".join(BACKENDS)


def _complain(command: str, message: str) -> None:
    sys.stdout.flush()   # keep the report above the complaint when both go to a terminal
    print(f"python -m megak {command}: {message}", file=sys.stderr)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _backend_problem(choice: BackendChoice) -> tuple[str, int] | None:
    """For `info`: (one line, exit code) when compile() would raise, else None."""
    if not choice.valid:
        return (f"MEGAK_BACKEND={choice.name!r} names no backend (allowed: "
                f"{ALLOWED}): megak.compile() will raise; set MEGAK_BACKEND to one of those, "
                f"or unset it", EXIT_USAGE)
    if not choice.runnable:
        return (f"{choice.asked_as} asks for the GPU, but none is usable "
                f"({choice.gpu_reason}): megak.compile() will raise; set MEGAK_BACKEND=sim, "
                f"or unset it, to run on the CPU simulator", EXIT_FAILED)
    return None


def info() -> int:
    from . import __version__, pages
    from .runtime import driver
    from .runtime.compiler import default_cache_dir, nvrtc_version

    print(f"megak {__version__}, Python {platform.python_version()}")
    for dist in ("numpy", "cffi", "cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc",
                 "matplotlib"):
        print(f"  {dist}: {_version(dist)}")
    try:
        major, minor = nvrtc_version()
        print(f"  NVRTC: {major}.{minor}")
    except Exception as e:  # noqa: BLE001 - informational only
        print(f"  NVRTC: unavailable ({e})")
    print(f"cache dir: {default_cache_dir()}")
    choice = choose_backend()
    problem = _backend_problem(choice)
    if problem is None:
        why = {"MEGAK_BACKEND": f"MEGAK_BACKEND={choice.name}",
               "default": "a GPU is usable" if choice.name == "cuda" else "no GPU is usable"}
        print(f"backend: {choice.name} ({why[choice.source]})")
    if driver.gpu_usable():
        d = driver.device_info()
        n_pages = pages.pages_for(d["smem_optin"])
        print(f"GPU: {d['name']} ({d['arch']}), {d['sm_count']} SMs, driver {d.get('driver_version')}")
        print(f"  shared memory: {d['smem_optin']} B opt-in per block -> {n_pages} pages of "
              f"{pages.PAGE_BYTES} B ({pages.smem_bytes(n_pages)} B requested per block)")
        print(f"  memory: {d['free_mem'] / 2**30:.1f} GiB free of {d['total_mem'] / 2**30:.1f} GiB")
    elif choice.runnable:
        print(f"GPU: none usable ({driver.gpu_unusable_reason()}); the simulator runs instead, "
              f"{pages.DEFAULT_PAGES} pages/SM as on H100/H200")
    else:
        print(f"GPU: none usable ({choice.gpu_reason})")
    if problem is not None:
        line, code = problem
        _complain("info", line)
        return code
    return 0


def demo(backend: str | None, trace: str | None) -> int:
    from .errors import GraphError, MegakernelError
    from .trace_files import TraceDirError, make_trace_dir

    choice = choose_backend(backend)
    if not choice.valid:   # only MEGAK_BACKEND can get here: argparse checks --backend
        _complain("demo", f"MEGAK_BACKEND={choice.name!r} names no backend (allowed: "
                          f"{ALLOWED}); set it to one of those, unset it, or pass --backend "
                          f"{{{','.join(BACKENDS)}}}")
        return EXIT_USAGE
    if not choice.runnable:
        fix = "--backend sim" if choice.source == "--backend" else \
            "--backend sim (or MEGAK_BACKEND=sim)"
        _complain("demo", f"cannot run on the GPU ({choice.asked_as}): no GPU is usable "
                          f"({choice.gpu_reason}); {fix} runs the CPU simulator")
        return EXIT_FAILED
    if trace is not None:
        try:
            make_trace_dir(trace)
        except TraceDirError as e:
            _complain("demo", f"--trace: {e}")
            return EXIT_USAGE
    from .demo import run_demo
    try:
        ok = run_demo(backend=choice.name, trace_dir=trace)
    except (GraphError, MegakernelError) as e:
        _complain("demo", f"failed on backend {choice.name}: {e}")
        return EXIT_FAILED
    return 0 if ok else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megak")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="GPU, SMs, pages, shared memory, cache dir, backend, versions")
    demo_args = sub.add_parser("demo", help="run the demo pipeline on the best backend")
    demo_args.add_argument("--trace", metavar="DIR",
                           help="write demo_trace.json (and .png with megak[plot]) here")
    demo_args.add_argument("--backend", choices=list(BACKENDS), default=None)
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    return demo(args.backend, args.trace)


if __name__ == "__main__":
    sys.exit(main())
