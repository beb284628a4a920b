"""The wgmma stage ring's protocol model (megak/runtime/wgmma_model.py): the protocol as the
device runs it holds under random interleavings, and each misuse is caught by its rule."""
import pytest

from megak.runtime.resident_model import RandomScheduler, RoundRobin
from megak.runtime.wgmma_model import Misuse, RingViolation, WgmmaModel

QUEUES = [[1], [4], [5], [9, 1, 4], [12, 3, 7, 2], [2, 2, 2, 2, 2]]


@pytest.mark.parametrize("nk", QUEUES, ids=lambda q: "-".join(map(str, q)))
def test_protocol_holds(nk):
    for seed in range(40):
        WgmmaModel(nk).run(RandomScheduler(seed))
    WgmmaModel(nk).run(RoundRobin())


def caught(misuse: Misuse, nk=(9, 6, 5), seeds=200) -> set[int]:
    rules = set()
    for seed in range(seeds):
        try:
            WgmmaModel(list(nk), misuse=misuse).run(RandomScheduler(seed))
        except RingViolation as v:
            rules.add(v.rule)
    return rules


@pytest.mark.parametrize("misuse, rule", [
    (Misuse(refill_early=True), 1),       # a refill overwrites a stage still being read
    (Misuse(wrong_parity=True), 1),       # a wait passes before its stage landed
    (Misuse(release_early=True), 2),      # the next loader reinitialises in-use barriers
    (Misuse(init_early=True), 2),         # barriers initialised before the pages came back
    (Misuse(second_issuer=True), None),   # two issuers: caught, whichever rule fires first
    (Misuse(empty_count=7), 1),           # a slot refilled while the 8th warp reads it
], ids=["refill_early", "wrong_parity", "release_early", "init_early", "second_issuer",
        "empty_count_7"])
def test_misuse_is_caught(misuse, rule):
    rules = caught(misuse)
    assert rules, f"{misuse} was never caught"
    if rule is not None:
        assert rule in rules, (misuse, rules)


def test_misuse_defaults_are_the_protocol():
    assert Misuse() == Misuse(False, False, False, False, False, 8)
