"""A large copy's bands taken in turn from a hand-out counter (megak/device/ops/copy.cuh),
stated in Python and run through interleavings of every thread of every taker, run after run.

The copy is lowered as T taker instructions, one per SM, all over one region of B bands. They
share a u32 hand-out counter `c` in device memory, which the host zeroes when it builds the
program and again after a failed run. Runs follow one another (a kernel or request boundary
between them, never overlapping); run number = epoch e = 0, 1, 2, ..., a good run moving the
next to e + 1 and a failed one back to 0.

  taker    a block of W threads; at iteration i = 0, 1, ...:
           1  thread 0: old = atomicAdd(c, 1) (one step), then (a step of its own) writes
              slot[i % 2] = old - e * (B + T) in u32 arithmetic. The counter is never reset
              between good runs (a reset would have to wait for every taker's last take: an
              order across the grid the megakernel does not have); instead every good run
              adds exactly B + T to it, so e * (B + T) is where run e starts. An `old` below
              that base wraps to a huge value, which reads as "no band left".
           2  a block barrier: every thread arrives, none passes until all have.
           3  every thread reads band = slot[i % 2]; band >= B: it leaves the loop (all read
              the same value, so the block leaves together); else it copies its share of the
              band and goes on to iteration i + 1.
           Every taker's last take is the one that finds no band left: T takes past the B
           bands, so a run adds B + T (the host's per-run target for this counter, by which
           its epoch wrap knows the count). Two broadcast slots make one barrier a take
           enough: thread 0 writes slot[(i + 1) % 2] only after passing barrier i, and every
           thread has read slot[(i - 1) % 2], the same word, before arriving at barrier i.
           With one slot, thread 0 may overwrite it before a slow thread has read it.
  unaligned  a run whose tensors are not 16-B aligned (`unaligned`): no taker takes; each
           copies its static share of the bands and thread 0 adds, in one add, its share of
           the run's count (taker 0: B + 1, the others 1): the run still adds B + T, so the
           next run, aligned or not, finds its base.
  failure  a run listed in `fail_after` fails (an error anywhere in it): once that many
           bands have been handed out in it, every thread of the run stops where it is (the
           kernel traps). The counter is left anywhere between the run's base and its end
           and the epoch is lost, so the host zeroes the counter and the next run is epoch 0.

Rules, numbered as `TakeViolation.rule` reports them:

  1  every band of every good run is copied exactly once, by all W threads of one taker;
  2  each thread reads, at iteration i, the value thread 0 wrote for iteration i;
  3  at the end of every good run the counter is (e + 1)(B + T);
  4  no deadlock, every taker ends.

Misuse switches (`TakeModel` arguments) change one step each; tests/runtime/test_take_model.py
shows each is caught.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..ops.copy import per_run_count
from .resident_model import PROGRESS, Actor, ModelViolation, interleave

U32 = 0xFFFF_FFFF

RULES = {
    1: "every band of a good run is copied once, by all threads of one taker",
    2: "each thread reads at iteration i what thread 0 wrote for iteration i",
    3: "a good run leaves the counter at (e + 1)(B + T)",
    4: "no deadlock, every taker ends",
}

__all__ = ["TakeModel", "TakeViolation", "per_run_count"]


class TakeViolation(ModelViolation):
    """A check failed; `rule` is its number in the module docstring."""
    rules = RULES


def _require(ok: bool, rule: int, message: str) -> None:
    if not ok:
        raise TakeViolation(rule, message)


class BlockBarrier:
    """__syncthreads for one block: the `threads`-th arrival opens it (a new generation)."""

    def __init__(self, threads: int):
        self.threads, self.arrived, self.generation = threads, 0, 0

    def arrive(self) -> int:
        """Arrive; returns the generation to wait past."""
        generation = self.generation
        self.arrived += 1
        if self.arrived == self.threads:
            self.arrived, self.generation = 0, generation + 1
        return generation


@dataclass
class TakeModel:
    """`takers` blocks of `threads` threads taking `bands` bands, `runs` runs in a row (see
    the module docstring). `fail_after` {run: takes}: that run fails, its threads stopped
    once `takes` takes have been handed out in it.

    `ahead`: take i + 1 is made while band i is copied, and its word written before the
    barrier that ends band i (device/ops/copy.cuh).

    `unaligned`: the runs whose tensors are not 16-B aligned: each taker copies its static
    share of the bands and thread 0 adds its share of the count in one add (taker 0 B + 1,
    the others 1), so the run still adds B + T.

    Misuse switches: `per_run` other than B + T (the base e * per_run), `slots=1` (one
    broadcast word, still one barrier a take), `epoch_base=False` (band = old),
    `zero_after_failure=False` (the run after a failed one starts from a stale counter),
    `unaligned_count=False` (an unaligned run's takers add 1 each, not their share)."""
    takers: int
    bands: int
    threads: int = 2
    runs: int = 3
    fail_after: dict = field(default_factory=dict)
    per_run: int | None = None
    slots: int = 2
    epoch_base: bool = True
    zero_after_failure: bool = True
    unaligned: frozenset = frozenset()
    unaligned_count: bool = True
    ahead: bool = False
    counter: int = 0
    epoch: int = 0
    actors: list = field(default_factory=list)
    copies: list = field(default_factory=list)   # per run: Counter of (band, taker, thread)
    failed: list = field(default_factory=list)   # the runs that failed

    def __post_init__(self):
        if self.per_run is None:
            self.per_run = per_run_count(self.takers, self.bands)

    # -- one taker's threads -----------------------------------------------------------------
    def _stopped_on_failure(self, steps):
        """The thread's steps until the run's failure stops every thread (a trap)."""
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

    def _share(self, run: int, taker: int, thread: int):
        """An unaligned run: the taker's static share of the bands, its count in one add."""
        if thread == 0:
            first = self.bands + 1 if taker == 0 and self.unaligned_count else 1
            self._take(first)
            yield PROGRESS
        for band in range(taker * self.bands // self.takers,
                          (taker + 1) * self.bands // self.takers):
            self.copies[run][(band, taker, thread)] += 1
            yield PROGRESS

    def _publish(self, old: int, i: int, base: int, slot: list, written: list):
        """Thread 0 writes take i's band into its word (one step)."""
        written.append((old - base) & U32)
        slot[i % self.slots] = written[i]
        yield PROGRESS

    def _thread(self, run: int, taker: int, thread: int, barrier: BlockBarrier,
                slot: list, written: list):
        """One thread's loop. Thread 0 takes band i and writes its word before barrier i;
        `ahead`: take 0 before the loop, take i + 1 while band i is copied, its word written
        before the barrier that ends band i."""
        base = (self.epoch * self.per_run) & U32 if self.epoch_base else 0
        if thread == 0 and self.ahead:
            old = self._take()
            yield PROGRESS
            yield from self._publish(old, 0, base, slot, written)
        i = 0
        while True:
            if thread == 0 and not self.ahead:
                old = self._take()
                yield PROGRESS
                yield from self._publish(old, i, base, slot, written)
            passed = barrier.arrive()
            yield PROGRESS
            while barrier.generation == passed:
                yield f"barrier {i}"
            band = slot[i % self.slots]
            _require(band == written[i], 2,
                     f"run {run}: taker {taker} thread {thread} reads {band} at iteration {i}, "
                     f"thread 0 wrote {written[i]} for it")
            yield PROGRESS
            if band >= self.bands:
                return
            if thread == 0 and self.ahead:
                old = self._take()
                yield PROGRESS
            self.copies[run][(band, taker, thread)] += 1
            yield PROGRESS
            if thread == 0 and self.ahead:
                yield from self._publish(old, i + 1, base, slot, written)
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
            barrier, slot, written = BlockBarrier(self.threads), [None] * self.slots, []
            for thread in range(self.threads):
                steps = (self._share(run, taker, thread) if run in self.unaligned
                         else self._thread(run, taker, thread, barrier, slot, written))
                self.actors.append(Actor(f"taker {taker} thread {thread}",
                                         self._stopped_on_failure(steps)))

    def _check_good_run(self, run: int) -> None:
        by_band: dict[int, list] = {}
        for (band, taker, thread), times in self.copies[run].items():
            by_band.setdefault(band, []).extend([(taker, thread)] * times)
        everyone = list(range(self.threads))
        for band in range(self.bands):
            who = sorted(by_band.get(band, []))
            takers = {taker for taker, _ in who}
            _require(len(takers) == 1 and [t for _, t in who] == everyone, 1,
                     f"run {run} (epoch {self.epoch}): band {band} copied by "
                     f"{who or 'nobody'} (taker, thread)")
        expected = ((self.epoch + 1) * per_run_count(self.takers, self.bands)) & U32
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
