"""Which of its pages an instruction's loader fills, and when its compute role gives them back.

An SM runs two roles (pages.py has the picture): a loader warp up to MK_SLOTS - 1 instructions
ahead and the compute warps. Pages are the hand-over between them, so both need to agree, per
instruction, on three things, all in positions 0 .. rec["pages"]-1 of the instruction's own
page table (acquisition order), never physical page numbers:

* ``preload_early``: pages the loader writes BEFORE the dependency wait. Only operands with
  no producer in the graph may be read then (MK_FLAG_B_READY marks a GEMM whose B is one).
* ``preload_late``: pages the loader writes after the wait (the operands that do have a
  producer), before it marks the slot ready.
* ``phases``: the op's compute phases in order, each ``(pages used, pages released after
  it)``. A page released after phase p is free for the next instruction's loader to take
  and overwrite while this instruction still runs phase p+1, so no later phase may use it.
  Whatever the record asked for and no phase released goes back after the last phase.

Each op states its plan in its own module (``OpDef.page_plan``, megak/ops/<op>.py; the
default is NO_PAGES: an op streaming through registers); the device ops (device/ops/*.cuh)
implement the same plan and the simulator (sim.py) checks every instruction against it.
"""
from __future__ import annotations

from .ops import BY_OPCODE
from .ops.base import NO_PAGES, PagePlan

__all__ = ["NO_PAGES", "PagePlan", "page_plan"]


def page_plan(rec, dtype_a: str = "float32") -> PagePlan:
    """The page plan of one decoded record (abi.decode); ``dtype_a`` is the dtype name of its
    tensor[MK_ARG_A] ("float32", "bfloat16"), which picks an op's path."""
    op = BY_OPCODE.get(int(rec["opcode"]))
    return NO_PAGES if op is None else op.page_plan(rec, dtype_a)
