"""What `python -m megak` says when the backend asked for cannot run: one line, the truth,
a non-zero exit, never a traceback."""
import pytest

from megak.runtime.driver import gpu_unusable_reason, gpu_usable
from tests.run_python import assert_no_traceback, one_line, run_python

needs_no_gpu = pytest.mark.skipif(
    gpu_usable(), reason="a GPU is usable here, so the no-GPU answers cannot be observed")


@needs_no_gpu
def test_info_with_cuda_requested_and_no_gpu():
    r = run_python(["-m", "megak", "info"], backend="cuda")
    assert_no_traceback(r)
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert line.startswith("python -m megak info: MEGAK_BACKEND=cuda asks for the GPU, but "
                           "none is usable")
    assert gpu_unusable_reason() in line
    assert "megak.compile() will raise" in line and "MEGAK_BACKEND=sim" in line
    assert "the simulator runs" not in r.stdout      # it would not: compile() raises
    assert "backend: " not in r.stdout


def test_info_with_an_invalid_backend():
    r = run_python(["-m", "megak", "info"], backend="tpu")
    assert_no_traceback(r)
    assert r.returncode == 2
    assert one_line(r.stderr) == (
        "python -m megak info: MEGAK_BACKEND='tpu' names no backend (allowed: sim, cuda): "
        "megak.compile() will raise; set MEGAK_BACKEND to one of those, or unset it")


@pytest.mark.parametrize("backend", [None, "sim"])
def test_info_with_a_runnable_backend_exits_zero(backend):
    r = run_python(["-m", "megak", "info"], backend=backend)
    assert_no_traceback(r)
    assert r.returncode == 0 and r.stderr == ""
    expected = "sim" if backend == "sim" or not gpu_usable() else "cuda"
    assert f"backend: {expected} (" in r.stdout


@needs_no_gpu
@pytest.mark.parametrize("args, env, asked, fix", [
    (["--backend", "cuda"], None, "--backend cuda", "--backend sim runs the CPU simulator"),
    ([], "cuda", "MEGAK_BACKEND=cuda", "--backend sim (or MEGAK_BACKEND=sim) runs the CPU "
                                       "simulator"),
], ids=["--backend", "MEGAK_BACKEND"])
def test_demo_on_cuda_without_a_gpu(args, env, asked, fix):
    r = run_python(["-m", "megak", "demo", *args], backend=env)
    assert_no_traceback(r)
    assert r.returncode == 1
    assert r.stdout == ""
    assert one_line(r.stderr) == (
        f"python -m megak demo: cannot run on the GPU ({asked}): no GPU is usable "
        f"({gpu_unusable_reason()}); {fix}")


def test_demo_with_an_invalid_backend():
    r = run_python(["-m", "megak", "demo"], backend="tpu")
    assert_no_traceback(r)
    assert r.returncode == 2
    assert one_line(r.stderr).startswith(
        "python -m megak demo: MEGAK_BACKEND='tpu' names no backend (allowed: sim, cuda)")
