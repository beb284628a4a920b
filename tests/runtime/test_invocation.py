"""The end-of-invocation protocol (megak/runtime/invocation.py, the device's
mk_finish_invocation) driven through the orders a GPU can produce: blocks of one invocation
exiting in any order, failures, CUDA graph replays carrying old tickets, epoch wraps, a host
that reads late. Invariants: a ticket is never reported before every block of its invocation
exited; no error is lost (each failure is counted, the first unread one held); the run after
a failure starts from zero counters at epoch 0; ticket_done never goes backwards."""
import numpy as np
import pytest

from megak import abi
from megak.runtime import invocation
from megak.runtime.invocation import HostView, finish, ticket_reached

OK = abi.ERRORS["MK_OK"]
TIMEOUT = abi.ERRORS["MK_ERR_TIMEOUT"]
ABORTED = abi.ERRORS["MK_ERR_ABORTED"]


class Device:
    """The device-side records of one program, as numpy records."""

    def __init__(self, n_sm: int, n_counters: int = 4, max_target: int = 3):
        self.n_sm, self.max_target = n_sm, max_target
        self.status = np.zeros(1, abi.STATUS_DTYPE)[0]
        self.sm_state = np.zeros(n_sm, abi.SM_STATE_DTYPE)
        self.run_state = np.zeros(1, abi.RUN_STATE_DTYPE)[0]
        self.view = np.zeros(1, abi.HOST_VIEW_DTYPE)
        self.host_sm = np.zeros(n_sm, abi.SM_STATE_DTYPE)
        self.counters = np.zeros(n_counters, np.uint32)
        self.host = HostView(self.view, self.host_sm)

    def invocation(self, ticket: int, rng, fail_sm: int | None = None, host_checks=()):
        """One invocation: blocks signal their counters, one may fail, then every block exits
        in a random order; `host_checks(k)` runs after the k-th exit (the host polling)."""
        epoch = int(self.run_state["epoch"])
        self.counters += 1                     # every counter gets its share of signals
        for sm in range(self.n_sm):
            self.sm_state[sm]["queue_index"] = 7
        if fail_sm is not None:
            self.status["abort"] = 1
            self.status["error"] = TIMEOUT
            self.status["sm"] = fail_sm
            self.sm_state[fail_sm]["error"] = TIMEOUT
        else:
            self.status["finished_blocks"] = self.n_sm
        closed = []
        for k, _sm in enumerate(rng.permutation(self.n_sm)):
            closed.append(finish(status=self.status, sm_state=self.sm_state,
                                 run_state=self.run_state, host_view=self.view[0],
                                 host_sm_state=self.host_sm, counters=self.counters,
                                 n_active=self.n_sm, epoch=epoch, max_target=self.max_target,
                                 ticket=ticket))
            for check in host_checks:
                check(k, closed[-1])
        assert closed.count(True) == 1 and closed[-1], "only the last block closes it"
        self.sm_state[:] = 0


@pytest.mark.parametrize("seed", range(20))
def test_a_ticket_is_reported_only_when_its_invocation_ended(seed):
    rng = np.random.default_rng(seed)
    dev = Device(n_sm=int(rng.integers(1, 9)))

    def not_before_the_end(k, closed, ticket):
        assert dev.host.done(ticket) == closed

    for ticket in range(1, 30):
        dev.invocation(ticket, rng, host_checks=[lambda k, c, t=ticket: not_before_the_end(k, c, t)])
        assert int(dev.run_state["epoch"]) == ticket % 2 ** 31
    assert not dev.host.error_pending()


def test_failures_are_counted_held_once_and_the_next_run_starts_clean():
    rng = np.random.default_rng(1)
    dev = Device(n_sm=4)
    dev.invocation(1, rng)
    dev.invocation(2, rng)
    assert int(dev.run_state["epoch"]) == 2 and (dev.counters == 2).all()
    dev.invocation(3, rng, fail_sm=2)
    # the run after a failure: zero counters, epoch 0, a clean status
    assert int(dev.run_state["epoch"]) == 0 and (dev.counters == 0).all()
    assert int(dev.status["error"]) == OK and int(dev.status["abort"]) == 0
    dev.invocation(4, rng, fail_sm=1)      # a second failure before the host read the first
    dev.invocation(5, rng)
    assert dev.host.done(5) and dev.host.error_pending()
    record, states, ticket, missed = dev.host.take_error()
    assert (ticket, missed, record["sm"], record["error"]) == (3, 2, 2, TIMEOUT)
    assert states[2]["error"] == TIMEOUT
    assert not dev.host.error_pending()
    dev.invocation(6, rng, fail_sm=0)      # the slot is free again: held
    record, _, ticket, missed = dev.host.take_error()
    assert (ticket, missed, record["sm"]) == (6, 1, 0)


def test_an_aborted_invocation_is_a_failure():
    rng = np.random.default_rng(2)
    dev = Device(n_sm=3)
    dev.status["abort"] = 1            # the host's watchdog: no block recorded an error
    dev.status["finished_blocks"] = 1
    epoch = int(dev.run_state["epoch"])
    for _ in range(3):
        finish(status=dev.status, sm_state=dev.sm_state, run_state=dev.run_state,
               host_view=dev.view[0], host_sm_state=dev.host_sm, counters=dev.counters,
               n_active=3, epoch=epoch, max_target=3, ticket=9)
    assert dev.host.done(9) and dev.host.error_pending()
    assert dev.host.take_error()[0]["error"] == ABORTED
    del rng


def test_replays_with_an_older_ticket_never_lower_ticket_done():
    rng = np.random.default_rng(3)
    dev = Device(n_sm=2)
    dev.invocation(10, rng)        # captured at ticket 10, then replayed after eager runs
    dev.invocation(11, rng)
    dev.invocation(12, rng)
    for _ in range(5):
        dev.invocation(10, rng)
        assert int(dev.view[0]["ticket_done"]) == 12
    dev.invocation(13, rng)
    assert dev.host.done(13) and int(dev.run_state["epoch"]) == 9   # every replay counts


def test_the_epoch_wraps_before_targets_could_pass_2_31():
    rng = np.random.default_rng(4)
    dev = Device(n_sm=2, max_target=1000)
    last = 2 ** 31 // 1000 - 1
    dev.run_state["epoch"] = last - 1
    dev.counters[:] = 5
    dev.invocation(1, rng)
    assert int(dev.run_state["epoch"]) == last and (dev.counters != 0).all()
    dev.invocation(2, rng)
    assert int(dev.run_state["epoch"]) == 0 and (dev.counters == 0).all()


def test_tickets_compare_across_the_u32_wrap():
    assert ticket_reached(5, 5) and ticket_reached(6, 5) and not ticket_reached(4, 5)
    assert ticket_reached(3, 0xFFFFFFFE)        # done wrapped past the ticket
    assert not ticket_reached(0xFFFFFFFE, 3)
    assert invocation.next_epoch(0, 0) == (1, False)


def test_a_host_that_skips_the_check_still_sees_the_error_later():
    """The misuse the protocol guards against: reading a ticket as good because a later
    invocation succeeded. The held error outlives any number of good runs."""
    rng = np.random.default_rng(5)
    dev = Device(n_sm=3)
    dev.invocation(1, rng, fail_sm=0)
    for t in range(2, 50):
        dev.invocation(t, rng)
    assert dev.host.done(1) and dev.host.error_pending()
    assert dev.host.take_error()[2] == 1


def test_a_detached_host_view_keeps_its_error_and_counts_every_launch_finished(rng):
    """What a closed executor reads instead of freed mapped memory: a copy in host memory
    with every launch up to the last finished, and the error it held still unreported."""
    dev = Device(n_sm=3)
    dev.invocation(1, rng)
    dev.invocation(2, rng, fail_sm=1)
    assert dev.host.error_pending() and not dev.host.done(3)
    copy = dev.host.detached(last_ticket=5)
    assert copy.done(5) and copy.done(4) and not copy.done(6)
    assert copy.error_pending()
    record, states, ticket, missed = copy.take_error()
    assert ticket == 2 and missed == 1 and states[1]["error"] == TIMEOUT
    assert not copy.error_pending()
    # the original is untouched (its memory is about to go; nothing reads it after)
    assert dev.host.error_pending() and not dev.host.done(3)
    dev.view["ticket_done"] = 0
    assert copy.done(5)
