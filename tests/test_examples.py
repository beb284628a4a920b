"""Every example and the command line run to PASS: on the simulator here, on the GPU in the
gpu tier."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def run(args, backend, timeout=300):
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, MEGAK_BACKEND=backend, PYTHONPATH=path)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_passes(backend, example):
    r = run([str(example)], backend)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "PASS"
    assert f"backend={backend}" in r.stdout or f"backend: {backend}" in r.stdout


def test_cli_info(backend):
    r = run(["-m", "megak", "info"], backend)
    assert r.returncode == 0, r.stderr
    for word in ("megak", "cache dir", "backend", "GPU", "pages", "cuda-core"):
        assert word in r.stdout
    if backend == "cuda":
        assert "SMs" in r.stdout and "opt-in" in r.stdout


def test_cli_demo_with_trace(backend, tmp_path):
    r = run(["-m", "megak", "demo", "--trace", str(tmp_path)], backend)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "PASS"
    assert (tmp_path / "demo_trace.json").stat().st_size > 0
    try:
        import matplotlib  # noqa: F401
        assert (tmp_path / "demo_trace.png").stat().st_size > 0
    except ImportError:
        assert "no PNG" in r.stdout
