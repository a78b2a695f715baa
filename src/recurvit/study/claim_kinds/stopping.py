"""A stopping rule with a control: "the iterations a per-input stopping rule uses grow with the input's size"
cannot tell adaptive stopping from never settling (a model that solves nothing iterates to the rule's cap,
and more so on larger inputs).

Its keys: ``a`` (the cell), ``figure`` (the per-run slope of the rule's mean iterations over every size, as the
evaluator writes it), ``iters`` and ``solved`` (the per-size columns, ``{size}`` in them; the sizes are those
the results hold), ``cap`` (a column or a number: the rule's cap) and optional ``control`` (a cell that solves
nothing, which the rule must separate from). Iterations count as thinking longer only where the mazes the rule
stopped on were solved: each run's slope is taken over the sizes at which the rule solved a maze and stopped
below its cap (the resolution the results file holds: per size, not per maze). The verdict is **reproduced**
when that slope is above 0 and the every-size slope is above the control's; **holds vacuously** when the
every-size slope is above 0 but no two runs have two sizes where they solved anything (their iterations grow
only where they solve nothing or sit at the cap).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import UserError
from .. import rules
from ..cells import SEED_KEY, Row, as_number, in_cell, values
from ..decision import HOLDS_VACUOUSLY, NOT_MEASURED, NOT_REPRODUCED, NOT_SEPARABLE, REPRODUCED, Decision
from ..vacuous import size_name
from .base import CELL, OnFigure, is_number, key, seed_sorted

SIZE_COLUMN = "a per-size results column, {size} in it"


def sizes_of(rows: Sequence[Row], template: str) -> List[int]:
    """The sizes a per-size column template (``rule_stable_iters_{size}``) has in the rows, ascending."""
    pattern = re.compile("^" + re.escape(template).replace(re.escape("{size}"), r"(\d+)") + "$")
    return sorted({int(m.group(1)) for r in rows for k in r for m in [pattern.match(str(k))] if m})


def _slope(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def _span(sizes: Sequence[int]) -> str:
    if not sizes:
        return "none"
    if len(sizes) == 1:
        return f"{size_name(sizes[0])} only"
    return f"{size_name(sizes[0])} to {size_name(sizes[-1])}"


def _against_zero(vals: Sequence[float]) -> Decision:
    return rules.superiority(list(vals), [0.0] * len(vals), paired=True)


@dataclass
class Stopping(OnFigure):
    """A per-input stopping rule's iterations grow with size where the inputs it stopped on were solved, and
    beyond a ``control`` cell that solves nothing (see the module docstring)."""

    figure: Any = key(help="the per-run slope of the rule's mean iterations over every size")
    a: Dict[str, Any] = key(help=CELL)
    iters: str = key(help=SIZE_COLUMN)
    solved: str = key(help=SIZE_COLUMN)
    cap: Any = key(None, "a column or a number: the rule's cap")
    control: Optional[Dict[str, Any]] = key(None, "a cell that solves nothing, which the rule must separate from")

    def check(self, claim: Any, where: str) -> None:
        cap = self.cap
        if not all("{size}" in str(c) for c in (self.iters, self.solved)) or not self.figure or (
                cap is not None and not isinstance(cap, str) and not is_number(cap)):
            raise UserError(f"{where}: a stopping claim needs `a`, `figure` (the per-run slope over every size), "
                            "`iters` and `solved` (per-size columns with {size}) and optionally `cap` and `control`")
        super().check(claim, where)

    def cells(self) -> List[Dict[str, Any]]:
        return [self.a] + ([self.control] if self.control is not None else [])

    def _cap(self, row: Row) -> Optional[float]:
        if self.cap is None:
            return None
        return float(self.cap) if isinstance(self.cap, (int, float)) else as_number(row.get(self.cap))

    def _at(self, row: Row, template: str, size: int) -> Optional[float]:
        return as_number(row.get(template.replace("{size}", str(size))))

    def counted_sizes(self, row: Row, sizes: Sequence[int]) -> List[int]:
        """The sizes at which a run's stopping rule solved a maze and stopped, on the mean, below its cap."""
        cap = self._cap(row)
        out = []
        for s in sizes:
            it, solved = self._at(row, self.iters, s), self._at(row, self.solved, s)
            if it is not None and solved is not None and solved > 0 and (cap is None or it < cap):
                out.append(s)
        return out

    def _solves_up_to(self, rows: Sequence[Row], sizes: Sequence[int]) -> str:
        """What a control cell solves with the rule: "nothing at any size" / "nothing past 9x9"."""
        solving = [s for s in sizes for r in rows if (self._at(r, self.solved, s) or 0.0) > 0]
        if not solving:
            return "it solves nothing at any size"
        return f"it solves nothing past {size_name(max(solving))}" if max(solving) < max(sizes) else \
            "it solves mazes up to the largest size"

    def _control(self, rows: List[Row], mine: List[Row]) -> Optional[Decision]:
        if self.control is None:
            return None
        ctl_rows = [r for r in rows if in_cell(r, self.control)]
        d = rules.superiority([v for _, v in values(mine, self.a, self.figure)],
                              [v for _, v in values(ctl_rows, self.control, self.figure)])
        return Decision(d.verdict, d.estimate, d.lo, d.hi, d.p, d.n, d.seeds_needed, f"{d.note}; the control: "
                        f"{'/'.join(map(str, self.control.values()))}, "
                        f"{self._solves_up_to(ctl_rows, sizes_of(ctl_rows, self.iters))}")

    def decide(self, rows: List[Row], claim: Any, decided: Dict[str, Decision]) -> Decision:
        """``parts``: the slope where solved, over every size, and against the control."""
        mine = seed_sorted(rows, self.a)
        sizes = sizes_of(mine, self.iters)
        every = _against_zero([v for _, v in values(mine, self.a, self.figure)])
        where, counted = [], []
        for r in mine:
            used = self.counted_sizes(r, sizes)
            counted.append(f"seed {str(r.get(SEED_KEY, r.get('seed')))}: {_span(used)}")
            got = _slope([(float(s), self._at(r, self.iters, s)) for s in used])
            if got is not None:
                where.append(got)
        note = "sizes counted (the rule solved a maze there, below its cap): " + "; ".join(counted)
        control = self._control(rows, mine)
        beside = [("above the control", control)] if control else []
        if len(where) < 2:  # nothing to count: its iterations grow, if at all, only where it solves nothing
            parts = tuple([("every size", every)] + beside)
            if every.verdict == REPRODUCED:
                return Decision(HOLDS_VACUOUSLY, every.estimate, every.lo, every.hi, every.p, every.n,
                                every.seeds_needed, f"{note}; fewer than 2 runs solved a maze at two sizes: the "
                                "iterations grow only where nothing is solved or at the cap", parts)
            return Decision(every.verdict, every.estimate, every.lo, every.hi, every.p, every.n, every.seeds_needed,
                            note, parts)
        solved = _against_zero(where)
        got = [solved.verdict] + ([control.verdict] if control else [])
        if all(v == REPRODUCED for v in got):
            verdict = REPRODUCED
        elif NOT_MEASURED in got:
            verdict = NOT_MEASURED
        elif NOT_REPRODUCED in got:
            verdict = NOT_REPRODUCED
        else:
            verdict = NOT_SEPARABLE
        return Decision(verdict, solved.estimate, solved.lo, solved.hi, solved.p, solved.n, solved.seeds_needed,
                        note, tuple([("where solved", solved), ("every size", every)] + beside))

    def rule_text(self) -> str:
        control = f", and beyond the control {'/'.join(map(str, self.control.values()))}" if self.control else ""
        return f"stopping rule: its per-run slope of iterations over size where it solved, above 0{control}"

    def shown(self, d: Decision, short: bool = False) -> str:
        if not d.parts:
            return super().shown(d, short)
        shown = []
        for name, part in d.parts:
            if name == "above the control":
                name += f" ({part.note.split('; the control: ', 1)[-1]})"
            shown.append(f"{name}: {self.fmt(part)} ({part.verdict})")
        return "; ".join(shown) + f"; {d.note}"
