"""tools/fuzz_sim.py: a few seeds of every kind in every mode pass, and a wrong result is
reported as a failure with exit status 1."""
import re

import numpy as np

from tests.tools import load_tool


def _tool():
    return load_tool("fuzz_sim")


def test_every_mode_passes_on_a_few_seeds(capsys):
    assert _tool().main(["--seeds", "0", "4"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("fuzz_sim: ") and " 0 failed " in summary
    passed, refused = (int(w) for w in re.match(r"fuzz_sim: (\d+) passed, (\d+) refused",
                                                 summary).groups())
    assert passed + refused == 4 * 6 * 4 and passed > 0      # seeds x kinds x modes


def test_a_wrong_result_is_a_failure(capsys, monkeypatch):
    from tests import reference
    tool = _tool()
    real = reference.evaluate

    def off_by_one(graph, inputs):
        return {i: (value + 1.0, bound) for i, (value, bound) in real(graph, inputs).items()}

    monkeypatch.setattr(reference, "evaluate", off_by_one)
    assert tool.main(["--seeds", "0", "1", "--kinds", "fp32", "--modes", "plain", "api"]) == 1
    out = capsys.readouterr().out
    assert "FAIL fp32 seed 0 mode plain: AssertionError" in out
    assert "FAIL fp32 seed 0 mode api: AssertionError" in out
    assert out.splitlines()[-1].startswith("fuzz_sim: 0 passed, 0 refused by the page budget, "
                                           "2 failed")


def test_an_interrupted_run_prints_what_it_ran(capsys, monkeypatch):
    tool = _tool()
    calls = []

    def stop_on_the_sixth(mode, graph, seed, rng):
        calls.append((seed, mode))
        if len(calls) == 6:
            raise KeyboardInterrupt     # what a SIGTERM from `timeout` raises
        return "ok"

    monkeypatch.setattr(tool, "run_mode", stop_on_the_sixth)
    assert tool.main(["--seeds", "7", "20", "--kinds", "fp32", "--modes", "plain", "api"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == "fuzz_sim: interrupted; the summary counts the seeds that ran"
    assert lines[-1] == ("fuzz_sim: 5 passed, 0 refused by the page budget, 0 failed "
                         "(fp32 seeds 7-8; modes plain, api)")


def test_strided_views_keep_values_and_pad_rows():
    tool = _tool()
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = tool.strided(a, np.random.default_rng(0))
    np.testing.assert_array_equal(v, a)
    assert v.strides[0] > a.strides[0] and v.strides[1] == a.strides[1]
