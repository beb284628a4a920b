"""The resident kernel's protocol (megak/runtime/resident_model.py, stating megakernel.cu's
mk_relay / mk_take_request / mk_serve and resident.py's ResidentKernel) driven through
seeded random interleavings: random programs (blocks with and without work), planted
failures, a host that pauses long enough for the kernel to leave idle and launches it again,
a relay deadline that gives up on slow requests, launches for wider builds, and a final
close. Every run must keep the
five rules of the model's docstring; each misuse switch, breaking one rule, must be caught."""
import random
from collections import Counter

import pytest

from megak.runtime import resident_model as rm
from megak.runtime.resident_model import (CLOSED, FAILED, IDLE, LOST, Program, ProtocolViolation,
                                          RandomScheduler, ResidentModel, RoundRobin, close,
                                          pause, post, sync, wait_left, widen)


def random_model(seed: int, **overrides) -> ResidentModel:
    """A small random world: 2-5 blocks, 1-3 programs, 4-14 requests with pauses, syncs,
    waits for the kernel to leave and launches of wider builds, tiny ring and mirror so that both wrap many times."""
    rng = random.Random(seed)
    grid = rng.randint(2, 5)
    programs = [Program(tuple(rng.choice((0, 0, 1, 2)) for _ in range(rng.randint(1, grid))))
                for _ in range(rng.randint(1, 3))]
    script = []
    for _ in range(rng.randint(4, 14)):
        script.append(post(rng.randrange(len(programs)), fail=rng.random() < 0.04))
        r = rng.random()
        if r < 0.10:
            script.append(pause(rng.randint(1, 40)))
        elif r < 0.15:
            script.append(wait_left())
        elif r < 0.20:
            script.append(sync())
        elif r < 0.25:
            script.append(widen())
    if rng.random() < 0.8:
        script.append(close())
    options = dict(grid=grid, ring_slots=rng.choice((1, 2, 4)),
                   mirror_slots=rng.choice((1, 2, 3)), idle_steps=rng.randint(1, 30),
                   wait_steps=rng.choice((None, None, None, None, None, 30)))
    options.update(overrides)
    return ResidentModel(programs, script, **options)


def scheduler(seed: int):
    """Round robin for every fifth seed; otherwise random, with actor speeds spread from
    nearly even to far apart."""
    if seed % 5 == 0:
        return RoundRobin()
    return RandomScheduler(seed, spread=(0.3, 1.5, 3.0)[seed % 3])


def run(model: ResidentModel, seed: int) -> rm.Outcome:
    try:
        return model.run(scheduler(seed))
    except ProtocolViolation as exc:
        pytest.fail(f"seed {seed}: {exc}")


def test_the_protocol_holds_in_200_random_interleavings():
    reasons, launches = Counter(), Counter()
    for seed in range(200):
        outcome = run(random_model(seed), seed)
        reasons.update(reason for reason, _ in outcome.exits)
        launches[min(outcome.launches, 3)] += 1
        if outcome.stopped is not None:
            assert outcome.never_ran == [s for s in outcome.never_ran
                                         if s >= outcome.stopped[1]]
    # the sweep reaches every way out, and relaunches after idle exits
    assert all(reasons[r] > 0 for r in (CLOSED, IDLE, FAILED, LOST)), reasons
    assert launches[2] > 0 and launches[3] > 0, launches


@pytest.mark.parametrize("seed", range(5))
def test_the_real_ring_and_mirror_sizes(seed):
    model = random_model(seed, ring_slots=rm.RING_SLOTS, mirror_slots=rm.MIRROR_SLOTS)
    run(model, seed)


@pytest.mark.parametrize("seed", range(10))
def test_a_failed_request_stops_the_kernel_at_the_next_one(seed):
    programs = [Program((1, 1, 0)), Program((0,))]
    script = [post(0), post(1), post(0, fail=True), post(1), post(0), sync(), close()]
    model = ResidentModel(programs, script, grid=3, ring_slots=2, mirror_slots=2,
                          idle_steps=5)
    outcome = run(model, seed)
    assert outcome.stopped == (FAILED, 4)
    assert outcome.ran == [1, 2, 3] and outcome.never_ran == [4, 5]
    assert model.run_state[0].epoch == 0          # restarted after the failure
    assert not model.served(4) and model.served(3)


@pytest.mark.parametrize("seed", range(10))
def test_idle_exits_are_followed_by_relaunches_that_keep_serving(seed):
    programs = [Program((2, 1))]
    script = [post(0), wait_left(), post(0), post(0), wait_left(), post(0), close()]
    model = ResidentModel(programs, script, grid=2, ring_slots=2, mirror_slots=1,
                          idle_steps=3)
    outcome = run(model, seed)
    # the two waits make the kernel leave idle before requests 2 and 4; a host slow enough
    # against the relay (the widest speed spreads) lets it leave idle between posts too
    reasons = [reason for reason, _ in outcome.exits]
    assert reasons[-1] == CLOSED and set(reasons[:-1]) == {IDLE}
    idle_firsts = [first for reason, first in outcome.exits if reason == IDLE]
    assert {2, 4} <= set(idle_firsts) and idle_firsts == sorted(idle_firsts)
    assert outcome.ran == [1, 2, 3, 4] and outcome.stopped == (CLOSED, 5)
    assert model.run_state[0].epoch == 4 and model.run_state[0].ticket_done == 4


@pytest.mark.parametrize("seed", range(10))
def test_a_close_request_makes_the_relay_and_every_block_leave_at_it(seed):
    programs = [Program((1, 0, 3, 1))]
    script = [post(0)] * 6 + [close()]
    model = ResidentModel(programs, script, grid=4, ring_slots=4, mirror_slots=2,
                          idle_steps=10_000)
    run(model, seed)
    last = model.launches[-1]
    assert last.reason == CLOSED
    assert set(last.left_at.values()) == {7} and len(last.left_at) == 5


@pytest.mark.parametrize("seed", range(10))
def test_a_request_slower_than_the_relay_deadline_is_lost(seed):
    """The deadline counts relay steps: actors of even speed, so 40 steps of work outlast 5."""
    programs = [Program((40, 40))]
    script = [post(0), post(0), post(0), sync()]
    model = ResidentModel(programs, script, grid=2, ring_slots=4, mirror_slots=2,
                          idle_steps=1_000, wait_steps=5)
    outcome = model.run(RandomScheduler(seed, spread=0.0))
    reason, first_never_run = outcome.stopped
    assert reason == LOST and outcome.never_ran == list(range(first_never_run, 4))
    assert outcome.ran == list(range(1, first_never_run))   # the slow one still finished


@pytest.mark.parametrize("seed", range(10))
def test_a_wider_build_takes_over_after_a_close_and_serves_every_request(seed):
    programs = [Program((1, 0, 2)), Program((1, 1))]
    script = [post(0), post(1), widen(), post(0), post(1), widen(), post(0), close()]
    model = ResidentModel(programs, script, grid=3, ring_slots=2, mirror_slots=2,
                          idle_steps=10_000)
    outcome = run(model, seed)
    # requests 3 and 6 are the widenings' closes, 8 the final one
    assert outcome.exits == [(CLOSED, 3), (CLOSED, 6), (CLOSED, 8)]
    assert outcome.ran == [1, 2, 4, 5, 7] and outcome.never_ran == []
    assert outcome.stopped == (CLOSED, 8)
    assert model.run_state[0].ticket_done == 3 and model.run_state[1].ticket_done == 2


@pytest.mark.parametrize("seed", range(10))
def test_a_failure_before_a_widening_close_keeps_the_kernel_stopped(seed):
    programs = [Program((1, 1))]
    script = [post(0), post(0, fail=True), post(0), widen(), post(0), sync()]
    model = ResidentModel(programs, script, grid=2, ring_slots=4, mirror_slots=2,
                          idle_steps=10_000)
    outcome = run(model, seed)
    assert outcome.stopped == (FAILED, 3)
    # the last post is 5 after a widening's close (4), or 4 where the host saw the failure
    # first and widen() posted nothing
    assert outcome.ran == [1, 2] and outcome.never_ran == [3, model.next - 1]


def test_a_widening_that_clears_a_failures_stop_is_caught():
    """Request 3 never ran: request 5 then starts at an epoch the host did not predict (rule
    2), or the host counts request 3 served (rule 3)."""
    programs = [Program((1, 1))]
    script = [post(0), post(0, fail=True), post(0), widen(), post(0), sync()]
    widened = caught = 0
    for seed in range(10):
        def model(**misuse):
            return ResidentModel(programs, script, grid=2, ring_slots=4, mirror_slots=2,
                                 idle_steps=10_000, **misuse)
        correct = model()
        run(correct, seed)
        if correct.next != 6:
            continue    # the host saw the failure before widen(): no close, nothing to clear
        widened += 1
        with pytest.raises(ProtocolViolation) as exc:
            model(widen_clears_any_stop=True).run(scheduler(seed))
        caught += exc.value.rule in (2, 3)
    assert widened >= 8 and caught == widened


def test_block_activity_follows_mk_block_active():
    program = Program((0, 3, 0, 1))
    assert [program.active(b) for b in range(6)] == [True, True, False, True, False, False]
    assert program.n_active() == 3
    with pytest.raises(ValueError):
        ResidentModel([Program((1, 1, 1))], [], grid=2)


# -- each misuse is caught --------------------------------------------------------------------
def rules_broken(seeds, misuse: str, **overrides) -> Counter:
    """For each seed: the correct protocol passes, the same world with `misuse` switched on is
    run; returns how often each rule caught it."""
    caught = Counter()
    for seed in seeds:
        run(random_model(seed, **overrides), seed)
        try:
            random_model(seed, **overrides, **{misuse: True}).run(scheduler(seed))
        except ProtocolViolation as exc:
            caught[exc.rule] += 1
    return caught


def test_publishing_before_the_previous_request_closed_is_caught():
    assert rules_broken(range(30), "publish_before_close")[2] > 0


def test_reusing_a_mirror_slot_before_every_block_read_it_is_caught():
    assert rules_broken(range(30), "reuse_mirror_unchecked", mirror_slots=2)[1] > 0


def test_blocks_deciding_the_idle_exit_themselves_leave_at_different_requests():
    assert rules_broken(range(30), "blocks_decide_idle")[3] > 0


def test_reusing_a_ring_slot_the_relay_has_not_taken_is_caught():
    assert rules_broken(range(30), "reuse_ring_unchecked", ring_slots=2)[4] > 0


def test_taking_the_ring_entry_on_its_seq_alone_pairs_two_requests_words():
    """The relay's loads of one entry may be performed in any order: without the params
    word's tag it can take a word the host had not yet rewritten (the slot's previous
    request, or a fresh ring's zeros: a close) with the new seq."""
    assert rules_broken(range(40), "untagged_ring", ring_slots=2)[1] > 0


def test_taking_the_ring_entry_without_the_program_words_tags_pairs_two_programs():
    """A block reads its queue bounds and run state through the request's program words, not
    through params: without their tags the relay can pair a new params word with the program
    words of the slot's previous request (another program's, or a fresh ring's none)."""
    assert rules_broken(range(40), "untagged_program_words", ring_slots=2)[1] > 0


def test_a_host_that_does_not_relaunch_after_an_idle_exit_loses_requests():
    caught = rules_broken(range(30), "no_relaunch")
    assert caught[5] + caught[3] > 0, caught


def test_the_deadlock_report_names_what_each_actor_waits_for():
    """No relaunch after the first idle exit: the host waits for a ticket no one will
    reach."""
    programs = [Program((1,))]
    script = [post(0), wait_left(), post(0), sync()]
    model = ResidentModel(programs, script, grid=1, ring_slots=2, mirror_slots=1,
                          idle_steps=2, no_relaunch=True)
    with pytest.raises(ProtocolViolation, match="host waits for ticket 2 of request 2") as exc:
        model.run(RoundRobin())
    assert exc.value.rule == 5
