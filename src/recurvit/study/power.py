"""How many seeds a comparison would need: the smallest number of seeds per group at which a 95%
interval, at the observed effect and spread, would exclude zero (every report's "seeds needed"), or the
boundary a claim's rule decides at (a margin, a level)."""
from __future__ import annotations

import math
import statistics
from typing import Callable, Optional, Sequence

from .stats import CONFIDENCE, clean, paired_differences

MAX_SEEDS = 1000  # seeds_needed searches n = 2..MAX_SEEDS


def first_n(effect: float, half_width: Callable, ns: Sequence[float]) -> float:
    """The first n in ``ns`` with ``half_width(n) < |effect|`` (inf if none, or when the effect is 0)."""
    import numpy as np

    effect = abs(effect)
    if effect == 0:
        return math.inf
    ns = np.asarray(ns, dtype=float)
    hit = np.nonzero(half_width(ns) < effect)[0]
    return float(ns[hit[0]]) if len(hit) else math.inf


def seeds_needed(a: Sequence[Optional[float]], b: Optional[Sequence[Optional[float]]] = None,
                 paired: bool = False, boundary: float = 0.0, confidence: float = CONFIDENCE) -> float:
    """The smallest number of seeds per group n (2..1000) at which the interval's half-width (95% unless
    ``confidence`` says otherwise) would be smaller than the observed |mean(a) - mean(b) - boundary|
    (``b=None``: |mean(a) - boundary|), keeping the observed standard deviations: the interval would then
    lie on one side of ``boundary`` (0: a difference of sign; a margin or a level: a rule's decision).

    Degrees of freedom: Welch's with the observed variances and n seeds each for two groups, n - 1 for one
    sample or paired differences. inf when the effect is 0 or no n up to 1000 suffices; nan with fewer than
    2 values per group."""
    import numpy as np
    from scipy import stats

    ns = np.arange(2, MAX_SEEDS + 1)
    q = 0.5 + confidence / 2
    if b is None or paired:
        v = paired_differences(a, b) if paired else clean(a)
        if len(v) < 2:
            return math.nan
        s = statistics.stdev(v)
        return first_n(statistics.fmean(v) - boundary, lambda n: stats.t.ppf(q, n - 1) * s / np.sqrt(n), ns)
    x, y = clean(a), clean(b)
    if len(x) < 2 or len(y) < 2:
        return math.nan
    va, vb = statistics.variance(x), statistics.variance(y)
    if va + vb == 0:
        return first_n(statistics.fmean(x) - statistics.fmean(y) - boundary, lambda n: np.zeros_like(n), ns)
    # Welch with n seeds each: dof = (va/n + vb/n)^2 / ((va/n)^2 + (vb/n)^2) * (n - 1)
    ratio = (va + vb) ** 2 / (va ** 2 + vb ** 2)
    return first_n(statistics.fmean(x) - statistics.fmean(y) - boundary,
                    lambda n: stats.t.ppf(q, ratio * (n - 1)) * np.sqrt((va + vb) / n), ns)
