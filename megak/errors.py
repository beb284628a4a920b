"""The error model: bad input is a GraphError before anything runs; what goes wrong while the
megakernel runs comes back as a status record, decoded here the same way for both backends."""
from __future__ import annotations

from . import abi



def fmt_bytes(n: int) -> str:
    """A byte count for messages: '1.50 GiB (1,610,612,736 B)'."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit} ({n:,} B)"
    return f"{n:,} B"

class GraphError(ValueError):
    """A bad graph, or inputs that do not match it. Raised before any launch."""


class MegakernelError(RuntimeError):
    """The megakernel (or the simulator running the same queues) stopped on an error.

    ``record`` is the decoded status record (dict); ``sm_states`` the per-SM records.
    """

    def __init__(self, message: str, record: dict | None = None,
                 sm_states: list[dict] | None = None):
        super().__init__(message)
        self.record = record or {}
        self.sm_states = list(sm_states) if sm_states is not None else []


class MegakernelHang(MegakernelError):
    """A wait never completed: deadline passed on the GPU, or no SM could progress in the
    simulator. The record names the SM, queue index, opcode, counter, expected and observed."""


def status_to_dict(status) -> dict:
    return {name: int(status[name]) for name in abi.STATUS_DTYPE.names}


def sm_states_to_dicts(sm_states) -> list[dict]:
    return [{name: int(row[name]) for name in abi.SM_STATE_DTYPE.names} for row in sm_states]


def raise_for_status(status, sm_states, op_labels: list[str], instrs=None, queue_start=None,
                     backend: str = "") -> None:
    """Raise MegakernelHang / MegakernelError if the status record holds an error.

    ``status``: one mk_status record (numpy void or dict); ``sm_states``: mk_sm_state rows;
    ``op_labels``: op_index -> human-readable graph op.
    """
    rec = status if isinstance(status, dict) else status_to_dict(status)
    if rec["error"] == abi.ERRORS["MK_OK"]:
        return
    if sm_states is None or len(sm_states) == 0:
        states = []
    elif isinstance(sm_states[0], dict):
        states = list(sm_states)
    else:
        states = sm_states_to_dicts(sm_states)
    code = rec["error"]
    name = abi.ERROR_NAMES.get(code, f"error {code}")

    def label(op_index: int) -> str:
        return op_labels[op_index] if 0 <= op_index < len(op_labels) else f"op #{op_index}"

    opname = abi.OPCODE_NAMES.get(rec["opcode"], f"opcode {rec['opcode']}")
    head = (f"{backend + ': ' if backend else ''}{name} on SM {rec['sm']}, queue index "
            f"{rec['queue_index']} ({opname} instruction of {label(rec['op_index'])})")
    # a counter wait always has a target > 0; expected = 0 marks the GPU's loader warp waiting
    # for its own SM's compute warps (an instruction that ran past the deadline)
    own_sm = code == abi.ERRORS["MK_ERR_TIMEOUT"] and rec["expected"] == 0
    if own_sm:
        head += (": waited for this SM's previous instructions to finish (not a counter): one "
                 "ran past the deadline")
    elif code == abi.ERRORS["MK_ERR_TIMEOUT"]:
        head += ": waited for " + _wait_text(rec)
    lines = [head]
    have_queues = instrs is not None and queue_start is not None and len(states) > 0
    if code == abi.ERRORS["MK_ERR_TIMEOUT"] and have_queues and not own_sm:
        lines.append(f"  producers of {_waited_on(rec['counter'])}: "
                     + _producers(rec["counter"], instrs, queue_start, states, label))
    stuck = [(sm, s) for sm, s in enumerate(states)
             if s["error"] == abi.ERRORS["MK_ERR_TIMEOUT"] and sm != rec["sm"]]
    for sm, s in stuck[:16]:
        line = (f"  SM {sm}: queue index {s['queue_index']} ({label(s['op_index'])}) "
                f"waits for {_wait_text(s)}")
        if have_queues:
            line += "; producers: " + _producers(s["counter"], instrs, queue_start, states,
                                                 label)
        lines.append(line)
    if len(stuck) > 16:
        lines.append(f"  ... and {len(stuck) - 16} more SMs waiting")
    cls = MegakernelHang if code == abi.ERRORS["MK_ERR_TIMEOUT"] else MegakernelError
    raise cls("\n".join(lines), rec, states)


def _waited_on(counter: int) -> str:
    """What a wait record's counter field names: a counter, or (MK_FLAG_WAIT | slot) the
    flagged words of a tensor slot (device/flag.cuh)."""
    if counter & abi.FLAG_WAIT:
        return f"the flagged words of tensor slot {counter & (abi.FLAG_WAIT - 1)}"
    return f"counter {counter}"


def _wait_text(rec: dict) -> str:
    if rec["counter"] & abi.FLAG_WAIT:
        return (f"{_waited_on(rec['counter'])} to carry this run's stamp {rec['expected']}, "
                f"observed stamp {rec['observed']}")
    return f"counter {rec['counter']} to reach {rec['expected']}, observed {rec['observed']}"


def _producers(counter: int, instrs, queue_start, states: list[dict], label, most: int = 4) -> str:
    """Which instructions signal `counter` (or write the flagged tensor it names), and
    whether each has run: a producer that never ran and waits itself shows the cycle; one
    that is simply missing shows a lost signal."""
    import numpy as np
    if counter & abi.FLAG_WAIT:
        mask = instrs["tensor"][:, abi.ARG_OUT] == (counter & (abi.FLAG_WAIT - 1))
        pos = np.nonzero(mask & (instrs["opcode"] != abi.OP_NOP))[0]
    else:
        n_sig = instrs["n_signals"].astype(np.int64)
        mask = (np.arange(abi.MAX_SIGNALS)[None, :] < n_sig[:, None]) & \
            (instrs["signal_counter"] == counter)
        pos = np.nonzero(mask.any(axis=1))[0]
    if len(pos) == 0:
        return "none: no instruction produces it (a missing producer)"
    qs = np.asarray(queue_start, dtype=np.int64)
    parts, pending = [], 0
    for p in pos:
        sm = int(np.searchsorted(qs, p, side="right") - 1)
        q = int(p - qs[sm])
        reached = states[sm]["queue_index"] if sm < len(states) else 0
        done = states[sm]["error"] == abi.ERRORS["MK_OK"] or q < reached
        if not done:
            pending += 1
            if len(parts) < most:
                waiting = states[sm]["error"] == abi.ERRORS["MK_ERR_TIMEOUT"]
                how = ("waiting itself" if q == reached and waiting else
                       f"queued behind SM {sm} queue index {reached}, which waits" if waiting
                       else "not reached")
                parts.append(f"SM {sm} queue index {q} ({label(int(instrs['op_index'][p]))}, "
                             f"{how})")
    if pending == 0:
        return f"all {len(pos)} ran (a signal was lost)"
    more = f", ... {pending - len(parts)} more" if pending > len(parts) else ""
    return f"{pending} of {len(pos)} not done: " + ", ".join(parts) + more
