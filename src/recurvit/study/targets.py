"""A project's own engineering target (an exit's accuracy drop, steps and speedup), met per seed or
not: counted, not tested (no mean is taken, so one good seed cannot carry two bad ones)."""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

from .rules import Decision, _not_measured


def target_verdict(met: int, n: int) -> str:
    """The verdict of :func:`per_seed_target`: every seed, or how many of them."""
    return "target met in every seed" if met == n else f"target met in {met} of {n} seeds"


def per_seed_target(runs: Sequence[Mapping[str, Optional[float]]], bounds: Mapping[str, Mapping[str, float]]) -> Decision:
    """Claim "a run meets the target" (a project's own engineering target, such as an exit's accuracy drop,
    steps and speedup): each run is checked against every bound (``{column: {max: v} or {min: v}}``) and
    the seeds meeting all of them are counted; a run lacking a column fails it (a run lacking every one
    was not evaluated and is left out). No test is made and no
    mean is taken: a target is met per seed or it is not. Verdict: "target met in every seed" or
    "target met in k of n seeds" (:func:`target_verdict`); estimate: the share of seeds; NOT_MEASURED
    without runs."""
    if not bounds or any(set(b) - {"max", "min"} or not b for b in bounds.values()):
        raise ValueError(f"bounds map columns to {{max: v}} or {{min: v}}, got {dict(bounds)!r}")

    def meets(run: Mapping[str, Optional[float]]) -> bool:
        for col, b in bounds.items():
            v = run.get(col)
            if v is None or math.isnan(float(v)):
                return False
            if ("max" in b and float(v) > b["max"]) or ("min" in b and float(v) < b["min"]):
                return False
        return True

    runs = [r for r in runs if any(r.get(c) is not None for c in bounds)]
    n = len(runs)
    if n == 0:
        return _not_measured((0,), "no evaluated runs")
    met = sum(meets(r) for r in runs)
    return Decision(target_verdict(met, n), met / n, math.nan, math.nan, math.nan, (n,), math.nan,
                    "; ".join(f"{c} {'<=' if 'max' in b else '>='} {b.get('max', b.get('min')):g}"
                              for c, b in bounds.items()))


__all__ = ["per_seed_target", "target_verdict"]
