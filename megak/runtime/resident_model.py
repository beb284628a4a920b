"""The resident megakernel's synchronisation protocol, stated in Python and run through
interleavings. The device half is megakernel.cu's resident kernel (mk_relay, mk_take_request,
mk_serve and the last lines of mk_finish_invocation); the host half is
megak/runtime/resident.py (ResidentKernel: post, _slot_free, kick, _launch, served, widen).

Each actor below is a generator whose every step is one shared-memory action (a read, a
write, or a read-modify-write); a scheduler interleaves the steps of all actors. Request
numbers are plain ints from 1 (the device's are u32 and compare wrap-safe; the order
argument is the same).

  host     post request s: wait until ring slot s % ring_slots is free, i.e. the kernel has
           taken request s - ring_slots (view.taken), or, while no launch runs,
           s - ring_slots < resume; write the entry's params word (tagged s), its program
           words (queue_start, run_state, n_sm: one step here, each tagged s on the device),
           then its (ticket, seq = s) word.
           kick: once view.left == generation the launch is over: resume = view.next, and any
           reason but IDLE stops the host for good (requests from view.next on never run,
           `served` says so). Not stopped, not running and requests waiting (resume != next):
           launch again from resume: view.taken = resume - 1, a new generation, and on the
           stream a reset of the device state (go = closed = first - 1, failed clear, every
           seen[b] = first - 1, the mirror zeroed), which the stream runs only once every
           actor of the previous launch has ended.
           widen (a wider build of op bodies for a program added): while a launch runs and
           nothing stopped it, post a close request c and wait until the launch has left; a
           stop at c itself (CLOSED, view.next == c) is the host's own: clear it and resume
           from c + 1, so the next post launches the new build. Any other stop stays.
  relay    the last block, for s = first, first + 1, ...
           R1  wait until the ring entry is request s, and closed == s - 1 (read in one step
               with `failed`: one word on the device; set means FAILED). Each round reads the
               entry's params word, its program words, then its (ticket, seq) word: the
               device's loads are in flight together and may be performed in any order, and
               this one can pair a stale word with a new one. The entry is taken only when
               every word names s (the params word's and the program words' tags). Steps
               with request s - 1 closed and request s not there count toward idle_steps
               (past it: IDLE); steps waiting for closed count toward wait_steps when that
               is set (past it: LOST). A close request (params None) means CLOSED. (The
               device reads the entry in its first round and, after that, only once s - 1
               has closed: a subset of these interleavings.)
           R2  mirror slot s % mirror_slots is free once every block's seen >= s - mirror_slots.
               The relay caches `safe` (every block has read up to here) and scans only when
               safe < s - mirror_slots, asking first for seen >= s - 1.
           R3  mirror[s % mirror_slots] = (params and program, or None when leaving; ticket;
               seq = s), then go = s.
           R4  leaving: view.next = s and view.reason, then view.left = generation, and the
               relay ends; otherwise view.taken = s.
  block b  for s = first, first + 1, ...: wait until go >= s; read mirror[s % mirror_slots];
           seen[b] = s; None params: leave. The block is active in the request when
           b < n_sm and (b == 0 or its queue is non-empty), for the n_sm and queue the
           program words name; an active block reads the epoch of the run state they name,
           runs its queue (one step per instruction), then exited += 1; the
           last of the program's n_active closes the invocation: epoch + 1 (0 after a
           failure), exited = 0, ticket_done raised to the ticket; then (closed = s,
           failed) in one write. Inactive blocks skip the request.
  stream   runs the host's launches in order, each after the previous launch's actors ended.

One decider, the relay, turns every reason to stop (close, idle, failure, deadline) into a
leave entry of the mirror, so every block sees the same sequence of requests and leaves at the
same one; the host learns from view.next where a relaunch starts, so nothing is skipped or
served twice across launches.

Beside the shared memory the model keeps what it knows to be true (`Truth`: each request as
posted, which requests were taken from the ring and closed, where each actor of a launch
left) and checks every actor's reads against it. The rules, numbered as
`ProtocolViolation.rule` reports them:

  1  the relay takes, and every block reads, for each s, the request the host posted as s:
     the relay never pairs words of two requests (its program words name its params'
     program), never rewrites a mirror slot some block has not read, and no block reads a
     stale entry
     (the blocks all poll one `go`, so the mirror must hold every request some block has
     yet to read);
  2  an active block starts request s only after request s - 1 closed, so it reads the run
     state (the epoch) the previous invocation of its program left, and the outputs of
     s - 1 are complete when s reads them;
  3  no request is lost or run twice: each posted request closes exactly once, or the host
     reports it never ran after a stop; the relay and every block of a launch leave at the
     same request;
  4  the host never rewrites a ring slot whose request the relay has not taken (unless the
     host has stopped: nothing will take it);
  5  no deadlock: the run ends (every actor done, or only the idle stream waiting for a
     launch that will never come) within the step budget.

Misuse switches (ResidentModel keywords), each breaking one rule the protocol relies on, so
that the tests can show the checks catch it:
  publish_before_close    the relay publishes s without waiting for closed == s - 1;
  reuse_mirror_unchecked  the relay rewrites a mirror slot without the seen[] check;
  blocks_decide_idle      each block leaves after its own idle wait for go, not the relay;
  reuse_ring_unchecked    the host rewrites a ring slot without waiting for view.taken;
  untagged_ring           the relay takes the entry on its seq alone, without the params
                          word's tag;
  untagged_program_words  the relay takes the entry without the program words' tags
                          (queue_start, run_state, n_sm);
  no_relaunch             the host never launches again after the first launch left;
  widen_clears_any_stop   widen clears whatever stop it finds, a failure's too.

Not modelled: an actor that stops for good (the relay's LOST in R2, for a block that stopped
reading requests, and a block's own deadline, for a relay that is gone, guard against that;
an interleaving only delays actors), the u32 wrap, and the invocation's work beyond its step
count (megak/runtime/invocation.py models how an invocation ends).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from .. import abi

RING_SLOTS = abi.RESIDENT["MK_RING_SLOTS"]
MIRROR_SLOTS = abi.RESIDENT["MK_MIRROR_SLOTS"]
CLOSED = abi.RESIDENT["MK_RESIDENT_CLOSED"]
IDLE = abi.RESIDENT["MK_RESIDENT_IDLE"]
FAILED = abi.RESIDENT["MK_RESIDENT_FAILED"]
LOST = abi.RESIDENT["MK_RESIDENT_LOST"]
REASON_NAMES = {CLOSED: "closed", IDLE: "idle", FAILED: "failed", LOST: "lost"}

PROGRESS = None
"""What an actor yields after a step that changed something (shared memory or its own state).
A step that only polled and found nothing new yields a string: what the actor waits for."""

RULES = {
    1: "every block reads request s as the host posted it",
    2: "request s starts only after request s - 1 closed",
    3: "no request is lost or run twice, a launch leaves at one request",
    4: "the host rewrites only ring slots the relay has taken",
    5: "no deadlock",
}


def interleave(model, scheduler, max_steps: int, violation, ended=None) -> int:
    """Run model.actors (a list that may grow) one step at a time, as `scheduler` picks, until
    `ended(live actors)` (default: none left); returns the steps taken. `violation(message)`
    is the model's exception for a deadlock or a run past max_steps.

    An actor that meets one of its waits a second time with nothing changed anywhere has gone
    round its whole polling loop: it would only repeat it, so it is not run again until
    something changes. When every live actor is there, nothing ever will: a deadlock."""
    waits: dict[Actor, set] = {}
    stalled: set[Actor] = set()
    for steps in range(max_steps):
        live = [a for a in model.actors if not a.done]
        if (ended(live) if ended is not None else not live):
            return steps
        ready = [a for a in live if a not in stalled]
        if not ready:
            raise violation("deadlock: " + "; ".join(
                f"{a.name} waits for {a.waiting}" for a in live))
        actor = scheduler.pick(ready)
        if actor.step():
            waits.clear()
            stalled.clear()
        elif actor.waiting in waits.setdefault(actor, set()):
            stalled.add(actor)
        else:
            waits[actor].add(actor.waiting)
    raise violation(f"no end within {max_steps} steps")


class ModelViolation(AssertionError):
    """A check of a protocol model failed; `rule` is its number in the model's docstring
    (each model subclasses it with its own `rules`)."""
    rules: dict[int, str] = {}

    def __init__(self, rule: int, message: str):
        super().__init__(f"rule {rule} ({self.rules[rule]}): {message}")
        self.rule = rule


class ProtocolViolation(ModelViolation):
    rules = RULES


def _require(ok: bool, rule: int, message: str) -> None:
    if not ok:
        raise ProtocolViolation(rule, message)


# -- what the host asks for -------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """One compiled program: `queues[b]` instructions for block b < n_sm = len(queues)."""
    queues: tuple[int, ...]

    @property
    def n_sm(self) -> int:
        return len(self.queues)

    def active(self, b: int) -> bool:
        """mk_block_active: block 0 always takes part (it closes empty programs too)."""
        return b < self.n_sm and (b == 0 or self.queues[b] > 0)

    def n_active(self) -> int:
        return sum(self.active(b) for b in range(self.n_sm))


@dataclass(frozen=True)
class Request:
    """A request's params: which program it invokes, and whether the test makes it fail."""
    program: int
    fail: bool = False


def post(program: int, fail: bool = False) -> tuple:
    """Script step: post one invocation of `program` (`fail`: its closing block reports an
    error)."""
    return ("post", Request(program, fail))


def pause(steps: int) -> tuple:
    """Script step: the host does nothing for `steps` of its own steps (time passes)."""
    return ("pause", steps)


def wait_left() -> tuple:
    """Script step: the host waits (kicking) until the current launch has left; with nothing
    posted the relay's idle deadline makes it leave."""
    return ("wait_left",)


def sync() -> tuple:
    """Script step: the host waits (kicking) until every request posted so far has run or is
    reported never to run, as a caller waiting for its tickets does."""
    return ("sync",)


def widen() -> tuple:
    """Script step: ResidentKernel.widen: the launch running leaves at a close request, and
    the next post launches again after it (a wider build)."""
    return ("widen",)


def close() -> tuple:
    """Script step: ResidentKernel.close: if a launch runs, post a close request; then wait
    until the launch has left."""
    return ("close",)


# -- shared memory ----------------------------------------------------------------------------
@dataclass
class Entry:
    """A ring or mirror slot (mk_request): params None is a leave. `program`: the program the
    queue_start, run_state and n_sm words name (a block reads its queue bounds and run state
    through them, not through params; None in a leave). In the ring, `tag` and `program_tag`
    are the request numbers the params word and the program words carry (the device's
    s & 0xffff)."""
    params: Request | None = None
    program: int | None = None
    ticket: int = 0
    seq: int = 0
    tag: int = 0
    program_tag: int = 0


@dataclass
class View:
    """mk_resident_view: mapped host memory the relay writes."""
    taken: int = 0
    reason: int = 0
    next: int = 0
    left: int = 0


@dataclass
class DeviceState:
    """mk_resident_state plus the seen[] array."""
    go: int = 0
    closed: int = 0
    failed: bool = False
    mirror: list[Entry] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)

    def reset(self, first: int, grid: int, mirror_slots: int) -> None:
        """What _launch copies to the device before a launch (a zeroed state)."""
        self.go = self.closed = first - 1
        self.failed = False
        self.mirror = [Entry() for _ in range(mirror_slots)]
        self.seen = [first - 1] * grid


@dataclass
class RunState:
    """The part of one program's mk_run_state (and host view) the protocol touches."""
    epoch: int = 0
    exited: int = 0
    ticket_done: int = 0


# -- what is true, beside the shared memory ---------------------------------------------------
@dataclass
class Launch:
    """One launch of the kernel: from which request, its generation, its actors once the
    stream has started it, and where each of them left."""
    first: int
    generation: int
    actors: list = field(default_factory=list)
    left_at: dict = field(default_factory=dict)     # actor name -> the request it left at
    reason: int | None = None

    def ended(self) -> bool:
        return all(a.done for a in self.actors)


@dataclass
class Truth:
    """What the model knows to be so, beside the shared memory: the checks compare against
    it, no actor reads it."""
    posted: dict = field(default_factory=dict)          # s -> (params, ticket)
    epoch_before: dict = field(default_factory=dict)    # s -> its program's epoch before it
    taken: set = field(default_factory=set)             # requests a relay read from the ring
    closed: Counter = field(default_factory=Counter)    # s -> times its invocation closed
    started: set = field(default_factory=set)           # (s, block) that ran request s


# -- actors and schedulers --------------------------------------------------------------------
class Actor:
    """A generator of steps with a name; `waiting` is what its last step waited for (None
    after a step that made progress)."""

    def __init__(self, name: str, steps):
        self.name, self._steps = name, steps
        self.done = False
        self.waiting: str | None = None

    def step(self) -> bool:
        """Run one step; True when it made progress."""
        try:
            self.waiting = next(self._steps)
        except StopIteration:
            self.done, self.waiting = True, None
        return self.waiting is None


class RandomScheduler:
    """Picks the next actor at random, each with its own speed (a weight drawn once per
    name), so some actors run far behind others: slow blocks, a slow host, a fast relay."""

    def __init__(self, seed: int, spread: float = 1.5):
        self._rng = random.Random(seed)
        self._spread = spread
        self._weight: dict[str, float] = {}

    def pick(self, actors: list[Actor]) -> Actor:
        weights = [self._weight.setdefault(a.name, self._rng.lognormvariate(0.0, self._spread))
                   for a in actors]
        return self._rng.choices(actors, weights)[0]


class RoundRobin:
    """One step of each actor in turn."""

    def __init__(self):
        self._turn = 0

    def pick(self, actors: list[Actor]) -> Actor:
        self._turn += 1
        return actors[self._turn % len(actors)]


@dataclass
class Outcome:
    """What one run did: launches made, each launch's (reason, next), the host's stop
    (reason, first request never run) or None, and the requests that closed."""
    steps: int
    launches: int
    exits: list
    stopped: tuple | None
    ran: list
    never_ran: list


# -- the model --------------------------------------------------------------------------------
class ResidentModel:
    """The host, the stream, the relay and `grid` blocks sharing the ring, the view and the
    device state. `programs`: the programs requests invoke; `script`: the host's steps
    (post, pause, wait_left, sync, widen, close). Time is counted in relay steps: idle_steps
    without a request make the kernel leave (IDLE), wait_steps waiting for a request to close make it
    give up (LOST; None: never)."""

    def __init__(self, programs, script, *, grid: int, ring_slots: int = RING_SLOTS,
                 mirror_slots: int = MIRROR_SLOTS, idle_steps: int = 20,
                 wait_steps: int | None = None, publish_before_close: bool = False,
                 reuse_mirror_unchecked: bool = False, blocks_decide_idle: bool = False,
                 reuse_ring_unchecked: bool = False, no_relaunch: bool = False,
                 untagged_ring: bool = False, untagged_program_words: bool = False,
                 widen_clears_any_stop: bool = False):
        if any(p.n_sm < 1 or p.n_sm > grid for p in programs):
            raise ValueError("every program needs 1..grid blocks")
        self.programs = list(programs)
        self.script = list(script)
        self.grid, self.ring_slots, self.mirror_slots = grid, ring_slots, mirror_slots
        self.idle_steps, self.wait_steps = idle_steps, wait_steps
        self.publish_before_close = publish_before_close
        self.reuse_mirror_unchecked = reuse_mirror_unchecked
        self.blocks_decide_idle = blocks_decide_idle
        self.reuse_ring_unchecked = reuse_ring_unchecked
        self.no_relaunch = no_relaunch
        self.untagged_ring = untagged_ring
        self.untagged_program_words = untagged_program_words
        self.widen_clears_any_stop = widen_clears_any_stop
        # shared memory
        self.ring = [Entry() for _ in range(ring_slots)]
        self.view = View()
        self.dev = DeviceState()
        self.dev.reset(1, grid, mirror_slots)
        self.run_state = [RunState() for _ in self.programs]
        # the host's own state (ResidentKernel's attributes)
        self.next = 1
        self.resume = 1
        self.generation = 0
        self.running = False
        self.stopped: tuple[int, int] | None = None
        self._tickets = [0] * len(self.programs)
        self._epoch_after = [0] * len(self.programs)     # the host's prediction, for rule 2
        # the stream and what is true
        self._queued: list[Launch] = []
        self.launches: list[Launch] = []
        self.truth = Truth()
        self.actors: list[Actor] = []

    # -- running ----------------------------------------------------------------------------
    def run(self, scheduler, max_steps: int = 200_000) -> Outcome:
        """Interleave every actor's steps as `scheduler` picks until the run ends; raises
        ProtocolViolation when a check fails."""
        host = Actor("host", self._host())
        stream = Actor("stream", self._stream())
        self.actors = [host, stream]
        # the run ends when the host is done and the stream, idle, is all that is left
        steps = interleave(self, scheduler, max_steps,
                           lambda message: ProtocolViolation(5, message),
                           ended=lambda live: host.done and not self._queued and live == [stream])
        self._check_end()
        return self._outcome(steps)

    def _outcome(self, steps: int) -> Outcome:
        posted = [s for s, (params, _) in sorted(self.truth.posted.items()) if params]
        return Outcome(steps=steps, launches=len(self.launches),
                       exits=[(launch.reason, launch.left_at.get("relay"))
                              for launch in self.launches],
                       stopped=self.stopped,
                       ran=[s for s in posted if self.truth.closed[s]],
                       never_ran=[s for s in posted if not self.served(s)])

    def _check_end(self) -> None:
        """Rule 3 once everything ended: each posted request ran once or is reported never
        run; each launch's relay and blocks left at one request."""
        for s, (params, ticket) in sorted(self.truth.posted.items()):
            if params is None:
                continue
            times = self.truth.closed[s]
            if self.served(s):
                _require(times == 1, 3, f"request {s} closed {times} times, the host counts "
                                        f"it served")
                done = self.run_state[params.program].ticket_done
                _require(done >= ticket, 3, f"request {s}: ticket {ticket} never reported")
            else:
                _require(times == 0, 3, f"request {s} ran, the host reports it never ran")
        for launch in self.launches:
            _require(len(launch.left_at) == self.grid + 1, 3,
                     f"launch {launch.generation}: only {sorted(launch.left_at)} left")

    # -- the host ---------------------------------------------------------------------------
    def _host(self):
        """The script, then a wait for every posted request, as callers wait for their
        tickets: a host that stopped kicking could leave a request behind an idle exit."""
        for op in self.script:
            if op[0] == "post":
                yield from self._post(op[1])
            elif op[0] == "pause":
                for _ in range(op[1]):
                    yield PROGRESS
            elif op[0] == "wait_left":
                yield from self._wait_left()
            elif op[0] == "sync":
                yield from self._sync()
            elif op[0] == "widen":
                yield from self._widen()
            elif op[0] == "close":
                if self.running:
                    yield from self._post(None)
                yield from self._wait_left()
            else:
                raise ValueError(f"unknown host step {op!r}")
        yield from self._sync()

    def _post(self, params: Request | None):
        """ResidentKernel.post: wait for the slot, the params word, the program words, then
        (ticket, seq), then kick."""
        s = self.next
        while not self._slot_free(s):
            changed = self._kick()
            if self.stopped is not None:
                break          # nothing will take it; `served` reports it
            yield PROGRESS if changed else f"ring slot of {s} free (taken >= {s - self.ring_slots})"
        self._check_ring_reuse(s)
        ticket = 0
        if params is not None:
            self._tickets[params.program] += 1
            ticket = self._tickets[params.program]
            self.truth.epoch_before[s] = self._epoch_after[params.program]
            self._epoch_after[params.program] = 0 if params.fail else self.truth.epoch_before[s] + 1
        self.truth.posted[s] = (params, ticket)
        entry = self.ring[s % self.ring_slots]
        entry.params, entry.tag = params, s
        yield PROGRESS
        entry.program = params.program if params is not None else None
        entry.program_tag = s
        yield PROGRESS
        entry.ticket, entry.seq = ticket, s
        yield PROGRESS
        self.next = s + 1
        self._kick()
        yield PROGRESS

    def _slot_free(self, s: int) -> bool:
        if self.reuse_ring_unchecked:
            return True
        if self.running:
            return self.view.taken >= s - self.ring_slots
        return s - self.ring_slots < self.resume

    def _check_ring_reuse(self, s: int) -> None:
        old = s - self.ring_slots
        abandoned = self.stopped is not None and old >= self.stopped[1]
        _require(old < 1 or old in self.truth.taken or abandoned, 4,
                 f"the host writes request {s} over request {old}, which no relay has taken")

    def _kick(self) -> bool:
        """ResidentKernel.kick; True when it changed the host's state."""
        changed = False
        if self.running and self.view.left == self.generation:
            self.running = False
            self.resume = self.view.next
            if self.view.reason != IDLE:
                self.stopped = (self.view.reason, self.view.next)
            changed = True
        relaunch_allowed = not (self.no_relaunch and self.launches)
        if (not self.running and self.stopped is None and self.resume != self.next
                and relaunch_allowed):
            self._launch(self.resume)
            changed = True
        return changed

    def _launch(self, first: int) -> None:
        """ResidentKernel._launch: the device state's reset and the kernel are queued on the
        stream, so they start after the previous launch has ended."""
        self.view.taken = first - 1
        self.generation += 1
        launch = Launch(first, self.generation)
        self._queued.append(launch)
        self.launches.append(launch)
        self.running = True

    def served(self, s: int) -> bool:
        """ResidentKernel.served: False once request s can no longer run."""
        return self.stopped is None or s < self.stopped[1]

    def _wait_left(self):
        while self.running:
            yield PROGRESS if self._kick() else "the launch to leave"

    def _widen(self):
        """ResidentKernel.widen, once the wider build is compiled."""
        if not self.running or self.stopped is not None:
            return
        c = self.next
        yield from self._post(None)
        yield from self._wait_left()
        if self.stopped == (CLOSED, c) or (self.widen_clears_any_stop and self.stopped):
            self.stopped = None
            self.resume = c + 1
        yield PROGRESS

    def _sync(self):
        for s, (params, ticket) in sorted(self.truth.posted.items()):
            if params is None:
                continue
            run = self.run_state[params.program]
            while run.ticket_done < ticket and self.served(s):
                yield PROGRESS if self._kick() else f"ticket {ticket} of request {s}"

    # -- the stream -------------------------------------------------------------------------
    def _stream(self):
        """Runs queued launches in order, each after the previous one's actors all ended."""
        current: Launch | None = None
        while True:
            if not self._queued:
                yield "a launch"
            elif current is not None and not current.ended():
                yield f"launch {current.generation} to end"
            else:
                current = self._queued.pop(0)
                self.dev.reset(current.first, self.grid, self.mirror_slots)
                yield PROGRESS
                current.actors = [Actor("relay", self._relay(current))]
                current.actors += [Actor(f"block{b}", self._block(current, b))
                                   for b in range(self.grid)]
                self.actors += current.actors
                yield PROGRESS

    # -- the relay --------------------------------------------------------------------------
    def _relay(self, launch: Launch):
        safe = launch.first - 1         # every block has read the requests up to here
        s = launch.first
        while True:
            params, program, ticket, reason = yield from self._relay_take(s)        # R1
            if reason is None and params is None:
                reason = CLOSED
            safe = yield from self._relay_wait_mirror(s, safe)                     # R2
            entry = self.dev.mirror[s % self.mirror_slots]                          # R3
            self._check_mirror_reuse(s, entry)
            entry.params = None if reason is not None else params
            entry.program = None if reason is not None else program
            entry.ticket, entry.seq = ticket, s
            yield PROGRESS
            self.dev.go = s
            yield PROGRESS
            if reason is not None:                                                  # R4
                self.view.next, self.view.reason = s, reason
                yield PROGRESS
                launch.reason = reason
                self._leave(launch, "relay", s)
                self.view.left = launch.generation
                yield PROGRESS
                return
            self.view.taken = s
            yield PROGRESS
            s += 1

    def _relay_take(self, s: int):
        """R1: (params, program, ticket, reason) of request s; reason None to publish it."""
        entry = self.ring[s % self.ring_slots]
        params, program, ticket = None, None, 0
        taken, closed = False, self.publish_before_close
        idle = waited = 0
        while not (taken and closed):
            if not taken:
                word_params, word_tag = entry.params, entry.tag
                yield f"ring params word of {s}"   # a read: progress only with the entry
                word_program, word_program_tag = entry.program, entry.program_tag
                yield f"ring program words of {s}"
                if (entry.seq == s and (word_tag == s or self.untagged_ring)
                        and (word_program_tag == s or self.untagged_program_words)):
                    params, program, ticket = word_params, word_program, entry.ticket
                    taken = True
                    self._check_take(s, params, program, ticket)
                    self.truth.taken.add(s)
                    yield PROGRESS
                else:
                    yield f"ring entry == {s}"
            if not closed:
                if self.dev.closed == s - 1:
                    closed, failed = True, self.dev.failed
                    yield PROGRESS
                    if failed:
                        return params, program, ticket, FAILED
                else:
                    yield f"closed == {s - 1}"
            if not closed and self.wait_steps is not None:
                waited += 1
                yield PROGRESS
                if waited > self.wait_steps:
                    return params, program, ticket, LOST
            if closed and not taken and not self.blocks_decide_idle:
                idle += 1
                yield PROGRESS
                if idle > self.idle_steps:
                    return None, None, 0, IDLE
        return params, program, ticket, None

    def _check_take(self, s: int, params, program, ticket: int) -> None:
        """Rule 1 at the ring: the relay takes request s as the host posted it, its program
        words naming its params' program."""
        posted = self.truth.posted.get(s)
        _require(posted == (params, ticket), 1,
                 f"the relay takes request {s} as {(params, ticket)}, posted as {posted}")
        named = params.program if params is not None else None
        _require(program == named, 1,
                 f"the relay takes request {s} with the program words of program {program}, "
                 f"its params those of program {named}")

    def _relay_wait_mirror(self, s: int, safe: int):
        """R2: the new `safe` once mirror slot s % mirror_slots is free."""
        if self.reuse_mirror_unchecked:
            return safe
        while safe < s - self.mirror_slots:
            if all(seen >= s - 1 for seen in self.dev.seen):
                safe = s - 1
                yield PROGRESS
            else:
                yield f"every seen >= {s - 1}"
                if all(seen >= s - self.mirror_slots for seen in self.dev.seen):
                    safe = s - self.mirror_slots
                    yield PROGRESS
                else:
                    yield f"every seen >= {s - self.mirror_slots}"
        return safe

    def _check_mirror_reuse(self, s: int, entry: Entry) -> None:
        """Rule 1 where it is broken: the entry about to be replaced has been read by every
        block (a zeroed entry, seq 0, holds no request)."""
        unread = [b for b, seen in enumerate(self.dev.seen) if seen < entry.seq]
        _require(not unread, 1, f"the relay writes request {s} over request {entry.seq}, "
                                f"which blocks {unread} have not read")

    # -- a block ----------------------------------------------------------------------------
    def _block(self, launch: Launch, b: int):
        name = f"block{b}"
        s = launch.first
        while True:
            waited = 0
            while self.dev.go < s:
                if not self.blocks_decide_idle:
                    yield f"go >= {s}"
                    continue
                waited += 1
                yield PROGRESS
                if waited > self.idle_steps:
                    self._leave(launch, name, s)
                    return
            entry = self.dev.mirror[s % self.mirror_slots]
            params, program, ticket = entry.params, entry.program, entry.ticket
            self._check_read(b, s, entry)
            yield PROGRESS
            self.dev.seen[b] = s
            yield PROGRESS
            if params is None:
                self._leave(launch, name, s)
                return
            if self.programs[program].active(b):
                yield from self._invoke(b, s, params, program, ticket)
            s += 1

    def _check_read(self, b: int, s: int, entry: Entry) -> None:
        """Rule 1: the entry is request s, as posted (a leave entry carries no request)."""
        _require(entry.seq == s, 1, f"block {b}, at request {s}, read the mirror entry of "
                                    f"request {entry.seq}")
        if entry.params is not None:
            posted = self.truth.posted.get(s)
            _require(posted == (entry.params, entry.ticket), 1,
                     f"block {b} read request {s} as {(entry.params, entry.ticket)}, "
                     f"posted as {posted}")
            _require(entry.program == entry.params.program, 1,
                     f"block {b} read request {s} with the queue bounds and run state of "
                     f"program {entry.program}, its params those of program "
                     f"{entry.params.program}")

    def _invoke(self, b: int, s: int, params: Request, program_index: int, ticket: int):
        """One active block's part of request s, and the close by the last one out: its queue
        and run state are those the request's program words name."""
        program = self.programs[program_index]
        run = self.run_state[program_index]
        epoch = run.epoch
        self._check_start(b, s, params, epoch)
        yield PROGRESS
        for _ in range(program.queues[b]):
            yield PROGRESS
        run.exited += 1
        last = run.exited == program.n_active()
        yield PROGRESS
        if not last:
            return
        _require(self.truth.closed[s] == 0, 3, f"request {s} closes a second time")
        run.epoch = 0 if params.fail else epoch + 1
        run.exited = 0
        run.ticket_done = max(run.ticket_done, ticket)
        yield PROGRESS
        self.dev.closed, self.dev.failed = s, params.fail     # one 8-byte word
        self.truth.closed[s] += 1
        yield PROGRESS

    def _check_start(self, b: int, s: int, params: Request, epoch: int) -> None:
        """Rules 2 and 3 when block b starts request s."""
        _require((s, b) not in self.truth.started, 3, f"block {b} runs request {s} twice")
        self.truth.started.add((s, b))
        before = s - 1          # the invocation before s: a close request (widen) runs none
        while before >= 1 and self.truth.posted[before][0] is None:
            before -= 1
        _require(before < 1 or self.truth.closed[before] > 0, 2,
                 f"block {b} starts request {s} before request {before} closed")
        expected = self.truth.epoch_before[s]
        _require(epoch == expected, 2, f"block {b} starts request {s} of program "
                                       f"{params.program} at epoch {epoch}, not {expected}")

    def _leave(self, launch: Launch, who: str, s: int) -> None:
        """Rule 3: every actor of a launch leaves at the same request."""
        for other, at in launch.left_at.items():
            _require(at == s, 3, f"launch {launch.generation}: {who} leaves at request {s}, "
                                 f"{other} left at {at}")
        launch.left_at[who] = s
