"""AdamW with decay only on weight matrices, and a per-iteration linear-warmup cosine schedule."""
from __future__ import annotations

import math
from typing import List

import torch
import torch.nn as nn

from ..config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> List[dict]:
    """No weight decay on norms, biases, embeddings (pos/cls/step) and 1-D parameters."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name in skip or name.endswith(".bias") or "embed" in name.split(".")[-1] \
                or "step_" in name or "token" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    fused = device.type == "cuda"
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas),
                             fused=fused or None)


def build_scheduler(opt: torch.optim.Optimizer, cfg: OptimConfig, iters_per_epoch: int):
    total = max(1, cfg.epochs * iters_per_epoch)
    warmup = int(round(cfg.warmup_epochs * iters_per_epoch))
    floor = cfg.min_lr / cfg.lr if cfg.lr > 0 else 0.0

    def factor(it: int) -> float:
        if it < warmup:
            return (it + 1) / warmup
        progress = min(1.0, (it - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def follow_config(opt: torch.optim.Optimizer, sched, cfg: OptimConfig, iters_per_epoch: int) -> None:
    """After loading a checkpoint's optimizer and schedule state: make them follow ``cfg`` (a
    resume whose overrides changed lr, min_lr, epochs, warmup, weight decay or betas).

    The schedule is recomputed from ``cfg`` at the iteration reached, so a new peak lr or epoch
    count continues the warmup-cosine curve of the new settings from there; with an unchanged
    config every value is the one already loaded (the same formula at the same iteration)."""
    fresh = build_scheduler(opt, cfg, iters_per_epoch)  # new lambdas (epochs, warmup, floor)
    it = sched.last_epoch
    sched.lr_lambdas = fresh.lr_lambdas
    sched.base_lrs = [cfg.lr for _ in opt.param_groups]
    for i, g in enumerate(opt.param_groups):
        g["initial_lr"] = cfg.lr
        g["lr"] = cfg.lr * sched.lr_lambdas[i](it)
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
