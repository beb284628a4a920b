"""Copy: out = x, fp32. A copy holds no pages (MK_COPY_PAGES = 0): the device streams the data
through registers, 64 KiB of loads in flight per SM, with no shared-memory hop. Two forms:

- dealt out: bands of whole rows of about COPY_CHUNK_BYTES each, one instruction a band, placed
  on SMs in advance: large enough that per-instruction overhead is small against the bytes
  moved, small enough to spread a big copy over every SM; a consumer waits for the bands it
  reads;
- taken in turn (a copy nothing in the graph reads, of at least two blocks' worth of bands,
  TAKE_BLOCK_UNITS float4 each): one instruction per SM (at most one per block's worth), each
  naming the whole region, whose warps take bands of 8 KiB from a hand-out counter until none
  is left (MK_FLAG_COPY_TAKE; device/ops/copy.cuh has the protocol). A warp that ran ahead
  takes the next band instead of idling at the end of a fixed share: 1 GiB in a probe of the
  same footprint, 3,841 GB/s dealt out against 4,118 taken by blocks (benchmarks/ANALYSIS.md).
  Its consumers could wait only for the whole copy (every taker may have written any row),
  which is why a copy read inside the graph keeps the dealt-out form.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..graph import check_float32_only
from ._lowering import Lowered, Region, cost_ns, edges
from .base import OpDef, region

COPY_CHUNK_BYTES = 1 << 20
# a taker warp's band: MK_COPY_TAKE_UNITS float4 units of the region's body (8 KiB), taken by
# each of a taker's MK_COPY_TAKE_WARPS warps; a run adds bands + TAKE_WARPS * takers to the
# counter
TAKE_UNITS = abi.OP_SHAPES["MK_COPY_TAKE_UNITS"]
TAKE_WARPS = abi.OP_SHAPES["MK_COPY_TAKE_WARPS"]
# what one taker's warps copy at once (64 KiB): a copy takes at least two of these, with at
# most one taker (SM) for each, so that a short copy is not spread over more SMs than it fills
TAKE_BLOCK_UNITS = TAKE_UNITS * TAKE_WARPS


def rows_per_chunk(rows: int, cols: int) -> int:
    return max(1, min(rows, COPY_CHUNK_BYTES // (4 * cols)))


def take_bands(rows: int, cols: int) -> int:
    """Bands of a taken copy: its body (the first cols // 4 * 4 columns) as float4 units in
    row-major order, TAKE_UNITS a band (device/ops/copy.cuh, mk_copy_bands)."""
    return -(-rows * (cols // 4) // TAKE_UNITS)


def per_run_count(takers: int, bands: int) -> int:
    """What one good run of a taken copy adds to its counter: every band once, and each
    taker warp's last take (device/ops/copy.cuh)."""
    return bands + TAKE_WARPS * takers


def take_share(taker: int, takers: int, rows: int) -> tuple[int, int]:
    """The rows [lo, hi) whose tail columns taker `taker` copies (all its columns where the
    tensors are not 16-B aligned on the device: mk_copy_share)."""
    return taker * rows // takers, (taker + 1) * rows // takers


def copy(self, x):
    """``x`` copied into a new tensor of the same shape (2-D, or 1-D vectors); float32."""
    self.check_operand(x, "copy", "x")
    check_float32_only(x, "copy")
    return self.append_op("copy", (x,), x.shape, x.dtype)


class Copy(OpDef):
    name = "copy"
    operands = (abi.ARG_A,)
    build = staticmethod(copy)
    flag_io = True
    uses_counters = True   # a taker's hand-out counter

    def expand(self, unit, ctx):
        """Fixes the form: takers (attrs["takers"] > 0, one per SM and per TAKE_BLOCK_UNITS
        at most) where nothing in the graph reads the copy, its body holds more than one
        TAKE_BLOCK_UNITS and fewer than 2^31 units (the device's u32 walk)."""
        x = unit.inputs[0]
        units = x.rows * (x.cols // 4)
        blocks = -(-units // TAKE_BLOCK_UNITS)
        read = ctx.readers.get(unit.output.index, 0) > 0
        takers = min(ctx.n_sm, blocks) if not read and blocks >= 2 and units < 1 << 31 else 0
        return [unit.with_(attrs=dict(unit.attrs, takers=takers))]

    def count(self, unit) -> int:
        x = unit.inputs[0]
        return unit.attrs.get("takers", 0) or -(-x.rows // rows_per_chunk(x.rows, x.cols))

    def lower(self, unit) -> Lowered:
        (x,) = unit.inputs
        rows, cols = x.rows, x.cols
        takers = unit.attrs.get("takers", 0)
        if takers:
            return self._lower_takers(rows, cols, takers)
        row_edges = edges(rows, rows_per_chunk(rows, cols))
        col_edges = np.array([0, cols], dtype=np.int64)
        r0, r1 = row_edges[:-1], row_edges[1:]
        n = len(r0)
        reads = [Region(r0, r1, np.zeros(n, dtype=np.int64), np.full(n, cols, dtype=np.int64))]
        nbytes = 8.0 * (r1 - r0) * cols
        return Lowered(self.opcode, self.pages, row_edges, col_edges, reads,
                       cost_ns(0.0, nbytes), bytes=8.0 * rows * cols)

    def _lower_takers(self, rows: int, cols: int, takers: int) -> Lowered:
        """`takers` instructions sharing the whole region (param: the taker's index, k0: the
        takers). Their grid rows are nominal (one per taker): each names every row, so
        consumers may wait only for the whole op."""
        zeros, n = np.zeros(takers, dtype=np.int64), takers
        whole = [Region(zeros, np.full(n, rows, dtype=np.int64), zeros,
                        np.full(n, cols, dtype=np.int64))]
        bands = take_bands(rows, cols)
        return Lowered(self.opcode, self.pages, np.arange(n + 1, dtype=np.int64),
                       np.array([0, cols], dtype=np.int64), whole,
                       cost_ns(0.0, np.full(n, 8.0 * rows * cols / n)),
                       bytes=8.0 * rows * cols,
                       extra={"row0": zeros, "rows": np.full(n, rows, dtype=np.int64),
                              "k0": np.full(n, n, dtype=np.int64),
                              "param": np.arange(n, dtype=np.int64)},
                       flags=abi.FLAG_COPY_TAKE, wait_levels=("op",),
                       combine=zeros,
                       combine_adds=np.array([per_run_count(n, bands)], dtype=np.int64))

    def bodies(self, recs) -> int:
        take = (recs["flags"] & abi.FLAG_COPY_TAKE) != 0
        return 1 << self.opcode | (abi.BODY_COPY_TAKE if take.any() else 0)

    def check_record(self, rec) -> bool:
        r0, c0, rn, cn = region(rec)
        ok = min(r0, c0, rn, cn) >= 0
        if int(rec["flags"]) & abi.FLAG_COPY_TAKE:   # mk_copy_check
            ok = (ok and int(rec["k0"]) >= 1 and int(rec["param"]) < int(rec["k0"])
                  and cn >= 4 and rn * (cn // 4) < 1 << 31)
        return ok

    def written(self, rec) -> tuple[int, int, int, int]:
        r0, c0 = int(rec["row0"]), int(rec["col0"])   # a taker's out_row0 is its counter
        return r0, r0 + int(rec["rows"]), c0, c0 + int(rec["cols"])

    def reads(self, rec, tensors):
        r0, c0, rn, cn = region(rec)
        return ((abi.ARG_A, r0, r0 + rn, c0, c0 + cn),)

    def simulate(self, rec, tensors, counters=None, epoch=0):
        """A dealt-out band, or a taker as the device runs it on 16-B aligned tensors
        (device/ops/copy.cuh): the body's bands its warps are handed by the counter until
        each takes one past the last (here warp 0 takes every band left), then the tail
        columns of its share of the rows."""
        x, out = tensors[rec["tensor"][abi.ARG_A]], tensors[rec["tensor"][abi.ARG_OUT]]
        r0, c0, rn, cn = region(rec)
        if not int(rec["flags"]) & abi.FLAG_COPY_TAKE:
            out[r0:r0 + rn, c0:c0 + cn] = x[r0:r0 + rn, c0:c0 + cn]
            return self.reads(rec, tensors)
        c, units = int(rec["out_row0"]), cn // 4
        bands = take_bands(rn, cn)
        base = epoch * per_run_count(int(rec["k0"]), bands)
        for band in self._hand_out(counters, c, base, bands):
            # the band's elements of the body, row-major: float4 units -> (row, column)
            e = np.arange(4 * band * TAKE_UNITS, 4 * min(rn * units, (band + 1) * TAKE_UNITS))
            rr, cc = r0 + e // (4 * units), c0 + e % (4 * units)
            out[rr, cc] = x[rr, cc]
        lo, hi = take_share(int(rec["param"]), int(rec["k0"]), rn)
        out[r0 + lo:r0 + hi, c0 + 4 * units:c0 + cn] = x[r0 + lo:r0 + hi, c0 + 4 * units:c0 + cn]
        return self.reads(rec, tensors)   # any row: the whole region, as its consumers see it

    @staticmethod
    def _hand_out(counters, c: int, base: int, bands: int):
        """The bands one taker's warps are handed, in turn: warp 0 until none is left, then
        each other warp's one take that finds none."""
        for _ in range(TAKE_WARPS):
            while True:
                old = int(counters[c])
                counters[c] = (old + 1) & 0xFFFFFFFF
                band = (old - base) & 0xFFFFFFFF
                if band >= bands:
                    break
                yield band

    def reference(self, op, args):
        value, bound = args[0]
        return value, bound   # exact


OP = Copy()
