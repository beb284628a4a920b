"""Writing a trace to a directory for a command line `--trace DIR`: the JSON always, the
PNG when matplotlib is there (`pip install megak[plot]`), one line of news per file."""
from __future__ import annotations

from pathlib import Path

from .trace import PlotUnavailable, Trace


class TraceDirError(ValueError):
    """A `--trace` path that cannot be a directory. The message is one line."""


def make_trace_dir(path) -> Path:
    """Create the directory `path` (and its parents) if needed. Call it before running
    anything, so a bad path costs no run."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise TraceDirError(f"{path} is a file, not a directory; give a directory "
                            f"(it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TraceDirError(f"cannot create the directory {path}: {e.strerror}") from None
    return out


def save_trace_files(trace: Trace, directory, stem: str) -> list[str]:
    """Write <stem>.json and, if matplotlib can be imported, <stem>.png into `directory`.
    Returns one line per file for the caller to print (what was written, or why the PNG
    was skipped)."""
    out = make_trace_dir(directory)
    json_path, png_path = out / f"{stem}.json", out / f"{stem}.png"
    trace.save_json(json_path)
    lines = [f"trace: {json_path} (open in ui.perfetto.dev)"]
    try:
        trace.save_png(png_path)
        lines.append(f"trace: {png_path}")
    except PlotUnavailable as e:
        lines.append(f"trace: PNG skipped ({e})")
    return lines
