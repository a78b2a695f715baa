"""A project's own target (an exit's accuracy drop, steps and speed-up), met per seed or not: every seed of
``a`` is checked against every bound and counted; no mean is taken (:mod:`recurvit.study.targets`; a speed-up
bound is read through :mod:`recurvit.study.speed`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from ...errors import UserError
from .. import rules
from ..cells import Row, as_number
from ..targets import decide_target
from .base import BOUNDS, CELL, StudyKind, bounds_ok, bounds_text, key, seed_sorted


@dataclass
class Target(StudyKind):
    """Every seed of ``a`` against every bound of ``targets`` (column -> ``{max: v}`` or ``{min: v}``)."""

    a: Dict[str, Any] = key(help=CELL)
    targets: Dict[str, Dict[str, float]] = key(help=BOUNDS)

    def check(self, claim: Any, where: str) -> None:
        if not bounds_ok(self.targets):
            raise UserError(f"{where}: a target claim needs `a` and `targets` mapping columns to "
                            "{max: number} or {min: number}")
        super().check(claim, where)

    def cells(self) -> List[Dict[str, Any]]:
        return [self.a]

    def columns(self) -> List[str]:
        return list(self.targets)

    def has_figure(self, row: Row) -> bool:
        return any(as_number(row.get(c)) is not None for c in self.targets)

    def decide(self, rows: List[Row], claim: Any, decided: Dict[str, rules.Decision]) -> rules.Decision:
        return decide_target(seed_sorted(rows, self.a), self.targets)

    def rule_text(self) -> str:
        return f"a target met per seed (counted, no mean taken): {bounds_text(self.targets)}"

    def shown(self, d: rules.Decision, short: bool = False) -> str:
        return "no run evaluated yet" if d.verdict == rules.NOT_MEASURED else d.note
