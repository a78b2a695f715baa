"""A trend: the least-squares slope of a figure over x, every run one point; not measured below 3 distinct x.

x is a grid axis's labels (``axis``, ``x``: label -> number, optional ``log2``), or with ``budgets`` (x -> a
results folder, relative to the study file) instead of ``axis``, each x's runs are that folder's cells ``a``
(and ``b``): a trend over studies that differ only in their budget. With ``b`` and ``paired: true`` the slope
is that of the paired gap a − b at each x.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import UserError
from .. import rules
from ..cells import Row, by_seed, values
from .base import CELL, Floored, key


@dataclass
class Trend(Floored):
    """The slope of a's figure (or the paired gap a − b) over x, on the claimed ``side``."""

    axis: Optional[str] = key(None, "the grid axis whose labels are x")
    x: Dict[Any, float] = key(help="the axis's label -> its number", factory=dict)
    budgets: Optional[Dict[Any, str]] = key(None, "x -> a results folder, relative to the study file (3 or more)")
    x_name: Optional[str] = key(None, "what x is called in the row (default: the axis)")
    log2: bool = key(False, "the slope per doubling of x")
    side: int = key(1, "the claimed sign of the slope: +1 or -1")
    a: Optional[Dict[str, Any]] = key(None, CELL)
    b: Optional[Dict[str, Any]] = key(None, CELL)
    paired: bool = key(False, "the gap a - b taken seed by seed at each x")

    def check(self, claim: Any, where: str) -> None:
        super().check(claim, where)
        if self.budgets is not None and (len(self.budgets) < 3 or self.axis is not None):
            raise UserError(f"{where}: `budgets` (x -> results folder, 3 or more) belongs to a trend claim without "
                            "`axis`")
        if self.budgets is None and self.axis is None:
            raise UserError(f"{where}: a trend claim needs `axis` and `x` (label -> number), or `budgets`")
        if self.axis is not None:
            if self.axis not in claim.labels:
                raise UserError(f"{where}: the study has no axis {self.axis!r}")
            missing = sorted(set(map(str, self.x)) - set(claim.labels[self.axis]))
            if missing:
                raise UserError(f"{where}: the study's axis {self.axis!r} has no label(s) {', '.join(missing)}")

    def cells(self) -> List[Dict[str, Any]]:
        return [c for c in (self.a, self.b) if c is not None]

    def sides(self) -> List[Dict[str, Any]]:
        return [self.a or {}] + ([self.b] if self.b is not None else [])

    def read_cells(self) -> List[Dict[str, Any]]:
        if self.budgets is not None:  # its own study's runs: the cells a and b
            return self.sides()
        return [{self.axis: label, **side} for label in self.x for side in self.sides()]

    # its points
    def folder(self, claim: Any, folder: Any) -> Path:
        """A ``budgets`` entry's results folder (relative to the study file)."""
        return (claim.study.parent / str(folder)).resolve() if claim.study else Path(str(folder))

    def points(self, rows: List[Row], claim: Any) -> List[Tuple[str, float, List[Row], Dict[str, Any]]]:
        """(label, x, the rows it reads, the cell that picks its x) of each point: a grid axis's labels, or
        with ``budgets`` the runs of each named results folder (this study's own rows for its own)."""
        if self.budgets is None:
            return [(label, x, rows, {self.axis: label}) for label, x in self.x.items()]
        out = []
        for x, folder in self.budgets.items():
            where = self.folder(claim, folder)
            if claim.results is not None and where == Path(claim.results).resolve():
                here = rows
            else:
                csv_path = where / "results.csv"
                here = list(csv.DictReader(csv_path.open())) if csv_path.is_file() else []
            out.append((str(x), float(x), here, {}))
        return out

    def by_x(self, rows: List[Row], claim: Any) -> List[Tuple[str, float, List[Tuple[str, float]]]]:
        """(x label, x, [(seed, value)]) of each x: a's figure, or the paired gap a - b per seed."""
        out = []
        for label, x, here, cell in self.points(rows, claim):
            a = values(here, {**cell, **(self.a or {})}, self.figure)
            if self.b is not None:
                da, db = by_seed(a, "a"), by_seed(values(here, {**cell, **self.b}, self.figure), "b")
                got = [(seed, da[seed] - db[seed]) for seed in sorted(da.keys() & db.keys())]
            else:
                got = a
            out.append((label, x, got))
        return out

    def with_budgets(self, labels: Sequence[str]) -> "Trend":
        """The trend restricted to the budgets ``labels`` (its reading on part of its inputs)."""
        return replace(self, budgets={x: f for x, f in (self.budgets or {}).items() if str(x) in set(labels)})

    # deciding and showing
    def verdict(self, rows: List[Row], claim: Any) -> rules.Decision:
        xs, ys = [], []
        for _, x, got in self.by_x(rows, claim):
            xs += [float(x)] * len(got)
            ys += [v for _, v in got]
        return rules.trend(xs, ys, side=self.side, log2_x=self.log2)

    def rule_text(self) -> str:
        axis = self.axis if self.x_name is None else self.x_name
        over = f" over log2({axis})" if self.log2 else f" over {axis}" if axis else ""
        return f"trend (least-squares slope{over})"

    def seeds_text(self, n: int, need: str) -> str:
        """n counts runs; the seeds needed count repetitions of the x values."""
        per = self.x_name or (self.axis if self.axis is not None else "x")
        return f" (n = {n} runs; at this effect and spread the rule decides with {need} seeds per {per})"
