"""`--trace DIR` writes the JSON always and the PNG when matplotlib is there; without it, one
line says the PNG was skipped and why, never a traceback."""
import json
import sys

import numpy as np
import pytest

import megak
from megak.trace_files import TraceDirError, make_trace_dir, save_trace_files
from tests.run_python import assert_no_traceback, one_line, run_python

SKIPPED = "trace: PNG skipped (matplotlib is not installed: pip install megak[plot])"


def small_trace(rng):
    g = megak.Graph()
    a = g.input("a", (130, 64), "float32")
    g.output(g.transpose(a), "y")
    prog = megak.compile(g, backend="sim", n_sm=4)
    prog.run(trace=True, a=rng.uniform(-1, 1, (130, 64)).astype(np.float32))
    return prog.last_trace


def test_without_matplotlib_the_json_is_written_and_the_png_skipped(monkeypatch, tmp_path,
                                                                    rng):
    tr = small_trace(rng)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if it were not installed
    lines = save_trace_files(tr, tmp_path / "new" / "dir", "t")
    assert lines == [f"trace: {tmp_path / 'new' / 'dir' / 't.json'} (open in ui.perfetto.dev)",
                     SKIPPED]
    assert json.loads((tmp_path / "new" / "dir" / "t.json").read_text())["traceEvents"]
    assert not (tmp_path / "new" / "dir" / "t.png").exists()
    with pytest.raises(ImportError, match=r"pip install megak\[plot\]"):
        tr.save_png(tmp_path / "t.png")


@pytest.mark.parametrize("args, stem", [(["-m", "megak", "demo"], "demo_trace"),
                                        (["examples/mlp.py"], "mlp_trace")],
                         ids=["demo", "mlp"])
def test_trace_without_matplotlib_says_so_in_one_line(tmp_path, args, stem):
    r = run_python([*args, "--trace", str(tmp_path)], backend="sim", without_matplotlib=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_no_traceback(r)
    assert SKIPPED in r.stdout.splitlines()
    assert r.stdout.strip().splitlines()[-1] == "PASS"
    assert json.loads((tmp_path / f"{stem}.json").read_text())["traceEvents"]
    assert not (tmp_path / f"{stem}.png").exists()


def test_trace_dir_that_is_a_file_is_one_line(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("keep")
    with pytest.raises(TraceDirError, match="is a file, not a directory"):
        make_trace_dir(f)
    with pytest.raises(TraceDirError, match="cannot create the directory"):
        make_trace_dir(f / "below")
    assert f.read_text() == "keep"


@pytest.mark.parametrize("args", [["-m", "megak", "demo"], ["examples/mlp.py"]],
                         ids=["demo", "mlp"])
def test_trace_to_a_file_fails_before_running(tmp_path, args):
    f = tmp_path / "a-file"
    f.write_text("keep")
    r = run_python([*args, "--trace", str(f)], backend="sim")
    assert r.returncode == 2
    assert_no_traceback(r)
    assert r.stdout == ""                      # nothing ran
    assert f"--trace: {f} is a file, not a directory" in one_line(r.stderr)
    assert f.read_text() == "keep"
