"""megak: run a graph of tensor operations as one persistent megakernel on a Hopper GPU.

    import megak, numpy as np
    g = megak.Graph()
    a = g.input("a", (256, 128), "float32")
    b = g.input("b", (128, 64), "float32")
    g.output(g.transpose(g.gemm(a, b)), "y")
    prog = megak.compile(g)             # "cuda" when a GPU is usable, else the CPU simulator
    y = prog.run(a=..., b=...)["y"]
"""
from .bound import Bound
from .errors import GraphError, MegakernelError, MegakernelHang
from .graph import Graph, Tensor
from .program import BACKENDS, Program, compile, resolve_backend
from .resident import Request, Resident, resident
from .trace import Trace

__all__ = [
    "BACKENDS",
    "Bound",
    "Graph",
    "GraphError",
    "MegakernelError",
    "MegakernelHang",
    "Program",
    "Request",
    "Resident",
    "Tensor",
    "Trace",
    "bfloat16",
    "compile",
    "resident",
    "resolve_backend",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # megak.bfloat16, ml_dtypes' numpy type, resolved on first use like megak.dtypes does
    if name == "bfloat16":
        from . import dtypes
        return dtypes.bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
