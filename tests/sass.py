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


def local_memory_in_loops(function: str, holding: str = "") -> list[str]:
    """The local-memory instructions (LDL, STL) of one function's SASS that lie inside a loop:
    between a backward branch's target label and the branch; with `holding` (a regex), only
    loops that hold a matching instruction (r"\bH(GMMA|MMA)\b": the MMA loops). Register
    saves ptxas places at a function's entry and exits cost once per call; inside a loop they
    cost every iteration."""
    label_at: dict[str, int] = {}
    code: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in function.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*)", line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                label_at[name] = addr
            pending = []
            code.append((addr, m.group(2)))
    loops = []
    for addr, text in code:
        m = re.search(r"\bBRA\b.*`\((\.L_x_\d+)\)", text)
        if m and m.group(1) in label_at and label_at[m.group(1)] <= addr:
            loops.append((label_at[m.group(1)], addr))
    if holding:
        loops = [(a, b) for a, b in loops
                 if any(a <= x <= b and re.search(holding, t) for x, t in code)]
    return [text.strip() for addr, text in code
            if re.search(r"\b(LDL|STL)\b", text) and any(a <= addr <= b for a, b in loops)]
