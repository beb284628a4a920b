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


def caught(misuse: Misuse, nk=(9, 6, 5), seeds=200, chained=False) -> set[int]:
    rules = set()
    for seed in range(seeds):
        try:
            WgmmaModel(list(nk), misuse=misuse, chained=chained).run(RandomScheduler(seed))
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
    assert Misuse() == Misuse(False, False, False, False, False, 8, False, False, False, False)


# -- chained: one ring for the whole queue (the MK_WGMMA_ONLY kernel) --------------------------

# instructions of no stages (0): split-K reduces between tiles (or tiles of K = 0)
CHAINED = QUEUES + [[0, 3, 0, 5], [1, 1, 1, 1, 1, 1, 1], [4, 0, 0, 7, 0, 2, 0]]


@pytest.mark.parametrize("nk", CHAINED, ids=lambda q: "-".join(map(str, q)))
def test_chained_protocol_holds(nk):
    for seed in range(40):
        WgmmaModel(nk, chained=True).run(RandomScheduler(seed))
    WgmmaModel(nk, chained=True).run(RoundRobin())


def test_chained_ring_runs_ahead_across_instructions():
    """The point of the chain: an instruction's first stage is issued while the one before
    still computes (no restart at a tile boundary), which the per-instruction ring never
    does."""
    def ahead(chained):
        """Whether, at some step of a round-robin run, a copy of instruction 1 is in flight
        or landed while warps of instruction 0 still read its stages."""
        m = WgmmaModel([9, 9], chained=chained)
        sched, seen = RoundRobin(), False
        for _ in range(100_000):
            live = [a for a in m.actors if not a.done]
            if not live:
                return seen
            sched.pick(live).step()
            seen |= m.active_warps.get(0, 0) > 0 and any(
                a.name.startswith("copy 1.") for a in m.actors)
        raise AssertionError("no end")
    assert ahead(True) and not ahead(False)


@pytest.mark.parametrize("misuse, rule", [
    (Misuse(refill_early=True), 1),
    (Misuse(parity_from_kb=True), None),  # a wait passes early or never: rule 1 or 5
    (Misuse(keep_last=True), 5),          # the next instruction's refill waits forever
    (Misuse(init_each=True), 2),          # barriers initialised under copies in flight
    (Misuse(empty_count=7), 1),
    (Misuse(advance_idle=True), 5),       # a reduce moves the loader's ring: a warp waits
    #                                       on a slot its stage never lands in
], ids=["refill_early", "parity_from_kb", "keep_last", "init_each", "empty_count_7",
        "advance_idle"])
def test_chained_misuse_is_caught(misuse, rule):
    rules = caught(misuse, nk=(3, 9, 0, 6, 5, 0, 2), chained=True)
    assert rules, f"{misuse} was never caught"
    if rule is not None:
        assert rule in rules, (misuse, rules)


def test_b_pages_paired_for_any_12_of_13():
    """The loader's page arrangement (the wgmma-only kernel has the n256 k loop only): for
    every 12 of the H200's 13 pages, and 12 of up to 32 where at most two runs of pages are
    free, each stage's B pages are neighbours, and the table is a permutation of the pages."""
    import itertools
    import random
    from megak.runtime.wgmma_model import pair_b_pages
    cases = [sorted(set(range(13)) - {m}) for m in range(13)]
    rnd = random.Random(5)
    for _ in range(500):   # n pages, one instruction holds n - 12 in a row: two runs free
        n = rnd.randint(13, 32)
        held = rnd.randint(0, 12)
        cases.append([p for p in range(n) if not held <= p < held + n - 12])
    for _ in range(500):   # any 12 of 32
        cases.append(sorted(rnd.sample(range(32), 12)))
    for table in cases:
        out = pair_b_pages(table)
        assert sorted(out) == table
        runs = sum(1 for a, b in itertools.pairwise([-2] + table) if b != a + 1)
        if runs <= 2:
            assert all(out[3 * s + 2] == out[3 * s + 1] + 1 for s in range(4)), (table, out)
    scattered = list(range(0, 24, 2))                 # no two neighbours: left as it was
    assert pair_b_pages(scattered) == scattered
