"""What a study asks of classification runs (:class:`ClassifyView`): each run's result row (train, then evaluate
over the horizon and core-option variants) and the columns, cells, tables and plots of its report.
The study runner and report (recurvit.study) find it through the task table (:mod:`recurvit.study.registry`)."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...analysis.accounting import account
from ...analysis.anytime import plot
from ...config import load_config
from ...errors import UserError
from ...models.cores import core_class
from ...models.loopvae_config import LoopVAEConfig
from ...models.registry import model_config
from ...run.device import pick_device
from ...run.load import load
from ...run.loaders import build_test_loader
from ...run.progress import quiet
from ...run.rundir import RunDir
from ...study import plots
from ...study.evaluators import Evaluated, evaluate_run
from ...study.grouping import axis_of, pairs, table
from ...study.plateau import plateau_change, plateau_column, plateau_per_seed, plateau_summary, plateau_text
from ...study.registry import Contrast, View
from ...study.stats import fmt_ci, mean_ci, welch
from ...study.workers import run_config, train_in_processes
from .evaluators import EVALUATORS
from .task import train

ACC_KEYS = ["acc_T", "acc_2T", "acc_4T", "acc_8T", "acc_16T", "acc_32T", "acc_64T", "acc_mean_T_4T"]
ACC_HEAD = {"acc_T": "acc@T", "acc_2T": "acc@2T", "acc_4T": "acc@4T", "acc_8T": "acc@8T", "acc_16T": "acc@16T",
            "acc_32T": "acc@32T", "acc_64T": "acc@64T",
            "acc_mean_T_4T": "mean T..4T"}


# ------------------------------------------------------------------------------- one run's row
def check_config(base: str, overrides: List[str]) -> None:
    """A classification grid point's config (a LoopVAE base is one line saying task: vae)."""
    cfg = load_config(base, overrides)
    if isinstance(model_config(cfg.model.name), LoopVAEConfig):  # a VAE base in a classification study
        raise UserError(f"model {cfg.model.name} is a LoopVAE tokenizer, not a classifier: a study of it says "
                        "task: vae")


def train_run(base: str, overrides: List[str], out: Path, nproc: int = 1, threads: Optional[int] = None
              ) -> Dict[str, Any]:
    """Train (or resume) a run of ``recurvit train`` (classification or mazes: the data chooses the task) in
    folder ``out``, in ``nproc`` processes when > 1; returns what its training returned."""
    cfg = run_config(load_config, out, base, overrides)
    cfg.train.progress = False
    if nproc > 1:
        return train_in_processes(["train"], base, overrides, out, nproc, threads)
    return train(cfg, out, resume=out.is_dir(), log=quiet)


def evaluate_trained(out: Path, eval_spec: Dict[str, Any], metrics: Dict[str, Any]) -> Dict[str, Any]:
    """The result row of a trained classification run (its last.pt): the evaluators of ``eval_spec``,
    its cost (parameters, FLOPs, NFE) and its curves; ``metrics``: what its training returned."""
    t0 = time.perf_counter()
    loaded = load(out / "last.pt")
    model, cfg = loaded.model, loaded.config
    device = pick_device(cfg.train.device)
    model.to(device)
    test_loader, info = build_test_loader(cfg)
    figures = evaluate_run(Evaluated(model, cfg, out, device, test_loader, info,
                                     load=lambda **opts: load(out / "last.pt", **opts).model),
                           eval_spec, EVALUATORS)
    acct = account(model.cpu(), memory=False)
    mc = model.cfg
    logged = RunDir(out, created=False, owner=False).read_metrics()
    curve = [m.get("test_acc") for m in logged]
    val_curve = [m.get("val_acc") for m in logged] if any("val_acc" in m for m in logged) else None
    return {
        "model": cfg.model.name, "core": mc.core, "runs_as": mc.core_cls.describe(mc),
        "shares_blocks": mc.core_cls.shares_blocks, "embed_dim": mc.embed_dim, "depth": mc.depth,
        "steps": model.nominal_steps, "seed": cfg.train.seed, "epochs": cfg.train.epochs, "params": acct["params"],
        "params_stored": acct["params_stored"], "flops_forward": acct["flops_forward"], "nfe": acct["nfe"],
        "chance": 1.0 / info.num_classes, **figures,
        "test_acc_final": metrics.get("test_acc"), "train_seconds": metrics.get("train_seconds"),
        "eval_seconds": time.perf_counter() - t0,
        "test_acc_curve": curve, "val_acc_curve": val_curve,
        "plateau_val": plateau_change(val_curve), "plateau_test": plateau_change(curve),
    }


# ------------------------------------------------------------------------------------ the report
def chance_of(rows: List[Dict[str, Any]]) -> float:
    """The chance level the rows record (nan when none does)."""
    return (rows[0].get("chance") or math.nan) if rows else math.nan


def intro(rows: List[Dict[str, Any]], seeds: list) -> List[str]:
    """The report's first sentence: runs, seeds, units, chance level, what acc@kT and the plateau column are."""
    chance = chance_of(rows)
    level = f"chance level {100 * chance:.1f}%" if not math.isnan(chance) else "chance level not recorded"
    return [f"{len(rows)} runs; seeds {seeds}; accuracy in % as mean ± half-width of the 95% t-interval over "
            f"seeds; {level}. T = trained steps; acc@kT = test accuracy when run for "
            "k x T steps (ODE: k x the trained time span); mean T..4T = mean accuracy over every step from T "
            f"to 4T; {plateau_text(rows)}", ""]


def accuracy_tables(cs: List[Dict[str, Any]], study) -> List[str]:
    """Accuracy per cell at and beyond T with cost and plateau, the core-option variants, the frontier."""
    axes = study.cell_axes()
    acc = [k for k in ACC_KEYS if any(not math.isnan(c[k]["mean"]) for c in cs)]
    model = [] if "model" in axes else ["model"]  # an axis named model is that column already
    per_seed = any(r.get("plateau_val") is not None or r.get("plateau_test") is not None for c in cs for r in c["rows"])
    plateau = "Δ last 20% epochs, each seed" if per_seed else "Δ last 20% epochs"
    head = axes + model + ["params (stored)", "MFLOPs/img", "NFE", "T", "epochs"] + [ACC_HEAD[k] for k in acc] + \
        [plateau, "train s"]
    body = [[str(c[a]) for a in axes] + [c["model"] for _ in model] + [
        f"{c['params_stored']:,}", f"{c['flops_forward'] / 1e6:.2f}", str(c["nfe"]), str(c["steps"]),
        str(c["epochs"] or "-")] + [fmt_ci(c[k]) for k in acc] +
        [plateau_per_seed(c) if per_seed else plateau_column(c["curve"]), f"{c['train_seconds']['mean']:.0f}"]
        for c in cs]
    lines = table(head, body) + [""]
    summary = plateau_summary([r for c in cs for r in c["rows"]]) if per_seed else ""
    lines += [summary, ""] if summary else []
    names = sorted({k for c in cs for k in c["variants"]})
    if names:
        lines += ["Evaluated at T with other core options (same weights; `recurvit eval RUN option=value`), "
                  "accuracy in %:", ""]
        lines += table(axes + ["trained as", "as trained"] + names,
                        [[str(c[a]) for a in axes] + [c["runs_as"], fmt_ci(c["acc_T"])] +
                         [fmt_ci(c["variants"][n]) if n in c["variants"] else "-" for n in names] for c in cs])
        lines += ["", "The same, as the change from the run's own accuracy (points; paired over seeds, mean ± 95% "
                  "half-width: an interval that excludes 0 is a change the seeds agree on):", ""]
        lines += table(axes + ["trained as"] + names,
                        [[str(c[a]) for a in axes] + [c["runs_as"]] +
                         [fmt_ci(c["variant_changes"][n], signed=True) if n in c["variants"] else "-" for n in names]
                         for c in cs])
        lines.append("")
    if study.frontier:
        lines += _frontier_table(cs)
    return lines


def _frontier_table(cs: List[Dict[str, Any]]) -> List[str]:
    """Where each setting sits on the accuracy-robustness frontier (means over seeds): on the front
    (no other setting is at least as good on both axes and better on one) or behind which settings."""
    cs = [c for c in cs if not math.isnan(c["acc_T"]["mean"]) and not math.isnan(c["acc_mean_T_4T"]["mean"])]
    if len(cs) < 2:
        return []

    def behind(c, key):
        x, y = c["acc_T"]["mean"], c[key]["mean"]
        better = [o["cell"] for o in cs if o is not c and not math.isnan(o[key]["mean"])
                  and o["acc_T"]["mean"] >= x and o[key]["mean"] >= y
                  and (o["acc_T"]["mean"] > x or o[key]["mean"] > y)]
        return "on the front" if not better else "behind " + ", ".join(better)

    lines = ["The accuracy-robustness frontier (means over seeds; a setting is on the front when no other is at "
             "least as accurate at T and beyond the horizon, and better on one; the 95% intervals of this report say which "
             "differences the seeds separate):", ""]
    body = [[c["cell"], fmt_ci(c["acc_T"]), fmt_ci(c["acc_mean_T_4T"]), fmt_ci(c["acc_16T"]),
             behind(c, "acc_mean_T_4T"), behind(c, "acc_16T") if not math.isnan(c["acc_16T"]["mean"]) else "-"]
            for c in cs]
    return lines + table(["setting", "acc@T", "mean T..4T", "acc@16T", "T vs mean T..4T", "T vs 16T"], body) + [""]


class ClassifyView(View):
    """Classification runs: train, then the evaluators of the study file's ``eval:`` (the horizon sweep at least);
    cells with accuracy at and beyond the trained depth, comparisons in points, cost fronts and horizon plots."""

    name = "classify"
    EVALUATORS = EVALUATORS
    CSV_KEYS = ["model", "core", "runs_as", "embed_dim", "depth", "steps", "seed", "epochs", "params",
                "params_stored", "flops_forward", "nfe", "chance", *ACC_KEYS, "test_acc_final", "train_seconds",
                "eval_seconds", "plateau_val", "plateau_test"]
    STAT_KEYS = ACC_KEYS + ["train_seconds"]
    SHARED_KEYS = ["model", "core", "runs_as", "shares_blocks", "embed_dim", "depth", "steps", "epochs",
                   "params_stored", "flops_forward", "nfe", "chance"]
    CURVE_KEY = "test_acc_curve"
    CONTRAST = Contrast(ACC_KEYS, 100.0, "points", ACC_HEAD)

    def check_run(self, base: str, overrides: List[str]) -> None:
        """A grid point's config, read when the study file is (a bad value is one line before any run trains)."""
        check_config(base, overrides)

    def run(self, base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
            threads: Optional[int] = None) -> Dict[str, Any]:
        """Train (or resume) the run, then run the evaluators of ``eval_spec`` ({name: options},
        :data:`recurvit.tasks.classify.evaluators.EVALUATORS`); the row also holds the run's cost and curves."""
        return evaluate_trained(out, eval_spec, train_run(base, overrides, out, nproc, threads))

    # -------------------------------------------------------------------------------- the report
    def complete_row(self, r: Dict[str, Any]) -> None:
        """A row read back from results.csv: what it implies but does not store (whether its core shares its
        blocks; the core-option variants, stored flat as variant_<name> columns)."""
        if r.get("core") and "shares_blocks" not in r:
            r["shares_blocks"] = core_class(r["core"]).shares_blocks
        if "variants" not in r:  # the core-option variants' accuracies, from their variant_<name> columns
            got = {k[len("variant_"):]: v for k, v in r.items() if k.startswith("variant_")}
            if got:
                r["variants"] = {name: ({"acc_T": v} if v is not None else None) for name, v in got.items()}

    def fill_cell(self, c: Dict[str, Any], rs: List[Dict[str, Any]]) -> None:
        """The cell's statistics (the beyond-horizon mean only of runs that reached 4T), its mean horizon curve
        and its core-option variants."""
        for r in rs:
            if r.get("acc_4T") is None:
                r["acc_mean_T_4T"] = None
        super().fill_cell(c, rs)
        K = min(len(r.get("horizon_accuracy") or []) for r in rs)
        c["horizon"] = [sum(r["horizon_accuracy"][i] for r in rs) / len(rs) for i in range(K)]
        names = sorted({k for r in rs for k, v in (r.get("variants") or {}).items() if v})
        got = [{k: ((r.get("variants") or {}).get(k) or {}).get("acc_T") for k in names} for r in rs]
        c["variants"] = {k: mean_ci([g[k] for g in got]) for k in names}
        c["variant_changes"] = {k: mean_ci([None if g[k] is None or r.get("acc_T") is None else g[k] - r["acc_T"]
                                            for g, r in zip(got, rs)]) for k in names}

    def tables(self, rows: List[Dict[str, Any]], cs: List[Dict[str, Any]], study, seeds: list) -> List[str]:
        """What the figures are (chance level, horizon, plateau), the accuracy table, the core-option variants
        and, when the study asks, the accuracy-robustness frontier."""
        return intro(rows, seeds) + accuracy_tables(cs, study)

    def plots(self, cs, study, out_dir: Path) -> List[Tuple[str, str]]:
        """Cost fronts, the horizon and per-epoch curves, the frontier, anytime exit and comparison trends."""
        chance = chance_of([r for c in cs for r in c["rows"]])
        made = plots.cost_fronts(cs, out_dir, study.name)
        # the per-step and per-epoch curves are in the runs, not in results.csv: a report made from
        # results.csv alone (run directories gone) keeps the plots drawn from them beside it
        if any(len(c["horizon"]) > 1 for c in cs):
            made.append(plots.horizon(cs, out_dir, study.name, chance))
        elif (out_dir / plots.HORIZON[1]).is_file():
            made.append(plots.HORIZON)
        if any(c["curve"] for c in cs):
            made.append(plots.epochs(cs, out_dir, study.name))
        elif (out_dir / plots.EPOCHS[1]).is_file():
            made.append(plots.EPOCHS)
        if study.frontier:
            made.append(plots.frontier(cs, out_dir, study.name, chance))
        axes = study.cell_axes()
        exits = [(c, r) for c in cs for r in c["rows"][:1] if isinstance(r.get("exit"), dict)]
        if exits:  # anytime exit: accuracy against mean steps, every criterion's sweep, the first seed of each cell
            plot([{"title": f"{', '.join(str(c[a]) for a in axes)} (seed {r.get('seed')}), "
                            f"chosen: {r['exit']['chosen']}",
                   "T": r["steps"], "fixed": next(iter(r["exit"]["per_criterion"].values()))["fixed_accuracy"],
                   "curves": {k: {"rows": e["sweep"], "point": e["test"]}
                              for k, e in r["exit"]["per_criterion"].items()}}
                  for c, r in exits], out_dir / "exit.png")
            made.append(("anytime exit: test accuracy against mean steps per image", "exit.png"))
        for a, b in study.compare:  # a comparison made at 3 or more labels of one other axis: its trend
            found, others = pairs(cs, axes, a, b), [x for x in axes if x != axis_of(cs, axes, a, b)]
            if len(found) >= 3 and len(others) == 1:
                points = [(where.strip(" ()"), welch([r.get("acc_T") for r in ca["rows"]],
                                                     [r.get("acc_T") for r in cb["rows"]])) for ca, cb, where in found]
                made.append(plots.difference_across(points, out_dir, study.name, f"{a} − {b}", others[0],
                                                    f"{a} − {b}, acc@T (points)"))
        return made
