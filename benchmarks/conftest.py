"""pytest set-up for benchmarks/: tests marked `gpu` skip without a usable GPU (the same rule
as tests/conftest.py, which is not on this folder's path)."""
import os

import pytest

os.environ.setdefault("CUDA_PYTHON_DISABLE_VERSION_CHECK", "1")


def pytest_collection_modifyitems(config, items):
    from megak.runtime.driver import gpu_unusable_reason, gpu_usable
    if gpu_usable():
        return
    skip = pytest.mark.skip(reason=f"needs a usable CUDA GPU ({gpu_unusable_reason()})")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
