"""Data as its own flag (megak/runtime/flag_model.py: 64-bit words of payload and stamp, a
stamp per invocation that only ever advances, consumers polling each word until its stamp is
theirs) driven through seeded random interleavings and hand-written schedules: random DAGs of
instructions on 2-6 SMs, 3-5 invocations in a row, failures injected part-way, stores that
land at steps of their own. Every run must keep the four rules of the model's docstring; each
misuse switch, changing one step, must be caught by the rule named."""
import random
from collections import Counter

import pytest

from megak.runtime import flag_model as fm
from megak.runtime.flag_model import (FlagModel, Instr, Invocation, Priority, Program,
                                      ProtocolViolation, RandomScheduler, RoundRobin,
                                      describe, next_stamp, payload, random_program)

U32 = fm.U32


def scheduler(seed: int):
    """Round robin for every fifth seed; otherwise random, with actor speeds (blocks and
    their stores) spread from nearly even to far apart."""
    if seed % 5 == 0:
        return RoundRobin()
    return RandomScheduler(seed, spread=(0.3, 1.5, 3.0)[seed % 3])


class Scripted:
    """Takes the named actors in turn, skipping a name whose actor cannot move; then round
    robin."""

    def __init__(self, *names: str):
        self._names = list(names)
        self._rest = RoundRobin()

    def pick(self, actors):
        while self._names:
            name = self._names.pop(0)
            for actor in actors:
                if actor.name == name:
                    return actor
        return self._rest.pick(actors)


def random_model(seed: int, fail_rate: float = 0.3, **switches) -> FlagModel:
    """random_program(seed), invoked 3-5 times; each invocation fails with `fail_rate`, at a
    random instruction of a random block."""
    program = random_program(seed)
    rng = random.Random(seed * 7919 + 1)
    invocations = []
    for _ in range(rng.randint(3, 5)):
        fail = None
        if rng.random() < fail_rate:
            b = rng.randrange(program.n_sm)
            fail = (b, rng.randrange(len(program.queues[b])))
        invocations.append(Invocation(fail))
    return FlagModel(program, invocations, **switches)


def run(model: FlagModel, sched, label) -> fm.FlagOutcome:
    try:
        return model.run(sched)
    except ProtocolViolation as exc:
        pytest.fail(f"{label}: {exc}")


def stamps_from(first: int, count: int) -> list[int]:
    out = [first]
    while len(out) < count:
        out.append(next_stamp(out[-1]))
    return out


# two SMs: sm0.0 writes word 0, sm1.0 polls it
PAIR = Program(((Instr((), (0,)),), (Instr((0,), ()),)))


# -- stamps, payloads, programs ---------------------------------------------------------------
def test_the_stamp_advances_by_one_and_skips_zero_at_the_wrap():
    assert next_stamp(1) == 2 and next_stamp(U32 - 1) == U32
    assert next_stamp(U32) == 1
    assert stamps_from(U32 - 1, 4) == [U32 - 1, U32, 1, 2]


def test_payloads_name_their_write_and_are_never_zero():
    names = {payload(n, (b, i), w) for n in range(4) for b in range(6) for i in range(3)
             for w in range(40)}
    assert len(names) == 4 * 6 * 3 * 40 and 0 not in names
    assert describe(payload(2, (3, 1), 7)) == "invocation 2's by sm3.1 for word 7"
    assert describe(0) == "0 (never written)"


def test_random_programs_follow_a_topological_order():
    sms = Counter()
    for seed in range(300):
        program = random_program(seed)
        program.validate()
        sms[program.n_sm] += 1
        assert all(program.queues) and program.polled()
    assert set(sms) == {2, 3, 4, 5, 6}, sms


@pytest.mark.parametrize("queues, what", [
    (((Instr((0,), ()), Instr((), (0,))),), "wait on each other"),       # polls before it writes
    (((Instr((1,), (0,)),), (Instr((0,), (1,)),)), "wait on each other"),  # a cycle across SMs
    (((Instr((), (0,)),), (Instr((), (0,)),)), "producers"),
    (((Instr((1,), ()),),), "never written"),
])
def test_programs_the_compiler_never_makes_are_refused(queues, what):
    with pytest.raises(ValueError, match=what):
        FlagModel(Program(queues), [Invocation()])


# -- the protocol holds -----------------------------------------------------------------------
def test_the_protocol_holds_in_250_random_interleavings():
    seen = Counter()
    for seed in range(250):
        model = random_model(seed)
        outcome = run(model, scheduler(seed), f"seed {seed}")
        program = model.program
        instrs = sum(len(q) for q in program.queues)
        polls = sum(len(ins.polls) for _, ins in program.instrs())
        count = len(model.invocations)
        # every invocation used the next stamp, failed or not, and all blocks agreed on it
        assert outcome.stamps == stamps_from(1, count)
        assert outcome.stamp == count + 1
        for n, inv in enumerate(model.invocations):
            assert outcome.failed[n] == (inv.fail is not None)
            if inv.fail is None:
                assert outcome.ran[n] == instrs and outcome.accepted[n] == polls
                assert not outcome.stopped[n]
            else:
                assert inv.fail[0] in outcome.stopped[n] and outcome.ran[n] < instrs
                seen["aborted polls"] += len(outcome.stopped[n]) - 1
            seen["failed" if inv.fail else "good"] += 1
        seen[f"sm{program.n_sm}"] += 1
    assert seen["failed"] > 150 and seen["good"] > 500 and seen["aborted polls"] > 50, seen
    assert all(seen[f"sm{n}"] > 20 for n in range(2, 7)), seen


@pytest.mark.parametrize("order", ["consumers first", "producers first", "stores last",
                                   "stores first"])
def test_the_protocol_holds_in_hand_written_schedules(order):
    """Blocks by rank (the last SM first, or the first), stores landing only when every
    block waits (or at their block's release), or at once."""
    for seed in range(30):
        model = random_model(seed)
        blocks = [f"sm{b}" for b in range(model.program.n_sm)]
        patterns = {"consumers first": ["relay"] + blocks[::-1],
                    "producers first": ["relay"] + blocks,
                    "stores last": ["relay", "sm?"],
                    "stores first": ["sm?.*", "relay"]}[order]
        run(model, Priority(*patterns), f"seed {seed}")


def test_stamps_cross_the_wrap_skipping_zero():
    for seed in range(20):
        program = random_program(seed)
        invocations = [Invocation(), Invocation((0, 0)), Invocation(), Invocation()]
        model = FlagModel(program, invocations, first_stamp=U32 - 1)
        outcome = run(model, scheduler(seed), f"seed {seed}")
        assert outcome.stamps == [U32 - 1, U32, 1, 2] and outcome.stamp == 3


def test_a_failure_stops_the_waiting_consumers_and_the_stamp_still_advances():
    """A chain sm0 -> sm1 -> sm2; in invocation 1 sm0 fails before its write: sm1 and sm2
    give up their polls on abort, the last block still closes the invocation."""
    chain = Program(((Instr((), (0,)),), (Instr((0,), (1,)),), (Instr((1,), ()),)))
    invocations = [Invocation(), Invocation((0, 0)), Invocation()]
    outcome = run(FlagModel(chain, invocations), Priority("relay", "sm2", "sm1", "sm0"), "")
    assert outcome.failed == [False, True, False]
    assert outcome.stopped == [[], [0, 1, 2], []]
    assert outcome.ran == [3, 0, 3] and outcome.accepted == [2, 0, 2]
    assert outcome.stamps == [1, 2, 3] and outcome.stamp == 4


# -- each misuse is caught --------------------------------------------------------------------
def rules_broken(seeds, switches: dict, **world) -> tuple[Counter, list[str]]:
    """Which rules caught the switches in the random worlds of `seeds` (the correct protocol
    passes in them: test_the_protocol_holds_in_250_random_interleavings), and the reports."""
    caught, reports = Counter(), []
    for seed in seeds:
        try:
            random_model(seed, **world, **switches).run(scheduler(seed))
        except ProtocolViolation as exc:
            caught[exc.rule] += 1
            reports.append(str(exc))
    return caught, reports


@pytest.mark.parametrize("switches, rules, world, report", [
    ({"torn_store": "payload_first"}, (1,), {}, "a torn word"),
    ({"torn_store": "stamp_first"}, (1,), {}, "a torn word"),
    ({"stamp_reset": True}, (1,), {"fail_rate": 0.7}, "a stale word"),
    ({"stamp_frozen": True}, (1,), {}, "a stale word"),
    ({"no_boundary": True}, (1, 3), {}, "a later invocation's word"),
    ({"two_producers": True}, (2, 1), {}, "which sm"),
    ({"unwritten_word": True}, (3,), {}, "waits for word"),
    ({"plain_by_flag": True}, (4,), {}, "plain datum"),
    ({"accept_newer": True, "no_boundary": True}, (1, 3), {}, "a later invocation's word"),
    ({"wrap_through_zero": True}, (1,), {"fail_rate": 1.0, "first_stamp": U32},
     "payload 0 (never written): a stale word"),
], ids=["torn_payload_first", "torn_stamp_first", "stamp_reset", "stamp_frozen", "no_boundary",
        "two_producers", "unwritten_word", "plain_by_flag", "accept_newer", "wrap_through_zero"])
def test_each_misuse_is_caught(switches, rules, world, report):
    """Within 60 random worlds: only the rules named, the first of them most of all, and a
    report that says what went wrong."""
    caught, reports = rules_broken(range(60), switches, **world)
    assert set(caught) <= set(rules) and caught[rules[0]] >= 10, caught
    assert caught.most_common(1)[0][0] == rules[0], caught
    assert any(report in r for r in reports), reports[:3]


def test_the_correct_variants_of_the_switches_pass():
    """The controls: plain data behind a release fence, and >= with the boundary (no newer
    stamp can exist), keep every rule."""
    for switches in ({"plain_by_flag": True, "fence_plain": True}, {"accept_newer": True}):
        caught, reports = rules_broken(range(80), switches)
        assert not caught, reports[:3]


@pytest.mark.parametrize("order", fm.TORN_ORDERS)
def test_a_torn_word_is_seen_between_its_halves(order):
    """The consumer polls first; the producer's two 32-bit stores are in flight and the stamp
    lands first: the consumer finds this stamp beside the allocation's payload."""
    schedule = ("sm1", "sm0.stamp", "sm0")
    run(FlagModel(PAIR, [Invocation()]), Priority(*schedule), order)
    with pytest.raises(ProtocolViolation, match="payload 0 .never written.: a torn word") as exc:
        FlagModel(PAIR, [Invocation()], torn_store=order).run(Priority(*schedule))
    assert exc.value.rule == 1


def test_a_restarted_stamp_meets_the_words_of_the_first_invocation():
    """Invocation 1 fails before sm0 writes: word 0 keeps invocation 0's stamp 1, which a
    restart after the failure hands to invocation 2."""
    invocations = [Invocation(), Invocation((0, 0)), Invocation()]
    schedule = ("relay", "sm1", "sm0")
    outcome = run(FlagModel(PAIR, invocations), Priority(*schedule), "")
    assert outcome.stamps == [1, 2, 3]
    with pytest.raises(ProtocolViolation, match="invocation 2 .stamp 1.: sm1.0 accepts word 0 "
                                                "with stamp 1 and payload invocation 0's") as exc:
        FlagModel(PAIR, invocations, stamp_reset=True).run(Priority(*schedule))
    assert exc.value.rule == 1


def test_a_frozen_stamp_accepts_the_previous_invocations_word():
    with pytest.raises(ProtocolViolation, match="invocation 1 .stamp 1.: .* a stale word") as exc:
        FlagModel(PAIR, [Invocation()] * 2, stamp_frozen=True).run(
            Priority("relay", "sm1", "sm0"))
    assert exc.value.rule == 1


def test_without_the_boundary_a_block_running_ahead_breaks_both_ways():
    """sm0 finishes invocation 0 and writes invocation 1's word while sm1 is still in
    invocation 0: with the stamp not yet advanced, sm1 accepts the later word (rule 1); once
    sm0's second arrival made it the last and it advanced the stamp, sm1 waits for stamp 1
    forever (rule 3). With the boundary the same schedules pass."""
    early = ("sm0",) * 6 + ("sm1",) * 3
    ahead = ("sm1",) + ("sm0",) * 40
    for schedule in (early, ahead):
        run(FlagModel(PAIR, [Invocation()] * 3), Scripted(*schedule), schedule)
    with pytest.raises(ProtocolViolation, match="accepts word 0 with stamp 1 and payload "
                                                "invocation 1's .*: a later invocation's") as exc:
        FlagModel(PAIR, [Invocation()] * 3, no_boundary=True).run(Scripted(*early))
    assert exc.value.rule == 1
    with pytest.raises(ProtocolViolation, match="sm1 waits for word 0 with stamp 1 .invocation "
                                                "0, sm1.0; it holds stamp 2.") as exc:
        FlagModel(PAIR, [Invocation()] * 3, no_boundary=True).run(Scripted(*ahead))
    assert exc.value.rule == 3


def test_accepting_a_newer_stamp_reads_the_next_invocations_data():
    """The schedule where == waits forever (above): >= takes invocation 2's word instead."""
    ahead = ("sm1",) + ("sm0",) * 40
    with pytest.raises(ProtocolViolation, match="invocation 0 .stamp 1.: sm1.0 accepts word 0 "
                                                "with stamp 2 and payload invocation 2's") as exc:
        FlagModel(PAIR, [Invocation()] * 3, no_boundary=True,
                  accept_newer=True).run(Scripted(*ahead))
    assert exc.value.rule == 1


def test_two_producers_of_a_word_are_caught_at_the_second_write():
    with pytest.raises(ProtocolViolation, match="invocation 0: sm1.0 writes word 0, which "
                                                "sm0.0 wrote already") as exc:
        FlagModel(PAIR, [Invocation()] * 3, two_producers=True).run(Priority("relay", "sm0"))
    assert exc.value.rule == 2


def test_a_word_nobody_writes_is_named_in_the_deadlock_report():
    chain = Program(((Instr((), (0,)), Instr((1,), ())), (Instr((0,), (1,)),)))
    with pytest.raises(ProtocolViolation, match="sm1 waits for word 0 with stamp 1") as exc:
        FlagModel(chain, [Invocation()] * 3, unwritten_word=True).run(RoundRobin())
    assert exc.value.rule == 3 and "sm0 waits for word 1 with stamp 1" in str(exc.value)


def test_a_plain_datum_is_not_ordered_by_the_flag():
    """The flagged store lands at once, the plain store before it is still in flight: the
    consumer that saw the flag reads the allocation's zero. A release fence between the two
    stores lands the plain one first."""
    schedule = ("relay", "sm1", "sm0.word", "sm0")
    run(FlagModel(PAIR, [Invocation()] * 3, plain_by_flag=True, fence_plain=True),
        Priority(*schedule), "fenced")
    with pytest.raises(ProtocolViolation, match="saw word 0's flag and reads its plain datum "
                                                "0 .never written.") as exc:
        FlagModel(PAIR, [Invocation()] * 3, plain_by_flag=True).run(Priority(*schedule))
    assert exc.value.rule == 4
