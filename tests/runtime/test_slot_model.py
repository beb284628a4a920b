"""The instruction slots' protocol model (megak/runtime/slot_model.py), with the paged
transpose's tile barriers: the protocol as the device runs it holds under random
interleavings, the loader gets two tiles ahead, and each misuse is caught by its rule."""
import pytest

from megak.runtime.resident_model import RandomScheduler, RoundRobin
from megak.runtime.slot_model import SLOTS, Instr, Misuse, SlotModel, SlotViolation

T = Instr(4, paged=True)   # a paged transpose: 4 pages, its tile copied in by the loader
QUEUES = {
    "tiles": [T] * 9,
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
], ids=["short_count", "refill_early", "no_tile_wait", "release_early", "no_drain"])
def test_misuse_is_caught(misuse, stop_at, rule):
    rules = caught(misuse, stop_at=stop_at)
    assert rule in rules, (misuse, rules)


def test_misuse_defaults_are_the_protocol():
    assert Misuse() == Misuse(False, False, False, False, False)
