"""The op registry: one line per op. Each module's ``OP`` is its whole contract
(megak/ops/base.py); graph.py, scheduler.py, sim.py, page_plan.py and the test references
loop over this registry and name no op. Importing it installs every public op's Graph
method (``megak.Graph.gemm`` is ``gemm.OP.build``)."""
from ..graph import Graph
from . import add, copy, gemm, layernorm, reduce, rmsnorm, softmax, transpose

REGISTRY = {m.OP.name: m.OP for m in (copy, transpose, gemm, reduce, add, softmax, layernorm,
                                      rmsnorm)}
BY_OPCODE = {op.opcode: op for op in REGISTRY.values()}

for _op in REGISTRY.values():
    if not _op.internal:
        setattr(Graph, _op.name, _op.build)
