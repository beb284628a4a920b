"""tools/trace_transpose_phases.py's CPU half: the intervals it reads from a trace's events, on
a synthetic trace whose every interval is known."""
import numpy as np

from megak import abi
from tests.tools import load_tool

P = abi.TRACE_PHASES


def _tool():
    return load_tool("trace_transpose_phases")


def test_pairs_read_each_interval_per_sm_in_queue_order():
    tool = _tool()
    n_sm, per_sm, period = 2, 4, 10_000
    dtype = np.dtype([("t", np.uint64, (P["MK_TRACE_PHASES"],)), ("sm", np.uint16),
                      ("queue_index", np.uint32)])
    rows = []
    for sm in range(n_sm):
        for q in reversed(range(per_sm)):          # events out of queue order
            start = 1_000_000 * (sm + 1) + period * q
            t = np.zeros(P["MK_TRACE_PHASES"], np.uint64)
            t[P["MK_T_LOADED"]] = start                  # the op starts
            t[P["MK_T_STORED"]] = start + 3_000          # and signals 3 us later
            t[P["MK_T_FETCH"]] = start - period + 2_000  # its record, 2 us into the one before
            t[P["MK_T_ACQUIRED"]] = t[P["MK_T_FETCH"]] + 500
            t[P["MK_T_WAITED"]] = t[P["MK_T_FETCH"]] + 1_500
            rows.append((t, sm, q))
    ev = np.array(rows, dtype=dtype)
    got = tool.pairs(ev)
    assert got.shape == (n_sm * (per_sm - 1), len(tool.LABELS))
    want = [2_000, 500, 1_500, period - 3_000, 3_000, period]
    np.testing.assert_array_equal(got, np.tile(want, (n_sm * (per_sm - 1), 1)))


def test_tile_rows_read_the_tile_arrival_per_instruction():
    tool = _tool()
    dtype = np.dtype([("t", np.uint64, (P["MK_TRACE_PHASES"],)), ("sm", np.uint16),
                      ("queue_index", np.uint32)])
    period, rows = 9_000, []
    for q in reversed(range(5)):
        start = 1_000_000 + period * q
        t = np.zeros(P["MK_TRACE_PHASES"], np.uint64)
        t[P["MK_T_LOADED"]] = start
        t[P["MK_T_COMPUTED"]] = start + 500          # the tile in, 0.5 us after the start
        t[P["MK_T_STORED"]] = start + 3_250
        t[P["MK_T_FETCH"]] = start - period + 1_700  # 1.2 us after the tile before came in
        t[P["MK_T_ACQUIRED"]] = t[P["MK_T_FETCH"]] + 1_900
        rows.append((t, 0, q))
    got = tool.tile_rows(np.array(rows, dtype=dtype))
    want = [1_200, 1_900, period + 500 - 1_700 - 1_900, 500, 2_750]
    np.testing.assert_array_equal(got, np.tile(want, (4, 1)))
