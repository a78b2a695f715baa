"""The optimizer and the learning-rate schedule of every task.

By default AdamW with decay only on weight matrices, a per-iteration linear warmup and a cosine to
``min_lr``. DeepThinking's recipe (Schwarzschild et al. 2021; Bansal et al. 2022) is the same schema's
other choices: ``optimizer=adam_l2`` (torch.optim.Adam, the decay an L2 term added to the gradient),
``warmup=exponential`` and ``lr_schedule=step`` (its warmup.py ExponentialWarmup and MultiStepLR, both
stepped once an epoch), ``lr_throttle`` (its recurrent block at lr / T) and ``grad_clip=0``.
"""
from __future__ import annotations

import math
from typing import List

import torch
import torch.nn as nn

from ..config import OptimConfig

BLOCKS = "blocks."  # the parameters of the core's blocks (a recurrent core's ONE shared block) begin so


def param_groups(model: nn.Module, weight_decay: float, block_scale: float = 1.0) -> List[dict]:
    """No weight decay on norms, biases, embeddings (pos/cls/step) and 1-D parameters. With
    ``block_scale`` != 1 the core's blocks (``blocks.*``) get groups of their own whose lr is the
    base lr x ``block_scale`` (each group's ``lr_scale``)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    groups = {(blk, dec): [] for blk in (False, True) for dec in (True, False)}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name in skip or name.endswith(".bias") or "embed" in name.split(".")[-1] \
            or "step_" in name or "token" in name
        groups[(block_scale != 1.0 and name.startswith(BLOCKS), not no_decay)].append(p)
    out = [{"params": groups[(False, True)], "weight_decay": weight_decay},
           {"params": groups[(False, False)], "weight_decay": 0.0}]
    if block_scale != 1.0:
        out = [g for g in out if g["params"]] + [
            {"params": groups[(True, dec)], "weight_decay": weight_decay if dec else 0.0, "lr_scale": block_scale}
            for dec in (True, False) if groups[(True, dec)]]
    return out


def block_lr_scale(model: nn.Module, cfg: OptimConfig) -> float:
    """The lr multiplier of the core's blocks: ``block_lr_scale``, divided by the trained depth T with
    ``lr_throttle`` (DeepThinking's utils/tools.py get_optimizer: ``lr / max_iters`` for "recur" parameters)."""
    scale = float(cfg.block_lr_scale)
    if cfg.lr_throttle:
        scale /= int(getattr(model, "nominal_steps", 1) or 1)
    return scale


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    fused = device.type == "cuda"
    groups = param_groups(model, cfg.weight_decay, block_lr_scale(model, cfg))
    for g in groups:
        if "lr_scale" in g:
            g["lr"] = cfg.lr * g["lr_scale"]
    kind = torch.optim.Adam if cfg.optimizer == "adam_l2" else torch.optim.AdamW  # Adam: coupled L2
    return kind(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=fused or None)


def lr_factor(cfg: OptimConfig, it: int, iters_per_epoch: int) -> float:
    """The multiplier of each group's base lr at iteration ``it`` (from 0)."""
    epoch = it // max(1, iters_per_epoch)
    if cfg.warmup == "exponential":  # DeepThinking's warmup.py ExponentialWarmup, dampened once an epoch
        period = cfg.warmup_epochs
        warm = 1.0 if epoch + 1 >= period else 1.0 - math.exp(-(epoch + 1) / period)
        return warm * _decay(cfg, it, epoch, iters_per_epoch, 0)
    warmup = int(round(cfg.warmup_epochs * iters_per_epoch))
    if it < warmup:
        return (it + 1) / warmup
    return _decay(cfg, it, epoch, iters_per_epoch, warmup)


def _decay(cfg: OptimConfig, it: int, epoch: int, iters_per_epoch: int, warmup: int) -> float:
    if cfg.lr_schedule == "step":  # MultiStepLR stepped at the end of each epoch: decayed from epoch m on
        return cfg.lr_factor ** sum(1 for m in cfg.lr_milestones if m <= epoch)
    total = max(1, cfg.epochs * iters_per_epoch)
    floor = cfg.min_lr / cfg.lr if cfg.lr > 0 else 0.0
    progress = min(1.0, (it - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, iters_per_epoch: int):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda it: lr_factor(cfg, it, iters_per_epoch))


def follow_config(opt: torch.optim.Optimizer, sched, cfg: OptimConfig, iters_per_epoch: int) -> None:
    """After loading a checkpoint's optimizer and schedule state: make them follow ``cfg`` (a
    resume whose overrides changed lr, min_lr, epochs, warmup, schedule, weight decay or betas).

    The schedule is recomputed from ``cfg`` at the iteration reached, so a new peak lr or epoch
    count continues the schedule of the new settings from there; with an unchanged config every
    value is the one already loaded (the same formula at the same iteration)."""
    fresh = build_scheduler(opt, cfg, iters_per_epoch)  # new lambdas (epochs, warmup, floor)
    it = sched.last_epoch
    sched.lr_lambdas = fresh.lr_lambdas
    sched.base_lrs = [cfg.lr * g.get("lr_scale", 1.0) for g in opt.param_groups]
    for i, g in enumerate(opt.param_groups):
        g["initial_lr"] = sched.base_lrs[i]
        g["lr"] = sched.base_lrs[i] * sched.lr_lambdas[i](it)
        g["betas"] = tuple(cfg.betas)
        if g["weight_decay"] > 0 or i == 0:  # group 0 holds the decayed weights (param_groups)
            g["weight_decay"] = cfg.weight_decay
    sched._last_lr = [g["lr"] for g in opt.param_groups]


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, sched, loss: torch.Tensor, grad_clip: float) -> None:
    """Backward, optional global-norm clipping, optimizer and (per-iteration) schedule step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    sched.step()
