"""Anytime exit of a trained run, the whole procedure (``recurvit exit`` and study evaluators call it):
calibrate a threshold on images the run never trained on when it has them (its ``data.holdout``
split), else on the seeded calibration split of the training set; then read the test split once,
for a threshold sweep, the calibrated point and its measured speed against fixed depth T.

    from recurvit.analysis.exit import calibrated_exit
    res = calibrated_exit(model, cfg, device, criterion="kl", target_drop=0.5)
    res["test"]["accuracy"], res["test"]["mean_steps"], res["threshold"]

With ``certify=(epsilon, delta)`` the threshold is instead the most aggressive one whose disagreement
with the full-depth answer is certified at ``epsilon`` (a fraction) with confidence ``1 - delta``
(Learn-then-Test, :mod:`recurvit.analysis.certify`); the calibration split alone certifies it.

The test split is read only after the threshold is chosen.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..data.calibration import CALIBRATION_FRACTION
from ..models.adaptive import has_step_readouts, plan_steps
from ..run.loaders import held_out_sets
from . import anytime as A
from .budget import check_eval_cost
from .certify import certify as certify_exit
from .timing import interleaved_batches


def calibrated_exit(model: nn.Module, cfg, device: torch.device, criterion: str = "kl",
                    max_steps: Optional[int] = None, min_steps: int = 1, target_drop: Optional[float] = None,
                    step_budget: Optional[float] = None, batch_size: int = 256, time_batches: int = 4,
                    force: bool = False, certify: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    """Calibrate, sweep and measure one criterion (see the module docstring). Returns the calibration
    figures, the ``threshold``, ``test`` (the calibrated point on the test split, timed), ``sweep``
    (test rows of the threshold sweep, each timed on ``time_batches`` batches), ``fixed_accuracy``
    (steps 1..K) and the plan (``max_steps``, ``min_steps``, ``calibration_fraction``,
    ``calibration_images``, ``note``). ValueError for a plan the model cannot run (a stack without
    per-block readouts)."""
    return calibrated_exits(model, cfg, device, [criterion], max_steps, min_steps, target_drop, step_budget,
                            batch_size, time_batches, force, certify)[criterion]


def calibrated_exits(model: nn.Module, cfg, device: torch.device, criteria: Sequence[str],
                     max_steps: Optional[int] = None, min_steps: int = 1, target_drop: Optional[float] = None,
                     step_budget: Optional[float] = None, batch_size: int = 256, time_batches: int = 4,
                     force: bool = False, certify: Optional[Tuple[float, float]] = None) -> Dict[str, Dict[str, Any]]:
    """:func:`calibrated_exit` for each of ``criteria`` ({criterion: its result}): the calibration and
    test splits are each run through every step once, for all of them (a trajectory holds every
    criterion's signals); each criterion then chooses, sweeps and is timed on its own."""
    from torch.utils.data import DataLoader

    T = model.nominal_steps
    # a stack's readouts after every block are trained by per-block heads or by deep supervision at every block
    readouts = has_step_readouts(model) or cfg.train.supervision.stages >= T
    K, m = plan_steps(model, max_steps, min_steps, readouts)
    note = (f"this {model.cfg.core} model runs at most {K} steps; --steps capped"
            if max_steps is not None and K < max_steps else None)
    amp = cfg.train.amp
    held_out = cfg.data.holdout > 0  # the run never trained on these: an honest calibration split
    calib_set, test_set = held_out_sets(cfg, fallback=True)  # else the seeded calibration split
    kw = dict(batch_size=batch_size, shuffle=False, num_workers=cfg.data.num_workers)
    calib_loader, test_loader = DataLoader(calib_set, **kw), DataLoader(test_set, **kw)
    # calibration and the test split each run every image to max(K, T) steps once, then each criterion's
    # timed passes (its sweep and its measured point)
    check_eval_cost(model, next(iter(calib_loader))[0].to(device), max(K, T),  # (a calibration batch)
                    len(calib_loader) + len(test_loader) + 2 * len(criteria) * len(test_loader), force=force)
    calib_traj = A.trajectories(model, calib_loader, device, max(K, T), amp)
    if certify is not None:
        cals = {c: _certified(calib_traj, c, certify, T, K, m) for c in criteria}
    else:
        cals = {c: A.calibrate(model, calib_loader, device, c, K, m, target_drop, step_budget, amp, readouts,
                               trajectory=calib_traj) for c in criteria}
    test_traj = A.trajectories(model, test_loader, device, max(K, T), amp)  # the test split, from here on
    batches = []
    for x, _ in test_loader:
        batches.append(x.to(device))
        if len(batches) == time_batches:
            break
    out = {}
    for criterion, cal in cals.items():
        thr = cal["threshold"]
        levels = sorted(set(A.thresholds(calib_traj, criterion, K, m)) | ({thr} if thr is not None else set()))
        sweep = []
        for t in levels:
            row = A.point(test_traj, criterion, t, K, m)
            ips = interleaved_batches(A.runners(model, criterion, t, K, m, device, amp, readouts), batches, device)
            sweep.append({**row, "images_per_s": ips["adaptive"], "fixed_images_per_s": ips["fixed"],
                          "speedup": ips["adaptive"] / ips["fixed"]})
        test = A.measure(model, test_loader, device, criterion, thr, K, m, amp, readouts)
        test["steps_pct_T"] = 100 * test["mean_steps"] / T
        out[criterion] = {
            "criterion": criterion, "trained_steps": T, "max_steps": K, "min_steps": m, "batch_size": batch_size,
            "calibration_fraction": cfg.data.holdout if held_out else CALIBRATION_FRACTION,
            "calibration_images": "held out from training" if held_out else "seen in training",
            **{k: v for k, v in cal.items() if k != "trajectory"}, "test": test, "sweep": sweep,
            "fixed_accuracy": A.fixed_accuracy(test_traj)[:K], "note": note}
    return out


def _certified(traj: dict, criterion: str, certify: Tuple[float, float], T: int, K: int, m: int) -> Dict[str, Any]:
    """The certified threshold of one criterion, in the form :func:`recurvit.analysis.anytime.calibrate`
    returns a calibrated one (``met``: whether an exit was certified)."""
    epsilon, delta = certify
    cert = certify_exit(traj, criterion, epsilon, delta, K, m)
    point = A.point(traj, criterion, cert["threshold"], K, m)
    return {"criterion": criterion, "threshold": cert["threshold"], "met": cert["certified"], "certify": cert,
            "calibration": {"n": cert["n"], "acc_T": A.fixed_accuracy(traj)[T - 1], **point}}
