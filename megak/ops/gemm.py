"""GEMM: out = act(a @ b + bias) + residual, lowered into 128 x 128 output tiles, each
running the whole K loop with the epilogue fused into its store.

Each tile instruction reads a row band of `a`, a column band of `b` and its own tile of
`bias` / `residual`, so it depends only on the producer tiles that wrote those. Edge tiles are
short; the device op bounds-checks. fp32 operands run on the FMA pipes, bf16 operands on
tensor cores; both accumulate in fp32.

`expand` picks one of three lowerings by shape:
  * streamed bf16 GEMMs (M <= MK_STREAM_M and B a graph input: a layer at batch 1..64): B in
    boxes of 64 columns x 128 k-rows through the weight ring (device/stream.cuh,
    device/ops/gemm_stream.cuh); each 64-column band in `parts` equal k ranges, so that a layer
    is about one instruction per SM, the last part of a band to finish sums the partials;
  * GEMMs of few output tiles: split over K into fp32 partials on many SMs, plus a REDUCE
    unit (ops/reduce.py) that sums them in a fixed order and applies the epilogue;
  * the rest: one instruction per output tile.
Tiles are 128 x 128, except the other bf16 GEMMs' on SMs with at least MK_WGMMA_PAGES pages:
128 x 256 tiles on Hopper's warpgroup MMA with TMA copies (MK_FLAG_WGMMA,
device/ops/gemm_wgmma.cuh), split-K partials included.
"""
from __future__ import annotations

import numpy as np

from .. import abi
from ..accuracy import accumulation_gamma
from ..dtypes import ITEMSIZE, TENSOR_ALIGN_ELEMS
from ..errors import GraphError
from ..graph import check_2d, check_dtype, check_row_vector
from ..pages import DEFAULT_PAGES, ring_pages
from . import _epilogue
from ._lowering import Lowered, Region, cost_ns, edges, grid, grouped_order, tile_group
from .base import OpDef, PagePlan, Unit, region

SHAPES = abi.OP_SHAPES
TILE_M = SHAPES["MK_GEMM_TILE_M"]
TILE_N = SHAPES["MK_GEMM_TILE_N"]
PAGES_BY_DTYPE = {"float32": SHAPES["MK_GEMM_PAGES"], "bfloat16": SHAPES["MK_GEMM_BF16_PAGES"]}
STREAM_M = SHAPES["MK_STREAM_M"]
STREAM_TILE_M = SHAPES["MK_STREAM_TILE_M"]
BOX_COLS = SHAPES["MK_STREAM_BOX_COLS"]
BOX_ROWS = SHAPES["MK_STREAM_BOX_ROWS"]
NARROW_COLS = SHAPES["MK_STREAM_NARROW_COLS"]
F32_COLS = SHAPES["MK_STREAM_F32_COLS"]
F32_STREAM_M = 16        # an fp32 band is one m16 tile of rows (device/ops/gemm_stream_f32.cuh)
STREAM_PAGES = SHAPES["MK_STREAM_PAGES"]
# the weight ring of a program of streamed GEMMs on a Hopper SM's pages (scheduler.stream_pages)
RING_BOXES = ring_pages(DEFAULT_PAGES, STREAM_PAGES)

WGMMA_TILE_M = SHAPES["MK_WGMMA_TILE_M"]
WGMMA_TILE_N = SHAPES["MK_WGMMA_TILE_N"]
WGMMA_NARROW_N = SHAPES["MK_WGMMA_NARROW_N"]
WGMMA_PAGES = SHAPES["MK_WGMMA_PAGES"]

MAX_SPLITS = 16          # split-K: at most this many partial products per output tile
MIN_SPLIT_K = 128        # and at least this much K per partial


def gemm(self, a, b, bias=None, activation=None, residual=None, out_dtype=None):
    """``act(a @ b + bias) + residual`` for (M, K) @ (K, N), any positive sizes, in one
    fused instruction per output tile (fp32 accumulation; bf16 operands on tensor cores).

    bias: (N,) or (1, N); activation: None, "relu", "gelu" (tanh form) or "silu";
    residual: (M, N); out_dtype: "float32" or "bfloat16" (default: a's dtype, so a bf16
    GEMM returns bf16). bias and residual may be float32 or bfloat16 whatever a's dtype.
    """
    for t, arg in ((a, "a"), (b, "b")):
        self.check_operand(t, "gemm", arg)
        check_2d(t, "gemm", arg)
    if a.cols != b.rows:
        raise GraphError(f"gemm: inner dimensions differ: a is {a.shape}, b is {b.shape} "
                         f"(need a.shape[1] == b.shape[0])")
    if a.dtype != b.dtype:
        raise GraphError(f"gemm: dtypes differ: a is {a.dtype}, b is {b.dtype}")
    m, n = a.rows, b.cols
    inputs = [a, b]
    if bias is not None:
        self.check_operand(bias, "gemm", "bias")
        check_row_vector(bias, n, "gemm", "bias")
        inputs.append(bias)
    if activation not in _epilogue.ACTIVATIONS:
        raise GraphError(f"gemm: unknown activation {activation!r}; allowed: "
                         f"{', '.join(repr(x) for x in _epilogue.ACTIVATIONS)}")
    if residual is not None:
        self.check_operand(residual, "gemm", "residual")
        if residual.shape != (m, n):
            raise GraphError(f"gemm: residual must have shape ({m}, {n}), got "
                             f"{residual.shape}")
        inputs.append(residual)
    out_dtype = a.dtype if out_dtype is None else check_dtype(out_dtype, "gemm out_dtype")
    return self.append_op("gemm", tuple(inputs), (m, n), out_dtype, bias=bias is not None,
                       activation=activation, residual=residual is not None)


def epilogue_flags(op) -> int:
    return _epilogue.flags(op.attrs)


def stream_split(m: int, k: int, n: int, dtype: str, b_is_input: bool,
                 n_sm: int) -> tuple[int, int] | None:
    """(parts, k per part) of a streamed GEMM on `n_sm` SMs, or None for the tiled lowering.

    Streamed: B a graph input (the streamer fetches it before any dependency is met), and
    bf16 of at most STREAM_M rows or fp32 of at most F32_STREAM_M (bands of F32_COLS columns,
    FMAs instead of MMAs: device/ops/gemm_stream_f32.cuh; their boxes are bf16's 16 KiB pages
    of 128 k-rows). Each band of BOX_COLS columns (and STREAM_TILE_M rows) splits its
    k-rows, in whole boxes, into equal parts: as few as keep one part's boxes within the ring
    (RING_BOXES: the streamer then has all of it in flight before the part's activation is
    ready, and every part past the first costs a combine on the layer's critical path), but
    as many as the SMs allow when a band's boxes are more (bands x row bands x parts <= n_sm:
    every SM streams a share)."""
    if not b_is_input:
        return None
    if dtype == "float32" and m <= F32_STREAM_M:
        bands, row_bands = -(-n // F32_COLS), 1
    elif dtype == "bfloat16" and m <= STREAM_M:
        bands, row_bands = -(-n // BOX_COLS), -(-m // STREAM_TILE_M)
    else:
        return None
    boxes = -(-k // BOX_ROWS)
    parts = max(1, min(-(-boxes // RING_BOXES), n_sm // (bands * row_bands)))
    per = -(-boxes // parts)
    return -(-boxes // per), per * BOX_ROWS


def stream_narrow(m: int, n: int, parts: int, n_sm: int) -> bool:
    """Whether a streamed GEMM that `stream_split` cuts into `parts` k ranges per band takes
    narrow bands instead (MK_FLAG_STREAM_NARROW: NARROW_COLS columns over the whole K, no
    combine): at most one m16 tile of rows, narrow bands that fit one wave and keep at least
    as many SMs streaming, and either a split that would combine or more SMs than the wide
    bands. On the H200 the combine of two parts cost 4.0 us of a 15.4 us layer of 4096 x 8,
    and one part on half the SMs as much in its longer k loop; 1024 x 1024 layers (16 wide
    bands of one part, 32 narrow) ran 87.7 us wide and 79.7 us narrow for 16 of them at
    batch 16 (benchmarks/ANALYSIS.md)."""
    narrow_bands = -(-n // NARROW_COLS)
    wide = parts * -(-n // BOX_COLS)
    return (m <= 16 and narrow_bands <= n_sm and narrow_bands >= wide
            and (parts > 1 or narrow_bands > wide))


# wgmma tiles split over K only into 8 parts or more: a split adds fp32 partials (written
# and read again) and a reduce op. Measured on the H200 (bf16, M x 4096 x 4096, both on the
# wgmma-only kernel, which runs the reduce too; CUDA events around run()): M = 512 (64
# tiles) 105.9 us split in 2 against 81.3 unsplit, M = 384 101.4 / 79.6, M = 256 (split in
# 4) 96.0 / 92.0. With 16 tiles (M = 128) the split in 8 is what puts the SMs to work.
WGMMA_MIN_SPLITS = 8


def uses_wgmma(dtype: str, n_pages: int) -> bool:
    """Whether a non-streamed GEMM takes 128 x 256 wgmma tiles: bf16 operands and room for the
    op's MK_WGMMA_PAGES pages on each SM."""
    return dtype == "bfloat16" and n_pages >= WGMMA_PAGES


def tile_shape(attrs: dict) -> tuple[int, int]:
    """(rows, cols) of a tiled unit's output tiles."""
    if attrs.get("wgmma"):
        return WGMMA_TILE_M, WGMMA_NARROW_N if attrs.get("narrow") else WGMMA_TILE_N
    return TILE_M, TILE_N


def narrow_wgmma(m: int, n: int, n_sm: int) -> bool:
    """Whether an unsplit wgmma GEMM takes 128 x 128 tiles instead of 128 x 256: when its wide
    tiles leave SMs idle and the narrow ones still fit one wave. A batch-512 layer (512 x 4096
    x 4096) has 64 wide tiles for 132 SMs, 128 narrow ones. A program whose every wgmma tile is
    at most 128 columns wide runs the narrow build of the wgmma-only kernel (MK_WGMMA_ONLY=2:
    n128 MMAs, half the tensor time per k step of the n256 ones). Gemm.expand asks only for
    GEMMs with at most a bias, the epilogue that build runs."""
    rows = -(-m // WGMMA_TILE_M)
    wide, narrow = rows * -(-n // WGMMA_TILE_N), rows * -(-n // WGMMA_NARROW_N)
    return wide < narrow <= n_sm


def _tile_pages_and_flag(attrs: dict, dtype: str) -> tuple[int, int]:
    """(pages, MK_FLAG_WGMMA or 0) of a tiled unit's records."""
    if attrs.get("wgmma"):
        return WGMMA_PAGES, abi.FLAG_WGMMA
    return PAGES_BY_DTYPE[dtype], 0


def split_k_factor(m: int, k: int, n: int, n_sm: int,
                   tile_n: int = TILE_N, min_splits: int = 2) -> tuple[int, int]:
    """(splits, K per split) for a GEMM: 1 unless its output tiles would leave most SMs idle.

    A GEMM of few output tiles (an MLP at small batch: M = 16 gives N/128 tiles) runs its
    whole K loop on those few SMs while the rest wait; splitting K over more SMs and summing
    the partials in a reduce instruction puts every SM to work. Chunks are multiples of 64 so
    bf16 operands stay 16-B aligned. No split below `min_splits` parts: wgmma tiles ask for 8
    (WGMMA_MIN_SPLITS)."""
    tiles = -(-m // TILE_M) * -(-n // tile_n)
    if min_splits * tiles > n_sm or k < 2 * MIN_SPLIT_K:
        return 1, k
    splits = min(n_sm // tiles, k // MIN_SPLIT_K, MAX_SPLITS)
    if splits < min_splits:
        return 1, k
    chunk = -(-k // splits)
    chunk = -(-chunk // 64) * 64
    return -(-k // chunk), chunk


class Gemm(OpDef):
    name = "gemm"
    # a, b, then bias and residual as present (lower() maps them by the attrs)
    operands = (abi.ARG_A, abi.ARG_B)
    early_operand = 1            # b: weights with no producer stream before the waits
    build = staticmethod(gemm)

    def expand(self, unit: Unit, ctx) -> list[Unit]:
        if unit.attrs.get("split") or unit.attrs.get("stream"):
            return [unit]
        a, b = unit.inputs[:2]
        stream = ctx.weight_stream and stream_split(a.rows, a.cols, b.cols, a.dtype,
                                                    getattr(b, "producer", -1) is None,
                                                    ctx.n_sm)
        if stream:
            parts, chunk = stream
            if a.dtype == "bfloat16" and stream_narrow(a.rows, b.cols, parts, ctx.n_sm):
                return [unit.with_(attrs=dict(unit.attrs, stream=1, chunk=a.cols, narrow=True))]
            inputs = unit.inputs
            if parts > 1:   # part p's partial rows at p * STREAM_M (the last part sums them)
                inputs += (ctx.new_tensor((parts * STREAM_M, b.cols), "float32",
                                          f"t{unit.output.index}_stream_partials"),)
            f32 = {"f32": True} if a.dtype == "float32" else {}
            return [unit.with_(inputs=inputs,
                               attrs=dict(unit.attrs, stream=parts, chunk=chunk, **f32))]
        wide = uses_wgmma(a.dtype, ctx.n_pages)
        splits, chunk = split_k_factor(a.rows, a.cols, b.cols, ctx.n_sm,
                                       WGMMA_TILE_N if wide else TILE_N,
                                       WGMMA_MIN_SPLITS if wide else 2)
        if splits == 1:
            if not wide:
                return [unit]
            # narrow tiles only where the n128 build can run them: with an activation or a
            # residual the general kernel runs a narrow tile at a wide one's MMA cost
            narrow = (not unit.attrs.get("activation") and not unit.attrs.get("residual")
                      and narrow_wgmma(a.rows, b.cols, ctx.n_sm))
            # wgmma tiles in grouped order (lower), in groups fitted to the SMs: 8192^3 bf16
            # +5% in the probe. The fp32 tiles (CUDA cores) keep row-major order, where
            # grouped measured 3% slower (39.7 against 41.1 TFLOP/s, H200).
            group = tile_group(ctx.n_sm, WGMMA_TILE_M, WGMMA_NARROW_N if narrow else WGMMA_TILE_N)
            extra = {"narrow": True} if narrow else {}
            return [unit.with_(attrs=dict(unit.attrs, wgmma=True, group=group, **extra))]
        part = ctx.new_tensor((splits * a.rows, b.cols), "float32",
                              f"t{unit.output.index}_partials")
        return [Unit("gemm", (a, b), part, {"split": splits, "chunk": chunk, "wgmma": wide},
                     f"{unit.label} split-K partials ({splits} x K {chunk})"),
                Unit("reduce", (part,) + tuple(unit.inputs[2:]), unit.output,
                     dict(unit.attrs, splits=splits, part_rows=a.rows),
                     f"{unit.label} split-K reduce + epilogue")]

    def count(self, unit: Unit) -> int:
        a, b = unit.inputs[:2]
        m, n = a.rows, b.cols
        if unit.attrs.get("stream"):
            return unit.attrs["stream"] * -(-n // _band_cols(unit.attrs)) * -(-m // STREAM_TILE_M)
        tm, tn = tile_shape(unit.attrs)
        return unit.attrs.get("split", 1) * -(-m // tm) * -(-n // tn)

    def lower(self, unit) -> Lowered:
        """One instruction per output tile (tile_shape) over the whole K (or _lower_split,
        _lower_stream)."""
        if unit.attrs.get("split"):
            return self._lower_split(unit)
        if unit.attrs.get("stream"):
            return self._lower_stream(unit)
        a, b = unit.inputs[:2]
        m, k = a.shape
        n = b.cols
        tile_m, tile_n = tile_shape(unit.attrs)
        row_edges = edges(m, tile_m)
        col_edges = edges(n, tile_n)
        r0, tm, c0, tn = grid(row_edges, col_edges)
        zeros = np.zeros(len(r0), dtype=np.int64)
        full_k = np.full(len(r0), k, dtype=np.int64)
        reads = [Region(r0, r0 + tm, zeros, full_k),      # a[m-band, :]
                 Region(zeros, full_k, c0, c0 + tn)]      # b[:, n-band]
        operands = [abi.ARG_A, abi.ARG_B]
        ones = np.ones(len(r0), dtype=np.int64)
        if unit.attrs.get("bias"):
            reads.append(Region(zeros, ones, c0, c0 + tn))             # bias[0, n-band]
            operands.append(abi.ARG_BIAS)
        if unit.attrs.get("residual"):
            reads.append(Region(r0, r0 + tm, c0, c0 + tn))             # residual tile
            operands.append(abi.ARG_RESIDUAL)
        size = ITEMSIZE[a.dtype]
        out_size = ITEMSIZE[unit.output.dtype]
        flops = 2.0 * tm * tn * k
        nbytes = size * (tm * k + k * tn) + out_size * tm * tn
        total_bytes = (size * (m * k + k * n) + out_size * m * n
                       + sum(ITEMSIZE[t.dtype] * t.rows * t.cols for t in unit.inputs[2:]))
        pages, wide = _tile_pages_and_flag(unit.attrs, a.dtype)
        group = unit.attrs.get("group")
        return Lowered(self.opcode, pages, row_edges, col_edges, reads,
                       cost_ns(flops, nbytes, tensor_cores=a.dtype == "bfloat16"),
                       flops=float(flops.sum()), bytes=float(total_bytes),
                       extra={"k0": zeros, "klen": full_k}, operands=operands,
                       flags=_epilogue.flags(unit.attrs) | wide,
                       placement=None if group is None else
                       grouped_order(len(row_edges) - 1, len(col_edges) - 1, group))

    def _lower_split(self, unit) -> Lowered:
        """Split-K partials: split s multiplies a[:, s*chunk:(s+1)*chunk] by the same rows of
        b into rows [s*M, (s+1)*M) of the fp32 partials tensor (unit.output, S*M x N), no
        epilogue; a reduce instruction sums them. The grid is over the partials."""
        a, b = unit.inputs
        m, k = a.shape
        n = b.cols
        splits, chunk = unit.attrs["split"], unit.attrs["chunk"]
        tile_m, tile_n = tile_shape(unit.attrs)
        m_edges, col_edges = edges(m, tile_m), edges(n, tile_n)
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
        pages, wide = _tile_pages_and_flag(unit.attrs, a.dtype)
        return Lowered(self.opcode, pages, row_edges, col_edges, reads,
                       cost_ns(flops, nbytes, tensor_cores=a.dtype == "bfloat16"),
                       flops=float(flops.sum()),
                       bytes=float(size * (m * k + k * n) + 4 * splits * m * n),
                       extra={"row0": m0, "out_row0": p0, "k0": k0, "klen": kl},
                       operands=[abi.ARG_A, abi.ARG_B], flags=wide)

    def _lower_stream(self, unit) -> Lowered:
        """A streamed GEMM: instruction (p, r, b) multiplies k range p (whole boxes, the last
        one short at K's end) of column band b (BOX_COLS columns, NARROW_COLS for narrow bands:
        one part) for row band r (STREAM_TILE_M rows). The grid's rows are parts x row bands over a virtual parts*M rows, so a column
        counter of the grid counts every instruction of a band: the consumers wait per band or
        for the op (wait_levels), never for one part, which may not be the last. The parts of
        a (row band, column band) share a combine counter (the scheduler allocates them)."""
        a, b = unit.inputs[:2]
        m, k = a.shape
        n = b.cols
        parts, chunk = unit.attrs["stream"], unit.attrs["chunk"]
        in_part = edges(m, STREAM_TILE_M)[:-1]
        halves = len(in_part)
        row_edges = np.append((np.arange(parts)[:, None] * m + in_part[None, :]).ravel(),
                              parts * m)
        narrow, f32 = bool(unit.attrs.get("narrow")), bool(unit.attrs.get("f32"))
        col_edges = edges(n, _band_cols(unit.attrs))
        p0, tm, c0, tn = grid(row_edges, col_edges)
        part = p0 // m
        r0 = p0 - part * m
        k0 = part * chunk
        kl = np.minimum(chunk, k - k0)
        zeros = np.zeros(len(p0), dtype=np.int64)
        reads = [Region(r0, r0 + tm, k0, k0 + kl), Region(k0, k0 + kl, c0, c0 + tn)]
        operands = [abi.ARG_A, abi.ARG_B]
        if unit.attrs.get("bias"):
            reads.append(Region(zeros, zeros + 1, c0, c0 + tn))
            operands.append(abi.ARG_BIAS)
        if unit.attrs.get("residual"):
            reads.append(Region(r0, r0 + tm, c0, c0 + tn))
            operands.append(abi.ARG_RESIDUAL)
        if parts > 1:   # the partials tensor: written and read by the parts themselves
            reads.append(Region(part * STREAM_M + r0, part * STREAM_M + r0 + tm, c0, c0 + tn))
            operands.append(abi.ARG_SPARE)
        n_bands = len(col_edges) - 1
        tile = np.arange(len(p0))
        group = ((tile // n_bands) % halves) * n_bands + tile % n_bands
        size = ITEMSIZE[a.dtype]
        out_size = ITEMSIZE[unit.output.dtype]
        flops = 2.0 * tm * tn * kl
        nbytes = size * (tm * kl + kl * tn) + 4 * tm * tn
        total_bytes = (size * (m * k + k * n) + out_size * m * n
                       + sum(ITEMSIZE[t.dtype] * t.rows * t.cols for t in unit.inputs[2:]))
        return Lowered(self.opcode, STREAM_PAGES, row_edges, col_edges, reads,
                       cost_ns(flops, nbytes, tensor_cores=not f32),
                       flops=float(flops.sum()), bytes=float(total_bytes),
                       extra={"row0": r0, "k0": k0, "klen": kl,
                              "param": (parts << 16) | part},
                       operands=operands,
                       flags=(_epilogue.flags(unit.attrs) | abi.FLAG_STREAM
                              | (abi.FLAG_STREAM_NARROW if narrow else 0)
                              | (abi.FLAG_STREAM_F32 if f32 else 0)),
                       wait_levels=("col", "op"),
                       combine=group if parts > 1 else None)

    # -- runtime ----------------------------------------------------------------------------
    def bodies(self, recs: np.ndarray) -> int:
        flags = recs["flags"].astype(np.int64)
        wgmma = (flags & abi.FLAG_WGMMA) != 0
        stream = ((flags & abi.FLAG_STREAM) != 0) & ~wgmma
        mask = 1 << self.opcode
        mask |= abi.BODY_GEMM_WGMMA if wgmma.any() else 0
        mask |= abi.BODY_GEMM_STREAM if stream.any() else 0
        mask |= abi.BODY_GEMM_TILED if (~wgmma & ~stream).any() else 0
        return mask

    # -- pages ------------------------------------------------------------------------------
    def page_plan(self, rec, dtype_a: str) -> PagePlan:
        if int(rec["flags"]) & abi.FLAG_WGMMA:
            staged = int(rec["flags"]) & (abi.FLAG_ACT_MASK | abi.FLAG_RESIDUAL)
            return WGMMA_PLAN if staged else WGMMA_REGISTER_PLAN
        if int(rec["flags"]) & abi.FLAG_STREAM:
            return _stream_plan(rec)
        return _tile_plan(rec, dtype_a)

    # -- simulator --------------------------------------------------------------------------
    def check_record(self, rec) -> bool:
        r0, c0, rn, cn = region(rec)
        flags = int(rec["flags"])
        if flags & abi.FLAG_WGMMA:   # gemm_wgmma.cuh's mk_gemm_wgmma_check
            return (not flags & abi.FLAG_STREAM and int(rec["pages"]) >= WGMMA_PAGES
                    and min(r0, c0, rn, cn, int(rec["out_row0"]), int(rec["k0"]),
                            int(rec["klen"])) >= 0
                    and rn <= WGMMA_TILE_M and cn <= WGMMA_TILE_N
                    and _epilogue.act_code_ok(rec))
        if flags & abi.FLAG_STREAM:
            parts, part = int(rec["param"]) >> 16, int(rec["param"]) & 0xFFFF
            narrow, f32 = flags & abi.FLAG_STREAM_NARROW, flags & abi.FLAG_STREAM_F32
            return (min(r0, c0, int(rec["k0"])) >= 0
                    and 1 <= rn <= (16 if narrow or f32 else STREAM_TILE_M)
                    and 1 <= cn <= (NARROW_COLS if narrow else F32_COLS if f32 else BOX_COLS)
                    and int(rec["klen"]) >= 1 and part < parts and (not narrow or parts == 1)
                    and not (narrow and f32)
                    and int(rec["pages"]) >= STREAM_PAGES and _epilogue.act_code_ok(rec))
        return (min(r0, c0, rn, cn, int(rec["out_row0"]), int(rec["k0"]), int(rec["klen"])) >= 0
                and rn <= TILE_M and cn <= TILE_N and _epilogue.act_code_ok(rec))

    def min_pages(self, rec) -> int:
        if int(rec["flags"]) & abi.FLAG_WGMMA:
            return WGMMA_PAGES
        return STREAM_PAGES if int(rec["flags"]) & abi.FLAG_STREAM else self.pages

    def written(self, rec) -> tuple[int, int, int, int]:
        r0, c0 = int(rec["row0"]), int(rec["col0"])
        if not int(rec["flags"]) & abi.FLAG_STREAM:
            r0 = int(rec["out_row0"])
        return r0, r0 + int(rec["rows"]), c0, c0 + int(rec["cols"])

    uses_counters = True   # a streamed GEMM's parts meet on a combine counter

    def simulate(self, rec, tensors, counters=None, epoch=0):
        """Run one GEMM tile as the device does: fp32 accumulation of the (exact) fp32 or
        bf16 operand values, the epilogue in fp32, one rounding to the output's dtype. A
        streamed part stores its partial and adds to its band's combine counter; the part
        that completes it sums every part's rows in part order and runs the epilogue."""
        t = rec["tensor"]
        a, b = tensors[t[abi.ARG_A]], tensors[t[abi.ARG_B]]
        r0, c0, rn, cn = region(rec)
        k0, kl = int(rec["k0"]), int(rec["klen"])
        f32 = np.float32
        v = a[r0:r0 + rn, k0:k0 + kl].astype(f32) @ b[k0:k0 + kl, c0:c0 + cn].astype(f32)
        reads = [(abi.ARG_A, r0, r0 + rn, k0, k0 + kl), (abi.ARG_B, k0, k0 + kl, c0, c0 + cn)]
        stream = int(rec["flags"]) & abi.FLAG_STREAM
        parts, part = int(rec["param"]) >> 16, int(rec["param"]) & 0xFFFF
        if stream and parts > 1:
            scratch = tensors[t[abi.ARG_SPARE]]
            at = part * STREAM_M + r0
            scratch[at:at + rn, c0:c0 + cn] = v
            c = int(rec["out_row0"])
            old = int(counters[c])
            counters[c] = (old + 1) & 0xFFFFFFFF
            if (old + 1) & 0xFFFFFFFF != ((epoch + 1) * parts) & 0xFFFFFFFF:
                return tuple(reads)
            v = np.zeros((rn, cn), dtype=f32)
            for p in range(parts):
                v = v + scratch[p * STREAM_M + r0:p * STREAM_M + r0 + rn, c0:c0 + cn]
        if stream:
            rec = rec.copy()
            rec["out_row0"] = r0   # the counter's field: the output rows start at row0
        return tuple(reads) + _epilogue.simulate(v, rec, tensors)

    # -- reference --------------------------------------------------------------------------
    def reference(self, op, args):
        """A fp32 dot product of length K, summed in any order, is within
        2 K u (|a| . |b|) of the exact value (megak/accuracy.py says why); errors already in
        a and b propagate through the product; then the epilogue's."""
        (a, ea), (b, eb) = args[:2]
        value = a @ b
        mag = (np.abs(a) + ea) @ (np.abs(b) + eb)
        bound = (ea @ np.abs(b) + np.abs(a) @ eb + ea @ eb
                 + accumulation_gamma(a.shape[1]) * mag)
        return _epilogue.reference(value, bound, op.attrs, args[2:], op.output.dtype)


OP = Gemm()


def reference(a: np.ndarray, b: np.ndarray, bias=None, act=None, residual=None) -> np.ndarray:
    """float64 act(a @ b + bias) + residual (the value only; OP.reference adds the bound)."""
    v = a.astype(np.float64) @ b.astype(np.float64)
    if bias is not None:
        v = v + np.asarray(bias, dtype=np.float64).reshape(1, -1)
    v = _epilogue.activation(v, act)
    if residual is not None:
        v = v + residual.astype(np.float64)
    return v


# -- page plans (device: gemm.cuh, gemm_bf16.cuh, gemm_stream.cuh) ----------------------------

def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _vec(dtype: str, *offsets: int) -> bool:
    """The device's test for the 16-B cp.async path, on the simulator's tensors: megak-owned
    rows start 16-B aligned (MK_TENSOR_ALIGN_BYTES), so an element offset inside a row is
    16-B aligned when it is a multiple of 8 bf16 or 4 fp32. The device tests the real
    pointers (a caller's tensor may fail it: its op then loads what this plan calls
    preloaded itself, later and inside its own pages)."""
    return all(o % TENSOR_ALIGN_ELEMS[dtype] == 0 for o in offsets)


# the wgmma tile: the loader fills the first 4 stages of 3 pages after the wait (TMA copies;
# it refills them while the k loop runs, inside the op's own pages), then the two staging
# tiles on pages 0-7 for the epilogue; the op hands nothing back early (the next wgmma tile
# needs all 12)
WGMMA_PLAN = PagePlan(preload_late=tuple(range(WGMMA_PAGES)),
                      phases=((tuple(range(WGMMA_PAGES)), ()),))
# the same tile with an epilogue of at most a bias: stored from registers, so every page goes
# back right after the k loop (gemm_wgmma.cuh, mk_wgmma_register_epilogue). A record whose
# operands have no tensor maps (known only at run time) stages its epilogue instead and keeps
# its pages to the end: later than this plan says, which no other instruction can notice
WGMMA_REGISTER_PLAN = PagePlan(preload_late=tuple(range(WGMMA_PAGES)),
                               phases=((tuple(range(WGMMA_PAGES)), tuple(range(WGMMA_PAGES))),
                                       ((), ())))


def _band_cols(attrs: dict) -> int:
    """Columns of one band of a streamed GEMM unit (the lowering's attrs)."""
    return NARROW_COLS if attrs.get("narrow") else F32_COLS if attrs.get("f32") else BOX_COLS


def _stream_plan(rec) -> PagePlan:
    # pages 0-1 hold A during the k loop (a 4 KiB chunk per warp; without the ring, A's ring
    # of stages) and page 2 B's box where the ring cannot deliver it; then the 8 warps'
    # partials in 1-2 summed (1-2 go) into registers (one part: stored from there, page 0
    # idle until the op ends) or into the staging rows in 0 for the combine and the epilogue.
    # B is never preloaded: the streamer delivers it into the ring, outside the op's pages
    return PagePlan(phases=(((0, 1, 2), ()), ((0, 1, 2), (1, 2)), ((0,), (0,))))


def f32_short(rec) -> bool:
    """Whether an fp32 tile record takes the short path (device/ops/gemm_f32_short.cuh,
    mk_gemm_f32_short_ok): at most MK_GEMM_F32_SHORT_ROWS rows, both operands' origins
    16-B aligned (on megak's tensors: the test of _vec)."""
    return (int(rec["rows"]) <= SHAPES["MK_GEMM_F32_SHORT_ROWS"]
            and _vec("float32", int(rec["k0"]), int(rec["col0"])))


def _tile_plan(rec, dtype_a: str) -> PagePlan:
    rows, klen = int(rec["rows"]), int(rec["klen"])
    n_pages = PAGES_BY_DTYPE[dtype_a]
    ring = tuple(range(n_pages))
    kept = min(n_pages, _ceil_div(max(rows, 0), SHAPES["MK_GEMM_STAGE_ROWS"]))
    phases = ((ring, ring[kept:]),          # the k loop, then the stages the epilogue skips
              (ring[:kept], ring[:kept]))   # the epilogue
    bk = SHAPES["MK_GEMM_BF16_BK" if dtype_a == "bfloat16" else "MK_GEMM_BK"]
    slices = _ceil_div(max(klen, 0), bk)
    if dtype_a == "bfloat16":
        n = 0
        if _vec("bfloat16", int(rec["k0"]), int(rec["col0"])):
            n = min(SHAPES["MK_GEMM_BF16_PRELOAD_STAGES"], slices)
        # each stage page holds a slice of B and a slice of A: with B a graph input its half
        # is written before the wait and A's after, so the same pages appear in both lists
        b_pages = a_pages = tuple(range(n))
    elif f32_short(rec):
        # the short fp32 tile: B's stage s in page s, every stage's A slice in the page after
        # the stages (its partial tiles then fill all four, the fp32 tile's phases)
        n = min(SHAPES["MK_GEMM_F32_SHORT_PRELOAD_STAGES"], slices)
        b_pages, a_pages = tuple(range(n)), (SHAPES["MK_GEMM_F32_SHORT_STAGES"],) if n else ()
    else:
        # the 128 x 128 fp32 tile double-buffers inside the op: nothing for the loader to fill
        return PagePlan(phases=phases)
    if not int(rec["flags"]) & abi.FLAG_B_READY:
        return PagePlan(preload_late=tuple(sorted(set(b_pages + a_pages))), phases=phases)
    k0, c0, cols = int(rec["k0"]), int(rec["col0"]), int(rec["cols"])
    # the flag promises all of B's band is final, not only the preloaded stages
    b_band = ((abi.ARG_B, k0, k0 + klen, c0, c0 + cols),)
    return PagePlan(preload_early=b_pages, preload_late=a_pages, phases=phases,
                    early_reads=b_band if b_pages else ())
