"""tools/ab_trees.py's CPU half: the trees it prepares hold the revision (and patch) asked for,
and its table reads the timings the GPU half collects."""
import difflib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.tools import load_tool

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    return load_tool("ab_trees")


def _git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def ab_dir():
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    out = ROOT / "build" / "test-ab-trees"   # inside the checkout: git apply's --directory
    yield out
    shutil.rmtree(out, ignore_errors=True)


def test_prepare_writes_the_revision_the_patch_and_the_order(ab_dir, tmp_path):
    ab = _tool()
    init = _git("show", "HEAD:megak/__init__.py").splitlines()
    # a patch touching megak (kept) and a test file (outside a tree's parts: skipped)
    patch = tmp_path / "p.patch"
    patched = [init[0], "# patched", *init[1:]]
    patch.write_text(
        "".join(difflib.unified_diff([f"{x}\n" for x in init], [f"{x}\n" for x in patched],
                                     "a/megak/__init__.py", "b/megak/__init__.py"))
        + "--- a/tests/nowhere.py\n+++ b/tests/nowhere.py\n@@ -1 +1 @@\n-x\n+y\n")
    ab.prepare(["base=HEAD", f"new=HEAD:{patch}", "wt=WORKTREE"], ab_dir)
    assert json.loads((ab_dir / "trees.json").read_text()) == ["base", "new", "wt"]
    base = (ab_dir / "base" / "megak" / "__init__.py").read_text()
    assert base.splitlines() == init
    new = (ab_dir / "new" / "megak" / "__init__.py").read_text().splitlines()
    assert new == patched
    assert not (ab_dir / "new" / "tests").exists()
    for tree in ("base", "new", "wt"):
        for part in ab.PARTS:
            assert (ab_dir / tree / part).exists(), (tree, part)
    assert (ab_dir / "wt" / "megak" / "__init__.py").read_text() == \
        (ROOT / "megak" / "__init__.py").read_text()


@pytest.mark.parametrize("spec", ["noequals", "=HEAD", "a/b=HEAD", "x="])
def test_a_bad_spec_is_refused(spec):
    with pytest.raises(SystemExit, match="NAME=REV"):
        _tool().parse_spec(spec)


def test_the_table_puts_rounds_side_by_side_and_ratios_against_the_first_tree():
    ab = _tool()
    results = [{"row": "r", "name": "a", "median_us": 100.0},
               {"row": "r", "name": "b", "median_us": 90.0},
               {"row": "r", "name": "a", "median_us": 102.0},
               {"row": "r", "name": "b", "median_us": 92.0}]
    table = ab.render(results, ["a", "b"], ["r", "missing"]).splitlines()
    assert table[2] == "| r | 100.0 / 102.0 | 90.0 / 92.0 | 0.901 |"
    assert table[3] == "| missing | failed | failed |  |"


def test_an_unknown_revision_or_a_patch_that_does_not_apply_says_so(ab_dir, tmp_path):
    ab = _tool()
    with pytest.raises(SystemExit, match="no revision 'no-such-rev'"):
        ab.prepare(["x=no-such-rev"], ab_dir)
    bad = tmp_path / "bad.patch"
    bad.write_text("--- a/megak/__init__.py\n+++ b/megak/__init__.py\n"
                   "@@ -1,2 +1,2 @@\n-not the first line\n+x\n not the second\n")
    with pytest.raises(SystemExit, match="does not apply"):
        ab.prepare([f"x=HEAD:{bad}"], ab_dir)


def test_a_directory_outside_the_checkout_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="inside the checkout"):
        _tool().prepare(["x=HEAD"], tmp_path)


def test_build_asks_for_what_run_and_time_will(monkeypatch, capsys):
    # `prebuild`'s child: the build of every body (run's first), then each row's program build
    # as the executor names it (its bodies), each distinct build once
    import megak
    from benchmarks import workloads as W
    from megak.runtime import compiler, executor, packed_weights
    asked = []

    class Built:
        from_cache = False

    def compile_megakernel(arch, defines=None, cache_dir=None):
        asked.append((arch, defines))
        return Built()

    monkeypatch.setattr(compiler, "compile_megakernel", compile_megakernel)
    rows = ["W1", "W2-1024x16-bf16", "W2-1024x16-bf16+const", "W1"]
    _tool().build_rows(rows, 132, "sm_90a", 7)
    expected = [None]
    for name in ("W1", "W2-1024x16-bf16"):
        plan = megak.compile(W.get(name).build(), backend="sim", n_sm=132).plan
        expected.append(compiler.bodies_defines(executor.program_bodies(
            plan.instrs, packed_weights.packed_forms(plan.instrs, plan.constant_values))))
    assert asked[:3] == [("sm_90a", d) for d in expected]
    # the constant's build holds the packed stream (where its weights are packed)
    assert len(asked) == 4 and int(asked[3][1]["MK_BODIES"].rstrip("u"), 16) & \
        megak.abi.BODY_STREAM_PACKED
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [b["build"] for b in lines][0] == "every body" and len(lines) == 4


def test_build_for_the_report_adds_the_traced_resident_and_wgmma_only_builds(monkeypatch,
                                                                              capsys):
    from megak.runtime import compiler
    asked = []

    class Built:
        from_cache = True

    def compile_megakernel(arch, defines=None, cache_dir=None):
        asked.append(defines)
        return Built()

    monkeypatch.setattr(compiler, "compile_megakernel", compile_megakernel)
    _tool().build_rows(["W3-8192-bf16", "W7-call-copy"], 132, "sm_90a", 7, report=True)
    names = [json.loads(line)["build"] for line in capsys.readouterr().out.splitlines()]
    assert names[0] == "every body" and asked[0] is None
    assert any(n.startswith("wgmma-only") for n in names)       # W3-bf16's wgmma tiles
    assert sum(n.endswith(" traced") for n in names) == 2       # one per program
    assert sum(n.endswith(" resident") for n in names) == 1     # the call workload's
    by_name = dict(zip(names, asked))
    traced = next(d for n, d in by_name.items() if n.endswith(" traced"))
    assert traced["MK_TRACE"] == 1 and "MK_BODIES" in traced
    resident = next(d for n, d in by_name.items() if n.endswith(" resident"))
    assert resident["MK_RESIDENT"] == 1
    wgmma = next(d for n, d in by_name.items() if n.startswith("wgmma-only"))
    assert set(wgmma) == {"MK_WGMMA_ONLY"}
