"""Page hand-over between consecutive instructions of one SM, on both backends.

Every GEMM record is made to ask for 8 of the 13 pages, so two of them never fit side by side:
the loader of instruction q+1 must wait for q's pages. A short tile (rows <= 32) hands 3 of
its 4 working pages back right after its k loop (the page plan), so q+1 gets its 8 while q is
still in its epilogue, and starts loading. Results are checked against float64 either way.
"""
import numpy as np
import pytest

import megak
from megak import abi
from tests.reference import check_graph

PAGES = 8


def short_tile_chain(dtype, layers=6, m=24, width=256):
    """x (m x width) through `layers` GEMMs with weights that are graph inputs: every tile is
    m <= 32 rows, so each holds one staging page after its k loop."""
    g = megak.Graph()
    y = g.input("x", (m, width), dtype)
    for i in range(layers):
        w = g.input(f"w{i}", (width, width), dtype)
        y = g.gemm(y, w, activation="relu" if i % 2 else None)
    g.output(y, "y")
    return g


def inflate(plan, pages=PAGES):
    gemms = plan.instrs["opcode"] == abi.OPCODE_OF["gemm"]
    assert gemms.any()
    plan.instrs["pages"][gemms] = pages
    return gemms


# fp32 only: a bf16 chain of so few rows streams its weights (tests/ops/test_gemm_stream.py),
# with the ring's pages outside the allocator
@pytest.mark.parametrize("dtype", ["float32"])
def test_instructions_wait_for_pages_and_results_hold(backend, rng, dtype):
    g = short_tile_chain(dtype)
    opts = {"n_sm": 2} if backend == "sim" else {"n_sm": 2, "debug": True}
    prog = megak.compile(g, backend=backend, **opts)
    try:
        assert prog.plan.n_pages == 13
        inflate(prog.plan)
        prog._executor.reload_queues()
        for _ in range(2):   # a replay (next epoch) hands pages over the same way
            check_graph(prog, g, rng, f"{dtype} chain, {PAGES} pages per GEMM")
        prog.run(**{k: v for k, v in _inputs(g, rng).items()}, trace=True)
        ev = prog.last_trace.events
        ph = abi.TRACE_PHASES
        # each SM: q+1 acquired its pages only after q's k loop handed 3 back, never before
        # q acquired; with 8 + 8 > 13 the hand-over is the only way it could get them
        pairs = early = 0
        for sm in range(prog.plan.n_sm):
            e = ev[ev["sm"] == sm]
            e = e[np.argsort(e["queue_index"])]
            gem = e[e["opcode"] == abi.OPCODE_OF["gemm"]]
            for a, b in zip(gem[:-1], gem[1:]):
                if b["queue_index"] != a["queue_index"] + 1:
                    continue
                pairs += 1
                assert b["t"][ph["MK_T_ACQUIRED"]] >= a["t"][ph["MK_T_ACQUIRED"]]
                early += int(b["t"][ph["MK_T_ACQUIRED"]] < a["t"][ph["MK_T_STORED"]])
                assert b["pages_in_use"] <= 13
        assert pairs >= 4, "the chain should put consecutive GEMMs on one SM"
        # the hand-over happens before q is done (q still runs its epilogue) for most pairs
        assert early >= pairs // 2, (early, pairs)
    finally:
        prog.close()


def _inputs(g, rng):
    from tests.reference import random_inputs
    return random_inputs(g, rng)
