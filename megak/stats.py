"""`Program.stats`: the scheduler's numbers as a dict, printed as a few readable lines."""
from __future__ import annotations

import statistics

__all__ = ["Stats"]

# dropped ops named in the summary; the rest are counted
_LABELS_SHOWN = 3


class Stats(dict):
    """What `megak.scheduler.stats` reports about a compiled program, as a dict (keys
    ``instructions``, ``instructions_per_opcode``, ``queue_lengths``, ``counters``,
    ``pages_per_sm``, ``stream_pages`` (of those, the weight stream's ring; 0 where nothing
    streams), ``peak_pages_per_sm`` (held by instructions), ``n_sm``, and ``dropped_ops`` where
    the scheduler reports it) whose repr is `summary()` instead of every per-SM list."""

    def summary(self) -> str:
        """A few lines: instructions in total and per opcode, SMs used, queue lengths,
        counters, pages, and the graph ops dropped because no output depends on them."""
        queues = list(self.get("queue_lengths", []))
        n_sm = self.get("n_sm", len(queues))
        used = sum(1 for n in queues if n > 0)
        per_opcode = ", ".join(f"{op} {n}" for op, n in
                               sorted(self.get("instructions_per_opcode", {}).items()))
        lines = [f"{self.get('instructions', sum(queues))} instructions "
                 f"({per_opcode or 'none'}) on {used} of {n_sm} SMs"]
        if queues:
            lines.append(f"queue length per SM: min {min(queues)}, "
                         f"median {statistics.median(queues):g}, max {max(queues)}")
        lines.append(f"counters: {self.get('counters', 0)}")
        peak = self.get("peak_pages_per_sm") or [0]
        ring = self.get("stream_pages", 0)
        ring_text = f"{ring} for the weight stream's ring, " if ring else ""
        lines.append(f"pages per SM: {self.get('pages_per_sm', '?')} "
                     f"({ring_text}peak in use on one SM: {max(peak)})")
        if "dropped_ops" in self:
            lines.append(_dropped_line(list(self["dropped_ops"])))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer, cycle) -> None:
        # IPython: the summary, not its pretty-printed dict
        printer.text(self.summary())


def _dropped_line(labels: list[str]) -> str:
    if not labels:
        return "dropped ops: none (every op feeds an output)"
    head = (f"dropped ops: {len(labels)} (no output depends on "
            f"{'it' if len(labels) == 1 else 'them'})")
    shown = ", ".join(labels[:_LABELS_SHOWN])
    more = f", ... {len(labels) - _LABELS_SHOWN} more" if len(labels) > _LABELS_SHOWN else ""
    return f"{head}: {shown}{more}"
