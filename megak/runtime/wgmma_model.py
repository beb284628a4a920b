"""The wgmma GEMM's stage ring (megak/device/ops/gemm_wgmma.cuh), stated in Python and run
through interleavings, as resident_model.py, stream_model.py and flag_model.py do for the
other protocols.

The protocol, per SM, for a queue of wgmma tiles (instruction t has nk[t] k-blocks):
- **Pages**: the loader takes an instruction's 12 pages (4 ring slots) once the one before
  has handed its pages back; the compute role hands them back after its compute barrier:
  right after the k loop (an epilogue from registers) or after the staged epilogue.
- **Barriers**: per slot, full (1 arrival + the stage's bytes) and empty (one arrival per
  compute warp, 8). The loader initialises them for each instruction (invalidating the
  previous ones) after taking its pages and before handing the slot over.
- **Loader**: issues stage kb of instruction t into slot kb % 4: arrive.expect_tx on full,
  then the copy (in flight until it lands, in any order with other copies); stages 0..3 before
  the hand-over, stage kb >= 4 once empty[kb % 4] completed phase kb / 4 - 1 (every warp
  released stage kb - 4). Then on to the next instruction.
- **Compute warps** (8): after the hand-over, for each kb: wait until full[kb % 4] completed
  phase kb / 4, read the stage, arrive on empty[kb % 4] once the reads are done. Then the
  compute barrier (all 8), then the pages go back.

The model: actors (generators, one memory action per step) interleaved by a scheduler
(resident_model.interleave): the loader, one actor per compute warp, and one per copy in
flight (it lands when the scheduler picks it). Each slot's data says which (instruction,
k-block) last landed there. Rules, as `RingViolation.rule` reports them:

  1  a warp reads the stage it waits for: the slot holds (t, kb) when its full phase says
     so (a copy overwrote a stage still being read, or a wait passed too early);
  2  barriers are initialised only when unused: no copy in flight to them, no warp of an
     earlier instruction still reading, waiting or arriving;
  3  a copy lands only in pages its instruction still holds;
  4  every issued copy has landed before its instruction's pages go back;
  5  no deadlock, and every instruction completes (`interleave`).

`Misuse` switches make the model break one rule of the protocol on purpose, so the tests can
show that each is caught: refill without the empty wait, a wrong parity, pages back before
the compute barrier, the next instruction's barriers initialised before the pages came back,
a second issuer (what the op's own thread 0 does where there is no loader, if it also ran
where there is one), and an empty barrier expecting 7 arrivals.

**Chained** (`chained=True`: the MK_WGMMA_ONLY kernel, device/pages.cuh, where every
instruction is a wgmma tile): one ring for the whole queue. The first instruction's loader
takes the 12 pages and initialises the barriers; nobody hands pages back until the queue is
done (then thread 0, after the last compute barrier). Stages are numbered by ring position
across instructions: instruction t's k-block kb is position P_t + kb (P_t: the stages of the
instructions before it), in slot pos % 4, full phase pos / 4; the loader hands the slot over
first and then issues every stage of t, position pos >= 4 once empty[pos % 4] completed phase
pos / 4 - 1, so t's first stages are in flight while t - 1 still computes; the warps arrive
on empty for every stage, the last of each instruction included. An instruction of no
stages (nk = 0: a split-K reduce between two tiles, or a tile of K = 0) takes no position:
the ring stands still across it. Its misuses: the parity taken from kb instead of the
position, the last stage of an instruction never released, the barriers initialised again
for each instruction, and an instruction of no stages counted as a position by the loader.
"""
from __future__ import annotations

from dataclasses import dataclass

from .resident_model import Actor, ModelViolation, interleave

STAGES = 4
WARPS = 8


RULES = {
    1: "a warp reads the stage it waits for",
    2: "barriers are initialised only when unused",
    3: "a copy lands only in pages its instruction holds",
    4: "every copy has landed before the pages go back",
    5: "no deadlock, every instruction completes",
}


class RingViolation(ModelViolation):
    """A broken rule of the wgmma ring protocol (RULES, the module docstring)."""
    rules = RULES


@dataclass(frozen=True)
class Misuse:
    refill_early: bool = False       # the loader does not wait for empty before a refill
    wrong_parity: bool = False       # warps wait on full with the other phase's parity
    release_early: bool = False      # pages go back before the compute barrier
    init_early: bool = False         # the loader takes no pages before initialising
    second_issuer: bool = False      # compute thread 0 issues the stages too
    empty_count: int = WARPS         # arrivals an empty phase needs
    parity_from_kb: bool = False     # chained: parities from kb, not from the ring position
    keep_last: bool = False          # chained: the last stage of an instruction never released
    init_each: bool = False          # chained: barriers initialised again per instruction
    advance_idle: bool = False       # chained: the loader counts an instruction of no stages
    #                                  (a reduce) as one ring position


class Barrier:
    """An mbarrier: `count` arrivals (plus pending tx bytes, here: pending copies) complete a
    phase; `phase` counts completed phases."""

    def __init__(self, count: int):
        self.count, self.arrived, self.pending, self.phase = count, 0, 0, 0
        self.valid = True

    def arrive(self, tx: int = 0) -> None:
        self.arrived += 1
        self.pending += tx
        self._maybe_complete()

    def complete_tx(self) -> None:
        self.pending -= 1
        self._maybe_complete()

    def _maybe_complete(self) -> None:
        if self.arrived >= self.count and self.pending <= 0:
            self.arrived -= self.count
            self.pending = 0
            self.phase += 1

    def done(self, parity: int) -> bool:
        """try_wait.parity: the phase with this parity has completed (as the device reads
        the current phase bit: the last completed phase's parity differs from the current)."""
        return self.valid and (self.phase & 1) != parity


class WgmmaModel:
    def __init__(self, nk: list[int], *, misuse: Misuse = Misuse(), chained: bool = False):
        self.nk, self.misuse, self.chained = list(nk), misuse, chained
        self.first_pos = [sum(nk[:t]) for t in range(len(nk))]   # P_t (chained)
        self.full = [Barrier(1) for _ in range(STAGES)]
        self.empty = [Barrier(misuse.empty_count) for _ in range(STAGES)]
        self.slot = [None] * STAGES          # (t, kb) that last landed in the slot
        self.holder: int | None = None       # the instruction holding the pages
        self.handed = -1                     # the last instruction handed to the warps
        self.finished = [0] * len(nk)        # warps past their compute barrier, per t
        self.released = -1                   # the last instruction whose pages went back
        self.in_flight: dict[int, int] = {}  # copies in flight per instruction
        self.active_warps: dict[int, int] = {}   # warps of t between hand-over and barrier
        self.done_t: set[int] = set()
        self.actors = [Actor("loader", self._chained_loader() if chained else self._loader())]
        self.actors += [Actor(f"warp {w}", self._warp(w)) for w in range(WARPS)]
        if misuse.second_issuer:
            self.actors.append(Actor("thread 0 issuer", self._second_issuer()))

    def run(self, scheduler, max_steps: int = 200_000) -> int:
        steps = interleave(self, scheduler, max_steps, lambda m: RingViolation(5, m))
        if self.done_t != set(range(len(self.nk))):
            raise RingViolation(5, f"instructions {sorted(self.done_t)} of {len(self.nk)} done")
        return steps

    # -- the loader --------------------------------------------------------------------------
    def _init_barriers(self, t: int):
        busy = [u for u, n in self.in_flight.items() if n]
        readers = [u for u, n in self.active_warps.items() if n]
        if busy or readers:
            raise RingViolation(2, f"instruction {t}'s loader initialises the barriers while "
                                   f"copies of {busy} are in flight or warps of {readers} "
                                   f"still use them")
        for b in self.full + self.empty:
            b.valid = False
        self.full = [Barrier(1) for _ in range(STAGES)]
        self.empty = [Barrier(self.misuse.empty_count) for _ in range(STAGES)]

    def _issue(self, t: int, kb: int, pos: int | None = None):
        s = (kb if pos is None else pos) % STAGES
        bar = self.full[s]
        bar.arrive(tx=1)
        self.in_flight[t] = self.in_flight.get(t, 0) + 1
        self.actors.append(Actor(f"copy {t}.{kb}", self._copy(t, kb, s, bar)))

    def _copy(self, t: int, kb: int, s: int, bar: Barrier):
        yield f"copy ({t}, {kb}) in flight"
        if self.holder != ("ring" if self.chained else t):
            raise RingViolation(3, f"copy ({t}, {kb}) lands in pages instruction {t} no "
                                   f"longer holds")
        self.slot[s] = (t, kb)
        self.in_flight[t] -= 1
        if bar.valid:
            bar.complete_tx()

    def _loader(self):
        for t, nk in enumerate(self.nk):
            if not self.misuse.init_early:
                while self.holder is not None:       # the one before hands its pages back
                    yield f"instruction {t}'s pages"
            self._init_barriers(t)
            yield None
            if self.misuse.init_early:
                while self.holder is not None:
                    yield f"instruction {t}'s pages"
            self.holder = t
            for kb in range(min(STAGES, nk)):
                self._issue(t, kb)
                yield None
            self.handed = t
            yield None
            for kb in range(STAGES, nk):
                s, parity = kb % STAGES, (kb // STAGES - 1) & 1
                while not (self.misuse.refill_early or self.empty[s].done(parity)):
                    yield f"empty[{s}] phase {kb // STAGES - 1} of instruction {t}"
                self._issue(t, kb)
                yield None

    def _chained_loader(self):
        skew = 0   # positions the loader counted that the warps did not (advance_idle)
        for t, nk in enumerate(self.nk):
            if t == 0 or self.misuse.init_each:
                if t == 0:
                    self.holder = "ring"             # the queue's pages, taken once
                self._init_barriers(t)
                yield None
            self.handed = t                          # L7, then L8 issues every stage
            yield None
            if nk == 0 and self.misuse.advance_idle:
                skew += 1
            for kb in range(nk):
                pos = self.first_pos[t] + kb + skew
                s, parity = pos % STAGES, (pos // STAGES - 1) & 1
                while pos >= STAGES and not (self.misuse.refill_early
                                             or self.empty[s].done(parity)):
                    yield f"empty[{s}] phase {pos // STAGES - 1} (position {pos})"
                self._issue(t, kb, pos)
                yield None

    def _second_issuer(self):
        for t, nk in enumerate(self.nk):
            while self.handed < t:
                yield f"instruction {t} handed over"
            for kb in range(min(STAGES, nk)):
                self._issue(t, kb)
                yield None

    # -- the compute warps -------------------------------------------------------------------
    def _warp(self, w: int):
        for t, nk in enumerate(self.nk):
            while self.handed < t:
                yield f"instruction {t} handed over"
            self.active_warps[t] = self.active_warps.get(t, 0) + 1
            for kb in range(nk):
                pos = kb if not self.chained or self.misuse.parity_from_kb \
                    else self.first_pos[t] + kb
                s = (self.first_pos[t] + kb if self.chained else kb) % STAGES
                parity = ((pos // STAGES) & 1) ^ (1 if self.misuse.wrong_parity else 0)
                while not self.full[s].done(parity):
                    yield f"full[{s}] phase {pos // STAGES} of instruction {t}"
                if self.slot[s] != (t, kb):
                    raise RingViolation(1, f"warp {w} reads slot {s} for ({t}, {kb}) and "
                                           f"finds {self.slot[s]}")
                yield None   # the MMAs read the stage
                if self.slot[s] != (t, kb):
                    raise RingViolation(1, f"stage ({t}, {kb}) in slot {s} was overwritten "
                                           f"by {self.slot[s]} while warp {w} read it")
                if not (self.chained and self.misuse.keep_last and kb == nk - 1):
                    self.empty[s].arrive()
                yield None
            self.active_warps[t] -= 1
            if self.misuse.release_early:
                self._release(t)
            self.finished[t] += 1
            while self.finished[t] < WARPS:          # the compute barrier
                yield f"instruction {t}'s compute barrier"
            if w == 0:
                if not self.chained or t == len(self.nk) - 1:
                    self._release(t)
                self.done_t.add(t)
            yield None

    def _release(self, t: int):
        if self.released >= t:
            return
        flying = sum(self.in_flight.values()) if self.chained else self.in_flight.get(t, 0)
        if flying:
            raise RingViolation(4, f"instruction {t} hands its pages back with "
                                   f"{flying} copies in flight")
        self.released = t
        self.holder = None


def pair_b_pages(table: list[int]) -> list[int]:
    """The loader's arrangement of a wgmma instruction's 12 pages (mk_wgmma_pair_b_pages in
    gemm_wgmma.cuh, restated): `table` ascending as the allocator took them; back a table in
    which stage st's B pages (positions 3 st + 1, 3 st + 2) are neighbours, pairs taken from the
    start of each run of consecutive pages, or `table` unchanged where 4 pairs do not exist."""
    left, firsts = set(table), []
    while left and len(firsts) < STAGES:
        p = min(left)
        if p + 1 in left:
            firsts.append(p)
            left -= {p, p + 1}
        else:
            left.discard(p)
    if len(firsts) < STAGES:
        return list(table)
    singles = sorted(set(table) - set(firsts) - {p + 1 for p in firsts})
    out = []
    for st in range(STAGES):
        out += [singles[st], firsts[st], firsts[st] + 1]
    return out
