"""A study's generated files: results.csv (one row per run), report.md (cells with 95% intervals
over seeds, the study's comparisons as Welch tests, its cost) and the plots of ``plots.py``."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import UserError
from ..run.atomic import write_atomic
from .evaluators import columns, evaluator
from .grouping import pairs, table
from .plateau import plateau_summary, PLATEAU_TOL
from .plots import every_run
from .power import seeds_needed
from .registry import view_of
from .spec import SEED_KEY, Study
from .stats import fmt_ci, fmt_p, mean_ci, welch


def evaluator_columns(rows: List[Dict[str, Any]], study: Study) -> List[str]:
    """The scalar columns the task's evaluators add (their ``columns``, tagged for the study's tagged
    instances such as ``exit@beyond``) that some row has."""
    table = view_of(study.task).EVALUATORS
    keys = list(table) + [k for k in study.evaluators if k not in table]
    cols = [c for k in keys for c in columns(k, evaluator(table, k))]
    return [c for c in dict.fromkeys(cols) if any(r.get(c) is not None for r in rows)]


def write_results_csv(rows: List[Dict[str, Any]], study: Study, path: Path) -> None:
    write_atomic(path, results_csv(rows, study))  # a reader (or a killed study) never sees half a table


def results_csv(rows: List[Dict[str, Any]], study: Study) -> str:
    """The text of results.csv: one row per run, the grid's columns, then the task's and its evaluators'."""
    axes, view = [a for a, _ in study.axes], view_of(study.task)
    variant_keys = sorted({f"variant_{k}" for r in rows for k, v in (r.get("variants") or {}).items() if v})
    keys = (["run_id"] + axes + [k for k in view.csv_columns(rows) if k not in axes]
            + evaluator_columns(rows, study) + variant_keys)
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        flat = {**r, **{f"variant_{k}": v["acc_T"] for k, v in (r.get("variants") or {}).items() if v}}
        w.writerow({k: (f"{flat[k]:.6g}" if isinstance(flat.get(k), float) else flat.get(k)) for k in keys})
    return buf.getvalue()


def rows_from_csv(path: Path, study: Study) -> List[Dict[str, Any]]:
    """Rows of a results.csv (when the run directories and the results folder's copies of their results are
    gone): numbers parsed, what the CSV does not hold (per-step curves) left out."""
    try:
        with open(path, newline="") as f:
            rows = rows_from_text(f.read(), study)
    except (csv.Error, UnicodeDecodeError, KeyError, ValueError, TypeError) as e:
        raise UserError(f"{path} is not a results table recurvit study wrote ({type(e).__name__}: {e}); "
                        "run the study again to rebuild it") from None
    need = {"run_id", *dict(study.axes)}
    broken = [r for r in rows if not need <= {k for k, v in r.items() if v is not None}]
    if broken:
        raise UserError(f"{path} is not a results table recurvit study wrote (a row lacks "
                        f"{', '.join(sorted(need - set(broken[0])))  or 'its grid labels'}); run the study again to rebuild it")
    return rows


def rows_from_text(text: str, study: Study) -> List[Dict[str, Any]]:
    """:func:`rows_from_csv` of a results.csv's text (e.g. as an earlier commit held it)."""
    def num(v: str) -> Any:
        if v == "":
            return None
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        return v

    rows = [{k: (v if k in ("run_id", *dict(study.axes)) else num(v)) for k, v in r.items()}
            for r in csv.DictReader(io.StringIO(text))]
    view = view_of(study.task)
    for r in rows:
        view.complete_row(r)
    return rows


def cells(rows: List[Dict[str, Any]], study: Study) -> List[Dict[str, Any]]:
    """Rows grouped over every grid axis except the seed: statistics of each figure."""
    axes, view = study.cell_axes(), view_of(study.task)
    groups: Dict[Tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(a) for a in axes), []).append(r)
    out = []
    for key, rs in groups.items():
        c = dict(zip(axes, key))
        c["cell"] = " / ".join(map(str, key)) or rs[0]["model"]
        c["rows"] = rs
        view.fill_cell(c, rs)
        out.append(c)
    return out


def _cost(rows: List[Dict[str, Any]]) -> str:
    train = sum(r.get("train_seconds") or 0 for r in rows)
    ev = sum(r.get("eval_seconds") or 0 for r in rows)
    return (f"Cost: {train / 3600:.2f} h of training and {ev / 3600:.2f} h of evaluation, summed over runs "
            f"(wall-clock seconds of each run's own process).")


def comparisons(cs: List[Dict[str, Any]], study: Study) -> List[str]:
    if not study.compare:
        return []
    axes, view = study.cell_axes(), view_of(study.task)
    keys, scale, unit, heads = view.CONTRAST
    lines = [f"Comparisons (difference of means, {unit}, with its 95% Welch interval and two-sided p-value; "
             f"n = seeds per cell; seeds needed = the seeds per cell with which a 95% interval would exclude 0 "
             f"at the observed difference and spread):", ""]
    body = []
    for a, b in study.compare:
        for ca, cb, where in pairs(cs, axes, a, b):
            for k in keys:
                w = welch([r.get(k) for r in ca["rows"]], [r.get(k) for r in cb["rows"]])
                if math.isnan(w["diff"]):
                    continue
                need = seeds_needed([r.get(k) for r in ca["rows"]], [r.get(k) for r in cb["rows"]])
                body.append([f"{a} − {b}{where}", heads.get(k, k), f"{w['diff'] * scale:+.2f}",
                             f"[{w['lo'] * scale:+.2f}, {w['hi'] * scale:+.2f}]", fmt_p(w["p"]),
                             f"{ca['n']} / {cb['n']}", _fmt_need(need)])
    if not body:  # a partial study: no pair of cells has two seeds each yet
        return []
    return lines + table(["comparison", "figure", "difference", "95% interval", "p", "n", "seeds needed"], body) + [""]


def _fmt_need(n: float) -> str:
    return "-" if math.isnan(n) else "> 1000" if math.isinf(n) else f"{n:.0f}"


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


def report_command(report: Path) -> Optional[str]:
    """The command a written report names (its ``Command:`` block), or None: what a report rewritten
    with ``--report-only`` keeps, since that command made the runs and the rewrite made none."""
    try:
        lines = report.read_text().splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines[:-2]):
        if line == "Command:" and lines[i + 2] == "```" and i + 3 < len(lines):
            return lines[i + 3]
    return None


def write_report(rows: List[Dict[str, Any]], study: Study, out_dir: Path, command: str = "") -> Path:
    """results.csv, report.md and the plots into ``out_dir``; returns the report path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [r for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    write_results_csv(rows, study, out_dir / "results.csv")
    cs = cells(rows, study)
    seeds = sorted({r.get("seed") for r in rows}, key=lambda s: (s is None, s))
    lines = [f"# Study `{study.name}`", "", "Generated by `recurvit study` from `results.csv`; do not edit by hand.", ""]
    if command:
        lines += ["Command:", "", "```", command, "```", ""]
    lines += [_cost(rows), ""]
    lines += _not_run_yet(study, rows + failed)
    view = view_of(study.task)
    lines += view.tables(rows, cs, study, seeds)
    lines += evaluated_table(cs, study)
    lines += comparisons(cs, study)
    if failed:
        lines += ["Failed runs (not in the table):", ""] + [f"- `{r['run_id']}`: {r['error']}" for r in failed] + [""]
    plots = view.plots(cs, study, out_dir) if cs else []
    if study.registration and rows:  # a registered study shows every run's curve: was its budget enough?
        word = view.CURVE_WORD  # the per-epoch figure its runs' curves hold
        lines += every_run_table(rows, study, word)
        plots.insert(0, every_run(rows, lambda r: _cell_name(r, study), out_dir, study.name, word))
    for title, name in plots:
        lines += [f"![{title}]({name})", ""]

    write_atomic(out_dir / "report.md", "\n".join(lines))
    return out_dir / "report.md"


def _cell_name(r: Dict[str, Any], study: Study) -> str:
    return "/".join(str(r.get(a)) for a in study.cell_axes())


def every_run_table(rows: List[Dict[str, Any]], study: Study, word: str = "accuracy") -> List[str]:
    """Each run's last validation (else test) accuracy and its change over the last 20% of its epochs (a
    least-squares line through them, :func:`recurvit.study.plateau.plateau_change`), against the plateau
    criterion: whether the budget was enough is read off the data, run by run."""
    key = "plateau_val" if any(r.get("plateau_val") is not None for r in rows) else "plateau_test"
    curve = "val_acc_curve" if key == "plateau_val" else "test_acc_curve"
    body = []
    for r in sorted(rows, key=lambda r: (_cell_name(r, study), str(r.get("seed")))):
        ys = [y for y in r.get(curve) or [] if y is not None]
        change = r.get(key)
        body.append([str(r.get("run_id")), str(len(ys)), f"{100 * ys[-1]:.2f}" if ys else "-",
                     "-" if change is None else f"{100 * change:+.2f}",
                     "-" if change is None else ("still rising" if change >= PLATEAU_TOL else
                                                 "falling" if change <= -PLATEAU_TOL else "plateau")])
    split = "validation" if key == "plateau_val" else "test"
    # the classification tables above already say the plateau line; another task's figure gets it here
    short, summary = ("acc", "") if word == "accuracy" else (word, plateau_summary(rows).replace("accuracy", word))
    return ([f"Every run (registered study): its last {split} {word} and the change over its last 20% of "
             f"epochs (points; a plateau is a change under {100 * PLATEAU_TOL:.1f} points either way):", ""]
            + table(["run", "epochs", f"last {split} {short} (%)", "Δ last 20% (points)", "reads"], body)
            + ([""] + ([summary, ""] if summary else [])))


def evaluated_table(cs: List[Dict[str, Any]], study: Study) -> List[str]:
    """The figures the study's evaluators added (their ``columns``), per cell: mean ± 95% half-width over
    seeds, as each evaluator stores them (see its docstring for units)."""
    cols = evaluator_columns([r for c in cs for r in c["rows"]], study)
    if not cols:
        return []
    axes = study.cell_axes()
    body = [[str(c[a]) for a in axes] + [fmt_ci(mean_ci([r.get(k) for r in c["rows"]]), 1.0, 3) for k in cols]
            for c in cs if any(r.get(k) is not None for r in c["rows"] for k in cols)]
    return [f"Figures of the study's evaluators ({', '.join(study.evaluators)}), mean ± 95% half-width over "
            "seeds:", ""] + table(axes + cols, body) + [""]


__all__ = ["write_report", "write_results_csv", "cells", "SEED_KEY"]
