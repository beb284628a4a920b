"""The short fp32 tile's device source run on the CPU (tests/host_run/gemm_f32_short.cpp): 256
threads and a barrier as its compute threads, copies landing when issued or only at their wait,
poisoned pages, operands and output; each run checks every output against float64 and that
nothing was written where the op must not write; mutated bodies must be refused. Needs g++
with C++20's <barrier>; skips without (tests/host_build.py).

GPU correctness goes through the public API (tests/ops/test_gemm.py)."""
from __future__ import annotations

import pytest

from megak import abi
from tests import host_build


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return host_build.build("gemm_f32_short", tmp_path_factory.mktemp("host-run"))


def _run(exe, *args, check=True):
    done = host_build.run(exe, *args)
    if check:
        assert host_build.passed(done), (args, done.stdout, done.stderr)
    return done


# rows, cols, klen, row0, col0, k0, lda, ldb, loader preload, B ready
CASES = [
    (16, 128, 300, 0, 0, 0, 308, 136, 1, 1),      # 10 slices, the loader's two
    (16, 128, 1000, 16, 128, 0, 1008, 264, 1, 1),  # 32 slices: the ring's stages reused
    (9, 44, 130, 4, 256, 64, 200, 308, 0, 0),      # 9 rows, column and k tails, no loader
    (8, 37, 61, 0, 0, 36, 104, 44, 1, 0),          # the 8-row loop, B produced (all late)
    (1, 1, 1, 0, 0, 0, 8, 8, 1, 1),                # one element
    (15, 4, 64, 0, 4, 0, 72, 16, 1, 1),            # one column chunk, two whole slices
    (16, 128, 32, 0, 0, 0, 40, 136, 1, 1),         # one slice
]


@pytest.mark.parametrize("late", [0, 1], ids=["copies-land-early", "copies-land-late"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])))
def test_short_tile_runs_right_on_the_host(harness, case, late):
    for seed in (1, 2, 3):
        _run(harness, *case, late, 0, 0, 0, seed)


@pytest.mark.parametrize("act", ["NONE", "RELU", "GELU", "SILU"])
@pytest.mark.parametrize("bias,res", [(1, 0), (0, 1), (1, 1)])
def test_short_tile_epilogue_on_the_host(harness, act, bias, res):
    # the shared epilogue (gemm_epilogue.cuh, epilogue.cuh) on the short tile's staging rows
    code = abi.ACTIVATIONS[f"MK_ACT_{act}"]
    _run(harness, 16, 128, 300, 0, 0, 0, 308, 136, 1, 1, 1, bias, res, code, 5)


def test_an_unaligned_tile_is_not_a_short_one(harness):
    # an origin off 16 B: the 128 x 128 tile takes it (mk_gemm_f32_short_ok)
    done = _run(harness, 16, 128, 100, 0, 0, 2, 108, 136, 1, 1, 0, 0, 0, 0, 1, check=False)
    assert done.returncode == 3 and "not a short tile" in done.stdout


# each a wrong body the harness must refuse: (file under megak/device, text, replacement)
MUTATIONS = {
    "a-wait-one-group-short": (
        "ops/gemm_f32_short.cuh", "mk_cp_async_wait_group<MK_GEMM_F32_SHORT_STAGES - 2>();",
        "mk_cp_async_wait_group<MK_GEMM_F32_SHORT_STAGES - 1>();"),
    "the-stage-being-read-overwritten": (
        "ops/gemm_f32_short.cuh",
        "load(kt + MK_GEMM_F32_SHORT_STAGES - 1, s == 0 ? MK_GEMM_F32_SHORT_STAGES - 1 : s - 1);",
        "load(kt + MK_GEMM_F32_SHORT_STAGES - 1, s);"),
    "nine-rows-on-the-8-row-loop": (
        "ops/gemm_f32_short.cuh", "if (rows > MK_GEMM_F32_SHORT_ROWS / 2)",
        "if (rows > MK_GEMM_F32_SHORT_ROWS / 2 + 1)"),
}


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_wrong_short_tile_is_caught_on_the_host(tmp_path, mutation):
    exe = host_build.build("gemm_f32_short", tmp_path, mutate=mutation)
    results = [host_build.run(exe, *case, late, 0, 0, 0, 1) for case in CASES
               for late in (0, 1)]
    assert not all(map(host_build.passed, results))
