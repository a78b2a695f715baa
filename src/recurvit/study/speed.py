"""Speed figures a loaded machine cannot make: which speed-ups a claim may decide on.

A wall-clock speed-up measured while other processes share the cores says how busy the machine was, and
one above what the skipped computation allows says the timing is off. So every speed figure a claim reads
(a results.csv column named ``<p>speedup``, e.g. ``deploy_speedup``, or a ratio of a benchmark's JSON) is
read through three checks, in this order:

1. **load**: the file records the machine's 1-minute load average before and during the timing and its
   cores (``<p>load_before``, ``<p>load_during``, ``<p>cores``; the measurement's own threads
   ``<p>threads``, default 1, are not counted against it: the reading before follows the run's own warm-up
   calls). Above :data:`LOAD_LIMIT` per core, or with no
   record, the claim decides nothing: **not measured: loaded** / **not measured: load not recorded**
   (a benchmark JSON: ``load_before``, ``load_after``, ``cores``, else its own ``loaded`` mark);
2. **interval**: a ``min`` bound decides on the lower end of the figure's 95% interval (``<p>speedup_lo``;
   a ``max`` bound on ``<p>speedup_hi``), never on the point estimate: **not measured: no interval**
   without one;
3. **compute ceiling**: an early exit that runs ``<p>steps_pct_T`` percent of T's steps can be at most
   ``(E + T S + R) / (E + m (S + C) + R)`` times faster, with ``m`` the mean steps, ``S`` a step's FLOPs,
   ``E`` the embedding's, ``R`` the readout's and ``C`` the per-step exit check's (``<p>flops_step``,
   ``<p>flops_embed``, ``<p>flops_readout``, ``<p>flops_check``; T is the run's ``steps``). Where the file
   does not split the FLOPs the ceiling is the step ratio ``100 / <p>steps_pct_T``, which embedding and
   readout only lower. A figure above its ceiling is **flagged**, not reported: the seed counts as neither
   met nor missed unless another bound already fails it. (The step share must be that of the images timed:
   a share over more images than were timed makes the ceiling approximate.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from .cells import Row, as_number

LOAD_LIMIT = 0.5  # load average per core above which the machine is loaded (as the benchmarks/ scripts mark it)
LOADED = "not measured: loaded"
UNRECORDED = "not measured: load not recorded"
NO_INTERVAL = "not measured: no interval"
FLAGGED = "flagged"
SUFFIX = "speedup"


def is_speed(column: str) -> bool:
    """Whether a results.csv column is a wall-clock speed-up (its name ends in ``speedup``)."""
    return str(column).endswith(SUFFIX)


def _prefix(column: str) -> str:
    return column[: -len(SUFFIX)]


def loaded(before: Optional[float], during: Optional[float], cores: Optional[float], threads: float = 1.0,
           own_before: bool = False) -> str:
    """"" on a quiet machine, else :data:`LOADED` or :data:`UNRECORDED`. The measurement's own ``threads`` are
    not counted against the reading during it, nor against the one before it where that reading follows the
    measuring process's own work (``own_before``: a run's evaluator reads it after its warm-up calls)."""
    if before is None or during is None or not cores:
        return UNRECORDED
    limit = LOAD_LIMIT * cores
    return LOADED if before - (threads if own_before else 0.0) > limit or during - threads > limit else ""


def ceiling(row: Row, column: str) -> Tuple[Optional[float], str]:
    """The compute ceiling of a run's speed-up ``column`` and how it was counted (None: no step share)."""
    p = _prefix(column)
    pct = as_number(row.get(p + "steps_pct_T"))
    if pct is None or pct <= 0:
        return None, ""
    step, T = as_number(row.get(p + "flops_step")), as_number(row.get("steps"))
    if step and T:
        embed, readout = (as_number(row.get(p + k)) or 0.0 for k in ("flops_embed", "flops_readout"))
        check = as_number(row.get(p + "flops_check")) or 0.0
        m = pct / 100 * T
        return ((embed + T * step + readout) / (embed + m * (step + check) + readout),
                f"{pct:.1f}% of T's steps; embedding and readout counted")
    return 100 / pct, f"{pct:.1f}% of T's steps; the step ratio alone: embedding and readout not recorded"


@dataclass(frozen=True)
class Reading:
    """A run's speed figure as a bound may read it."""

    mean: Optional[float]
    value: Optional[float]  # what the bound decides on: the interval's end (None: flagged or no interval)
    state: str              # "" (quiet), LOADED, UNRECORDED, NO_INTERVAL or FLAGGED
    text: str               # how the table shows it


def read(row: Row, column: str, bound: Mapping[str, float]) -> Reading:
    """A run's speed-up ``column`` through the load, interval and ceiling checks (module docstring)."""
    p = _prefix(column)
    mean = as_number(row.get(column))
    if mean is None:
        return Reading(None, None, "", "-")
    lo, hi = as_number(row.get(column + "_lo")), as_number(row.get(column + "_hi"))
    shown = f"{mean:.3g}x" + (f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else "")
    top, how = ceiling(row, column)
    if top is not None and mean > top + 1e-9:  # flagged whatever else holds: the figure is not reported
        shown = f"flagged: above its compute ceiling of {top:.3g}x ({how})"
    state = loaded(as_number(row.get(p + "load_before")), as_number(row.get(p + "load_during")),
                   as_number(row.get(p + "cores")), as_number(row.get(p + "threads")) or 1.0, own_before=True)
    end = lo if "min" in bound else hi
    if not state and end is None:
        state = NO_INTERVAL
    if not state and shown.startswith(FLAGGED):
        state = FLAGGED
    return Reading(mean, None if state else end, state, shown)


def json_state(data: Mapping[str, Any]) -> str:
    """A benchmark JSON's load: its record of the load before and after (during) the run and its cores,
    else its own ``loaded`` mark (taken at the same limit); "" when quiet."""
    before, after = data.get("load_before"), data.get("load_after")
    if not before or not after:
        return UNRECORDED
    cores = data.get("cores")
    if cores:
        return loaded(float(before[0]), float(after[0]), float(cores), float(data.get("threads", 1)))
    return LOADED if data.get("loaded") else ""


def ratio_flag(entry: Mapping[str, Any]) -> str:
    """"" or a flag for a benchmark ratio above the compute ceiling its entry records (``ceiling``)."""
    top = entry.get("ceiling")
    mean = entry.get("mean")
    if isinstance(top, (int, float)) and isinstance(mean, (int, float)) and not math.isnan(mean) and mean > top:
        return f"flagged: above its compute ceiling of {top:.3g}x"
    return ""


__all__ = ["LOAD_LIMIT", "LOADED", "UNRECORDED", "NO_INTERVAL", "FLAGGED", "is_speed", "loaded", "ceiling",
           "Reading", "read", "json_state", "ratio_flag"]
