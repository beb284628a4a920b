"""The split-K reduce op's device code (ops/reduce.cuh), checked without a GPU (NVRTC only):
the megakernel compiles with MK_OP_REDUCE in its op table, the reduce body is its own
function (``__noinline__``, like the GEMM bodies), and neither entry nor that body spills.

GPU correctness goes through the public API (split-K GEMM tests).
"""
from __future__ import annotations

import re

import pytest

compiler = pytest.importorskip("megak.runtime.compiler")
pytest.importorskip("cuda.core")

ARCH = "sm_90a"
ENTRIES = ("megakernel", "megak_op")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    return compiler.compile_megakernel(ARCH, cache_dir=tmp_path_factory.mktemp("megak-reduce"))


def test_reduce_is_in_the_op_table():
    src = compiler.device_source()
    assert re.search(r"X\(REDUCE, reduce, 0\)", src)
    assert "mk_reduce_body" in src


def test_reduce_compiles_without_spills(kernel):
    for entry in ENTRIES:
        info = compiler.parse_ptxas_log(kernel.log, entry)
        print(f"\n{entry}: {info}")
        assert info["registers"] is not None and info["registers"] <= 255, kernel.log
        assert info["spill_stores"] == info["spill_loads"] == 0, kernel.log
        if entry != "megakernel":   # the megakernel calls its role functions: a frame
            # (the separate-launch entry's 32 B: tests/test_device_gemm_compile.py)
            assert info["stack_bytes"] <= 32, kernel.log
    bodies = re.findall(r"Function properties for (\S*mk_reduce_body\S*)\s*\n\S*\s*\.\s*(\d+) "
                        r"bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                        kernel.log)
    assert bodies, f"the reduce body is not a separate function:\n{kernel.log}"
    for name, *vals in bodies:
        assert list(map(int, vals)) == [0, 0, 0], f"{name} spills or keeps a stack:\n{kernel.log}"
