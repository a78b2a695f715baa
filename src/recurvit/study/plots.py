"""Study plots, drawn with matplotlib's object API (``Figure``): the caller's backend is untouched.

- ``acc_vs_params.png`` / ``acc_vs_flops.png``: accuracy at T against stored parameters / forward
  FLOPs, recurrent and standard models as two Pareto fronts.
- ``acc_vs_steps.png``: accuracy against test-time steps (training horizon and chance marked).
- ``acc_vs_epoch.png``: test accuracy against epoch for the first seed of every cell.
- ``frontier.png``: the accuracy-robustness frontier: nominal accuracy (at T) against accuracy
  beyond the horizon (mean over T..4T, and at 16T), one point per cell with its 95% intervals.
- ``psnr_vs_params.png`` (LoopVAE studies): PSNR against stored parameters.
- ``series``: means with their 95% intervals against a numeric x, one line per label (the README's
  SoftMoR figure: accuracy against the recursion depth r for each mixture, from ``scripts/findings.py``).
- ``<a>_minus_<b>.png``: a comparison ``[a, b]`` made at every label of another axis (the gap ViT - bViT
  at each width): the difference with its 95% Welch interval against that axis.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from matplotlib.figure import Figure

from ..plot_style import percent, wrap
from ..run.outputs import save_figure

# (caption, file) of horizon() and of epochs() at its default label: a report rebuilt without the run
# directories keeps these plots, drawn earlier, under the same names
HORIZON = ("accuracy against test-time steps", "acc_vs_steps.png")
EPOCHS = ("test accuracy against epoch", "acc_vs_epoch.png")


def _percent(ax, *which: str) -> None:
    """Accuracies are stored as fractions, shown in % as the tables (decimals as the ticks need)."""
    percent(ax, *which)


def pareto(points: Sequence[Tuple[float, float]], lower_x: bool = True) -> List[Tuple[float, float]]:
    """The upper-left front: points not beaten in y by a point of smaller (or equal) x."""
    front, best = [], -math.inf
    for x, y in sorted(points, key=lambda p: (p[0] if lower_x else -p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return front


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:  # nothing labelled (no cell with the figure): no empty legend
        ax.legend(**kw)


def _save(fig: Figure, path: Path) -> str:
    fig.tight_layout()

    save_figure(fig, path)
    return path.name


def cost_fronts(cells: List[Dict[str, Any]], out: Path, name: str) -> List[Tuple[str, str]]:
    """Accuracy at T against a cost, one labelled point per cell (with its 95% interval over seeds), recurrent
    and standard models as two Pareto fronts. Cells at the same cost (one recurrent block run for any number
    of steps stores the same parameters) get their labels stacked, so that each point stays named."""
    made = []
    for cost, fname, xlabel in (("params_stored", "acc_vs_params.png", "stored parameters"),
                                ("flops_forward", "acc_vs_flops.png", "forward FLOPs per image")):
        fig = Figure(figsize=(6.5, 4.2), dpi=120)
        ax = fig.add_subplot()
        stacked: Dict[float, int] = {}
        for shared, color, label in ((True, "tab:blue", "recurrent (shared blocks)"),
                                     (False, "tab:orange", "standard (independent blocks)")):
            own = [c for c in cells if c["shares_blocks"] == shared and not math.isnan(c["acc_T"]["mean"])]
            if not own:
                continue
            pts = [(c[cost], c["acc_T"]["mean"]) for c in own]
            ax.errorbar([x for x, _ in pts], [y for _, y in pts], yerr=[_err(c["acc_T"]) for c in own], fmt="o",
                        color=color, ms=4, capsize=2, lw=0.8, alpha=0.8, label=label)
            ax.step(*zip(*pareto(pts)), where="post", color=color, lw=1.2)
            for c, (x, y) in sorted(zip(own, pts), key=lambda cp: -cp[1][1]):
                k = stacked[x] = stacked.get(x, -1) + 1
                ax.annotate(c["cell"], (x, y), fontsize=6, xytext=(4, 3 - 8 * k), textcoords="offset points",
                            color=color)
        ax.set_xscale("log")
        ax.set_xlabel(f"{xlabel} (log scale)")
        ax.set_ylabel("test accuracy at T (%)")
        _percent(ax)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7)
        ax.set_title(wrap(f"{name}: accuracy vs {xlabel} (95% intervals over seeds; line: Pareto front)", 6.0, 9),
                     fontsize=9)
        made.append((f"accuracy vs {xlabel}", _save(fig, out / fname)))
    return made


def horizon(cells: List[Dict[str, Any]], out: Path, name: str, chance: float) -> Tuple[str, str]:
    fig = Figure(figsize=(6.5, 4), dpi=120)
    ax = fig.add_subplot()
    for T in sorted({c["steps"] for c in cells if len(c["horizon"]) > 1}):
        ax.axvline(T, color="k", ls="--", lw=0.8)
    for c in cells:
        if len(c["horizon"]) > 1:
            ax.plot(range(1, len(c["horizon"]) + 1), c["horizon"], marker=".", ms=2, lw=1, label=c["cell"])
    if not math.isnan(chance):
        ax.axhline(chance, color="grey", ls=":", lw=1, label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("test-time steps (log scale; dashed: training horizon T)")
    ax.set_ylabel("test accuracy, mean over seeds (%)")
    ax.set_ylim(0, 1)
    _percent(ax)
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=6, ncol=2)
    ax.set_title(wrap(f"{name}: {HORIZON[0]}", fig.get_figwidth() - 0.8, 9), fontsize=9)
    return HORIZON[0], _save(fig, out / HORIZON[1])


def epochs(cells: List[Dict[str, Any]], out: Path, name: str, key: str = "curve",
           ylabel: str = "test accuracy", percent: bool = True) -> Tuple[str, str]:
    fig = Figure(figsize=(6, 3.6), dpi=120)
    ax = fig.add_subplot()
    for c in cells:
        ys = [y for y in c.get(key) or [] if y is not None]
        if ys:
            ax.plot(range(1, len(ys) + 1), ys, marker=".", ms=3, lw=1, label=c["cell"])
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"{ylabel}, first seed" + (" (%)" if percent else ""))
    if percent:
        _percent(ax)
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=6, ncol=2)
    ax.set_title(wrap(f"{name}: {ylabel} against epoch", fig.get_figwidth() - 0.8, 9), fontsize=9)
    return f"{ylabel} against epoch", _save(fig, out / EPOCHS[1])


def every_run(rows: List[Dict[str, Any]], cell_of, out: Path, name: str, word: str = "accuracy") -> Tuple[str, str]:
    """Every run's validation accuracy (test where the runs hold no split out) against epoch, one colour a
    cell, the last 20% of the epochs shaded: whether a budget was enough, read off every run."""
    fig = Figure(figsize=(6.4, 3.8), dpi=120)
    ax = fig.add_subplot()
    key = "val_acc_curve" if any(r.get("val_acc_curve") for r in rows) else "test_acc_curve"
    colours, longest = {}, 0
    for r in sorted(rows, key=lambda r: (cell_of(r), str(r.get("seed")))):
        ys = [y for y in r.get(key) or [] if y is not None]
        if not ys:
            continue
        cell = cell_of(r)
        first = cell not in colours
        colours.setdefault(cell, f"C{len(colours) % 10}")
        ax.plot(range(1, len(ys) + 1), ys, lw=0.8, color=colours[cell], label=cell if first else None)
        longest = max(longest, len(ys))
    if longest:
        ax.axvspan(longest - round(0.2 * longest), longest, color="grey", alpha=0.15, lw=0, label="last 20% of epochs")
    ax.set_xlabel("epoch")
    split = "validation" if key == "val_acc_curve" else "test"
    ax.set_ylabel(f"{split} {word}, every run (%)")
    _percent(ax)
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=6)
    ax.set_title(wrap(f"{name}: {split} {word} of every run against epoch", fig.get_figwidth() - 0.8, 9), fontsize=9)
    return f"{split} {word} of every run against epoch", _save(fig, out / "every_run.png")


def frontier(cells: List[Dict[str, Any]], out: Path, name: str, chance: float) -> Tuple[str, str]:
    """Nominal accuracy against beyond-horizon accuracy, two panels (mean T..4T, at 16T)."""
    fig = Figure(figsize=(10, 4.2), dpi=120)
    for i, (key, ylabel) in enumerate((("acc_mean_T_4T", "mean accuracy over T..4T"),
                                       ("acc_16T", "accuracy at 16T"))):
        ax = fig.add_subplot(1, 2, i + 1)
        pts = []
        for c in cells:
            x, y = c["acc_T"], c[key]
            if math.isnan(x["mean"]) or math.isnan(y["mean"]):
                continue
            ax.errorbar(x["mean"], y["mean"], xerr=_err(x), yerr=_err(y), fmt="o", ms=4, capsize=2, lw=0.8)
            ax.annotate(c["cell"], (x["mean"], y["mean"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
            pts.append((x["mean"], y["mean"]))
        front = pareto([(-x, y) for x, y in pts])  # maximise both: higher x is "cheaper" here
        if front:
            xs, ys = zip(*sorted((-x, y) for x, y in front))
            ax.plot(xs, ys, color="tab:red", lw=1, ls="--", label="Pareto front")
        if key == "acc_16T" and not math.isnan(chance):
            ax.axhline(chance, color="grey", ls=":", lw=1, label="chance")
        ax.set_xlabel("nominal accuracy, at T (%)")
        ax.set_ylabel(f"{ylabel} (%)")
        _percent(ax, "x", "y")
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7)
    fig.suptitle(wrap(f"{name}: accuracy-robustness frontier (95% intervals over seeds)", fig.get_figwidth() - 0.5, 9),
                 fontsize=9)
    return "accuracy-robustness frontier", _save(fig, out / "frontier.png")


def _err(ms: Dict[str, float]) -> float:
    return 0.0 if math.isnan(ms["ci"]) else ms["ci"]


def psnr_vs_params(cells: List[Dict[str, Any]], out: Path, name: str) -> Tuple[str, str]:
    fig = Figure(figsize=(5.5, 3.6), dpi=120)
    ax = fig.add_subplot()
    for c in cells:
        ax.errorbar(c["params_stored"], c["psnr"]["mean"], yerr=_err(c["psnr"]), fmt="o", ms=4, capsize=2)
        ax.annotate(c["cell"], (c["params_stored"], c["psnr"]["mean"]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("stored parameters")
    ax.set_ylabel("test PSNR (dB)")
    ax.grid(alpha=0.3)
    ax.set_title(wrap(f"{name}: PSNR against stored parameters", fig.get_figwidth() - 0.8, 9), fontsize=9)
    return "PSNR against stored parameters", _save(fig, out / "psnr_vs_params.png")


def difference_across(points: Sequence[Tuple[str, Dict[str, float]]], out: Path, name: str, what: str,
                      axis: str, ylabel: str, scale: float = 100.0) -> Tuple[str, str]:
    """Differences ``(label, welch result)`` in the grid's order, with their 95% intervals and 0 marked."""
    fig = Figure(figsize=(5.0, 3.4), dpi=120)
    ax = fig.add_subplot()
    xs = list(range(len(points)))
    means = [w["diff"] * scale for _, w in points]
    lo = [(w["diff"] - w["lo"]) * scale if not math.isnan(w["lo"]) else 0.0 for _, w in points]
    hi = [(w["hi"] - w["diff"]) * scale if not math.isnan(w["hi"]) else 0.0 for _, w in points]
    ax.errorbar(xs, means, yerr=[lo, hi], fmt="o-", ms=4, capsize=3, lw=1.2)
    ax.axhline(0.0, color="grey", ls=":", lw=1)
    ax.set_xticks(xs, [label for label, _ in points])
    ax.set_xlabel(axis)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.set_title(wrap(f"{name}: {what} against {axis} (95% Welch intervals)", fig.get_figwidth() - 0.8, 9), fontsize=9)
    slug = "".join(ch if ch.isalnum() else "_" for ch in what.replace(" − ", "_minus_"))
    return f"{what} against {axis}", _save(fig, out / f"{slug}.png")


def series(lines: Dict[str, Sequence[Tuple[float, Dict[str, float]]]], path: Path, title: str, xlabel: str,
           ylabel: str, scale: float = 100.0) -> str:
    """One line per label through ``(x, mean_ci result)`` points, each with its 95% interval; lines
    sharing an x are offset a little so that their intervals stay readable."""
    fig = Figure(figsize=(5.0, 3.4), dpi=120)
    ax = fig.add_subplot()
    xs_all = sorted({x for pts in lines.values() for x, _ in pts})
    step = min((b - a for a, b in zip(xs_all, xs_all[1:])), default=1.0)
    for i, (label, pts) in enumerate(lines.items()):
        shift = (i - (len(lines) - 1) / 2) * 0.06 * step
        xs = [x + shift for x, _ in pts]
        ax.errorbar(xs, [m["mean"] * scale for _, m in pts], yerr=[_err(m) * scale for _, m in pts], fmt="o-",
                    ms=4, capsize=3, lw=1.2, label=label)
    ax.set_xticks(xs_all)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=7)
    ax.set_title(wrap(title, fig.get_figwidth() - 0.8, 9), fontsize=9)
    return _save(fig, path)
