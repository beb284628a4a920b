"""Decoding of the status record into exceptions (megak/errors.py), for records only the GPU's
loader warp writes."""
import pytest

from megak import abi
from megak.errors import MegakernelHang, raise_for_status


def _status(**fields):
    rec = {name: 0 for name in abi.STATUS_DTYPE.names}
    rec.update(abort=1, **fields)
    return rec


def _states(n_sm, **fields):
    states = [{name: 0 for name in abi.SM_STATE_DTYPE.names} for _ in range(n_sm)]
    for s in states:
        s["error"] = abi.ERRORS["MK_ERR_ABORTED"]
    states[0].update(fields)
    return states


def test_loader_waiting_for_its_own_sm_is_not_reported_as_a_counter():
    timeout = abi.ERRORS["MK_ERR_TIMEOUT"]
    rec = _status(error=timeout, sm=0, queue_index=7, opcode=abi.OPCODE_OF["gemm"], op_index=1)
    states = _states(2, error=timeout, queue_index=7, opcode=abi.OPCODE_OF["gemm"], op_index=1)
    with pytest.raises(MegakernelHang) as info:
        raise_for_status(rec, states, ["input", "gemm #1"], backend="cuda")
    msg = str(info.value)
    assert "previous instructions to finish (not a counter)" in msg
    assert "waited for counter" not in msg and "gemm #1" in msg


def test_counter_wait_names_the_counter():
    timeout = abi.ERRORS["MK_ERR_TIMEOUT"]
    rec = _status(error=timeout, sm=1, queue_index=2, opcode=abi.OPCODE_OF["copy"], op_index=0,
                  counter=5, expected=3, observed=2)
    with pytest.raises(MegakernelHang, match="waited for counter 5 to reach 3, observed 2"):
        raise_for_status(rec, _states(2), ["copy #0"], backend="cuda")
