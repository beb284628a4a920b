"""What every SM did: per-instruction phase timestamps, from the GPU (%globaltimer, ns) or the
simulator (logical steps), with exporters.

    prog.run(..., trace=True); tr = prog.last_trace
    tr.save_json("t.json")   # open in ui.perfetto.dev: a track per SM, a slice per instruction
    tr.save_png("t.png")     # SM x time picture, coloured by op, waits shaded (megak[plot])
    print(tr.summary())      # per op: time, GB/s, TFLOP/s vs ceilings; idle fraction per SM
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from . import abi

_P = abi.TRACE_PHASES
_FETCH, _WAITED, _ACQUIRED = _P["MK_T_FETCH"], _P["MK_T_WAITED"], _P["MK_T_ACQUIRED"]
_LOADED, _COMPUTED, _STORED = _P["MK_T_LOADED"], _P["MK_T_COMPUTED"], _P["MK_T_STORED"]

# boundary names, indexed like mk_trace_event.t
PHASES = ["fetch", "waited", "acquired", "loaded", "computed", "stored"]
# The order in which an instruction passes them: the loader warp fetches, takes its pages,
# waits for its counters (and preloads); the compute role starts the op (loaded), finishes
# it (computed) and stores and signals (stored).
ORDER = [_FETCH, _ACQUIRED, _WAITED, _LOADED, _COMPUTED, _STORED]
# slices between consecutive boundaries in that order: "acquire" is the wait for free pages,
# "wait" the dependency wait, "load" the late preloads and the wait for the compute role
SEGMENTS = [("acquire", _FETCH, _ACQUIRED), ("wait", _ACQUIRED, _WAITED),
            ("load", _WAITED, _LOADED), ("compute", _LOADED, _COMPUTED),
            ("store", _COMPUTED, _STORED)]

# H200 ceilings measured with vendor libraries (the baselines of benchmarks/report.py TARGETS): fp32 GEMM, copy.
DEFAULT_CEILINGS = {"fp32_tflops": 50.8, "bf16_tflops": 766.0, "hbm_gbps": 4171.0}


class PlotUnavailable(ImportError):
    """Trace.save_png cannot draw: matplotlib cannot be imported. The message says why and
    how to install it, in one line; Trace.save_json needs nothing."""


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")   # files only: never needs a display
        import matplotlib.pyplot as plt
    except ImportError as e:
        # e.name is the module that failed: matplotlib itself, or one of its dependencies
        why = ("matplotlib is not installed" if e.name == "matplotlib"
               else f"matplotlib cannot be imported: {e}")
        raise PlotUnavailable(f"{why}: pip install megak[plot]") from None
    return plt


@dataclass
class Trace:
    events: np.ndarray                 # abi.TRACE_DTYPE, one per executed instruction
    op_labels: list[str]
    op_kinds: list[str]
    op_flops: list[float]
    op_bytes: list[float]
    n_sm: int
    n_pages: int
    own_pages: np.ndarray              # pages each event's instruction acquired
    op_dtypes: list[str] = field(default_factory=list)  # bf16 GEMMs compare to tensor cores
    unit: str = "ns"                   # "ns" on the GPU, "step" in the simulator
    ceilings: dict = field(default_factory=lambda: dict(DEFAULT_CEILINGS))

    # -- views ------------------------------------------------------------------------------
    def _t(self) -> np.ndarray:
        t = self.events["t"].astype(np.float64)
        return t - (t[:, _FETCH].min() if len(t) else 0.0)

    @property
    def span(self) -> float:
        t = self._t()
        return float(t[:, _STORED].max()) if len(t) else 0.0

    def busy_fraction(self) -> np.ndarray:
        """Per SM: share of its span (first fetch to last store) in which the compute role
        runs an op (the union of [loaded, stored]). 0 for an SM that ran nothing."""
        t = self._t()
        busy = np.zeros(self.n_sm)
        for sm in range(self.n_sm):
            m = self.events["sm"] == sm
            if not m.any():
                continue
            span = t[m, _STORED].max() - t[m, _FETCH].min()
            run = _union_length(t[m, _LOADED], t[m, _STORED])
            busy[sm] = min(run / span, 1.0) if span > 0 else 1.0
        return busy

    def bubble_fraction(self) -> np.ndarray:
        """Per SM: share of its span in which the compute role waits for the next
        instruction (its loads, dependencies or pages): 1 - busy_fraction."""
        return 1.0 - self.busy_fraction()

    def bubble_summary(self) -> dict:
        """Mean, median and max bubble fraction over the SMs that ran anything."""
        used = self._used_sms()
        if not used:
            return {"mean": 0.0, "median": 0.0, "max": 0.0, "sms": 0}
        bub = self.bubble_fraction()[used]
        return {"mean": float(bub.mean()), "median": float(np.median(bub)),
                "max": float(bub.max()), "sms": len(used)}

    def _used_sms(self) -> list[int]:
        return sorted(set(int(s) for s in self.events["sm"]))

    def pages_over_time(self, sm: int) -> tuple[np.ndarray, np.ndarray]:
        """(times, pages held) on one SM, counting each instruction's pages from its acquire
        boundary to its store boundary: an upper bound, since ops give pages back in phases
        before they store (page_plan.py) and the trace does not record those moments."""
        m = self.events["sm"] == sm
        return _held(self.own_pages[m], self._t()[m])

    # -- exporters --------------------------------------------------------------------------
    def to_chrome(self) -> dict:
        scale = 1e-3 if self.unit == "ns" else 1.0   # chrome wants microseconds
        t = self._t() * scale
        out = []
        for sm in range(self.n_sm):
            out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": sm,
                        "args": {"name": f"SM {sm}"}})
        for i, e in enumerate(self.events):
            sm = int(e["sm"])
            label = self.op_labels[int(e["op_index"])]
            out.append({"ph": "X", "pid": 0, "tid": sm, "name": label,
                        "cat": abi.OPCODE_NAMES.get(int(e["opcode"]), "?"),
                        "ts": t[i, _FETCH], "dur": max(t[i, _STORED] - t[i, _FETCH], 0.0),
                        "args": {"queue_index": int(e["queue_index"]), "slot": int(e["slot"]),
                                 **{p: float(t[i, k]) for k, p in enumerate(PHASES)}}})
            for name, a, b in SEGMENTS:
                if t[i, b] > t[i, a]:
                    out.append({"ph": "X", "pid": 0, "tid": sm, "name": name, "cat": "phase",
                                "ts": t[i, a], "dur": t[i, b] - t[i, a]})
        for sm in sorted(set(self.events["sm"].tolist())):
            times, held = self.pages_over_time(sm)
            for tt, h in zip(times, held):
                out.append({"ph": "C", "pid": 0, "tid": sm, "name": f"pages SM {sm}",
                            "ts": tt * scale, "args": {"pages": int(h)}})
        return {"traceEvents": out, "displayTimeUnit": "ns",
                "otherData": {"unit": self.unit, "n_sm": self.n_sm, "n_pages": self.n_pages}}

    def save_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_chrome(), f)

    def save_png(self, path, max_sms: int | None = None) -> None:
        """Raises PlotUnavailable (an ImportError) when matplotlib cannot be imported."""
        plt = _pyplot()
        t = self._t() * (1e-3 if self.unit == "ns" else 1.0)
        unit = "µs" if self.unit == "ns" else "steps"
        sms = sorted(set(self.events["sm"].tolist()))[:max_sms]
        kinds = sorted(set(self.op_kinds))
        cmap = plt.get_cmap("tab10")
        colour = {k: cmap(i % 10) for i, k in enumerate(kinds)}
        fig, ax = plt.subplots(figsize=(12, max(2.5, 0.18 * len(sms) + 1.5)))
        row = {sm: i for i, sm in enumerate(sms)}
        for i, e in enumerate(self.events):
            sm = int(e["sm"])
            if sm not in row:
                continue
            y = row[sm]
            # the loader's time below (pages, dependencies) while the previous op runs
            ax.broken_barh([(t[i, _FETCH], max(t[i, _WAITED] - t[i, _FETCH], 0))],
                           (y - 0.4, 0.8),
                           facecolors="lightgrey", hatch="///", edgecolor="grey", lw=0,
                           zorder=1)
            kind = self.op_kinds[int(e["op_index"])]
            ax.broken_barh([(t[i, _LOADED], max(t[i, _STORED] - t[i, _LOADED], 1e-9))],
                           (y - 0.4, 0.8),
                           facecolors=colour[kind], edgecolor="black", lw=0.2, zorder=2)
        ax.set_yticks(range(len(sms)))
        ax.set_yticklabels([f"SM {s}" for s in sms], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel(f"time ({unit})")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colour[k]) for k in kinds]
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="lightgrey", hatch="///"))
        ax.legend(handles, kinds + ["waiting"], loc="upper right", fontsize=7)
        ax.set_title(f"megak trace: {len(self.events)} instructions on {len(sms)} SMs")
        fig.tight_layout()
        fig.savefig(path, dpi=130)
        plt.close(fig)

    def summary(self) -> str:
        t = self._t()
        lines = [f"trace: {len(self.events)} instructions, {self.n_sm} SMs, span "
                 f"{self._fmt(self.span)}"]
        for op_index, label in enumerate(self.op_labels):
            m = self.events["op_index"] == op_index
            if not m.any():
                continue
            end = t[m, _STORED].max()
            run = end - t[m, _WAITED].min()
            line = f"  {label}: {m.sum()} instr, {self._fmt(run)}"
            if self.unit == "ns" and run > 0:
                gbps = self.op_bytes[op_index] / run
                line += f", {gbps:.0f} GB/s ({100 * gbps / self.ceilings['hbm_gbps']:.0f}% of " \
                        f"{self.ceilings['hbm_gbps']:.0f})"
                if self.op_flops[op_index]:
                    tf = self.op_flops[op_index] / run / 1e3
                    bf16 = op_index < len(self.op_dtypes) and \
                        self.op_dtypes[op_index] == "bfloat16"
                    ceil = self.ceilings["bf16_tflops" if bf16 else "fp32_tflops"]
                    line += f", {tf:.2f} TFLOP/s ({100 * tf / ceil:.0f}% of {ceil})"
            lines.append(line)
        used = self._used_sms()
        if used:
            b = self.bubble_summary()
            lines.append(f"  idle (bubble) fraction of the compute role per SM: mean "
                         f"{b['mean']:.2f}, median {b['median']:.2f}, max {b['max']:.2f} over "
                         f"{b['sms']} SMs that ran")
            bub = self.bubble_fraction()
            worst = sorted(used, key=lambda s: -bub[s])[:4]
            lines.append("  most idle: " + ", ".join(f"SM {s} {bub[s]:.2f}" for s in worst))
        return "\n".join(lines)

    def _fmt(self, x: float) -> str:
        return f"{x / 1e3:.2f} us" if self.unit == "ns" else f"{x:.0f} steps"


def _union_length(start: np.ndarray, end: np.ndarray) -> float:
    order = np.argsort(start)
    total, cur_s, cur_e = 0.0, None, None
    for s, e in zip(start[order], end[order]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return float(total)


def _held(own: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pages held over time on one SM: +own pages at acquire, -own pages at store."""
    own = own.astype(np.int64)
    times = np.concatenate([t[:, _ACQUIRED], t[:, _STORED]])
    deltas = np.concatenate([own, -own])
    order = np.lexsort((deltas, times))   # releases before acquires at equal times
    return times[order], np.cumsum(deltas[order])
