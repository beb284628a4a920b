"""The instruction slots' protocol model (megak/runtime/slot_model.py), with the paged
transpose's tile barriers and TMA stores: the protocol as the device runs it holds under
random interleavings, the loader gets its tiles ahead, and each misuse is caught by its rule."""
import pytest

from megak.runtime.resident_model import RandomScheduler, RoundRobin
from megak.runtime.slot_model import SLOTS, Instr, Misuse, SlotModel, SlotViolation

T = Instr(4, paged=True)   # a paged transpose: 4 pages, its tile copied in by the loader
TS = Instr(4, paged=True, signals=True)   # the same, its output read by a consumer
QUEUES = {
    "tiles": [T] * 9,
    "signalled": [TS, T, TS, TS, T, T, TS, T],
    "mixed": [T, Instr(12), T, Instr(0), Instr(4), T, T, Instr(13), T, Instr(0)],
    "no-pages": [Instr(0)] * 7,
}


@pytest.mark.parametrize("name", QUEUES)
@pytest.mark.parametrize("n_pages", [13, 4])
def test_protocol_holds(name, n_pages):
    queue = [i for i in QUEUES[name] if i.pages <= n_pages]
    for seed in range(60):
        SlotModel(queue, n_pages=n_pages).run(RandomScheduler(seed))
    SlotModel(queue, n_pages=n_pages).run(RoundRobin())


@pytest.mark.parametrize("stop_at", [0, 1, 4, 7])
def test_a_stop_leaves_no_copy_in_flight(stop_at):
    for seed in range(60):
        SlotModel(QUEUES["tiles"], stop_at=stop_at).run(RandomScheduler(seed))


def test_the_loader_fills_every_slot():
    """With 13 pages, some interleaving has every slot's tile in flight at once (4 pages a
    tile): the loader SLOTS - 1 records ahead of the compute threads, what the slots are for."""
    deepest = 0
    for seed in range(60):
        m = SlotModel(QUEUES["tiles"])
        real_copy = m._copy

        def copy(q, s, bar, m=m, real_copy=real_copy):
            nonlocal deepest
            deepest = max(deepest, sum(m.in_flight))
            yield from real_copy(q, s, bar)
        m._copy = copy
        m.run(RandomScheduler(seed))
    assert deepest == SLOTS


def caught(misuse: Misuse, queue=None, stop_at=None, seeds=200) -> set[int]:
    rules = set()
    for seed in range(seeds):
        try:
            SlotModel(queue or QUEUES["tiles"], stop_at=stop_at,
                      misuse=misuse).run(RandomScheduler(seed))
        except SlotViolation as v:
            rules.add(v.rule)
    return rules


@pytest.mark.parametrize("misuse, stop_at, rule", [
    (Misuse(short_count=True), None, 1),      # a thread runs a slot the loader has not filled
    (Misuse(refill_early=True), None, 1),     # a record overwritten while it runs
    (Misuse(no_tile_wait=True), None, 4),     # a tile read before it landed
    (Misuse(release_early=True), None, 3),    # a tile lands in pages a thread still reads
    (Misuse(no_drain=True), 2, 5),            # a stopped block's tile lands after it left
    (Misuse(store_early=True), None, 10),     # stores read pages not yet all written
    (Misuse(no_read_wait=True), None, 7),     # pages handed back while the stores read them
    (Misuse(no_written_wait=True), None, 8),  # a consumer signalled before the stores wrote
    (Misuse(no_store_drain=True), None, 9),   # a store writes after the invocation ended
], ids=["short_count", "refill_early", "no_tile_wait", "release_early", "no_drain",
        "store_early", "no_read_wait", "no_written_wait", "no_store_drain"])
def test_misuse_is_caught(misuse, stop_at, rule):
    # (a paged record's reads end at its own barrier, before thread 0 could hand its pages
    # back: an early hand-back shows on the records that read their pages up to the end)
    queue = QUEUES["mixed"] if misuse.release_early else QUEUES["signalled"]
    rules = caught(misuse, queue=queue, stop_at=stop_at)
    assert rule in rules, (misuse, rules)


def test_a_stop_waits_for_the_stores_issued():
    """A stop after signalled and unsignalled tiles: every store issued has written before the
    compute threads leave (rule 9 would catch one still in flight)."""
    for stop_at in (1, 3, 6):
        for seed in range(60):
            SlotModel(QUEUES["signalled"], stop_at=stop_at).run(RandomScheduler(seed))


def test_misuse_defaults_are_the_protocol():
    assert Misuse() == Misuse(*[False] * 9)
