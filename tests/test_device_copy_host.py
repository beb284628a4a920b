"""The copy's device source run on the CPU (tests/host_run/copy.cpp): 256 threads as its
compute threads on one record, A poisoned around the region and OUT everywhere, every access
checked to lie inside its operand's region (a float4 one 16-B aligned), the region checked bit
for bit; and takers (MK_FLAG_COPY_TAKE), a block of 256 threads whose warps take bands for
themselves (a shuffle each), sharing one counter run after run, under ThreadSanitizer too. Skips without g++ and C++20.

GPU correctness goes through the public API (tests/ops/test_copy.py)."""
from __future__ import annotations

import pytest

from tests import host_build

# rows, cols, row0, col0, lda, ldo, A's and OUT's origins off 16 B (floats): the path it takes
CASES = {
    "pipeline": (100, 1000, 3, 4, 1012, 1020, 0, 0),        # the float4 register pipeline
    "head-body-tail": (100, 1005, 3, 5, 1012, 1020, 0, 0),  # scalar head and tail around it
    "pipeline-offset": (300, 64, 0, 0, 64, 68, 2, 2),       # both origins 8 B past 16 B
    "one-unit-a-thread": (64, 4, 0, 0, 4, 4, 0, 0),         # <= 256 units: no pipeline
    "one-unit": (1, 4, 0, 0, 4, 4, 0, 0),
    "one-float": (1, 1, 0, 0, 1, 1, 3, 2),
    "phases-differ": (50, 40, 0, 1, 44, 48, 1, 3),           # all scalar
    "odd-pitches": (7, 9, 1, 2, 16, 13, 1, 1),
    "out-pitch-odd": (7, 9, 0, 0, 16, 13, 0, 0),             # same phase, OUT's pitch odd
    "a-pitch-odd": (7, 9, 0, 0, 13, 16, 0, 0),
    "wide-odd-pitch": (3, 300, 2, 0, 301, 300, 0, 0),
}

# takers: (rows, cols, row0, col0, lda, ldo, A's and OUT's offsets, takers, first epoch)
TAKERS = {
    "49-bands-3-takers": (100, 1000, 3, 4, 1012, 1020, 0, 0, 3, 2),
    "tail-columns-5-takers": (100, 1003, 3, 4, 1012, 1020, 0, 0, 5, 7),
    "313-bands-6-takers": (400, 1600, 1, 0, 1604, 1608, 0, 0, 6, 3),
    "1-band-4-takers": (9, 8, 0, 0, 8, 8, 0, 0, 4, 1),          # 31 of the 32 warps take none
    "narrow-rows-walked": (700, 12, 1, 4, 20, 24, 0, 0, 3, 1),  # 3 units a row: a warp's step
                                                                # spans 10 rows
    "one-taker": (1, 4, 0, 0, 4, 4, 0, 0, 1, 0),
    # one run of units in both tensors (rows without padding, or one row): the flat bands
    "flat-147-bands-4-takers": (300, 1000, 5, 0, 1000, 1000, 0, 0, 4, 2),
    "flat-one-row-20-bands": (1, 40000, 0, 0, 40000, 40000, 0, 0, 3, 1),
    "a-without-padding-out-with": (300, 1000, 0, 0, 1000, 1004, 0, 0, 3, 1),
    "a-off-16-B": (100, 1000, 3, 4, 1012, 1020, 1, 0, 3, 0),   # static shares of the rows
    "out-pitch-odd": (7, 9, 0, 0, 16, 13, 0, 0, 3, 1),
}

# each a wrong body the harness must refuse: (file under megak/device, text, replacement)
MUTATIONS = {
    "store-walk-wraps-by-A": (
        "ops/copy.cuh",
        "const mk_u64 wrap_d = 4ull * ((mk_u64)ldd - 4u * (mk_u32)units);",
        "const mk_u64 wrap_d = 4ull * ((mk_u64)lds - 4u * (mk_u32)units);"),
    "one-unit-column": (
        "ops/copy.cuh",
        "const int r = rows == 1 ? 0 : t / body, c = t - r * body;",
        "const int r = rows == 1 ? 0 : t / body, c = t % 4;"),
    "vector-path-on-A-pitch-alone": (
        "ops/copy.cuh", "((A.ld | O.ld) & 3u) == 0", "(A.ld & 3u) == 0"),
    "takers-without-the-epoch": (
        "ops/copy.cuh",
        "const mk_u32 base = ctl.params.epoch * (bands + MK_COPY_TAKE_WARPS * (mk_u32)in.k0);",
        "const mk_u32 base = ctl.params.epoch * bands;"),
    "a-base-of-one-last-take-a-taker": (
        "ops/copy.cuh",
        "const mk_u32 base = ctl.params.epoch * (bands + MK_COPY_TAKE_WARPS * (mk_u32)in.k0);",
        "const mk_u32 base = ctl.params.epoch * (bands + (mk_u32)in.k0);"),
    "a-last-take-that-copies": ("ops/copy.cuh", "while (band < bands)", "while (band <= bands)"),
    "no-exchange": ("ops/copy.cuh", "return __shfl_sync(0xffffffffu, old, 0) - base;",
                    "return old - base;"),
    "flat-stores-past-the-end": (
        "ops/copy.cuh", "                if (first + (mk_u32)(32 * k) < total)\n",
        "                if (first + (mk_u32)(32 * k) <= total)\n"),
    "flat-on-the-a-pitch-alone": (
        "ops/copy.cuh", "(A.ld == 4u * (mk_u32)units && O.ld == 4u * (mk_u32)units)",
        "(A.ld == 4u * (mk_u32)units)"),
    "unaligned-takers-count-short": (
        "ops/copy.cuh",
        "atomicAdd(counter, in.param == 0u ? bands + MK_COPY_TAKE_WARPS : MK_COPY_TAKE_WARPS);",
        "atomicAdd(counter, in.param == 0u ? bands + 1u : MK_COPY_TAKE_WARPS);"),
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return host_build.build("copy", tmp_path_factory.mktemp("host-run"))


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_copy_runs_right_on_the_host(harness, case):
    for seed in (1, 2):
        done = host_build.run(harness, *case, 2, seed)
        assert host_build.passed(done), (case, done.stdout, done.stderr)


@pytest.mark.parametrize("case", TAKERS.values(), ids=TAKERS.keys())
def test_copy_takers_run_right_on_the_host(harness, case):
    for seed in (1, 2, 3):
        done = host_build.run(harness, *case[:8], 3, seed, *case[8:])
        assert host_build.passed(done), (case, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def tsan_harness(tmp_path_factory):
    return host_build.build("copy", tmp_path_factory.mktemp("host-run-tsan"), tsan=True)


@pytest.mark.parametrize("case", [TAKERS["49-bands-3-takers"], TAKERS["1-band-4-takers"]],
                         ids=["49-bands", "1-band"])
def test_copy_takers_race_free_on_the_host(tsan_harness, case):
    # ThreadSanitizer reports a data race (and fails the run) where a word is written while
    # another thread may still read it
    done = host_build.run(tsan_harness, *case[:8], 2, 1, *case[8:])
    assert host_build.passed(done), (done.stdout, done.stderr[-3000:])


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_wrong_copy_is_caught_on_the_host(tmp_path, mutation):
    exe = host_build.build("copy", tmp_path, mutate=mutation)
    results = [host_build.run(exe, *case, 1, 1) for case in CASES.values()]
    results += [host_build.run(exe, *case[:8], 1, 1, *case[8:]) for case in TAKERS.values()]
    assert not all(map(host_build.passed, results))
