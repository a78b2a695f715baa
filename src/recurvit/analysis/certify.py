"""A certified early exit: the exit threshold chosen by Learn-then-Test (Angelopoulos et al. 2021, as CALM,
Schuster et al. 2022, uses it for early-exit language models), so that the exit's loss against the
full-depth answer is at most ``epsilon`` with probability at least ``1 - delta`` over the calibration
draw, whatever the data distribution (calibration and new images exchangeable, i.e. i.i.d. draws).

The loss of one image at a threshold is 1 when its early answer differs from its answer at full depth
(the prediction after ``max_steps``), else 0: a consistency loss that needs no label, and an upper bound
on the accuracy the exit loses (an image whose answer did not change cannot lose accuracy), so a
certified disagreement rate of ``epsilon`` certifies an accuracy loss of at most ``epsilon``.

The procedure, over a threshold grid fixed before any data is seen (:func:`grid`, ordered from the
least to the most aggressive exit):

1. for each threshold, the null hypothesis "its risk exceeds epsilon" gets the exact binomial p-value
   ``P(Binomial(n, epsilon) <= k)`` of the k disagreements it makes on the n calibration images;
2. fixed-sequence testing: walk the grid in order and reject while the p-value is at most ``delta``;
   stop at the first that is not (this controls the family-wise error at ``delta``);
3. the certified threshold is the last one rejected: the most aggressive exit whose risk is certified.
   When the first is not rejected, no exit is certified and the model runs to full depth.

Nothing here reads a test split: :func:`certify` takes the trajectories of the calibration images only
(:func:`recurvit.analysis.anytime.trajectories` of the held-out loader).
"""
from __future__ import annotations

import math
from typing import List, Optional

import torch

from ..models.adaptive import RISING, check_criterion, exit_steps

GRID_POINTS = 400  # thresholds in a criterion's fixed grid


def grid(criterion: str, points: int = GRID_POINTS) -> List[float]:
    """The candidate thresholds of ``criterion``, fixed before any data is seen, from the least aggressive
    exit to the most: max_prob from 1 down to 0 (a lower bar exits sooner); entropy, kl and state from
    1e-8 up to 10 on a log scale (a higher bar on a falling signal exits sooner)."""
    check_criterion(criterion)
    if criterion in RISING:
        return [1.0 - i / (points - 1) for i in range(points)]
    return [10 ** (-8 + 9 * i / (points - 1)) for i in range(points)]


def losses(traj: dict, criterion: str, threshold: Optional[float], max_steps: int,
           min_steps: int = 1) -> tuple:
    """(per-image loss: 1 where the early answer differs from the answer at ``max_steps``; exit steps)."""
    sig = traj["signals"][criterion][:max_steps].clone()
    steps = exit_steps(sig, criterion, threshold, min_steps)
    preds = traj["preds"][:max_steps]
    early = preds[steps - 1, torch.arange(preds.shape[1])]
    return (early != preds[-1]).double(), steps


def binomial_p(k: int, n: int, epsilon: float) -> float:
    """p-value of "risk > epsilon" after k losses in n draws: P(Binomial(n, epsilon) <= k)."""
    from scipy import stats

    return float(stats.binom.cdf(k, n, epsilon))


def certify(traj: dict, criterion: str, epsilon: float, delta: float, max_steps: int, min_steps: int = 1,
            thresholds: Optional[List[float]] = None) -> dict:
    """The most aggressive threshold whose disagreement with full depth is certified at ``epsilon`` with
    confidence ``1 - delta`` on these calibration trajectories (see the module docstring); ``threshold``
    None and ``certified`` False when no exit is."""
    if not 0 < epsilon < 1 or not 0 < delta < 1:
        raise ValueError(f"epsilon and delta must lie in (0, 1); got {epsilon}, {delta}")
    n = int(traj["preds"].shape[1])
    if n == 0:
        raise ValueError("no calibration images")
    chosen = {"threshold": None, "risk": 0.0, "p_value": math.nan,
              "mean_steps": float(max_steps)}
    tested = 0
    for t in thresholds if thresholds is not None else grid(criterion):
        loss, steps = losses(traj, criterion, t, max_steps, min_steps)
        k = int(loss.sum().item())
        p = binomial_p(k, n, epsilon)
        tested += 1
        if p > delta:  # fixed-sequence testing stops at the first hypothesis it cannot reject
            break
        chosen = {"threshold": t, "risk": k / n, "p_value": p, "mean_steps": steps.double().mean().item()}
    return {"criterion": criterion, "epsilon": epsilon, "delta": delta, "n": n, "max_steps": max_steps,
            "certified": chosen["threshold"] is not None, "tested": tested, **chosen}
