"""A claim made of other claims of the same study: not measured when any part is, reproduced when every
part is, not reproduced when any part is not; ``qualified`` names the verdict when the claim as a whole is not
reproduced but the parts in ``when`` are (never while another part is not measured or not separable: it
could still hold); it holds vacuously when every part holds, some only vacuously."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ...errors import UserError
from .. import rules
from ..cells import Row
from .base import Kind, StudyKind, key


@dataclass
class Qualified:
    """The verdict of an all_of claim not reproduced as a whole whose parts ``when`` are."""

    when: List[str] = key(help="claim ids of the same study", factory=list)
    verdict: str = key(help="the verdict then, e.g. Euler-specific")


@dataclass
class AllOf(StudyKind):
    """Every one of ``parts`` (claim ids of the same study)."""

    parts: List[str] = key(help="claim ids of the same study")
    qualified: Optional[Qualified] = key(None, "{when: [ids], verdict: ...}")

    def check(self, claim: Any, where: str) -> None:
        Kind.check(self, claim, where)  # no grid of its own: its parts read the study's
        if not self.parts:
            raise UserError(f"{where}: an all_of claim names its `parts` (claim ids of the same study)")

    @property
    def part_ids(self) -> Tuple[str, ...]:
        return tuple(self.parts)

    @property
    def named_ids(self) -> Tuple[str, ...]:
        return tuple(self.parts) + tuple(self.qualified.when if self.qualified else ())

    def decide(self, rows: List[Row], claim: Any, decided: Dict[str, rules.Decision]) -> rules.Decision:
        parts = [decided[p] for p in self.parts]
        verdicts = [d.verdict for d in parts]
        if any(v == rules.NOT_MEASURED for v in verdicts):
            verdict = rules.NOT_MEASURED
        elif all(v == rules.REPRODUCED for v in verdicts):
            verdict = rules.REPRODUCED
        elif all(v in (rules.REPRODUCED, rules.HOLDS_VACUOUSLY) for v in verdicts):
            verdict = rules.HOLDS_VACUOUSLY
        elif any(v == rules.NOT_REPRODUCED for v in verdicts):
            verdict = rules.NOT_REPRODUCED
        else:
            verdict = rules.NOT_SEPARABLE
        q = self.qualified
        if q and verdict == rules.NOT_REPRODUCED and all(decided[p].verdict == rules.REPRODUCED for p in q.when):
            verdict = q.verdict
        return rules.Decision(verdict, math.nan, math.nan, math.nan, math.nan, (), math.nan,
                              note="parts: " + ", ".join(f"{p} {d.verdict}" for p, d in zip(self.parts, parts)))

    def decision_text(self, claim: Any, d: rules.Decision) -> str:
        return d.note

    def rule_text(self) -> str:
        return f"all of: {', '.join(self.parts)}"
