"""What a run refuses, in one line, instead of a traceback from deep inside torch.

- :func:`check_train_config`: values torch would reject late (a negative lr, a batch size of 1e20);
- :func:`divergence_advice` / :class:`Diverged` / :func:`how_to_go_on`: what to change after a non-finite
  loss (used by train, finetune and vae train), and how to go on from what the run directory holds
  once it is closed (a run that diverged inside its first epoch has no checkpoint, and a directory
  it created is removed: ``--resume`` is advised only where there is something to resume).

The memory and time estimates made before long work starts are in ``budget.py``.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config import RunConfig
from ..errors import UserError
from .tensorboard import require_tensorboard

MAX_COUNT = 10**9  # bound on epochs / batch size: larger values are a mistake, not a plan


def divergence_advice(tc) -> str:
    """What to change after a diverged step: a lower lr, and clipping on (or harder)."""
    clip = ("set train.grad_clip (e.g. 1.0) to clip gradients" if tc.grad_clip == 0
            else f"clip harder with a smaller train.grad_clip (now {tc.grad_clip:g})")
    return f"lower train.lr (now {tc.lr:g}) or {clip}"


class Diverged(UserError):
    """A non-finite loss. The message says what to change; the command that owns the run directory
    adds how to go on (:func:`how_to_go_on`) once the directory is closed."""

    def __init__(self, loss, epoch: int, tc):
        super().__init__(f"training diverged (loss={loss}) at epoch {epoch}; {divergence_advice(tc)}")


def how_to_go_on(e: Diverged, run_dir: Path, resumable: bool = True) -> UserError:
    """``e`` with the way to go on that is true of ``run_dir`` as it is now (after it was closed)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        how = f"then start the run again with the new value (nothing was saved: {run_dir} was removed)"
    elif resumable and (run_dir / "last.pt").is_file():
        how = f"then --resume {run_dir} with the new value (it continues from its last.pt)"
    elif resumable:
        how = (f"then --resume {run_dir} with the new value (it has no checkpoint yet: "
               "it starts again from the beginning)")
    else:
        how = f"then start it again with the new value and another --out ({run_dir} is kept as it is)"
    return UserError(f"{e}, {how}")


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _in_unit(x) -> bool:
    """x in [0, 1) (NaN is not)."""
    return _number(x) and 0 <= x < 1


def check_train_config(cfg: RunConfig) -> None:
    """Values torch would reject with a traceback, or that train into nonsense: one clear line
    naming the key instead."""
    t, m = cfg.train, cfg.model
    if not (math.isfinite(t.lr) and t.lr > 0):
        raise UserError(f"train.lr must be a positive number, got {t.lr}")
    if not (math.isfinite(t.min_lr) and t.min_lr >= 0):
        raise UserError(f"train.min_lr must be a number >= 0, got {t.min_lr}")
    if not (math.isfinite(t.warmup_epochs) and t.warmup_epochs >= 0):
        raise UserError(f"train.warmup_epochs must be a number >= 0, got {t.warmup_epochs}")
    for key in ("epochs", "batch_size"):
        if getattr(t, key) < 1:
            raise UserError(f"train.{key} must be >= 1, got {getattr(t, key)}")
        if getattr(t, key) > MAX_COUNT:
            raise UserError(f"train.{key} must be <= {MAX_COUNT:,}, got {getattr(t, key)}")
    if not (math.isfinite(t.weight_decay) and t.weight_decay >= 0):
        raise UserError(f"train.weight_decay must be a number >= 0, got {t.weight_decay}")
    if not (_number(t.grad_clip) and t.grad_clip >= 0):
        raise UserError(f"train.grad_clip must be a number >= 0 (0: no clipping), got {t.grad_clip}")
    if not _in_unit(t.label_smoothing):
        raise UserError(f"train.label_smoothing must be in [0, 1), got {t.label_smoothing}")
    betas = list(t.betas)
    if len(betas) != 2 or not all(_in_unit(b) for b in betas):
        raise UserError(f"train.betas must be two numbers in [0, 1) (e.g. [0.9, 0.999]), got {betas}")
    if m.num_classes is not None and m.num_classes < 2:
        raise UserError(f"model.num_classes must be >= 2 (or unset: the data set's classes), got {m.num_classes}")
    for key in ("drop_path", "drop_rate"):
        value = getattr(m, key)
        if value is not None and not _in_unit(value):
            raise UserError(f"model.{key} must be in [0, 1), got {value}")
    if t.supervision.stages < 1:
        raise UserError("train.supervision.stages must be >= 1")
    _check_more(cfg)
    if t.eval_every < 1:
        raise UserError(f"train.eval_every must be >= 1, got {t.eval_every}")
    if t.tensorboard:
        require_tensorboard()


def _check_more(cfg: RunConfig) -> None:
    """The rest of :func:`check_train_config` (values that once trained into nonsense in silence, or
    failed with a traceback at the first batch)."""
    t, m, d = cfg.train, cfg.model, cfg.train.depth
    if not (isinstance(t.seed, int) and -2**63 <= t.seed < 2**64):  # what torch.manual_seed takes
        raise UserError(f"train.seed must be an integer in [0, 2**64), got {t.seed}")
    if m.mlp_ratio is not None and not (_number(m.mlp_ratio) and math.isfinite(m.mlp_ratio) and m.mlp_ratio > 0):
        raise UserError(f"model.mlp_ratio must be a finite number > 0 (MLP hidden = mlp_ratio x embed_dim), "
                        f"got {m.mlp_ratio}")
    if m.stage_heads is not None and m.stage_heads < 0:
        raise UserError(f"model.stage_heads must be >= 0, got {m.stage_heads}")
    if m.steps is not None and m.steps >= 1 and t.supervision.stages > m.steps:  # was clamped to the steps in silence
        raise UserError(f"train.supervision.stages={t.supervision.stages} is more than model.steps={m.steps} "
                        f"(one readout a step at most); choose stages <= {m.steps}")
    if t.keep_every < 0:
        raise UserError(f"train.keep_every must be >= 0 (0: keep no epoch's model), got {t.keep_every}")
    if t.log_every < 0:
        raise UserError(f"train.log_every must be >= 0 (0: no log lines), got {t.log_every}")
    for key in ("block_lr_scale", "lr_factor"):
        value = getattr(t, key)
        if not (_number(value) and math.isfinite(value) and value > 0):
            raise UserError(f"train.{key} must be a finite number > 0, got {value}")
    if any(ms < 0 for ms in t.lr_milestones):
        raise UserError(f"train.lr_milestones are epoch indices >= 0, got {list(t.lr_milestones)}")
    if not (_number(d.sigma) and math.isfinite(d.sigma) and d.sigma > 0):
        raise UserError(f"train.depth.sigma must be a finite number > 0, got {d.sigma}")
    if d.truncate < 0:
        raise UserError(f"train.depth.truncate must be >= 0 (0: backpropagate through every step), got {d.truncate}")
    if d.min_steps < 1 or (d.max_steps is not None and d.max_steps < d.min_steps):
        raise UserError(f"train.depth needs 1 <= min_steps <= max_steps, got {d.min_steps} and {d.max_steps}")
    if cfg.data.name == "synthetic" and cfg.data.synthetic_classes < 2:
        raise UserError(f"data.synthetic_classes must be >= 2 (one class is always right), "
                        f"got {cfg.data.synthetic_classes}")
