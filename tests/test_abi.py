"""The ABI comes from instr.h alone; encode/decode round-trips; cffi and numpy agree."""
import numpy as np

from megak import abi


def test_constants_come_from_the_header():
    text = abi.HEADER_PATH.read_text()
    assert f"MK_INSTR_BYTES = {abi.INSTR_BYTES}" in text
    assert abi.INSTR_DTYPE.itemsize == abi.INSTR_BYTES == 128
    assert abi.PAGE_BYTES == 16384
    assert abi.ffi().sizeof("mk_instr") == abi.INSTR_BYTES
    assert set(abi.OPCODE_NAMES.values()) >= {"nop", "copy", "transpose", "gemm"}


def test_numpy_layout_matches_cffi():
    f = abi.ffi()
    for ctype, dt in [("mk_instr", abi.INSTR_DTYPE), ("mk_params", abi.PARAMS_DTYPE),
                      ("mk_status", abi.STATUS_DTYPE), ("mk_tensor", abi.TENSOR_DTYPE),
                      ("mk_sm_state", abi.SM_STATE_DTYPE)]:
        assert dt.itemsize == f.sizeof(ctype)
        for name, field in f.typeof(ctype).fields:
            assert dt.fields[name][1] == field.offset, (ctype, name)


def random_records(rng, n):
    rec = abi.empty_instrs(n)
    for name in abi.INSTR_DTYPE.names:
        base, shape = abi.INSTR_DTYPE.fields[name][0].base, abi.INSTR_DTYPE.fields[name][0].shape
        info = np.iinfo(base)
        rec[name] = rng.integers(info.min, info.max, size=(n, *shape), dtype=base,
                                 endpoint=True)
    return rec


def test_encode_decode_round_trip(rng):
    rec = random_records(rng, 50)
    data = abi.encode(rec)
    assert len(data) == 50 * abi.INSTR_BYTES
    back = abi.decode(data)
    assert back.tobytes() == data
    for name in abi.INSTR_DTYPE.names:
        np.testing.assert_array_equal(back[name], rec[name])


def test_numpy_encoding_equals_cffi_encoding(rng):
    rec = random_records(rng, 5)
    for r in rec:
        as_dict = {name: (r[name].tolist() if r[name].shape else int(r[name]))
                   for name in abi.INSTR_DTYPE.names}
        assert abi.encode_cffi(as_dict) == r.tobytes()


def test_decode_rejects_partial_records():
    import pytest
    with pytest.raises(ValueError, match="whole number"):
        abi.decode(b"\0" * 130)


def test_layout_asserts_cover_every_field():
    text = abi.layout_asserts()
    for name in abi.INSTR_DTYPE.names:
        assert f"__builtin_offsetof(mk_instr, {name})" in text
    assert "static_assert(MK_OP_GEMM == " in text
