"""Device source run on the CPU: building a harness of tests/host_run/ with g++.

A harness includes an op's device header with stand-ins for the headers around it (each
harness says which) and runs it on std::threads as the compute threads, so the body's index
math and its barriers are checked as written. Each build copies megak/device and the harness
into a tree of its own, so that a test can build a mutated body beside the real one (the
harness must catch the mutation: its checks can fail)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOST_RUN = ROOT / "tests" / "host_run"
FLAGS = ("-std=c++20", "-O1", "-pthread", "-w")
TSAN_FLAGS = ("-fsanitize=thread", "-g")
# what every harness includes beyond the C library: g++ must have C++20's <barrier> too
_PROBE = ("#include <atomic>\n#include <barrier>\n#include <thread>\n"
          "int main() { std::barrier<> b(1); b.arrive_and_wait(); }\n")


def _compiler(tmp: Path, tsan: bool) -> str:
    """g++, able to build (and, with `tsan`, run under ThreadSanitizer) a harness; skips the
    test where it is missing or cannot."""
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++ on this machine")
    probe = tmp / "probe.cpp"
    probe.write_text(_PROBE)
    flags = (*FLAGS, *TSAN_FLAGS) if tsan else FLAGS
    built = subprocess.run([cxx, *flags, "-o", str(tmp / "probe"), str(probe)],
                           capture_output=True)
    if built.returncode != 0:
        pytest.skip("g++ without C++20's <barrier>" + (" or ThreadSanitizer" if tsan else ""))
    if tsan and subprocess.run([str(tmp / "probe")], capture_output=True).returncode != 0:
        pytest.skip("ThreadSanitizer cannot run here")
    return cxx


def build(harness: str, tmp: Path, *, tsan: bool = False,
          mutate: tuple[str, str, str] | None = None) -> Path:
    """The executable of tests/host_run/<harness>.cpp, built in `tmp`. mutate: (a file under
    megak/device, a piece of its text that occurs once, what replaces it)."""
    cxx = _compiler(tmp, tsan)
    tree = tmp / "tree"
    shutil.copytree(ROOT / "megak" / "device", tree / "megak" / "device")
    source = tree / "tests" / "host_run" / f"{harness}.cpp"
    source.parent.mkdir(parents=True)
    shutil.copy(HOST_RUN / f"{harness}.cpp", source)
    for header in HOST_RUN.glob("*.h"):   # the stand-ins the harnesses share
        shutil.copy(header, source.parent / header.name)
    if mutate is not None:
        path, old, new = mutate
        target = tree / "megak" / "device" / path
        text = target.read_text()
        assert text.count(old) == 1, f"the mutation's text occurs {text.count(old)} times"
        target.write_text(text.replace(old, new))
    exe = tmp / (harness + ("-tsan" if tsan else ""))
    flags = (*FLAGS, *TSAN_FLAGS) if tsan else FLAGS
    built = subprocess.run([cxx, *flags, "-o", str(exe), str(source)], capture_output=True,
                           text=True)
    assert built.returncode == 0, built.stderr
    return exe


def run(exe: Path, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """One run of a harness (it prints OK and exits 0 when every check held)."""
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def passed(done: subprocess.CompletedProcess) -> bool:
    return done.returncode == 0 and done.stdout.strip().endswith("OK")
