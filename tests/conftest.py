"""Shared fixtures: the `backend` fixture runs a test on the simulator and, where a GPU is
usable, on the CUDA backend (those cases are marked `gpu` and skip without one)."""
import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("CUDA_PYTHON_DISABLE_VERSION_CHECK", "1")


def _gpu_usable() -> bool:
    from megak.runtime.driver import gpu_usable
    return gpu_usable()


def pytest_collection_modifyitems(config, items):
    if _gpu_usable():
        return
    skip = pytest.mark.skip(reason="needs a usable CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request):
    return request.param


@pytest.fixture
def rng(request):
    # a fresh, reproducible stream per test: seeded by the test's name
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
