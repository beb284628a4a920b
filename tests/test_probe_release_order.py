"""tools/probe_release_order.py (does the page hand-back reach the loader before the arrival
that follows it) builds for sm_90a without a GPU, with no spills."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.core")

ROOT = Path(__file__).resolve().parents[1]


def test_the_probe_compiles_without_spills(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))   # a cold build, not a cached one
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "probe_release_order.py"),
                           "--compile-only"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "release_order" in done.stdout
