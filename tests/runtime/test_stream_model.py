"""The weight stream's protocols (megak/runtime/stream_model.py, stating stream.cuh's ring of
pages and gemm_stream.cuh's cross-SM combine) driven through seeded random interleavings and
a few hand-written schedules: random queues (streamed and plain instructions, tensor maps
missing from the table), ring sizes from 1 page up, several invocations in a row, failures
of one warp or of the whole compute role; bands of 1-5 parts over several runs, failed runs
and a small wrap limit. Every run must keep the ten rules of the model's docstring; each
misuse switch, changing one step, must be caught by the rule named."""
import random
from collections import Counter

import numpy as np
import pytest

from megak import abi
from megak.runtime import stream_model as sm
from megak.runtime.stream_model import (CombineModel, CombineRun, Invocation, MBarrier, Priority,
                                        ProtocolViolation, RandomScheduler, Record, RingModel,
                                        RoundRobin)


def scheduler(seed: int):
    """Round robin for every fifth seed; otherwise random, with actor speeds spread from
    nearly even to far apart."""
    if seed % 5 == 0:
        return RoundRobin()
    return RandomScheduler(seed, spread=(0.3, 1.5, 3.0)[seed % 3])


# -- the weight ring --------------------------------------------------------------------------
def random_ring(seed: int, fail_rate: float = 0.2, **switches) -> RingModel:
    """1-4 invocations, each 1-6 instructions (70% flagged, 1-4 stages, B one of 3 tensors
    whose map the table may lack, one or two readers per stage, 30% holding the streamer
    through their tail), a ring of 1-5 or MAX_RING pages, and with `fail_rate` a failure of
    one warp or of the whole compute role at a random instruction (in its tail, for a
    holding one)."""
    rng = random.Random(seed)
    holding = random.Random(-1 - seed)   # its own stream: the worlds without holds stay put
    invocations = []
    for _ in range(rng.randint(1, 4)):
        ready = tuple(rng.random() < 0.8 for _ in range(3)) + (True,) * 3
        queue = tuple(Record(rng.random() < 0.7, rng.randrange(3), rng.randint(1, 4),
                             rng.choice((1, sm.READERS)), hold=holding.random() < 0.3)
                      for _ in range(rng.randint(1, 6)))
        fail = None
        if rng.random() < fail_rate:
            fail = (rng.choice((None, None, 0, 3, 7)), rng.randrange(len(queue)))
        invocations.append(Invocation(queue, ring=rng.choice((1, 1, 2, 3, 4, 5, sm.MAX_RING)),
                                      ready=ready, fail=fail))
    return RingModel(invocations, **switches)


def run_ring(model: RingModel, seed: int) -> sm.RingOutcome:
    try:
        return model.run(scheduler(seed))
    except ProtocolViolation as exc:
        pytest.fail(f"seed {seed}: {exc}")


def test_mbarrier_parity_follows_try_wait_parity():
    bar = MBarrier()
    bar.init(2)
    assert bar.try_wait(1) and not bar.try_wait(0)     # fresh: "phase -1" (parity 1) is done
    bar.arrive()
    assert not bar.try_wait(0)
    bar.arrive()
    assert bar.try_wait(0) and not bar.try_wait(1) and bar.phase == 1
    full = MBarrier()
    full.init(1)
    full.arrive(expect_tx=sm.PAGE_BYTES)               # the streamer's arrival alone: pending
    assert not full.try_wait(0)
    full.complete_tx(sm.PAGE_BYTES)                     # the copy's bytes complete the phase
    assert full.try_wait(0) and full.phase == 1


def test_the_ring_holds_in_200_random_interleavings():
    stopped, rings, invocations = Counter(), Counter(), 0
    for seed in range(200):
        model = random_ring(seed)
        outcome = run_ring(model, seed)
        for inv, issued, read, stop in zip(model.invocations, outcome.issued, outcome.read,
                                           outcome.stopped):
            invocations += 1
            rings[inv.ring] += 1
            stopped[stop] += 1
            if inv.fail is None:
                assert not stop and issued == read == len(inv.sequence())
            assert read <= issued <= len(inv.sequence())
        assert not model.truth.in_flight
    # the sweep reaches the stop path, many invocations in a row, R = 1 and R past the queue
    assert stopped[True] > 20 and stopped[False] > 200, stopped
    assert invocations > 400 and rings[1] > 50 and rings[sm.MAX_RING] > 20, rings


@pytest.mark.parametrize("ring", range(1, sm.MAX_RING + 1))
def test_every_ring_size_streams_a_long_queue(ring):
    queue = (Record(True, 0, 7), Record(), Record(True, 1, 1), Record(True, 0, 13),
             Record(True, 1, 9, readers=sm.READERS), Record(True, 0, 2))
    model = RingModel([Invocation(queue, ring=ring)] * 2)
    for seed in range(3):
        outcome = run_ring(RingModel(model.invocations), seed + 1)
        assert outcome.issued == outcome.read == [32, 32]


def test_a_stage_of_two_readers_is_read_by_both_before_its_slot_is_reused():
    """Warps 0-3 and 4-7 split each stage of a two-tile instruction: both read stage k (warps
    k % 4 and k % 4 + 4), and the streamer waits for both before the slot's next copy."""
    assert sm.owners(Record(True, 0, 8, readers=2), 5) == (1, 5)
    assert sm.owners(Record(True, 0, 8), 5) == (5,)
    assert [sm.readers_of(r) for r in (1, 16, 17, 32)] == [1, 1, 2, 2]
    # a narrow band's stage: two boxes stacked in k, one reader each
    narrow = abi.FLAG_STREAM | abi.FLAG_STREAM_NARROW
    assert sm.readers_of(16, narrow) == sm.boxes_of(narrow) == 2
    assert sm.boxes_of(abi.FLAG_STREAM) == 1
    queue = (Record(True, 0, 6, readers=2), Record(True, 1, 3))
    model = RingModel([Invocation(queue, ring=2)])
    outcome = model.run(Priority("block", "streamer", "copy*", "warp0", "warp1"))
    assert outcome.issued == outcome.read == [9]
    for pos in range(6):
        assert model.truth.reads[0, pos] == {pos % 4, pos % 4 + 4}
    with pytest.raises(ValueError):
        RingModel([Invocation((Record(True, 0, 1, readers=3),), ring=2)])


def test_a_program_without_a_ring_streams_nothing():
    plain = Invocation((Record(), Record(True, 1)), ring=0, ready=(True, False))
    outcome = run_ring(RingModel([plain, Invocation((Record(True),), ring=1), plain]), 0)
    assert outcome.issued == [0, 1, 0]
    with pytest.raises(ValueError):
        RingModel([Invocation((Record(True),), ring=0)])
    with pytest.raises(ValueError):
        RingModel([Invocation((Record(True),), ring=sm.MAX_RING + 1)])


def test_a_streamer_far_ahead_fills_the_ring_then_waits_for_every_warp():
    """The streamer and its copies go first: R stages land before any warp reads, then each
    new stage waits for the warp of the stage before it in its slot."""
    queue = (Record(True, 0, 5), Record(), Record(True, 1, 4))
    model = RingModel([Invocation(queue, ring=3)])
    outcome = model.run(Priority("block", "streamer", "copy*"))
    assert outcome.issued == outcome.read == [9]


def test_warps_far_ahead_wait_for_each_copy():
    queue = (Record(True, 0, 5), Record(True, 1, 2))
    model = RingModel([Invocation(queue, ring=2), Invocation(queue, ring=1)])
    outcome = model.run(Priority("block", "warp*", "streamer"))
    assert outcome.issued == outcome.read == [7, 7]


@pytest.mark.parametrize("who", [None, 0, 5])
def test_a_failure_stops_the_streamer_which_drains_its_copies(who):
    """The copies land last of all: the streamer, stopped in its empty wait, must wait for
    them before the block leaves and thread 0 initialises the barriers again."""
    queue = (Record(True, 0, 2), Record(True, 0, 6), Record(True, 1, 3))
    invocations = [Invocation(queue, ring=3, fail=(who, 1)), Invocation(queue, ring=2)]
    model = RingModel(invocations)
    outcome = model.run(Priority("block", "streamer", "warp*"))
    assert outcome.stopped == [True, False]
    # stages 0-2 fill the ring, then the warps run before the copies land. A failure of
    # warp 0 (or of the role, raised by warp 0) comes after warp 0 read stage 0, which lets
    # stage 3 go; warp 5 owns no stage of the first instruction and fails before any copy
    # landed. Either way the streamer stops in its next empty wait, and a warp polling
    # ring_stop leaves without its stage.
    assert outcome.issued[0] == (3 if who == 5 else 4) and outcome.read[0] <= 2
    assert outcome.issued[1] == outcome.read[1] == 11
    with pytest.raises(ProtocolViolation) as exc:
        RingModel(invocations, no_drain=True).run(Priority("block", "streamer", "warp*"))
    assert exc.value.rule == 3


def test_positions_restart_at_zero_without_reinit_only_on_even_phases():
    """Without the barriers' re-initialisation the next invocation meets the previous one's
    phases: harmless when each slot went through an even number of them (R the same, a
    multiple of 2 R stages), a stale page otherwise."""
    even = [Invocation((Record(True, 0, 4), Record(True, 1, 4)), ring=2)] * 3
    for seed in range(10):
        run_ring(RingModel(even, no_reinit=True), seed)
    odd = [Invocation((Record(True, 0, 3),), ring=2), Invocation((Record(True, 0, 4),), ring=2)]
    run_ring(RingModel(odd), 0)
    with pytest.raises(ProtocolViolation) as exc:
        RingModel(odd, no_reinit=True).run(Priority("block", "warp*"))
    assert exc.value.rule == 1 and "finds Page(invocation=0" in str(exc.value)


def ring_rules_broken(seeds, misuse: str, **world) -> Counter:
    """How often each rule caught `misuse` in the random worlds of `seeds` (the correct
    protocol passes in them: test_the_ring_holds_in_200_random_interleavings)."""
    caught = Counter()
    for seed in seeds:
        try:
            random_ring(seed, **world, **{misuse: True}).run(scheduler(seed))
        except ProtocolViolation as exc:
            caught[exc.rule] += 1
    return caught


@pytest.mark.parametrize("misuse, rules", [
    ("skip_empty_wait", {2, 3}),   # 3: more copies in flight than the drain waits for
    ("arrive_before_read", {2}),
    ("full_parity_off_by_one", {1, 4}),
    ("empty_parity_off_by_one", {2, 4}),
    ("no_reinit", {1, 2, 4}),
    ("streamer_ignores_ready", {5}),
    ("empty_count_per_warp", {4}),
    ("no_issued_word", {1}),
    ("reader_arrives_for_all", {2, 4}),   # 4: arrivals past the count jam the barrier
    ("hold_at_entry", {10}),
])
def test_each_ring_misuse_is_caught(misuse, rules):
    caught = ring_rules_broken(range(40), misuse)
    assert set(caught) <= rules and sum(caught.values()) >= 10, caught
    assert caught[min(rules)] > 0, caught


def test_every_lane_handing_the_page_back_holds_and_needs_its_count():
    """The build with the packed stream: every lane of a reader warp arrives on empty
    itself (stream.cuh, MK_RING_LANE_ARRIVALS), so empty expects READERS x lanes; a count
    of one a warp lets the streamer refill a page another lane still reads."""
    for seed in range(60):
        outcome = run_ring(random_ring(seed, lanes=2), seed)
        assert all(r <= i for r, i in zip(outcome.read, outcome.issued))
    caught = ring_rules_broken(range(40), "lane_count_for_warp", lanes=2)
    assert set(caught) <= {1, 2, 4} and sum(caught.values()) >= 10, caught
    assert caught[2] > 0, caught
    assert not ring_rules_broken(range(40), "lane_count_for_warp", lanes=1)   # lane 0 alone


@pytest.mark.parametrize("misuse, rule", [("no_drain", 3), ("silent_failure", 4)])
def test_each_ring_misuse_of_the_stop_path_is_caught(misuse, rule):
    caught = ring_rules_broken(range(40), misuse, fail_rate=1.0)
    assert set(caught) == {rule} and caught[rule] >= 5, caught


def test_a_hold_delays_copies_past_its_instruction_only():
    """A streamed instruction's tail holds the streamer (stream.cuh, "The hold"): with the
    streamer far ahead, it is held while the holding instruction's tail runs, then every
    stage is still issued and read, in every interleaving; holds() is the device's rule."""
    narrow = abi.FLAG_STREAM | abi.FLAG_STREAM_NARROW
    assert sm.holds(narrow) and sm.holds(abi.FLAG_STREAM) and not sm.holds(0)
    queue = (Record(True, 0, 3, readers=2, hold=True), Record(True, 1, 5, readers=2, hold=True),
             Record(), Record(True, 0, 2))
    held = 0
    for seed in range(30):
        model = RingModel([Invocation(queue, ring=3)] * 2)
        outcome = run_ring(model, seed)
        assert outcome.issued == outcome.read == [10, 10]
        assert not model.hold
        held += model.truth.held > 0
    assert held >= 5, held   # the streamer met a raised hold in that many interleavings


def test_a_hold_left_raised_by_a_failure_costs_a_deadline_not_a_hang():
    """The op gives up in a holding band's tail (the hold stays raised): the streamer's
    bounded wait, or ring_stop, lets it go on and drain; waiting for the hold to be lowered
    without either is a deadlock."""
    queue = (Record(True, 0, 3, hold=True), Record(True, 1, 4))
    failing = [Invocation(queue, ring=2, fail=(None, 0)), Invocation(queue, ring=2)]
    for seed in range(20):
        outcome = run_ring(RingModel(failing), seed)
        assert outcome.stopped == [True, False] and outcome.read[1] == 7
    # without ring_stop, the bounded wait alone: the stages past the hold need no page back
    last = (Record(True, 0, 3, hold=True), Record(True, 1, 1))
    outcome = RingModel([Invocation(last, ring=4, fail=(None, 0)), Invocation(last, ring=4)],
                        silent_failure=True).run(Priority("block", "warp*", "copy*", "streamer"))
    assert outcome.issued == [4, 4] and outcome.read[1] == 4
    with pytest.raises(ProtocolViolation, match="the hold lowered") as exc:
        RingModel(failing, hold_unbounded=True).run(Priority("block", "warp*", "copy*"))
    assert exc.value.rule == 4
    run_ring(RingModel([Invocation(queue, ring=2)], hold_unbounded=True), 1)


def test_the_deadlock_report_names_what_each_actor_waits_for():
    """A failing warp that does not raise ring_stop: the streamer waits for its arrival on
    empty, the other warps for a stage that will never be issued."""
    model = RingModel([Invocation((Record(True, 0, 4),), ring=1, fail=(0, 0))],
                      silent_failure=True)
    with pytest.raises(ProtocolViolation, match="streamer waits for empty.0. parity 0") as exc:
        model.run(RoundRobin())
    assert exc.value.rule == 4


# -- the cross-SM combine ---------------------------------------------------------------------
def random_combine(seed: int, fail_rate: float = 0.15, min_parts: int = 1,
                   **switches) -> CombineModel:
    """1-3 bands of 1-5 parts, 1-6 runs, with `fail_rate` a failed run (some parts of a band
    stop before their write, add or signal), and for half the seeds a wrap limit of 3-4
    runs."""
    rng = random.Random(seed)
    bands = tuple(rng.randint(min_parts, 5) for _ in range(rng.randint(1, 3)))
    runs = []
    for _ in range(rng.randint(1, 6)):
        fails = ()
        if rng.random() < fail_rate:
            b = rng.randrange(len(bands))
            fails = tuple((b, p, rng.choice(("write", "add", "signal")))
                          for p in rng.sample(range(bands[b]), rng.randint(1, bands[b])))
        runs.append(CombineRun(fails))
    limit = rng.choice((sm.WRAP_LIMIT, 3 * max(bands), 4 * max(bands)))
    return CombineModel(bands, runs, seed=seed, wrap_limit=limit, **switches)


def run_combine(model: CombineModel, seed: int) -> sm.CombineOutcome:
    try:
        return model.run(scheduler(seed))
    except ProtocolViolation as exc:
        pytest.fail(f"seed {seed}: {exc}")


def test_the_combine_holds_in_200_random_interleavings():
    seen = Counter()
    for seed in range(200):
        model = random_combine(seed)
        outcome = run_combine(model, seed)
        for r, run in enumerate(model.runs):
            for b in range(len(model.bands)):
                if not run.fails:      # a good run: every band has its output, read by its reader
                    assert outcome.outputs[r][b] == model.truth.expected[r, b]
                    assert model.truth.seen[r, b] == outcome.outputs[r][b]
            seen["failed" if run.fails else "good"] += 1
        seen["zeroed"] += outcome.zeroed > 0
        seen["epoch >= 3"] += max(outcome.epochs) >= 3
    assert seen["failed"] > 50 and seen["zeroed"] > 50 and seen["epoch >= 3"] > 20, seen


def test_the_output_bits_are_the_same_in_every_interleaving():
    runs = [CombineRun(), CombineRun(), CombineRun(((1, 2, "add"),)), CombineRun()]
    results = set()
    for seed in range(40):
        outcome = run_combine(CombineModel((5, 4), runs, seed=7), seed)
        results.add(tuple(tuple(r) for r in outcome.outputs))
    assert len(results) == 1
    (outputs,) = results
    assert outputs[2][1] is None and None not in outputs[2][:1] + outputs[3]


ORDER_MATTERS = {(0, 0, 0): 1e8, (0, 0, 1): 1.0, (0, 0, 2): -1e8}


def test_the_last_sums_in_part_order_whoever_arrives_last():
    """Parts arrive 2, 0, 1: part 1 is last and sums (1e8 + 1) - 1e8 = 0 in fp32; in arrival
    order it would be (-1e8 + 1e8) + 1 = 1."""
    assert sm.fixed_order_sum([1e8, 1.0, -1e8]) == 0
    order = Priority("finish", "b0.p2", "b0.p0", "b0.p1")
    model = CombineModel((3,), [CombineRun()], values=ORDER_MATTERS)
    outcome = model.run(order)
    assert outcome.outputs == [[int(np.float32(0.5).view(np.uint32))]]   # epilogue(0)
    with pytest.raises(ProtocolViolation) as exc:
        CombineModel((3,), [CombineRun()], values=ORDER_MATTERS, arrival_order=True).run(order)
    assert exc.value.rule == 8


def test_a_partial_not_yet_visible_is_caught():
    """Part 0's store lands after everything else: without the fence before its add, the
    last (part 1) reads no partial of part 0."""
    order = Priority("finish", "b0.p0", "b0.p1", "b0.reader")
    run_combine(CombineModel((2,), [CombineRun()]), 0)
    with pytest.raises(ProtocolViolation) as exc:
        CombineModel((2,), [CombineRun()], no_fence=True).run(order)
    assert exc.value.rule == 7 and "finds nothing" in str(exc.value)


def test_epochs_advance_restart_after_a_failure_and_before_the_wrap():
    runs = [CombineRun()] * 2 + [CombineRun(((0, 1, "signal"),))] + [CombineRun()] * 5
    outcome = run_combine(CombineModel((3, 2), runs, wrap_limit=9), 1)
    # zeroed after the failed run, and after the good run at epoch 2: epoch 3's targets,
    # 4 * 3, would pass the limit
    assert outcome.epochs == [0, 1, 2, 0, 1, 2, 0, 1]
    assert outcome.zeroed == 2
    outcome = run_combine(CombineModel((3,), [CombineRun()] * 6), 2)
    assert outcome.epochs == list(range(6)) and outcome.zeroed == 0


def test_a_last_test_without_the_epoch_finds_no_last_in_the_second_run():
    model = CombineModel((3,), [CombineRun(), CombineRun()], last_without_epoch=True)
    with pytest.raises(ProtocolViolation, match="run 1 .epoch 1., band 0: every part added, "
                                                "none was last") as exc:
        model.run(RoundRobin())
    assert exc.value.rule == 6


def combine_rules_broken(seeds, misuse: str, **world) -> Counter:
    caught = Counter()
    for seed in seeds:
        try:
            random_combine(seed, **world, **{misuse: True}).run(scheduler(seed))
        except ProtocolViolation as exc:
            caught[exc.rule] += 1
    return caught


@pytest.mark.parametrize("misuse, rules, world", [
    ("last_without_epoch", {6}, {}),
    ("partial_after_atomic", {7}, {}),
    ("no_fence", {7}, {}),
    ("arrival_order", {8}, {"min_parts": 3}),
    ("keep_counters_after_failure", {6, 7, 9}, {"fail_rate": 0.6}),
    ("signal_before_output", {9}, {}),
])
def test_each_combine_misuse_is_caught(misuse, rules, world):
    caught = combine_rules_broken(range(60), misuse, **world)
    assert set(caught) <= rules and sum(caught.values()) >= 15, caught
