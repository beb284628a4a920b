#!/usr/bin/env python3
"""Compile a GPU lease's megakernel builds on this (CPU) machine, with the GPU image's NVRTC.

NVRTC needs no GPU, and the compile cache's key holds the NVRTC version and the exact flags
cuda.core gives it (megak/runtime/compiler.py), so a cubin compiled here under the GPU
image's cuda-core, cuda-bindings and nvidia-cuda-nvrtc is found there under the same key: the
lease loads it instead of compiling. On the H200's 16 cores the tier's ~100 builds took 39-56 s
(554-686 s of NVRTC), each tree of an A/B a minute or more: device time, the scarcest thing a
session has. Under this machine's own NVRTC (another version) nothing here would hit there.

    python3 tools/gpu_cache.py fill [--tier] [--tests PATH ...] [--report] [--sanitize]
                                    [--ab ROW ...] [--jobs N]

  1. build/gpu-env: a venv of the GPU image's cuda packages, their versions read from the
     newest results JSON's machine.packages (benchmarks/results/*.json), made once;
  2. --tier: tools/prebuild_bodies.py under it (the GPU tier's builds, recorded without a GPU);
     --tests PATH ...: the same for these test paths or node ids only (gpu_checks.sh's tests
     step, $GPU_TESTS);
     --report: the builds `python -m benchmarks.report` asks for, of this checkout
     (tools/ab_trees.py build --report over every GPU and call workload);
     --sanitize: those of tools/sanitize.sh's program (tools/sanitize_graph.py --builds);
     --ab ROW ...: tools/ab_trees.py prebuild --rows ROW ... under it (the trees under ab/);
  3. the cache (build/gpu-cache/megak) packed into build/cubins.tar.xz (`pack` alone packs
     it again, e.g. after another checkout's builds were copied into it).

Carry build/cubins.tar.xz; tools/gpu_checks.sh unpacks it into its cache before its steps. By
hand, on the GPU machine, after the usual exports:

    mkdir -p "$XDG_CACHE_HOME/megak" && tar -xJf build/cubins.tar.xz -C "$XDG_CACHE_HOME/megak"

A build the lease asks for that is not in the archive (a traced or resident build, another
tree) is compiled there as before; `prebuild_bodies`' "N compiled" there says how many.
"""
import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = ROOT / "build" / "gpu-env"
CACHE = ROOT / "build" / "gpu-cache"          # XDG_CACHE_HOME for the builds: .../megak
ARCHIVE = ROOT / "build" / "cubins.tar.xz"
# the GPU image's packages that decide a cubin's cache key: NVRTC and what drives it
KEYED = ("cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc")
# what recording the tier's programs imports besides them (megak from the checkout)
OTHERS = ("numpy", "cffi", "ml_dtypes", "pytest", "pytest-benchmark")


def gpu_packages(results: Path = ROOT / "benchmarks" / "results") -> dict[str, str]:
    """KEYED's versions on the GPU machine, from the newest report JSON that names them."""
    found = []
    for path in results.glob("*.json"):
        try:
            machine = json.loads(path.read_text()).get("machine") or {}
        except (json.JSONDecodeError, OSError, AttributeError):
            continue
        packages = machine.get("packages") or {}
        if all(packages.get(k) for k in KEYED):
            found.append((str(machine.get("date", "")), path.name,
                          {k: packages[k] for k in KEYED}))
    if not found:
        raise SystemExit(f"gpu_cache: no results JSON under {results} names "
                         f"{', '.join(KEYED)} (a report run on the GPU writes them)")
    return max(found, key=lambda f: (f[0], f[1]))[2]


def make_env(packages: dict[str, str]) -> Path:
    """build/gpu-env with exactly `packages` (made again where a version differs)."""
    python = ENV / "bin" / "python"
    stamp = ENV / "gpu-packages.json"
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == packages:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(ENV)], check=True)
    pins = [f"{k}=={v}" for k, v in packages.items()]
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *pins, *OTHERS],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu_cache: pip could not install {' '.join(pins)}:\n"
                         f"{done.stderr[-3000:]}")
    stamp.write_text(json.dumps(packages))
    return python


def pack(cache: Path = CACHE / "megak", archive: Path = ARCHIVE) -> tuple[int, int]:
    """Every cubin and log of `cache` into `archive` (xz): (files, bytes of the archive)."""
    files = sorted(p for p in cache.glob("*") if p.suffix in (".cubin", ".log"))
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz") as tar:
        for p in files:
            tar.add(p, arcname=p.name)
    os.replace(tmp, archive)
    return len(files), archive.stat().st_size


def report_rows(python: str = sys.executable) -> list[str]:
    """The workloads benchmarks.report runs on the GPU (all but the host ones), as `python`
    (one with megak's needs) reads them."""
    done = subprocess.run([python, "-c", "from benchmarks import workloads as W; "
                           "print(' '.join(n for n, f in W.FACTORIES.items() "
                           "if f().kind != 'host'))"], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
    return done.stdout.split()


def _builds(what: str, command: list[str], env: dict) -> int:
    """Run a command that compiles builds and prints one JSON line each (ab_trees.py
    compile_builds); say how many it compiled. Its exit status."""
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    built = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    print(f"gpu_cache: the {what}'s {len(built)} builds "
          f"({sum(not b['from_cache'] for b in built)} compiled)", flush=True)
    if done.returncode != 0:
        print(done.stderr[-3000:], flush=True)
    return done.returncode


def fill(tier: bool, report: bool, sanitize: bool, ab_rows: list[str], jobs: int,
         tests: list[str] = ()) -> int:
    packages = gpu_packages()
    python = make_env(packages)
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(CACHE))
    env.pop("MEGAK_CACHE_DIR", None)
    print(f"gpu_cache: {', '.join(f'{k} {v}' for k, v in packages.items())} in {ENV}",
          flush=True)
    status = 0
    if tier or tests:
        done = subprocess.run([str(python), "tools/prebuild_bodies.py", "--jobs", str(jobs),
                               *([] if tier else tests)],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        print("\n".join(line for line in done.stdout.splitlines()
                        if line.startswith("prebuild_bodies")), flush=True)
        status |= done.returncode
    if report:
        status |= _builds("report", [str(python), "tools/ab_trees.py", "build", "--report",
                                     "--rows", *report_rows(str(python))], env)
    if sanitize:
        status |= _builds("sanitizer", [str(python), "tools/sanitize_graph.py", "--builds"],
                          env)
    if ab_rows:
        done = subprocess.run([str(python), "tools/ab_trees.py", "prebuild", "--jobs", str(jobs),
                               "--rows", *ab_rows], cwd=ROOT, env=env)
        status |= done.returncode
    n, size = pack()
    print(f"gpu_cache: {n} files in {ARCHIVE.relative_to(ROOT)} ({size / 2**20:.1f} MiB): "
          f"carry it", flush=True)
    return 1 if status else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pf = sub.add_parser("fill", help="compile the lease's builds here, then pack them")
    pf.add_argument("--tier", action="store_true", help="the GPU tier's builds")
    pf.add_argument("--tests", nargs="+", default=[], metavar="PATH",
                    help="the builds of these GPU tests only (gpu_checks.sh's tests step)")
    pf.add_argument("--report", action="store_true", help="benchmarks.report's builds")
    pf.add_argument("--sanitize", action="store_true", help="tools/sanitize.sh's builds")
    pf.add_argument("--ab", nargs="+", default=[], metavar="ROW",
                    help="the builds of these rows for every tree under ab/")
    pf.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    sub.add_parser("versions", help="print the GPU image's keyed package versions")
    sub.add_parser("pack", help="pack the cache again (after builds added to it by hand)")
    a = p.parse_args(argv)
    if a.cmd == "versions":
        print(json.dumps(gpu_packages()))
        return 0
    if a.cmd == "pack":
        n, size = pack()
        print(f"gpu_cache: {n} files in {ARCHIVE.relative_to(ROOT)} ({size / 2**20:.1f} MiB)")
        return 0
    if not (a.tier or a.tests or a.report or a.sanitize or a.ab):
        p.error("fill: name --tier, --tests PATH ..., --report, --sanitize, --ab ROW ..., "
                "or several")
    return fill(a.tier, a.report, a.sanitize, a.ab, a.jobs, a.tests)


if __name__ == "__main__":
    sys.exit(main())
