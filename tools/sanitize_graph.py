#!/usr/bin/env python3
"""One small mixed graph through the CUDA backend, checked against float64: the workload
`tools/sanitize.sh` runs under compute-sanitizer. It touches every path of the megakernel:
an fp32 gemm -> transpose -> copy, and in bf16 a chain of two GEMMs of 16 rows (streamed
GEMMs loading their weights themselves: the program's wgmma GEMMs leave no pages for a ring;
narrow bands) and one of 40 rows on the same weights (wide bands: row bands of two m16
tiles and of one), plus a 128-row
tile GEMM whose first stages the loader fills, with early page hand-back (short tiles), a
chain of two fp32 GEMMs of 16 rows on the short fp32 tile (device/ops/gemm_f32_short.cuh:
the loader's B stages before the wait, the first layer split over K), and
the row-wise ops: a broadcast add -> causal softmax -> layernorm -> rmsnorm chain in bf16,
and a small fp32 copy/add chain whose intermediates carry their own flags (device/flag.cuh),
and two chained Hopper GEMMs (128 x 256 wgmma tiles, TMA copies the loader warp issues into
a ring of 4 stages across 12 pages): v = u @ w3 + bias (stored from registers, the pages
handed back before the store) and o = gelu(v @ w4) + res (through the staging tiles), the
second reading the first's output, written by other SMs' generic stores, through TMA.
The runs are made once as launches (prog.run) and once as requests of a resident kernel
(megak.resident: the request ring, the relay and the per-request set-up). A second program,
two chained wgmma GEMMs with at most a bias on 2 SMs (wgmma_graph), runs on the
MK_WGMMA_ONLY kernel: one ring of stages across each SM's 7-8 tiles (device/pages.cuh); a
third, one GEMM tile + bias + gelu split over K on 8 SMs (split_graph), runs there too: wgmma
tiles writing fp32 partials, then the reduces that sum them and run the epilogue. A fourth,
ring_graph, on 2 SMs: the weight ring, two streamed GEMMs in a chain whose first is one
instruction of 12 stages per SM (the compute warps take them in turn, and the 10-page ring
wraps within the instruction), then one more of the first's weights (20 rows: two readers
per stage, two parts combined) and one of its own (8 rows in narrow bands: a stage of two
boxes, the last one past K's end; half-height A chunks, each warp's next one copied ahead),
so that stages are read by 2 and 1 warps in every order,
as launches and as resident requests (the ring's barriers set up again per request).
A fifth, tiles_graph, on 2 SMs: paged transposes (device/ops/transpose.cuh), whole tiles the
loader copies into pages by tensor copies ahead of their instruction and thread 0 stores by
TMA from them, several per SM, one reading another SM's copy (generic stores, then the
loader's proxy fence), one reading another transpose's TMA-stored tiles (their stores
waited for and fenced before the signal), with edge tiles between them on the register path;
and a copy nothing reads, whose two takers' warps take its 30 bands from a hand-out counter
(device/ops/copy.cuh: each band given to its warp by a shuffle); as launches and as resident
requests.
A sixth, const_graph, on 2 SMs: streamed GEMMs whose weights are constants packed for the
stream (wide bands of two parts, narrow bands), each stage one 1-D bulk copy; as launches
and as resident requests.

Sizes are deliberately odd (partial tiles, leading dimensions padded to
MK_TENSOR_ALIGN_BYTES) and small (the sanitizer slows the kernel down by 10-100x).
Exit status: 0 when every output is within its error bound, 1 on a mismatch, 2 when the run
itself failed.

    python tools/sanitize_graph.py [--m 130 --k 72 --n 66] [--runs 2] [--timeout 120]
    python tools/sanitize_graph.py --builds   (no GPU: compile the builds the run asks for
                                               into the cache; tools/gpu_cache.py)
"""
from __future__ import annotations

import argparse
import math
import sys
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

import megak  # noqa: E402
from megak import abi  # noqa: E402
from megak.dtypes import numpy_dtype  # noqa: E402

BF16 = numpy_dtype("bfloat16")

U32 = 2.0 ** -24  # fp32 unit roundoff


BF16_U = 2.0 ** -8  # bf16 unit roundoff (outputs rounded to nearest even)
STREAM_M, BF16_K, BF16_N, TILE_M = 16, 200, 40, 40
# zs = silu((xs @ ws1) @ ws2 + bs2) in fp32: short tiles (16 rows), the first split over K
SHORT_X, SHORT_N, SHORT_N2 = (16, 300), 200, 70


def build(m: int, k: int, n: int) -> megak.Graph:
    g = megak.Graph()
    a = g.input("a", (m, k), "float32")
    b = g.input("b", (k, n), "float32")
    c = g.gemm(a, b)
    t = g.transpose(c)
    y = g.copy(t)
    g.output(y, "y")
    x = g.input("x", (STREAM_M, BF16_K), "bfloat16")
    w1 = g.input("w1", (BF16_K, BF16_N), "bfloat16")
    w2 = g.input("w2", (BF16_N, BF16_N), "bfloat16")
    h = g.gemm(x, w1, activation="relu")
    g.output(h, "h")
    g.output(g.gemm(h, w2), "z")
    p = g.input("p", (TILE_M, BF16_K), "bfloat16")
    g.output(g.gemm(p, w1), "q")
    r = g.input("r", ROWS, "bfloat16")
    n = ROWS[1]
    s = g.softmax(g.add(r, g.input("rv", (n,), "float32")), scale=0.5, causal=True)
    ln = g.layernorm(s, g.input("lw", (n,), "bfloat16"), g.input("lb", (n,), "float32"))
    g.output(g.rmsnorm(ln, g.input("rw", (n,), "bfloat16")), "norm")
    f = g.input("f", FLAGGED, "float32")
    f1 = g.copy(f)
    f3 = g.copy(g.add(f1, g.input("fb", (FLAGGED[1],), "float32")))
    g.output(g.add(f3, f1), "flagged")
    u = g.input("u", WG_U, "bfloat16")
    v = g.gemm(u, g.input("w3", (WG_U[1], WG_N), "bfloat16"),
               bias=g.input("bias3", (WG_N,), "float32"))
    g.output(v, "v")
    g.output(g.gemm(v, g.input("w4", (WG_N, WG_N2), "bfloat16"), activation="gelu",
                    residual=g.input("res4", (WG_U[0], WG_N2), "float32"),
                    out_dtype="float32"), "o")
    hs = g.gemm(g.input("xs", SHORT_X, "float32"), g.input("ws1", (SHORT_X[1], SHORT_N),
                                                          "float32"))
    g.output(g.gemm(hs, g.input("ws2", (SHORT_N, SHORT_N2), "float32"),
                    bias=g.input("bs2", (SHORT_N2,), "float32"), activation="silu"), "zs")
    return g


def wgmma_graph() -> megak.Graph:
    """e = t @ w5 + bias5 (bf16, from registers), d = e @ w6 (fp32): the second GEMM reads
    the first's output through TMA."""
    g = megak.Graph()
    e = g.gemm(g.input("t", WG2_T, "bfloat16"), g.input("w5", (WG2_T[1], WG2_N), "bfloat16"),
               bias=g.input("bias5", (WG2_N,), "bfloat16"))
    g.output(e, "e")
    g.output(g.gemm(e, g.input("w6", (WG2_N, WG2_N2), "bfloat16"), out_dtype="float32"), "d")
    return g


def split_graph() -> megak.Graph:
    """s = gelu(x5 @ w7 + bias7): one output tile, split over K into fp32 partials."""
    g = megak.Graph()
    g.output(g.gemm(g.input("x5", SPLIT_X, "bfloat16"),
                    g.input("w7", (SPLIT_X[1], SPLIT_N), "bfloat16"),
                    bias=g.input("bias7", (SPLIT_N,), "bfloat16"), activation="gelu"), "s")
    return g


ROWS = (37, 150)   # row-wise ops: odd rows and a width past one warp step (128 columns)
FLAGGED = (3, 21)  # the flagged chain: more elements than one warp, fewer than the 256 threads
WG_U, WG_N, WG_N2 = (200, 136), 200, 260   # the wgmma pair: 2 x 1 and 2 x 2 tiles, K tails,
#                                            K < 256 so neither splits over K
WG2_T, WG2_N, WG2_N2 = (300, 200), 520, 260    # wgmma_graph: 3 x 3 then 3 x 2 tiles, K tail
#                                                at A's end (520), on 2 SMs
SPLIT_X, SPLIT_N = (100, 1100), 120    # split_graph: one tile, K 1100 in parts on 8 SMs
RING_X, RING_N, RING_N2 = (40, 1500), 40, 72   # ring_graph: 12 boxes of 128 k-rows, then 1;
#                                                 40 rows: a row band of two m16 tiles (two
#                                                 warps read each stage) and one of one
RING_MORE = {"xs": ("zs", 20, "wr1"),   # wr1 again: two readers per stage, 2 parts combined
             "xt": ("zt", 8, "wr3")}    # a weight of its own: 2 narrow bands, one per SM
RING_SMS = 2


TILES_X, TILES_SMS = (260, 384), 2
TAKE_X = (3, 20000)   # rows of 80,000 B: 30 bands of 8 KiB across them (ops/copy.py)


def tiles_graph() -> megak.Graph:
    """tt = copy(x)^T, tx = x^T and ttt = tt^T = x (x: TILES_X fp32): six whole 128 x 128
    tiles and three at the edges each, on TILES_SMS SMs; cx = copy(xc) (TAKE_X: 30 bands,
    taken in turn by the warps of two takers)."""
    g = megak.Graph()
    g.output(g.copy(g.input("xc", TAKE_X, "float32")), "cx")
    x = g.input("x", TILES_X, "float32")
    tt = g.transpose(g.copy(x))
    g.output(tt, "tt")
    g.output(g.transpose(x), "tx")
    g.output(g.transpose(tt), "ttt")
    return g


def ring_graph() -> megak.Graph:
    """zr = relu(xr @ wr1) @ wr2, zs = xs @ wr1, zt = xt @ wr3, all streamed through the
    weight ring (on RING_SMS SMs)."""
    g = megak.Graph()
    w = {"wr1": g.input("wr1", (RING_X[1], RING_N), "bfloat16"),
         "wr3": g.input("wr3", (RING_X[1], RING_N), "bfloat16")}
    h = g.gemm(g.input("xr", RING_X, "bfloat16"), w["wr1"], activation="relu")
    g.output(g.gemm(h, g.input("wr2", (RING_N, RING_N2), "bfloat16")), "zr")
    for x, (z, rows, b) in RING_MORE.items():
        g.output(g.gemm(g.input(x, (rows, RING_X[1]), "bfloat16"), w[b]), z)
    return g


def const_graph(rng) -> tuple[megak.Graph, dict]:
    """zc = xc @ wc (20 rows: wide bands of two parts) and zn = xn @ wn (8 rows: narrow bands,
    the last stage without its second box), the weights constants packed for the stream
    (runtime/packed_weights.py: one 1-D bulk copy per stage), on RING_SMS SMs. Returns the
    graph and its weights."""
    k = RING_X[1]
    w = {name: (rng.uniform(-1, 1, (k, RING_N)) / np.sqrt(k)).astype(np.float32).astype(BF16)
         for name in ("wc", "wn")}
    g = megak.Graph()
    for x, z, rows, name in (("xc", "zc", 20, "wc"), ("xn", "zn", 8, "wn")):
        g.output(g.gemm(g.input(x, (rows, k), "bfloat16"), g.constant(name, w[name])), z)
    return g, w


def ring_inputs(rng, w_scale: tuple[float, float] | None = None) -> dict:
    """ring_graph's inputs, bf16 values: uniform in [-1, 1), the weights scaled by w_scale
    (default 1 / sqrt(K) and 1)."""
    s1, s2 = w_scale or (1 / np.sqrt(RING_X[1]), 1.0)
    w = {"xr": rng.uniform(-1, 1, RING_X),
         "wr1": rng.uniform(-1, 1, (RING_X[1], RING_N)) * s1,
         "wr3": rng.uniform(-1, 1, (RING_X[1], RING_N)) * s1,
         "wr2": rng.uniform(-1, 1, (RING_N, RING_N2)) * s2}
    w.update({x: rng.uniform(-1, 1, (rows, RING_X[1])) for x, (_, rows, _) in RING_MORE.items()})
    return {k: v.astype(np.float32).astype(BF16) for k, v in w.items()}


def check_ring(g, w: dict, out: dict, what: str) -> list[tuple[bool, str]]:
    """ring_graph's outputs against float64."""
    return [check_reference(g, w, out[z], z, f"{z} ({what})")
            for z in ("zr",) + tuple(z for z, _, _ in RING_MORE.values())]


def check_reference(g, inputs: dict, got, name: str, what: str) -> tuple[bool, str]:
    """Output `name` against float64 with each op's stated bound (tests/reference.py)."""
    from tests.reference import evaluate
    value, bound = evaluate(g, inputs)[g.outputs[name].index]
    got = np.asarray(got, dtype=np.float64)
    if got.shape != value.shape or not np.isfinite(got).all():
        return False, f"{name}: shape {got.shape} or non-finite values (unwritten output?)"
    err = np.abs(got - value)
    if (err > bound + 1e-30).any():
        i = int(np.argmax(err - bound))
        return False, f"{name}: error {err.flat[i]:.3e} exceeds bound {bound.flat[i]:.3e}"
    return True, f"{what}: max error {err.max():.3e}"


def check_bf16(got, a, b, what: str, relu: bool = False) -> tuple[bool, str]:
    """A bf16 GEMM output against float64 of its actual (bf16) inputs: the fp32 dot-product
    bound plus one bf16 rounding of the result."""
    a64, b64 = (np.asarray(v, dtype=np.float64) for v in (a, b))
    ref = a64 @ b64
    if relu:
        ref = np.maximum(ref, 0.0)
    bound = 2 * a64.shape[1] * U32 * (np.abs(a64) @ np.abs(b64)) + BF16_U * np.abs(ref)
    got = np.asarray(got, dtype=np.float64)
    if got.shape != ref.shape or not np.isfinite(got).all():
        return False, f"{what}: shape {got.shape} or non-finite values (unwritten output?)"
    err = np.abs(got - ref)
    if (err > bound + 1e-30).any():
        i = int(np.argmax(err - bound))
        return False, f"{what}: error {err.flat[i]:.3e} exceeds bound {bound.flat[i]:.3e}"
    return True, f"{what}: max error {err.max():.3e}"


def check(y: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    """y must be (a @ b).T within the fp32 dot-product bound 2 K u (|a| @ |b|) per element;
    transpose and copy are exact."""
    ref = (a.astype(np.float64) @ b.astype(np.float64)).T
    bound = 2 * a.shape[1] * U32 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))).T
    if y.shape != ref.shape or y.dtype != np.float32:
        return False, f"y is {y.shape} {y.dtype}, expected {ref.shape} float32"
    if not np.isfinite(y).all():
        bad = int(np.count_nonzero(~np.isfinite(y)))
        return False, f"{bad} non-finite values in y (unwritten output?)"
    err = np.abs(y.astype(np.float64) - ref)
    excess = err - bound
    worst = int(np.argmax(excess))
    if excess.flat[worst] > 1e-30:
        return False, (f"max error {err.flat[worst]:.3e} exceeds bound {bound.flat[worst]:.3e} "
                       f"at {tuple(int(i) for i in np.unravel_index(worst, y.shape))}")
    return True, f"max error {err.max():.3e} (bound at worst {bound.flat[worst]:.3e})"


def program_graphs(m: int, k: int, n: int, seed: int) -> list[tuple[megak.Graph, int | None]]:
    """The six programs main compiles, in order (prog .. prog6): (graph, the SMs it is
    compiled for: None for the device's)."""
    return [(build(m, k, n), None), (wgmma_graph(), 2), (split_graph(), 8),
            (ring_graph(), RING_SMS), (tiles_graph(), TILES_SMS),
            (const_graph(np.random.default_rng(seed + 6))[0], RING_SMS)]


RESIDENT_PROGRAMS = (0, 3, 4, 5)   # prog, prog4, prog5, prog6: one resident kernel serves them


def prebuild(args) -> int:
    """--builds: the builds the run asks for, compiled into the cache without a GPU: each
    program's (tools/ab_trees.py program_builds: its bodies, MK_WGMMA_ONLY where it runs
    there; "the device's" SMs taken as the H200's) and the resident kernel's build of
    RESIDENT_PROGRAMS' bodies."""
    from ab_trees import H200_SMS, compile_builds, program_builds   # tools/: a script's path

    from megak.runtime import executor, packed_weights
    builds, union = {}, 0
    for i, (graph, n_sm) in enumerate(program_graphs(args.m, args.k, args.n, args.seed)):
        plan = megak.compile(graph, backend="sim", n_sm=n_sm or H200_SMS).plan
        for what, defines in program_builds(plan, False, False).items():
            builds.setdefault(what, defines)
        if i in RESIDENT_PROGRAMS:
            union |= executor.program_bodies(
                plan.instrs, packed_weights.packed_forms(plan.instrs, plan.constant_values))
    builds[f"{union:#x} resident"] = executor.CudaExecutor._variant_defines(
        None, False, 0, union, True)
    compile_builds(builds, "sm_90a")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=130)
    p.add_argument("--k", type=int, default=72)
    p.add_argument("--n", type=int, default=66)
    p.add_argument("--runs", type=int, default=2, help="replays (epoch-offset waits)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="device spin deadline in s (generous: the sanitizer is slow)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--builds", action="store_true",
                   help="compile the builds the run asks for (no GPU), run nothing")
    args = p.parse_args(argv)
    if args.builds:
        return prebuild(args)

    rng = np.random.default_rng(args.seed)
    progs = [None] * 6
    try:
        graphs = program_graphs(args.m, args.k, args.n, args.seed)
        (g, _), (g2, _), (g3, _), (g4, _), (g5, _), (g6, _) = graphs
        for i, (graph, n_sm) in enumerate(graphs):
            progs[i] = megak.compile(graph, backend="cuda", n_sm=n_sm, timeout_s=args.timeout,
                                     debug=True)
        prog, prog2, prog3, prog4, prog5, prog6 = progs
        streamed = prog4.plan.instrs["flags"] & abi.FLAG_STREAM
        if prog4.plan.stream_pages == 0 or not streamed.all():
            raise RuntimeError(f"ring_graph streams no weights (ring of "
                               f"{prog4.plan.stream_pages} pages)")
        if not (prog5.plan.instrs["flags"] & abi.FLAG_COPY_TAKE).any():
            raise RuntimeError("tiles_graph's copy of xc has no takers")
        from megak.runtime import packed_weights
        if len(packed_weights.packed_forms(prog6.plan.instrs, prog6.plan.constant_values)) != 2:
            raise RuntimeError("const_graph's weights are not both packed")
    except Exception:
        traceback.print_exc()
        print("sanitize_graph: FAILED to compile", flush=True)
        return 2
    ok = True
    try:
        for pr in progs:
            ex = getattr(pr, "_executor", None)
            if ex is not None and hasattr(ex, "host_timeout_s"):
                ex.host_timeout_s = math.inf  # the sanitizer's pace is not a hang
        resident = None
        for run in range(2 * args.runs):
            if run == args.runs:   # the same runs again as requests of a resident kernel
                resident = megak.resident(*(progs[i] for i in RESIDENT_PROGRAMS),
                                          idle_s=math.inf)
            a = rng.uniform(-1, 1, (args.m, args.k)).astype(np.float32)
            b = rng.uniform(-1, 1, (args.k, args.n)).astype(np.float32)
            bf = {name: rng.uniform(-1, 1, shape).astype(np.float32).astype(BF16)
                  for name, shape in (("x", (STREAM_M, BF16_K)), ("w1", (BF16_K, BF16_N)),
                                      ("w2", (BF16_N, BF16_N)), ("p", (TILE_M, BF16_K)))}
            n = ROWS[1]
            rows = {"r": rng.uniform(-1, 1, ROWS).astype(np.float32).astype(BF16),
                    "rv": rng.uniform(-1, 1, n).astype(np.float32),
                    "lw": rng.uniform(0.5, 1.5, n).astype(np.float32).astype(BF16),
                    "lb": rng.uniform(-1, 1, n).astype(np.float32),
                    "rw": rng.uniform(0.5, 1.5, n).astype(np.float32).astype(BF16),
                    "f": rng.uniform(-1, 1, FLAGGED).astype(np.float32),
                    "fb": rng.uniform(-1, 1, FLAGGED[1]).astype(np.float32),
                    "u": rng.uniform(-1, 1, WG_U).astype(np.float32).astype(BF16),
                    "w3": rng.uniform(-1, 1, (WG_U[1], WG_N)).astype(np.float32).astype(BF16),
                    "bias3": rng.uniform(-1, 1, WG_N).astype(np.float32),
                    "w4": rng.uniform(-1, 1, (WG_N, WG_N2)).astype(np.float32).astype(BF16),
                    "res4": rng.uniform(-1, 1, (WG_U[0], WG_N2)).astype(np.float32),
                    "xs": rng.uniform(-1, 1, SHORT_X).astype(np.float32),
                    "ws1": rng.uniform(-1, 1, (SHORT_X[1], SHORT_N)).astype(np.float32),
                    "ws2": rng.uniform(-1, 1, (SHORT_N, SHORT_N2)).astype(np.float32),
                    "bs2": rng.uniform(-1, 1, SHORT_N2).astype(np.float32)}
            if resident is None:
                out = prog.run(a=a, b=b, **bf, **rows)
            else:
                out = resident.submit(prog, a=a, b=b, **bf, **rows).wait()
            results = [check(out["y"], a, b),
                       check_bf16(out["h"], bf["x"], bf["w1"], "h = relu(x @ w1)", relu=True),
                       check_bf16(out["z"], out["h"], bf["w2"], "z = h @ w2"),
                       check_bf16(out["q"], bf["p"], bf["w1"], "q = p @ w1"),
                       check_reference(g, {**rows, "a": a, "b": b, **bf}, out["norm"], "norm",
                                       "norm = rmsnorm(layernorm(softmax(r + rv)))"),
                       check_reference(g, {**rows, "a": a, "b": b, **bf}, out["flagged"],
                                       "flagged", "flagged = copy(copy(f) + fb) + copy(f)"),
                       check_reference(g, {**rows, "a": a, "b": b, **bf}, out["v"], "v",
                                       "v = u @ w3 + bias3 (wgmma)"),
                       check_reference(g, {**rows, "a": a, "b": b, **bf}, out["o"], "o",
                                       "o = gelu(v @ w4) + res4 (wgmma)"),
                       check_reference(g, {**rows, "a": a, "b": b, **bf}, out["zs"], "zs",
                                       "zs = silu((xs @ ws1) @ ws2 + bs2) (short fp32 tiles)")]
            if resident is None:
                w = {"t": rng.uniform(-1, 1, WG2_T),
                     "w5": rng.uniform(-1, 1, (WG2_T[1], WG2_N)),
                     "bias5": rng.uniform(-1, 1, WG2_N),
                     "w6": rng.uniform(-1, 1, (WG2_N, WG2_N2))}
                w = {k: v.astype(np.float32).astype(BF16) for k, v in w.items()}
                out2 = prog2.run(**w)
                variant = getattr(getattr(prog2, "_executor", None), "last_variant", None)
                results += [check_reference(g2, w, out2["e"], "e", f"e = t @ w5 + bias5 "
                                            f"(wgmma, kernel {variant})"),
                            check_reference(g2, w, out2["d"], "d", "d = e @ w6 (wgmma)")]
                if variant != "wgmma_only":
                    results.append((False, f"the wgmma pair ran on the {variant} kernel"))
                w = {"x5": rng.uniform(-1, 1, SPLIT_X),
                     "w7": rng.uniform(-1, 1, (SPLIT_X[1], SPLIT_N)),
                     "bias7": rng.uniform(-1, 1, SPLIT_N)}
                w = {k: v.astype(np.float32).astype(BF16) for k, v in w.items()}
                out3 = prog3.run(**w)
                variant = getattr(getattr(prog3, "_executor", None), "last_variant", None)
                results.append(check_reference(g3, w, out3["s"], "s", "s = gelu(x5 @ w7 + "
                                               f"bias7) (wgmma split-K, kernel {variant})"))
                if variant != "wgmma_only" or "reduce" not in prog3.stats[
                        "instructions_per_opcode"]:
                    results.append((False, f"the split GEMM ran on the {variant} kernel"))
            w = ring_inputs(rng)
            out4 = prog4.run(**w) if resident is None else resident.submit(prog4, **w).wait()
            results += check_ring(g4, w, out4, f"weight ring of {prog4.plan.stream_pages} "
                                               "pages")
            xs = {x: rng.uniform(-1, 1, t.shape).astype(np.float32).astype(BF16)
                  for x, t in g6.inputs.items()}
            out6 = prog6.run(**xs) if resident is None else resident.submit(prog6, **xs).wait()
            results += [check_reference(g6, xs, out6[z], z, f"{z} (packed constant weights)")
                        for z in g6.outputs]
            x = rng.uniform(-1, 1, TILES_X).astype(np.float32)
            xc = rng.uniform(-1, 1, TAKE_X).astype(np.float32)
            out5 = (prog5.run(x=x, xc=xc) if resident is None
                    else resident.submit(prog5, x=x, xc=xc).wait())
            for name, want, what in (("tt", x.T, "paged transposes"),
                                     ("tx", x.T, "paged transposes"),
                                     ("ttt", x, "paged transposes"), ("cx", xc, "taken copy")):
                same = np.array_equal(out5[name], want)
                results.append((same, f"{name} ({what}): "
                                      f"{'exact' if same else 'differs'}"))
            how = "resident request" if resident is not None else "run"
            for good, msg in results:
                print(f"sanitize_graph: {how} {run}: {'ok' if good else 'MISMATCH'}: {msg}",
                      flush=True)
                ok &= good
        if resident is not None:
            resident.close()
    except Exception:
        traceback.print_exc()
        print("sanitize_graph: FAILED while running", flush=True)
        return 2
    finally:
        for pr in progs:
            close = getattr(pr, "close", None)
            if close is not None:
                try:
                    close()  # free everything before exit: memcheck's leak check sees leaks
                except Exception:
                    traceback.print_exc()
                    ok = False
    print(f"sanitize_graph: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
