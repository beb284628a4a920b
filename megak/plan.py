"""A compiled graph as both backends take it: encoded queues plus a tensor table.

This is the hand-over point between the host pipeline (graph -> lowering -> scheduler -> abi)
and the backends (sim.py, runtime/). Nothing in here knows about CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import abi
from .dtypes import ITEMSIZE

FLAG_WORD_BYTES = 8   # a flagged element: the fp32 value and its stamp in one 64-bit word


@dataclass(frozen=True)
class TensorSlot:
    """One entry of the tensor table. ``kind``: "input" (a graph input or constant: data
    the kernel only reads), "intermediate", or "unused" (no instruction writes or reads it:
    its op was dropped or fused away; it gets no memory); outputs name slots. ``flagged``:
    an fp32 intermediate held as 64-bit words, value and stamp
    (scheduler.flagged_tensors)."""

    slot: int
    name: str
    rows: int
    cols: int
    dtype: str  # numpy dtype name, e.g. "float32"
    kind: str
    flagged: bool = False   # held as data that is its own flag (MK_DTYPE_F32_FLAG: 8 B per
                            # element, device/flag.cuh): an intermediate the scheduler picked

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def itemsize(self) -> int:
        """Bytes per element as megak holds it."""
        return FLAG_WORD_BYTES if self.flagged else ITEMSIZE[self.dtype]


@dataclass
class Plan:
    instrs: np.ndarray           # abi.INSTR_DTYPE, queues back to back
    queue_start: np.ndarray      # uint32[n_sm + 1]
    tensors: list[TensorSlot]
    n_counters: int
    n_sm: int
    n_pages: int
    op_labels: list[str]         # op_index -> "gemm #3 (a @ b -> t5)"
    inputs: dict[str, int]       # input name -> tensor slot
    outputs: dict[str, int]      # output name -> tensor slot
    input_shapes: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    output_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    counter_targets: np.ndarray | None = None  # uint32[n_counters]: signals per run
    op_kinds: list[str] = field(default_factory=list)
    op_flops: list[float] = field(default_factory=list)   # from lowering, for the trace
    op_bytes: list[float] = field(default_factory=list)
    op_dtypes: list[str] = field(default_factory=list)    # the dtype an op computes in
    dropped_ops: list[str] = field(default_factory=list)  # labels of ops no output needs
    stream_pages: int = 0        # pages of each block's weight ring (mk_params.stream_pages;
                                 # 0: no instruction streams its weights)
    constant_values: dict[int, np.ndarray] = field(default_factory=dict)  # slot -> the value
                                 # of a constant (Graph.constant): megak's own, uploaded once

    def queue(self, sm: int) -> np.ndarray:
        return self.instrs[int(self.queue_start[sm]):int(self.queue_start[sm + 1])]

    def encoded(self) -> bytes:
        return abi.encode(self.instrs)

    def queue_lengths(self) -> list[int]:
        return np.diff(self.queue_start.astype(np.int64)).tolist()
