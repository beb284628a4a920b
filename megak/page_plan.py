"""Which of its pages an instruction's loader fills, and when its compute role gives them back.

An SM runs two roles (pages.py has the picture): a loader warp one instruction ahead and the
compute warps. Pages are the hand-over between them, so both need to agree, per instruction,
on three things, all in positions 0 .. rec["pages"]-1 of the instruction's own page table
(acquisition order), never physical page numbers:

* ``preload_early``: pages the loader writes BEFORE the dependency wait. Only operands with
  no producer in the graph may be read then (MK_FLAG_B_READY marks a GEMM whose B is one).
* ``preload_late``: pages the loader writes after the wait (the operands that do have a
  producer), before it marks the slot ready.
* ``phases``: the op's compute phases in order, each ``(pages used, pages released after
  it)``. A page released after phase p is free for the next instruction's loader to take
  and overwrite while this instruction still runs phase p+1, so no later phase may use it.
  Whatever the record asked for and no phase released goes back after the last phase.

This module is the one Python statement of those rules; the device ops (device/ops/*.cuh)
implement the same plan and the simulator (sim.py) checks every instruction against it.
Adding an op kind with a page plan: one function and one line in ``_RULES``.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import abi


@dataclass(frozen=True)
class PagePlan:
    preload_early: tuple[int, ...] = ()
    preload_late: tuple[int, ...] = ()
    phases: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (((), ()),)
    # operand regions the early preloads read, (operand position, r0, r1, c0, c1): they are
    # read before the dependency wait, so they must be complete before it (the simulator
    # checks it; a flag set on an operand that has a producer is a race)
    early_reads: tuple[tuple[int, int, int, int, int], ...] = ()


# ops that stream through registers: one phase touching no page; the final release frees
# whatever the record asked for
NO_PAGES = PagePlan()

GEMM_PAGES = abi.OP_SHAPES["MK_GEMM_PAGES"]
# the epilogue stages the output tile through the op's pages, this many rows per page: a
# tile of fewer rows needs only its first pages, and the rest can go before the epilogue
GEMM_EPILOGUE_ROWS_PER_PAGE = 32
# one pipeline stage = a 32-deep k slice of A and B in one page (bf16 cp.async ring)
GEMM_STAGE_K = 32
# the loader fills at most this many stages: the ring has GEMM_PAGES stages and the op must
# find one empty to issue its next load into when it starts
GEMM_PRELOAD_STAGES = 3


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# skinny bf16 tiles (device/ops/gemm_bf16_skinny.cuh): the device picks that path by the
# record's shape, whatever lowered it (an edge tile of a 128 x 128 grid can qualify)
SKINNY_M = abi.OP_SHAPES["MK_GEMM_SKINNY_M"]
SKINNY_MAX_N = abi.OP_SHAPES["MK_GEMM_SKINNY_MAX_N"]
# a skinny stage is one page of B's band: 1024 k-rows of 8 columns (one plane), fewer rows
# per page for wider bands (2 or 4 planes)
SKINNY_STAGE_K = 1024


def skinny_plan(rec) -> PagePlan:
    cols, klen = int(rec["cols"]), int(rec["klen"])
    planes = 1 if cols <= 8 else (2 if cols <= 16 else 4)
    stages = tuple(range(min(GEMM_PRELOAD_STAGES,
                             _ceil_div(max(klen, 0), SKINNY_STAGE_K // planes))))
    # k loop on the 4-page ring, then pages 2 and 3 go; the 8 warps' partials are summed from
    # page 1 into the staging rows in page 0, then page 1 goes; the epilogue reads page 0
    phases = (((0, 1, 2, 3), (2, 3)), ((0, 1), (1,)), ((0,), (0,)))
    # only B is staged (A goes from global memory to registers): with B a graph input the
    # loader fills its stages before the wait, and has nothing to do after it
    if not int(rec["flags"]) & abi.FLAG_B_READY:
        return PagePlan(preload_late=stages, phases=phases)
    k0, c0 = int(rec["k0"]), int(rec["col0"])
    b_band = ((abi.ARG_B, k0, k0 + klen, c0, c0 + cols),)
    return PagePlan(preload_early=stages, phases=phases, early_reads=b_band if stages else ())


def gemm_plan(rec, dtype_a: str) -> PagePlan:
    rows, klen = int(rec["rows"]), int(rec["klen"])
    if dtype_a == "bfloat16" and 1 <= rows <= SKINNY_M and 1 <= int(rec["cols"]) <= SKINNY_MAX_N:
        return skinny_plan(rec)
    ring = tuple(range(GEMM_PAGES))
    kept = min(GEMM_PAGES, _ceil_div(max(rows, 0), GEMM_EPILOGUE_ROWS_PER_PAGE))
    phases = ((ring, ring[kept:]),          # the k loop, then the stages the epilogue skips
              (ring[:kept], ring[:kept]))   # the epilogue
    if dtype_a != "bfloat16":
        # the fp32 path double-buffers inside the op: nothing for the loader to fill
        return PagePlan(phases=phases)
    stages = tuple(range(min(GEMM_PRELOAD_STAGES, _ceil_div(max(klen, 0), GEMM_STAGE_K))))
    # each stage page holds a slice of B and a slice of A: with B a graph input its half is
    # written before the wait and A's after, so the same pages appear in both lists
    if not int(rec["flags"]) & abi.FLAG_B_READY:
        return PagePlan(preload_late=stages, phases=phases)
    k0, c0, cols = int(rec["k0"]), int(rec["col0"]), int(rec["cols"])
    # the flag promises all of B's band is final, not only the preloaded stages
    b_band = ((abi.ARG_B, k0, k0 + klen, c0, c0 + cols),)
    return PagePlan(preload_early=stages, preload_late=stages, phases=phases,
                    early_reads=b_band if stages else ())


def _no_pages(rec, dtype_a: str) -> PagePlan:
    return NO_PAGES


_RULES = {
    abi.OP_NOP: _no_pages,
    abi.OP_COPY: _no_pages,
    abi.OP_TRANSPOSE: _no_pages,
    abi.OPCODES["MK_OP_REDUCE"]: _no_pages,
    abi.OP_GEMM: gemm_plan,
}


def page_plan(rec, dtype_a: str = "float32") -> PagePlan:
    """The page plan of one decoded record (abi.decode); ``dtype_a`` is the dtype name of its
    tensor[MK_ARG_A] ("float32", "bfloat16"), which picks the GEMM path."""
    rule = _RULES.get(int(rec["opcode"]), _no_pages)
    return rule(rec, dtype_a)
