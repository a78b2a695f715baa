"""Claims that compare cells: a against b (superiority, non-inferiority, equivalence), a against chance, and
several groups against each other (heterogeneity). Margins are in the figure's own units (accuracy as a
fraction).

A comparison of a cell may be decided at several sizes as one claim (``sizes: [9, 17, 25]`` with ``{size}`` in
its figure, floor and label; :mod:`recurvit.study.vacuous`). A pooled cell (an axis given a list of labels)
decides only once each of its labels has 2 runs. With ``reference_baseline: {column: baseline_psnr, margin:
1.0}`` a comparison against a reference that did not learn (b's figure within ``margin`` of its baseline
column) is "not tested".
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ...errors import UserError
from .. import rules, vacuous
from ..cells import Row, as_number, in_cell, pair, values
from ..stats import fmt_p
from .base import CELL, NOT_TESTED, POOLED, Floored, key


def unfilled_labels(rows: List[Row], cell: Mapping[str, Any], figure: Any) -> List[str]:
    """The labels of a pooled cell (an axis given as a list, e.g. ``solver: [midpoint, heun3, rk4]``) with
    fewer than 2 runs that have the figure, as ``"solver = rk4"``. A claim about several cells is not
    decided on the runs of some of them: "higher-order fields" read from midpoint alone would be a claim
    about midpoint under the pooled label."""
    out = []
    for axis, label in cell.items():
        if isinstance(label, list):
            for one in label:
                if len(values(rows, {**cell, axis: one}, figure)) < 2:
                    out.append(f"{axis} = {one}")
    return out


@dataclass
class Baseline:
    """Where a reference that did not learn sits: its ``column`` (e.g. the mean image's PSNR) and how near."""

    column: str = key(help="the results column of the reference's untrained figure")
    margin: float = key(help="within this of the column, the reference did not train")


@dataclass
class Compared(Floored):
    """A comparison of cell ``a``, decided once or at each of ``sizes``."""

    a: Dict[str, Any] = key(help=CELL)
    sizes: Optional[List[int]] = key(None, "the sizes it is decided at, one comparison each, {size} in its figure")

    def check(self, claim: Any, where: str) -> None:
        super().check(claim, where)
        if self.sizes is not None:
            if not self.sizes or not all(isinstance(v, int) and not isinstance(v, bool) for v in self.sizes):
                raise UserError(f"{where}: `sizes` is a list of sizes, one comparison decided at each")
            if "{size}" not in str(self.figure):
                raise UserError(f"{where}: a claim with `sizes` names its figure with {{size}} in it")

    def cells(self) -> List[Dict[str, Any]]:
        return [self.a]

    def at_size(self, size: int) -> "Compared":
        """The claim at one of its sizes: ``{size}`` filled in in its figure, floor and label."""
        return replace(self, sizes=None, figure=vacuous.fill_size(self.figure, size),
                       floor=vacuous.fill_size(self.floor, size), label=vacuous.fill_size(self.label, size))

    def figures(self) -> List[Any]:
        return [self.at_size(size).figure for size in self.sizes] if self.sizes else [self.figure]

    def decide(self, rows: List[Row], claim: Any, decided: Dict[str, rules.Decision]) -> rules.Decision:
        if self.sizes:
            return vacuous.of_sizes([(vacuous.size_name(size), self.at_size(size).decide(rows, claim, decided))
                                     for size in self.sizes])
        return super().decide(rows, claim, decided)

    def verdict(self, rows: List[Row], claim: Any) -> rules.Decision:
        a = values(rows, self.a, self.figure)
        unfilled = [label for cell in self.cells() for label in unfilled_labels(rows, cell, self.figure)]
        if unfilled:
            return rules.Decision(rules.NOT_MEASURED, math.nan, math.nan, math.nan, math.nan, (len(a),), math.nan,
                                  note=f"{POOLED} {', '.join(unfilled)}")
        return self.test(a, rows)

    def test(self, a: List[Tuple[str, float]], rows: List[Row]) -> rules.Decision:
        """Its rule on a's (seed, figure) values (every pooled label filled)."""
        raise NotImplementedError

    def sized(self, text: str) -> str:
        """A rule's text, with the sizes it is decided at."""
        return text + (f", at each size ({', '.join(map(vacuous.size_name, self.sizes))})" if self.sizes else "")

    def shown(self, d: rules.Decision, short: bool = False) -> str:
        if self.sizes and d.parts:  # one comparison, a figure a size
            return "; ".join(f"{name}: {self.at_size(size).shown(part, True)} ({part.verdict})"
                             for size, (name, part) in zip(self.sizes, d.parts))
        return super().shown(d, short)


@dataclass
class TwoCells(Compared):
    """a against b; with ``b`` left out, a's values are themselves differences (a per-run figure such as
    ``variant_refine_h/4 - acc_T``), tested against 0."""

    b: Optional[Dict[str, Any]] = key(None, CELL)
    paired: bool = key(False, "one run per seed in each cell, compared seed by seed")
    reference_baseline: Optional[Baseline] = key(None, "{column, margin}: b at its baseline did not train")

    def cells(self) -> List[Dict[str, Any]]:
        return [self.a] + ([self.b] if self.b is not None else [])

    def untrained(self, rows: List[Row]) -> str:
        """Why b (the reference) tests nothing: its mean figure within ``margin`` of its mean baseline column."""
        ref = self.reference_baseline
        if ref is None or self.b is None:
            return ""
        got = [v for _, v in values(rows, self.b, self.figure)]
        base = [v for _, v in values(rows, self.b, ref.column)]
        if not got or not base or statistics.fmean(got) >= statistics.fmean(base) + float(ref.margin):
            return ""
        return (f"the reference is at its baseline ({statistics.fmean(got) * self.scale:.2f} vs "
                f"{statistics.fmean(base) * self.scale:.2f} {self.unit}): it did not train")

    def test(self, a: List[Tuple[str, float]], rows: List[Row]) -> rules.Decision:
        untrained = self.untrained(rows)
        if untrained:
            return rules.Decision(NOT_TESTED, math.nan, math.nan, math.nan, math.nan, (), math.nan, note=untrained)
        paired = self.paired
        if self.b is not None:
            x, y = pair(a, values(rows, self.b, self.figure), paired)
        else:  # a's values are differences already: test them against 0
            x, y, paired = [v for _, v in a], [0.0] * len(a), True
        return self.rule(x, y, paired)

    def rule(self, x: List[float], y: List[float], paired: bool) -> rules.Decision:
        raise NotImplementedError


@dataclass
class Superiority(TwoCells):
    """The 95% interval of a − b on the claimed ``side`` (beyond ``by``, a size the claim states, e.g. 0.01
    for "more than a point")."""

    side: int = key(1, "the claimed sign of a - b: +1 or -1")
    by: float = key(0.0, "how far beyond 0 the interval must lie, in the figure's units")

    def rule(self, x: List[float], y: List[float], paired: bool) -> rules.Decision:
        return rules.superiority(x, y, side=self.side, paired=paired, by=float(self.by))

    def rule_text(self) -> str:
        text = "superiority (95% interval of the difference on the claimed side)"
        if self.by:
            text = text.replace("on the claimed side", f"beyond {float(self.by) * self.scale:g} {self.unit}")
        return self.sized(text)


@dataclass
class NonInferiority(TwoCells):
    """a is not worse than b by more than ``margin``."""

    margin: float = key(help="how much worse a may be, in the figure's units")

    def rule(self, x: List[float], y: List[float], paired: bool) -> rules.Decision:
        return rules.noninferiority(x, y, float(self.margin), paired=paired)

    def rule_text(self) -> str:
        return self.sized(f"non-inferiority, margin {self.margin_text(self.margin)}")


@dataclass
class Equivalence(TwoCells):
    """Two one-sided tests at ±``margin``: how a "no gain" claim is decided (it can fail)."""

    margin: float = key(help="the equivalence margin, in the figure's units")

    def rule(self, x: List[float], y: List[float], paired: bool) -> rules.Decision:
        return rules.equivalence(x, y, float(self.margin), paired=paired)

    def rule_text(self) -> str:
        return self.sized(f"equivalence, margin ±{self.margin_text(self.margin)} (two one-sided tests)")


@dataclass
class NearChance(Compared):
    """a's figure within ``margin`` of ``chance`` (else the rows' ``chance`` column)."""

    margin: float = key(help="how near chance, in the figure's units")
    chance: Optional[float] = key(None, "the chance level (default: the rows' chance column)")

    def test(self, a: List[Tuple[str, float]], rows: List[Row]) -> rules.Decision:
        chance = self.chance
        if chance is None:
            found = [as_number(r.get("chance")) for r in rows if in_cell(r, self.a)]
            found = [c for c in found if c is not None]
            chance = found[0] if found else math.nan
        return rules.near_chance([v for _, v in a], float(chance), float(self.margin))

    def rule_text(self) -> str:
        return self.sized(f"near chance, margin {self.margin_text(self.margin)}")

    def estimate_text(self, d: rules.Decision) -> str:
        """A level, not a difference: no sign, and the chance it is held to."""
        note = d.note.split(f"; {vacuous.AT_FLOOR}")[0]
        return (f"{d.estimate * self.scale:.2f}% [{d.lo * self.scale:.2f}, {d.hi * self.scale:.2f}], "
                f"p = {fmt_p(d.p)} ({note})")


@dataclass
class Heterogeneity(Floored):
    """The ``groups``' means are not all equal (Welch ANOVA; uniform = pairwise equivalence within ±margin)."""

    groups: Dict[str, Dict[str, Any]] = key(help="name -> cell")
    margin: float = key(help="the pairwise equivalence margin, in the figure's units")

    def cells(self) -> List[Dict[str, Any]]:
        return list(self.groups.values())

    def verdict(self, rows: List[Row], claim: Any) -> rules.Decision:
        groups = {name: [v for _, v in values(rows, cell, self.figure)] for name, cell in self.groups.items()}
        return rules.heterogeneity(groups, float(self.margin))

    def rule_text(self) -> str:
        return (f"heterogeneity (Welch ANOVA; uniform = pairwise equivalence within "
                f"±{self.margin_text(self.margin)})")
