"""The shared-memory page model.

Dynamic shared memory of one block (one per SM)::

    +------------------+-------+--------+--------+-----+-----------+
    | control area     | align | page 0 | page 1 | ... | page n-1  |
    | slots, page map  | slack | 16 KiB | 16 KiB |     | 16 KiB    |
    +------------------+-------+--------+--------+-----+-----------+
      MK_CONTROL_BYTES   <= MK_PAGE_ALIGN

The page count is what fits in the device's opt-in shared memory per block: 13 on H100/H200
(232,448 B opt-in). Rules, honoured by the simulator and the megakernel alike:

* an instruction acquires all its pages before it runs and releases each one exactly once
  when it is done;
* an SM has two instruction slots: while the instruction in one slot runs, the next one may be
  fetched, wait for its dependencies and acquire pages that are free;
* an instruction needing more pages than the SM has is rejected at compile time.
"""
from __future__ import annotations

from . import abi
from .errors import GraphError

PAGE_BYTES = abi.PAGE_BYTES
SLOTS = 2

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


def check_page_needs(needs: int, n_pages: int, what: str) -> None:
    if needs > n_pages:
        raise GraphError(f"{what} needs {needs} shared-memory pages of {PAGE_BYTES} B; "
                         f"this device has {n_pages}")
