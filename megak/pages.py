"""The shared-memory page model.

Dynamic shared memory of one block (one per SM)::

    +------------------+-------+--------+--------+-----+-----------+
    | control area     | align | page 0 | page 1 | ... | page n-1  |
    | slots, page map  | slack | 16 KiB | 16 KiB |     | 16 KiB    |
    +------------------+-------+--------+--------+-----+-----------+
      MK_CONTROL_BYTES   <= MK_PAGE_ALIGN

The page count is what fits in the device's opt-in shared memory per block: 13 on H100/H200
(232,448 B opt-in). Each block runs two roles over ``SLOTS`` (instr.h MK_SLOTS, two)
instruction slots::

    loader warp    fetch q | acquire | early preload | wait | late preload | ready q  ...  q+1
    compute warps         ... q-1: phase 0 | release | phase 1 | release | signal, release rest

Rules, honoured by the simulator and the megakernel alike:

* the loader runs up to SLOTS - 1 instructions ahead: it fetches q into q's slot once the
  compute role has finished q - SLOTS, the slot's previous record, then takes the record's
  ``pages`` pages, lowest-numbered free pages first, strictly in queue order, waiting while
  too few are free;
* pages are handed over as they are released: the compute role gives back a declared group
  of the instruction's pages after each phase of its op, and the rest after its last phase,
  so a later instruction's loader can take and fill them while q still computes; a page is
  never taken while an earlier instruction still holds it;
* before the dependency wait the loader writes only loads of operands with no producer
  (MK_FLAG_B_READY); the rest of the op's first stages after it;
* which pages an op preloads, uses and releases in each phase is its page plan
  (``megak/page_plan.py``, mirrored by the device ops);
* every acquired page is released exactly once, by the instruction that acquired it; pages
  still held at the end of a queue are a leak (MK_ERR_PAGE_LEAK);
* an instruction needing more pages than the SM has is rejected at compile time.
"""
from __future__ import annotations

from . import abi
from .errors import GraphError

PAGE_BYTES = abi.PAGE_BYTES
SLOTS = abi.SLOTS

# What H100/H200 report; used where no device is queried (simulator, CI).
HOPPER_OPTIN_SMEM = 232_448


def smem_bytes(n_pages: int) -> int:
    """Dynamic shared memory the megakernel asks for to hold n_pages pages."""
    return abi.CONTROL_BYTES + abi.PAGE_ALIGN + n_pages * PAGE_BYTES


def pages_for(optin_smem_bytes: int, static_smem_bytes: int = 0) -> int:
    """How many pages fit in a block's opt-in shared memory (minus the kernel's static smem)."""
    room = optin_smem_bytes - static_smem_bytes - abi.CONTROL_BYTES - abi.PAGE_ALIGN
    return max(0, min(abi.MAX_PAGES, room // PAGE_BYTES))


DEFAULT_PAGES = pages_for(HOPPER_OPTIN_SMEM)


def ring_pages(n_pages: int, largest_record_pages: int) -> int:
    """Pages of each block's weight ring (mk_params.stream_pages): what the largest record
    leaves of n_pages, up to MK_STREAM_MAX_RING; 0 below MK_STREAM_MIN_RING (the streamed
    GEMMs then load B themselves)."""
    ring = min(n_pages - largest_record_pages, abi.OP_SHAPES["MK_STREAM_MAX_RING"])
    return ring if ring >= abi.OP_SHAPES["MK_STREAM_MIN_RING"] else 0


def check_page_needs(needs: int, n_pages: int, what: str) -> None:
    if needs > n_pages:
        raise GraphError(f"{what} needs {needs} shared-memory pages of {PAGE_BYTES} B; "
                         f"the plan has n_pages={n_pages} per SM (compile(n_pages=...); "
                         f"the default is as many as fit the device)")
