"""Dense prediction: a class for every pixel, trained by the one loop (mazes).

    recurvit train configs/mazes/dt_recall_prog.yaml      # `recurvit train` picks this task from the data

The model gives per-pixel logits (B, classes, H, W) (``DTNet``, or a ViT with ``model.dense=true``) and
the targets are masks (B, H, W). The loss is the pixel cross-entropy, over the drawn depth's readouts as
classification weighs them (deep supervision, random depth, truncation: ``train.supervision`` /
``train.depth``), mixed with Bansal et al.'s progressive loss when ``train.depth.progressive`` = alpha > 0
(``losses.progressive_logits``). With ``train.loss_mask=open`` every term averages over the open pixels
only (the input's brightest channel > 0: DeepThinking's mazes mask, walls and frame left out). Figures: pixel
accuracy, **solved** (the share of images with every pixel right) and **solved_open** (DeepThinking's: its
predictions on walls zeroed, every open pixel right); ``train.solved`` names the one that chooses best.pt.

The validation split (at the training size) is evaluated every ``train.eval_every`` epochs and chooses
best.pt (``val_solved``); the last epoch adds the test split at every size of ``data.maze_test_sizes``
at the trained depth (``test_solved_<size>``, ``test_acc_<size>``; ``test_*`` without a size: the
training size). Sweeps over sizes x test-time iterations are :mod:`recurvit.analysis.mazes`'s.

Everything else (data-parallel training, compilation, resume, the depth draws under DDP) is
classification's (:class:`~recurvit.tasks.classify.ClassifyTask`), which this task extends.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ...config import RunConfig
from ...errors import UserError
from ...run import checkpoint as ckpt_io, distributed as dist_io
from ...run.device import autocast
from ...run.loaders import build_loaders, resolve_model_config
from ...train.checks import check_train_config
from ...train.fit import fit
from ...train.loop import Step
from ...train.losses import (progressive_draw, progressive_logits, progressive_mix, readout_steps, stage_weights,
    stepped_logits, supervised_loss)
from ...data.datasets import DENSE, dense_target
from ...data.mazes import maze_pixels, maze_test_sets
from ..classify.task import ClassifyTask


# ------------------------------------------------------------------------------ figures
def open_pixels(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W) True where the image (B, C, H, W) is not black in every channel: a maze's open squares
    (DeepThinking's utils/training.py mask, ``inputs.max(dim=1) > 0``; the loader's mean is 0)."""
    return x.amax(1) > 0


def pixel_loss(logits: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor] = None,
               label_smoothing: float = 0.0) -> torch.Tensor:
    """The pixel cross-entropy of logits (B, C, H, W), averaged over every pixel or over ``mask`` (B, H, W)
    alone (DeepThinking: ``loss[mask > 0].mean()``, one mean over the batch's open pixels)."""
    if mask is None:
        return F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing)
    per = F.cross_entropy(logits.float(), target, reduction="none", label_smoothing=label_smoothing)
    return per[mask].mean()


@torch.no_grad()
def dense_counts(logits: torch.Tensor, target: torch.Tensor, open_px: Optional[torch.Tensor] = None) -> Dict[str, int]:
    """Pixels right, pixels, images with every pixel right and (given ``open_px``, (B, H, W)) images
    with every open pixel right, for logits (B, C, H, W) and target (B, H, W)."""
    right = logits.argmax(1) == target  # (B, H, W)
    out = {"correct": int(right.sum()), "pixels": right.numel(), "solved": int(right.flatten(1).all(1).sum()),
           "n": len(target)}
    if open_px is not None:  # DeepThinking's get_predicted: predictions on walls zeroed (targets are 0 there)
        out["solved_open"] = int((right | ~open_px).flatten(1).all(1).sum())
    return out


@torch.no_grad()
def evaluate_dense(model: nn.Module, loader: Iterable, device: torch.device, steps: Optional[int] = None,
                   amp: str = "auto", env: Optional[dist_io.DistEnv] = None) -> Dict[str, float]:
    """Pixel loss, pixel accuracy, solved (share of images with every pixel right) and solved_open
    (DeepThinking's: every open pixel right) at ``steps`` (default: the trained depth); in a process
    group, of the whole set (each rank's shard all-reduced)."""
    model.eval()
    k = model.core.check_steps(steps)
    loss_sum, correct, pixels, solved, solved_open, n = 0.0, 0, 0, 0, 0, 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(x, steps=k)
        c = dense_counts(logits, y, open_pixels(x))
        loss_sum += F.cross_entropy(logits.float(), y).item() * len(y)
        correct, pixels, solved, n = correct + c["correct"], pixels + c["pixels"], solved + c["solved"], n + c["n"]
        solved_open += c["solved_open"]
    env = dist_io.current() if env is None else env
    if env.enabled:
        loss_sum, correct, pixels, solved, solved_open, n = env.all_reduce_sum(
            [loss_sum, correct, pixels, solved, solved_open, n], device)
    return {"loss": loss_sum / max(n, 1), "accuracy": correct / max(pixels, 1), "solved": solved / max(n, 1),
            "solved_open": solved_open / max(n, 1), "n": int(round(n))}


# -------------------------------------------------------------------------------- one epoch
class DenseForward(nn.Module):
    """What DDP wraps: the drawn depth's readouts and, with the progressive loss, the readout after
    (n without gradient, k with), in ONE forward call (so DDP prepares the all-reduce for both)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, steps=None, at=None, grad_last=None, progressive=None, full=True, start_gen=None):
        if not full:
            logits_at = None
        elif start_gen is None:
            logits_at = self.model.forward_steps(x, steps=steps, at=at, grad_last=grad_last)
        else:  # a random first state (train.depth.random_start)
            logits_at = stepped_logits(self.model, x, steps, at, grad_last, start_gen)
        prog = progressive_logits(self.model, x, *progressive, start_gen=start_gen) if progressive is not None else None
        return logits_at, prog


# ------------------------------------------------------------------------------------ the task
class DenseTask(ClassifyTask):
    """Images -> per-pixel logits; best.pt is chosen on the validation split (``val_solved``)."""

    name = "dense"

    def check(self):
        check_train_config(self.cfg)
        if not dense_target(self.cfg.data.name):
            raise UserError(f"the dense task trains on data with a per-pixel target (data.name=mazes), "
                            f"not data.name={self.cfg.data.name}")
        alpha = self.cfg.train.depth.progressive
        if not 0 <= alpha <= 1:
            raise UserError(f"train.depth.progressive (the progressive loss weight alpha) must be in [0, 1], got {alpha}")
        start = self.cfg.train.depth.random_start
        if not 0 <= start <= 1:
            raise UserError(f"train.depth.random_start (a probability) must be in [0, 1], got {start}")
        if self.cfg.data.holdout:
            raise UserError("mazes have their own validation split (data.maze_val): set data.holdout=0")
        if self.cfg.data.mixup_alpha or self.cfg.data.cutmix_alpha:
            raise UserError("MixUp / CutMix mix class labels, not per-pixel masks: set data.mixup_alpha=0 and "
                            "data.cutmix_alpha=0 for the dense task")

    # ---------------------------------------------------------------- building
    def build(self, env, device, log, force):
        self.train_loader, self.val_loader, self.info = build_loaders(self.cfg, env=env, log=log)
        self.test_loader = None  # the test sets at every size: built when the last epoch evaluates them
        self.cfg = cfg = resolve_model_config(self.cfg, self.info)
        self.model = ckpt_io.build_model_from_config(cfg).to(device)
        self._check_model()

    def _check_model(self):
        mc, cfg = self.model.cfg, self.cfg
        if hasattr(mc, "dense") and not mc.dense:
            raise UserError(f"model {cfg.model.name} reads out one class an image: set model.dense=true for "
                            f"per-pixel logits")
        larger = [s for s in cfg.data.maze_test_sizes if maze_pixels(s) != maze_pixels(cfg.data.maze_size)]
        if larger and hasattr(mc, "dynamic_img_size") and not mc.dynamic_img_size:
            raise UserError(f"data.maze_test_sizes has sizes other than the training size ({larger}): set "
                            f"model.dynamic_img_size=true so the model runs on them")
        p = getattr(mc, "patch_size", 1) or 1
        sizes = [cfg.data.maze_size, *cfg.data.maze_test_sizes]  # the test sizes too: they run at the last epoch
        bad = sorted({f"{s}x{s} ({maze_pixels(s)} px)" for s in sizes if maze_pixels(s) % p})
        if bad:
            raise UserError(f"model.patch_size={p} does not divide every maze's side: {', '.join(bad)}; "
                            f"use 2 or 4 (they divide every maze size)")
        if self.cfg.train.depth.random_start:
            why = mc.core_cls.cannot_step(mc) or (None if getattr(self.model.core, "cond", None) is not None
                                                  and self.model.core.cond.reinject else
                                                  "the input must enter at every step: set model.reinject=true")
            if why:
                raise UserError(f"train.depth.random_start starts the recurrence from noise: {why}")
        if self.cfg.train.depth.progressive and mc.core_cls.cannot_step(mc):
            raise UserError(f"train.depth.progressive needs a core that runs one step at a time: "
                            f"{mc.core_cls.cannot_step(mc)}")

    def build_depth(self, env):
        super().build_depth(env)
        # the progressive loss draws (n, k) from its own generator, seeded alike on every rank and saved with
        # last.pt: one process and several draw the same (n, k) for every batch
        self.prog_gen = torch.Generator().manual_seed(self.cfg.train.seed + 7919)
        self.start_gen = torch.Generator().manual_seed(self.cfg.train.seed + 104729)  # random_start's draws and noise
        self.generators["progressive_rng"] = self.prog_gen
        if self.cfg.train.depth.random_start:
            self.generators["random_start_rng"] = self.start_gen

    def training_module(self) -> nn.Module:
        return DenseForward(self.model)

    def may_skip_parameters(self) -> bool:
        return super().may_skip_parameters() or self.cfg.train.depth.progressive > 0

    def header(self, env, device):
        cfg, model = self.cfg, self.model
        n_params = sum(p.numel() for p in model.parameters())
        where = f"device {device}" if not env.enabled else f"{env.world_size} processes ({device.type}, DDP)"
        size = cfg.data.maze_size
        alpha = cfg.train.depth.progressive
        return (f"model {cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)} core, {n_params:,} params, "
                f"steps={model.nominal_steps}{f', progressive loss alpha={alpha:g}' if alpha else ''}) on "
                f"{size}x{size} mazes ({len(self.train_loader.dataset)} train / {len(self.val_loader.dataset)} "
                f"validation, best.pt chosen on it; tested at sizes {', '.join(map(str, cfg.data.maze_test_sizes))}), "
                f"{where}")

    # ---------------------------------------------------------------- each epoch
    def batch_guard(self, epoch):
        return None  # classification's first-batches time guard describes patches; a maze run has none yet

    def train_step(self, batch, amp):
        """The per-pixel loss of one batch at a drawn depth, mixed with the progressive loss (alpha =
        ``train.depth.progressive``; its (n, k) drawn from the task's own generator); the figures are of the
        readout at the drawn depth (of the progressive readout when alpha = 1: the full depth is then not run)."""
        tc = self.cfg.train
        alpha = tc.depth.progressive
        forward = DenseForward(self.model) if self.forward is None else self.forward
        x, y = batch[0].to(self.device, non_blocking=True), batch[1].to(self.device, non_blocking=True)
        k = self.depth()
        at = readout_steps(k, tc.supervision.stages)
        w = stage_weights(tc.supervision.weights, len(at))
        prog = progressive_draw(k, self.prog_gen) if alpha > 0 else None
        p = tc.depth.random_start
        start_gen = self.start_gen if p > 0 and float(torch.rand(1, generator=self.start_gen)) < p else None
        with amp():
            logits_at, prog_logits = forward(x, steps=k, at=at, grad_last=tc.depth.truncate or None,
                                             progressive=prog, full=alpha < 1, start_gen=start_gen)
        mask = open_pixels(x) if tc.loss_mask == "open" else None
        if logits_at is None:
            full_loss = None
        elif mask is None:
            full_loss = supervised_loss(logits_at, y, w, tc.label_smoothing)
        else:
            full_loss = sum(ws * pixel_loss(lg, y, mask, tc.label_smoothing) for ws, lg in zip(w.tolist(), logits_at))
        prog_loss = pixel_loss(prog_logits, y, mask, tc.label_smoothing) if prog is not None else None
        loss = progressive_mix(full_loss, prog_loss, alpha)
        c = dense_counts(logits_at[-1] if logits_at is not None else prog_logits, y, open_pixels(x))
        return Step(loss, len(y), {"loss": loss.detach()},
                    {"correct": c["correct"], "pixels": c["pixels"], "solved": c["solved"],
                     "solved_open": c["solved_open"]})

    def progress(self, totals):
        return {"loss": f"{totals.mean('loss'):.4f}", "acc": f"{totals.total('correct') / max(totals.total('pixels'), 1):.4f}",
                "solved": f"{totals.total('solved') / max(totals.n, 1):.4f}"}

    def epoch_metrics(self, totals, seconds):
        return {"lr": self.sched.get_last_lr()[0], "train_loss": totals.mean("loss"),
                "train_acc": totals.total("correct") / max(totals.total("pixels"), 1),
                "train_solved": totals.total("solved") / max(totals.n, 1),
                "train_solved_open": totals.total("solved_open") / max(totals.n, 1), "img_per_s": totals.n / seconds,
                "seconds": seconds}

    def evaluate(self, env):
        amp, out = self.cfg.train.amp, {}
        with torch.random.fork_rng(devices=[]):  # evaluating must not move the run's random streams
            ev = evaluate_dense(self.model, self.val_loader, self.device, amp=amp, env=env)
            out.update(val_loss=ev["loss"], val_acc=ev["accuracy"], val_solved=ev["solved"],
                       val_solved_open=ev["solved_open"])
            if self.epoch + 1 == self.cfg.train.epochs:
                out.update(self._test_every_size(env))
        return out

    def _test_every_size(self, env) -> Dict[str, float]:
        out = {}
        for size, data in maze_test_sets(self.cfg.data).items():
            sampler = dist_io.Shard(len(data), env.rank, env.world_size) if env.enabled else None
            loader = DataLoader(data, batch_size=self.val_loader.batch_size, shuffle=False, sampler=sampler)
            ev = evaluate_dense(self.model, loader, self.device, amp=self.cfg.train.amp, env=env)
            out.update({f"test_loss_{size}": ev["loss"], f"test_acc_{size}": ev["accuracy"],
                        f"test_solved_{size}": ev["solved"], f"test_solved_open_{size}": ev["solved_open"]})
            if size == self.cfg.data.maze_size:
                out.update(test_loss=ev["loss"], test_acc=ev["accuracy"], test_solved=ev["solved"],
                           test_solved_open=ev["solved_open"])
        return out

    def epoch_line(self, metrics):
        if "val_solved" not in metrics:
            return None
        open_ = self.cfg.train.solved == "open"  # the figure best.pt is chosen on, DeepThinking's, shown too
        key = "test_solved_open_" if open_ else "test_solved_"
        sizes = "  ".join(f"solved@{k[len(key):]} {v:.3f}" for k, v in metrics.items()
                          if k.startswith(key) and k[len(key):].isdigit())
        dt = f"val_solved_open {metrics['val_solved_open']:.3f}  " if open_ else ""
        return (f"epoch {metrics['epoch']:>3}/{self.cfg.train.epochs}  loss {metrics['train_loss']:.4f}  "
                f"train_solved {metrics['train_solved']:.3f}  val_acc {metrics['val_acc']:.4f}  "
                f"val_solved {metrics['val_solved']:.3f}  {dt}{sizes + '  ' if sizes else ''}"
                f"{metrics['img_per_s']:.0f} img/s  {metrics['seconds']:.1f}s")

    def score(self, metrics, last):
        return metrics.get("val_solved_open" if self.cfg.train.solved == "open" else "val_solved")

    def best_files(self, record, metrics):
        return {"best.pt": {**record, "val_solved": metrics["val_solved"], "val_acc": metrics["val_acc"],
                            "val_solved_open": metrics["val_solved_open"]}}


def train_dense(cfg: RunConfig, out: Path, resume: bool = False, log=print, stop_after: Optional[int] = None,
                force: bool = False) -> Dict[str, Any]:
    """Train the dense task ``cfg`` into run directory ``out`` (or continue it): ``recurvit.tasks.classify.train``
    with data of a per-pixel target comes here too."""
    return fit(DenseTask(cfg), out, resume=resume, log=log, stop_after=stop_after, force=force)
