"""The benchmark workloads: what is computed, on what inputs, and how a result is judged correct.

Each GPU workload (`Workload`) gives

    build()                   -> megak.Graph (result: output "y"; W2 outputs every layer)
    make_inputs(rng)          -> {input name: fresh random float32 array}
    reference(inputs, rng)    -> a float64 reference (+ error bound), computed once, reused
                                 by every check of every variant
    check(ref, outputs, what) -> max |err| / bound (0.0 for exact ops); raises CheckError
    torch_case(...)      -> the same computation in torch (same shapes, fp32, TF32 off)
    work                 -> what the metric counts (ops, flops or bytes)

Error bounds. An fp32 dot product of length K, summed in any order, with or without FMA, is
within K * u * (|a| @ |b|) of the exact result (u = 2^-24, round to nearest); we allow twice
that: |err| <= 2 * K * 2^-24 * (|a| @ |b|) per GEMM. Along a chain x_{i+1} = x_i @ W_i the
errors add up: layer i's error is its own rounding plus the error it inherits, carried through
W_i. A bound carried from the inputs alone must multiply by |W_i| (row sums ~ sqrt(K) here) at
every layer and is vacuous after a few layers, so W2 declares every layer's result a graph
output (no extra device work: intermediates live in device memory anyway) and checks each GEMM
on its own, against float64 of the *computed* previous layer:

    |h_i - h_{i-1} @ W_i| <= 2 K u * (|h_{i-1}| @ |W_i|)         (h_{-1} = x, exact)

which is rigorous and tight for every layer, whatever the depth. Copies and transposes move
bits: they must be exact.

Large GEMMs are checked on a stratified sample (one random row in every 64, all columns; one
random column in every 64, all rows): every 128 x 128 output tile of every instruction is hit,
at a small fraction of a float64 8192^3 product.

Host workloads (`HostWorkload`, W6) time host code (lowering, NVRTC) and check its product.

Call-path workloads (W7, ``kind="call"``) are GPU workloads of the same shape (a W1 copy, the
W2-1024x16-bf16 chain, with their references and checks) that report.run_call_workload times
per call from Python, wall-clock: what one call of a small graph costs its caller.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

import megak
from megak.dtypes import UNIT_ROUNDOFF, numpy_dtype

U = 2.0 ** -24                 # unit roundoff of fp32
SAMPLE_EVERY = 64              # stratified sampling: one row (column) per this many
FULL_CHECK_MAX_MNK = 2 ** 33   # above this M*N*K, GEMM checks sample rows and columns
EXACT_BLOCK_ROWS = 512         # transpose checks compare this many output rows at a time

#: Workloads with targets that this suite does not measure yet (bf16).
#: They are listed as "not yet available" in RESULTS.md, never measured or faked. When bf16
#: GEMMs run on the device, add their builders below and remove them from here.
NOT_YET_AVAILABLE: dict[str, str] = {}


class CheckError(AssertionError):
    """A benchmark result disagrees with its float64 reference beyond the stated bound."""


def gemm_gamma(k: int) -> float:
    """Relative bound factor of one fp32 GEMM with inner dimension k (see module docstring)."""
    return 2.0 * k * U


# ---- checks ----------------------------------------------------------------------------------

def _check_array(got: np.ndarray, shape: tuple, what: str, dtype: str = "float32") -> None:
    if not isinstance(got, np.ndarray):
        raise CheckError(f"{what}: expected a numpy array, got {type(got).__name__}")
    if got.shape != tuple(shape) or got.dtype != numpy_dtype(dtype):
        raise CheckError(f"{what}: expected a {tuple(shape)} {dtype} array, "
                         f"got {got.shape} {got.dtype}")


def rounding_slack(dtype: str, ref: np.ndarray) -> np.ndarray | float:
    """What one rounding of the fp32 result to `dtype` may add (0 for fp32 itself)."""
    return 0.0 if dtype == "float32" else UNIT_ROUNDOFF[dtype] * np.abs(ref)


def check_bounded(got: np.ndarray, ref: np.ndarray, bound: np.ndarray, what: str) -> float:
    """|got - ref| <= bound everywhere (ref, bound float64). Returns max |err| / bound."""
    got64 = got.astype(np.float64)
    bad = ~np.isfinite(got64)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CheckError(f"{what}: {int(bad.sum())} non-finite values, first at {idx} "
                         f"(= {got64[idx]!r}; reference {ref[idx]:.6g})")
    err = np.abs(got64 - ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a zero bound (all products zero) leaves no room: any error is a failure
        ratio = np.where(bound > 0, err / np.where(bound > 0, bound, 1.0),
                         np.where(err > 0, np.inf, 0.0))
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    r = float(ratio[worst])
    if not r <= 1.0:
        raise CheckError(f"{what}: |err| = {err[worst]:.3g} at {tuple(map(int, worst))} exceeds "
                         f"the bound {bound[worst]:.3g} (got {got64[worst]:.9g}, float64 "
                         f"reference {ref[worst]:.9g}); {int((ratio > 1).sum())} elements "
                         f"out of bounds")
    return r


def check_exact(got: np.ndarray, expected: np.ndarray, what: str) -> float:
    """Bit-for-bit equality (the inputs hold no NaN, so == is exact)."""
    if not np.array_equal(got, expected):
        idx = tuple(int(i) for i in np.argwhere(got != expected)[0])
        raise CheckError(f"{what}: not exact: first difference at {idx}: got {got[idx]!r}, "
                         f"expected {expected[idx]!r}; "
                         f"{int((got != expected).sum())} elements differ")
    return 0.0


def check_transpose_exact(got: np.ndarray, x: np.ndarray, what: str) -> float:
    """got == x.T exactly, compared in row blocks: a transposed view of a 1 GiB array compared
    in one go walks memory with a 64 KiB stride and takes many seconds."""
    for r in range(0, got.shape[0], EXACT_BLOCK_ROWS):
        block = got[r:r + EXACT_BLOCK_ROWS]
        expected = x[:, r:r + EXACT_BLOCK_ROWS].T
        if not np.array_equal(block, expected):
            i, j = (int(v) for v in np.argwhere(block != expected)[0])
            raise CheckError(f"{what}: transpose not exact: out[{r + i}, {j}] = "
                             f"{block[i, j]!r}, expected x[{j}, {r + i}] = {expected[i, j]!r}")
    return 0.0


def stratified(n: int, every: int, rng: np.random.Generator) -> np.ndarray:
    """One random index in each run of `every` indices of range(n), plus the last index (the
    edge tile is where bounds checks go wrong)."""
    starts = np.arange(0, n, every)
    stops = np.minimum(starts + every, n)
    picks = rng.integers(starts, stops)
    return np.unique(np.append(picks, n - 1))


@dataclass
class GemmReference:
    """float64 reference of out = a @ b with its bound, full or on sampled rows/columns."""
    shape: tuple[int, int]
    rows: np.ndarray | None = None      # sampled row indices (None: full reference)
    cols: np.ndarray | None = None
    ref: np.ndarray | None = None       # full: (M, N); sampled: rows x N
    bound: np.ndarray | None = None
    ref_cols: np.ndarray | None = None  # sampled: M x cols
    bound_cols: np.ndarray | None = None
    dtype: str = "float32"              # the output's dtype

    def check(self, got: np.ndarray, what: str) -> float:
        _check_array(got, self.shape, what, self.dtype)
        slack = rounding_slack
        if self.rows is None:
            return check_bounded(got, self.ref, self.bound + slack(self.dtype, self.ref), what)
        r1 = check_bounded(got[self.rows], self.ref,
                           self.bound + slack(self.dtype, self.ref), f"{what} (sampled rows)")
        r2 = check_bounded(got[:, self.cols], self.ref_cols,
                           self.bound_cols + slack(self.dtype, self.ref_cols),
                           f"{what} (sampled columns)")
        return max(r1, r2)


def gemm_reference(a: np.ndarray, b: np.ndarray, rng: np.random.Generator,
                   full_max_mnk: int = FULL_CHECK_MAX_MNK,
                   dtype: str = "float32") -> GemmReference:
    m, k = a.shape
    n = b.shape[1]
    gamma = gemm_gamma(k)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    abs_a, abs_b = np.abs(a64), np.abs(b64)
    if m * n * k <= full_max_mnk:
        return GemmReference((m, n), ref=a64 @ b64, bound=gamma * (abs_a @ abs_b), dtype=dtype)
    rows = stratified(m, SAMPLE_EVERY, rng)
    cols = stratified(n, SAMPLE_EVERY, rng)
    return GemmReference(
        (m, n), rows=rows, cols=cols,
        ref=a64[rows] @ b64, bound=gamma * (abs_a[rows] @ abs_b),
        ref_cols=a64 @ b64[:, cols], bound_cols=gamma * (abs_a @ abs_b[:, cols]), dtype=dtype)


@dataclass
class ChainReference:
    """Per-layer check of h_i = h_{i-1} @ W_i (h_{-1} = x, the last h is "y"): float64
    weights (and their absolute values) converted once and reused by every check."""
    x: np.ndarray
    weights64: list[np.ndarray]
    abs_weights64: list[np.ndarray]
    names: list[str]                 # output name of each layer's result
    dtype: str = "float32"

    def check(self, outputs: dict, what: str) -> float:
        prev = self.x.astype(np.float64)
        worst = 0.0
        for i, (w64, aw64, name) in enumerate(zip(self.weights64, self.abs_weights64,
                                                   self.names)):
            got = outputs[name]
            _check_array(got, (prev.shape[0], w64.shape[1]), f"{what}, layer {i} ({name})",
                         self.dtype)
            ref = prev @ w64
            bound = gemm_gamma(w64.shape[0]) * (np.abs(prev) @ aw64) + \
                rounding_slack(self.dtype, ref)
            worst = max(worst, check_bounded(got, ref, bound, f"{what}, layer {i} ({name})"))
            prev = got.astype(np.float64)   # the next layer's input is what was computed
        return worst


def chain_reference(x: np.ndarray, weights: list[np.ndarray], names: list[str],
                    dtype: str = "float32") -> ChainReference:
    w64 = [w.astype(np.float64) for w in weights]
    return ChainReference(x, w64, [np.abs(w) for w in w64], list(names), dtype)


# ---- workloads -------------------------------------------------------------------------------

def _noop(*args) -> None:
    return None


@dataclass
class TorchCase:
    """The workload in torch: ``run()`` writes ``outputs`` (output name -> tensor; static
    buffers, so the same call can be captured in a CUDA graph); ``buffers`` are every tensor it
    writes (poisoned before timing)."""
    run: Callable[[], None]
    outputs: dict
    buffers: list


@dataclass
class Workload:
    name: str
    description: str
    metric: str                       # "us/op" | "us" | "TFLOP/s" | "GB/s"
    work: float                       # ops (us/op), flops (TFLOP/s), bytes (GB/s); 0 for "us"
    build: Callable[[], megak.Graph]
    make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    reference: Callable[[dict, np.random.Generator], Any]
    check: Callable[[Any, dict, str], float]
    torch_case: Callable[[dict, Any, Any], TorchCase]
    working_set_bytes: int
    reps: dict = field(default_factory=dict)   # variant -> (reps, warmup)
    plan_check: Callable[[Any], str] | None = None   # raises if the plan does not measure
    #                                                  what the workload claims; returns a note
    kind: str = "gpu"                 # "gpu" (run_gpu_workload) | "call" (run_call_workload)
    weight_bytes: int = 0             # bytes of weights one run must read (W2: every layer's
    #                                   B); > 0: each result reports weight bytes / median time
    build_constant: Callable[[dict], megak.Graph] | None = None
    #   the graph with its weights as constants (g.constant) from these inputs: the
    #   megak_const variant, run on the inputs that are left (constant_inputs)
    constant_inputs: tuple[str, ...] = ()


@dataclass
class HostWorkload:
    """Host-side work timed with perf_counter (variant "megak", metric "ms")."""
    name: str
    description: str
    setup: Callable[[], Any]                    # untimed, once
    prepare: Callable[[Any], Any]               # untimed, before every rep -> rep argument
    step: Callable[[Any, Any], Any]             # timed: step(state, prepared) -> product
    check: Callable[[Any, Any], str]            # check(state, product) -> note; raises
    cleanup: Callable[[Any, Any], None]         # untimed, after every rep
    teardown: Callable[[Any], None] = _noop     # untimed, once at the end
    reps: tuple[int, int] = (7, 1)
    metric: str = "ms"
    kind: str = "host"


# W1 -----------------------------------------------------------------------------------------

def instruction_sms(plan) -> np.ndarray:
    """SM (queue) of every instruction of `plan.instrs`, from plan.queue_start."""
    idx = np.arange(len(plan.instrs))
    # side="right": an empty queue shares its start with the next one; the last SM whose start
    # is <= idx is the queue that holds idx
    return np.searchsorted(plan.queue_start.astype(np.int64), idx, side="right") - 1


def check_chain_on_distinct_sms(plan) -> str:
    """W1 measures cross-SM hand-offs only if every op is one instruction and consecutive ops
    sit on different SMs. Raises CheckError otherwise; returns a note on the placement."""
    ops = plan.instrs["op_index"].astype(np.int64)
    n_ops = int(ops.max()) + 1 if len(ops) else 0
    if len(ops) != n_ops or len(np.unique(ops)) != n_ops:
        raise CheckError(f"W1: expected one instruction per op, got {len(ops)} instructions "
                         f"for {n_ops} ops")
    sm = np.empty(n_ops, dtype=np.int64)
    sm[ops] = instruction_sms(plan)
    same = np.nonzero(sm[1:] == sm[:-1])[0]
    if len(same):
        i = int(same[0])
        raise CheckError(f"W1: ops {i} and {i + 1} are both on SM {int(sm[i])}: the chain "
                         f"would not measure cross-SM dependencies ({len(same)} such pairs)")
    return f"{n_ops} ops on {len(np.unique(sm))} SMs, no two consecutive ops on one SM"


def w1(n_ops: int = 1000, cols: int = 32) -> Workload:
    def build():
        g = megak.Graph()
        y = g.input("x", (1, cols), "float32")
        for _ in range(n_ops):
            y = g.copy(y)
        g.output(y, "y")
        return g

    def make_inputs(rng):
        return {"x": rng.random((1, cols), dtype=np.float32) + np.float32(0.5)}

    def reference(inputs, rng):
        return inputs["x"]

    def check(ref, outputs, what):
        _check_array(outputs["y"], ref.shape, what)
        return check_exact(outputs["y"], ref, what)

    def torch_case(inputs, torch, device):
        x = torch.from_numpy(inputs["x"]).to(device)
        bufs = [torch.empty_like(x) for _ in range(n_ops)]

        def run():
            src = x
            for b in bufs:
                b.copy_(src)
                src = b
        return TorchCase(run, {"y": bufs[-1]}, bufs)

    name = "W1" if (n_ops, cols) == (1000, 32) else f"W1-{n_ops}x{cols}"
    return Workload(
        name=name,
        description=f"a dependent chain of {n_ops:,} copies of a (1, {cols}) fp32 tensor, "
                    f"each op one instruction on a different SM than the op before it: the "
                    f"cost of one cross-SM dependent step",
        metric="us/op", work=float(n_ops), build=build, make_inputs=make_inputs,
        reference=reference, check=check, torch_case=torch_case,
        working_set_bytes=(n_ops + 1) * cols * 4,
        reps={"megak": (200, 20), "separate": (20, 3), "graph": (100, 10),
              "graph_pdl": (100, 10), "torch": (20, 3), "torch_graph": (100, 10)},
        plan_check=check_chain_on_distinct_sms)


def _as_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    return a if dtype == "float32" else a.astype(numpy_dtype(dtype))


def _to_torch(a: np.ndarray, torch, device):
    """numpy (fp32 or ml_dtypes bf16) -> torch on device, bit for bit."""
    if a.dtype == numpy_dtype("bfloat16"):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(a).to(device)


_SHORT = {"float32": "fp32", "bfloat16": "bf16"}


# W2 -----------------------------------------------------------------------------------------

def w2(hidden: int, layers: int, batch: int = 16, dtype: str = "float32") -> Workload:
    # every layer's result is an output (see the module docstring): h0 .. h{L-2}, then y
    names = [f"h{i}" for i in range(layers - 1)] + ["y"]

    def build(weights=None):
        g = megak.Graph()
        x = g.input("x", (batch, hidden), dtype)
        for i in range(layers):
            w = (g.input(f"w{i}", (hidden, hidden), dtype) if weights is None
                 else g.constant(f"w{i}", weights[f"w{i}"]))
            x = g.gemm(x, w)
            g.output(x, names[i])
        return g

    def make_inputs(rng):
        # scaled by 1/sqrt(hidden) so activations stay O(1) through the layers
        scale = np.float32(1.0 / np.sqrt(hidden))
        inputs = {"x": _as_dtype(rng.standard_normal((batch, hidden), dtype=np.float32), dtype)}
        for i in range(layers):
            inputs[f"w{i}"] = _as_dtype(
                rng.standard_normal((hidden, hidden), dtype=np.float32) * scale, dtype)
        return inputs

    def reference(inputs, rng):
        return chain_reference(inputs["x"], [inputs[f"w{i}"] for i in range(layers)], names,
                               dtype)

    def check(ref, outputs, what):
        return ref.check(outputs, what)

    def torch_case(inputs, torch, device):
        x = _to_torch(inputs["x"], torch, device)
        ws = [_to_torch(inputs[f"w{i}"], torch, device) for i in range(layers)]
        bufs = [torch.empty((batch, hidden), dtype=getattr(torch, dtype), device=device)
                for _ in range(layers)]

        def run():
            src = x
            for w, b in zip(ws, bufs):
                torch.mm(src, w, out=b)
                src = b
        return TorchCase(run, dict(zip(names, bufs)), bufs)

    flops = 2.0 * batch * hidden * hidden * layers
    size = 4 if dtype == "float32" else 2
    weight_bytes = layers * hidden * hidden * size
    big = weight_bytes > (256 << 20)
    return Workload(
        name=f"W2-{hidden}x{layers}-{_SHORT[dtype]}" + (f"-b{batch}" if batch != 16 else ""),
        description=f"MLP-like GEMM chain, {dtype}: x ({batch}, {hidden}), then x = x @ W_i "
                    f"for {layers} layers, each with its own ({hidden}, {hidden}) weight input "
                    f"(every layer's result an output, to check each GEMM) "
                    f"({flops / 1e9:.2f} GFLOP, "
                    f"{weight_bytes / 2**20:.0f} MiB of weights)",
        metric="us", work=0.0, build=build, make_inputs=make_inputs, reference=reference,
        check=check, torch_case=torch_case,
        working_set_bytes=batch * hidden * (layers + 1) * size + weight_bytes,
        reps={v: ((100, 10) if big else (200, 20))
              for v in ("megak", "separate", "graph", "graph_pdl", "torch", "torch_graph")},
        weight_bytes=weight_bytes,
        build_constant=build if dtype == "bfloat16" else None,
        constant_inputs=("x",) if dtype == "bfloat16" else ())


# W3 -----------------------------------------------------------------------------------------

def w3(n: int, full_max_mnk: int = FULL_CHECK_MAX_MNK, dtype: str = "float32",
       m: int | None = None, k: int | None = None) -> Workload:
    """One GEMM (m x k) @ (k x n); m and k default to n (a cube, named W3-<n>-<dtype>), else
    named W3-<m>x<n>x<k>-<dtype>."""
    m = n if m is None else m
    k = n if k is None else k

    def build():
        g = megak.Graph()
        g.output(g.gemm(g.input("a", (m, k), dtype), g.input("b", (k, n), dtype)), "y")
        return g

    def make_inputs(rng):
        return {"a": _as_dtype(rng.standard_normal((m, k), dtype=np.float32), dtype),
                "b": _as_dtype(rng.standard_normal((k, n), dtype=np.float32), dtype)}

    def reference(inputs, rng):
        return gemm_reference(inputs["a"], inputs["b"], rng, full_max_mnk, dtype)

    def check(ref, outputs, what):
        return ref.check(outputs["y"], what)

    def torch_case(inputs, torch, device):
        a = _to_torch(inputs["a"], torch, device)
        b = _to_torch(inputs["b"], torch, device)
        c = torch.empty((m, n), dtype=getattr(torch, dtype), device=device)

        def run():
            torch.mm(a, b, out=c)
        return TorchCase(run, {"y": c}, [c])

    cube = m == n == k
    flops = 2.0 * m * n * k
    # ~40 ms per 8192^3 fp32 run inside the megakernel: few reps there
    reps = (10, 2) if flops >= 2.0 * 8192 ** 3 else (20, 3)
    shape = f"M = N = K = {n}" if cube else f"M = {m}, N = {n}, K = {k}"
    return Workload(
        name=f"W3-{n if cube else f'{m}x{n}x{k}'}-{_SHORT[dtype]}",
        description=f"one {dtype} GEMM, {shape} ({flops / 1e12:.2f} TFLOP); "
                    + ("torch with TF32 off" if dtype == "float32" else
                       "fp32 accumulation, bf16 output; torch = cuBLAS bf16"),
        metric="TFLOP/s", work=flops, build=build, make_inputs=make_inputs,
        reference=reference, check=check, torch_case=torch_case,
        working_set_bytes=(m * k + k * n + m * n) * (4 if dtype == "float32" else 2),
        reps={v: reps for v in ("megak", "separate", "graph", "graph_pdl", "torch",
                                "torch_graph")})


# W4, W5 -------------------------------------------------------------------------------------

def w4(n: int) -> Workload:
    def build():
        g = megak.Graph()
        g.output(g.transpose(g.input("x", (n, n), "float32")), "y")
        return g

    def make_inputs(rng):
        return {"x": rng.random((n, n), dtype=np.float32)}

    def reference(inputs, rng):
        return inputs["x"]

    def check(x, outputs, what):
        _check_array(outputs["y"], (n, n), what)
        return check_transpose_exact(outputs["y"], x, what)

    def torch_case(inputs, torch, device):
        x = torch.from_numpy(inputs["x"]).to(device)
        out = torch.empty((n, n), dtype=torch.float32, device=device)

        def run():
            out.copy_(x.t())
        return TorchCase(run, {"y": out}, [out])

    return Workload(
        name=f"W4-{n}-fp32",
        description=f"transpose of a {n} x {n} fp32 matrix ({n * n * 4 / 2**30:.2f} GiB); "
                    f"GB/s counts bytes read + written",
        metric="GB/s", work=2.0 * n * n * 4, build=build, make_inputs=make_inputs,
        reference=reference, check=check, torch_case=torch_case,
        working_set_bytes=2 * n * n * 4,
        reps={v: (30, 3) for v in ("megak", "separate", "graph", "graph_pdl", "torch",
                                   "torch_graph")})


def w5(rows: int = 16384, cols: int = 16384) -> Workload:
    nbytes = rows * cols * 4

    def build():
        g = megak.Graph()
        g.output(g.copy(g.input("x", (rows, cols), "float32")), "y")
        return g

    def make_inputs(rng):
        return {"x": rng.random((rows, cols), dtype=np.float32)}

    def reference(inputs, rng):
        return inputs["x"]

    def check(x, outputs, what):
        _check_array(outputs["y"], (rows, cols), what)
        return check_exact(outputs["y"], x, what)

    def torch_case(inputs, torch, device):
        x = torch.from_numpy(inputs["x"]).to(device)
        out = torch.empty_like(x)

        def run():
            out.copy_(x)
        return TorchCase(run, {"y": out}, [out])

    name = "W5-1GiB" if nbytes == 1 << 30 else f"W5-{rows}x{cols}"
    return Workload(
        name=name,
        description=f"copy of a {rows} x {cols} fp32 tensor ({nbytes / 2**30:.2f} GiB); "
                    f"GB/s counts bytes read + written",
        metric="GB/s", work=2.0 * nbytes, build=build, make_inputs=make_inputs,
        reference=reference, check=check, torch_case=torch_case,
        working_set_bytes=2 * nbytes,
        reps={v: (30, 3) for v in ("megak", "separate", "graph", "graph_pdl", "torch",
                                   "torch_graph")})


# W6 (host) ----------------------------------------------------------------------------------

def w6_lower() -> HostWorkload:
    from megak import abi

    from .test_host import graph_100k, lower_schedule_encode

    def check(g, product):
        plan, data = product
        n = len(plan.instrs)
        if n != 100_352 or len(data) != n * abi.INSTR_BYTES:
            raise CheckError(f"W6-lower-100k: {n} instructions, {len(data)} bytes; expected "
                             f"100,352 and {100_352 * abi.INSTR_BYTES:,}")
        if not np.array_equal(abi.decode(data), plan.instrs):
            raise CheckError("W6-lower-100k: the encoded bytes do not decode to plan.instrs")
        return f"{n:,} instructions, {len(data) / 2**20:.1f} MiB encoded, deadlock check passed"

    return HostWorkload(
        name="W6-lower-100k",
        description="host: lowering + scheduling (132 SMs, deadlock check) + encoding of 98 "
                    "chained 4096^2 GEMMs = 100,352 tile instructions (benchmarks/test_host.py)",
        setup=graph_100k, prepare=_noop,
        step=lambda g, _: lower_schedule_encode(g), check=check, cleanup=_noop, reps=(7, 1))


def _arch() -> str:
    from megak.runtime.compiler import DEFAULT_ARCH
    from megak.runtime.driver import device_info, gpu_usable
    return device_info()["arch"] if gpu_usable() else DEFAULT_ARCH


@dataclass
class ChildCompile:
    """What a cold compile in a fresh process reported about itself."""
    elapsed_s: float
    from_cache: bool
    cubin_bytes: int
    spill_bytes: int


_CHILD_COMPILE = """
import json, sys, time
from megak.runtime.compiler import compile_megakernel
t = time.perf_counter()
k = compile_megakernel(arch=sys.argv[1], cache_dir=sys.argv[2])
dt = time.perf_counter() - t
print(json.dumps({"elapsed_s": dt, "from_cache": k.from_cache, "cubin_bytes": len(k.cubin),
                  "spill_bytes": k.spill_bytes}))
"""


def _compile_in_child(arch: str, cache_dir: str) -> ChildCompile:
    # a fresh process: NVRTC (seen with NVRTC 13.0) answers a repeated compile in the same
    # process ~8x faster than the first, which is not what a user's first compile costs
    import json
    import os
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _CHILD_COMPILE, arch, cache_dir],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    if out.returncode != 0:
        raise CheckError(f"cold compile in a child process failed: {out.stderr[-2000:]}")
    return ChildCompile(**json.loads(out.stdout.strip().splitlines()[-1]))


def w6_compile_cold() -> HostWorkload:
    def check(arch, ck):
        if ck.from_cache or not ck.cubin_bytes:
            raise CheckError(f"W6-compile-cold: from_cache={ck.from_cache}, "
                             f"{ck.cubin_bytes} B cubin: not a cold compile")
        return (f"{arch}: {ck.cubin_bytes:,} B cubin, {ck.spill_bytes} B spilled (ptxas); "
                f"each compile in a fresh process, timed inside it")

    return HostWorkload(
        name="W6-compile-cold",
        description="host: NVRTC compile of the megakernel to a cubin into an empty cache "
                    "directory, in a fresh process each time (timed inside that process)",
        setup=_arch,
        prepare=lambda arch: tempfile.mkdtemp(prefix="megak-bench-cold-"),
        step=_compile_in_child,
        check=check,
        cleanup=lambda arch, tmp: shutil.rmtree(tmp, ignore_errors=True),
        reps=(3, 0))


def w6_compile_cached() -> HostWorkload:
    from megak.runtime.compiler import compile_megakernel

    class State:
        def __init__(self):
            self.arch = _arch()
            self.dir = tempfile.mkdtemp(prefix="megak-bench-cached-")
            self.cold = compile_megakernel(arch=self.arch, cache_dir=self.dir)  # untimed

    def check(st, ck):
        if not ck.from_cache or ck.cubin != st.cold.cubin or ck.cache_key != st.cold.cache_key:
            raise CheckError(f"W6-compile-cached: from_cache={ck.from_cache}, same cubin: "
                             f"{ck.cubin == st.cold.cubin}: not a cache hit of the cold compile")
        return f"cache hit, {len(ck.cubin):,} B cubin"

    return HostWorkload(
        name="W6-compile-cached",
        description="host: compile_megakernel again with the same cache directory: source "
                    "assembly, cache key (sha256) and cubin read from disk",
        setup=State, prepare=_noop, step=lambda st, _: compile_megakernel(
            arch=st.arch, cache_dir=st.dir),
        check=check, cleanup=_noop,
        teardown=lambda st: shutil.rmtree(st.dir, ignore_errors=True), reps=(20, 2))


# W7 (call path) -----------------------------------------------------------------------------

#: launches the megak_launch variant enqueues back to back before its one wait (its figure is
#: the batch's wall time / LAUNCH_BATCH)
LAUNCH_BATCH = 1000

#: the call-path variants, in table order (report.run_call_workload)
CALL_VARIANTS = ("megak_run", "megak_bound", "megak_launch", "megak_resident",
                 "megak_resident_bound", "torch", "torch_graph")

# (timed reps, warm-up) per variant; megak_launch counts batches of LAUNCH_BATCH launches
_CALL_REPS = {"megak_run": (1000, 100), "megak_bound": (1000, 100), "megak_launch": (20, 2),
              "megak_resident": (1000, 100), "megak_resident_bound": (1000, 100),
              "torch": (1000, 100), "torch_graph": (1000, 100)}

_CALL_HOW = ("torch tensors on the GPU in, out= for every output the graph declares; "
             "wall-clock per call from Python (perf_counter_ns), no L2 flush")


def _call_workload(base: Workload, name: str, description: str) -> Workload:
    """`base`'s graph, inputs, reference, check and torch calls, timed per call (kind "call").
    The metric is a time per call whatever base counted; its plan check is about the device
    schedule, which the call path does not measure."""
    # no weight bandwidth: without an L2 flush the weights of a small chain are read from L2
    return dataclasses.replace(base, name=name, description=description, metric="us",
                               work=0.0, reps=dict(_CALL_REPS), plan_check=None, kind="call",
                               weight_bytes=0)


def w7_call_copy(cols: int = 32) -> Workload:
    name = "W7-call-copy" if cols == 32 else f"W7-call-copy-{cols}"
    return _call_workload(
        w1(n_ops=1, cols=cols), name,
        f"call path: one copy of a (1, {cols}) fp32 tensor (g.copy(x)), {_CALL_HOW}: what "
        f"a call costs when the GPU has next to nothing to do")


def w7_call_mlp(hidden: int = 1024, layers: int = 16, batch: int = 16) -> Workload:
    name = ("W7-call-mlp1024" if (hidden, layers, batch) == (1024, 16, 16)
            else f"W7-call-mlp{hidden}x{layers}")
    return _call_workload(
        w2(hidden, layers, batch, dtype="bfloat16"), name,
        f"call path: the W2-{hidden}x{layers}-bf16 chain (x ({batch}, {hidden}) bf16, "
        f"x = x @ W_i for {layers} layers, every layer's result an output, checked layer by "
        f"layer), {_CALL_HOW}")


# ---- registry --------------------------------------------------------------------------------

#: every workload of a full report, in run order (names as in TARGETS and the issues)
FACTORIES: dict[str, Callable[[], Workload | HostWorkload]] = {
    "W1": w1,
    "W2-1024x16-fp32": lambda: w2(1024, 16),
    "W2-4096x8-fp32": lambda: w2(4096, 8),
    "W3-4096-fp32": lambda: w3(4096),
    "W3-8192-fp32": lambda: w3(8192),
    "W2-1024x16-bf16": lambda: w2(1024, 16, dtype="bfloat16"),
    "W2-4096x8-bf16": lambda: w2(4096, 8, dtype="bfloat16"),
    "W2-4096x8-bf16-b1": lambda: w2(4096, 8, batch=1, dtype="bfloat16"),
    "W2-4096x8-bf16-b64": lambda: w2(4096, 8, batch=64, dtype="bfloat16"),
    "W2-8192x8-bf16": lambda: w2(8192, 8, dtype="bfloat16"),
    "W3-4096-bf16": lambda: w3(4096, dtype="bfloat16"),
    "W3-512x4096x4096-bf16": lambda: w3(4096, dtype="bfloat16", m=512),
    "W3-8192-bf16": lambda: w3(8192, dtype="bfloat16"),
    "W4-16384-fp32": lambda: w4(16384),
    "W5-1GiB": w5,
    "W6-lower-100k": w6_lower,
    "W6-compile-cold": w6_compile_cold,
    "W6-compile-cached": w6_compile_cached,
    "W7-call-copy": w7_call_copy,
    "W7-call-mlp1024": w7_call_mlp,
}

#: the smaller workloads a --quick smoke run measures
QUICK = ("W1", "W2-1024x16-fp32", "W3-4096-fp32", "W6-lower-100k", "W6-compile-cached",
         "W7-call-copy")

VARIANTS = ("megak", "megak_trace", "megak_const", "megak_run", "megak_bound", "megak_launch",
            "megak_resident", "megak_resident_bound", "separate", "graph", "graph_pdl", "torch",
            "torch_graph")

VARIANT_DESCRIPTIONS = {
    "megak": "the whole graph in one persistent megakernel launch (Bench.time_megakernel)",
    "megak_const": "the same megakernel with the weights declared constants (g.constant): "
                   "megak holds them, a streamed B also in a packed copy, each column band "
                   "one run of k-rows (README \"Constant weights\"); only x is an input "
                   "(Bench.time_megakernel)",
    "megak_run": "call path (W7): prog.run(out=..., **tensors) per call, launch + wait, "
                 "wall-clock from Python; the figure the W7 rows compare with",
    "megak_bound": "call path (W7): the same call bound once (bound = prog.bind(out=..., "
                   "**tensors)), bound.run() per call, launch + wait, wall-clock",
    "megak_launch": f"call path (W7): {LAUNCH_BATCH:,} prog.launch(...) back to back, one "
                    f"wait() on the last; batch wall-clock / {LAUNCH_BATCH:,} per call",
    "megak_resident": "call path (W7): the program served by megak.resident(prog): "
                      "r.submit(prog, out=..., **tensors).wait() per call, wall-clock; one "
                      "kernel launch for all calls",
    "megak_resident_bound": "call path (W7): the same resident kernel fed the bound call: "
                            "r.submit(bound).wait() per call, wall-clock",
    "separate": "one kernel launch per graph op, same device op code (entry megak_op), "
                "stream order as the dependency (Bench.time_separate); a chain that "
                "streams its weights in the megakernel is lowered as tiles here "
                "(compile(weight_stream=False): the stream's loop without its ring runs "
                "1.3-2.9x slower)",
    "graph": "the separate launches captured once in a CUDA graph and replayed "
             "(Bench.time_separate(graph=True))",
    "graph_pdl": "the same CUDA graph with programmatic dependent launch: each launch right "
                 "after the previous op's launch (not one behind a combine-counter memset) "
                 "starts while that op runs and waits in griddepcontrol.wait until it has "
                 "completed (Bench.time_separate(graph=True, pdl=True))",
    "torch": "torch eager (cuBLAS for GEMMs, TF32 off), into preallocated outputs (W7: + "
             "torch.cuda.synchronize() per call, wall-clock)",
    "torch_graph": "the same torch calls captured in a torch.cuda.CUDAGraph and replayed (W7: "
                   "replay() + torch.cuda.synchronize() per call, wall-clock)",
}


def get(name: str) -> Workload | HostWorkload:
    try:
        return FACTORIES[name]()
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(FACTORIES)}") from None
