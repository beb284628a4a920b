"""Every example and the command line run to PASS: on the simulator here, on the GPU in the
gpu tier. Every check they print is against a bound that is tight: the observed error is a
real fraction of it, so a bound too loose to catch a wrong result fails here."""
import re

import pytest

from tests.run_python import ROOT, run_python

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

# one check as megak.accuracy.Check.line() prints it: "... (fp32, K=256): ... worst
# |err|/bound 5.21e-03: within the bound"
CHECK = re.compile(r"\((fp32|bf16), K=\d+\).* worst \|err\|/bound (\S+):")
# The smallest worst |err| / bound that says the bound is tight: a bound further above the
# error would also pass wrong results. Each GEMM is checked on its computed input: fp32
# checks see about 1e-3 (K = 2048 on the GPU) to 5e-2 (K = 64); a bf16 result carries its
# own rounding to bf16, which some element realises nearly in full, so bf16 checks see
# about 0.5 to 1, where a tolerance of a few bf16 ulps of max |y| sits near 0.05.
TIGHT = {"fp32": 1e-4, "bf16": 0.1}


def run(args, backend):
    return run_python(args, backend=backend)


def assert_tight_checks(stdout: str) -> None:
    checks = CHECK.findall(stdout)
    assert checks, f"no error check printed:\n{stdout}"
    for dtype, ratio in checks:
        assert TIGHT[dtype] < float(ratio) <= 1.0, \
            f"{dtype} check at {ratio} of its bound: bound not tight\n{stdout}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_passes(backend, example):
    r = run([str(example)], backend)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "PASS"
    assert f"backend={backend}" in r.stdout or f"backend: {backend}" in r.stdout
    assert_tight_checks(r.stdout)


def test_cli_info(backend):
    r = run(["-m", "megak", "info"], backend)
    assert r.returncode == 0, r.stderr
    for word in ("megak", "cache dir", "backend", "GPU", "pages", "cuda-core", "matplotlib"):
        assert word in r.stdout
    if backend == "cuda":
        assert "SMs" in r.stdout and "opt-in" in r.stdout


def _matplotlib_importable() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("args, stem", [(["-m", "megak", "demo"], "demo_trace"),
                                        (["examples/mlp.py"], "mlp_trace")],
                         ids=["demo", "mlp"])
def test_trace_writes_json_and_png(backend, tmp_path, args, stem):
    r = run([*args, "--trace", str(tmp_path)], backend)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "PASS"
    assert_tight_checks(r.stdout)
    assert (tmp_path / f"{stem}.json").stat().st_size > 0
    if _matplotlib_importable():     # the test extra brings it: CI takes this branch
        assert (tmp_path / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "trace: PNG skipped (matplotlib is not installed" in r.stdout
