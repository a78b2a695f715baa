"""Exit analysis: calibrate an anytime-exit threshold on held-out TRAINING images, then measure it
on the test split (accuracy, steps per image, real images/s against fixed depth T).

- :func:`trajectories` runs each image through every step once and keeps its prediction and every
  criterion's signal after each step, so any threshold's exits, accuracy and steps follow without
  another forward (:func:`point`, with the exit rule of ``forward_adaptive``).
- :func:`calibrate` picks the threshold on the loader it is given (the calibration split of
  data/calibration.py): the fewest mean steps whose accuracy is within ``target_drop`` points of
  fixed depth T there, or (``step_budget``) the best accuracy at no more than that fraction of T's
  steps. It reads no other data.
- :func:`measure` evaluates a threshold with ``forward_adaptive`` (compaction on) over a loader,
  alternating adaptive and fixed-T batches in the same process; images/s are from the medians of
  the per-batch times, so the speedup is a ratio of peers measured under the same load.
"""
from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn as nn

from ..models.adaptive import CRITERIA, exit_steps, forward_adaptive, plan_steps, step_signals
from ..plot_style import percent
from ..run.device import autocast
from ..run.outputs import save_figure
from ..tables import write_csv as write_table
from .timing import LoadWatch, geometric_ratio, sync

SWEEP_LEVELS = 12  # thresholds in a sweep: quantiles of the calibration signals
CANDIDATES = 256  # thresholds calibration chooses among


@torch.no_grad()
def trajectories(model: nn.Module, loader: Iterable, device: torch.device, steps: int, amp: str = "off") -> dict:
    """Predictions (K, N), labels (N,) and every criterion's signal (K, N) after steps 1..K."""
    model.eval()
    preds, labels, sigs = [], [], {c: [] for c in CRITERIA}
    for x, y in loader:
        with autocast(device, amp):
            p, s = step_signals(model, x.to(device), steps)
        preds.append(p.cpu())
        labels.append(torch.as_tensor(y))
        for c in CRITERIA:
            sigs[c].append(s[c].cpu())
    return {"preds": torch.cat(preds, 1), "labels": torch.cat(labels),
            "signals": {c: torch.cat(v, 1) for c, v in sigs.items()}}


def fixed_accuracy(traj: dict) -> List[float]:
    """Accuracy at fixed depth k = 1..K (``model(x, steps=k)``)."""
    return (traj["preds"] == traj["labels"]).double().mean(dim=1).tolist()


def _stats(steps: torch.Tensor) -> Dict[str, float]:
    s = steps.double()
    return {"mean_steps": s.mean().item(), "median_steps": s.median().item(),
            "p90_steps": torch.quantile(s, 0.9).item()}


def point(traj: dict, criterion: str, threshold: Optional[float], max_steps: int, min_steps: int = 1) -> dict:
    """Accuracy and steps per image at one threshold (exits after steps 1..max_steps)."""
    steps = exit_steps(traj["signals"][criterion][:max_steps].clone(), criterion, threshold, min_steps)
    pred = traj["preds"][steps - 1, torch.arange(len(steps))]
    acc = (pred == traj["labels"]).double().mean().item()
    return {"threshold": threshold, "accuracy": acc, **_stats(steps)}


def thresholds(traj: dict, criterion: str, max_steps: int, min_steps: int = 1, n: int = SWEEP_LEVELS) -> List[float]:
    """Thresholds from the signals of ``traj`` at the steps where an exit can happen, sorted: all
    their distinct values when there are at most ``n`` (every distinct exit pattern), else ``n``
    quantiles. Signals are float32, so float32 thresholds reproduce each exit pattern exactly."""
    first = max(min_steps, 2 if criterion == "kl" else 1)
    sig = traj["signals"][criterion][first - 1:max_steps].flatten()
    sig = sig[torch.isfinite(sig)]
    if sig.unique().numel() > n:  # quantiles of all values: spread by where the exits are
        sig = torch.quantile(sig.double(), torch.linspace(0, 1, n, dtype=torch.float64)).float()
    return sorted(set(sig.tolist()))


def choose(traj: dict, criterion: str, T: int, max_steps: int, min_steps: int = 1,
           target_drop: Optional[float] = 0.5, step_budget: Optional[float] = None) -> dict:
    """The threshold meeting the target on ``traj`` (see the module docstring); ``met`` says
    whether one does (if not: accuracy target -> never exit early; step budget -> fewest steps)."""
    acc_T = fixed_accuracy(traj)[T - 1]
    pts = [point(traj, criterion, t, max_steps, min_steps) for t in thresholds(traj, criterion, max_steps, min_steps,
                                                                               CANDIDATES)]
    pts.append(point(traj, criterion, None, max_steps, min_steps))
    if step_budget is not None:
        ok = [p for p in pts if p["mean_steps"] <= step_budget * T + 1e-9]
        fewest = min(pts, key=lambda p: p["mean_steps"])
        best = max(ok, key=lambda p: (p["accuracy"], -p["mean_steps"])) if ok else fewest
    else:
        ok = [p for p in pts if p["accuracy"] >= acc_T - target_drop / 100 - 1e-12]
        best = min(ok, key=lambda p: (p["mean_steps"], -p["accuracy"])) if ok else pts[-1]
    target = {"step_budget": step_budget} if step_budget is not None else {"target_drop": target_drop}
    return {"criterion": criterion, "threshold": best["threshold"], "met": bool(ok), **target,
            "calibration": {"n": len(traj["labels"]), "acc_T": acc_T, **best}}


def calibrate(model: nn.Module, loader: Iterable, device: torch.device, criterion: str = "kl",
              max_steps: Optional[int] = None, min_steps: int = 1, target_drop: Optional[float] = 0.5,
              step_budget: Optional[float] = None, amp: str = "off",
              per_step_readouts: Optional[bool] = None, trajectory: Optional[dict] = None) -> dict:
    """Choose the threshold on ``loader`` (held-out training images) only. Returns the choice and,
    under ``"trajectory"``, what was collected (for sweeps); ``trajectory``: that collection made
    already (for another criterion: it holds every criterion's signals), so ``loader`` is not read."""
    K, m = plan_steps(model, max_steps, min_steps, per_step_readouts)
    T = model.nominal_steps
    if target_drop is None and step_budget is None:
        target_drop = 0.5
    traj = trajectory if trajectory is not None else trajectories(model, loader, device, max(K, T), amp)
    return {**choose(traj, criterion, T, K, m, target_drop, step_budget), "trajectory": traj}


def runners(model: nn.Module, criterion: str, threshold: Optional[float], max_steps: int, min_steps: int,
            device: torch.device, amp: str, per_step_readouts: Optional[bool] = None) -> Dict[str, Callable]:
    """The adaptive forward and the fixed-T forward as timed callables (no grad, same autocast)."""
    def adaptive(x):
        with torch.no_grad(), autocast(device, amp):
            return forward_adaptive(model, x, criterion, threshold, max_steps, min_steps,
                                    per_step_readouts=per_step_readouts)

    def fixed(x):
        with torch.no_grad(), autocast(device, amp):
            return model(x, steps=model.nominal_steps)

    return {"adaptive": adaptive, "fixed": fixed}


@torch.no_grad()
def measure(model: nn.Module, loader: Iterable, device: torch.device, criterion: str, threshold: Optional[float],
            max_steps: int, min_steps: int = 1, amp: str = "off", per_step_readouts: Optional[bool] = None) -> dict:
    """One pass over ``loader`` alternating adaptive and fixed-T batches (the order flips every
    batch): accuracy of both, steps per image, images/s of both (median per-image time), the speedup (the
    geometric mean of the per-batch time ratios, fixed T over the exit) with its 95% interval (``speedup_lo``,
    ``speedup_hi``),
    with the machine's load before and during the timing, its cores and the threads timed (:class:`LoadWatch`;
    :mod:`recurvit.study.speed` decides nothing from a loaded machine)."""
    model.eval()
    fns = runners(model, criterion, threshold, max_steps, min_steps, device, amp, per_step_readouts)
    times: Dict[str, List[float]] = {"adaptive": [], "fixed": []}
    correct = {"adaptive": 0, "fixed": 0}
    steps, n = [], 0
    batches = iter(loader)
    first = next(batches, None)
    if first is None:
        raise ValueError("measure: the loader holds no batch")
    for f in fns.values():  # warm-up, untimed: the load reading comes after it, as the deploy evaluator's
        f(first[0].to(device))
    with LoadWatch() as load:
        for i, (x, y) in enumerate(itertools.chain([first], batches)):
            x, y = x.to(device), torch.as_tensor(y).to(device)
            for name in (("adaptive", "fixed") if i % 2 == 0 else ("fixed", "adaptive")):
                sync(device)
                t0 = time.perf_counter()
                out = fns[name](x)
                sync(device)
                times[name].append((time.perf_counter() - t0) / len(x))
                logits = out[0] if name == "adaptive" else out
                correct[name] += (logits.argmax(-1) == y).sum().item()
                if name == "adaptive":
                    steps.append(out[1].cpu())
            n += len(y)
            load.sample()
    ips = {k: 1.0 / statistics.median(v) for k, v in times.items()}
    paired = geometric_ratio(times["fixed"], times["adaptive"])  # per batch: fixed-T time over the exit's
    return {"threshold": threshold, "accuracy": correct["adaptive"] / n, "acc_T": correct["fixed"] / n,
            "drop_points": 100 * (correct["fixed"] - correct["adaptive"]) / n, **_stats(torch.cat(steps)),
            "images_per_s": ips["adaptive"], "fixed_images_per_s": ips["fixed"],
            "speedup": paired["mean"], "speedup_lo": paired["lo"], "speedup_hi": paired["hi"],
            "load_before": load.before, "load_during": load.during, "cores": load.cores,
            "threads": torch.get_num_threads() if device.type == "cpu" else None,
            "n": n, "batches": len(times["fixed"])}


CSV_KEYS = ["threshold", "accuracy", "mean_steps", "median_steps", "p90_steps", "images_per_s",
            "fixed_images_per_s", "speedup"]


def write_csv(rows: List[dict], path: Path) -> None:
    write_table([{k: None if r.get(k) is None else float(r[k]) for k in CSV_KEYS} for r in rows], path, CSV_KEYS)


def draw(ax, fixed: Sequence[float], curves: Dict[str, dict], T: int, title: str = "") -> None:
    """Accuracy against mean steps per image: the fixed-depth curve (steps 1..K), one adaptive
    sweep per entry of ``curves`` ({label: {"rows": sweep rows, "point": calibrated row}})."""
    ax.plot(range(1, len(fixed) + 1), fixed, color="k", marker="o", ms=3, lw=1, label="fixed depth k")
    for i, (label, c) in enumerate(curves.items()):
        color = f"C{i}"
        rows = sorted(c["rows"], key=lambda r: r["mean_steps"])
        ax.plot([r["mean_steps"] for r in rows], [r["accuracy"] for r in rows], color=color, marker=".", lw=1,
                label=label)
        p = c.get("point")
        if p is not None:
            ax.plot([p["mean_steps"]], [p["accuracy"]], color=color, marker="*", ms=12, mec="k", mew=0.6, ls="")
    if any(c.get("point") is not None for c in curves.values()):  # the stars, explained once in the legend
        ax.plot([], [], color="w", marker="*", ms=12, mec="k", mew=0.6, ls="",
                label="threshold chosen on the calibration split")
    ax.axvline(T, color="grey", ls="--", lw=0.8, label=f"trained steps T = {T}")
    ax.set_xlabel("mean steps per image")
    ax.set_ylabel("test accuracy (%)")

    percent(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)


def plot(panels: List[dict], path: Path) -> None:
    """One axis per panel ({"title", "T", "fixed", "curves"}, see :func:`draw`); stars: calibrated."""
    from matplotlib.figure import Figure

    cols = min(len(panels), 2)
    rows = (len(panels) + cols - 1) // cols
    fig = Figure(figsize=(5.5 * cols, 3.8 * rows), dpi=120)
    for i, p in enumerate(panels):
        draw(fig.add_subplot(rows, cols, i + 1), p["fixed"], p["curves"], p["T"], p.get("title", ""))
    fig.tight_layout()

    save_figure(fig, path)


__all__ = ["trajectories", "fixed_accuracy", "point", "thresholds", "choose", "calibrate", "runners",
           "measure", "write_csv", "draw", "plot"]
