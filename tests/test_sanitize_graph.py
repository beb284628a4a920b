"""tools/sanitize_graph.py on the CPU: the builds its run asks for, compiled without a GPU
(--builds, what tools/gpu_cache.py fill --sanitize runs), and the run itself on the
simulator."""
import argparse

from tests.tools import ROOT, load_tool


def test_builds_names_each_program_s_build_and_the_resident_kernel_s(monkeypatch, capsys):
    import megak
    from megak.runtime import compiler, executor, packed_weights
    monkeypatch.syspath_prepend(str(ROOT / "tools"))   # as when run as a script
    sg = load_tool("sanitize_graph")
    asked = []

    class Built:
        from_cache = False

    monkeypatch.setattr(compiler, "compile_megakernel",
                        lambda arch="sm_90a", defines=None, cache_dir=None:
                        asked.append(defines) or Built())
    args = argparse.Namespace(m=130, k=72, n=66, seed=1234)
    assert sg.prebuild(args) == 0
    bodies, device_sms = [], load_tool("ab_trees").H200_SMS
    for graph, n_sm in sg.program_graphs(130, 72, 66, 1234):
        plan = megak.compile(graph, backend="sim", n_sm=n_sm or device_sms).plan
        bodies.append(executor.program_bodies(
            plan.instrs, packed_weights.packed_forms(plan.instrs, plan.constant_values)))
    union = 0
    for i in sg.RESIDENT_PROGRAMS:
        union |= bodies[i]
    for b in set(bodies):
        assert compiler.bodies_defines(b) in asked
    assert asked[-1] == compiler.bodies_defines(union, True)
    assert sum("MK_WGMMA_ONLY" in (d or {}) for d in asked) >= 1   # prog2 and prog3 run there
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(asked) and all(line.startswith('{"build"') for line in out)


def test_the_run_checks_out_on_the_simulator(monkeypatch, capsys):
    # the whole tool, its launches and resident requests, on the simulator: every output
    # within its bound; only the two checks of which GPU kernel ran can say nothing here
    import megak
    sg = load_tool("sanitize_graph")
    real = megak.compile
    monkeypatch.setattr(sg.megak, "compile",
                        lambda graph, backend=None, **options: real(graph, backend="sim",
                                                                     **options))
    assert sg.main(["--runs", "1"]) == 1
    lines = capsys.readouterr().out.splitlines()
    mismatches = [line for line in lines if "MISMATCH" in line]
    assert mismatches == ["sanitize_graph: run 0: MISMATCH: the wgmma pair ran on the None "
                          "kernel",
                          "sanitize_graph: run 0: MISMATCH: the split GEMM ran on the None "
                          "kernel"]
    assert sum(": ok: " in line for line in lines) >= 30
    assert any(line.startswith("sanitize_graph: resident request 1: ok:") for line in lines)
