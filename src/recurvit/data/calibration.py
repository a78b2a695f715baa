"""A calibration split: a fixed, seeded part of the TRAINING split, read without augmentation.

Thresholds chosen on it (``recurvit exit``) never look at the test split. With ``data.holdout=f``
a run trains on the rest of the training split only, and the held-out fraction is its calibration
split (:func:`holdout_split`): images the model has never seen. Without it (``calibration_split``)
the images were seen in training: a model is usually more confident on them than on new images,
and a threshold calibrated there errs towards exiting early (the test figures, measured once at the
chosen threshold, show by how much).
"""
from __future__ import annotations

import copy

import torch
from torch.utils.data import Dataset, Subset

from ..errors import UserError

CALIBRATION_FRACTION = 0.1
CALIBRATION_SEED = 0
HOLDOUT_SEED = 0  # the held-out images depend on the data set and the fraction only, not the run's seed


def holdout_indices(n: int, fraction: float, seed: int = HOLDOUT_SEED):
    """(indices trained on, indices held out) of a training split of ``n`` images, both sorted."""
    if not 0 < fraction < 1:
        raise UserError(f"data.holdout must be in [0, 1), got {fraction}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    take = max(1, round(fraction * n))
    if take >= n:  # nothing left to train on (a traceback in the first epoch)
        raise UserError(f"data.holdout={fraction} holds out all {n} training images; choose a smaller fraction "
                        f"(at most {(n - 1) / n:.4g})")
    return sorted(perm[take:].tolist()), sorted(perm[:take].tolist())


def holdout_split(train_set: Dataset, test_set: Dataset, fraction: float) -> Subset:
    """The held-out part of the FULL training split (``data.holdout``), with the test transform."""
    plain = _without_augmentation(train_set, test_set)
    return Subset(plain, holdout_indices(len(plain), fraction)[1])


def _without_augmentation(train_set: Dataset, test_set: Dataset) -> Dataset:
    if not (hasattr(train_set, "transform") and hasattr(test_set, "transform")):
        raise UserError(f"cannot read {type(train_set).__name__} without augmentation (it has no `transform`)")
    plain = copy.copy(train_set)  # shares the images; only the transform differs
    plain.transform = test_set.transform
    return plain


def calibration_split(train_set: Dataset, test_set: Dataset, fraction: float = CALIBRATION_FRACTION,
                      seed: int = CALIBRATION_SEED) -> Subset:
    """``fraction`` of ``train_set`` (a seeded random choice, at least one image) with the test
    set's transform (no augmentation). ``test_set`` lends only its transform: none of its images."""
    if not 0 < fraction <= 1:
        raise UserError(f"the calibration fraction must be in (0, 1], got {fraction}")
    plain = _without_augmentation(train_set, test_set)
    n = len(plain)
    take = max(1, round(fraction * n))
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:take]
    return Subset(plain, sorted(idx.tolist()))
