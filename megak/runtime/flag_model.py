"""Data as its own flag: a tensor whose every word carries the stamp of the invocation that
wrote it, so that a consumer on another SM waits on the word itself instead of on a counter.
Stated in Python and run through interleavings, as resident_model.py and stream_model.py do
for the resident kernel's relay and the weight stream.

The protocol:
- A **flagged tensor** holds fp32 values as 64-bit words: low 32 bits the payload, high 32
  bits the **stamp** of the invocation that wrote it. Buffers are zeroed when allocated
  (stamp 0 = never written).
- **Stamp**: one per invocation: s = the last invocation's stamp + 1, skipping 0 on the u32
  wrap; when an invocation ends (success or failure) its last block stores s in the run
  state; it is never reset (unlike the counters' epoch, which restarts at 0 after a failed
  invocation). The device's run state holds the last stamp (0 from the host); this model
  keeps the next one instead (starting at 1): the same sequence of stamps.
- **Producer**: each word of a flagged tensor is written exactly once per invocation, by one
  instruction, with one 64-bit relaxed store at gpu scope (payload and stamp together;
  single-copy atomic because aligned 64-bit). No fence, no counter for this tensor.
- **Consumer**: an instruction reading a flagged tensor polls each word it needs with a
  relaxed 64-bit load until its stamp half equals the invocation's stamp (with a deadline:
  past it, a hang error), then uses that word's payload, and nothing else on the strength of
  it (any other data it reads comes with its own dependency: a counter wait with acquire, or
  its own flagged words).
- **Invocation boundary**: invocation n + 1 of a program starts only after every block has
  finished invocation n (a kernel boundary, or in the resident kernel the relay that
  publishes the next request only after the last block closed the previous one). So a word
  is never overwritten by invocation n + 1 while a consumer of invocation n still needs it.
- Each block runs its queue in order; an instruction's reads (polls) happen before its
  writes.

The model (FlagModel): one program (a Program: one queue of instructions per SM, each
instruction the words it polls and the words it writes) invoked several times in a row
(Invocation: possibly with an injected failure). Memory is the words, as two u32 halves
(`stamps`, `payloads`), the plain data of the misuse below (`plain`, datum w goes with word
w), and the run state. Each actor is a generator whose every step is one memory action; a
scheduler interleaves the steps of all actors:

  relay    for n = 0, 1, ...: publishes go = n, then waits until the last block of
           invocation n closed it (closed == n): the invocation boundary.
  block b  for each invocation n: waits until go >= n; reads the run state's stamp s; runs
           its queue. For each instruction: at the injected failure, raises abort[n] (the
           invocation's error) and stops its queue; otherwise polls each word it reads
           (one step: a 64-bit load of the word, and abort[n]) until the word's stamp is s,
           then checks its payload; a set abort[n] makes it stop its queue instead (the
           aborted poll; the device's deadline does the same); then issues one 64-bit store
           (stamp s, payload) for each word it writes. At the end of its queue, stopped or
           not: a release (every store of the block lands), exited += 1; the block that
           brings exited to n_sm is the last: exited = 0, stamp = next_stamp(s), closed = n.
  store    each store is in flight from the step that issues it until a later step of its
           own, which the scheduler picks: relaxed stores to different addresses land in any
           order. A release (a fence, or the block's end) lands every store of its block.

Payloads are names: payload(n, (b, i), w) says which invocation, instruction and word wrote
it, so a check knows exactly what a consumer found (`describe`).

Beside the memory the model keeps what it knows to be true (`FlagTruth`: each word's
producer, what was written in each invocation, the stamp each block used) and checks every
read against it. The rules, numbered as `ProtocolViolation.rule` reports them:

  1  every word a consumer accepts carries the payload its producer wrote in this
     invocation; the report says what it found instead: a stale word (an earlier
     invocation's, or the allocation's zero), a torn word (a stamp not written with that
     payload), a later invocation's word, or another producer's word;
  2  no word is written twice in one invocation;
  3  no deadlock: a state where no actor can move while some wait (the report names the word
     each block waits for); on the device this is a consumer's deadline passing, a hang
     error, which the protocol without a failure must never reach;
  4  a plain datum read on the strength of a flag is this invocation's.

Misuse switches (FlagModel keywords), each changing one step, so that the tests can show the
checks catch it:
  torn_store         "payload_first" or "stamp_first": the producer writes the two halves as
                     two 32-bit stores, in that order (each lands at its own step);
  stamp_reset        a failed invocation's last block restarts the stamp at 1 (as the epoch
                     restarts) instead of advancing it;
  stamp_frozen       the stamp is not advanced between invocations;
  wrap_through_zero  the stamp goes from 0xffffffff to 0 (the zeroed words' stamp);
  no_boundary        each block starts invocation n + 1 as soon as it finished n;
  two_producers      a second instruction also writes one of the words that are polled;
  unwritten_word     no instruction writes one of the words that are polled;
  plain_by_flag      each producer also writes a plain datum (plain store, no fence) before
                     each flagged word, and each consumer reads it after accepting the word;
  accept_newer       a consumer accepts a stamp >= its own (wrap-safe) instead of ==.
And one that is not a misuse, to show what the plain datum lacks: fence_plain, with
plain_by_flag, a release fence between the plain store and the flagged store (the consumer's
acquire after its poll is implicit: a load reads what has landed).

Not modelled: the deadline's time (an aborted poll stands for one that gives up; a consumer
that would wait forever is the deadlock of rule 3), the payload's fp32 value (a name), cache
effects on loads (a load reads the landed memory), the counter waits of other data, more
than one program (each has its own stamp and its own buffers), and what a block does after an
aborted poll beyond stopping (flag.cuh's op goes on without the value to the compute barrier:
whatever it stores carries the failed invocation's stamp, which no later invocation accepts).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase

from . import stream_model
from .resident_model import PROGRESS, Actor, ModelViolation, RoundRobin, interleave
from .stream_model import RandomScheduler

U32 = 0xFFFFFFFF
FIRST_STAMP = 1          # what the host starts a program's stamp at
RESTART = 1              # where stamp_reset restarts it
TORN_ORDERS = ("payload_first", "stamp_first")

RULES = {
    1: "a consumer accepts only the payload its producer wrote in this invocation",
    2: "no word is written twice in one invocation",
    3: "no deadlock, no hang",
    4: "a plain datum read on the strength of a flag is this invocation's",
}

__all__ = ["FlagModel", "FlagOutcome", "Instr", "Invocation", "Priority", "Program",
           "ProtocolViolation", "RandomScheduler", "RoundRobin", "describe", "next_stamp",
           "payload", "random_program"]


class ProtocolViolation(ModelViolation):
    """A check failed; `rule` is its number in the module docstring."""
    rules = RULES


def _require(ok: bool, rule: int, message: str) -> None:
    if not ok:
        raise ProtocolViolation(rule, message)


class Priority(stream_model.Priority):
    """stream_model's hand-written schedule (the ready actor whose name matches the earliest
    pattern), with each name's rank worked out once: stores come and go by the hundred."""

    def __init__(self, *patterns: str):
        super().__init__(*patterns)
        self._ranks: dict[str, int] = {}

    def _rank(self, actor: Actor) -> int:
        rank = self._ranks.get(actor.name)
        if rank is None:
            rank = self._ranks[actor.name] = next(
                (i for i, p in enumerate(self._patterns) if fnmatchcase(actor.name, p)),
                len(self._patterns))
        return rank

    def pick(self, actors: list[Actor]) -> Actor:
        return min(actors, key=self._rank)     # min keeps the first of equal ranks


# -- stamps and payloads ----------------------------------------------------------------------
def next_stamp(s: int) -> int:
    """The stamp after s: s + 1 in u32, skipping 0 (the stamp of a word never written)."""
    return ((s + 1) & U32) or 1


def payload(n: int, instr: tuple[int, int], w: int) -> int:
    """The u32 that instruction instr = (block, index) writes into word w in invocation n
    (never 0, the allocation's)."""
    b, i = instr
    assert n < 4095 and b < 16 and i < 256 and w < 256
    return ((n + 1) << 20) | (b << 16) | (i << 8) | w


def describe(value: int) -> str:
    """Which write a payload (or a plain datum) comes from."""
    if value == 0:
        return "0 (never written)"
    n, b, i, w = (value >> 20) - 1, (value >> 16) & 0xF, (value >> 8) & 0xFF, value & 0xFF
    return f"invocation {n}'s by sm{b}.{i} for word {w}"


# -- the program ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Instr:
    """One instruction: the flagged words it polls, the words it writes; plain_writes (data
    written with a plain store before the flagged word of the same index) and plain_reads
    (data read after accepting the word of the same index) only in the misuse."""
    polls: tuple[int, ...] = ()
    writes: tuple[int, ...] = ()
    plain_reads: tuple[int, ...] = ()
    plain_writes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Program:
    """`queues[b]`: the instructions of SM (block) b, in the order it runs them."""
    queues: tuple[tuple[Instr, ...], ...]

    @property
    def n_sm(self) -> int:
        return len(self.queues)

    @property
    def n_words(self) -> int:
        return 1 + max((w for _, ins in self.instrs() for w in ins.polls + ins.writes),
                       default=-1)

    def instrs(self):
        """((block, index), Instr) for every instruction."""
        for b, queue in enumerate(self.queues):
            for i, ins in enumerate(queue):
                yield (b, i), ins

    def producers(self) -> dict[int, list[tuple[int, int]]]:
        """word -> the instructions that write it."""
        out: dict[int, list[tuple[int, int]]] = {}
        for at, ins in self.instrs():
            for w in ins.writes:
                out.setdefault(w, []).append(at)
        return out

    def polled(self) -> list[int]:
        """The words some instruction polls, sorted."""
        return sorted({w for _, ins in self.instrs() for w in ins.polls})

    def validate(self) -> None:
        """What the compiler guarantees: one producer per word, a producer for every polled
        word, and queues that follow one topological order (so that running them to the end
        one instruction at a time, some queue can always go on)."""
        producers = self.producers()
        for w, who in producers.items():
            if len(who) != 1:
                raise ValueError(f"word {w} has producers {who}")
        for w in self.polled():
            if w not in producers:
                raise ValueError(f"word {w} is polled and never written")
        written: set[int] = set()
        heads = [0] * self.n_sm
        while any(heads[b] < len(q) for b, q in enumerate(self.queues)):
            for b, q in enumerate(self.queues):
                if heads[b] < len(q) and set(q[heads[b]].polls) <= written:
                    written.update(q[heads[b]].writes)
                    heads[b] += 1
                    break
            else:
                raise ValueError(f"the queues wait on each other at {heads}")


def random_program(seed: int, sms: tuple[int, int] = (2, 6), per_sm: int = 3) -> Program:
    """A small random DAG: 2-6 SMs, each with 1..per_sm instructions; the instructions are
    drawn in one topological order (each polls 1-3 words written before it, the first none,
    and writes 1-2 new words) and each SM's queue keeps that order, as the scheduler does."""
    rng = random.Random(seed)
    n_sm = rng.randint(*sms)
    owners = list(range(n_sm)) + [rng.randrange(n_sm)
                                  for _ in range(rng.randint(0, (per_sm - 1) * n_sm))]
    rng.shuffle(owners)
    queues: list[list[Instr]] = [[] for _ in range(n_sm)]
    written: list[int] = []
    for b in owners:
        polls = tuple(sorted(rng.sample(written, min(len(written), rng.randint(1, 3)))))
        writes = tuple(range(len(written), len(written) + rng.randint(1, 2)))
        written += writes
        queues[b].append(Instr(polls, writes))
    return Program(tuple(tuple(q) for q in queues))


@dataclass(frozen=True)
class Invocation:
    """One invocation of the program: fail = (block, index) makes that block stop at the
    start of that instruction (its error), or None."""
    fail: tuple[int, int] | None = None


# -- memory in flight -------------------------------------------------------------------------
class Store:
    """A store issued and not yet landed: its (array, index, value) writes, made at once
    when it lands (two halves of one 64-bit store land together)."""

    def __init__(self, *writes):
        self.writes = writes
        self.landed = False

    def land(self) -> None:
        if not self.landed:
            for array, index, value in self.writes:
                array[index] = value
            self.landed = True


# -- what is true, beside the memory ----------------------------------------------------------
@dataclass
class FlagTruth:
    """What the model knows to be so, beside the memory: the checks compare against it, no
    actor reads it."""
    producer: dict = field(default_factory=dict)    # word -> (block, index) that writes it
    writes: dict = field(default_factory=dict)      # (invocation, word) -> writer
    stamp_of: dict = field(default_factory=dict)    # payload -> the stamp written with it
    stamps: dict = field(default_factory=dict)      # (invocation, block) -> stamp it used
    accepted: Counter = field(default_factory=Counter)  # invocation -> words accepted
    ran: Counter = field(default_factory=Counter)   # invocation -> instructions completed
    stopped: dict = field(default_factory=dict)     # invocation -> blocks that stopped early
    closed_with: list = field(default_factory=list)  # stamp after each closing, in order


@dataclass
class FlagOutcome:
    """What one run did: steps; per invocation the stamp its blocks used (a sorted tuple of
    them where blocks disagreed), whether it failed, the words accepted, the instructions
    completed and the blocks that stopped early; the run state's stamp at the end."""
    steps: int
    stamps: list
    failed: list
    accepted: list
    ran: list
    stopped: list
    stamp: int


# -- the model --------------------------------------------------------------------------------
class FlagModel:
    """The relay, one block per SM and their stores, running `program` once per entry of
    `invocations`, with the run state's stamp starting at `first_stamp`."""

    def __init__(self, program: Program, invocations, *, first_stamp: int = FIRST_STAMP,
                 torn_store: str | None = None, stamp_reset: bool = False,
                 stamp_frozen: bool = False, wrap_through_zero: bool = False,
                 no_boundary: bool = False, two_producers: bool = False,
                 unwritten_word: bool = False, plain_by_flag: bool = False,
                 fence_plain: bool = False, accept_newer: bool = False):
        program.validate()
        if torn_store not in (None,) + TORN_ORDERS:
            raise ValueError(f"torn_store: one of {TORN_ORDERS} or None")
        if not 0 < first_stamp <= U32:
            raise ValueError("a stamp is a nonzero u32")
        self.invocations = list(invocations)
        if (program.n_sm > 16 or max(map(len, program.queues)) > 256 or program.n_words > 256
                or len(self.invocations) > 4094):
            raise ValueError("payload names hold 16 SMs, 256 instructions a queue, 256 words "
                             "and 4094 invocations")
        for inv in self.invocations:
            if inv.fail is not None:
                b, i = inv.fail
                if not (0 <= b < program.n_sm and 0 <= i < len(program.queues[b])):
                    raise ValueError(f"no instruction {inv.fail} to fail at")
        self.truth = FlagTruth()
        self.truth.producer = {w: who[0] for w, who in program.producers().items()}
        self.n_words = program.n_words
        self.torn_store = torn_store
        self.stamp_reset = stamp_reset
        self.stamp_frozen = stamp_frozen
        self.wrap_through_zero = wrap_through_zero
        self.no_boundary = no_boundary
        self.fence_plain = fence_plain
        self.accept_newer = accept_newer
        self.program = _misuse(program, two_producers=two_producers,
                               unwritten_word=unwritten_word, plain_by_flag=plain_by_flag)
        # memory: zeroed at allocation
        self.stamps = [0] * self.n_words
        self.payloads = [0] * self.n_words
        self.plain = [0] * self.n_words
        self.stamp = first_stamp                 # the run state
        self.exited = 0
        self.go = self.closed = -1
        self.abort = [False] * len(self.invocations)
        self.pending: list[list[Store]] = [[] for _ in range(self.program.n_sm)]
        self.actors: list[Actor] = []

    def run(self, scheduler, max_steps: int = 200_000) -> FlagOutcome:
        """Interleave every actor's steps as `scheduler` picks until all are done; raises
        ProtocolViolation when a check fails."""
        self.actors = [Actor(f"sm{b}", self._block(b)) for b in range(self.program.n_sm)]
        if not self.no_boundary:
            self.actors.insert(0, Actor("relay", self._relay()))
        steps = self._interleave(scheduler, max_steps)
        return self._outcome(steps)

    def _interleave(self, scheduler, max_steps: int) -> int:
        return interleave(self, scheduler, max_steps, lambda message: ProtocolViolation(3, message))

    def _outcome(self, steps: int) -> FlagOutcome:
        t = self.truth
        count = len(self.invocations)
        stamps = []
        for n in range(count):
            used = sorted({s for (m, _), s in t.stamps.items() if m == n})
            stamps.append(used[0] if len(used) == 1 else tuple(used))
        return FlagOutcome(steps=steps, stamps=stamps, failed=list(self.abort),
                           accepted=[t.accepted[n] for n in range(count)],
                           ran=[t.ran[n] for n in range(count)],
                           stopped=[sorted(t.stopped.get(n, ())) for n in range(count)],
                           stamp=self.stamp)

    # -- the invocation boundary ------------------------------------------------------------
    def _relay(self):
        for n in range(len(self.invocations)):
            self.go = n
            yield PROGRESS
            while self.closed < n:
                yield f"invocation {n} to close"

    # -- a block ----------------------------------------------------------------------------
    def _block(self, b: int):
        for n, inv in enumerate(self.invocations):
            if not self.no_boundary:
                while self.go < n:
                    yield f"go >= {n}"
            s = self.stamp
            self.truth.stamps[n, b] = s
            yield PROGRESS
            yield from self._queue(n, inv, b, s)
            yield from self._end(n, b, s)

    def _queue(self, n: int, inv: Invocation, b: int, s: int):
        """The block's instructions in order, up to its failure or an aborted poll."""
        for i, ins in enumerate(self.program.queues[b]):
            if inv.fail == (b, i):
                self.abort[n] = True
                self.truth.stopped.setdefault(n, set()).add(b)
                yield PROGRESS
                return
            for w in ins.polls:
                accepted = yield from self._poll(n, b, i, w, s)
                if not accepted:
                    self.truth.stopped.setdefault(n, set()).add(b)
                    return
                if w in ins.plain_reads:
                    self._read_plain(n, b, i, w)
                    yield PROGRESS
            for w in ins.writes:
                yield from self._write(n, b, i, w, s, plain=w in ins.plain_writes)
            self.truth.ran[n] += 1

    def _end(self, n: int, b: int, s: int):
        """The release and the arrival on exited; the last closes the invocation."""
        self._release(b)
        old = self.exited
        self.exited = old + 1
        yield PROGRESS
        if old + 1 < self.program.n_sm:
            return
        self.exited = 0
        yield PROGRESS
        self.stamp = self._advance(s, failed=self.abort[n])
        self.truth.closed_with.append(self.stamp)
        yield PROGRESS
        self.closed = n
        yield PROGRESS

    def _advance(self, s: int, failed: bool) -> int:
        """The stamp the last block leaves for the next invocation."""
        if self.stamp_frozen:
            return s
        if self.stamp_reset and failed:
            return RESTART
        if self.wrap_through_zero:
            return (s + 1) & U32
        return next_stamp(s)

    # -- a consumer's poll ------------------------------------------------------------------
    def _poll(self, n: int, b: int, i: int, w: int, s: int):
        """Load word w (and abort[n]) until its stamp is s: True once accepted, False when
        the invocation's error stops the block first."""
        while True:
            stamp, value = self.stamps[w], self.payloads[w]        # one 64-bit load
            if self._accepts(stamp, s):
                self._check_word(n, b, i, w, s, stamp, value)
                yield PROGRESS
                return True
            if self.abort[n]:
                yield PROGRESS
                return False
            yield (f"word {w} with stamp {s} (invocation {n}, sm{b}.{i}; it holds stamp "
                   f"{stamp})")

    def _accepts(self, stamp: int, s: int) -> bool:
        if self.accept_newer:
            return ((stamp - s) & U32) < 0x80000000
        return stamp == s

    def _check_word(self, n: int, b: int, i: int, w: int, s: int, stamp: int,
                    value: int) -> None:
        """Rule 1: the word carries what its producer writes in invocation n."""
        producer = self.truth.producer[w]
        want = payload(n, producer, w)
        _require(value == want, 1,
                 f"invocation {n} (stamp {s}): sm{b}.{i} accepts word {w} with stamp {stamp} "
                 f"and payload {describe(value)}: {self._what(n, stamp, value)}; "
                 f"sm{producer[0]}.{producer[1]} writes {describe(want)}")
        self.truth.accepted[n] += 1

    def _what(self, n: int, stamp: int, value: int) -> str:
        """What a wrong word is: torn (its stamp was not written with its payload), stale
        (an earlier invocation's, or the allocation's zero), a later invocation's, or another
        producer's."""
        if self.truth.stamp_of.get(value, 0) != stamp:
            return "a torn word"
        m = (value >> 20) - 1
        return ("a stale word" if m < n else "a later invocation's word" if m > n
                else "another producer's word")

    def _read_plain(self, n: int, b: int, i: int, w: int) -> None:
        """Rule 4: the plain datum read after word w's flag is invocation n's."""
        value = self.plain[w]
        want = payload(n, self.truth.producer[w], w)
        _require(value == want, 4, f"invocation {n}: sm{b}.{i} saw word {w}'s flag and reads "
                                   f"its plain datum {describe(value)}, not {describe(want)}")

    # -- a producer's stores ----------------------------------------------------------------
    def _write(self, n: int, b: int, i: int, w: int, s: int, plain: bool):
        value = payload(n, (b, i), w)
        if plain:
            self._issue(b, "plain", Store((self.plain, w, value)))
            yield PROGRESS
            if self.fence_plain:
                self._release(b)
                yield PROGRESS
        self._check_write(n, b, i, w, s)
        if self.torn_store is None:
            self._issue(b, "word", Store((self.stamps, w, s), (self.payloads, w, value)))
            yield PROGRESS
            return
        halves = {"stamp": (self.stamps, w, s), "payload": (self.payloads, w, value)}
        first = "payload" if self.torn_store == "payload_first" else "stamp"
        for half in (first, "stamp" if first == "payload" else "payload"):
            self._issue(b, half, Store(halves[half]))
            yield PROGRESS

    def _check_write(self, n: int, b: int, i: int, w: int, s: int) -> None:
        """Rule 2: one write of each word per invocation."""
        self.truth.stamp_of[payload(n, (b, i), w)] = s
        before = self.truth.writes.setdefault((n, w), (b, i))
        _require(before == (b, i), 2, f"invocation {n}: sm{b}.{i} writes word {w}, which "
                                      f"sm{before[0]}.{before[1]} wrote already")

    def _issue(self, b: int, kind: str, store: Store) -> None:
        """The store is in flight: it lands at a step of its own (or at a release)."""
        self.pending[b].append(store)
        self.actors.append(Actor(f"sm{b}.{kind}", self._landing(store)))

    @staticmethod
    def _landing(store: Store):
        store.land()
        yield PROGRESS

    def _release(self, b: int) -> None:
        """A release fence: every store block b issued lands now."""
        for store in self.pending[b]:
            store.land()
        self.pending[b].clear()


def _misuse(program: Program, *, two_producers: bool, unwritten_word: bool,
            plain_by_flag: bool) -> Program:
    """The program as the misuse switches change it (the truth keeps the original producers):
    two_producers adds the first polled word to the writes of the first other instruction;
    unwritten_word takes it out of its producer's writes; plain_by_flag gives every flagged
    write and poll its plain datum."""
    queues = [list(q) for q in program.queues]
    polled = program.polled()
    if (two_producers or unwritten_word) and not polled:
        raise ValueError("the misuse needs a polled word")
    if two_producers or unwritten_word:
        w = polled[0]
        (pb, pi), = program.producers()[w]
        if unwritten_word:
            ins = queues[pb][pi]
            queues[pb][pi] = replace(ins, writes=tuple(x for x in ins.writes if x != w))
        if two_producers:
            ob, oi = next(at for at, _ in program.instrs() if at != (pb, pi))
            ins = queues[ob][oi]
            queues[ob][oi] = replace(ins, writes=ins.writes + (w,))
    if plain_by_flag:
        queues = [[replace(ins, plain_writes=ins.writes, plain_reads=ins.polls) for ins in q]
                  for q in queues]
    return Program(tuple(tuple(q) for q in queues))
