"""tools/gpu_cache.py's parts that need neither pip nor NVRTC: which versions it pins (the GPU
image's, from the newest results JSON that names them) and what it packs."""
import json
import os
import tarfile
import types

import pytest

from tests.tools import load_tool


def _results(tmp_path, runs):
    for name, date, packages in runs:
        (tmp_path / name).write_text(json.dumps({"machine": {"date": date,
                                                             "packages": packages}}))
    return tmp_path


KEYED = {"cuda-core": "1.2.0", "cuda-bindings": "13.3.1", "nvidia-cuda-nvrtc": "13.0.88"}


def test_the_pins_are_the_newest_report_s_that_names_them(tmp_path):
    tool = load_tool("gpu_cache")
    newer = dict(KEYED, **{"nvidia-cuda-nvrtc": "13.1.0"})
    results = _results(tmp_path, [
        ("a.json", "2026-12-01", KEYED),
        ("b.json", "2026-12-03", newer),
        ("c.json", "2026-12-04", {"cuda-core": "1.2.0"}),     # names too few: not a source
    ])
    (tmp_path / "broken.json").write_text("{")
    assert tool.gpu_packages(results) == newer


def test_no_report_naming_the_packages_is_refused(tmp_path):
    tool = load_tool("gpu_cache")
    with pytest.raises(SystemExit, match="no results JSON"):
        tool.gpu_packages(_results(tmp_path, [("a.json", "2026-12-01", {"numpy": "2"})]))


def test_the_archive_holds_the_cubins_and_their_logs(tmp_path):
    tool = load_tool("gpu_cache")
    cache = tmp_path / "megak"
    cache.mkdir()
    for name in ("k1.cubin", "k1.log", "k2.cubin", "k2.log", "k3.tmp"):
        (cache / name).write_bytes(name.encode() * 100)
    archive = tmp_path / "out" / "cubins.tar.xz"
    n, size = tool.pack(cache, archive)
    assert n == 4 and size == archive.stat().st_size
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["k1.cubin", "k1.log", "k2.cubin", "k2.log"]
        assert tar.extractfile("k2.cubin").read() == b"k2.cubin" * 100


def test_fill_names_what_to_build(capsys):
    with pytest.raises(SystemExit):
        load_tool("gpu_cache").main(["fill"])
    assert "--tier" in capsys.readouterr().err


def test_fill_tests_prebuilds_those_tests_only(monkeypatch, capsys):
    # --tests: prebuild_bodies over the named paths (the tests step's $GPU_TESTS), not the tier
    tool = load_tool("gpu_cache")
    ran = []

    def fake_run(command, **kw):
        ran.append(command)
        return types.SimpleNamespace(returncode=0, stdout="prebuild_bodies: 3 builds\n",
                                     stderr="")
    monkeypatch.setattr(tool, "gpu_packages", lambda: {"cuda-core": "1.2.0"})
    monkeypatch.setattr(tool, "make_env", lambda packages: "python")
    monkeypatch.setattr(tool, "pack", lambda: (3, 1024))
    monkeypatch.setattr(tool.subprocess, "run", fake_run)
    assert tool.main(["fill", "--tests", "tests/ops/test_a.py", "tests/ops/test_b.py::t"]) == 0
    assert ran == [["python", "tools/prebuild_bodies.py", "--jobs", str(os.cpu_count() or 1),
                    "tests/ops/test_a.py", "tests/ops/test_b.py::t"]]
    assert "prebuild_bodies: 3 builds" in capsys.readouterr().out
