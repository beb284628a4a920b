"""SASS of a cubin through nvdisasm (NVIDIA's disassembler; no GPU needed), for the tests that
check what ptxas made of the device code. Skips the calling test where nvdisasm is missing."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest


def _nvdisasm() -> str | None:
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for root in map(Path, getattr(nvidia, "__path__", [])):
        for cand in sorted(root.glob("*/bin/nvdisasm")):
            return str(cand)
    return None


def functions(cubin: bytes, tmp_path: Path) -> list[str]:
    """The cubin's SASS split per function: each piece starts with the function's name."""
    tool = _nvdisasm()
    if tool is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run([tool, "-c", str(path)], capture_output=True, text=True,
                          check=True).stdout
    return re.split(r"\n\s*\.type\s+", sass)
