"""A large copy's bands taken in turn from a hand-out counter (megak/device/ops/copy.cuh),
stated in Python and run through interleavings of every lane of every warp of every taker,
run after run.

The copy is lowered as T taker instructions, one per SM, all over one region of B bands. Each
taker's W warps take bands for themselves. They share a u32 hand-out counter `c` in device
memory, which the host zeroes when it builds the program and again after a failed run. Runs
follow one another (a kernel or request boundary between them, never overlapping); run number
= epoch e = 0, 1, 2, ..., a good run moving the next to e + 1 and a failed one back to 0.

  warp     L lanes; at iteration i = 0, 1, ...:
           1  lane 0: old = atomicAdd(c, 1) (one step). The counter is never reset between
              good runs (a reset would have to wait for every warp's last take: an order
              across the grid the megakernel does not have); instead every good run adds
              exactly B + W T to it, so e * (B + W T) is where run e starts.
           2  the exchange (__shfl_sync): every lane gets band = old - e * (B + W T) in u32
              arithmetic, the value lane 0 took for iteration i. A register exchange of the
              warp: no word another iteration could overwrite, so no barrier. An `old` below
              the base wraps to a huge value, which reads as "no band left".
           3  band >= B: the lane leaves the loop (all lanes hold the same value, so the warp
              leaves together); else it copies its share of the band and goes on to i + 1.
           Every warp's last take is the one that finds no band left: W T takes past the B
           bands, so a run adds B + W T (the host's per-run target for this counter, by which
           its epoch wrap knows the count).
           `ahead` (as built): take 0 before the loop, take i + 1 while band i is copied,
           exchanged after it.
  unaligned  a run whose tensors are not 16-B aligned (`unaligned`): no warp takes; each
           taker copies its static share of the bands and one lane adds, in one add, its
           share of the run's count (taker 0: B + W, the others W): the run still adds
           B + W T, so the next run, aligned or not, finds its base.
  failure  a run listed in `fail_after` fails (an error anywhere in it): once that many
           bands have been handed out in it, every lane of the run stops where it is (the
           kernel traps). The counter is left anywhere between the run's base and its end
           and the epoch is lost, so the host zeroes the counter and the next run is epoch 0.

Rules, numbered as `TakeViolation.rule` reports them:

  1  every band of every good run is copied exactly once, by all L lanes of one warp;
  2  each lane copies at iteration i the band its warp's lane 0 took for iteration i;
  3  at the end of every good run the counter is (e + 1)(B + W T);
  4  no deadlock, every warp ends.

Misuse switches (`TakeModel` arguments) change one step each; tests/runtime/test_take_model.py
shows each is caught.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .resident_model import PROGRESS, Actor, ModelViolation, interleave

U32 = 0xFFFF_FFFF

RULES = {
    1: "every band of a good run is copied once, by all lanes of one warp",
    2: "each lane copies at iteration i the band lane 0 took for iteration i",
    3: "a good run leaves the counter at (e + 1)(B + W T)",
    4: "no deadlock, every warp ends",
}

__all__ = ["TakeModel", "TakeViolation", "per_run_count"]


class TakeViolation(ModelViolation):
    """A check failed; `rule` is its number in the module docstring."""
    rules = RULES


def _require(ok: bool, rule: int, message: str) -> None:
    if not ok:
        raise TakeViolation(rule, message)


def per_run_count(takers: int, bands: int, warps: int) -> int:
    """What one good run adds to the counter: every band once, and each warp's last take."""
    return bands + warps * takers


@dataclass
class TakeModel:
    """`takers` blocks of `warps` warps of `lanes` lanes taking `bands` bands, `runs` runs in
    a row (see the module docstring). `fail_after` {run: takes}: that run fails, its lanes
    stopped once `takes` takes have been handed out in it.

    `ahead`: take i + 1 is made while band i is copied and exchanged after it
    (device/ops/copy.cuh).

    `unaligned`: the runs whose tensors are not 16-B aligned: each taker copies its static
    share of the bands and adds its share of the count in one add (taker 0 B + W, the others
    W), so the run still adds B + W T.

    Misuse switches: `per_run` other than B + W T (the base e * per_run), `epoch_base=False`
    (band = old), `zero_after_failure=False` (the run after a failed one starts from a stale
    counter), `unaligned_count=False` (an unaligned run's takers add 1 each, not their
    share), `every_lane_takes=True` (each lane adds to the counter and copies what it took:
    no exchange)."""
    takers: int
    bands: int
    warps: int = 2
    lanes: int = 2
    runs: int = 3
    fail_after: dict = field(default_factory=dict)
    per_run: int | None = None
    epoch_base: bool = True
    zero_after_failure: bool = True
    unaligned: frozenset = frozenset()
    unaligned_count: bool = True
    every_lane_takes: bool = False
    ahead: bool = False
    counter: int = 0
    epoch: int = 0
    actors: list = field(default_factory=list)
    copies: list = field(default_factory=list)   # per run: Counter of (band, taker, warp, lane)
    failed: list = field(default_factory=list)   # the runs that failed

    def __post_init__(self):
        if self.per_run is None:
            self.per_run = per_run_count(self.takers, self.bands, self.warps)

    # -- one warp's lanes ---------------------------------------------------------------------
    def _stopped_on_failure(self, steps):
        """The lane's steps until the run's failure stops every lane (a trap)."""
        while not self._trapped:
            try:
                waiting = next(steps)
            except StopIteration:
                return
            yield waiting

    def _take(self, add: int = 1) -> int:
        old = self.counter
        self.counter = (old + add) & U32
        self._taken += 1
        if self._taken >= self._take_limit:
            self._trapped = True
        return old

    def _share(self, run: int, taker: int, warp: int, lane: int):
        """An unaligned run: the taker's static share of the bands (copied here by each of its
        lanes), its count in one add by its first lane."""
        if warp == 0 and lane == 0:
            share = self.bands + self.warps if taker == 0 else self.warps
            self._take(share if self.unaligned_count else 1)
            yield PROGRESS
        for band in range(taker * self.bands // self.takers,
                          (taker + 1) * self.bands // self.takers):
            if warp == 0:
                self.copies[run][(band, taker, warp, lane)] += 1
                yield PROGRESS

    def _lane(self, run: int, taker: int, warp: int, lane: int, took: list):
        """One lane's loop. Lane 0 (every lane with `every_lane_takes`) takes band i, then the
        exchange (__shfl_sync: collective, no lane leaves it before lane 0 has come; each lane
        gets lane 0's take i, or, with `every_lane_takes`, keeps its own); `ahead`: take 0
        before the loop, take i + 1 while band i is copied."""
        base = (self.epoch * self.per_run) & U32 if self.epoch_base else 0
        takes = lane == 0 or self.every_lane_takes
        own: list = []                 # this lane's takes, by iteration
        i = 0
        while True:
            if takes and (not self.ahead or i == 0):
                own.append((self._take() - base) & U32)
                if lane == 0:
                    took.append(own[-1])
                yield PROGRESS
            while len(took) <= i:
                yield f"lane 0's take {i}"
            band = own[i] if self.every_lane_takes else took[i]
            yield PROGRESS
            _require(band == took[i], 2,
                     f"run {run}: taker {taker} warp {warp} lane {lane} copies band {band} at "
                     f"iteration {i}, lane 0 took {took[i]} for it")
            if band >= self.bands:
                return
            if takes and self.ahead:
                own.append((self._take() - base) & U32)
                if lane == 0:
                    took.append(own[-1])
                yield PROGRESS
            self.copies[run][(band, taker, warp, lane)] += 1
            yield PROGRESS
            i += 1

    # -- runs, one after another ---------------------------------------------------------------
    def _start(self, run: int) -> None:
        self._taken, self._trapped = 0, False
        self._take_limit = self.fail_after.get(run, float("inf"))
        if self._take_limit <= 0:
            self._trapped = True
        self.copies.append(Counter())
        self.actors = []
        for taker in range(self.takers):
            for warp in range(self.warps):
                took: list = []        # lane 0's takes, by iteration: what the exchange gives
                for lane in range(self.lanes):
                    steps = (self._share(run, taker, warp, lane) if run in self.unaligned
                             else self._lane(run, taker, warp, lane, took))
                    self.actors.append(Actor(f"taker {taker} warp {warp} lane {lane}",
                                             self._stopped_on_failure(steps)))

    def _check_good_run(self, run: int) -> None:
        by_band: dict[int, list] = {}
        for (band, taker, warp, lane), times in self.copies[run].items():
            by_band.setdefault(band, []).extend([(taker, warp, lane)] * times)
        everyone = list(range(self.lanes))
        for band in range(self.bands):
            who = sorted(by_band.get(band, []))
            warps = {(taker, warp) for taker, warp, _ in who}
            _require(len(warps) == 1 and [lane for _, _, lane in who] == everyone, 1,
                     f"run {run} (epoch {self.epoch}): band {band} copied by "
                     f"{who or 'nobody'} (taker, warp, lane)")
        expected = ((self.epoch + 1) * per_run_count(self.takers, self.bands, self.warps)) & U32
        _require(self.counter == expected, 3,
                 f"run {run} (epoch {self.epoch}) ends with the counter at {self.counter}, "
                 f"expected {expected}")

    def run(self, scheduler, max_steps: int = 100_000) -> int:
        steps = 0
        for run in range(self.runs):
            self._start(run)
            steps += interleave(self, scheduler, max_steps, lambda m: TakeViolation(4, m))
            if run in self.fail_after:
                self.failed.append(run)
                if self.zero_after_failure:
                    self.counter = 0
                self.epoch = 0
            else:
                self._check_good_run(run)
                self.epoch += 1
        return steps
