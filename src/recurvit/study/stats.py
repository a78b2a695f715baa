"""Seed statistics of a study: means with 95% intervals and Welch tests (scipy)."""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence

CONFIDENCE = 0.95


def clean(vals: Sequence[Optional[float]]) -> List[float]:
    return [float(v) for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]


def mean_ci(vals: Sequence[Optional[float]]) -> Dict[str, float]:
    """Mean, standard deviation and the half-width of the 95% t-interval of the mean (nan when
    there is one value: no interval without a spread)."""
    from scipy import stats

    v = clean(vals)
    if not v:
        return {"mean": math.nan, "std": math.nan, "ci": math.nan, "n": 0}
    m = statistics.fmean(v)
    if len(v) < 2:
        return {"mean": m, "std": math.nan, "ci": math.nan, "n": 1}
    s = statistics.stdev(v)
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, len(v) - 1) * s / math.sqrt(len(v))
    return {"mean": m, "std": s, "ci": float(half), "n": len(v)}


def welch(a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> Dict[str, float]:
    """Difference of means a - b, its 95% Welch interval and the two-sided Welch p-value."""
    from scipy import stats

    x, y = clean(a), clean(b)
    if len(x) < 2 or len(y) < 2:
        return {"diff": math.nan, "lo": math.nan, "hi": math.nan, "p": math.nan}
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    diff = statistics.fmean(x) - statistics.fmean(y)
    se = math.sqrt(vx + vy)
    if se == 0:
        return {"diff": diff, "lo": diff, "hi": diff, "p": 0.0 if diff else 1.0}
    dof = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, dof) * se
    p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
    return {"diff": diff, "lo": diff - half, "hi": diff + half, "p": p}


def ols_contrast(x: Sequence[Sequence[float]], y: Sequence[float], contrast: Sequence[float]) -> Dict[str, float]:
    """A linear combination of least-squares coefficients (``contrast . beta`` for ``y ~ x beta``), its
    95% t-interval (residual degrees of freedom n - columns) and its two-sided p-value.

    Used for trends across a grid axis, e.g. the slope of accuracy over the recursion depth r with every
    run one observation, or the difference of two such slopes in one model."""
    import numpy as np
    from scipy import stats

    X, Y, c = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(contrast, dtype=float)
    dof = len(Y) - X.shape[1]
    if dof < 1 or np.linalg.matrix_rank(X) < X.shape[1]:
        return {"diff": math.nan, "lo": math.nan, "hi": math.nan, "p": math.nan}
    beta, *_ = np.linalg.lstsq(X, Y, rcond=None)
    resid = Y - X @ beta
    s2 = float(resid @ resid) / dof
    est = float(c @ beta)
    se = math.sqrt(s2 * float(c @ np.linalg.inv(X.T @ X) @ c))
    if se == 0:
        return {"diff": est, "lo": est, "hi": est, "p": 0.0 if est else 1.0}
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof)) * se
    p = float(2 * stats.t.sf(abs(est) / se, dof))
    return {"diff": est, "lo": est - half, "hi": est + half, "p": p}


def paired_differences(a: Sequence[Optional[float]], b: Sequence[Optional[float]]) -> List[float]:
    """The per-seed differences a[i] - b[i], dropping a seed where either value is missing."""
    if len(a) != len(b):
        raise ValueError(f"paired values need equal lengths, got {len(a)} and {len(b)}")
    return [x[0] - y[0] for x, y in ((clean([u]), clean([v])) for u, v in zip(a, b)) if x and y]



def fmt_ci(ms: Dict[str, float], scale: float = 100.0, digits: int = 1, signed: bool = False) -> str:
    """'77.8 ± 0.9' (mean ± 95% half-width; signed: '+0.4 ± 0.9'); '77.8' for a single value; '-' for none."""
    if math.isnan(ms["mean"]):
        return "-"
    mean = f"{ms['mean'] * scale:{'+' if signed else ''}.{digits}f}"
    if math.isnan(ms["ci"]):
        return mean
    return f"{mean} ± {ms['ci'] * scale:.{digits}f}"


def fmt_p(p: float) -> str:
    if math.isnan(p):
        return "-"
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"
