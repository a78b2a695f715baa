"""A calibration split: a fixed, seeded part of the TRAINING split, read without augmentation.

Thresholds chosen on it (``recurvit exit``) never look at the test split. The runs of this package
train on the whole training split, so these images were seen in training: a model is usually more
confident on them than on new images, and a threshold calibrated here errs towards exiting early
(the test figures, measured once at the chosen threshold, show by how much).
"""
from __future__ import annotations

import copy

import torch
from torch.utils.data import Dataset, Subset

from ..errors import UserError

CALIBRATION_FRACTION = 0.1
CALIBRATION_SEED = 0


def calibration_split(train_set: Dataset, test_set: Dataset, fraction: float = CALIBRATION_FRACTION,
                      seed: int = CALIBRATION_SEED) -> Subset:
    """``fraction`` of ``train_set`` (a seeded random choice, at least one image) with the test
    set's transform (no augmentation). ``test_set`` lends only its transform: none of its images."""
    if not 0 < fraction <= 1:
        raise UserError(f"the calibration fraction must be in (0, 1], got {fraction}")
    if not (hasattr(train_set, "transform") and hasattr(test_set, "transform")):
        raise UserError(f"cannot read {type(train_set).__name__} without augmentation (it has no `transform`)")
    plain = copy.copy(train_set)  # shares the images; only the transform differs
    plain.transform = test_set.transform
    n = len(plain)
    take = max(1, round(fraction * n))
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:take]
    return Subset(plain, sorted(idx.tolist()))
