"""The standalone probes in tools/ (each its own kernel source, built by NVRTC) build for sm_90a
without a GPU, with no spills: a probe is run on a GPU machine only now and then, and a kernel
that stopped compiling would only show there, in device time."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.core")

ROOT = Path(__file__).resolve().parents[1]

PROBES = [
    # what a gpu-scope publish costs while the SM streams weights
    ("probe_fence_load.py", "OK: fence_load compiled, 0 spills"),
    # whether the page hand-back reaches the loader before the arrival that follows it
    ("probe_release_order.py", "release_order"),
    # how fast the SMs read L2-resident bytes while they stream weights from HBM
    ("probe_l2_stream.py", "l2_stream"),
    # whether more lanes issuing bulk copies make an SM read faster
    ("probe_issuers.py", "issuers"),
    # whether bytes prefetched into L2 reach a later bulk copy from L2
    ("probe_l2_prefetch.py", "l2_prefetch"),
    # how much code an SM keeps fetched, and what a cold block costs while HBM streams
    ("probe_icache.py", "icache"),
    # what a warp's A chunk costs beside the weight stream, fetched three ways
    ("probe_a_chunks.py", "a_chunks"),
    # whether loading a module waits for a kernel that holds every SM
    ("probe_module_load.py", "spin"),
    # a transpose through pages a loader warp fills one tile ahead, against registers
    ("probe_paged_transpose.py", "paged_transpose"),
    # the register copy's cache hints and band interleave, against the device copy
    ("probe_copy_hints.py", "OK: every entry compiled, 0 spills"),
    # whether multicasting each weight page to a cluster of 2 streams batch 64 faster
    ("probe_cluster_stream.py", "OK: cluster_stream compiled, 0 spills"),
    # how fast one thread, or one warp load, sees a request entry the host writes
    ("probe_ring_poll.py", "poll"),
]


@pytest.mark.parametrize("script, expected", PROBES, ids=[p for p, _ in PROBES])
def test_the_probe_compiles_without_spills(tmp_path, script, expected):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))   # a cold build, not a cached one
    done = subprocess.run([sys.executable, str(ROOT / "tools" / script), "--compile-only"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expected in done.stdout
