"""The evaluator a dense (maze) study runs on each trained run (see :mod:`recurvit.study.evaluators`):
one sweep of sizes x test-time iterations (:mod:`recurvit.analysis.mazes`) and the flat columns that
claims read.

================  ===================================================================================
``mazes``         (runs by default) the run's last.pt at every size of ``data.maze_test_sizes``, ``mazes``
                  test mazes each, iterations 1..``max_steps_factor`` x T in one pass; the best iteration
                  chosen on the validation split at the training size (never on a test set); the stopping
                  rules with ``min_steps`` (default T) and ``patience`` fixed here, before any result;
                  ``solved``: ``strict`` (default: every pixel right) or ``open`` (DeepThinking's: every open
                  pixel right, its wall predictions zeroed), which every solved column below and the
                  validation choice read
================  ===================================================================================

Columns for each test size ``s`` (fractions; iterations in block applications):

- ``solved_<s>`` at T, ``solved_<s>_<k>T`` at k x T for k in 2, 4, 10 (None beyond the sweep);
- ``best_iter_<s>``: the iteration of most validation mazes solved at the training size (the first on a
  tie; the same for every size), ``best_solved_<s>``: test solved there, ``drop_10T_<s>``: solved at 10T
  minus that (overthinking: < 0);
- ``rule_conf_solved_<s>`` / ``rule_conf_iters_<s>``: the maximal-confidence readout (after DeepThinking's;
  confidence over every pixel, see :mod:`recurvit.analysis.mazes`) and the mean iteration it picked;
  ``rule_stable_solved_<s>`` / ``rule_stable_iters_<s>``: stop at the first iteration from ``min_steps`` on
  whose mask equals those of the ``patience`` iterations before it;
- ``pixel_acc_<s>`` (at T), ``pixel_acc_<s>_10T``;
- ``solved_<s>_slope``: least-squares slope of solved over log2 of the iterations T, 2T, 4T, 10T (a share per
  doubling of the iterations; the per-run trend a claim tests against 0);
- ``state_growth_<s>``: the recurrent state's RMS at 10T over its RMS at T (1: it stays; a bounded recurrence's
  claim "within 2x" reads it; None where the sweep stored no state or stops before 10T).

And per run: ``val_solved`` (validation at T), ``val_best_solved`` (at the chosen iteration), ``val_best_iter``,
``max_iters``, ``mazes_per_size``, ``rule_conf_iters_slope`` / ``rule_stable_iters_slope`` (least-squares slope
of a rule's mean iterations over the maze size: iterations per unit of size; > 0 when larger mazes take
longer). ``maze_sweeps`` (every size's curve), ``maze_val_sweep`` and ``maze_example`` (one maze of the
largest size: image, target and prediction at the last iteration) stay in result.json.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ...analysis.mazes import PATIENCE, maze_sweep
from ...data.mazes import build_mazes, maze_test_sets
from ...errors import UserError
from ...study.evaluators import Evaluated, Evaluator

FACTORS = (2, 4, 10)  # solved_<s>_<k>T columns
RUN_COLUMNS = ("val_solved", "val_best_solved", "val_best_iter", "max_iters", "mazes_per_size",
               "rule_conf_iters_slope", "rule_stable_iters_slope")
SIZE_COLUMNS = ("solved_{s}", *(f"solved_{{s}}_{k}T" for k in FACTORS), "best_solved_{s}", "best_iter_{s}",
                "drop_10T_{s}", "rule_conf_solved_{s}", "rule_conf_iters_{s}", "rule_stable_solved_{s}",
                "rule_stable_iters_{s}", "pixel_acc_{s}", "pixel_acc_{s}_10T", "solved_{s}_slope", "state_growth_{s}")
SOLVED_KEYS = {"strict": "solved", "open": "solved_open"}  # the evaluator's ``solved`` option -> the sweep's curve
EXAMPLE_KEEP = 16  # mazes of the largest size kept for the picture (the first one solved is shown)


def size_columns(sizes: Sequence[int]) -> List[str]:
    """Every per-size column name, size by size, in a fixed order."""
    return [c.format(s=s) for s in sizes for c in SIZE_COLUMNS]


def slope(xs: Sequence[float], ys: Sequence[Optional[float]]) -> Optional[float]:
    """Least-squares slope of ys over xs (points with a None y left out); None below 2 distinct x."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if y is not None]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def best_iteration(solved: Sequence[float]) -> int:
    """The iteration (1-based) of the most solved, the first on a tie."""
    return max(range(len(solved)), key=lambda i: (solved[i], -i)) + 1


def columns_of(sweeps: Mapping[int, Dict[str, Any]], val: Dict[str, Any], T: int, curve: str = "solved"
               ) -> Dict[str, Any]:
    """The flat columns of a run (see the module docstring) from its test sweeps {size: maze_sweep} and its
    validation sweep at the training size; ``curve`` the sweep's solved curve they read (``solved_open``:
    DeepThinking's)."""
    chosen = best_iteration(val[curve])
    K = len(val[curve])
    row: Dict[str, Any] = {"val_solved": val[curve][T - 1] if T <= K else None,
                           "val_best_solved": val[curve][chosen - 1], "val_best_iter": chosen, "max_iters": K}
    for s, sw in sorted(sweeps.items()):
        solved, acc = sw[curve], sw["accuracy"]
        at = lambda xs, k: xs[k - 1] if k <= len(xs) else None  # noqa: E731
        row[f"solved_{s}"] = at(solved, T)
        for k in FACTORS:
            row[f"solved_{s}_{k}T"] = at(solved, k * T)
        row[f"best_solved_{s}"], row[f"best_iter_{s}"] = at(solved, chosen), chosen
        ten = at(solved, 10 * T)
        row[f"drop_10T_{s}"] = None if ten is None else ten - solved[chosen - 1]
        for rule, key in (("max_conf", "conf"), ("stable", "stable")):
            row[f"rule_{key}_solved_{s}"] = sw[rule]["solved"]
            row[f"rule_{key}_iters_{s}"] = sw[rule]["steps_mean"]
        row[f"pixel_acc_{s}"], row[f"pixel_acc_{s}_10T"] = at(acc, T), at(acc, 10 * T)
        row[f"solved_{s}_slope"] = slope([math.log2(k) for k in (1, *FACTORS)],
                                         [at(solved, k * T) for k in (1, *FACTORS)])
        rms = sw.get("state_rms") or []
        a, b = at(rms, T), at(rms, 10 * T)
        row[f"state_growth_{s}"] = b / a if a and b is not None else None
    sizes = sorted(sweeps)
    for key in ("conf", "stable"):
        row[f"rule_{key}_iters_slope"] = slope(sizes, [row[f"rule_{key}_iters_{s}"] for s in sizes])
    return row


def example_of(kept: Dict[str, Any], size: int, K: int) -> Dict[str, Any]:
    """One maze of ``kept`` (maze_sweep's), the first solved at K (else the first), as text rows for result.json:
    ``image`` a row of 'rrggbb' hex pixels a line, ``target`` / ``pred`` a row of '0'/'1' a line."""
    solved = [bool((p == t).all()) for p, t in zip(kept["pred"], kept["target"])]
    i = solved.index(True) if True in solved else 0
    img = kept["image"][i].permute(1, 2, 0).tolist()  # (H, W, 3)
    mask = lambda m: ["".join(str(int(v)) for v in row) for row in m.tolist()]  # noqa: E731
    return {"size": size, "index": i, "iterations": K, "solved": solved[i],
            "image": ["".join(f"{r:02x}{g:02x}{b:02x}" for r, g, b in row) for row in img],
            "target": mask(kept["target"][i]), "pred": mask(kept["pred"][i])}


class Mazes(Evaluator):
    name = "mazes"
    defaults = {"max_steps_factor": 10, "mazes": 300, "min_steps": None, "patience": PATIENCE, "batch_size": 50}
    optional = {"solved": "strict"}
    minimum = {"max_steps_factor": 1, "mazes": 1, "patience": 1, "batch_size": 1}
    default = True  # every dense study sweeps sizes x iterations

    def check(self, options, where):
        opts = super().check(options, where)
        m = opts["min_steps"]
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise UserError(f"{where}: min_steps must be an integer >= 1 (or null: the trained depth T), got {m!r}")
        if opts.get("solved", "strict") not in SOLVED_KEYS:
            raise UserError(f"{where}: solved must be one of {', '.join(SOLVED_KEYS)}, got {opts['solved']!r}")
        return opts

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        from dataclasses import replace

        from torch.utils.data import DataLoader, Subset

        model, data, o = run.model, run.cfg.data, options
        T = model.nominal_steps
        K = o["max_steps_factor"] * T
        if model.core.limit is not None:
            K = min(K, model.core.limit)
        rule = {"min_steps": o["min_steps"] or T, "patience": o["patience"]}
        _, val = build_mazes(data, with_train=False)
        val = Subset(val, range(min(o["mazes"], len(val))))
        loader = lambda d: DataLoader(d, batch_size=o["batch_size"], shuffle=False)  # noqa: E731
        val_sweep = maze_sweep(model, loader(val), run.device, K, **rule)
        sets = maze_test_sets(replace(data, maze_test=o["mazes"]))
        largest = max(sets)
        sweeps = {s: maze_sweep(model, loader(d), run.device, K, **rule, keep=EXAMPLE_KEEP if s == largest else 0)
                  for s, d in sorted(sets.items())}
        example = example_of(sweeps[largest].pop("kept"), largest, K)
        solved = o.get("solved", self.optional["solved"])
        return {**columns_of(sweeps, val_sweep, T, SOLVED_KEYS[solved]), "mazes_per_size": o["mazes"],
                "trained_steps": T, "maze_solved": solved,
                "maze_sweeps": {str(s): sw for s, sw in sweeps.items()}, "maze_val_sweep": val_sweep,
                "maze_example": example}


EVALUATORS = {e.name: e for e in (Mazes(),)}
