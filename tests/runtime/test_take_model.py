"""A large copy's bands taken from a hand-out counter (megak/runtime/take_model.py, stating
ops/copy.cuh's takers) through seeded random interleavings of every lane of every taker's
warps, run after run: the protocol as built keeps the model's rules, after failed runs too, and each
misuse switch, changing one step, is caught by the rule named."""
import random

import pytest

from megak.runtime.resident_model import RoundRobin
from megak.runtime.stream_model import RandomScheduler
from megak.runtime.take_model import TakeModel, TakeViolation, per_run_count


def scheduler(seed: int):
    if seed % 5 == 0:
        return RoundRobin()
    return RandomScheduler(seed, spread=(0.3, 1.5, 3.0)[seed % 3])


def shape(seed: int) -> dict:
    """1-3 takers of 1-3 warps, 1-6 bands (more warps than bands at times), 2-3 lanes, 1-4
    runs; one seed in three fails one run (not the last) after 0 .. B + W T takes; a run in
    four has tensors that are not 16-B aligned (static shares, one add a taker)."""
    rng = random.Random(seed)
    takers, warps, bands = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 6)
    runs = rng.randint(1, 4)
    fail_after = {}
    if runs > 1 and rng.random() < 1 / 3:
        fail_after[rng.randrange(runs - 1)] = rng.randint(0, bands + warps * takers)
    unaligned = frozenset(r for r in range(runs) if rng.random() < 1 / 4)
    return dict(takers=takers, bands=bands, warps=warps, lanes=rng.randint(2, 3), runs=runs,
                fail_after=fail_after, unaligned=unaligned)


@pytest.mark.parametrize("seed", range(200))
def test_the_protocol_as_built_keeps_every_rule(seed):
    model = TakeModel(**shape(seed))
    model.run(scheduler(seed))
    assert model.failed == sorted(model.fail_after)


@pytest.mark.parametrize("takers, bands, warps, lanes, runs, fail_after", [
    (1, 1, 1, 2, 3, {}),             # one taker of one warp, one band
    (1, 1, 4, 2, 3, {}),             # one band among a taker's warps
    (4, 1, 2, 3, 3, {}),             # B = 1 among several takers
    (3, 2, 2, 2, 4, {}),             # more warps than bands: most take nothing
    (2, 9, 2, 3, 4, {}),             # more bands than warps
    (3, 5, 2, 2, 5, {1: 3}),         # a run cut short mid-way, then epochs 0, 1, 2 again
    (3, 5, 1, 2, 4, {0: 8}),         # a failed run that handed out everything before failing
    (2, 4, 2, 3, 4, {0: 0, 2: 1}),   # a run failed before any take, another after one
], ids=str)
def test_shapes(takers, bands, warps, lanes, runs, fail_after):
    for seed in range(20):
        model = TakeModel(takers, bands, warps, lanes, runs, fail_after=dict(fail_after))
        model.run(scheduler(seed))
        for run, copies in enumerate(model.copies):
            if run not in fail_after:
                assert sorted({band for band, *_ in copies}) == list(range(bands))
        # the last run is good: the counter stands at the end of its epoch
        assert model.counter == model.epoch * per_run_count(takers, bands, warps)


def test_a_run_adds_b_plus_w_t():
    model = TakeModel(3, 5, warps=2, runs=4)
    model.run(RoundRobin())
    assert model.counter == 4 * per_run_count(3, 5, 2) == 4 * 11


def test_the_device_and_the_host_count_the_same_run():
    # the lowering's per-run target (megak/ops/copy.py) is the model's at the device's warps
    from megak.ops import copy
    for takers, bands in [(1, 2), (132, 131072), (3, 19)]:
        assert copy.per_run_count(takers, bands) == per_run_count(takers, bands, copy.TAKE_WARPS)


def caught(seeds: int, **misuse) -> set[int]:
    rules = set()
    for seed in range(seeds):
        try:
            TakeModel(**{**shape(seed), **misuse}).run(scheduler(seed))
        except TakeViolation as exc:
            rules.add(exc.rule)
    return rules


def caught_in_every_seed(seeds: int, config) -> set[int]:
    """The rules that catch a misuse in each of `seeds` seeds (each one must catch it);
    config(seed) gives the model's arguments, the misuse among them."""
    rules = set()
    for seed in range(seeds):
        try:
            TakeModel(**config(seed)).run(scheduler(seed))
        except TakeViolation as exc:
            rules.add(exc.rule)
        else:
            raise AssertionError(f"seed {seed}: {config(seed)} not caught")
    return rules


def test_a_base_without_the_overshoots_is_caught():
    # per_run = B: run 1 starts W T bands late (bands 0 .. W T - 1 never handed out)
    for takers, bands in [(1, 1), (3, 5), (5, 2)]:
        with pytest.raises(TakeViolation) as exc:
            TakeModel(takers, bands, runs=2, per_run=bands).run(RoundRobin())
        assert exc.value.rule in (1, 3)
    rules = caught_in_every_seed(60, lambda seed: {
        **shape(seed), "runs": 3, "fail_after": {}, "unaligned": frozenset(),
        "per_run": shape(seed)["bands"]})
    assert rules <= {1, 3} and rules


def test_a_base_counting_one_last_take_a_taker_is_caught():
    # per_run = B + T (a block's last take, not each warp's): with W > 1, run 1 starts late
    rules = caught_in_every_seed(60, lambda seed: {
        **shape(seed), "warps": 2 + seed % 2, "runs": 3, "fail_after": {},
        "unaligned": frozenset(), "per_run": shape(seed)["bands"] + shape(seed)["takers"]})
    assert rules <= {1, 3} and rules


def test_every_lane_taking_for_itself_is_caught():
    # no exchange: each lane adds to the counter and copies what it took
    assert caught(100, every_lane_takes=True) == {2}


def test_no_epoch_base_is_caught():
    # band = old: run 1's first take is already B + T, every taker leaves, nothing is copied
    for takers, bands in [(1, 1), (3, 5), (5, 2)]:
        with pytest.raises(TakeViolation) as exc:
            TakeModel(takers, bands, runs=2, epoch_base=False).run(RoundRobin())
        assert exc.value.rule == 1
    assert caught(60, epoch_base=False) == {1}


def test_a_stale_counter_after_a_failure_is_caught():
    # the failed run handed out 3 takes; the next, epoch 0 again, starts at band 3
    with pytest.raises(TakeViolation) as exc:
        TakeModel(3, 5, runs=2, fail_after={0: 3}, zero_after_failure=False).run(RoundRobin())
    assert exc.value.rule in (1, 3)
    rules = caught_in_every_seed(60, lambda seed: {
        **shape(seed), "runs": 2, "fail_after": {0: 1 + seed % 4}, "unaligned": frozenset(),
        "zero_after_failure": False})
    assert rules <= {1, 3} and rules


def test_a_failed_run_with_no_take_needs_no_zeroing():
    # nothing was handed out, so the stale counter is the zeroed one
    TakeModel(3, 5, runs=2, fail_after={0: 0}, zero_after_failure=False).run(RoundRobin())


def test_unaligned_runs_between_taken_ones_keep_the_count():
    for seed in range(40):
        model = TakeModel(takers=3, bands=5, warps=2, runs=5, unaligned=frozenset({1, 2}))
        model.run(scheduler(seed))
        assert model.counter == 5 * per_run_count(3, 5, 2)


def test_an_unaligned_run_adding_one_a_taker_is_caught():
    # the shares' adds forget the bands: the next run's base is B too low
    for seed in range(20):
        model = TakeModel(takers=3, bands=5, warps=2, runs=2, unaligned=frozenset({0}),
                          unaligned_count=False)
        with pytest.raises(TakeViolation) as exc:
            model.run(scheduler(seed))
        assert exc.value.rule in (1, 3)


@pytest.mark.parametrize("seed", range(200))
def test_taking_ahead_keeps_every_rule(seed):
    # the take for band i + 1 made while band i is copied, exchanged after it
    # (device/ops/copy.cuh)
    model = TakeModel(**shape(seed), ahead=True)
    model.run(scheduler(seed))
    assert model.failed == sorted(model.fail_after)


def test_taking_ahead_with_every_lane_taking_is_caught():
    assert caught(100, every_lane_takes=True, ahead=True) == {2}
