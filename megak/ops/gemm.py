"""GEMM: out = a @ b, lowered into 128 x 128 output tiles, each running the whole K loop.

Each tile instruction reads a row band of `a` and a column band of `b`, so it depends only on
the producer tiles that wrote those bands. Edge tiles are short; the device op bounds-checks.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ._lowering import Lowered, Region, cost_ns, edges

OPCODE = abi.OP_GEMM
PAGES = abi.OP_SHAPES["MK_GEMM_PAGES"]
TILE_M = abi.OP_SHAPES["MK_GEMM_TILE_M"]
TILE_N = abi.OP_SHAPES["MK_GEMM_TILE_N"]


def lower(op) -> Lowered:
    a, b = op.inputs
    m, k = a.shape
    n = b.cols
    row_edges, col_edges = edges(m, TILE_M), edges(n, TILE_N)
    nr, nc = len(row_edges) - 1, len(col_edges) - 1
    tm = np.repeat(np.diff(row_edges), nc)
    tn = np.tile(np.diff(col_edges), nr)
    r0 = np.repeat(row_edges[:-1], nc)
    c0 = np.tile(col_edges[:-1], nr)
    zeros = np.zeros(nr * nc, dtype=np.int64)
    full_k = np.full(nr * nc, k, dtype=np.int64)
    reads = [Region(r0, r0 + tm, zeros, full_k),      # a[m-band, :]
             Region(zeros, full_k, c0, c0 + tn)]      # b[:, n-band]
    flops = 2.0 * tm * tn * k
    nbytes = 4.0 * (tm * k + k * tn + tm * tn)
    return Lowered(OPCODE, PAGES, row_edges, col_edges, reads, cost_ns(flops, nbytes),
                   flops=float(flops.sum()), bytes=4.0 * (m * k + k * n + m * n),
                   extra={"k0": zeros, "klen": full_k})


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def simulate(instr, tensors: list[np.ndarray]) -> tuple[tuple, ...]:
    """Run one GEMM tile in float32, as the device does. Returns the regions it read."""
    a, b, out = (tensors[instr["tensor"][i]] for i in (abi.ARG_A, abi.ARG_B, abi.ARG_OUT))
    r0, c0, rn, cn = int(instr["row0"]), int(instr["col0"]), int(instr["rows"]), int(instr["cols"])
    k0, kl = int(instr["k0"]), int(instr["klen"])
    out[r0:r0 + rn, c0:c0 + cn] = a[r0:r0 + rn, k0:k0 + kl] @ b[k0:k0 + kl, c0:c0 + cn]
    return ((abi.ARG_A, r0, r0 + rn, k0, k0 + kl), (abi.ARG_B, k0, k0 + kl, c0, c0 + cn))
