"""Running `python ...` in a subprocess the way a user would, from the repository root."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs `-m module args` or `script args` with matplotlib unimportable, as on a machine
# without it: a None entry in sys.modules makes `import matplotlib` raise ImportError.
_WITHOUT_MATPLOTLIB = """\
import runpy, sys
sys.modules["matplotlib"] = None
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_python(args: list[str], *, backend: str | None = None, without_matplotlib=False,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """`python *args` with MEGAK_BACKEND=backend (unset when None); stdout and stderr as
    text."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    env.pop("MEGAK_BACKEND", None)
    if backend is not None:
        env["MEGAK_BACKEND"] = backend
    prefix = ["-c", _WITHOUT_MATPLOTLIB] if without_matplotlib else []
    return subprocess.run([sys.executable, *prefix, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def one_line(stderr: str) -> str:
    """The one line a command said on stderr (fails when it said more, or nothing)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def assert_no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
