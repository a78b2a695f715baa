"""Study runner: a grid of runs from one base config, resumable, with generated tables and plots.

A study file::

    name: crossroads-digits
    base: configs/digits/bvit.yaml        # relative to the study file's folder, then to the cwd
    grid:
      regime:                             # a mapping: named variants, each a set of dotted overrides
        naive: {}
        deep_supervision: {train.supervision.stages: 3, train.supervision.weights: uniform}
      train.seed: [0, 1, 2]               # a list: values of one dotted key
    eval:
      max_steps_factor: 4                 # horizon sweep up to 4T
    results: results/crossroads_digits    # where results.csv / report.md / plots go (default: the study dir)

Each grid point is a run directory ``<study dir>/runs/<id>``; a run with ``result.json`` is done
and skipped, a run with ``last.pt`` only is resumed, so an interrupted study continues where it
stopped. ``results.csv`` has one row per run; ``report.md`` gives mean +- std over seeds per cell.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import os
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from ..errors import UserError

SEED_KEY = "train.seed"


@dataclass
class RunSpec:
    run_id: str
    labels: Dict[str, str]  # grid axis -> label of this run's value
    overrides: List[str]  # dotted key=value
    base: Optional[Path] = None  # a variant's own base config (default: the study's)


@dataclass
class Study:
    name: str
    base: Path
    axes: List[Tuple[str, List[Tuple[str, Dict[str, Any]]]]]  # axis -> [(label, {dotted key: value})]
    max_steps_factor: int = 4
    results: Optional[Path] = None
    path: Optional[Path] = None
    runs: List[RunSpec] = field(default_factory=list)


def _label(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", str(value))


def load_study(path: str | Path) -> Study:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"study file not found: {p}")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"study file {p} is not valid YAML: {str(e).splitlines()[0]}") from None
    for key in ("name", "base", "grid"):
        if key not in raw:
            raise UserError(f"study file {p} needs a '{key}:' entry (see recurvit/analysis/study.py)")
    base = _find(raw["base"], p)
    axes = []
    for axis, values in (raw["grid"] or {}).items():
        if isinstance(values, dict):
            variants = [(str(lbl), dict(ov or {})) for lbl, ov in values.items()]
        elif isinstance(values, list):
            variants = [(_label(v), {axis: v}) for v in values]
        else:
            raise UserError(f"grid entry '{axis}' must be a list of values or a mapping of named variants")
        if not variants:
            raise UserError(f"grid entry '{axis}' is empty")
        axes.append((str(axis), variants))
    ev = raw.get("eval") or {}
    study = Study(name=str(raw["name"]), base=base, axes=axes, max_steps_factor=int(ev.get("max_steps_factor", 4)),
                  results=(p.parent / raw["results"]).resolve() if raw.get("results") else None, path=p)
    study.runs = expand(study)
    return study


def _find(path: str, study_file: Optional[Path]) -> Path:
    """A config path relative to the study file's folder, else to the current directory."""
    for cand in ((study_file.parent / path) if study_file else None, Path(path)):
        if cand is not None and cand.is_file():
            return cand
    raise UserError(f"study base config not found: {path} (relative to the study file or the current directory)")


def expand(study: Study) -> List[RunSpec]:
    runs = []
    for combo in itertools.product(*[variants for _, variants in study.axes]):
        labels, overrides = {}, []
        for (axis, _), (label, ov) in zip(study.axes, combo):
            labels[axis] = label
            overrides += [f"{k}={_yaml_value(v)}" for k, v in ov.items()]
        run_id = "__".join(f"{axis.split('.')[-1]}={lbl}" if _is_value_axis(study, axis) else lbl
                           for axis, lbl in labels.items())
        base = next((ov["base"] for _, (_, ov) in zip(study.axes, combo) if "base" in ov), None)
        runs.append(RunSpec(run_id=run_id, labels=labels, overrides=[o for o in overrides if not o.startswith("base=")],
                            base=_find(base, study.path) if base else study.base))
    return runs


def _is_value_axis(study: Study, axis: str) -> bool:
    """A list axis (values of one key) rather than named variants."""
    variants = dict(study.axes)[axis]
    return all(list(ov) == [axis] for _, ov in variants)


def _yaml_value(v: Any) -> str:
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if v is None:
        return "null"
    return str(v).lower() if isinstance(v, bool) else str(v)


# ------------------------------------------------------------------------------------ one run
def regime_of(cfg) -> str:
    """A short description of how a run trains: core, supervision and depth schedule."""
    m, t = cfg.model, cfg.train
    core = m.core or ("stack" if m.name.startswith("vit") else "softmor" if m.name.startswith("srvit") else "recurrent")
    parts = [core]
    if core == "ode":
        parts.append(f"{m.method or 'euler'}/{m.field or 'state_subtracted'}")
    if t.supervision.stages > 1:
        parts.append(f"ds{t.supervision.stages}-{t.supervision.weights}")
    if t.depth.schedule != "fixed":
        parts.append(f"depth-{t.depth.schedule}")
    return " ".join(parts)


def run_one(base: str, overrides: List[str], out: str, max_steps_factor: int, labels: Dict[str, str],
            threads: Optional[int] = None) -> Dict[str, Any]:
    """Train (or resume) one grid point, sweep its horizon, account for it; writes result.json."""
    import torch

    from ..config import load_config
    from ..train.checkpoint import load_model_and_config
    from ..train.loop import build_loaders, pick_device, train
    from .accounting import account
    from .horizon import horizon_sweep, summarize

    if threads:
        torch.set_num_threads(threads)
    out_p = Path(out)
    resume = (out_p / "last.pt").is_file()
    cfg = load_config(out_p / "config.yaml" if resume else base, [] if resume else overrides)
    cfg.train.progress = False
    t0 = time.perf_counter()
    metrics = train(cfg, out_p, resume=resume, log=lambda *a, **k: None)
    model, cfg = load_model_and_config(out_p / "last.pt")
    device = pick_device(cfg.train.device)
    model.to(device)
    T = model.nominal_steps
    K = max_steps_factor * T
    if model.core.max_steps is not None:
        K = min(K, model.core.max_steps)
    _, test_loader, _ = build_loaders(cfg)
    sweep = horizon_sweep(model, test_loader, device, K)
    acct = account(model.cpu(), memory=False)
    res = {
        "run_id": out_p.name, "model": cfg.model.name, "core": model.cfg.core, "regime": regime_of(cfg), **labels,
        "embed_dim": model.cfg.embed_dim, "depth": model.cfg.depth, "steps": T, "seed": cfg.train.seed,
        "params": acct["params"], "params_stored": acct["params_stored"], "flops_forward": acct["flops_forward"],
        "nfe": acct["nfe"], **{k: v for k, v in summarize(sweep, T).items() if k.startswith("acc_")},
        "test_acc_final": metrics.get("test_acc"), "train_seconds": metrics.get("train_seconds"),
        "wall_seconds": time.perf_counter() - t0, "horizon_accuracy": sweep["accuracy"],
    }
    tmp = out_p / "result.json.tmp"
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, out_p / "result.json")
    return res


def _run_one_safe(kw) -> Dict[str, Any]:
    """run_one, but a run that fails (diverged, bad option) is reported, not fatal to the study."""
    try:
        return run_one(**kw)
    except UserError as e:
        (Path(kw["out"]) / "error.txt").write_text(str(e) + "\n") if Path(kw["out"]).is_dir() else None
        return {"run_id": Path(kw["out"]).name, **kw["labels"], "error": str(e)}


# ------------------------------------------------------------------------------------ the study
def run_study(study: Study, out: Path, workers: int = 1, progress: bool = True, log=print) -> List[Dict[str, Any]]:
    from tqdm.auto import tqdm

    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "study.yaml").write_text(study.path.read_text() if study.path else "")
    todo, done = [], []
    for spec in study.runs:
        rd = out / "runs" / spec.run_id
        if (rd / "result.json").is_file():
            done.append(json.loads((rd / "result.json").read_text()))
        else:
            todo.append(dict(base=str(spec.base), overrides=spec.overrides, out=str(rd),
                             max_steps_factor=study.max_steps_factor, labels=spec.labels))
    log(f"study {study.name}: {len(study.runs)} runs, {len(done)} already finished, {len(todo)} to run "
        f"({workers} worker{'s' if workers > 1 else ''}) in {out}")
    bar = tqdm(total=len(study.runs), initial=len(done), desc=study.name, disable=not progress, dynamic_ncols=True)
    if workers <= 1:
        for kw in todo:
            bar.set_postfix_str(Path(kw["out"]).name)
            done.append(_run_one_safe(kw))
            bar.update()
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        threads = max(1, (os.cpu_count() or 1) // workers)
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            futs = [ex.submit(_run_one_safe, {**kw, "threads": threads}) for kw in todo]
            for f in as_completed(futs):
                done.append(f.result())
                bar.update()
    bar.close()
    for r in done:
        if "error" in r:
            log(f"run {r['run_id']} failed: {r['error']}")
    order = {s.run_id: i for i, s in enumerate(study.runs)}
    return sorted(done, key=lambda r: order.get(r["run_id"], 1 << 30))


def collect(out: Path, study: Study) -> List[Dict[str, Any]]:
    rows = []
    for spec in study.runs:
        f = out / "runs" / spec.run_id / "result.json"
        if f.is_file():
            rows.append(json.loads(f.read_text()))
    return rows


# ------------------------------------------------------------------------------------ reporting
CSV_KEYS = ["model", "core", "regime", "embed_dim", "depth", "steps", "seed", "params", "params_stored",
            "flops_forward", "nfe", "acc_T", "acc_2T", "acc_4T", "acc_mean_T_4T", "train_seconds"]


def write_results_csv(rows: List[Dict[str, Any]], study: Study, path: Path) -> None:
    axes = [a for a, _ in study.axes]
    keys = ["run_id"] + axes + [k for k in CSV_KEYS if k not in axes]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt_csv(r.get(k)) for k in keys})


def _fmt_csv(v):
    return f"{v:.6g}" if isinstance(v, float) else v


def _mean_std(vals: List[float]) -> Tuple[float, float]:
    vals = [v for v in vals if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not vals:
        return float("nan"), float("nan")
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def cells(rows: List[Dict[str, Any]], study: Study) -> List[Dict[str, Any]]:
    """Rows grouped over every grid axis except the seed: mean and std of each figure."""
    axes = [a for a, _ in study.axes if a != SEED_KEY]
    groups: Dict[Tuple, List[Dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(a) for a in axes), []).append(r)
    out = []
    for key, rs in groups.items():
        c = dict(zip(axes, key))
        c.update({k: rs[0][k] for k in ("model", "core", "regime", "embed_dim", "depth", "steps", "params_stored",
                                         "flops_forward", "nfe")})
        c["n"] = len(rs)
        for k in ("acc_T", "acc_2T", "acc_4T", "acc_mean_T_4T", "train_seconds"):
            c[k] = _mean_std([r.get(k) for r in rs])
        K = min(len(r["horizon_accuracy"]) for r in rs)
        c["horizon"] = [statistics.fmean(r["horizon_accuracy"][i] for r in rs) for i in range(K)]
        out.append(c)
    return out


def _pm(ms: Tuple[float, float], scale: float = 100.0, digits: int = 1) -> str:
    m, s = ms
    if math.isnan(m):
        return "-"
    return f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}"


def write_report(rows: List[Dict[str, Any]], study: Study, out_dir: Path, command: str = "") -> Path:
    """results.csv, report.md and the plots into ``out_dir``; returns the report path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = [r for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    write_results_csv(rows, study, out_dir / "results.csv")
    cs = cells(rows, study)
    axes = [a for a, _ in study.axes if a != SEED_KEY]
    seeds = sorted({r.get("seed") for r in rows})
    lines = [f"# Study `{study.name}`", "",
             "Generated by `recurvit study` from `results.csv`; do not edit by hand.", ""]
    if command:
        lines += ["Command:", "", "```", command, "```", ""]
    lines += [f"{len(rows)} runs; seeds {seeds}; accuracy in % as mean ± std over seeds; T = trained steps; "
              f"acc@kT = test accuracy when run for k x T steps (ODE: k x the trained time span); "
              "mean T..4T = mean accuracy over every step from T to 4T.", ""]
    head = axes + ["model", "params (stored)", "MFLOPs/img", "NFE", "T", "acc@T", "acc@2T", "acc@4T",
                   "mean T..4T", "train s"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for c in cs:
        lines.append("| " + " | ".join([str(c[a]) for a in axes] + [
            c["model"], f"{c['params_stored']:,}", f"{c['flops_forward'] / 1e6:.2f}", str(c["nfe"]), str(c["steps"]),
            _pm(c["acc_T"]), _pm(c["acc_2T"]), _pm(c["acc_4T"]), _pm(c["acc_mean_T_4T"]),
            f"{c['train_seconds'][0]:.0f}"]) + " |")
    lines.append("")
    if failed:
        lines += ["Failed runs (not in the table):", ""] + [f"- `{r['run_id']}`: {r['error']}" for r in failed] + [""]
    plots = write_plots(rows, cs, study, out_dir)
    for title, name in plots:
        lines += [f"![{title}]({name})", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return out_dir / "report.md"


def _is_recurrent(core: str) -> bool:
    return core != "stack"


def _pareto(points: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """Upper-left front: the best accuracy reached at or below each cost."""
    front, best = [], -1.0
    for x, y in sorted(points):
        if y > best:
            front.append((x, y))
            best = y
    return front


def write_plots(rows, cs, study: Study, out_dir: Path) -> List[Tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for cost, fname, xlabel in (("params_stored", "acc_vs_params.png", "stored parameters"),
                                ("flops_forward", "acc_vs_flops.png", "forward FLOPs per image")):
        fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
        for recurrent, color, label in ((True, "tab:blue", "recurrent (one shared block)"),
                                        (False, "tab:orange", "standard (independent blocks)")):
            pts = [(c[cost], c["acc_T"][0]) for c in cs if _is_recurrent(c["core"]) == recurrent
                   and not math.isnan(c["acc_T"][0])]
            if not pts:
                continue
            ax.scatter(*zip(*pts), color=color, s=18, alpha=0.7, label=label)
            fr = _pareto(pts)
            ax.step(*zip(*fr), where="post", color=color, lw=1.2)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy at T")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"{study.name}: accuracy vs {xlabel}", fontsize=9)
        fig.tight_layout()
        fig.savefig(out_dir / fname)
        plt.close(fig)
        made.append((f"accuracy vs {xlabel}", fname))
    fig, ax = plt.subplots(figsize=(6.5, 4), dpi=120)
    axes = [a for a, _ in study.axes if a != SEED_KEY]
    Ts = set()
    for c in cs:
        if len(c["horizon"]) <= 1:
            continue
        label = " / ".join(str(c[a]) for a in axes) or c["model"]
        ax.plot(range(1, len(c["horizon"]) + 1), c["horizon"], marker=".", ms=3, lw=1, label=label)
        Ts.add(c["steps"])
    for T in sorted(Ts):
        ax.axvline(T, color="k", ls="--", lw=0.8)
    ax.set_xlabel("test-time steps (dashed: training horizon T)")
    ax.set_ylabel("test accuracy (mean over seeds)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    ax.set_title(f"{study.name}: accuracy against test-time steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "acc_vs_steps.png")
    plt.close(fig)
    made.append(("accuracy against test-time steps", "acc_vs_steps.png"))
    return made
