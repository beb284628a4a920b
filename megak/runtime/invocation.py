"""How one megakernel invocation ends and how the host learns of it: the protocol between
megakernel.cu's ``mk_finish_invocation`` and the executor, stated once in Python.

Device side (``finish``): every active block (block 0 and each block with a non-empty queue;
the others leave at once), once both of its roles are done, counts itself in
``run_state.exited``; the last of the ``n_active`` closes the invocation: it copies a failed
invocation's status and per-SM states into the host view (unless an unread error is held
there), counts the failure, advances or restarts the epoch (zeroing the counters on an error,
or before the next epoch's targets could reach 2^31), resets the status record for the next
invocation, and last raises ``host_view.ticket_done`` to the launch's ticket (never lowers
it: a replayed CUDA graph carries the ticket of its capture; the device keeps its own copy in
``run_state.ticket_done`` so it never reads host memory back).

Host side (``HostView``): a launch is finished when ``ticket_done`` has reached its ticket
(wrap-safe); an error is pending while ``errors`` exceeds what the host has reported, and its
record is the one held under ``error_ticket``, which the host clears once read.

The fake GPU of tests/runtime/test_cuda_runtime.py runs ``finish`` after its kernel, and
tests/runtime/test_invocation.py drives it through the orders a GPU can produce (blocks in
any order, failures, replays, wraps), checking that no error is lost, no ticket is reported
before its invocation ended, and a good invocation never follows a failed one on stale
counters.
"""
from __future__ import annotations

import numpy as np

from .. import abi

_OK = abi.ERRORS["MK_OK"]
_ABORTED = abi.ERRORS["MK_ERR_ABORTED"]


def ticket_reached(done: int, ticket: int) -> bool:
    """``done`` has reached ``ticket`` (u32 tickets, wrap-safe like the device's test)."""
    return ((int(done) - int(ticket)) & 0xFFFFFFFF) < 0x80000000


def next_epoch(epoch: int, max_target: int) -> tuple[int, bool]:
    """The epoch after a good invocation, and whether the counters are zeroed first: the
    next invocation waits for (epoch + 1) * target, which must stay <= 2^31."""
    nxt = epoch + 1
    if (nxt + 1) * max(int(max_target), 1) > 2 ** 31:
        return 0, True
    return nxt, False


def finish(*, status, sm_state, run_state, host_view, host_sm_state, counters, n_active: int,
           epoch: int, max_target: int, ticket: int) -> bool:
    """One block's exit (numpy record views, as the device's memory). Returns True when this
    block was the last and closed the invocation."""
    run_state["exited"] += 1     # (the device skips the count when n_active is 1: same outcome)
    if int(run_state["exited"]) != n_active:
        return False
    error = int(status["error"])
    if error == _OK and int(status["finished_blocks"]) != n_active:
        error = _ABORTED          # stopped from outside: the host's watchdog
    if error != _OK:
        if int(host_view["error_ticket"]) == 0:
            for name in abi.STATUS_DTYPE.names:
                host_view["status"][name] = status[name]
            host_view["status"]["error"] = error
            host_sm_state[:] = sm_state
            host_view["error_ticket"] = ticket
        host_view["errors"] += 1
        zero, new_epoch = True, 0
    else:
        new_epoch, zero = next_epoch(epoch, max_target)
    if zero:
        counters[:] = 0
    status["abort"] = 0
    status["error"] = _OK
    status["finished_blocks"] = 0
    run_state["epoch"] = new_epoch
    run_state["exited"] = 0
    if not ticket_reached(int(run_state["ticket_done"]), ticket):
        run_state["ticket_done"] = ticket
    host_view["ticket_done"] = run_state["ticket_done"]
    return True


class HostView:
    """The host's reading of the mapped host view (and the failing invocation's SM states)."""

    _TICKET = abi.HOST_VIEW_DTYPE.fields["ticket_done"][1] // 4
    _ERRORS = abi.HOST_VIEW_DTYPE.fields["errors"][1] // 4

    def __init__(self, view: np.ndarray, sm_states: np.ndarray):
        self.view = view                  # abi.HOST_VIEW_DTYPE, shape (1,)
        self.sm_states = sm_states        # abi.SM_STATE_DTYPE, shape (n_sm,)
        self.reported = 0                 # errors the host has raised
        # the same memory as 32-bit words: a read is one index (the call path polls it)
        self.words = memoryview(view.view(np.uint8)).cast("I")

    def done(self, ticket: int) -> bool:
        return ((self.words[self._TICKET] - ticket) & 0xFFFFFFFF) < 0x80000000

    def detached(self, last_ticket: int) -> "HostView":
        """A copy in host memory, for when the mapped memory is about to be freed: what it
        held (an error not yet reported included), with every launch up to last_ticket
        finished."""
        copy = HostView(self.view.copy(), self.sm_states.copy())
        copy.view["ticket_done"] = last_ticket
        copy.reported = self.reported
        return copy

    def error_pending(self) -> bool:
        return self.words[self._ERRORS] != self.reported

    def take_error(self) -> tuple[dict, list[dict], int, int]:
        """(status record, SM states, its ticket, failures since the last report) of the
        held error; clears it so the device can hold the next one."""
        from ..errors import sm_states_to_dicts, status_to_dict
        v = self.view[0]
        errors = int(v["errors"])
        missed = errors - self.reported
        ticket = int(v["error_ticket"])
        record = status_to_dict(v["status"]) if ticket else {"error": _ABORTED}
        states = sm_states_to_dicts(self.sm_states) if ticket else []
        self.reported = errors
        v["error_ticket"] = 0
        return record, states, ticket, missed
