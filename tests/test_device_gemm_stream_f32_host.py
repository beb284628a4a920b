"""The fp32 weight stream's k loops run on the CPU (tests/host_run/gemm_stream_f32.cpp): 256
threads with per-warp barriers for the warp exchanges, a streamer thread filling a ring of R
pages as the TMA would (each page poisoned before its next stage), copies landing when issued
or only at their wait, poisoned pages and operands; each run checks the 8 warps' sums against
float64; mutated loops must be refused. Needs g++ with C++20's <barrier>; skips without
(tests/host_build.py).

GPU correctness goes through the public API (tests/ops/test_gemm_stream_f32.py)."""
from __future__ import annotations

import pytest

from tests import host_build


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    return host_build.build("gemm_stream_f32", tmp_path_factory.mktemp("host-run"))


# rows, cols, klen, k0, lda, ldb, ring pages (0: the op copies each stage itself)
CASES = [
    (16, 32, 1000, 0, 1008, 104, 10),     # 8 stages on a ring of 10: a warp pair's two turns
    (16, 32, 4096, 0, 4104, 104, 4),      # 32 stages through 4 slots, each used 8 times
    (5, 7, 300, 128, 436, 104, 2),        # short rows and columns, a k tail, the smallest ring
    (8, 32, 1000, 0, 1008, 104, 10),      # 8 rows: rows 8-15 left out of the FMAs
    (9, 32, 1000, 0, 1008, 104, 10),      # 9 rows: the first that takes both halves
    (1, 1, 17, 0, 24, 72, 3),             # one element of one partial stage
    (9, 20, 300, 4, 320, 100, 0),         # no ring: the op's copied stages
    (16, 32, 1000, 0, 1008, 104, 0),
    (16, 32, 256, 0, 261, 104, 3),        # A's rows off 16 B: its scalar copies
    (16, 32, 300, 0, 308, 101, 0),        # no ring, B's rows off 16 B: its scalar copies
]


@pytest.mark.parametrize("late", [0, 1], ids=["copies-land-early", "copies-land-late"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])) + f"-R{c[-1]}")
def test_f32_stream_loop_runs_right_on_the_host(harness, case, late):
    for seed in (1, 2):
        done = host_build.run(harness, *case, late, seed)
        assert host_build.passed(done), (case, late, seed, done.stdout, done.stderr)


# each a wrong loop the harness must refuse: (file under megak/device, text, replacement)
MUTATIONS = {
    "b-read-without-the-swizzle": (
        "ops/gemm_stream_f32.cuh", "(((mk_u32)t ^ (r & 7u)) << 4)", "((mk_u32)t << 4)"),
    "the-shuffle-from-the-wrong-lane": (
        "ops/gemm_stream_f32.cuh", "(2 * (n8 & 1) + (t >> 1))", "(2 * (n8 & 1) + (t & 1))"),
    "both-readers-on-the-first-half": (
        "ops/gemm_stream_f32.cuh", "const int kb = kc * (warp / step);", "const int kb = 0;"),
    "a-read-before-its-copies-landed": (
        "ops/gemm_stream_f32.cuh",
        "mk_cp_async_wait_all();\n        __syncwarp();                         /* the warp",
        "__syncwarp();                         /* the warp"),
    "nine-rows-on-eight-rows-fmas": (
        "ops/gemm_stream_f32.cuh", "if (ring && in.rows <= 8)", "if (ring && in.rows <= 9)"),
    "split-partials-kept-on-both-lanes": (
        "ops/gemm_stream_f32.cuh", "const float keep = upper ? s[r + half][c] : s[r][c];",
        "const float keep = upper ? s[r][c] : s[r + half][c];"),
    "split-rows-stored-as-the-partner-group's": (
        "ops/gemm_stream_f32.cuh", "(8 * h + OWN * kg + i)", "(8 * h + OWN * (kg ^ 1) + i)"),
    "split-a-rows-8-15-not-copied-for-16-rows": (
        "ops/gemm_stream_f32.cuh", "mk_stream_f32_chunk_a<4 * H>(buf,",
        "mk_stream_f32_chunk_a<4>(buf,"),
    "a-row-past-the-record-copied": (
        "ops/gemm_stream_f32.cuh", "const int n = r < rows ?", "const int n = r <= rows ?"),
    "copied-a-stage-read-before-it-landed": (
        "ops/gemm_stream_f32.cuh", "mk_cp_async_wait_group<D - 1>();",
        "mk_cp_async_wait_group<D>();"),
    "copied-the-next-stage-over-the-one-read": (
        "ops/gemm_stream_f32.cuh", "mk_compute_sync();   /* every warp is done with stage s",
        "/* every warp is done with stage s"),
    "copied-the-other-stage-read": (
        "ops/gemm_stream_f32.cuh", "mk_stream_f32_fma<2>(c, a_at(s),",
        "mk_stream_f32_fma<2>(c, a_at(s + 1),"),
}


@pytest.mark.parametrize("mutation", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_a_wrong_f32_stream_loop_is_caught_on_the_host(tmp_path, mutation):
    exe = host_build.build("gemm_stream_f32", tmp_path, mutate=mutation)
    results = [host_build.run(exe, *case, late, 1) for case in CASES for late in (0, 1)]
    assert not all(map(host_build.passed, results))


def test_f32_stream_loop_is_race_free_under_threadsanitizer(tmp_path):
    # the ring's hand-offs (the streamer's release, the readers' acquire and hand-back), the
    # warp exchanges and the copied stages' barriers order every access: no report
    exe = host_build.build("gemm_stream_f32", tmp_path, tsan=True)
    for case in (CASES[0], CASES[4], CASES[-1]):
        done = host_build.run(exe, *case, 1, 3, timeout=300)
        assert host_build.passed(done) and "ThreadSanitizer" not in done.stderr, \
            (case, done.stderr[-3000:])
