"""tools/probe_fence_load.py (what a gpu-scope publish costs while the SM streams weights) builds
for sm_90a without a GPU, with no spills: the probe is run on a GPU machine only now and then,
and a kernel that stopped compiling would only show there."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.core")

ROOT = Path(__file__).resolve().parents[1]


def test_the_probe_compiles_without_spills(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))   # a cold build, not a cached one
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "probe_fence_load.py"),
                           "--compile-only"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: fence_load compiled, 0 spills" in done.stdout
