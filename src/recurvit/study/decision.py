"""A rule's verdict and the number that decided it (:class:`Decision`), and the differences of means every
two-group rule of :mod:`recurvit.study.rules` tests (t-based, Welch or paired)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

from .stats import CONFIDENCE, clean, paired_differences

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_SEPARABLE = "not separable at this scale"
NOT_MEASURED = "not measured"
# a rule met only because every quantity it reads sits at a floor or ceiling that makes it hold whatever the
# model does (both cells solve nothing): never a reproduction (recurvit.study.vacuous)
HOLDS_VACUOUSLY = "holds vacuously"

ALPHA = 1 - CONFIDENCE  # 0.05: the level of every test here


@dataclass(frozen=True)
class Decision:
    """The verdict on a claim and the number that decided it (an estimate with its interval and p-value)."""

    verdict: str  # REPRODUCED / NOT_REPRODUCED / NOT_SEPARABLE / NOT_MEASURED (or HOLDS_VACUOUSLY, a claim's)
    estimate: float  # the deciding number (difference of means, slope, mean, ...), in the units given
    lo: float  # its interval (95% two-sided unless the rule says otherwise)
    hi: float
    p: float  # the rule's p-value (documented per rule), nan when not applicable
    n: tuple  # sample sizes used
    seeds_needed: float  # seeds per group to decide (power.seeds_needed at the rule's boundary); nan where
    # not defined; inf when the effect sits on the boundary
    note: str = ""  # e.g. "TOST at ±0.005, 90% interval"
    parts: tuple = ()  # (name, Decision) of each part a claim is decided in (one a size: recurvit.study.vacuous)

    def __post_init__(self) -> None:
        # plain Python numbers (not numpy scalars), so decisions compare, print and serialise cleanly
        for name in ("estimate", "lo", "hi", "p", "seeds_needed"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "n", tuple(int(k) for k in self.n))


def _not_measured(n: tuple, note: str) -> Decision:
    return Decision(NOT_MEASURED, math.nan, math.nan, math.nan, math.nan, n, math.nan, note)


EXACT = "exact comparison: no variance (every value of each group identical), decided without a test"


def _exact(d: "_Diff", holds: bool, note: str) -> Decision:
    """A figure without variance (a FLOP count: every seed the same) is compared exactly, without a test."""
    return Decision(REPRODUCED if holds else NOT_REPRODUCED, d.est, d.est, d.est, math.nan, d.n, math.nan,
                    f"{EXACT}; {note}")


def _check_side(side: int) -> None:
    if side not in (1, -1):
        raise ValueError(f"side must be +1 or -1, got {side!r}")


def _check_margin(margin: float) -> None:
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin!r}")


class _Diff(NamedTuple):
    """A difference of means a - b (or a one-sample mean) with its standard error and t degrees of freedom."""

    est: float
    se: float
    dof: float
    n: tuple


def _one_sample(v: List[float]) -> _Diff:
    return _Diff(statistics.fmean(v), statistics.stdev(v) / math.sqrt(len(v)), len(v) - 1, (len(v),))


def _difference(a: Sequence[Optional[float]], b: Sequence[Optional[float]],
                paired: bool) -> Tuple[Optional[_Diff], tuple]:
    """The difference a - b (paired: mean of the per-seed differences), or None with fewer than 2 values per
    group; with the sample sizes used."""
    if paired:
        d = paired_differences(a, b)
        n = (len(d), len(d))
        return (_one_sample(d)._replace(n=n) if len(d) >= 2 else None), n
    x, y = clean(a), clean(b)
    n = (len(x), len(y))
    if len(x) < 2 or len(y) < 2:
        return None, n
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    se = math.sqrt(vx + vy)
    dof = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1)) if se > 0 else math.nan
    return _Diff(statistics.fmean(x) - statistics.fmean(y), se, dof, n), n


def _interval(d: _Diff, confidence: float) -> Tuple[float, float]:
    """Two-sided t-interval of d.est at ``confidence``."""
    from scipy import stats

    if d.se == 0:
        return d.est, d.est
    half = float(stats.t.ppf(0.5 + confidence / 2, d.dof)) * d.se
    return d.est - half, d.est + half


def _p_one_sided(d: _Diff, null: float, alternative: str) -> float:
    """p-value of the t test of H0 against ``est > null`` (alternative "greater") or ``est < null`` ("less");
    without a spread: 0 when the estimate lies on the alternative's side, else 1."""
    from scipy import stats

    sign = 1.0 if alternative == "greater" else -1.0
    if d.se == 0:
        return 0.0 if sign * (d.est - null) > 0 else 1.0
    return float(stats.t.sf(sign * (d.est - null) / d.se, d.dof))


def _sign_verdict(lo: float, hi: float, side: int) -> str:
    """REPRODUCED when [lo, hi] lies strictly on ``side`` of 0, NOT_REPRODUCED when strictly on the other."""
    if side * lo > 0 and side * hi > 0:
        return REPRODUCED
    if side * lo < 0 and side * hi < 0:
        return NOT_REPRODUCED
    return NOT_SEPARABLE
