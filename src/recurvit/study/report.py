"""A study's generated files: results.csv (one row per run), report.md (cells with 95% intervals
over seeds, the study's comparisons as Welch tests, its cost) and the plots of ``plots.py``."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

from . import plots
from .spec import SEED_KEY, Study
from .plateau import plateau_change, plateau_column, plateau_per_seed, plateau_text
from .power import seeds_needed
from .stats import fmt_ci, fmt_p, mean_ci, welch

ACC_KEYS = ["acc_T", "acc_2T", "acc_4T", "acc_8T", "acc_16T", "acc_32T", "acc_64T", "acc_mean_T_4T"]
ACC_HEAD = {"acc_T": "acc@T", "acc_2T": "acc@2T", "acc_4T": "acc@4T", "acc_8T": "acc@8T", "acc_16T": "acc@16T",
            "acc_32T": "acc@32T", "acc_64T": "acc@64T",
            "acc_mean_T_4T": "mean T..4T"}
CSV_KEYS = {
    "classify": ["model", "core", "runs_as", "embed_dim", "depth", "steps", "seed", "epochs", "params",
                 "params_stored", "flops_forward", "nfe", "chance", *ACC_KEYS, "test_acc_final", "train_seconds",
                 "eval_seconds", "plateau_val", "plateau_test"],
    "vae": ["model", "operator", "core", "seed", "epochs", "params_stored", "params_effective", "flops_forward",
            "block_applications", "psnr", "ssim", "out_of_range", "baseline_psnr", "ms_per_img", "train_seconds",
            "eval_seconds"],
}
STAT_KEYS = {"classify": ACC_KEYS + ["train_seconds"], "vae": ["psnr", "ssim", "ms_per_img", "train_seconds"]}
SHARED_KEYS = {"classify": ["model", "core", "runs_as", "shares_blocks", "embed_dim", "depth", "steps", "epochs",
                            "params_stored", "flops_forward", "nfe", "chance"],
               "vae": ["model", "operator", "core", "epochs", "params_stored", "params_effective", "flops_forward",
                       "block_applications"]}


def write_results_csv(rows: List[Dict[str, Any]], study: Study, path: Path) -> None:
    axes = [a for a, _ in study.axes]
    variant_keys = sorted({f"variant_{k}" for r in rows for k, v in (r.get("variants") or {}).items() if v})
    keys = ["run_id"] + axes + [k for k in CSV_KEYS[study.task] if k not in axes] + variant_keys
    import io

    from ..train.rundir import write_atomic

    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        flat = {**r, **{f"variant_{k}": v["acc_T"] for k, v in (r.get("variants") or {}).items() if v}}
        w.writerow({k: (f"{flat[k]:.6g}" if isinstance(flat.get(k), float) else flat.get(k)) for k in keys})
    write_atomic(path, buf.getvalue())  # a reader (or a killed study) never sees half a table


def rows_from_csv(path: Path, study: Study) -> List[Dict[str, Any]]:
    """Rows of a results.csv written earlier (when the run directories are gone): numbers parsed,
    what the CSV does not hold (per-step curves) left out."""
    from ..models.cores import core_class

    def num(v: str) -> Any:
        if v == "":
            return None
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        return v

    with open(path, newline="") as f:
        rows = [{k: (v if k in ("run_id", *dict(study.axes)) else num(v)) for k, v in r.items()}
                for r in csv.DictReader(f)]
    for r in rows:
        if r.get("core") and "shares_blocks" not in r and study.task == "classify":
            r["shares_blocks"] = core_class(r["core"]).shares_blocks
    return rows


def cells(rows: List[Dict[str, Any]], study: Study) -> List[Dict[str, Any]]:
    """Rows grouped over every grid axis except the seed: statistics of each figure."""
    axes = study.cell_axes()
    groups: Dict[Tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(a) for a in axes), []).append(r)
    out = []
    for rs in groups.values():  # beyond-horizon means exist only for runs that reached 4T
        for r in rs:
            if study.task == "classify" and r.get("acc_4T") is None:
                r["acc_mean_T_4T"] = None
    for key, rs in groups.items():
        c = dict(zip(axes, key))
        c["cell"] = " / ".join(map(str, key)) or rs[0]["model"]
        c["rows"] = rs
        c.update({k: rs[0].get(k) for k in SHARED_KEYS[study.task]})
        c["n"] = len(rs)
        for k in STAT_KEYS[study.task]:
            c[k] = mean_ci([r.get(k) for r in rs])
        first = min(rs, key=lambda r: (r.get("seed") is None, r.get("seed")))
        c["curve"] = first.get("test_acc_curve" if study.task == "classify" else "test_psnr_curve")
        if study.task == "classify":
            K = min(len(r.get("horizon_accuracy") or []) for r in rs)
            c["horizon"] = [sum(r["horizon_accuracy"][i] for r in rs) / len(rs) for i in range(K)]
            names = sorted({k for r in rs for k, v in (r.get("variants") or {}).items() if v})
            got = [{k: ((r.get("variants") or {}).get(k) or {}).get("acc_T") for k in names} for r in rs]
            c["variants"] = {k: mean_ci([g[k] for g in got]) for k in names}
            c["variant_changes"] = {k: mean_ci([None if g[k] is None or r.get("acc_T") is None else g[k] - r["acc_T"]
                                                for g, r in zip(got, rs)]) for k in names}
        out.append(c)
    return out


def _cost(rows: List[Dict[str, Any]]) -> str:
    train = sum(r.get("train_seconds") or 0 for r in rows)
    ev = sum(r.get("eval_seconds") or 0 for r in rows)
    return (f"Cost: {train / 3600:.2f} h of training and {ev / 3600:.2f} h of evaluation, summed over runs "
            f"(wall-clock seconds of each run's own process).")


def _table(head: List[str], body: List[List[str]]) -> List[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]


def classify_tables(cs: List[Dict[str, Any]], study: Study) -> List[str]:
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
    lines = _table(head, body) + [""]
    names = sorted({k for c in cs for k in c["variants"]})
    if names:
        lines += ["Evaluated at T with other core options (same weights; `recurvit eval RUN option=value`), "
                  "accuracy in %:", ""]
        lines += _table(axes + ["trained as", "as trained"] + names,
                        [[str(c[a]) for a in axes] + [c["runs_as"], fmt_ci(c["acc_T"])] +
                         [fmt_ci(c["variants"][n]) if n in c["variants"] else "-" for n in names] for c in cs])
        lines += ["", "The same, as the change from the run's own accuracy (points; paired over seeds, mean ± 95% "
                  "half-width: an interval that excludes 0 is a change the seeds agree on):", ""]
        lines += _table(axes + ["trained as"] + names,
                        [[str(c[a]) for a in axes] + [c["runs_as"]] +
                         [fmt_ci(c["variant_changes"][n], signed=True) if n in c["variants"] else "-" for n in names]
                         for c in cs])
        lines.append("")
    return lines


def frontier_table(cs: List[Dict[str, Any]]) -> List[str]:
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
    return lines + _table(["setting", "acc@T", "mean T..4T", "acc@16T", "T vs mean T..4T", "T vs 16T"], body) + [""]


def vae_tables(cs: List[Dict[str, Any]], study: Study) -> List[str]:
    axes = study.cell_axes()
    head = axes + ["model", "core", "params (stored)", "MFLOPs/img", "block apps", "PSNR dB", "SSIM", "ms/img",
                   "Δ last 20% epochs (dB)", "train s"]
    body = [[str(c[a]) for a in axes] + [
        c["model"], c["core"], f"{c['params_stored']:,}", f"{c['flops_forward'] / 1e6:.1f}",
        str(c["block_applications"]), fmt_ci(c["psnr"], 1.0, 2), fmt_ci(c["ssim"], 1.0, 4),
        fmt_ci(c["ms_per_img"], 1.0, 2), plateau_column([None if v is None else v / 100 for v in c["curve"] or []]),
        f"{c['train_seconds']['mean']:.0f}"] for c in cs]
    return _table(head, body) + [""]


def comparisons(cs: List[Dict[str, Any]], study: Study) -> List[str]:
    if not study.compare:
        return []
    axes = study.cell_axes()
    keys = ACC_KEYS if study.task == "classify" else ["psnr", "ssim"]
    scale = 100.0 if study.task == "classify" else 1.0
    unit = "points" if study.task == "classify" else "dB / SSIM"
    lines = [f"Comparisons (difference of means, {unit}, with its 95% Welch interval and two-sided p-value; "
             f"n = seeds per cell; seeds needed = the seeds per cell with which a 95% interval would exclude 0 "
             f"at the observed difference and spread):", ""]
    body = []
    for a, b in study.compare:
        for ca, cb, where in _pairs(cs, axes, a, b):
            for k in keys:
                w = welch([r.get(k) for r in ca["rows"]], [r.get(k) for r in cb["rows"]])
                if math.isnan(w["diff"]):
                    continue
                need = seeds_needed([r.get(k) for r in ca["rows"]], [r.get(k) for r in cb["rows"]])
                body.append([f"{a} − {b}{where}", ACC_HEAD.get(k, k), f"{w['diff'] * scale:+.2f}",
                             f"[{w['lo'] * scale:+.2f}, {w['hi'] * scale:+.2f}]", fmt_p(w["p"]),
                             f"{ca['n']} / {cb['n']}", _fmt_need(need)])
    if not body:  # a partial study: no pair of cells has two seeds each yet
        return []
    return lines + _table(["comparison", "figure", "difference", "95% interval", "p", "n", "seeds needed"], body) + [""]


def _fmt_need(n: float) -> str:
    return "-" if math.isnan(n) else "> 1000" if math.isinf(n) else f"{n:.0f}"


def _axis_of(cs: List[Dict[str, Any]], axes: List[str], a: str, b: str):
    """The axis whose labels include both ``a`` and ``b`` (None: no such axis)."""
    return next((x for x in axes if any(str(c[x]) == a for c in cs) and any(str(c[x]) == b for c in cs)), None)


def _pairs(cs: List[Dict[str, Any]], axes: List[str], a: str, b: str):
    """(cell a, cell b, ' (other labels)') for every combination of the OTHER axes' labels: in a
    width x model grid, ``[vit, bvit]`` is one comparison per width, never a mix of widths."""
    axis = _axis_of(cs, axes, a, b)
    if axis is None:
        return []
    others = [x for x in axes if x != axis]
    out = []
    for ca in (c for c in cs if str(c[axis]) == a):
        key = tuple(str(ca[x]) for x in others)
        cb = next((c for c in cs if str(c[axis]) == b and tuple(str(c[x]) for x in others) == key), None)
        if cb is not None:
            out.append((ca, cb, f" ({', '.join(key)})" if others else ""))
    return out


def _not_run_yet(study: Study, rows: List[Dict[str, Any]]) -> List[str]:
    """A partial study (stopped, or run with --only) says which runs its tables do not have yet."""
    have = {r.get("run_id") for r in rows}
    missing = [r.run_id for r in study.runs if r.run_id not in have]
    if not missing:
        return []
    per_cell: Dict[str, int] = {}
    for run_id in missing:  # the cell: the run id without its seed
        cell = "__".join(p for p in run_id.split("__") if not p.startswith("seed=")) or run_id
        per_cell[cell] = per_cell.get(cell, 0) + 1
    cells_text = ", ".join(f"`{c}` ({n})" for c, n in per_cell.items())
    return [f"**Partial study**: {len(study.runs) - len(missing)} of its {len(study.runs)} runs are in; not run yet "
            f"(runs): {cells_text}. The same command continues it.", ""]


def write_report(rows: List[Dict[str, Any]], study: Study, out_dir: Path, command: str = "") -> Path:
    """results.csv, report.md and the plots into ``out_dir``; returns the report path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [r for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    write_results_csv(rows, study, out_dir / "results.csv")
    cs = cells(rows, study)
    seeds = sorted({r.get("seed") for r in rows}, key=lambda s: (s is None, s))
    for r in rows:  # results of an older runner: the plateau read off the stored curves
        for key, curve in (("plateau_val", "val_acc_curve"), ("plateau_test", "test_acc_curve")):
            if r.get(key) is None and r.get(curve):
                r[key] = plateau_change(r[curve])
    lines = [f"# Study `{study.name}`", "", "Generated by `recurvit study` from `results.csv`; do not edit by hand.", ""]
    if command:
        lines += ["Command:", "", "```", command, "```", ""]
    lines += [_cost(rows), ""]
    lines += _not_run_yet(study, rows + failed)
    if study.task == "classify":
        chance = (rows[0].get("chance") or math.nan) if rows else math.nan
        level = f"chance level {100 * chance:.1f}%" if not math.isnan(chance) else "chance level not recorded"
        lines += [f"{len(rows)} runs; seeds {seeds}; accuracy in % as mean ± half-width of the 95% t-interval over "
                  f"seeds; {level}. T = trained steps; acc@kT = test accuracy when run for "
                  "k x T steps (ODE: k x the trained time span); mean T..4T = mean accuracy over every step from T "
                  f"to 4T; {plateau_text(rows)}", ""]
        lines += classify_tables(cs, study)
        if study.frontier:
            lines += frontier_table(cs)
    else:
        chance = math.nan
        lines += [f"{len(rows)} runs; seeds {seeds}; PSNR / SSIM / ms per image as mean ± half-width of the 95% "
                  "t-interval over seeds (ms/img: reconstruction of a batch of 16, best of 3).", ""]
        lines += vae_tables(cs, study)
    lines += comparisons(cs, study)
    if failed:
        lines += ["Failed runs (not in the table):", ""] + [f"- `{r['run_id']}`: {r['error']}" for r in failed] + [""]
    for title, name in _plots(cs, study, out_dir, chance):
        lines += [f"![{title}]({name})", ""]
    from ..train.rundir import write_atomic

    write_atomic(out_dir / "report.md", "\n".join(lines))
    return out_dir / "report.md"


def _plots(cs, study: Study, out_dir: Path, chance: float) -> List[Tuple[str, str]]:
    if not cs:
        return []
    if study.task == "vae":
        return [plots.psnr_vs_params(cs, out_dir, study.name),
                plots.epochs(cs, out_dir, study.name, ylabel="test PSNR (dB)")]
    made = plots.cost_fronts(cs, out_dir, study.name)
    if any(len(c["horizon"]) > 1 for c in cs):
        made.append(plots.horizon(cs, out_dir, study.name, chance))
    if any(c["curve"] for c in cs):
        made.append(plots.epochs(cs, out_dir, study.name))
    if study.frontier:
        made.append(plots.frontier(cs, out_dir, study.name, chance))
    axes = study.cell_axes()
    for a, b in study.compare:  # a comparison made at 3 or more labels of one other axis: its trend
        pairs, others = _pairs(cs, axes, a, b), [x for x in axes if x != _axis_of(cs, axes, a, b)]
        if len(pairs) >= 3 and len(others) == 1:
            points = [(where.strip(" ()"), welch([r.get("acc_T") for r in ca["rows"]],
                                                 [r.get("acc_T") for r in cb["rows"]])) for ca, cb, where in pairs]
            made.append(plots.difference_across(points, out_dir, study.name, f"{a} − {b}", others[0],
                                                f"{a} − {b}, acc@T (points)"))
    return made


__all__ = ["write_report", "write_results_csv", "cells", "SEED_KEY"]
