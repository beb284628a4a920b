"""What every op's lowering returns: a regular grid of output tiles, one instruction per tile
(row-major over the grid), the region each instruction reads from each input, a cost estimate
and the page need. The scheduler turns read regions into tile-level dependencies."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Region:
    """Per-instruction rectangles [r0, r1) x [c0, c1) of one input, arrays of length n."""
    r0: np.ndarray
    r1: np.ndarray
    c0: np.ndarray
    c1: np.ndarray


@dataclass
class Lowered:
    opcode: int
    pages: int
    row_edges: np.ndarray          # output grid: tile i covers rows row_edges[i]:row_edges[i+1]
    col_edges: np.ndarray
    reads: list[Region]            # one per op input, in order
    cost_ns: np.ndarray            # estimated time of each instruction on one SM
    flops: float = 0.0
    bytes: float = 0.0
    extra: dict = field(default_factory=dict)  # per-instruction fields (k0, klen, ...)
    operands: list[int] | None = None  # mk_instr.tensor[] position of each input (default 0..)
    flags: int = 0                     # mk_flags of every instruction (epilogue, ...)
    wait_levels: tuple[str, ...] | None = None  # counter levels consumers may wait on (None:
                                       # any); a grid whose rows are not output rows limits them
    combine: np.ndarray | None = None  # per instruction: its combine group (a band of
                                       # streamed parts, a copy's takers); the scheduler puts
                                       # the group's counter in out_row0 (instr.h,
                                       # MK_FLAG_STREAM, MK_FLAG_COPY_TAKE)
    combine_adds: np.ndarray | None = None  # per combine group: what one run adds to its
                                       # counter (None: one per instruction of the group)
    placement: np.ndarray | None = None  # the order the scheduler places the instructions on
                                       # SMs in (a permutation of 0..n-1; None: row-major):
                                       # instructions placed together run at the same time

    @property
    def n_row_tiles(self) -> int:
        return len(self.row_edges) - 1

    @property
    def n_col_tiles(self) -> int:
        return len(self.col_edges) - 1

    @property
    def n(self) -> int:
        return self.n_row_tiles * self.n_col_tiles

    def tile_regions(self):
        """(row0, rows, col0, cols) of every instruction's output tile, row-major."""
        return grid(self.row_edges, self.col_edges)


def grid(row_edges: np.ndarray, col_edges: np.ndarray):
    """(row0, rows, col0, cols) per tile of the grid, row-major: one instruction each."""
    r0, rn = row_edges[:-1], np.diff(row_edges)
    c0, cn = col_edges[:-1], np.diff(col_edges)
    nr, nc = len(r0), len(c0)
    return np.repeat(r0, nc), np.repeat(rn, nc), np.tile(c0, nr), np.tile(cn, nr)


def grouped_order(n_rows: int, n_cols: int, group: int) -> np.ndarray:
    """The row-major tile indices of an n_rows x n_cols grid in grouped order: `group` tile
    rows at a time, down each column of the group before the next column. Tiles placed one
    after another run at the same time on different SMs; in row-major order the first wave
    of a wide grid covers a few row bands and every column band, in this order about `group`
    row bands and n_sm / group column bands, so they share more of their operands in L2."""
    order = []
    for g0 in range(0, n_rows, max(1, group)):
        rows = np.arange(g0, min(g0 + group, n_rows), dtype=np.int64)
        order.append((np.arange(n_cols, dtype=np.int64)[:, None] + rows[None, :] * n_cols).ravel())
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)


def tile_group(n_sm: int, tile_m: int, tile_n: int) -> int:
    """The group (tile rows) of grouped_order whose first wave of n_sm tiles reads the fewest
    operand bytes per k step: g row bands of tile_m and n_sm / g column bands of tile_n cost
    g tile_m + (n_sm / g) tile_n, least at g = sqrt(n_sm tile_n / tile_m)."""
    return max(1, round((n_sm * tile_n / tile_m) ** 0.5))


def edges(extent: int, tile: int) -> np.ndarray:
    """Tile boundaries 0, tile, 2*tile, ..., extent (the last tile may be short)."""
    e = np.arange(0, extent, tile, dtype=np.int64)
    return np.append(e, extent)


# Rough per-SM throughput of an H200 (132 SMs), for balancing queues, not for promises.
SM_FLOPS_PER_NS = 50e12 / 132 / 1e9        # fp32 FMA pipes at ~50 TFLOP/s per device
SM_TC_FLOPS_PER_NS = 700e12 / 132 / 1e9    # bf16 tensor cores
SM_BYTES_PER_NS = 4.0e12 / 132 / 1e9       # ~4 TB/s HBM per device
INSTR_OVERHEAD_NS = 500.0                  # dependency hand-off and instruction fetch


def cost_ns(flops: np.ndarray | float, nbytes: np.ndarray | float,
            tensor_cores: bool = False) -> np.ndarray:
    rate = SM_TC_FLOPS_PER_NS if tensor_cores else SM_FLOPS_PER_NS
    return np.maximum(np.asarray(flops, dtype=np.float64) / rate,
                      np.asarray(nbytes, dtype=np.float64) / SM_BYTES_PER_NS) + INSTR_OVERHEAD_NS


# Elementwise and row-wise ops: whole rows per instruction, about this many bytes of input
# each, but spread so that a small tensor still lands on many SMs.
ROW_CHUNK_BYTES = 256 << 10


def rows_per_instruction(rows: int, row_bytes: int, n_sm: int) -> int:
    """Rows per instruction of a row-band lowering: at most ROW_CHUNK_BYTES of input (at
    least one row), and no more than needed to give every SM a band."""
    by_bytes = max(1, ROW_CHUNK_BYTES // max(1, row_bytes))
    return max(1, min(rows, by_bytes, -(-rows // max(1, n_sm))))


def row_bands(rows: int, cols: int, per: int, reads_per_input: list[str]):
    """Row-band grid of `rows` x `cols` with `per` rows per instruction, and one Region per
    input: "rows" (the band's own rows, all columns) or "row0" (row 0 only: a broadcast row
    vector)."""
    row_edges = edges(rows, per)
    col_edges = np.array([0, cols], dtype=np.int64)
    r0, r1 = row_edges[:-1], row_edges[1:]
    n = len(r0)
    zeros, full = np.zeros(n, dtype=np.int64), np.full(n, cols, dtype=np.int64)
    reads = [Region(r0, r1, zeros, full) if how == "rows"
             else Region(zeros, np.ones(n, dtype=np.int64), zeros, full)
             for how in reads_per_input]
    return row_edges, col_edges, reads


class RowBands:
    """expand/count of the ops lowered into bands of whole rows (add, the row-wise ops): the
    rows per instruction depend on the SM count, so expand fixes them in the unit's attrs."""

    def expand(self, unit, ctx):
        from ..dtypes import ITEMSIZE
        x = unit.inputs[0]
        per = rows_per_instruction(x.rows, ITEMSIZE[x.dtype] * x.cols, ctx.n_sm)
        return [unit.with_(attrs=dict(unit.attrs, rows_per_instr=per))]

    def count(self, unit) -> int:
        return -(-unit.inputs[0].rows // unit.attrs["rows_per_instr"])
