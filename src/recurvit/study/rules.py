"""Decision rules: a research claim decided from per-seed measurements.

Each rule takes the per-seed values of a study (one value per seed and group, ``None``/nan dropped),
tests the claim with a t-based interval and returns a :class:`Decision` with one of four verdicts:

* ``REPRODUCED``: the data support the claim at the 95% level;
* ``NOT_REPRODUCED``: the data contradict it at the same level;
* ``NOT_SEPARABLE``: neither, at this number of seeds (``Decision.seeds_needed`` says how many seeds per
  group would let the rule decide at the observed effect and spread: its interval clear of the rule's
  boundary, which is 0 for a sign, the margin for non-inferiority and equivalence, the bound for a level);
* ``NOT_MEASURED``: too little data (fewer than 2 values per group) or a model that cannot be fitted.
  No rule raises on too little data.

A claim adds one more (:mod:`recurvit.study.vacuous`): ``HOLDS_VACUOUSLY``, a rule met only because every
quantity it reads sits at a floor or ceiling that makes it hold whatever the model does (never a reproduction).

Which rule answers which kind of claim:

=========================================  ====================================================
claim                                       rule
=========================================  ====================================================
"a beats b" / "a is worse than b"           :func:`superiority` (``side=+1`` / ``-1``)
"a is not worse than b by more than m"      :func:`noninferiority` (higher is better)
"a and b are the same within m"             :func:`equivalence` (two one-sided tests, TOST)
"y rises / falls with x" (depth, width..)   :func:`trend` (least-squares slope, every run a point)
"the accuracy is at chance"                 :func:`near_chance`
"the groups' means are not all equal"       :func:`heterogeneity` (Welch's one-way ANOVA)
"each run meets a target" (own targets)     :func:`recurvit.study.targets.per_seed_target` (per seed)
=========================================  ====================================================

Two-group rules compare ``a - b``: with ``paired=True`` ``a[i]`` and ``b[i]`` belong to the same seed and
the rule uses the one-sample t on the differences ``a[i] - b[i]``; otherwise the Welch two-sample t (as in
:func:`recurvit.study.stats.welch`). Margins are in the units of the values (e.g. 0.005 for half a point of
accuracy stored as a fraction). :func:`fmt_decision` writes a decision for a report.
"""
from __future__ import annotations

import math
import re
import statistics
import warnings
from typing import List, Mapping, Optional, Sequence

from .decision import (ALPHA, EXACT, HOLDS_VACUOUSLY, NOT_MEASURED, NOT_REPRODUCED, NOT_SEPARABLE,
                       REPRODUCED, Decision, _check_margin, _check_side, _difference, _exact, _interval,
                       _not_measured, _one_sample, _p_one_sided, _sign_verdict)
from .power import MAX_SEEDS, first_n, seeds_needed
from .stats import CONFIDENCE, clean, fmt_p, mean_ci, ols_contrast, paired_differences, welch

def superiority(a: Sequence[Optional[float]], b: Sequence[Optional[float]], side: int = 1,
                paired: bool = False, by: float = 0.0) -> Decision:
    """Claim "a - b has sign ``side``" (+1: a is higher), or with ``by`` > 0 "a - b exceeds ``by`` on that side"
    (a size, e.g. "costs more than 1 dB"). 95% interval of a - b: REPRODUCED when it lies strictly beyond
    ``side * by`` on the claimed side, NOT_REPRODUCED when strictly on the other, else NOT_SEPARABLE.
    p: two-sided p of the t test of a - b = ``side * by``."""
    _check_side(side)
    if by < 0:
        raise ValueError(f"by must be >= 0, got {by!r}")
    d, n = _difference(a, b, paired)
    if d is None:
        return _not_measured(n, "fewer than 2 values per group")
    if d.se == 0:
        return _exact(d, side * (d.est - side * by) > 0, f"claimed sign {side:+d}, beyond {side * by:+g}")
    if paired:
        ms = mean_ci(paired_differences(a, b))
        est, lo, hi = ms["mean"], ms["mean"] - ms["ci"], ms["mean"] + ms["ci"]
        p = min(1.0, 2 * min(_p_one_sided(d, 0.0, "greater"), _p_one_sided(d, 0.0, "less")))
    else:
        w = welch(a, b)
        est, lo, hi, p = w["diff"], w["lo"], w["hi"], w["p"]
    shift = side * by
    if by:
        p = min(1.0, 2 * min(_p_one_sided(d, shift, "greater"), _p_one_sided(d, shift, "less")))
    return Decision(_sign_verdict(lo - shift, hi - shift, side), est, lo, hi, p, n,
                    seeds_needed(a, b, paired, boundary=shift),
                    f"{'paired' if paired else 'Welch'} t, claimed sign {side:+d}" + (f", beyond {shift:+g}" if by else ""))


def noninferiority(a: Sequence[Optional[float]], b: Sequence[Optional[float]], margin: float,
                   paired: bool = False) -> Decision:
    """Claim "a is not worse than b by more than ``margin``" (higher is better; negate both for a lower-is-better
    metric). 95% interval of a - b: REPRODUCED when its lower end > -margin, NOT_REPRODUCED when its upper end
    < -margin, else NOT_SEPARABLE (so REPRODUCED is a one-sided test at 0.025).
    p: one-sided p of H0 a - b <= -margin (t test against -margin, alternative "greater")."""
    _check_margin(margin)
    d, n = _difference(a, b, paired)
    if d is None:
        return _not_measured(n, "fewer than 2 values per group")
    if d.se == 0:
        return _exact(d, d.est > -margin, f"non-inferiority at -{margin:g}")
    lo, hi = _interval(d, CONFIDENCE)
    verdict = REPRODUCED if lo > -margin else NOT_REPRODUCED if hi < -margin else NOT_SEPARABLE
    return Decision(verdict, d.est, lo, hi, _p_one_sided(d, -margin, "greater"), n,
                    seeds_needed(a, b, paired, boundary=-margin),
                    f"non-inferiority at -{margin:g}, {'paired' if paired else 'Welch'} t")


def equivalence(a: Sequence[Optional[float]], b: Sequence[Optional[float]], margin: float,
                paired: bool = False) -> Decision:
    """Claim "a and b differ by less than ``margin``": two one-sided t tests (TOST) at 0.05.

    REPRODUCED when both reject, i.e. the 90% interval of a - b lies inside (-margin, +margin);
    NOT_REPRODUCED when the 95% interval lies wholly outside the margin (lo > margin or hi < -margin);
    else NOT_SEPARABLE. lo/hi: the 90% interval. p: the larger of the two one-sided p-values."""
    _check_margin(margin)
    d, n = _difference(a, b, paired)
    if d is None:
        return _not_measured(n, "fewer than 2 values per group")
    if d.se == 0:
        return _exact(d, abs(d.est) < margin, f"equivalence at ±{margin:g}")
    lo90, hi90 = _interval(d, 1 - 2 * ALPHA)
    lo95, hi95 = _interval(d, CONFIDENCE)
    p = max(_p_one_sided(d, -margin, "greater"), _p_one_sided(d, margin, "less"))
    if -margin < lo90 and hi90 < margin:
        verdict = REPRODUCED
    elif lo95 > margin or hi95 < -margin:
        verdict = NOT_REPRODUCED
    else:
        verdict = NOT_SEPARABLE
    # decided inside the margin by the 90% interval, outside it by the 95% one: the nearer end decides
    need = seeds_needed(a, b, paired, boundary=math.copysign(margin, d.est),
                        confidence=1 - 2 * ALPHA if abs(d.est) < margin else CONFIDENCE)
    return Decision(verdict, d.est, lo90, hi90, p, n, need,
                    f"TOST at ±{margin:g}, 90% interval, {'paired' if paired else 'Welch'} t")


def trend(x: Sequence[float], y: Sequence[Optional[float]], side: int = 1, log2_x: bool = False) -> Decision:
    """Claim "y rises (``side=+1``) / falls (-1) with x": the least-squares slope of y over x (``log2_x``: over
    log2 x, i.e. per doubling), every observation one point (as scipy.stats.linregress). 95% t-interval
    (n - 2 degrees of freedom), verdict as :func:`superiority` on the slope, p two-sided. Not measured below
    3 distinct x: through two x values the slope is only their difference, which says nothing of a trend.

    seeds_needed: repetitions of the design (each distinct x once, i.e. seeds per x) at which the slope's
    interval half-width would be below |slope|, at the observed residual spread: the slope's standard error
    scales by sqrt(n_obs / (repetitions * distinct x)). Searched from 1 repetition up."""
    import numpy as np
    from scipy import stats

    _check_side(side)
    if len(x) != len(y):
        raise ValueError(f"x and y need equal lengths, got {len(x)} and {len(y)}")
    pts = [(float(u), v[0]) for u, v in ((u, clean([v])) for u, v in zip(x, y)) if v and not math.isnan(float(u))]
    if log2_x:
        if any(u <= 0 for u, _ in pts):
            raise ValueError("log2_x needs x > 0")
        pts = [(math.log2(u), v) for u, v in pts]
    n = (len(pts),)
    if len({u for u, _ in pts}) < 3:  # through two x values a slope is their difference, not a trend
        return _not_measured(n, "fewer than 3 distinct x (with two, a slope is only their difference)")
    xs, ys = np.array([u for u, _ in pts]), np.array([v for _, v in pts])
    fit = ols_contrast(np.column_stack([np.ones_like(xs), xs]), ys, [0.0, 1.0])
    if math.isnan(fit["diff"]):
        return _not_measured(n, "slope cannot be fitted")
    slope, lo, hi = fit["diff"], fit["lo"], fit["hi"]
    q = 0.5 + CONFIDENCE / 2
    se = (hi - lo) / 2 / float(stats.t.ppf(q, len(pts) - 2))
    k = len(np.unique(xs))
    reps = np.arange(1, MAX_SEEDS + 1)
    reps = reps[reps * k > 2]
    need = first_n(slope, lambda m: stats.t.ppf(q, m * k - 2) * se * np.sqrt(len(pts) / (m * k)), reps)
    return Decision(_sign_verdict(lo, hi, side), slope, lo, hi, fit["p"], n, need,
                    f"least-squares slope over {'log2 x' if log2_x else 'x'}, claimed sign {side:+d}; "
                    f"seeds_needed in repetitions of {k} distinct x")


def near_chance(values: Sequence[Optional[float]], chance: float, margin: float) -> Decision:
    """Claim "the accuracy is within ``margin`` of chance" (at most chance + margin). 95% t-interval of the mean:
    REPRODUCED when its upper end <= chance + margin, NOT_REPRODUCED when its lower end > chance + margin,
    else NOT_SEPARABLE. estimate: the mean. p: one-sided p of H0 mean >= chance + margin (alternative "less")."""
    _check_margin(margin)
    v = clean(values)
    n = (len(v),)
    if len(v) < 2:
        return _not_measured(n, "fewer than 2 values")
    d = _one_sample(v)
    if d.se == 0:
        return _exact(d, d.est <= chance + margin, f"at most chance {chance:g} + {margin:g}")
    ms = mean_ci(v)
    lo, hi = ms["mean"] - ms["ci"], ms["mean"] + ms["ci"]
    bound = chance + margin
    verdict = REPRODUCED if hi <= bound else NOT_REPRODUCED if lo > bound else NOT_SEPARABLE
    return Decision(verdict, ms["mean"], lo, hi, _p_one_sided(d, bound, "less"), n, seeds_needed(v, boundary=bound),
                    f"at most chance {chance:g} + {margin:g}")


def _welch_anova(samples: List[List[float]]) -> float:
    """p-value of Welch's one-way ANOVA (nan where it is undefined, e.g. a group without spread)."""
    import inspect

    import numpy as np
    from scipy import stats

    if "equal_var" not in inspect.signature(stats.f_oneway).parameters:
        raise RuntimeError("heterogeneity needs scipy >= 1.15 (f_oneway(equal_var=False))")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return float(stats.f_oneway(*samples, equal_var=False).pvalue)


def heterogeneity(groups: Mapping[str, Sequence[Optional[float]]], margin: float) -> Decision:
    """Claim "the groups' means are not all equal" (e.g. the gains of several solvers over a baseline are not
    uniform): Welch's one-way ANOVA. REPRODUCED when p < 0.05; NOT_REPRODUCED when every pair of groups is
    equivalent within ``margin`` by :func:`equivalence` (the groups are shown equal); else NOT_SEPARABLE.
    estimate: max - min of the group means; lo/hi nan; p: the ANOVA p. NOT_MEASURED with fewer than 2 groups,
    fewer than 2 values in a group, or an undefined ANOVA (a group without spread)."""
    _check_margin(margin)
    names = list(groups)
    samples = [clean(groups[k]) for k in names]
    n = tuple(len(s) for s in samples)
    if len(samples) < 2 or min(n) < 2:
        return _not_measured(n, "fewer than 2 groups or fewer than 2 values in a group")
    p = _welch_anova(samples) if all(statistics.variance(s) > 0 for s in samples) else math.nan
    if math.isnan(p):
        return _not_measured(n, "Welch ANOVA undefined (a group without spread)")
    means = [statistics.fmean(s) for s in samples]
    spread = max(means) - min(means)
    equal = all(equivalence(samples[i], samples[j], margin).verdict == REPRODUCED
                for i in range(len(samples)) for j in range(i + 1, len(samples)))
    note = f"Welch one-way ANOVA over {len(samples)} groups; pairwise TOST at ±{margin:g}"
    if p < ALPHA:
        return Decision(REPRODUCED, spread, math.nan, math.nan, p, n, math.nan,
                        note + (" (all pairs also equivalent)" if equal else ""))
    return Decision(NOT_REPRODUCED if equal else NOT_SEPARABLE, spread, math.nan, math.nan, p, n, math.nan, note)


def fmt_decision(d: Decision, scale: float = 100.0, unit: str = "points", digits: int = 2) -> str:
    """'+1.82 points [+1.06, +2.58], p = 0.0027' (estimate, interval, p; values times ``scale``); the interval's
    level is named when it is not 95% ('... [-0.20, +0.40] (90% interval), p = 0.003'); 'not measured'."""
    if d.verdict == NOT_MEASURED or math.isnan(d.estimate):
        return "not measured"
    unit = f" {unit}" if unit else ""
    out = f"{d.estimate * scale:+.{digits}f}{unit}"
    if not (math.isnan(d.lo) or math.isnan(d.hi) or d.note.startswith(EXACT)):
        out += f" [{d.lo * scale:+.{digits}f}, {d.hi * scale:+.{digits}f}]"
        level = re.search(r"(\d+(?:\.\d+)?)% interval", d.note)
        if level and float(level.group(1)) != CONFIDENCE * 100:
            out += f" ({level.group(1)}% interval)"
    if d.note.startswith(EXACT):
        out += " (exact: no variance over seeds, no test)"
    elif not math.isnan(d.p):
        p = fmt_p(d.p)
        out += f", p {p[0]} {p[1:]}" if p.startswith("<") else f", p = {p}"
    return out


__all__ = ["Decision", "REPRODUCED", "NOT_REPRODUCED", "NOT_SEPARABLE", "NOT_MEASURED", "HOLDS_VACUOUSLY",
           "seeds_needed",
           "superiority", "noninferiority", "equivalence", "trend", "near_chance", "heterogeneity",
           "fmt_decision"]
