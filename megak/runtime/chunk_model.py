"""A warp's A chunks in flight (megak/device/ops/gemm_stream.cuh): cp.async groups over a ring
of shared-memory buffers, stated in Python and run through interleavings in which every copy
lands whenever it may.

Two k loops keep A this way, one warp each, nothing shared with the other warps:
mk_stream_kloop_ring_rows8 (a narrow band of at most 8 rows: two 2 KiB halves, the next
turn's chunk requested one turn ahead: depth 2, lead 1, wait 1) and mk_stream_kloop_copied
(no ring: a ring of D = 8 / P slots, D - 1 stages ahead: depth D, lead D - 1, wait D - 1).

  warp     before its first turn it requests chunks 0 .. lead - 1, chunk c into buffer
           c % depth, each committed as a group of its own (an empty group where there is
           no such chunk); at turn t = 0 .. n - 1 it requests chunk t + lead, where there is
           one, into buffer (t + lead) % depth, commits a group (empty where there is none:
           one group per turn, so that "at most `wait` pending" means "chunk t landed"),
           waits until every group but the `wait` most recent is complete
           (cp.async.wait_group), then
           reads buffer t % depth (ldmatrix: its registers are ready before the warp goes
           on, so a later copy into that buffer cannot change what it read). A dead turn (a
           narrow stage's second box past K, which the streamer did not copy) has no chunk:
           nothing requested, nothing read, its group still committed. After the last turn
           it waits for every group (cp.async.wait_all).
  copy     each requested chunk lands in one step of its own, in any order against the
           others: PTX orders groups only through wait_group (every group but the `wait`
           most recent ones complete).

Rules, numbered as `ChunkViolation.rule` reports them:

  1  turn t reads chunk t, landed, with no copy of another chunk in flight into its buffer;
  2  no copy is in flight into the buffers once the loop has ended (the pages go on to the
     reduce and to the next instruction);
  3  no deadlock.

Misuse switches (`ChunkModel` arguments) change one step each; tests/runtime/test_chunk_model.py
shows each is caught.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .resident_model import PROGRESS, Actor, ModelViolation, interleave

RULES = {
    1: "turn t reads chunk t, landed, and nothing else is on its way into its buffer",
    2: "nothing is in flight into the buffers after the loop",
    3: "no deadlock",
}

__all__ = ["ChunkModel", "ChunkViolation", "copied_loop", "rows8_loop"]


class ChunkViolation(ModelViolation):
    """A check failed; `rule` is its number in the module docstring."""
    rules = RULES


def _require(ok: bool, rule: int, message: str) -> None:
    if not ok:
        raise ChunkViolation(rule, message)


@dataclass(eq=False)
class Copy:
    chunk: int
    buffer: int
    landed: bool = False


@dataclass
class ChunkModel:
    """One warp's `turns` turns over `depth` buffers (see the module docstring).

    Misuse switches: `wait` other than `lead` (the device's wait_group immediate),
    `empty_commits=False` (a turn with no chunk to request commits no group), `ahead_into`
    "current" (the next chunk into the buffer this turn reads), `final_wait=False`,
    `bounded=False` (the request's "is there a next stage" test dropped: chunks past K)."""
    turns: int
    depth: int
    lead: int
    wait: int | None = None
    empty_commits: bool = True
    ahead_into: str = "own"          # "own": buffer (t + lead) % depth; "current": t % depth
    final_wait: bool = True
    bounded: bool = True             # False: chunk t + lead requested past the last turn too
    dead: frozenset = frozenset()    # turns with nothing to read (a box past K): no copy
    actors: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    groups: list = field(default_factory=list)
    reads: list = field(default_factory=list)

    def __post_init__(self):
        if self.wait is None:
            self.wait = self.lead
        self.buffers = [None] * self.depth     # the chunk whose copy landed last there
        self.actors = [Actor("warp", self._warp())]

    # -- the copies -----------------------------------------------------------------------
    def _request(self, chunk: int, buffer: int, staged: list) -> None:
        copy = Copy(chunk, buffer)
        staged.append(copy)
        self.actors.append(Actor(f"copy{chunk}", self._land(copy)))

    def _land(self, copy: Copy):
        self.buffers[copy.buffer] = copy.chunk
        copy.landed = True
        yield PROGRESS

    def _waited(self, n: int) -> bool:
        """cp.async.wait_group n may return: every group but the n most recent is complete
        (every copy of it landed; an empty group is complete)."""
        older = self.groups[:len(self.groups) - n] if n else self.groups
        return all(c.landed for g in older for c in g)

    def _in_flight(self) -> list[Copy]:
        return [c for g in self.groups for c in g if not c.landed]

    # -- the warp -------------------------------------------------------------------------
    def _commit(self, staged: list) -> None:
        self.groups.append(list(staged))
        staged.clear()

    def _warp(self):
        staged: list[Copy] = []
        for c in range(self.lead):
            if c < self.turns and c not in self.dead:
                self._request(c, c % self.depth, staged)
            if (c < self.turns and c not in self.dead) or self.empty_commits:
                self._commit(staged)
            yield PROGRESS
        for t in range(self.turns):
            ahead = t + self.lead
            wanted = (ahead < self.turns or not self.bounded) and ahead not in self.dead
            if wanted:
                into = ahead if self.ahead_into == "own" else t
                self._request(ahead, into % self.depth, staged)
            if wanted or self.empty_commits:
                self._commit(staged)
            yield PROGRESS
            while not self._waited(self.wait):
                yield "wait_group"
            if t in self.dead:
                continue
            buffer = t % self.depth
            _require(self.buffers[buffer] == t, 1,
                     f"turn {t} reads buffer {buffer} holding chunk {self.buffers[buffer]}")
            others = [c.chunk for c in self._in_flight() if c.buffer == buffer]
            _require(not others, 1, f"turn {t} reads buffer {buffer} while chunk(s) {others} "
                                    f"are on their way into it")
            self.reads.append(t)
            yield PROGRESS
        if self.final_wait:
            while not self._waited(0):
                yield "wait_all"
        left = [c.chunk for c in self._in_flight()]
        _require(not left, 2, f"chunk(s) {left} still in flight after the loop")

    def run(self, scheduler, max_steps: int = 100_000) -> int:
        steps = interleave(self, scheduler, max_steps, lambda m: ChunkViolation(3, m),
                           ended=lambda live: not any(a.name == "warp" for a in live))
        expected = [t for t in range(self.turns) if t not in self.dead]
        _require(self.reads == expected, 1, f"turns read {self.reads}, expected {expected}")
        return steps


def rows8_loop(turns: int, **misuse) -> ChunkModel:
    """mk_stream_kloop_ring_rows8: two halves, one turn ahead, cp.async.wait_group 1."""
    return ChunkModel(turns, depth=2, lead=1, **misuse)


def copied_loop(turns: int, tiles: int = 1, **misuse) -> ChunkModel:
    """mk_stream_kloop_copied with `tiles` m16 tiles: D = 8 / tiles slots, D - 1 stages ahead,
    wait_group D - 1 (mk_stream_wait_a)."""
    depth = 8 // tiles
    return ChunkModel(turns, depth=depth, lead=depth - 1, **misuse)
