"""A warp's A chunks in flight (megak/runtime/chunk_model.py, stating gemm_stream.cuh's
half-height chunks one turn ahead and the copied loop's ring of A slots) through seeded
random interleavings of the copies' landings: the loops as built keep the model's rules, and
each misuse switch, changing one step, is caught by the rule named."""
import random

import pytest

from megak.runtime.chunk_model import ChunkModel, ChunkViolation, copied_loop, rows8_loop
from megak.runtime.resident_model import RoundRobin
from megak.runtime.stream_model import RandomScheduler


def scheduler(seed: int):
    if seed % 5 == 0:
        return RoundRobin()
    return RandomScheduler(seed, spread=(0.3, 1.5, 3.0)[seed % 3])


def loops(seed: int, **misuse):
    """The two loops at 1-12 turns; the narrow band's last turn dead where its second box
    starts past K (one seed in three)."""
    rng = random.Random(seed)
    turns = rng.randint(1, 12)
    dead = frozenset({turns - 1}) if turns > 1 and rng.random() < 1 / 3 else frozenset()
    return [rows8_loop(turns, dead=dead, **misuse), copied_loop(turns, 1, **misuse),
            copied_loop(turns, 2, **misuse)]


@pytest.mark.parametrize("seed", range(300))
def test_the_loops_as_built_keep_every_rule(seed):
    for model in loops(seed):
        model.run(scheduler(seed))


def caught(seeds: int, **misuse) -> set[int]:
    rules = set()
    for seed in range(seeds):
        for model in loops(seed, **misuse):
            try:
                model.run(scheduler(seed))
            except ChunkViolation as exc:
                rules.add(exc.rule)
    return rules


@pytest.mark.parametrize("misuse", [
    {"wait": 2},                  # rows8: wait_group 2 lets this turn's chunk pend
    {"empty_commits": False},     # a turn with nothing to request commits no group
    {"ahead_into": "current"},    # the next chunk into the buffer this turn reads
], ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
def test_each_misuse_is_caught(misuse):
    assert caught(100, **misuse) == {1}


def test_a_lead_as_deep_as_the_ring_is_caught():
    # one turn further ahead than the buffers allow: the copy of chunk t + depth is on its
    # way into the buffer turn t reads
    rules = set()
    for seed in range(100):
        try:
            ChunkModel(6, depth=2, lead=2).run(scheduler(seed))
        except ChunkViolation as exc:
            rules.add(exc.rule)
    assert rules == {1}


def test_the_final_wait_guards_chunks_requested_past_the_last_turn():
    # as built, the last turns commit empty groups and every data group was waited for by
    # its own turn, so the loops end with nothing in flight even without the wait_all; a
    # loop that requests past its last turn (no "is there a next stage" test) leaves chunks
    # in flight, which only the wait_all lands before the pages go on
    assert caught(100, final_wait=False) == set()
    assert caught(100, bounded=False, final_wait=False) == {2}
    assert caught(100, bounded=False) == set()
