"""What a study asks of dense (maze) runs: each run's result row (train, then one sweep of sizes x test-time
iterations, :class:`recurvit.tasks.dense.evaluators.Mazes`) and the columns, tables and plots of its report.

::

    name: mazes
    task: dense
    base: ../src/recurvit/configs/mazes/vit_naive.yaml
    grid:
      regime: {vit_naive: {}, dt_recall_prog: {base: ../src/recurvit/configs/mazes/dt_recall_prog.yaml}}
      train.seed: [0, 1, 2]
    eval:
      mazes: {max_steps_factor: 10, mazes: 300, min_steps: null, patience: 3}   # the defaults

The per-size columns (``solved_<s>``, ``solved_<s>_10T``, ``drop_10T_<s>``, ...) are listed in
:mod:`recurvit.tasks.dense.evaluators`; results.csv holds them for every size a run was tested at.
"""
from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...analysis.accounting import count_params, measure_flops
from ...data.mazes import maze_pixels
from ...run.device import pick_device
from ...run.load import load
from ...run.rundir import RunDir
from ...study.evaluators import Evaluated, evaluate_run
from ...study.grouping import table
from ...study.plateau import plateau_change, plateau_per_seed, plateau_summary
from ...study.registry import Contrast, View
from ...study.stats import fmt_ci, mean_ci, paired_differences, welch
from ..classify.study import check_config, train_run
from .evaluators import EVALUATORS, RUN_COLUMNS, SOLVED_KEYS, Mazes, size_columns
from .plots import maze_picture, solved_panels

_SIZES = range(3, 129, 2)
_SIZE = re.compile(r"^solved_(\d+)$")
ANCHOR_PREFIX = "dt_net"  # DeepThinking's recurrent conv nets: the anchor every other cell is measured against
GAP_FIGURES = (("at T", "solved_{s}"), ("stable rule", "rule_stable_solved_{s}"), ("at 10T", "solved_{s}_10T"))


# ------------------------------------------------------------------------------- one run's row
def evaluate_trained(out: Path, eval_spec: Dict[str, Any], metrics: Dict[str, Any]) -> Dict[str, Any]:
    """The result row of a trained maze run (its last.pt: best.pt is chosen on validation at T only)."""
    t0 = time.perf_counter()
    loaded = load(out / "last.pt")
    model, cfg = loaded.model, loaded.config
    device = pick_device(cfg.train.device)
    model.to(device)
    figures = evaluate_run(Evaluated(model, cfg, out, device, None, None), eval_spec, EVALUATORS)
    px = maze_pixels(cfg.data.maze_size)  # the cost of one training-size maze at T
    flops = measure_flops(model.cpu(), (3, px, px), train=False)
    acct = {**count_params(model, block_uses=flops["block_uses"]), **flops}
    mc = model.cfg
    logged = RunDir(out, created=False, owner=False).read_metrics()
    val_curve = [m.get("val_solved") for m in logged] if any("val_solved" in m for m in logged) else None
    return {
        "model": cfg.model.name, "core": mc.core, "runs_as": mc.core_cls.describe(mc),
        "width": mc.width if hasattr(mc, "width") else mc.embed_dim, "steps": model.nominal_steps,
        "seed": cfg.train.seed, "epochs": cfg.train.epochs, "params": acct["params"],
        "params_stored": acct["params_stored"], "flops_forward": acct["flops_forward"], "nfe": acct["nfe"],
        **figures, "train_seconds": metrics.get("train_seconds"), "eval_seconds": time.perf_counter() - t0,
        "val_acc_curve": val_curve, "val_pixel_acc_curve": [m.get("val_acc") for m in logged],
        "plateau_val": plateau_change(val_curve),
    }


# ------------------------------------------------------------------------------------ the report
def sizes_of(rows: List[Dict[str, Any]]) -> List[int]:
    """The maze sizes some row was tested at (read off its solved_<s> columns)."""
    return sorted({int(m.group(1)) for r in rows for k in r for m in [_SIZE.match(k)] if m})


def per_size_columns(rows: List[Dict[str, Any]]) -> List[str]:
    """The per-size columns (after the view's CSV_KEYS): every size's, in a fixed order, that some row has."""
    return [c for c in size_columns(sizes_of(rows)) if any(r.get(c) is not None for r in rows)]


def intro(rows: List[Dict[str, Any]], seeds: list, solved: str = "strict") -> List[str]:
    """The report's first sentence: runs, seeds, T, what solved (the mazes evaluator's ``solved`` option), the
    chosen iteration and the plateau are."""
    T = sorted({r.get("steps") for r in rows if r.get("steps")})
    what = ("DeepThinking's: the share of test mazes with every open pixel right (its wall predictions zeroed)"
            if solved == "open" else "the share of test mazes with every pixel right")
    return [f"{len(rows)} runs; seeds {seeds}; T = trained iterations ({', '.join(map(str, T)) or '-'}). Solved = "
            f"{what}, in % as mean ± half-width of the 95% t-interval over "
            "seeds, at T and at the most iterations swept (10T by default), read from last.pt. The best iteration "
            "is chosen on the validation split at the training size, never on a test set; Δ last 20% epochs = "
            "the change of each seed's validation solved over its last 20% of epochs (a plateau is near 0).", ""]


def maze_tables(cs: List[Dict[str, Any]], study) -> List[str]:
    """Solved per size at T and 10T, the largest size's rules and slope, the stopping rules at every size, the
    gaps to the conv anchor and the state's drift past T."""
    axes = study.cell_axes()
    sizes = sorted({s for c in cs for s in c["sizes"]})
    ten = any(f"solved_{s}_10T" in c for c in cs for s in sizes)
    head = axes + ["model", "params (stored)", "T", "val solved @T", "chosen iter (val)"] + \
        [f"{s}: @T" for s in sizes] + ([f"{s}: @10T" for s in sizes] if ten else []) + \
        ["Δ last 20% epochs, each seed", "train s"]
    get = lambda c, k: fmt_ci(c[k]) if k in c else "-"  # noqa: E731
    body = [[str(c[a]) for a in axes] + [
        c["model"], f"{c['params_stored']:,}", str(c["steps"]), fmt_ci(c["val_solved"]),
        fmt_ci(c["val_best_iter"], 1.0, 1)] + [get(c, f"solved_{s}") for s in sizes] +
        ([get(c, f"solved_{s}_10T") for s in sizes] if ten else []) +
        [plateau_per_seed(c), f"{c['train_seconds']['mean']:.0f}"] for c in cs]
    lines = ["Mazes solved (%) per test size, at the trained depth T and at 10T:", ""] + table(head, body) + [""]
    if sizes:
        s = sizes[-1]
        cols = [("solved", f"solved_{s}"), ("at the chosen iter", f"best_solved_{s}"),
                ("@10T − chosen (points)", f"drop_10T_{s}"), ("max-conf rule", f"rule_conf_solved_{s}"),
                ("its iters", f"rule_conf_iters_{s}"), ("stable rule", f"rule_stable_solved_{s}"),
                ("its iters", f"rule_stable_iters_{s}"), ("slope / doubling (points)", f"solved_{s}_slope")]
        scale = {f"rule_conf_iters_{s}": 1.0, f"rule_stable_iters_{s}": 1.0}
        lines += [f"At the largest size ({s}x{s}): solved at the iteration chosen on validation, the change from "
                  "there to 10T, the two stopping rules (solved and mean iterations used) and the slope of solved "
                  "over log2 iterations (T, 2T, 4T, 10T):", ""]
        lines += table(axes + [h for h, _ in cols], [[str(c[a]) for a in axes] + [
            fmt_ci(c[k], scale.get(k, 100.0), 1 if k in scale else 2) if k in c else "-" for _, k in cols]
            for c in cs]) + [""]
    rule_cols = [f"rule_{r}_solved_{s}" for s in sizes for r in ("conf", "stable")]
    if any(k in c for c in cs for k in rule_cols):
        o = {**Mazes.defaults, **study.evaluators.get("mazes", {})}  # as the study file set them, before any result
        start = "T" if o["min_steps"] is None else str(o["min_steps"])
        lines += [f"The two per-maze stopping rules at every size, up to {o['max_steps_factor']}T: solved (%) and "
                  "the mean iterations used (max-conf: the iteration of largest mean confidence over every pixel, after "
                  "DeepThinking's, which averages over open pixels only; "
                  f"stable: the first iteration from {start} on whose mask equals those of the {o['patience']} "
                  "iterations before it; never stable: the last):", ""]
        rule = lambda c, r, s: "-" if f"rule_{r}_solved_{s}" not in c else (  # noqa: E731
            f"{fmt_ci(c[f'rule_{r}_solved_{s}'])} ({fmt_ci(c[f'rule_{r}_iters_{s}'], 1.0, 1)})")
        lines += table(axes + [f"{s}: {name}" for s in sizes for name in ("max-conf", "stable")],
                       [[str(c[a]) for a in axes] + [rule(c, r, s) for s in sizes for r in ("conf", "stable")]
                        for c in cs]) + [""]
        lines += ["What each maze stopping for itself gains over the fixed depth T: the stable rule's solved − solved "
                  "at T, in points, per seed (paired) as mean ± half-width of the 95% t-interval:", ""]
        lines += table(axes + [f"{s}x{s}" for s in sizes],
                       [[str(c[a]) for a in axes] + [_paired(c, f"rule_stable_solved_{s}", f"solved_{s}")
                                                     for s in sizes] for c in cs]) + [""]
    lines += anchor_gaps(cs)
    lines += state_drift(cs, sizes)
    summary = plateau_summary([r for c in cs for r in c["rows"]])
    return lines + ([summary.replace("accuracy", "solved"), ""] if summary else [])


def _paired(c: Dict[str, Any], a: str, b: str) -> str:
    """Mean ± 95% half-width of the per-seed a − b of a cell's runs, in points ('-': no seed has both)."""
    return fmt_ci(mean_ci(paired_differences([r.get(a) for r in c["rows"]], [r.get(b) for r in c["rows"]])),
                  signed=True)


def _sweep_at(r: Dict[str, Any], size: int, key: str, k: int) -> Optional[float]:
    """A run's sweep figure ``key`` at size ``size`` after iteration ``k`` (None: not stored or not reached)."""
    curve = ((r.get("maze_sweeps") or {}).get(str(size)) or {}).get(key)
    return curve[k - 1] if curve and 0 < k <= len(curve) and curve[k - 1] is not None else None


def state_drift(cs: List[Dict[str, Any]], sizes: List[int]) -> List[str]:
    """How each cell's recurrent state and path move past T, at the smallest tested size (the training size in
    the maze studies) and the largest: the growth of the RMS state from T to 10T, each seed (``x12``; a state
    that keeps growing leaves the range its head was trained on), and path recall and precision at 10T (recall
    falls when the path is erased, precision when it spills into dead ends). Only for runs whose sweeps stored the state (recurvit after 8ca379b); nothing
    when none did."""
    def growth(r, s):
        T = int(r.get("steps") or 0)
        a, b = _sweep_at(r, s, "state_rms", T), _sweep_at(r, s, "state_rms", 10 * T)
        return None if a is None or b is None or a <= 0 else b / a

    shown = list(dict.fromkeys(sizes[:1] + sizes[-1:]))  # one column group when a single size is tested
    cells = [c for c in cs if any(growth(r, s) is not None for r in c["rows"] for s in shown)]
    if not cells:
        return []
    head, body = ["cell"], []
    for s in shown:
        head += [f"{s}: state x T→10T, each seed", f"{s}: path recall @10T", f"{s}: precision @10T"]
    for c in cells:
        row = [f"`{c['cell']}`"]
        for s in shown:
            g = [growth(r, s) for r in c["rows"]]
            row.append("; ".join(f"x{v:.3g}" for v in g if v is not None) or "-")
            for key in ("path_recall", "path_precision"):
                row.append(fmt_ci(mean_ci([_sweep_at(r, s, key, 10 * int(r.get("steps") or 0)) for r in c["rows"]])))
        body.append(row)
    return ["How the recurrent state and the path move past T (each run's sweep): the growth of each maze's RMS "
            "state from T to 10T, each seed (a state that keeps growing leaves the range its head was trained on), "
            "and path recall and precision at 10T, % (recall falls when the path is erased, precision when it "
            "spills into dead ends):", ""] + table(head, body) + [""]


def anchor_gaps(cs: List[Dict[str, Any]]) -> List[str]:
    """Each cell against the conv anchor (the one cell of a DeepThinking model) at every size: the difference
    of solved in points (cell − anchor, with its 95% Welch interval where both cells have 2 seeds or more) at
    T, with the stable rule and at 10T, and per figure and size the cell closest to the anchor: by how much
    the recurrent ViT is behind and which regime closes the most of it. Nothing when the study has no anchor."""
    anchors = [c for c in cs if str(c.get("model", "")).startswith(ANCHOR_PREFIX)]
    others = [c for c in cs if not str(c.get("model", "")).startswith(ANCHOR_PREFIX)]
    if len(anchors) != 1 or not others:
        return []
    a = anchors[0]
    sizes = [s for s in a["sizes"] if any(s in c["sizes"] for c in others)]
    if not sizes:
        return []

    def gap(c, key):
        x, y = [r.get(key) for r in c["rows"]], [r.get(key) for r in a["rows"]]
        mx, my = mean_ci(x), mean_ci(y)
        if math.isnan(mx["mean"]) or math.isnan(my["mean"]):
            return None, "-"
        d = (mx["mean"] - my["mean"]) * 100.0
        w = welch(x, y)
        if math.isnan(w["lo"]):
            return d, f"{d:+.1f} (n = {mx['n']} / {my['n']})"
        return d, f"{d:+.1f} [{w['lo'] * 100:+.1f}, {w['hi'] * 100:+.1f}]"

    body = []
    for label, pattern in GAP_FIGURES:
        keys = [pattern.format(s=s) for s in sizes]
        if not any(k in a for k in keys):
            continue
        gaps = {c["cell"]: [gap(c, k) for k in keys] for c in others}
        body += [[label, f"`{name}`", *(t for _, t in g)] for name, g in gaps.items()]
        closest = []
        for i in range(len(sizes)):
            got = {name: g[i][0] for name, g in gaps.items() if g[i][0] is not None}
            if not got:
                closest.append("-")
                continue
            top = max(got.values())
            best = [name for name, d in got.items() if d == top]
            where = "level" if top == 0 else f"ahead by {top:.1f}" if top > 0 else f"behind by {-top:.1f}"
            who = "every cell" if len(best) == len(gaps) > 1 else ", ".join(f"`{b}`" for b in best)
            closest.append(f"{who} ({where})")
        body.append([label, "**closest to the anchor**", *closest])
    if not body:
        return []
    return [f"Each cell against the conv anchor (`{a['cell']}`), solved in points (cell − anchor: the mean "
            "difference over seeds with its 95% Welch interval, or the seeds per cell where a cell has one), at "
            "T, with the stable rule and at 10T; per figure and size, the cell closest to the anchor, which is "
            "how far the recurrent ViT is behind and the regime that closes the most of it:", ""] + \
        table(["figure", "cell"] + [f"{s}x{s}" for s in sizes], body) + [""]


class DenseView(View):
    """Maze runs: train, then one sweep of sizes x test-time iterations (:class:`.evaluators.Mazes`); cells with
    solved per size at T and 10T, comparisons in points, solved-against-iterations plots."""

    name = "dense"
    EVALUATORS = EVALUATORS
    CSV_KEYS = ["model", "core", "runs_as", "width", "steps", "seed", "epochs", "params", "params_stored",
                "flops_forward", "nfe", *RUN_COLUMNS, "train_seconds", "eval_seconds", "plateau_val"]
    STAT_KEYS = ["val_solved", "val_best_iter", "train_seconds", "eval_seconds"]
    SHARED_KEYS = ["model", "core", "runs_as", "width", "steps", "epochs", "params_stored", "flops_forward", "nfe",
                   "max_iters"]
    CURVE_KEY = "val_acc_curve"  # validation solved a epoch (the figure best.pt is chosen on)
    CURVE_WORD = "solved"  # what the every-run table and plot of a registered study read: validation solved
    CONTRAST = Contrast([f"solved_{s}{k}" for s in _SIZES for k in ("", "_10T")], 100.0, "points",
                        {f"solved_{s}{k}": f"solved {s}x{s} @{'10T' if k else 'T'}" for s in _SIZES
                         for k in ("", "_10T")})

    def check_run(self, base: str, overrides: List[str]) -> None:
        """A maze run's config is a run config too: read as classification's is."""
        check_config(base, overrides)

    def run(self, base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
            threads: Optional[int] = None) -> Dict[str, Any]:
        """Train (or resume) the maze run, then sweep it (:data:`EVALUATORS`); the row also holds its cost."""
        return evaluate_trained(out, eval_spec, train_run(base, overrides, out, nproc, threads))

    def csv_columns(self, rows: List[Dict[str, Any]]) -> List[str]:
        """CSV_KEYS, then every size's columns that some row has."""
        return list(self.CSV_KEYS) + per_size_columns(rows)

    def fill_cell(self, c: Dict[str, Any], rs: List[Dict[str, Any]]) -> None:
        """The statistics, then every per-size column's mean and 95% interval and the mean sweep curves (from
        result.json)."""
        super().fill_cell(c, rs)
        for col in per_size_columns(rs):
            c[col] = mean_ci([r.get(col) for r in rs])
        c["sizes"] = sizes_of(rs)
        sweeps = [(r["maze_sweeps"], SOLVED_KEYS[r.get("maze_solved", "strict")]) for r in rs
                  if isinstance(r.get("maze_sweeps"), dict)]
        c["sweeps"] = {}
        for s in (sorted({int(k) for sw, _ in sweeps for k in sw}) if sweeps else []):
            curves = [sw[str(s)][key] for sw, key in sweeps if str(s) in sw]
            K = min(len(x) for x in curves)
            c["sweeps"][s] = {"step": list(range(1, K + 1)), "solved": [sum(x[i] for x in curves) / len(curves)
                                                                         for i in range(K)]}

    def tables(self, rows: List[Dict[str, Any]], cs: List[Dict[str, Any]], study, seeds: list) -> List[str]:
        return intro(rows, seeds, study.evaluators.get("mazes", {}).get("solved", "strict")) + maze_tables(cs, study)

    def plots(self, cs, study, out_dir: Path) -> List[Tuple[str, str]]:
        """Solved against test-time iterations per size, and one large maze solved (kept when only results.csv
        is at hand)."""
        made = []
        if any(c["sweeps"] for c in cs):
            made.append(solved_panels(cs, study, out_dir))
        elif (out_dir / "solved_vs_iterations.png").is_file():  # the report rebuilt from results.csv alone
            made.append(("mazes solved against test-time iterations", "solved_vs_iterations.png"))
        pic = maze_picture(cs, out_dir)
        if pic:
            made.append(pic)
        elif (out_dir / "maze_solved.png").is_file():
            made.append(("one large maze: input, prediction, target", "maze_solved.png"))
        return made
