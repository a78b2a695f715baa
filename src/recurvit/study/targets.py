"""A project's own engineering target (an exit's accuracy drop, steps and speedup), met per seed or
not: counted, not tested (no mean is taken, so one good seed cannot carry two bad ones). A speed-up among
the bounds is read through :mod:`recurvit.study.speed` (load, interval, compute ceiling)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Dict, Mapping, Optional, Sequence

from . import speed
from .cells import SEED_KEY, as_number
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


def _shown(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3g}"


def decide_target(rows: Sequence[Mapping[str, Any]], bounds: Mapping[str, Mapping[str, float]]) -> Decision:
    """:func:`per_seed_target` on a cell's rows (in seed order), with the per-seed figures as its note. A
    speed-up bound (:func:`recurvit.study.speed.is_speed`) decides nothing while a run's timing was loaded,
    carries no load record or no interval (the verdict says which); else it reads the interval's lower end
    (``max``: upper), and a run whose speed-up is above its compute ceiling is flagged: it is counted as
    missed only when another bound fails it, else it is left undecided and the verdict says how many were."""
    runs = [{c: as_number(r.get(c)) for c in bounds} for r in rows]
    fast = [c for c in bounds if speed.is_speed(c)]
    if not fast:
        d = per_seed_target(runs, bounds)
        per_seed = "; ".join(", ".join(_shown(v) for v in run.values()) for run in runs)
        return replace(d, note=f"per seed ({', '.join(bounds)}): {per_seed}")
    readings = [{c: speed.read(r, c, bounds[c]) for c in fast} for r in rows]
    shown = []
    for r, run, rd in zip(rows, runs, readings):
        seed = r.get(SEED_KEY, r.get("seed"))
        shown.append(f"seed {seed}: " + ", ".join(rd[c].text if c in rd else _shown(v) for c, v in run.items()))
    note = f"per seed ({', '.join(bounds)}): {'; '.join(shown)}"
    evaluated = [i for i, run in enumerate(runs) if any(v is not None for v in run.values())]
    if not evaluated:
        return _not_measured((0,), "no evaluated runs")
    states = {rd.state for i in evaluated for rd in readings[i].values() if rd.mean is not None}
    for state, why in ((speed.LOADED, "a speed-up timed on a loaded machine decides nothing"),
                       (speed.UNRECORDED, "no load record beside the speed-ups: a speed figure decides only "
                        f"where the machine is recorded quiet (load at most {speed.LOAD_LIMIT:g} per core)"),
                       (speed.NO_INTERVAL, "a speed target decides on the lower end of its 95% interval")):
        if state in states:
            return Decision(state, math.nan, math.nan, math.nan, math.nan, (len(evaluated),), math.nan,
                            f"{note}; {why}")
    decided: list = []
    flagged = 0
    for i in evaluated:
        run: Dict[str, Optional[float]] = {**runs[i], **{c: rd.value for c, rd in readings[i].items()}}
        if any(rd.state == speed.FLAGGED for rd in readings[i].values()):
            others = {c: b for c, b in bounds.items()
                      if c not in readings[i] or readings[i][c].state != speed.FLAGGED}
            if others and per_seed_target([run], others).estimate < 1:
                decided.append(run)  # missed on another bound: the ceiling changes nothing
            else:
                flagged += 1
            continue
        decided.append(run)
    met = sum(per_seed_target([run], bounds).estimate == 1 for run in decided)
    verdict = target_verdict(met, len(evaluated)) if not flagged else (
        f"target met in {met} of {len(evaluated)} seeds; {flagged} flagged (speed-up above its compute ceiling)")
    return Decision(verdict, met / len(evaluated), math.nan, math.nan, math.nan, (len(evaluated),), math.nan,
                    note + "; speed-ups on the lower end of their 95% interval")


__all__ = ["per_seed_target", "target_verdict", "decide_target"]
