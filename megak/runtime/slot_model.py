"""An SM's instruction slots (megak/device/megakernel.cu: mk_loader's L1-L8, mk_compute's
C1-C4; pages.cuh: mk_slot_of, mk_slot_parity) with the paged transpose's tile barrier per slot
(ops/transpose.cuh), stated in Python and run through interleavings, as wgmma_model.py does for
the wgmma ring.

The protocol, per SM, for a queue of instructions (instruction q takes pages[q] pages; a paged
one has its tile copied into them by the loader):
- **Slots**: SLOTS (instr.h MK_SLOTS) slots, instruction q in slot q % SLOTS, each with a full
  barrier (1 arrival: the loader's hand-over) and an empty one (one arrival per compute
  thread). Instruction q completes its slot's (q // SLOTS)-th phase of both, waited for with
  parity (q // SLOTS) & 1: a waiter is never more than one phase off.
- **Loader**, per q: L1 (q >= SLOTS) waits until empty[q % SLOTS] completed the phase of
  q - SLOTS, then writes the record into the slot; L3 takes its pages (lowest free first, in
  queue order, waiting while too few are free); a paged record then initialises the slot's
  tile barrier (expecting the tile) and issues the copy, in flight until it lands; L7 arrives
  on full, without waiting for the copy. When it leaves (its queue done, or stopped because a
  wait passed its deadline) it waits for every tile barrier it initialised: the drain.
- **Compute threads**, per q: wait on full[q % SLOTS]; read the record; a paged record: wait on
  the tile barrier (phase 0), then read the pages, a barrier, write the transposed tile back
  into them, a barrier, and thread 0 issues the TMA stores that read the pages and write
  global memory, in flight until they have; thread 0 waits until they have read the pages,
  and where the record signals a consumer until they have written; the compute barrier (all
  threads); thread 0 signals and gives the pages back; every thread arrives on empty. Thread
  0 waits for every store's writes before the threads leave (the invocation reported done).
  A stop at `stop_at` (an op's error): the threads leave before running that instruction,
  and the loader's next wait on empty gives up (its deadline) and the loader leaves.

Rules, as `SlotViolation.rule` reports them:

  1  the compute threads run the record they wait for: the slot holds q when full says so;
  2  a tile barrier is initialised only when unused: no copy in flight to it and no thread of
     the slot's earlier record still to wait on it;
  3  a copy lands only in pages its instruction holds and no thread is reading;
  4  a thread reads a tile only after it has landed;
  5  no copy lands after the loader has left (the block may be gone);
  6  no deadlock, every instruction runs (up to the stop);
  7  no page is handed back, or refilled, while a store still reads it;
  8  a signal moves only after its instruction's stores have written;
  9  no store writes after the compute threads have left;
 10  a store reads the pages only after every thread has written them.

`Misuse` switches break one rule of the protocol on purpose, so the tests show each caught:
an index and parity that count one slot fewer than the barriers, a refill without
the empty wait, the tile read without its barrier wait, pages given back before the compute
barrier, a loader that leaves without the drain; thread 0 issuing the stores before the
other threads' write-back, handing the pages back before the stores read them, signalling
before they wrote, and leaving without waiting for them.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import abi
from .resident_model import Actor, ModelViolation, interleave
from .wgmma_model import Barrier

SLOTS = abi.SLOTS
THREADS = 2   # compute threads modelled (the device's 256 arrive the same way)

RULES = {
    1: "the compute threads run the record they wait for",
    2: "a tile barrier is initialised only when unused",
    3: "a copy lands only in pages its instruction holds and nobody reads",
    4: "a thread reads a tile only after it has landed",
    5: "no copy lands after the loader has left",
    6: "no deadlock, every instruction runs",
    7: "no page is handed back or refilled while a store reads it",
    8: "a signal moves only after its instruction's stores have written",
    9: "no store writes after the compute threads have left",
    10: "a store reads the pages only after every thread has written them",
}


class SlotViolation(ModelViolation):
    """A broken rule of the slot protocol (RULES, the module docstring)."""
    rules = RULES


@dataclass(frozen=True)
class Misuse:
    short_count: bool = False      # slot q % (SLOTS - 1), parity (q // (SLOTS - 1)) & 1: an index
                                   # that counts one slot fewer than the barriers
    refill_early: bool = False     # the loader writes a slot without waiting for empty
    no_tile_wait: bool = False     # the compute threads read a tile without its barrier
    release_early: bool = False    # thread 0 gives the pages back before the compute barrier
    no_drain: bool = False         # the loader leaves without waiting for its tiles
    store_early: bool = False      # thread 0 stores without the barrier after the write-back
    no_read_wait: bool = False     # thread 0 goes on without waiting for the stores' reads
    no_written_wait: bool = False  # a signalling record's thread 0 does not wait for the writes
    no_store_drain: bool = False   # the threads leave without waiting for the stores' writes


@dataclass(frozen=True)
class Instr:
    pages: int
    paged: bool = False   # the loader copies a tile into its pages (a paged transpose)
    signals: bool = False  # a consumer waits for its counter (a paged record's stores then
                           # are waited for before the signal)


class SlotModel:
    def __init__(self, queue: list[Instr], *, n_pages: int = 13, stop_at: int | None = None,
                 misuse: Misuse = Misuse()):
        self.queue, self.n_pages, self.stop_at, self.misuse = list(queue), n_pages, stop_at, misuse
        self.full = [Barrier(1) for _ in range(SLOTS)]
        self.empty = [Barrier(THREADS) for _ in range(SLOTS)]
        self.tile = [Barrier(1) for _ in range(SLOTS)]
        self.tile_used = [False] * SLOTS        # initialised in this invocation (the drain)
        self.slot_rec: list[int | None] = [None] * SLOTS
        self.owner: list[int | None] = [None] * n_pages
        self.readers = [0] * n_pages            # threads reading the page now
        self.pages_of: dict[int, list[int]] = {}
        self.landed: set[int] = set()
        self.in_flight = [0] * SLOTS            # copies in flight to each slot's tile barrier
        self.tile_waiters: dict[int, int] = {}  # threads of q that have yet to wait on its tile
        self.finished = [0] * len(self.queue)   # threads past q's compute barrier
        self.ran: set[int] = set()
        self.stopped = False                    # the compute threads stopped (stop_at)
        self.loader_left = False
        self.read_back = [0] * len(self.queue)   # threads past a paged q's reads
        self.wrote = [0] * len(self.queue)       # threads past a paged q's write-back
        self.store_reads: dict[int, bool] = {}   # q -> its stores still read its pages
        self.written: set[int] = set()           # q whose stores have written
        self.compute_left = False
        self.actors = [Actor("loader", self._loader())]
        self.actors += [Actor(f"thread {t}", self._thread(t)) for t in range(THREADS)]

    def run(self, scheduler, max_steps: int = 200_000) -> int:
        steps = interleave(self, scheduler, max_steps, lambda m: SlotViolation(6, m))
        end = len(self.queue) if self.stop_at is None else self.stop_at
        if self.ran != set(range(end)):
            raise SlotViolation(6, f"instructions {sorted(self.ran)} ran, of {end}")
        return steps

    # -- slot index and parity, as the device computes them -----------------------------------
    def _slot(self, q: int) -> int:
        return q % max(SLOTS - 1, 1) if self.misuse.short_count else q % SLOTS

    def _parity(self, q: int) -> int:
        return (q // max(SLOTS - 1, 1)) & 1 if self.misuse.short_count else (q // SLOTS) & 1

    # -- the loader ---------------------------------------------------------------------------
    def _loader(self):
        for q, ins in enumerate(self.queue):
            s = self._slot(q)
            if q >= SLOTS and not self.misuse.refill_early:           # L1
                while not self.empty[s].done(self._parity(q - SLOTS)):
                    if self.stopped:                                   # its deadline passes
                        yield from self._leave()
                        return
                    yield f"empty[{s}] for {q - SLOTS}"
            self.slot_rec[s] = q                                       # L2
            yield None
            while True:                                                # L3
                free = [p for p in range(self.n_pages) if self.owner[p] is None]
                if len(free) >= ins.pages:
                    break
                if self.stopped:
                    yield from self._leave()
                    return
                yield f"{ins.pages} pages for {q}"
            self.pages_of[q] = free[:ins.pages]
            for p in self.pages_of[q]:
                self.owner[p] = q
            yield None
            if ins.paged:                                              # L6
                self._init_tile(q, s)
                self.tile[s].arrive(tx=1)
                self.in_flight[s] += 1
                self.actors.append(Actor(f"copy {q}", self._copy(q, s, self.tile[s])))
                yield None
            self.full[s].arrive()                                      # L7
            yield None
        yield from self._leave()

    def _init_tile(self, q: int, s: int) -> None:
        earlier = [r for r, n in self.tile_waiters.items() if n and self._slot(r) == s]
        if self.in_flight[s] or earlier:
            raise SlotViolation(2, f"instruction {q}'s loader initialises slot {s}'s tile "
                                   f"barrier with {self.in_flight[s]} copies in flight to it and "
                                   f"threads of {earlier} still to wait on it")
        self.tile[s].valid = False
        self.tile[s] = Barrier(1)
        self.tile_used[s] = True
        self.tile_waiters[q] = THREADS

    def _leave(self):
        if not self.misuse.no_drain:
            for s in range(SLOTS):
                while self.tile_used[s] and not self.tile[s].done(0):
                    yield f"tile[{s}] landed (the drain)"
        self.loader_left = True

    def _copy(self, q: int, s: int, bar: Barrier):
        yield f"copy {q} in flight"
        if self.loader_left:
            raise SlotViolation(5, f"instruction {q}'s tile lands after the loader left")
        for p in self.pages_of[q]:
            if self.owner[p] != q or self.readers[p]:
                raise SlotViolation(3, f"instruction {q}'s tile lands in page {p}, held by "
                                       f"{self.owner[p]} and read by {self.readers[p]} threads")
            reading = [r for r, on in self.store_reads.items() if on and p in self.pages_of[r]]
            if reading:
                raise SlotViolation(7, f"instruction {q}'s tile lands in page {p} while the "
                                       f"stores of {reading} read it")
        self.landed.add(q)
        self.in_flight[s] -= 1
        if bar.valid:
            bar.complete_tx()

    # -- the compute threads ------------------------------------------------------------------
    def _thread(self, t: int):
        for q, ins in enumerate(self.queue):
            if q == self.stop_at:
                self.stopped = True
                yield from self._leave_compute(t)
                return
            s = self._slot(q)
            while not self.full[s].done(self._parity(q)):               # C1
                yield f"full[{s}] for {q}"
            if self.slot_rec[s] != q:
                raise SlotViolation(1, f"thread {t} runs slot {s} for {q} and finds "
                                       f"{self.slot_rec[s]}")
            if ins.paged:                                                # C2
                bar = self.tile[s]
                while not (self.misuse.no_tile_wait or bar.done(0)):
                    yield f"tile[{s}] for {q}"
                self.tile_waiters[q] -= 1
                if q not in self.landed:
                    raise SlotViolation(4, f"thread {t} reads instruction {q}'s tile before "
                                           f"it landed")
            for p in self.pages_of[q]:
                self.readers[p] += 1
            yield None
            for p in self.pages_of[q]:
                self.readers[p] -= 1
            if ins.paged:
                yield from self._store_out(t, q, ins)
            if self.slot_rec[s] != q:
                raise SlotViolation(1, f"slot {s} was refilled with {self.slot_rec[s]} while "
                                       f"thread {t} ran {q}")
            if t == 0 and self.misuse.release_early:
                self._release(q)
            self.finished[q] += 1
            while self.finished[q] < THREADS:                            # C3
                yield f"{q}'s compute barrier"
            if t == 0:                                                   # C4
                if ins.signals and ins.paged and q not in self.written:
                    raise SlotViolation(8, f"instruction {q} signals before its stores wrote")
                self._release(q)
                self.ran.add(q)
            self.empty[s].arrive()
            yield None
        yield from self._leave_compute(t)

    def _store_out(self, t: int, q: int, ins: Instr):
        """A paged record's write-back and thread 0's stores (ops/transpose.cuh)."""
        self.read_back[q] += 1
        yield None
        while self.read_back[q] < THREADS:                              # every read done
            yield f"{q}'s reads of its tile"
        self.wrote[q] += 1
        yield None
        while self.wrote[q] < THREADS and not (t == 0 and self.misuse.store_early):
            yield f"{q}'s write-back"
        if t != 0:
            return
        self.store_reads[q] = True
        self.actors.append(Actor(f"store {q}", self._store(q)))
        yield None
        while self.store_reads[q] and not self.misuse.no_read_wait:
            yield f"store {q} read"
        while (ins.signals and q not in self.written
               and not self.misuse.no_written_wait):
            yield f"store {q} written"

    def _store(self, q: int):
        if self.wrote[q] < THREADS:
            raise SlotViolation(10, f"instruction {q}'s stores read its pages with "
                                    f"{THREADS - self.wrote[q]} threads still to write them")
        for p in self.pages_of[q]:
            if self.owner[p] != q:
                raise SlotViolation(7, f"instruction {q}'s stores read page {p}, held by "
                                       f"{self.owner[p]}")
        yield None   # reading
        for p in self.pages_of[q]:
            if self.owner[p] != q:
                raise SlotViolation(7, f"instruction {q}'s stores read page {p}, handed back "
                                       f"to {self.owner[p]}")
        self.store_reads[q] = False
        yield None   # writing
        if self.compute_left:
            raise SlotViolation(9, f"instruction {q}'s stores write after the threads left")
        self.written.add(q)

    def _leave_compute(self, t: int):
        if t == 0 and not self.misuse.no_store_drain:
            while any(q not in self.written for q in self.store_reads):
                yield "every store written (the drain)"
        if t == 0:
            self.compute_left = True
            yield None

    def _release(self, q: int) -> None:
        if self.store_reads.get(q):
            raise SlotViolation(7, f"instruction {q}'s pages handed back while its stores "
                                   f"read them")
        for p in self.pages_of[q]:
            if self.owner[p] == q:
                self.owner[p] = None
