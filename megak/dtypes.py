"""The element types megak supports, by name, with their numpy dtypes and ABI codes.

bfloat16 comes from ml_dtypes (numpy has no bfloat16); it is imported only when used, and
``bfloat16`` here (also ``megak.bfloat16``) is its numpy scalar type, as ``np.float32`` is
float32's: ``np.zeros(n, megak.bfloat16)``, ``x.astype(megak.bfloat16)``.
"""
from __future__ import annotations

import numpy as np

from . import abi

SUPPORTED = ("float32", "bfloat16")
ABI_CODE = {"float32": abi.DTYPES["MK_DTYPE_F32"], "bfloat16": abi.DTYPES["MK_DTYPE_BF16"]}
ITEMSIZE = {"float32": 4, "bfloat16": 2}
# rows of megak-owned buffers start MK_TENSOR_ALIGN_BYTES-aligned: this many elements
TENSOR_ALIGN_ELEMS = {name: abi.TENSOR_ALIGN_BYTES // size for name, size in ITEMSIZE.items()}
# a quiet-NaN bit pattern filling one 32-bit word (two bf16 NaNs side by side)
POISON_WORD = {"float32": 0x7FC00000, "bfloat16": 0x7FC07FC0}
# unit roundoff (half an ulp at 1.0): what one rounding to this dtype can cost, relatively
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}


def __getattr__(name: str):
    # a module attribute resolved on first use, so importing megak does not import ml_dtypes
    if name == "bfloat16":
        return numpy_dtype("bfloat16").type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def name_of(dtype) -> str | None:
    """megak's name for a numpy / torch / cupy dtype or a string, or None if unknown."""
    text = str(dtype)
    for prefix in ("torch.", "dtype('", "<class 'numpy."):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.rstrip("')>")
    if text in SUPPORTED:
        return text
    try:
        name = np.dtype(dtype).name
    except TypeError:
        return text or None
    return name
