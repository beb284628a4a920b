"""The user's graph: tensors, ops and validation. Nothing here knows about tiles or SMs."""
from __future__ import annotations

from dataclasses import dataclass, field

from .dtypes import name_of
from .errors import GraphError

from .dtypes import SUPPORTED as SUPPORTED_DTYPES

ACTIVATIONS = (None, "relu", "gelu", "silu")


@dataclass(frozen=True, eq=False)
class Tensor:
    """A handle to a tensor of one graph: a graph input or the result of an op.

    Tensors are 2-D, or 1-D (n,) for vectors such as a GEMM bias, held as one row (1, n)."""
    graph: "Graph" = field(repr=False)
    index: int
    shape: tuple[int, ...]
    dtype: str
    producer: int | None  # op index, None for graph inputs
    name: str | None = None

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def __repr__(self) -> str:
        origin = f"input {self.name!r}" if self.producer is None else f"op #{self.producer}"
        return f"Tensor(t{self.index}, shape={self.shape}, dtype={self.dtype}, {origin})"


@dataclass(frozen=True, eq=False)
class Op:
    index: int
    kind: str
    inputs: tuple[Tensor, ...]
    output: Tensor
    attrs: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        args = ", ".join(f"t{t.index}" for t in self.inputs)
        return f"{self.kind} #{self.index} ({args} -> t{self.output.index})"


class Graph:
    """A graph of tensor operations, run as one megakernel by :func:`megak.compile`.

    >>> g = Graph()
    >>> a = g.input("a", (64, 32), "float32"); b = g.input("b", (32, 16), "float32")
    >>> g.output(g.transpose(g.gemm(a, b)), "y")
    """

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.inputs: dict[str, Tensor] = {}
        self.outputs: dict[str, Tensor] = {}

    # -- building ---------------------------------------------------------------------------
    def input(self, name: str, shape, dtype: str = "float32") -> Tensor:
        self._check_name(name, "input")
        shape = _check_shape(shape, f"input {name!r}")
        dtype = _check_dtype(dtype, f"input {name!r}")
        t = self._new_tensor(shape, dtype, None, name)
        self.inputs[name] = t
        return t

    def gemm(self, a: Tensor, b: Tensor, bias: Tensor | None = None,
             activation: str | None = None, residual: Tensor | None = None,
             out_dtype: str | None = None) -> Tensor:
        """``act(a @ b + bias) + residual`` for (M, K) @ (K, N), any positive sizes, in one
        fused instruction per output tile (fp32 accumulation; bf16 operands on tensor cores).

        bias: (N,) or (1, N); activation: None, "relu", "gelu" (tanh form) or "silu";
        residual: (M, N); out_dtype: "float32" or "bfloat16" (default: a's dtype).
        """
        for t, arg in ((a, "a"), (b, "b")):
            self._check_operand(t, "gemm", arg)
            if len(t.shape) != 2:
                raise GraphError(f"gemm: {arg} must be 2-D, got shape {t.shape}")
        if a.cols != b.rows:
            raise GraphError(f"gemm: inner dimensions differ: a is {a.shape}, b is {b.shape} "
                             f"(need a.shape[1] == b.shape[0])")
        if a.dtype != b.dtype:
            raise GraphError(f"gemm: dtypes differ: a is {a.dtype}, b is {b.dtype}")
        m, n = a.rows, b.cols
        inputs = [a, b]
        if bias is not None:
            self._check_operand(bias, "gemm", "bias")
            if bias.shape not in ((n,), (1, n)):
                raise GraphError(f"gemm: bias must have shape ({n},) or (1, {n}), got "
                                 f"{bias.shape}")
            inputs.append(bias)
        if activation not in ACTIVATIONS:
            raise GraphError(f"gemm: unknown activation {activation!r}; allowed: "
                             f"{', '.join(repr(x) for x in ACTIVATIONS)}")
        if residual is not None:
            self._check_operand(residual, "gemm", "residual")
            if residual.shape != (m, n):
                raise GraphError(f"gemm: residual must have shape ({m}, {n}), got "
                                 f"{residual.shape}")
            inputs.append(residual)
        out_dtype = a.dtype if out_dtype is None else _check_dtype(out_dtype, "gemm out_dtype")
        return self._add_op("gemm", tuple(inputs), (m, n), out_dtype, bias=bias is not None,
                            activation=activation, residual=residual is not None)

    def transpose(self, x: Tensor) -> Tensor:
        self._check_operand(x, "transpose", "x")
        _check_float32_only(x, "transpose")
        if len(x.shape) != 2:
            raise GraphError(f"transpose: x must be 2-D, got shape {x.shape}")
        return self._add_op("transpose", (x,), (x.cols, x.rows), x.dtype)

    def copy(self, x: Tensor) -> Tensor:
        self._check_operand(x, "copy", "x")
        _check_float32_only(x, "copy")
        return self._add_op("copy", (x,), x.shape, x.dtype)

    def output(self, x: Tensor, name: str) -> Tensor:
        self._check_operand(x, "output", "x")
        self._check_name(name, "output")
        self.outputs[name] = x
        return x

    # -- helpers ----------------------------------------------------------------------------
    def _new_tensor(self, shape, dtype, producer, name=None) -> Tensor:
        t = Tensor(self, len(self.tensors), shape, dtype, producer, name)
        self.tensors.append(t)
        return t

    def _add_op(self, kind: str, inputs: tuple[Tensor, ...], shape, dtype, **attrs) -> Tensor:
        index = len(self.ops)
        out = self._new_tensor(tuple(int(s) for s in shape), dtype, index)
        self.ops.append(Op(index, kind, inputs, out, attrs))
        return out

    def _check_operand(self, t, op: str, arg: str) -> None:
        if not isinstance(t, Tensor):
            raise GraphError(f"{op}: {arg} must be a megak Tensor of this graph, "
                             f"got {type(t).__name__}")
        if t.graph is not self:
            raise GraphError(f"{op}: {arg} ({t!r}) belongs to another Graph")

    def _check_name(self, name, what: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise GraphError(f"{what} name must be a Python identifier (it becomes a keyword "
                             f"of run()), got {name!r}")
        if name in self.inputs or name in self.outputs:
            raise GraphError(f"duplicate name {name!r}: input and output names must be unique")

    def validate(self) -> None:
        """Whole-graph checks made by compile()."""
        if not self.outputs:
            raise GraphError("the graph declares no outputs: call g.output(tensor, name)")


def _check_float32_only(x: Tensor, op: str) -> None:
    # the device's copy and transpose move 4-byte elements; bf16 there is future work
    if x.dtype != "float32":
        raise GraphError(f"{op}: dtype {x.dtype!r} is not supported by {op} yet; allowed: "
                         f"float32 (bfloat16 tensors feed and leave GEMMs)")


def _check_shape(shape, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise GraphError(f"{what}: shape must be a tuple of 1 or 2 positive ints, "
                         f"got {shape!r}") from None
    if len(dims) not in (1, 2):
        raise GraphError(f"{what}: megak tensors are 2-D (or 1-D vectors), got shape {dims!r}")
    out = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise GraphError(f"{what}: shape must hold ints, got {dims!r}")
        d = int(d)
        if d <= 0:
            raise GraphError(f"{what}: dimensions must be positive (no empty tensors), "
                             f"got {dims!r}")
        if d >= 2**31:
            raise GraphError(f"{what}: dimension {d} does not fit the 32-bit tile coordinates")
        out.append(d)
    return tuple(out)


def _check_dtype(dtype, what: str) -> str:
    name = name_of(dtype)
    if name not in SUPPORTED_DTYPES:
        raise GraphError(f"{what}: dtype {name!r} is not supported; allowed: "
                         f"{', '.join(SUPPORTED_DTYPES)}")
    return name
