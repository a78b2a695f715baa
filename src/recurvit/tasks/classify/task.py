"""Classification: the task ``recurvit train`` trains (and fine-tuning builds on, finetune.py).

The task never knows which core it drives: it asks the model for logits at readout steps
(``forward_steps(..., at=...)``) and weighs them with ``losses.supervised_loss``.

Speed and scale: under torchrun the run is data-parallel (DDP; ``run/distributed.py`` gives the conventions:
global batch, sample order, rank-0 I/O); ``train.compile=true`` compiles each block (regional
``torch.compile``: no recompilation when the step count changes); ``train.activation_checkpointing=true``
recomputes every block application in backward; bf16 autocast is on by default on CUDA, AdamW fused there."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ...analysis.budget import check_param_memory, check_train_memory, first_batches_guard
from ...config import RunConfig, as_dict
from ...data import build_batch_transform
from ...data.datasets import dense_target, native_size
from ...errors import UserError
from ...models.speed import compile_available, compile_blocks, set_activation_checkpointing
from ...run import checkpoint as ckpt_io, distributed as dist_io
from ...run.device import autocast
from ...run.loaders import build_loaders, build_val_loader, resolve_model_config, set_epoch
from ...run.preprocessing import data_record
from ...run.progress import bar_options
from ...train.checks import check_train_config
from ...train.fit import fit
from ...train.loop import Step, train_epoch
from ...train.losses import DepthSampler, readout_steps, soft_cross_entropy, stage_weights, supervised_loss
from ...train.optim import build_optimizer, build_scheduler
from ..base import Task, data_task


# ------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device, steps: Optional[int] = None,
             amp: str = "auto", env: Optional[dist_io.DistEnv] = None, progress: bool = False) -> Dict[str, float]:
    """Test loss and accuracy at ``steps`` (default: the trained depth).

    In a process group (``env``, default: the current one) each rank evaluates its loader's shard
    and the sums are all-reduced, so every rank returns the figures of the whole test set.
    ``progress``: a bar over batches x steps (shown only on a terminal)."""
    model.eval()
    n, loss_sum, correct = 0, 0.0, 0
    k = model.core.check_steps(steps)
    bar = tqdm(total=len(loader) * k, desc=f"evaluating at {k} steps", unit="step", leave=False,
               **bar_options(progress))
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, amp):
            z = None
            for z in model.iter_states(x, k):  # model(x, steps=k), one step at a time for the bar
                bar.update()
            logits = model.forward_head(model.norm(z), step=k)
        loss_sum += soft_cross_entropy(logits, y).item() * len(y)
        correct += (logits.argmax(-1) == y).sum().item()
        n += len(y)
    bar.close()
    env = dist_io.current() if env is None else env
    if env.enabled:
        loss_sum, correct, n = env.all_reduce_sum([loss_sum, correct, n], device)
        correct, n = int(round(correct)), int(round(n))
    return {"loss": loss_sum / max(n, 1), "accuracy": correct / max(n, 1), "n": n}


# -------------------------------------------------------------------------------- one epoch
class StepsForward(nn.Module):
    """``forward(...)`` = ``model.forward_steps(...)``: what DDP wraps, so its forward (which
    prepares the gradient all-reduce) is the one training calls."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, steps=None, at=None, grad_last=None):
        return self.model.forward_steps(x, steps=steps, at=at, grad_last=grad_last)


def train_one_epoch(model, loader, opt, sched, device, cfg: RunConfig, depth: DepthSampler,
                    batch_transform=None, epoch: int = 0, forward: Optional[Callable] = None,
                    env: dist_io.DistEnv = dist_io.SINGLE, log: Optional[Callable] = None) -> Dict[str, float]:
    """One pass of classification over ``loader`` through the one batch loop (:func:`recurvit.train.loop.
    train_epoch`), for a model, optimizer and schedule built outside a run. ``forward`` (default
    ``model.forward_steps``) is the DDP-wrapped forward under several processes; the returned figures are
    then sums over all ranks. With ``train.log_every=N``, ``log`` gets a line every N batches."""
    task = ClassifyTask(cfg).setup_with(model, loader, opt, sched, device, depth, batch_transform, forward)
    return train_epoch(task, epoch, env, log)


@torch.no_grad()
def _stage_losses(logits_at: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> list:
    """Each readout's loss (the terms ``supervised_loss`` weighs), as floats."""
    return torch.stack([soft_cross_entropy(lg, target, label_smoothing) for lg in logits_at]).tolist()


# ------------------------------------------------------------------------------------ the task
class ClassifyTask(Task):
    """Images -> class logits, trained with (deep-supervised) cross-entropy; best.pt is chosen on
    the validation split (``data.holdout``) and a run without one writes no best.pt."""

    name = "classify"
    reader = ckpt_io.Reader(ckpt_io.read_model)  # its checkpoints hold a RunConfig and the registry's model
    forward = None  # the training forward: the DDP-wrapped module under several processes, else the model's
    batch_transform = None  # MixUp / CutMix (data.mixup_alpha, data.cutmix_alpha), or none
    time_guard = None  # the first-batches time guard of the first epoch this process trains (prepare_training)

    def checkpoint_config(self, state):
        return as_dict(ckpt_io.config_from_checkpoint(state))

    def check(self):
        check_train_config(self.cfg)
        if dense_target(self.cfg.data.name):
            raise UserError(f"data.name={self.cfg.data.name} has a per-pixel target: it trains as the dense task "
                            f"(recurvit.tasks.dense; `recurvit train` picks it from the data), not as classification")
        if self.cfg.train.depth.progressive:
            raise UserError(f"train.depth.progressive={self.cfg.train.depth.progressive:g}: the progressive loss is "
                            f"the dense task's (data.name=mazes); set it to 0 for classification")
        for key, plain in (("loss_mask", "all"), ("solved", "strict")):
            if getattr(self.cfg.train, key) != plain:
                raise UserError(f"train.{key}={getattr(self.cfg.train, key)} is the dense task's (data.name=mazes); "
                                f"set it to {plain} for classification")

    def out_of_memory(self, e):
        """An allocation that failed anyway: one line naming the settings that size the run."""
        m, t = self.cfg.model, self.cfg.train
        return UserError(f"out of memory ({str(e).splitlines()[0][:100]}) with model {m.name} embed_dim={m.embed_dim} "
                         f"depth={m.depth} steps={m.steps} and train.batch_size={t.batch_size}; make one of them "
                         "smaller or set train.activation_checkpointing=true")

    # ---------------------------------------------------------------- building
    def setup(self, env, device, log, force=False):
        self.device = device
        self.build(env, device, log, force)
        self.steps_per_epoch = len(self.train_loader)
        self.opt = build_optimizer(self.model, self.cfg.train, device)
        self.sched = build_scheduler(self.opt, self.cfg.train, self.steps_per_epoch)
        self.build_depth(env)

    def setup_with(self, model, loader, opt, sched, device, depth: DepthSampler, batch_transform=None,
                   forward: Optional[Callable] = None) -> "ClassifyTask":
        """This task set up from parts built outside a run (:func:`train_one_epoch`): the model, its training
        loader, optimizer, schedule and depth sampler, what :meth:`setup` builds from the config otherwise."""
        self.model, self.train_loader, self.opt, self.sched, self.device = model, loader, opt, sched, device
        self.depth, self.batch_transform, self.forward = depth, batch_transform, forward
        self.steps_per_epoch = len(loader)
        return self

    def build(self, env, device, log, force):
        """The loaders, the batch transform, the config resolved from the data, the model (what fine-tuning
        builds otherwise)."""
        self.train_loader, self.test_loader, self.info = build_loaders(self.cfg, env=env, log=log)
        if self.info.num_classes < 2:  # one class trains to "accuracy 1.0" and learns nothing (a VAE may read one)
            raise UserError(f"{self.cfg.data.name}: {self.info.num_classes} class (an image folder: one folder a "
                            "class under train/); a classifier needs at least 2")
        self.val_loader = build_val_loader(self.cfg, self.train_loader, self.test_loader, env)
        self.cfg = cfg = resolve_model_config(self.cfg, self.info)
        m = cfg.model
        env.on_main(lambda: check_param_memory(  # rank 0 decides for every rank (no rank waits on a stopped one)
            lambda: ckpt_io.build_model_from_config(cfg), device, force=force,
            what=f"model {m.name} (embed_dim={m.embed_dim}, depth={m.depth}, steps={m.steps})"))
        self.model = ckpt_io.build_model_from_config(cfg).to(device)
        self.batch_transform = build_batch_transform(cfg.data, self.info.num_classes)

    def build_depth(self, env):
        """The depth sampler, and the generators of the task's own draws (``self.generators``: saved with
        last.pt under their names, restored on resume)."""
        tc = self.cfg.train
        # one depth per global batch: under several processes the draws come from a generator that
        # every rank seeds alike (a single process keeps drawing from the global RNG, as it always has)
        self.depth_gen = torch.Generator().manual_seed(tc.seed) if env.enabled else None
        self.generators = {"depth_rng": self.depth_gen} if env.enabled else {}
        try:
            self.depth = DepthSampler(tc.depth, self.model.nominal_steps, self.depth_gen, cap=self.model.core.limit)
            stage_weights(tc.supervision.weights, 1)
        except ValueError as e:
            raise UserError(str(e)) from None

    def restore(self, state, env):
        for key, gen in self.generators.items():
            if state.get(key) is not None:
                gen.set_state(state[key])

    def extra_state(self, env):
        return {key: gen.get_state() for key, gen in self.generators.items()}

    def prepare_training(self, env, device, log, force=False):
        self.forward = self._speed_and_scale(device, env)
        model, depth, tc = self.model, self.depth, self.cfg.train
        with torch.random.fork_rng(devices=[]):  # measuring must not move the run's random streams
            batch = dist_io.per_rank_batch(tc.batch_size, env.world_size) if env.enabled else tc.batch_size
            env.on_main(lambda: check_train_memory(model, (model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size),
                                                   depth.deepest, batch, device,
                                                   f"{depth.deepest:,} steps x batch {batch:,}", force=force))
        self.time_guard = None if force or env.enabled else self._time_guard  # ranks would not agree on a stop

    def _time_guard(self, epoch):
        c, tc, per_epoch = self.model.cfg, self.cfg.train, len(self.train_loader)
        return first_batches_guard(per_epoch, per_epoch * (tc.epochs - epoch), f"{c.img_size}x{c.img_size} px, "
                                   f"{self.model.patch_embed.num_patches:,} tokens an image, "
                                   f"{self.depth.deepest:,} steps, batch {tc.batch_size:,}")

    def _speed_and_scale(self, device, env) -> Optional[Callable]:
        """Activation checkpointing, regional compilation and the DDP wrapper, as the config asks;
        returns the training forward (the DDP module under several processes, else None)."""
        model, tc = self.model, self.cfg.train
        if tc.activation_checkpointing:
            try:
                model.cfg.core_cls.check_training(model.cfg, activation_checkpointing=True)
            except ValueError as e:
                raise UserError(str(e)) from None
            set_activation_checkpointing(model, True)
        if tc.compile:
            reason = compile_available(device)
            if reason:
                raise UserError(f"train.compile=true: {reason}; or set train.compile=false")
            compile_blocks(model)
        if not env.enabled:
            return None
        return dist_io.wrap_ddp(self.training_module(), device, self.may_skip_parameters())

    def training_module(self) -> nn.Module:
        """What DDP wraps under several processes: its forward is the one training calls."""
        return StepsForward(self.model)

    def may_skip_parameters(self) -> bool:
        """Parameters may get no gradient in a step (DDP's find_unused_parameters): stage heads not
        read out, blocks before a truncation, a depth that varies per batch."""
        tc = self.cfg.train
        return (getattr(self.model, "stage_heads", None) is not None or tc.depth.truncate > 0
                or tc.depth.schedule != "fixed")

    def header(self, env, device):
        cfg, model = self.cfg, self.model
        n_params = sum(p.numel() for p in model.parameters())
        val_note = (f" / {len(self.val_loader.dataset)} validation, best.pt chosen on it" if self.val_loader is not None
                    else "; no validation split (data.holdout), so no best.pt")
        where = f"device {device}" if not env.enabled else f"{env.world_size} processes ({device.type}, DDP)"
        size, tokens = model.cfg.img_size, model.patch_embed.num_patches
        line = (f"model {cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)} core, {n_params:,} params, "
                f"steps={model.nominal_steps}) on {cfg.data.name} ({len(self.train_loader.dataset)} train / "
                f"{len(self.test_loader.dataset)} test{val_note}; {size}x{size} px, {tokens:,} tokens an image), {where}")
        native = native_size(cfg.data.name)
        if native and size >= 4 * native:
            line += (f"\nnote: {cfg.data.name}'s {native} px images are upscaled {size / native:g}x to {size} px "
                     f"({tokens:,} tokens an image with patch_size={model.cfg.patch_size}); set data.img_size="
                     f"{native} (and a smaller model.patch_size) to train at the native size")
        if cfg.train.warmup_epochs >= cfg.train.epochs:
            line += (f"\nnote: train.warmup_epochs={cfg.train.warmup_epochs:g} >= train.epochs={cfg.train.epochs}: the "
                     f"learning rate never reaches train.lr={cfg.train.lr:g} (lower train.warmup_epochs)")
        return line

    def record(self):
        return {"data": data_record(self.cfg, self.info)}  # what using the model needs without its training data

    # ---------------------------------------------------------------- each epoch
    def start_epoch(self, epoch):
        self.epoch = epoch  # the epoch this pass trains (the dense task's evaluation reads it)
        set_epoch(self.train_loader, self.cfg.train.seed * 100_003 + epoch)  # the shuffle depends on (seed, epoch) only

    def batch_guard(self, epoch):
        watch, self.time_guard = self.time_guard, None  # the first epoch this process trains
        return watch and watch(epoch)

    def train_step(self, batch, amp):
        """The deep-supervised cross-entropy of one batch at a drawn depth (MixUp / CutMix first, if set)."""
        tc = self.cfg.train
        x, y = batch[0].to(self.device, non_blocking=True), batch[1].to(self.device, non_blocking=True)
        target = y
        if self.batch_transform is not None:
            x, target = self.batch_transform(x, y)
        k = self.depth()
        at = readout_steps(k, tc.supervision.stages)
        w = stage_weights(tc.supervision.weights, len(at))
        forward = self.model.forward_steps if self.forward is None else self.forward
        with amp():
            logits_at = forward(x, steps=k, at=at, grad_last=tc.depth.truncate or None)
        loss = supervised_loss(logits_at, target, w, tc.label_smoothing)
        hard = target.argmax(-1) if target.ndim == 2 else target
        means = {"loss": loss.detach()}
        if len(at) > 1:  # deep supervision: each readout's unweighted loss
            means["stages"] = _stage_losses(logits_at, target, tc.label_smoothing)
        return Step(loss, len(y), means, {"correct": (logits_at[-1].argmax(-1) == hard).sum()})

    def progress(self, totals):
        return {"loss": f"{totals.mean('loss'):.4f}", "acc": f"{totals.total('correct') / max(totals.n, 1):.4f}"}

    def epoch_metrics(self, totals, seconds):
        out = {"lr": self.sched.get_last_lr()[0], "train_loss": totals.mean("loss"),
               "train_acc": totals.total("correct") / max(totals.n, 1), "img_per_s": totals.n / seconds,
               "seconds": seconds}
        if "stages" in totals.sums:  # the unweighted loss of each readout, earliest first (runs without stages lack it)
            out["train_stage_losses"] = totals.means("stages")
        return out

    def evaluate(self, env):
        out, amp = {}, self.cfg.train.amp
        if self.val_loader is not None:
            with torch.random.fork_rng(devices=[]):  # validating must not move the run's random streams
                ev = evaluate(self.model, self.val_loader, self.device, amp=amp, env=env)
            out.update(val_loss=ev["loss"], val_acc=ev["accuracy"])
        ev = evaluate(self.model, self.test_loader, self.device, amp=amp, env=env)
        out.update(test_loss=ev["loss"], test_acc=ev["accuracy"])
        return out

    def epoch_line(self, metrics):
        if "test_acc" not in metrics:
            return None
        val = f"val_acc {metrics['val_acc']:.4f}  " if "val_acc" in metrics else ""
        return (f"epoch {metrics['epoch']:>3}/{self.cfg.train.epochs}  loss {metrics['train_loss']:.4f}  "
                f"train_acc {metrics['train_acc']:.4f}  {val}test_acc {metrics['test_acc']:.4f}  "
                f"{metrics['img_per_s']:.0f} img/s  {metrics['seconds']:.1f}s")

    def score(self, metrics, last):
        return metrics.get("val_acc")  # best.pt is chosen on the validation split; a run without one has no best.pt

    def best_files(self, record, metrics):
        return {"best.pt": {**record, "val_acc": metrics["val_acc"], "test_acc": metrics["test_acc"]}}


def train(cfg: RunConfig, out: Path, resume: bool = False, log=print,
          stop_after: Optional[int] = None, force: bool = False) -> Dict[str, Any]:
    """Train ``cfg`` into run directory ``out`` (or continue it from last.pt); returns the final metrics.

    With ``resume`` the overrides in ``cfg`` follow the rule of :mod:`recurvit.train.resume`;
    ``force`` starts even when the memory estimate (:mod:`recurvit.analysis.budget`) says it will
    not fit; ``stop_after=k`` ends after epoch k as an interruption would. Under torchrun every rank
    calls this with the same arguments (see :func:`recurvit.train.fit.fit`). Data with a per-pixel
    target (``data.name=mazes``) train as the dense task (:mod:`recurvit.tasks.dense`)."""
    task = data_task(cfg.data.name, ClassifyTask)(cfg)
    return fit(task, out, resume=resume, log=log, stop_after=stop_after, force=force)
