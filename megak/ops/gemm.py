"""GEMM: out = act(a @ b + bias) + residual, lowered into 128 x 128 output tiles, each
running the whole K loop with the epilogue fused into its store.

Each tile instruction reads a row band of `a`, a column band of `b` and its own tile of
`bias` / `residual`, so it depends only on the producer tiles that wrote those. Edge tiles are
short; the device op bounds-checks. fp32 operands run on the FMA pipes, bf16 operands on
tensor cores; both accumulate in fp32.

Skinny bf16 GEMMs (M <= MK_GEMM_SKINNY_M, an MLP at small batch) get other tiles: the
scheduler asks `skinny_cols` for a band width, and `lower` makes one instruction per narrow
column band of all M rows over the whole K, so that a layer is about one instruction per SM
and every SM streams only its own band of the weights (device/ops/gemm_bf16_skinny.cuh).
The scheduler never splits them.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..dtypes import ITEMSIZE
from ._lowering import Lowered, Region, cost_ns, edges, grid

OPCODE = abi.OP_GEMM
PAGES = abi.OP_SHAPES["MK_GEMM_PAGES"]
PAGES_BY_DTYPE = {"float32": PAGES, "bfloat16": abi.OP_SHAPES["MK_GEMM_BF16_PAGES"]}
TILE_M = abi.OP_SHAPES["MK_GEMM_TILE_M"]
TILE_N = abi.OP_SHAPES["MK_GEMM_TILE_N"]
SKINNY_M = abi.OP_SHAPES["MK_GEMM_SKINNY_M"]
SKINNY_MAX_N = abi.OP_SHAPES["MK_GEMM_SKINNY_MAX_N"]
# band widths, narrowest first: whole n8 MMA tiles up to SKINNY_MAX_N
SKINNY_WIDTHS = tuple(8 << i for i in range(SKINNY_MAX_N.bit_length()) if 8 << i <= SKINNY_MAX_N)


def epilogue_flags(op) -> int:
    act = abi.ACTIVATIONS["MK_ACT_" + (op.attrs.get("activation") or "none").upper()]
    return ((abi.FLAG_BIAS if op.attrs.get("bias") else 0)
            | (abi.FLAG_RESIDUAL if op.attrs.get("residual") else 0)
            | (act << abi.FLAG_ACT_SHIFT))


def skinny_cols(m: int, n: int, dtype: str, n_sm: int) -> int | None:
    """Column band width of a skinny bf16 GEMM on `n_sm` SMs, or None for the tiled lowering.

    The narrowest band whose instructions fit on the SMs at once (one band per SM, and the
    fewest weight bytes per SM); the widest if even that gives more bands than SMs. fp32 and
    M > SKINNY_M keep 128 x 128 tiles (and split-K where they are few)."""
    if dtype != "bfloat16" or m > SKINNY_M:
        return None
    for width in SKINNY_WIDTHS:
        if -(-n // width) <= n_sm:
            return width
    return SKINNY_WIDTHS[-1]


def lower(op) -> Lowered:
    """One instruction per output tile over the whole K: 128 x 128 tiles, or for a skinny
    bf16 GEMM (op.attrs["skinny"] = band width) one band of all M rows by that many columns
    (memory-bound: the cost is the band of b plus a, each read once)."""
    if op.attrs.get("split"):
        return lower_split(op)
    a, b = op.inputs[:2]
    m, k = a.shape
    n = b.cols
    band = op.attrs.get("skinny")
    row_edges = edges(m, m) if band else edges(m, TILE_M)
    col_edges = edges(n, band if band else TILE_N)
    r0, tm, c0, tn = grid(row_edges, col_edges)
    zeros = np.zeros(len(r0), dtype=np.int64)
    full_k = np.full(len(r0), k, dtype=np.int64)
    reads = [Region(r0, r0 + tm, zeros, full_k),      # a[m-band, :]
             Region(zeros, full_k, c0, c0 + tn)]      # b[:, n-band]
    operands = [abi.ARG_A, abi.ARG_B]
    ones = np.ones(len(r0), dtype=np.int64)
    if op.attrs.get("bias"):
        reads.append(Region(zeros, ones, c0, c0 + tn))             # bias[0, n-band]
        operands.append(abi.ARG_BIAS)
    if op.attrs.get("residual"):
        reads.append(Region(r0, r0 + tm, c0, c0 + tn))             # residual tile
        operands.append(abi.ARG_RESIDUAL)
    size = ITEMSIZE[a.dtype]
    flops = 2.0 * tm * tn * k
    nbytes = size * (tm * k + k * tn) + ITEMSIZE[op.output.dtype] * tm * tn
    total_bytes = (size * (m * k + k * n) + ITEMSIZE[op.output.dtype] * m * n
                   + sum(ITEMSIZE[t.dtype] * t.rows * t.cols for t in op.inputs[2:]))
    return Lowered(OPCODE, PAGES_BY_DTYPE[a.dtype], row_edges, col_edges, reads,
                   cost_ns(flops, nbytes, tensor_cores=a.dtype == "bfloat16"),
                   flops=float(flops.sum()), bytes=float(total_bytes),
                   extra={"k0": zeros, "klen": full_k}, operands=operands,
                   flags=epilogue_flags(op))


def lower_split(op) -> Lowered:
    """Split-K partials: split s multiplies a[:, s*chunk:(s+1)*chunk] by the same rows of b
    into rows [s*M, (s+1)*M) of the fp32 partials tensor (op.output, S*M x N), no epilogue;
    a reduce instruction sums them (megak/ops/reduce.py). The grid is over the partials."""
    a, b = op.inputs
    m, k = a.shape
    n = b.cols
    splits, chunk = op.attrs["split"], op.attrs["chunk"]
    m_edges, col_edges = edges(m, TILE_M), edges(n, TILE_N)
    # the partials' row grid: each split's M rows tiled like the output's
    row_edges = np.append((np.arange(splits)[:, None] * m + m_edges[None, :-1]).ravel(),
                          splits * m)
    p0, tm, c0, tn = grid(row_edges, col_edges)
    split = p0 // m                     # every tile lies inside one split's rows
    m0 = p0 - split * m
    k0 = split * chunk
    kl = np.minimum(chunk, k - k0)
    reads = [Region(m0, m0 + tm, k0, k0 + kl), Region(k0, k0 + kl, c0, c0 + tn)]
    size = ITEMSIZE[a.dtype]
    flops = 2.0 * tm * tn * kl
    nbytes = size * (tm * kl + kl * tn) + 4 * tm * tn
    return Lowered(OPCODE, PAGES_BY_DTYPE[a.dtype], row_edges, col_edges, reads,
                   cost_ns(flops, nbytes, tensor_cores=a.dtype == "bfloat16"),
                   flops=float(flops.sum()),
                   bytes=float(size * (m * k + k * n) + 4 * splits * m * n),
                   extra={"row0": m0, "out_row0": p0, "k0": k0, "klen": kl},
                   operands=[abi.ARG_A, abi.ARG_B], flags=0)


def activation(v: np.ndarray, name: str | None) -> np.ndarray:
    """The epilogue activations, in the input's precision (float32 in the simulator)."""
    if name is None or name == "none":
        return v
    if name == "relu":
        return np.maximum(v, v.dtype.type(0))
    if name == "gelu":   # tanh form, as the device computes it
        c = v.dtype.type(0.7978845608028654)
        return v.dtype.type(0.5) * v * (v.dtype.type(1) + np.tanh(c * (v + v.dtype.type(0.044715) * v * v * v)))
    if name == "silu":
        return v / (v.dtype.type(1) + np.exp(-v))
    raise ValueError(f"unknown activation {name!r}")


def reference(a: np.ndarray, b: np.ndarray, bias=None, act=None, residual=None) -> np.ndarray:
    """float64 reference of act(a @ b + bias) + residual."""
    v = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        v = v + np.asarray(bias, dtype=np.float64).reshape(1, -1)
    v = activation(v, act)
    if residual is not None:
        v = v + residual.astype(np.float64)
    return v


def simulate(instr, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
    """Run one GEMM tile as the device does: fp32 accumulation of the (exact) fp32 or bf16
    operand values, the epilogue in fp32, one rounding to the output's dtype. Returns the
    regions it read."""
    t = instr["tensor"]
    a, b = tensors[t[abi.ARG_A]], tensors[t[abi.ARG_B]]
    r0, c0, rn, cn = int(instr["row0"]), int(instr["col0"]), int(instr["rows"]), int(instr["cols"])
    k0, kl = int(instr["k0"]), int(instr["klen"])
    f32 = np.float32
    v = a[r0:r0 + rn, k0:k0 + kl].astype(f32) @ b[k0:k0 + kl, c0:c0 + cn].astype(f32)
    reads = [(abi.ARG_A, r0, r0 + rn, k0, k0 + kl), (abi.ARG_B, k0, k0 + kl, c0, c0 + cn)]
    return tuple(reads) + epilogue(v, instr, tensors)


def epilogue(v: np.ndarray, instr, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
    """act(v + bias) + residual in fp32, in the device's order, rounded once into the output
    at rows out_row0.. (shared by GEMM and REDUCE). Returns the regions it read."""
    t = instr["tensor"]
    r0, c0, rn, cn = int(instr["row0"]), int(instr["col0"]), int(instr["rows"]), int(instr["cols"])
    flags = int(instr["flags"])
    f32 = np.float32
    reads = []
    if flags & abi.FLAG_BIAS:
        v = v + tensors[t[abi.ARG_BIAS]][0:1, c0:c0 + cn].astype(f32)
        reads.append((abi.ARG_BIAS, 0, 1, c0, c0 + cn))
    act = (flags & abi.FLAG_ACT_MASK) >> abi.FLAG_ACT_SHIFT
    v = activation(v, _ACT_NAMES[act])
    if flags & abi.FLAG_RESIDUAL:
        v = v + tensors[t[abi.ARG_RESIDUAL]][r0:r0 + rn, c0:c0 + cn].astype(f32)
        reads.append((abi.ARG_RESIDUAL, r0, r0 + rn, c0, c0 + cn))
    out = tensors[t[abi.ARG_OUT]]
    orow = int(instr["out_row0"])
    out[orow:orow + rn, c0:c0 + cn] = v.astype(out.dtype)
    return tuple(reads)


_ACT_NAMES = {v: k[len("MK_ACT_"):].lower() for k, v in abi.ACTIVATIONS.items()}
