#!/usr/bin/env python3
"""Same-lease A/B timing of megak source trees: which of two builds is faster on the W2 rows.

Device time is scarce and GPUs differ from lease to lease by more than most changes move a
row (the W2 rows have moved 5-10% between leases on unchanged code), so a change is judged
against its base on ONE machine, the trees alternated round by round. Two steps:

  prepare (CPU machine)   tools/ab_trees.py prepare main=HEAD~1 new=WORKTREE lean=HEAD:fix.patch
      writes ab/<name>/ (megak, benchmarks, pyproject.toml) for each NAME=REV[:PATCH]: REV
      from `git archive`, or WORKTREE for this checkout's files as they are; PATCH applied
      on top with `git apply`. ab/ is git-ignored: carry it to the GPU machine
      (`carry: ["ab", ".whl"]`).
  run (GPU machine)       tools/ab_trees.py run [--rows ...] [--rounds 2] [--names ...]
      builds each tree's megakernel in parallel, then per round times every tree in turn,
      each in a child process importing that tree (PYTHONPATH=ab/<name>); prints the medians
      per round and each tree's mean over rounds against the first tree's.
  prebuild (CPU machine, optional)   tools/ab_trees.py prebuild [--rows ...]
      compiles every build `run` will ask for (each tree's build of every body, and its build
      of each row's program: lowered here as the GPU machine lowers it) into the compile
      cache; run under the GPU image's NVRTC (tools/gpu_cache.py), the lease finds them there.

A timing is `python -m benchmarks.report`'s megak variant: Bench.time_megakernel (CUDA events
around each launch), the workload's own reps, the L2 flushed only where the report flushes it
(working set <= L2_FLUSH_BYTES: the flush's dirty lines add ~12 us to a 4096 x 8 chain, so a
flushed figure is not comparable with the report's), outputs checked against the float64
reference after the timed runs, on outputs poisoned before them. A row named ROW+const times
ROW's graph with its weights as constants (the report's megak_const variant).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("megak", "benchmarks", "pyproject.toml")   # what a tree needs to build and time
ORDER = "trees.json"   # prepare's names in the order given: the base first
CONSTANT = "+const"   # a row named W2-...+const: its megak_const variant (g.constant weights)
H200_SMS = 132   # what `prebuild` lowers for: the SMs of the GPU the leases lend
W2_ROWS = ("W2-4096x8-bf16", "W2-4096x8-bf16-b1", "W2-8192x8-bf16", "W2-4096x8-bf16-b64",
           "W2-1024x16-bf16")


# -- prepare (CPU) ---------------------------------------------------------------------------
def _git(args: list[str], what: str) -> bytes:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"ab_trees: {what}:\n{done.stderr.decode(errors='replace')}")
    return done.stdout


def parse_spec(spec: str) -> tuple[str, str, str | None]:
    """NAME=REV[:PATCH] -> (name, rev, patch or None)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest or "/" in name or name.startswith("."):
        raise SystemExit(f"ab_trees: expected NAME=REV[:PATCH], got {spec!r}")
    rev, _, patch = rest.partition(":")
    return name, rev, patch or None


def prepare(specs: list[str], out: Path) -> list[Path]:
    out = out.resolve()
    if not out.is_relative_to(ROOT):   # git apply patches paths under the checkout
        raise SystemExit(f"ab_trees: --dir {out} must lie inside the checkout {ROOT}")
    trees = []
    for name, rev, patch in map(parse_spec, specs):
        tree = out / name
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        if rev == "WORKTREE":
            for part in PARTS:
                src = ROOT / part
                if src.is_dir():
                    shutil.copytree(src, tree / part,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy2(src, tree / part)
        else:
            archive = _git(["archive", rev, *PARTS], f"no revision {rev!r}")
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        if patch:
            # only the tree's parts: a patch may touch tests and docs too
            rel = tree.relative_to(ROOT)
            keep = [f"--include={(rel / part).as_posix()}" + ("/*" if (ROOT / part).is_dir()
                                                              else "") for part in PARTS]
            _git(["apply", f"--directory={rel.as_posix()}", *keep, str(Path(patch).resolve())],
                 f"{patch} does not apply to {rev}")
        trees.append(tree)
        print(f"ab_trees: {tree} <- {rev}" + (f" + {patch}" if patch else ""))
    (out / ORDER).write_text(json.dumps([t.name for t in trees]))   # run's default order
    return trees


# -- run (GPU) --------------------------------------------------------------------------------
def _child_env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return env


def _child(tree: Path, args: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          cwd=tree, env=_child_env(tree), capture_output=True, text=True,
                          timeout=timeout)


def time_rows(tag: str, rows: list[str], reps: int | None, seed: int) -> None:
    """Child: time the megak variant of `rows` with the megak on sys.path; one JSON line each."""
    import numpy as np

    import megak
    from benchmarks import workloads as W
    from megak.runtime.bench import L2_FLUSH_BYTES, Bench
    rng = np.random.default_rng(seed)
    for name in rows:
        w = W.get(name.removesuffix(CONSTANT))
        n, warmup = w.reps["megak"] if reps is None else (reps, 10)
        inputs = w.make_inputs(rng)
        ref = w.reference(inputs, rng)
        if name.endswith(CONSTANT):      # the report's megak_const: weights as constants
            graph = w.build_constant(inputs)
            inputs = {k: inputs[k] for k in w.constant_inputs}
        else:
            graph = w.build()
        prog = megak.compile(graph, backend="cuda")
        bench = Bench(prog)
        w.check(ref, prog.run(**inputs), "prog.run")
        bench.upload(**inputs)
        bench.poison()
        flush = w.working_set_bytes <= L2_FLUSH_BYTES
        t = bench.time_megakernel(reps=n, warmup=warmup, flush_l2=flush)
        err = w.check(ref, bench.outputs(), "the timed runs' outputs")
        print(json.dumps({"tag": tag, "row": name, "median_us": float(np.median(t)),
                          "p10_us": float(np.percentile(t, 10)),
                          "p90_us": float(np.percentile(t, 90)), "reps": n, "flush": flush,
                          "err_ratio": float(err), "megak": megak.__file__}), flush=True)
        del bench, prog


def program_builds(plan, report: bool, resident: bool) -> dict[str, dict | None]:
    """The builds a CudaExecutor of `plan` compiles, named: its program build (the plan's
    bodies) and, where its GEMMs allow, the MK_WGMMA_ONLY one; with `report` its traced build
    too (the report's megak_trace and bubble runs), and with `resident` the resident kernel's
    build of its bodies. The defines are the executor's own (_variant_defines)."""
    import numpy as np

    from megak.runtime import executor, packed_weights, tensor_maps
    defines = executor.CudaExecutor._variant_defines   # takes nothing from its instance
    bodies = executor.program_bodies(
        plan.instrs, packed_weights.packed_forms(plan.instrs, plan.constant_values))
    builds = {f"{bodies:#x}": defines(None, False, 0, bodies, False)}
    if report:
        builds[f"{bodies:#x} traced"] = defines(None, True, 0, bodies, False)
    if resident:
        builds[f"{bodies:#x} resident"] = defines(None, False, 0, bodies, True)
    n = max((t.slot for t in plan.tensors), default=-1) + 1
    rows, cols = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for t in plan.tensors:
        rows[t.slot], cols[t.slot] = t.rows, t.cols
    if tensor_maps.wgmma_only_slots(plan.instrs, rows, cols) is not None:
        build = tensor_maps.wgmma_only_build(plan.instrs)
        builds[f"wgmma-only {build}"] = defines(None, False, build, None, False)
    return builds


def build_rows(rows: list[str], n_sm: int, arch: str, seed: int, report: bool = False) -> None:
    """Child: compile the build of every body and each row's program builds with the megak on
    sys.path (what `run` and `time` ask for; with `report`, what `benchmarks.report` asks for
    too: program_builds), the programs lowered for `n_sm` SMs without a GPU; one JSON line
    each."""
    import numpy as np

    import megak
    from benchmarks import workloads as W
    rng = np.random.default_rng(seed)
    builds = {"every body": None}
    for name in rows:
        w = W.get(name.removesuffix(CONSTANT))
        graph = w.build_constant(w.make_inputs(rng)) if name.endswith(CONSTANT) else w.build()
        plan = megak.compile(graph, backend="sim", n_sm=n_sm).plan
        for what, defines in program_builds(plan, report, report and w.kind == "call").items():
            builds.setdefault(what, defines)
        lowering = _peer_lowering(plan) if report else {}
        if lowering:   # the report's separate launches time a program lowered for themselves
            peer = megak.compile(graph, backend="sim", n_sm=n_sm, **lowering).plan
            for what, defines in program_builds(peer, False, False).items():
                builds.setdefault(what, defines)
    compile_builds(builds, arch)


def _peer_lowering(plan) -> dict:
    """benchmarks.report.peer_lowering of `plan`, or none in a tree that predates it."""
    try:
        from benchmarks.report import peer_lowering
    except ImportError:
        return {}
    return peer_lowering(plan)


def compile_builds(builds: dict[str, dict | None], arch: str) -> None:
    """Compile each named build into the cache; one JSON line each (what `prebuild` and
    tools/gpu_cache.py read)."""
    import time

    from megak.runtime import compiler
    for what, defines in builds.items():
        t0 = time.monotonic()
        k = compiler.compile_megakernel(arch, defines=defines)
        print(json.dumps({"build": what, "from_cache": k.from_cache,
                          "seconds": round(time.monotonic() - t0, 1),
                          "nvrtc": list(compiler.nvrtc_version())}), flush=True)


def prebuild(out: Path, names: list[str], rows: list[str], n_sm: int, arch: str, seed: int,
             jobs: int) -> int:
    """Every tree's builds for `run` on `rows`, `jobs` trees at a time, into the cache."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> tuple[str, subprocess.CompletedProcess]:
        return name, _child(out / name, ["build", "--rows", *rows, "--n-sm", str(n_sm),
                                         "--arch", arch, "--seed", str(seed)], timeout=3600)
    failed = 0
    with ThreadPoolExecutor(max(jobs, 1)) as pool:
        for name, done in pool.map(one, names):
            for line in done.stdout.splitlines():
                if line.startswith("{"):
                    b = json.loads(line)
                    how = "cached" if b["from_cache"] else f"compiled in {b['seconds']} s"
                    print(f"{name}: {b['build']} {how} (NVRTC {b['nvrtc'][0]}.{b['nvrtc'][1]})",
                          flush=True)
            if done.returncode != 0:
                failed += 1
                print(f"ab_trees: {name} does not build:\n{done.stderr[-3000:]}", flush=True)
    return 1 if failed else 0


def render(results: list[dict], names: list[str], rows: list[str]) -> str:
    """Rows x (each tree's medians per round, its mean over rounds / the first tree's)."""
    by = {}
    for r in results:
        by.setdefault((r["row"], r["name"]), []).append(r["median_us"])
    base = names[0]
    head = ["row"] + [f"{n} (us, per round)" for n in names] + [f"{n} / {base}"
                                                              for n in names[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row]
        means = {}
        for n in names:
            got = by.get((row, n), [])
            means[n] = statistics.fmean(got) if got else None
            cells.append(" / ".join(f"{v:.1f}" for v in got) or "failed")
        for n in names[1:]:
            ok = means[n] is not None and means[base]
            cells.append(f"{means[n] / means[base]:.3f}" if ok else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(out: Path, names: list[str], rows: list[str], rounds: int, reps: int | None,
        seed: int, arch: str, log: Path | None) -> int:
    trees = {n: out / n for n in names}
    missing = [str(t) for t in trees.values() if not (t / "megak").is_dir()]
    if missing:
        print(f"ab_trees: no tree at {', '.join(missing)} (prepare first, carry ab/)")
        return 2
    # the builds first, all at once: each takes a minute of one core
    builds = {n: subprocess.Popen(
        [sys.executable, "-c", f"from megak.runtime import compiler; "
                               f"compiler.compile_megakernel({arch!r})"],
        cwd=t, env=_child_env(t), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True) for n, t in trees.items()}
    for n, p in builds.items():
        _, err = p.communicate(timeout=400)
        if p.returncode != 0:
            print(f"ab_trees: {n} does not build:\n{err[-3000:]}")
            return 1
    results, failed = [], 0
    for k in range(1, rounds + 1):
        for n, t in trees.items():
            done = _child(t, ["time", "--tag", f"{n}{k}", "--seed", str(seed), "--rows", *rows]
                          + ([] if reps is None else ["--reps", str(reps)]), timeout=300)
            for line in done.stdout.splitlines():
                if line.startswith("{"):
                    r = dict(json.loads(line), name=n, round=k)
                    if not Path(r["megak"]).resolve().is_relative_to(t.resolve()):
                        raise SystemExit(f"ab_trees: {n} imported {r['megak']}, not its tree")
                    results.append(r)
                    print(f"{n} round {k}: {r['row']} {r['median_us']:.1f} us "
                          f"(p10 {r['p10_us']:.1f}, p90 {r['p90_us']:.1f}, "
                          f"flush {r['flush']}, max |err|/bound {r['err_ratio']:.2f})",
                          flush=True)
            if done.returncode != 0:
                failed += 1
                print(f"ab_trees: {n} round {k} failed:\n{done.stderr[-3000:]}", flush=True)
    table = render(results, names, rows)
    print(table)
    if log is not None:
        log.write_text(json.dumps({"results": results, "table": table}, indent=1))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="CPU: write ab/<name>/ for each NAME=REV[:PATCH]")
    pp.add_argument("specs", nargs="+", metavar="NAME=REV[:PATCH]")
    pp.add_argument("--dir", default=str(ROOT / "ab"))
    pr = sub.add_parser("run", help="GPU: build the trees, time them alternately")
    pr.add_argument("--dir", default=str(ROOT / "ab"))
    pr.add_argument("--names", nargs="+",
                    help="trees, the base first (default: prepare's, in its order)")
    pr.add_argument("--rows", nargs="+", default=list(W2_ROWS))
    pr.add_argument("--rounds", type=int, default=2)
    pr.add_argument("--reps", type=int, help="timed runs per row (default: the workload's)")
    pr.add_argument("--seed", type=int, default=7)
    pr.add_argument("--arch", default="sm_90a")
    pr.add_argument("--json", type=Path, help="write every timing and the table here")
    pb = sub.add_parser("prebuild", help="compile the builds `run` will ask for (no GPU needed)")
    pb.add_argument("--dir", default=str(ROOT / "ab"))
    pb.add_argument("--names", nargs="+", help="trees (default: prepare's)")
    pb.add_argument("--rows", nargs="+", default=list(W2_ROWS))
    pb.add_argument("--n-sm", type=int, default=H200_SMS,
                    help="the SMs the programs are lowered for (the GPU machine's)")
    pb.add_argument("--seed", type=int, default=7)
    pb.add_argument("--arch", default="sm_90a")
    pb.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    pc = sub.add_parser("build", help=argparse.SUPPRESS)
    pc.add_argument("--rows", nargs="+", required=True)
    pc.add_argument("--n-sm", type=int, default=H200_SMS)
    pc.add_argument("--arch", default="sm_90a")
    pc.add_argument("--seed", type=int, default=7)
    pc.add_argument("--report", action="store_true",
                    help="also the builds benchmarks.report asks for (program_builds)")
    pt = sub.add_parser("time", help=argparse.SUPPRESS)
    pt.add_argument("--tag", required=True)
    pt.add_argument("--rows", nargs="+", required=True)
    pt.add_argument("--reps", type=int)
    pt.add_argument("--seed", type=int, default=7)
    a = p.parse_args(argv)
    if a.cmd == "prepare":
        prepare(a.specs, Path(a.dir))
        return 0
    if a.cmd == "time":
        time_rows(a.tag, a.rows, a.reps, a.seed)
        return 0
    if a.cmd == "build":
        build_rows(a.rows, a.n_sm, a.arch, a.seed, a.report)
        return 0
    out = Path(a.dir)
    names = a.names
    if not names and (out / ORDER).is_file():
        names = json.loads((out / ORDER).read_text())
    if not names:
        print(f"ab_trees: no trees under {out} (prepare first, carry ab/)")
        return 2
    if a.cmd == "prebuild":
        return prebuild(out, names, a.rows, a.n_sm, a.arch, a.seed, a.jobs)
    return run(out, names, a.rows, a.rounds, a.reps, a.seed, a.arch, a.json)


if __name__ == "__main__":
    sys.exit(main())
