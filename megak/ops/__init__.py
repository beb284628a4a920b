"""The op registry: one line per op. Each module's ``OP`` is its whole contract
(megak/ops/base.py); graph.py, scheduler.py, sim.py, page_plan.py and the test references
loop over this registry and name no op. Importing it installs every public op's Graph
method (``megak.Graph.gemm`` is ``gemm.OP.build``)."""
import numpy as np

from .. import abi
from ..graph import Graph
from . import add, copy, gemm, layernorm, reduce, rmsnorm, softmax, transpose

REGISTRY = {m.OP.name: m.OP for m in (copy, transpose, gemm, reduce, add, softmax, layernorm,
                                      rmsnorm)}
BY_OPCODE = {op.opcode: op for op in REGISTRY.values()}


def bodies(instrs) -> int:
    """The MK_BODIES mask (instr.h, enum mk_bodies) of a kernel that runs the records
    `instrs` (an array of abi.INSTR_DTYPE): each op's bodies; opcodes no op has (NOP, or a
    bad one the device reports) add nothing."""
    codes = instrs["opcode"]
    mask = 1 << abi.OP_NOP
    for code in np.unique(codes):
        op = BY_OPCODE.get(int(code))
        if op is not None:
            mask |= op.bodies(instrs[codes == code])
    return mask

for _op in REGISTRY.values():
    if not _op.internal:
        setattr(Graph, _op.name, _op.build)
