"""The probes in tools/ that measure the megakernel from inside compile it with text patches of
the device source (marks, or variants that cut or change one step). A patch whose anchor no
longer matches the source fails only when the probe runs, on the GPU machine, where device
time is the scarce thing: every patch of every probe is applied here, to the current source,
without a GPU."""
import importlib
from pathlib import Path

import pytest

from megak.runtime import compiler

TOOLS = Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture
def source(monkeypatch):
    """The device source as built; the tools are importable, and whatever a probe module does
    to compiler.device_source on import is undone afterwards."""
    monkeypatch.syspath_prepend(str(TOOLS))
    monkeypatch.setattr(compiler, "device_source", compiler.device_source)
    return compiler.device_source()


def test_every_stage_probe_variant_applies(source):
    probe = importlib.import_module("probe_stream_stages")
    for variant in probe.VARIANTS:
        for marked in (False, True):
            unchanged = probe.patched(source, variant, marked) == source
            assert unchanged == (variant == "asbuilt" and not marked), (variant, marked)


def test_every_racecheck_variant_applies(source):
    probe = importlib.import_module("probe_racecheck")
    for variant in probe.VARIANTS:
        assert (probe.patched(source, variant) == source) == (variant == "asbuilt")


def test_every_stream_loop_cut_applies(source):
    probe = importlib.import_module("probe_stream_loop")
    for name, cuts in probe.CUTS.items():
        for anchor, _ in cuts:
            assert source.count(anchor) == 1, (name, anchor)


def test_every_request_mark_applies(source):
    probe = importlib.import_module("probe_request_marks")
    out = probe.patch(source)
    assert "mk_probe_marks" in out
    assert out.count("MKL(mk_probe_layer_start") == 1 and out.count("MKL(mk_probe_layer_end") == 1


def test_the_page_leak_records_apply(source):
    probe = importlib.import_module("probe_page_leak")
    for marks in (False, True):
        out = probe.patched(source, marks)   # asserts every anchor matches once
        assert "mkp_leak[" in out and "mkp_late[" in out
        assert ("mkp_m[3] = mk_globaltimer();" in out) == marks


def test_the_stage_probe_reads_landings_as_a_delivery_rate(source):
    """Synthetic marks: 2 SMs, a page landing each microsecond on each, 3 us after its issue
    and read 0.5 us after landing, then 4 us with nothing landing: 2 pages/us = 32.8 GB/s."""
    import numpy as np
    probe = importlib.import_module("probe_stream_stages")
    m = np.zeros((132, probe.MAXPOS, probe.NMARK), dtype=np.int64)
    for sm in range(2):
        m[sm, 0, 1] = 10_000                          # the first k-loop entry
        for pos in range(20):
            land = 13_000 + 1000 * pos + (4000 if pos >= 10 else 0)
            m[sm, pos, 0], m[sm, pos, probe.LANDED], m[sm, pos, 3] = land - 3000, land, land + 500
    figures, timeline = probe.analyse_landing(m)
    rate = 2 * 16384 / 1e-6 / 1e12
    assert timeline == pytest.approx([0.0] * 3 + [rate] * 10 + [0.0] * 4 + [rate] * 10)
    assert figures["land TB/s p50"] == pytest.approx(rate)
    assert figures["low bins"] == pytest.approx(7 / 27)
    assert (figures["issue->land (all)"], figures["land->seen"]) == pytest.approx((3.0, 0.5))


def test_the_stage_probe_splits_the_epilogue(source):
    """Synthetic marks, one instruction per SM: on SM 0 the epilogue's first rows loaded 0.9 us
    after the combine and stored 0.3 us later; on SM 1 (variant epi2) a first pass of 1.2 us
    and a second of 0.1."""
    import numpy as np
    probe = importlib.import_module("probe_stream_stages")
    m = np.zeros((132, probe.MAXPOS, probe.NMARK), dtype=np.int64)
    for sm in range(2):
        m[sm, 0, [1, 5, 6, 7]] = [10_000, 16_000, 17_000, 17_200]
        m[sm, 0, 4] = 15_000                          # a stage read, so the SM counts
    m[0, 0, 17], m[0, 0, 8] = 18_100, 18_400
    m[1, 0, 18], m[1, 0, 17], m[1, 0, 8] = 18_400, 18_450, 18_500
    out = probe.analyse(m)
    assert (out["epi:to stores"], out["epi:stores"]) == pytest.approx((0.9, 0.3))
    assert (out["epi:1st pass"], out["epi:2nd pass"]) == pytest.approx((1.2, 0.1))
    assert out["epilogue"] == pytest.approx((1.2 + 1.3) / 2)
