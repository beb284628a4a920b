"""Op registry: graph op kind -> module with lower(op), reference(*arrays), simulate(instr,
tensors), OPCODE and PAGES. Adding an op is one line here plus its own files."""
from . import copy, gemm, reduce, transpose

REGISTRY = {
    "copy": copy,
    "transpose": transpose,
    "gemm": gemm,
    "reduce": reduce,   # internal: the second half of a split-K GEMM (scheduler.expand)
}

BY_OPCODE = {module.OPCODE: module for module in REGISTRY.values()}
