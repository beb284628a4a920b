"""The instruction ABI, read from ``megak/device/instr.h`` and nowhere else.

cffi parses the header (after dropping preprocessor lines), so every size, offset, opcode and
limit below comes from the same text NVRTC compiles. For speed, records are built as numpy
structured arrays whose dtype is derived from cffi's layout: encoding 100k instructions is one
``tobytes()``.
"""
from __future__ import annotations

import functools
from pathlib import Path

import cffi
import numpy as np

DEVICE_DIR = Path(__file__).resolve().parent / "device"
HEADER_PATH = DEVICE_DIR / "instr.h"


def header_cdef(text: str) -> str:
    """The header as cffi reads it: preprocessor lines dropped, nothing restated."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


@functools.lru_cache(maxsize=None)
def ffi() -> cffi.FFI:
    f = cffi.FFI()
    f.cdef(header_cdef(HEADER_PATH.read_text()))
    return f


def _enum(name: str) -> dict[str, int]:
    return dict(ffi().typeof(f"enum {name}").relements)


LIMITS = _enum("mk_limits")
OPCODES = _enum("mk_opcode")
ERRORS = _enum("mk_error")
FLAGS = _enum("mk_flags")
DTYPES = _enum("mk_dtype")
OPERANDS = _enum("mk_operand")
OP_SHAPES = _enum("mk_op_shapes")
OPERAND_MASKS = _enum("mk_op_operands")
RESIDENT = _enum("mk_resident_limits")
TRACE_PHASES = _enum("mk_trace_phase")
ACTIVATIONS = _enum("mk_activation")
BODIES = _enum("mk_bodies")

INSTR_BYTES = LIMITS["MK_INSTR_BYTES"]
MAX_WAITS = LIMITS["MK_MAX_WAITS"]
MAX_SIGNALS = LIMITS["MK_MAX_SIGNALS"]
MAX_TENSORS = LIMITS["MK_MAX_TENSORS"]
PAGE_BYTES = LIMITS["MK_PAGE_BYTES"]
MAX_PAGES = LIMITS["MK_MAX_PAGES"]
CONTROL_BYTES = LIMITS["MK_CONTROL_BYTES"]
PAGE_ALIGN = LIMITS["MK_PAGE_ALIGN"]
THREADS = LIMITS["MK_THREADS"]
BLOCK_THREADS = LIMITS["MK_BLOCK_THREADS"]
TENSOR_ALIGN_BYTES = LIMITS["MK_TENSOR_ALIGN_BYTES"]
SLOTS = LIMITS["MK_SLOTS"]
TMAP_BYTES = OP_SHAPES["MK_TMAP_BYTES"]
STREAM_BOX_COLS = OP_SHAPES["MK_STREAM_BOX_COLS"]
STREAM_BOX_ROWS = OP_SHAPES["MK_STREAM_BOX_ROWS"]

OP_NOP = OPCODES["MK_OP_NOP"]
OPCODE_NAMES = {v: k[len("MK_OP_"):].lower() for k, v in OPCODES.items() if k != "MK_OP_COUNT"}
OPCODE_OF = {name: code for code, name in OPCODE_NAMES.items()}   # "gemm" -> MK_OP_GEMM
ERROR_NAMES = {v: k for k, v in ERRORS.items()}

ARG_A = OPERANDS["MK_ARG_A"]
ARG_B = OPERANDS["MK_ARG_B"]
ARG_OUT = OPERANDS["MK_ARG_OUT"]

FLAG_DEBUG_LEAK_PAGE = FLAGS["MK_FLAG_DEBUG_LEAK_PAGE"]
FLAG_BIAS = FLAGS["MK_FLAG_BIAS"]
FLAG_RESIDUAL = FLAGS["MK_FLAG_RESIDUAL"]
FLAG_ACT_SHIFT = FLAGS["MK_FLAG_ACT_SHIFT"]
FLAG_ACT_MASK = FLAGS["MK_FLAG_ACT_MASK"]
FLAG_B_READY = FLAGS["MK_FLAG_B_READY"]
FLAG_CAUSAL = FLAGS["MK_FLAG_CAUSAL"]
FLAG_STREAM = FLAGS["MK_FLAG_STREAM"]
FLAG_WGMMA = FLAGS["MK_FLAG_WGMMA"]
FLAG_STREAM_NARROW = FLAGS["MK_FLAG_STREAM_NARROW"]
FLAG_STREAM_F32 = FLAGS["MK_FLAG_STREAM_F32"]
FLAG_COPY_TAKE = FLAGS["MK_FLAG_COPY_TAKE"]
BODY_GEMM_TILED = BODIES["MK_BODY_GEMM_TILED"]
BODY_GEMM_STREAM = BODIES["MK_BODY_GEMM_STREAM"]
BODY_GEMM_WGMMA = BODIES["MK_BODY_GEMM_WGMMA"]
BODY_STREAM_PACKED = BODIES["MK_BODY_STREAM_PACKED"]
BODY_COPY_TAKE = BODIES["MK_BODY_COPY_TAKE"]
# sm_state.counter of a poll of a flagged word past its deadline: this bit | the tensor slot
FLAG_WAIT = _enum("mk_flag_wait")["MK_FLAG_WAIT"]
DTYPE_F32_FLAG = DTYPES["MK_DTYPE_F32_FLAG"]
ARG_BIAS = OPERANDS["MK_ARG_BIAS"]
ARG_RESIDUAL = OPERANDS["MK_ARG_RESIDUAL"]
ARG_SPARE = OPERANDS["MK_ARG_SPARE"]

_NUMPY_SCALARS = {
    "unsigned short": np.uint16,
    "unsigned int": np.uint32,
    "int": np.int32,
    "unsigned long long": np.uint64,
}


@functools.lru_cache(maxsize=None)
def numpy_dtype(ctype: str) -> np.dtype:
    """A numpy structured dtype with exactly cffi's field offsets and item size."""
    f = ffi()
    t = f.typeof(ctype)
    names, formats, offsets = [], [], []
    for name, field in t.fields:
        ft = field.type
        if ft.kind == "array":
            item = ft.item
            base = numpy_dtype(item.cname) if item.kind == "struct" else _NUMPY_SCALARS[item.cname]
            formats.append((base, ft.length))
        elif ft.kind == "struct":
            formats.append(numpy_dtype(ft.cname))
        else:
            formats.append(_NUMPY_SCALARS[ft.cname])
        names.append(name)
        offsets.append(field.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": f.sizeof(t)})


INSTR_DTYPE = numpy_dtype("mk_instr")
TENSOR_DTYPE = numpy_dtype("mk_tensor")
PACKED_B_DTYPE = numpy_dtype("mk_packed_b")
STATUS_DTYPE = numpy_dtype("mk_status")
SM_STATE_DTYPE = numpy_dtype("mk_sm_state")
PARAMS_DTYPE = numpy_dtype("mk_params")
RUN_STATE_DTYPE = numpy_dtype("mk_run_state")
HOST_VIEW_DTYPE = numpy_dtype("mk_host_view")
REQUEST_DTYPE = numpy_dtype("mk_request")
RESIDENT_STATE_DTYPE = numpy_dtype("mk_resident_state")
RESIDENT_VIEW_DTYPE = numpy_dtype("mk_resident_view")
RESIDENT_ARGS_DTYPE = numpy_dtype("mk_resident_args")
TRACE_DTYPE = numpy_dtype("mk_trace_event")

if INSTR_DTYPE.itemsize != INSTR_BYTES:  # the header contradicts itself: refuse to run
    raise ImportError(f"instr.h: sizeof(mk_instr) = {INSTR_DTYPE.itemsize}, "
                      f"MK_INSTR_BYTES = {INSTR_BYTES}")


def tmap_offset(n: int) -> int:
    """Byte offset of the tensor maps in a tensor table of n entries (mk_tmap_offset): the
    entries rounded up to MK_TMAP_BYTES, so each CUtensorMap is 128-B aligned when the table
    is."""
    return -(-n * TENSOR_DTYPE.itemsize // TMAP_BYTES) * TMAP_BYTES


def ready_offset(n: int) -> int:
    """Byte offset of the u32 ready[n] flags that follow the n tensor maps."""
    return tmap_offset(n) + TMAP_BYTES * n


def table_bytes(n: int) -> int:
    """Bytes of a whole tensor table of n entries: entries, padding, maps, ready words; at
    least MK_TABLE_HEAD entries' worth and MK_TABLE_HEAD ready words (zero past n), which a
    launched block copies at its entry."""
    head = LIMITS["MK_TABLE_HEAD"]
    return max(ready_offset(n) + 4 * max(n, head), head * TENSOR_DTYPE.itemsize)


def empty_instrs(n: int) -> np.ndarray:
    return np.zeros(n, dtype=INSTR_DTYPE)


def own_counter(instrs: np.ndarray) -> np.ndarray:
    """Which records name a counter of their own in out_row0 (instr.h), one they add to and
    never wait on: a streamed band's part where the band has parts (MK_FLAG_STREAM, its
    combine), a copy's taker (MK_FLAG_COPY_TAKE, its hand-out). mk_validate checks that id
    like a wait's."""
    flags = instrs["flags"].astype(np.int64)
    parts = instrs["param"].astype(np.int64) >> 16
    return ((flags & FLAG_STREAM) != 0) & (parts > 1) | ((flags & FLAG_COPY_TAKE) != 0)


def encode(instrs: np.ndarray) -> bytes:
    """Instruction records -> the bytes both backends execute."""
    if instrs.dtype != INSTR_DTYPE:
        raise TypeError("encode() takes an array of INSTR_DTYPE")
    return np.ascontiguousarray(instrs).tobytes()


def decode(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """Bytes -> instruction records (a copy, safe to modify)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if buf.size % INSTR_BYTES:
        raise ValueError(f"{buf.size} bytes is not a whole number of {INSTR_BYTES}-byte records")
    return buf.view(INSTR_DTYPE).copy()


def encode_cffi(record: dict) -> bytes:
    """Encode one record through cffi itself (an independent path, used to test `encode`)."""
    f = ffi()
    p = f.new("mk_instr *")
    for key, value in record.items():
        if isinstance(value, (list, tuple, np.ndarray)):
            arr = getattr(p, key)
            for i, v in enumerate(value):
                arr[i] = int(v)
        else:
            setattr(p, key, int(value))
    return bytes(f.buffer(p))


def layout_asserts() -> str:
    """C++ static_asserts of every struct's size and field offsets, from cffi's layout.

    Compiled by NVRTC in the tests so the device can never read a record differently.
    """
    f = ffi()
    lines = ['#include "instr.h"']
    for ctype in ("mk_instr", "mk_tensor", "mk_sm_state", "mk_status", "mk_params",
                  "mk_trace_event", "mk_run_state", "mk_host_view", "mk_request",
                  "mk_resident_state", "mk_resident_view", "mk_resident_args"):
        t = f.typeof(ctype)
        lines.append(f'static_assert(sizeof({ctype}) == {f.sizeof(t)}, "sizeof {ctype}");')
        for name, field in t.fields:
            lines.append(f"static_assert(__builtin_offsetof({ctype}, {name}) == {field.offset},"
                         f' "{ctype}.{name}");')
    for enum in ("mk_limits", "mk_op_shapes", "mk_op_operands", "mk_trace_phase",
                 "mk_activation", "mk_opcode", "mk_error", "mk_flags", "mk_dtype",
                 "mk_operand", "mk_resident_limits"):
        for name, value in _enum(enum).items():
            lines.append(f'static_assert({name} == {value}, "{name}");')
    return "\n".join(lines) + "\n"
