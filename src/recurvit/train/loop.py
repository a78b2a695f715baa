"""The training loop: train_one_epoch / evaluate / train.

The loop never knows which core it drives: it asks the model for logits at readout steps
(``forward_steps(..., at=...)``) and weighs them with ``losses.supervised_loss``.

Speed and scale (issue 6): under torchrun the same ``train`` runs data-parallel (DDP; see
``distributed.py`` for the conventions: global batch, sample order, rank-0 I/O);
``train.compile=true`` compiles each block (regional ``torch.compile``: no recompilation when the
step count changes); ``train.activation_checkpointing=true`` recomputes every block application
in backward; bf16 autocast is on by default on CUDA and AdamW is fused there.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ..config import RunConfig, as_dict, to_yaml
from ..errors import UserError
from . import checkpoint as ckpt_io
from . import distributed as dist_io
from ..export.preprocessing import data_record
from .budget import check_param_memory, check_train_memory
from .checks import Diverged, check_train_config, how_to_go_on, out_of_memory
from .losses import DepthSampler, readout_steps, soft_cross_entropy, stage_weights, supervised_loss
from .optim import build_optimizer, build_scheduler, follow_config, optimizer_step
from .resume import check_resume, config_changes
from .rundir import RunDir, open_run
from .tensorboard import EpochWriter
from .runtime import (autocast, build_loaders, build_val_loader, pick_device, resolve_model_config, seed_everything, set_epoch,
                      show_progress)

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
               disable=not show_progress(progress))
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


# -------------------------------------------------------------------------------- training
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
                    env: dist_io.DistEnv = dist_io.SINGLE) -> Dict[str, float]:
    """One pass over ``loader``. ``forward`` (default ``model.forward_steps``) is the DDP-wrapped
    forward under several processes; the returned figures are then sums over all ranks."""
    model.train()
    forward = model.forward_steps if forward is None else forward
    tc = cfg.train
    weights = stage_weights(tc.supervision.weights, tc.supervision.stages if tc.supervision.stages > 1 else 1)
    n, loss_sum, correct, t0 = 0, 0.0, 0, time.perf_counter()
    stage_sums, stage_n = [], []  # deep supervision: each readout's loss (summed x batch) and images
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{tc.epochs}", leave=False,
               disable=not (show_progress(tc.progress) and env.is_main), dynamic_ncols=True)
    for x, y in bar:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        target = y
        if batch_transform is not None:
            x, target = batch_transform(x, y)
        k = depth()
        at = readout_steps(k, tc.supervision.stages)
        w = weights if len(at) == len(weights) else stage_weights(tc.supervision.weights, len(at))
        with autocast(device, tc.amp):
            logits_at = forward(x, steps=k, at=at, grad_last=tc.depth.truncate or None)
        loss = supervised_loss(logits_at, target, w, tc.label_smoothing)
        b = len(y)
        stages = _stage_losses(logits_at, target, tc.label_smoothing) if len(at) > 1 else []
        hard = target.argmax(-1) if target.ndim == 2 else target
        if env.enabled:  # global figures of this step; every rank sees the same (divergence stops all)
            step_loss, step_correct, step_n, *stages = env.all_reduce_sum(
                [loss.detach() * b, (logits_at[-1].argmax(-1) == hard).sum(), b, *(s * b for s in stages)], device)
            step_loss /= max(step_n, 1)
            stages = [s / max(step_n, 1) for s in stages]
        else:
            step_loss, step_correct, step_n = None, None, b
        if not torch.isfinite(loss if step_loss is None else torch.tensor(step_loss)):
            value = loss.item() if step_loss is None else step_loss
            raise Diverged(value, epoch + 1, tc)
        optimizer_step(model, opt, sched, loss, tc.grad_clip)
        if step_loss is None:
            n += b
            loss_sum += loss.item() * b
            correct += (logits_at[-1].argmax(-1) == hard).sum().item()
        else:
            n += int(round(step_n))
            loss_sum += step_loss * step_n
            correct += int(round(step_correct))
        for i, s in enumerate(stages):
            if i == len(stage_sums):
                stage_sums.append(0.0)
                stage_n.append(0)
            stage_sums[i] += float(s) * step_n
            stage_n[i] += step_n
        bar.set_postfix(loss=f"{loss_sum / n:.3f}", acc=f"{correct / n:.3f}",
                        img_s=f"{n / (time.perf_counter() - t0):.0f}")
    secs = time.perf_counter() - t0
    out = {"train_loss": loss_sum / max(n, 1), "train_acc": correct / max(n, 1), "img_per_s": n / secs, "seconds": secs}
    if stage_sums:  # the unweighted loss of each readout, earliest first (a new key: runs without stages lack it)
        out["train_stage_losses"] = [s / max(k, 1) for s, k in zip(stage_sums, stage_n)]
    return out


@torch.no_grad()
def _stage_losses(logits_at: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> list:
    """Each readout's loss (the terms ``supervised_loss`` weighs), as floats."""
    return torch.stack([soft_cross_entropy(lg, target, label_smoothing) for lg in logits_at]).tolist()


def train(cfg: RunConfig, out: Path, resume: bool = False, log=print,
          stop_after: Optional[int] = None, force: bool = False) -> Dict[str, float]:
    """Train ``cfg`` into run directory ``out`` (or continue it from last.pt); returns final metrics.

    The run directory is owned through :class:`~recurvit.train.rundir.RunDir` (created, locked for
    the life of the run, cleaned up if nothing was written). With ``resume`` the overrides in
    ``cfg`` follow the rule of :mod:`recurvit.train.resume`.

    ``force`` starts even when the memory estimate (:mod:`recurvit.train.budget`) says it will not fit.

    ``stop_after=k`` ends the run after epoch k as an interruption would (last.pt written), so a
    later ``resume=True`` continues it; used to test that resuming changes nothing.

    Under torchrun (``WORLD_SIZE`` > 1) or inside an initialised process group every rank calls
    this with the same arguments and the run is data-parallel (see ``distributed.py``); rank 0
    alone writes ``out`` and logs, and every rank returns the same global metrics.
    """
    with dist_io.session(cfg.train.device) as env:
        out = Path(env.broadcast(str(out)))  # rank 0's run directory (a default one carries a time stamp)
        log = log if env.is_main else _quiet
        check_train_config(cfg)
        run = env.on_main(lambda: open_run(out, resume, log=log)) or RunDir(out, created=False, owner=False)
        try:
            with run, EpochWriter(run.path, cfg.train.tensorboard and env.is_main) as tb:
                resume = env.broadcast(run.has_checkpoint()) if resume else False
                try:
                    return _train(cfg, run, resume, log, stop_after, env, tb, force)
                except (torch.OutOfMemoryError, MemoryError) as e:
                    raise out_of_memory(cfg, e) from None
                except RuntimeError as e:
                    if "allocate" not in str(e):
                        raise
                    raise out_of_memory(cfg, e) from None
        except Diverged as e:  # the directory is closed now (removed if it held nothing): advise what is true of it
            raise how_to_go_on(e, run.path) from None
        except ckpt_io.DiskFull as e:  # a checkpoint or metrics write found the disk full: the run can go on from it
            if not run.path.is_dir():
                raise
            raise e.then(f"--resume {run.path}") from None


def _quiet(*args, **kwargs) -> None:
    return None


def _train(cfg: RunConfig, run: RunDir, resume: bool, log, stop_after: Optional[int],
           env: dist_io.DistEnv, tb: Optional[EpochWriter] = None, force: bool = False) -> Dict[str, float]:
    out = run.path
    state = run.load_last() if resume else None  # every rank resumes from it
    if state is not None:
        used = as_dict(ckpt_io.config_from_checkpoint(state))
        log(check_resume(str(out), state["epoch"], config_changes(used, as_dict(cfg))))
    seed_everything(cfg.train.seed)
    device = dist_io.rank_device(env, pick_device(cfg.train.device))

    from ..data import build_batch_transform

    train_loader, test_loader, info = build_loaders(cfg, env=env, log=log)
    val_loader = build_val_loader(cfg, train_loader, test_loader, env)
    cfg = resolve_model_config(cfg, info)
    m = cfg.model
    env.on_main(lambda: check_param_memory(  # rank 0 decides for every rank (no rank waits on a stopped one)
        lambda: ckpt_io.build_model_from_config(cfg), device, force=force,
        what=f"model {m.name} (embed_dim={m.embed_dim}, depth={m.depth}, steps={m.steps})"))
    model = build_model(cfg, device)
    opt = build_optimizer(model, cfg.train, device)
    sched = build_scheduler(opt, cfg.train, len(train_loader))
    # one depth per global batch: under several processes the draws come from a generator that
    # every rank seeds alike (a single process keeps drawing from the global RNG, as it always has)
    depth_gen = torch.Generator().manual_seed(cfg.train.seed) if env.enabled else None
    try:
        depth = DepthSampler(cfg.train.depth, model.nominal_steps, depth_gen, cap=model.core.limit)
        stage_weights(cfg.train.supervision.weights, 1)
    except ValueError as e:
        raise UserError(str(e)) from None
    batch_transform = build_batch_transform(cfg.data, info.num_classes)

    start_epoch, best_acc, elapsed = 0, -1.0, 0.0
    if state is not None:
        ckpt_io.load_state(model, state["model"], out / "last.pt")
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        follow_config(opt, sched, cfg.train, len(train_loader))
        start_epoch, best_acc, elapsed = state["epoch"], state["best_acc"], state.get("train_seconds", 0.0)
        _restore_rng(state, env, cfg.train.seed, depth_gen)
        run.truncate_metrics(start_epoch)
    elif env.enabled and env.rank > 0:
        torch.manual_seed(dist_io.rank_seed(cfg.train.seed, env.rank))  # own dropout / augmentation draws
    forward = _speed_and_scale(model, cfg, device, env)
    with torch.random.fork_rng(devices=[]):  # measuring must not move the run's random streams
        batch = dist_io.per_rank_batch(cfg.train.batch_size, env.world_size) if env.enabled else cfg.train.batch_size
        env.on_main(lambda: check_train_memory(model, (model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size),
                                               depth.deepest, batch, device, f"{depth.deepest:,} steps x batch {batch:,}",
                                               force=force))
    run.write_config(to_yaml(cfg))  # what the run actually uses, overrides of a resume included
    cfg_dict = as_dict(cfg)
    data_info = data_record(cfg, info)  # what using the model needs without its training data

    n_params = sum(p.numel() for p in model.parameters())
    val_note = (f" / {len(val_loader.dataset)} validation, best.pt chosen on it" if val_loader is not None
                else "; no validation split (data.holdout), so no best.pt")
    where = f"device {device}" if not env.enabled else f"{env.world_size} processes ({device.type}, DDP)"
    log(f"model {cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)} core, {n_params:,} params, "
        f"steps={model.nominal_steps}) on {cfg.data.name} ({len(train_loader.dataset)} train / "
        f"{len(test_loader.dataset)} test{val_note}), {where}")
    if cfg.train.warmup_epochs >= cfg.train.epochs:
        log(f"note: train.warmup_epochs={cfg.train.warmup_epochs:g} >= train.epochs={cfg.train.epochs}: the learning "
            f"rate never reaches train.lr={cfg.train.lr:g} (lower train.warmup_epochs)")
    metrics: Dict[str, float] = (state or {}).get("metrics") or {}
    if state is not None and not metrics:  # a checkpoint from before last.pt kept its metrics: the logged line
        metrics = next(iter(run.read_metrics()[-1:]), {})
    for epoch in range(start_epoch, cfg.train.epochs):
        set_epoch(train_loader, cfg.train.seed * 100_003 + epoch)  # the shuffle depends on (seed, epoch) only
        m = train_one_epoch(model, train_loader, opt, sched, device, cfg, depth, batch_transform, epoch,
                            forward=forward, env=env)
        elapsed += m["seconds"]
        metrics = {"epoch": epoch + 1, "lr": sched.get_last_lr()[0], **m}
        last = epoch + 1 == cfg.train.epochs
        if last or (epoch + 1) % cfg.train.eval_every == 0:
            if val_loader is not None:
                with torch.random.fork_rng(devices=[]):  # validating must not move the run's random streams
                    ev = evaluate(model, val_loader, device, amp=cfg.train.amp, env=env)
                metrics.update(val_loss=ev["loss"], val_acc=ev["accuracy"])
            ev = evaluate(model, test_loader, device, amp=cfg.train.amp, env=env)
            metrics.update(test_loss=ev["loss"], test_acc=ev["accuracy"])
        metrics["train_seconds"] = elapsed
        rng = ckpt_io.rng_state()
        extra = {}
        if env.enabled:  # a collective: every rank takes part, rank 0 writes
            extra = {"rng_ranks": env.gather(rng), "world_size": env.world_size, "depth_rng": depth_gen.get_state()}
        # best.pt is chosen on the validation split (data.holdout); a run without one has no best.pt
        best = "val_acc" in metrics and metrics["val_acc"] > best_acc
        best_acc = metrics["val_acc"] if best else best_acc
        run.append_metrics(metrics)
        if tb is not None:
            tb.add_epoch(metrics)  # TensorBoard (train.tensorboard=true, rank 0): a copy of the metrics line
        record = {"format": ckpt_io.FORMAT, "config": cfg_dict, "model": model.state_dict(), "epoch": epoch + 1,
                  "data": data_info}
        if best:
            run.save("best.pt", {**record, "val_acc": best_acc, "test_acc": metrics["test_acc"]})
        run.save("last.pt", {**record, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                             "best_acc": best_acc, "train_seconds": elapsed, "rng": rng, "metrics": metrics, **extra})
        if "test_acc" in metrics:
            val = f"val_acc {metrics['val_acc']:.4f}  " if "val_acc" in metrics else ""
            log(f"epoch {epoch + 1:>3}/{cfg.train.epochs}  loss {m['train_loss']:.4f}  train_acc {m['train_acc']:.4f}  "
                f"{val}test_acc {metrics['test_acc']:.4f}  {m['img_per_s']:.0f} img/s  {m['seconds']:.1f}s")
        if stop_after is not None and epoch + 1 >= stop_after and not last:
            log(f"stopped after epoch {epoch + 1}; continue with `recurvit train --resume {out}`")
            env.barrier()  # last.pt is on disk before any rank returns
            return metrics
    env.barrier()
    return metrics


def build_model(cfg: RunConfig, device: torch.device) -> nn.Module:
    """The run's model on ``device``."""
    return ckpt_io.build_model_from_config(cfg).to(device)


def _speed_and_scale(model: nn.Module, cfg: RunConfig, device: torch.device,
                     env: dist_io.DistEnv) -> Optional[Callable]:
    """Activation checkpointing, regional compilation and the DDP wrapper, as the config asks.

    Returns the training forward (the DDP module under several processes, else None: the
    model's own ``forward_steps``)."""
    from ..models.speed import compile_available, compile_blocks, set_activation_checkpointing

    tc = cfg.train
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
    from torch.nn.parallel import DistributedDataParallel as DDP

    # parameters that may get no gradient in a step: stage heads not read out, blocks before a
    # truncation, a depth that varies per batch
    find_unused = (getattr(model, "stage_heads", None) is not None or tc.depth.truncate > 0
                   or tc.depth.schedule != "fixed")
    return DDP(StepsForward(model), device_ids=[device.index] if device.type == "cuda" else None,
               find_unused_parameters=find_unused)


def _restore_rng(state: dict, env: dist_io.DistEnv, seed: int, depth_gen: Optional[torch.Generator]) -> None:
    """The RNG state of this rank at the checkpoint (each rank's own when the world size is unchanged)."""
    ranks = state.get("rng_ranks")
    if env.enabled and ranks is not None and len(ranks) == env.world_size:
        ckpt_io.set_rng_state(ranks[env.rank])
    else:
        ckpt_io.set_rng_state(state.get("rng"))
        if env.enabled and env.rank > 0:  # a new world size: fresh, distinct streams
            torch.manual_seed(dist_io.rank_seed(seed + state["epoch"], env.rank))
    if depth_gen is not None and state.get("depth_rng") is not None:
        depth_gen.set_state(state["depth_rng"])
