"""Cells and figures: which runs of a study a claim reads, and each run's value of the claim's figure.

A cell is a mapping axis -> grid label (or a list of labels, pooled); a figure is a results.csv column,
``"col_a - col_b"`` or ``{mean_of: [cols], minus: col, skip_own: axis}`` (see :mod:`recurvit.study.claims`).
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..errors import UserError

SEED_KEY = "train.seed"  # the grid axis a study averages over (recurvit.study.spec uses this one)
Row = Dict[str, Any]


def in_cell(row: Row, cell: Mapping[str, Any]) -> bool:
    """A run belongs to a cell when its label on each named axis is the cell's (or one of a list)."""
    return all(str(row.get(axis)) in (list(map(str, label)) if isinstance(label, list) else [str(label)])
               for axis, label in cell.items())


def as_number(v: Any) -> Optional[float]:
    if v is None or v == "":
        return None
    x = float(v)
    return None if math.isnan(x) else x


def figure_of(row: Row, figure: Any) -> Optional[float]:
    """One run's value of a claim's figure (None when the run lacks it)."""
    if isinstance(figure, dict):
        own = str(row.get(figure.get("skip_own", ""), "\0"))
        vals = [as_number(row.get(c)) for c in figure["mean_of"] if not c.endswith("_" + own)]
        vals = [v for v in vals if v is not None]
        minus = as_number(row.get(figure["minus"])) if figure.get("minus") else 0.0
        if not vals or minus is None:
            return None
        return statistics.fmean(vals) - minus
    if " - " in figure:
        left, right = (s.strip() for s in figure.split(" - ", 1))
        a, b = as_number(row.get(left)), as_number(row.get(right))
        return None if a is None or b is None else a - b
    return as_number(row.get(figure))


def figure_columns(figure: Any) -> List[str]:
    """The results.csv columns a claim's figure reads."""
    if isinstance(figure, dict):
        return [*figure["mean_of"], *([figure["minus"]] if figure.get("minus") else [])]
    return [s.strip() for s in str(figure).split(" - ")]


def values(rows: Iterable[Row], cell: Mapping[str, Any], figure: Any) -> List[Tuple[str, float]]:
    """(seed, figure) of every run of the cell that has the figure, one run one observation."""
    out = []
    for r in rows:
        if in_cell(r, cell):
            v = figure_of(r, figure)
            if v is not None:
                out.append((str(r.get(SEED_KEY, r.get("seed"))), v))
    return out


def by_seed(vals: List[Tuple[str, float]], what: str) -> Dict[str, float]:
    seeds = [s for s, _ in vals]
    if len(set(seeds)) != len(seeds):
        raise UserError(f"a paired comparison needs one run per seed in each cell; {what} has several")
    return dict(vals)


def pair(a: List[Tuple[str, float]], b: List[Tuple[str, float]], paired: bool) -> Tuple[List[float], List[float]]:
    if paired:
        da, db = by_seed(a, "a"), by_seed(b, "b")
        seeds = sorted(da.keys() & db.keys())
        return [da[s] for s in seeds], [db[s] for s in seeds]
    return [v for _, v in a], [v for _, v in b]
