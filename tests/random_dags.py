"""Seeded random graphs of mixed ops with odd shapes, shared by the CPU and GPU tiers."""
from __future__ import annotations

import numpy as np

import megak
from megak.dtypes import numpy_dtype

DIMS = [1, 3, 7, 33, 64, 65, 129, 200, 300]


def random_graph(seed: int) -> megak.Graph:
    rng = np.random.default_rng(seed)
    g = megak.Graph()
    pool = []
    n_inputs = 0

    def new_input(rows, cols):
        nonlocal n_inputs
        t = g.input(f"in{n_inputs}", (int(rows), int(cols)), "float32")
        n_inputs += 1
        pool.append(t)
        return t

    def new_vector(n):
        nonlocal n_inputs
        t = g.input(f"in{n_inputs}", (int(n),), "float32")
        n_inputs += 1
        return t

    new_input(rng.choice(DIMS), rng.choice(DIMS))
    for _ in range(int(rng.integers(2, 9))):
        kind = rng.choice(["gemm", "gemm", "transpose", "copy", "add", "softmax", "layernorm",
                           "rmsnorm"])
        x = pool[int(rng.integers(len(pool)))]
        if kind == "gemm":
            partners = [t for t in pool if t.rows == x.cols]
            if partners and rng.random() < 0.6:
                b = partners[int(rng.integers(len(partners)))]
            else:
                b = new_input(x.cols, rng.choice(DIMS))
            pool.append(g.gemm(x, b))
        elif kind == "transpose":
            pool.append(g.transpose(x))
        elif kind == "copy":
            pool.append(g.copy(x))
        elif kind == "add":
            same = [t for t in pool if t.shape == x.shape and t is not x]
            if same and rng.random() < 0.6:
                b = same[int(rng.integers(len(same)))]
            elif rng.random() < 0.5:
                b = new_vector(x.cols)          # broadcast over rows
            else:
                b = new_input(x.rows, x.cols)
            pool.append(g.add(x, b))
        elif kind == "softmax":
            pool.append(g.softmax(x, scale=float(rng.choice([1.0, 0.125, 3.0])),
                                  causal=bool(rng.random() < 0.5)))
        elif kind == "layernorm":
            pool.append(g.layernorm(x, new_vector(x.cols), new_vector(x.cols)))
        else:
            pool.append(g.rmsnorm(x, new_vector(x.cols)))
    return _with_outputs(g, pool, rng)


# bf16 graphs: shapes around the GEMM paths' edges (<= 64 rows with weights as inputs: the
# weight stream; more rows or a produced B: wgmma tiles; K and N off the 64/128 boxes)
ROWS_BF16 = [1, 2, 16, 17, 33, 64, 65, 130]
COLS_BF16 = [8, 64, 100, 128, 200, 256, 300]
_ACTIVATIONS = [None, None, "relu", "gelu", "silu"]


def random_bf16_graph(seed: int) -> megak.Graph:
    """Mixed bf16 / fp32 graphs: bf16 GEMMs with random epilogues (bias, activation,
    residual, bf16 or fp32 out) on weight inputs or produced operands, and the row-wise ops
    that take bf16 (add, softmax, layernorm, rmsnorm) on either dtype."""
    rng = np.random.default_rng(seed)
    g = megak.Graph()
    pool = []

    def new_input(shape, dtype):
        return g.input(f"in{len(g.inputs)}", tuple(int(d) for d in shape), dtype)

    def either():
        return "bfloat16" if rng.random() < 0.6 else "float32"

    pool.append(new_input((rng.choice(ROWS_BF16), rng.choice(COLS_BF16)), "bfloat16"))
    for _ in range(int(rng.integers(2, 8))):
        kind = rng.choice(["gemm", "gemm", "gemm", "add", "softmax", "layernorm", "rmsnorm"])
        x = pool[int(rng.integers(len(pool)))]
        if kind == "gemm":
            if x.dtype != "bfloat16":
                x = pool[0]
            partners = [t for t in pool if t.rows == x.cols and t.dtype == "bfloat16"]
            if partners and rng.random() < 0.3:
                b = partners[int(rng.integers(len(partners)))]
            else:
                b = new_input((x.cols, rng.choice(COLS_BF16)), "bfloat16")
            n = b.cols
            kw = {"activation": _ACTIVATIONS[int(rng.integers(len(_ACTIVATIONS)))]}
            if rng.random() < 0.4:
                kw["bias"] = new_input((n,), either())
            if rng.random() < 0.3:
                kw["residual"] = new_input((x.rows, n), either())
            if rng.random() < 0.3:
                kw["out_dtype"] = either()
            pool.append(g.gemm(x, b, **kw))
        elif kind == "add":
            other = new_input((x.cols,) if rng.random() < 0.5 else x.shape, either())
            pool.append(g.add(x, other))
        elif kind == "softmax":
            pool.append(g.softmax(x, scale=float(rng.choice([1.0, 0.125])),
                                  causal=bool(rng.random() < 0.5)))
        elif kind == "layernorm":
            pool.append(g.layernorm(x, new_input((x.cols,), either()),
                                    new_input((x.cols,), either())))
        else:
            pool.append(g.rmsnorm(x, new_input((x.cols,), either())))
    return _with_outputs(g, pool, rng)


def random_fused_graph(seed: int) -> megak.Graph:
    """Graphs where adds fold into GEMM epilogues whose other operand is produced after the
    GEMM (x@w1 + x@w2, LoRA's x@w + (x@a)@b, gemm + copy(v), chains of such sums), in fp32 or
    bf16: the fused unit must wait for that later producer without breaking queue order."""
    rng = np.random.default_rng(seed)
    dtype = "bfloat16" if rng.random() < 0.4 else "float32"
    dims = ROWS_BF16 if dtype == "bfloat16" else DIMS
    cols = COLS_BF16 if dtype == "bfloat16" else DIMS
    g = megak.Graph()

    def new_input(shape, dtype=dtype):
        return g.input(f"in{len(g.inputs)}", tuple(int(d) for d in shape), dtype)

    x = new_input((rng.choice(dims), rng.choice(cols)))
    pool = [x]
    for _ in range(int(rng.integers(1, 5))):
        same = [t for t in pool if t.dtype == dtype]  # (an fp32 b first makes an fp32 sum)
        x = same[int(rng.integers(len(same)))]
        n = int(rng.choice(cols))
        h = g.gemm(x, new_input((x.cols, n)))          # read once: the add folds into it
        other = rng.choice(["gemm", "lora", "copy", "transpose", "sum"])
        if other == "gemm":
            b = g.gemm(x, new_input((x.cols, n)))
        elif other == "lora":
            r = int(rng.choice([1, 8, 16]))
            b = g.gemm(g.gemm(x, new_input((x.cols, r))), new_input((r, n)))
        elif other == "copy":
            b = g.copy(new_input((x.rows, n), "float32"))   # copy and transpose: fp32 only
        elif other == "transpose":
            b = g.transpose(new_input((n, x.rows), "float32"))
        else:                                           # the sum of two products, then more
            b = g.add(g.gemm(x, new_input((x.cols, n))), g.gemm(x, new_input((x.cols, n))))
        if rng.random() < 0.3:
            pool.append(g.add(b, h))                    # the GEMM as the add's second operand
        else:
            pool.append(g.add(h, b))
    return _with_outputs(g, pool, rng)


STREAM_DIMS = [64, 100, 128, 200, 520, 1024]


def _operands(g: megak.Graph, seed: int, rng, constants: float):
    """new(shape, dtype, weight=True): a new graph input, or, for a weight, bias or residual
    (`weight`) with probability `constants`, a constant of uniform(-1, 1) values (drawn from
    a generator of its own, so a graph without constants draws as before)."""
    values = np.random.default_rng([seed, 1])

    def new(shape, dtype, weight=True):
        shape = tuple(int(d) for d in shape)
        if weight and constants and rng.random() < constants:
            value = values.uniform(-1.0, 1.0, shape).astype(np.float32)
            return g.constant(f"c{len(g.constants)}", value.astype(numpy_dtype(dtype)))
        return g.input(f"in{len(g.inputs)}", shape, dtype)
    return new


def _layer_epilogue(rng, operand, m: int, n: int, dtype: str, bias_dtype) -> dict:
    """A random layer's epilogue keywords: an activation (or none), a bias (of `bias_dtype()`)
    with probability 0.3, a residual (of `dtype`) with probability 0.2."""
    kw = {"activation": _ACTIVATIONS[int(rng.integers(len(_ACTIVATIONS)))]}
    if rng.random() < 0.3:
        kw["bias"] = operand((n,), bias_dtype())
    if rng.random() < 0.2:
        kw["residual"] = operand((m, n), dtype)
    return kw


def random_stream_graph(seed: int, constants: float = 0.0) -> megak.Graph:
    """Layer chains at batch 1 to 64 on bf16 weights (the weight stream: its ring runs across
    instruction boundaries where an SM has several layers' bands), with random epilogues
    (bias, activation, residual; an fp32 output ends the chain, as the next layer's A must be
    bf16), K and N off the 64 / 128 boxes, sometimes a bias added between layers. Each
    weight, bias and residual a constant with probability `constants`."""
    rng = np.random.default_rng(seed)
    g = megak.Graph()
    operand = _operands(g, seed, rng, constants)
    m = int(rng.choice([1, 2, 7, 16, 33, 64]))
    h = operand((m, rng.choice(STREAM_DIMS)), "bfloat16", weight=False)
    pool = [h]
    for _ in range(int(rng.integers(2, 6))):
        n = int(rng.choice(STREAM_DIMS))
        kw = _layer_epilogue(rng, operand, m, n, "bfloat16",
                             lambda: "bfloat16" if rng.random() < 0.5 else "float32")
        last = rng.random() < 0.15
        if last:
            kw["out_dtype"] = "float32"
        h = g.gemm(h, operand((h.cols, n), "bfloat16"), **kw)
        pool.append(h)
        if last:
            break
        if rng.random() < 0.15:
            h = g.add(h, operand((n,), "bfloat16"))
            pool.append(h)
    return _with_outputs(g, pool, rng)


F32_CHAIN_ROWS = [1, 2, 5, 8, 16, 17]
F32_CHAIN_DIMS = [32, 100, 128, 257, 520, 1024, 2100]


def random_f32_chain_graph(seed: int, constants: float = 0.0) -> megak.Graph:
    """fp32 layer chains at batch 1 to 16 (and 17, past that path's edge) on weight inputs,
    the path of the fp32 W2 rows, with random epilogues (bias, activation, residual), K and N
    off the 32-column bands and 128-row boxes, sometimes a bias or a residual added between
    layers (folded into the layer or not, by the epilogue's order). Each weight, bias and
    residual a constant with probability `constants`."""
    rng = np.random.default_rng(seed)
    g = megak.Graph()
    operand = _operands(g, seed, rng, constants)
    m = int(rng.choice(F32_CHAIN_ROWS))
    h = operand((m, rng.choice(F32_CHAIN_DIMS)), "float32", weight=False)
    pool = [h]
    for _ in range(int(rng.integers(2, 6))):
        n = int(rng.choice(F32_CHAIN_DIMS))
        kw = _layer_epilogue(rng, operand, m, n, "float32", lambda: "float32")
        h = g.gemm(h, operand((h.cols, n), "float32"), **kw)
        pool.append(h)
        if rng.random() < 0.25:
            h = g.add(h, operand((n,) if rng.random() < 0.5 else (m, n), "float32"))
            pool.append(h)
    return _with_outputs(g, pool, rng)


def random_const_graph(seed: int) -> megak.Graph:
    """The stream's bf16 chains (even seeds) and the fp32 chains (odd seeds) with half their
    weights, biases and residuals constants (g.constant): on the GPU a streamed constant B is
    also kept packed in the stream's page order, read by bulk copies."""
    make = random_stream_graph if seed % 2 == 0 else random_f32_chain_graph
    return make(seed, constants=0.5)


def random_layer_chain(rng, dtype: str, batches: list[int], widths: list[int]) -> tuple:
    """x @ W_i through 1-3 layers of a batch and widths drawn from `batches` and `widths`, each
    layer with an fp32 bias and a relu or silu at random, every layer's result an output (the
    GPU stress tests' chains). Returns (graph, batch, widths)."""
    m = int(rng.choice(batches))
    dims = [int(rng.choice(widths)) for _ in range(int(rng.integers(2, 5)))]
    g = megak.Graph()
    x = g.input("x", (m, dims[0]), dtype)
    for i, (k, n) in enumerate(zip(dims[:-1], dims[1:])):
        x = g.gemm(x, g.input(f"w{i}", (k, n), dtype),
                   bias=g.input(f"b{i}", (n,), "float32") if rng.random() < 0.5 else None,
                   activation=str(rng.choice(["relu", "silu"])) if rng.random() < 0.5
                   else None)
        g.output(x, f"h{i}")
    return g, m, dims


def _with_outputs(g: megak.Graph, pool: list, rng) -> megak.Graph:
    """The last op's result as an output, and each other op's with probability 0.3."""
    produced = [t for t in pool if t.producer is not None]
    outs = {produced[-1].index: produced[-1]}
    for t in produced[:-1]:
        if rng.random() < 0.3:
            outs[t.index] = t
    for i, t in enumerate(outs.values()):
        g.output(t, f"out{i}")
    return g
