"""What a run refuses, in one line, instead of a traceback from deep inside torch.

- :func:`check_train_config`: values torch would reject late (a negative lr, a batch size of 1e20);
- :func:`out_of_memory`: an allocation that failed anyway, named by the settings that size the run;
- :func:`divergence_advice`: what to change after a non-finite loss (used by train and vae train).

The memory and time estimates made before long work starts are in ``budget.py``.
"""
from __future__ import annotations

import math

from ..config import RunConfig
from ..errors import UserError
from .tensorboard import require_tensorboard

MAX_COUNT = 10**9  # bound on epochs / batch size: larger values are a mistake, not a plan


def divergence_advice(tc) -> str:
    """What to change after a diverged step: a lower lr, and clipping on (or harder)."""
    clip = ("set train.grad_clip (e.g. 1.0) to clip gradients" if tc.grad_clip == 0
            else f"clip harder with a smaller train.grad_clip (now {tc.grad_clip:g})")
    return f"lower train.lr (now {tc.lr:g}) or {clip}, then --resume the run with the new value"


def check_train_config(cfg: RunConfig) -> None:
    """Values torch would reject with a traceback: one clear line instead."""
    t = cfg.train
    if not (math.isfinite(t.lr) and t.lr > 0):
        raise UserError(f"train.lr must be a positive number, got {t.lr}")
    for key in ("epochs", "batch_size"):
        if getattr(t, key) < 1:
            raise UserError(f"train.{key} must be >= 1, got {getattr(t, key)}")
        if getattr(t, key) > MAX_COUNT:
            raise UserError(f"train.{key} must be <= {MAX_COUNT:,}, got {getattr(t, key)}")
    if t.weight_decay < 0 or t.grad_clip < 0 or not 0 <= t.label_smoothing < 1:
        raise UserError("train.weight_decay and train.grad_clip must be >= 0, train.label_smoothing in [0, 1)")
    if t.supervision.stages < 1:
        raise UserError("train.supervision.stages must be >= 1")
    if t.eval_every < 1:
        raise UserError(f"train.eval_every must be >= 1, got {t.eval_every}")
    if t.tensorboard:
        require_tensorboard()


def out_of_memory(cfg: RunConfig, e: BaseException) -> UserError:
    """An allocation that failed anyway: one line naming the settings that size the run."""
    m, t = cfg.model, cfg.train
    return UserError(f"out of memory ({str(e).splitlines()[0][:100]}) with model {m.name} embed_dim={m.embed_dim} "
                     f"depth={m.depth} steps={m.steps} and train.batch_size={t.batch_size}; make one of them smaller "
                     "or set train.activation_checkpointing=true")
