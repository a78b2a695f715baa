"""What a run shows while it works: tqdm bars where someone watches, a line a minute in a log or a pipe,
nothing on ranks other than 0, in study workers or under ``--json`` (:func:`quiet`)."""
from __future__ import annotations

import os
import sys
import time


def quiet(*args, **kwargs) -> None:
    """A log that says nothing (ranks other than 0, study workers, --json)."""
    return None


def show_progress(wanted: bool = True) -> bool:
    """Progress bars only where someone watches: asked for, stderr a terminal, TQDM_DISABLE unset."""
    if not wanted or _tqdm_disabled():
        return False
    return sys.stderr.isatty()


def _tqdm_disabled() -> bool:
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false")


PIPE_INTERVAL = 60.0  # seconds between progress lines when stderr is not a terminal


class _Lines:
    """A file for tqdm that turns its carriage-return redraws into whole lines (a log, a pipe), at most
    one every PIPE_INTERVAL seconds and the first PIPE_INTERVAL seconds after the bar starts."""

    def __init__(self):
        self.last = time.monotonic()

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        now = time.monotonic()
        if s and now - self.last >= PIPE_INTERVAL:
            self.last = now
            sys.stderr.write(s + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def bar_options(wanted: bool = True) -> dict:
    """tqdm's options for a progress bar: a bar on a terminal (:func:`show_progress`); where stderr
    is a pipe or a log, one line every PIPE_INTERVAL seconds, the first after PIPE_INTERVAL (so short
    work prints nothing and long work is never silent); none when not wanted or TQDM_DISABLE is set."""
    if show_progress(wanted):
        return {"disable": False}
    if not wanted or _tqdm_disabled():
        return {"disable": True}
    return {"disable": False, "file": _Lines(), "mininterval": min(1.0, PIPE_INTERVAL), "ncols": 100, "ascii": True}
