"""The training loop: train_one_epoch / evaluate, run directories, resume.

The loop never knows which core it drives: it asks the model for logits at readout steps
(``forward_steps(..., at=...)``) and weighs them with ``losses.supervised_loss``.
"""
from __future__ import annotations

import json
import random
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..config import RunConfig, as_dict, save_config
from ..errors import UserError
from . import checkpoint as ckpt_io
from .losses import DepthSampler, readout_steps, soft_cross_entropy, stage_weights, supervised_loss
from .optim import build_optimizer, build_scheduler


# ---------------------------------------------------------------------------- setup helpers
def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device={name} but CUDA is not available; use train.device=cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"train.device='{name}' is not a device; use auto, cpu, cuda or cuda:N") from None


def autocast(device: torch.device, amp: str):
    """bf16 autocast: on by default on CUDA (amp=auto), opt-in on CPU (amp=bf16)."""
    if amp not in ("auto", "bf16", "off"):
        raise UserError(f"train.amp must be auto, bf16 or off, got '{amp}'")
    on = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if on else nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def resolve_model_config(cfg: RunConfig, info) -> RunConfig:
    """The model follows the data set (img_size, in_chans, num_classes) unless set explicitly."""
    m = cfg.model
    m = replace(m,
                img_size=m.img_size if m.img_size is not None else info.img_size,
                in_chans=m.in_chans if m.in_chans is not None else info.in_chans,
                num_classes=m.num_classes if m.num_classes is not None else info.num_classes)
    if cfg.train.supervision.per_stage_heads and m.stage_heads is None:
        m = replace(m, stage_heads=cfg.train.supervision.stages)
    return replace(cfg, model=m)


def build_loaders(cfg: RunConfig, epoch_seed: int = 0) -> Tuple[DataLoader, DataLoader, object]:
    from ..data import build_datasets

    train_set, test_set, info = build_datasets(cfg.data)
    kw = dict(num_workers=cfg.data.num_workers, pin_memory=torch.cuda.is_available(),
              persistent_workers=cfg.data.num_workers > 0)
    train_loader = DataLoader(train_set, batch_size=cfg.train.batch_size, shuffle=True, drop_last=False,
                              generator=torch.Generator().manual_seed(epoch_seed), **kw)
    test_loader = DataLoader(test_set, batch_size=max(256, cfg.train.batch_size), shuffle=False, **kw)
    return train_loader, test_loader, info


# ------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable, device: torch.device, steps: Optional[int] = None,
             amp: str = "auto") -> Dict[str, float]:
    """Test loss and accuracy at ``steps`` (default: the trained depth)."""
    model.eval()
    n, loss_sum, correct = 0, 0.0, 0
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(x, steps=steps)
        loss_sum += soft_cross_entropy(logits, y).item() * len(y)
        correct += (logits.argmax(-1) == y).sum().item()
        n += len(y)
    return {"loss": loss_sum / max(n, 1), "accuracy": correct / max(n, 1), "n": n}


# -------------------------------------------------------------------------------- training
def train_one_epoch(model, loader, opt, sched, device, cfg: RunConfig, depth: DepthSampler,
                    batch_transform=None, epoch: int = 0) -> Dict[str, float]:
    model.train()
    tc = cfg.train
    weights = stage_weights(tc.supervision.weights, tc.supervision.stages if tc.supervision.stages > 1 else 1)
    n, loss_sum, correct, t0 = 0, 0.0, 0, time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{tc.epochs}", leave=False, disable=not tc.progress, dynamic_ncols=True)
    for x, y in bar:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        target = y
        if batch_transform is not None:
            x, target = batch_transform(x, y)
        k = depth()
        at = readout_steps(k, tc.supervision.stages)
        w = weights if len(at) == len(weights) else stage_weights(tc.supervision.weights, len(at))
        with autocast(device, tc.amp):
            logits_at = model.forward_steps(x, steps=k, at=at, grad_last=tc.depth.truncate or None)
        loss = supervised_loss(logits_at, target, w, tc.label_smoothing)
        if not torch.isfinite(loss):
            raise UserError(f"training diverged (loss={loss.item()}) at epoch {epoch + 1}; lower train.lr or raise train.grad_clip")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if tc.grad_clip > 0:
            nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        sched.step()
        b = len(y)
        n += b
        loss_sum += loss.item() * b
        hard = target.argmax(-1) if target.ndim == 2 else target
        correct += (logits_at[-1].argmax(-1) == hard).sum().item()
        bar.set_postfix(loss=f"{loss_sum / n:.3f}", acc=f"{correct / n:.3f}",
                        img_s=f"{n / (time.perf_counter() - t0):.0f}")
    secs = time.perf_counter() - t0
    return {"train_loss": loss_sum / max(n, 1), "train_acc": correct / max(n, 1), "img_per_s": n / secs, "seconds": secs}


def prepare_run_dir(out: Path, resume: bool) -> None:
    if resume:
        if not (out / "last.pt").is_file():
            raise UserError(f"cannot resume: {out / 'last.pt'} not found")
        return
    if out.exists() and any(out.iterdir()):
        raise UserError(f"run directory {out} already exists and is not empty; choose another --out or pass --resume {out}")
    out.mkdir(parents=True, exist_ok=True)


def default_run_dir(cfg: RunConfig, root: str = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{cfg.data.name}-{cfg.model.name}-{stamp}"
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out


def train(cfg: RunConfig, out: Path, resume: bool = False, log=print,
          stop_after: Optional[int] = None) -> Dict[str, float]:
    """Train ``cfg`` into run directory ``out`` (or continue it from last.pt); returns final metrics.

    ``stop_after=k`` ends the run after epoch k as an interruption would (last.pt written), so a
    later ``resume=True`` continues it; used to test that resuming changes nothing.
    """
    out = Path(out)
    prepare_run_dir(out, resume)
    state = ckpt_io.load_checkpoint(out / "last.pt") if resume else None
    seed_everything(cfg.train.seed)
    device = pick_device(cfg.train.device)

    from ..data import build_batch_transform

    train_loader, test_loader, info = build_loaders(cfg)
    cfg = resolve_model_config(cfg, info)
    model = ckpt_io.build_model_from_config(cfg).to(device)
    opt = build_optimizer(model, cfg.train, device)
    sched = build_scheduler(opt, cfg.train, len(train_loader))
    try:
        depth = DepthSampler(cfg.train.depth, model.nominal_steps, cap=model.core.max_steps)
        stage_weights(cfg.train.supervision.weights, 1)
    except ValueError as e:
        raise UserError(str(e)) from None
    if cfg.train.supervision.stages < 1:
        raise UserError("train.supervision.stages must be >= 1")
    batch_transform = build_batch_transform(cfg.data, info.num_classes)

    start_epoch, best_acc, elapsed = 0, -1.0, 0.0
    if state is not None:
        ckpt_io.load_state(model, state["model"], out / "last.pt")
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        start_epoch, best_acc, elapsed = state["epoch"], state["best_acc"], state.get("train_seconds", 0.0)
        ckpt_io.set_rng_state(state.get("rng"))
        _truncate_metrics(out / "metrics.jsonl", start_epoch)
    save_config(cfg, out / "config.yaml")
    cfg_dict = as_dict(cfg)

    n_params = sum(p.numel() for p in model.parameters())
    log(f"model {cfg.model.name} ({cfg.model.core or 'preset'} core, {n_params:,} params, steps={model.nominal_steps}) "
        f"on {cfg.data.name} ({len(train_loader.dataset)} train / {len(test_loader.dataset)} test), device {device}")
    metrics: Dict[str, float] = {}
    for epoch in range(start_epoch, cfg.train.epochs):
        train_loader.generator.manual_seed(cfg.train.seed * 100_003 + epoch)  # the shuffle depends on (seed, epoch) only
        m = train_one_epoch(model, train_loader, opt, sched, device, cfg, depth, batch_transform, epoch)
        elapsed += m["seconds"]
        metrics = {"epoch": epoch + 1, "lr": sched.get_last_lr()[0], **m}
        last = epoch + 1 == cfg.train.epochs
        if last or (epoch + 1) % cfg.train.eval_every == 0:
            ev = evaluate(model, test_loader, device, amp=cfg.train.amp)
            metrics.update(test_loss=ev["loss"], test_acc=ev["accuracy"])
        metrics["train_seconds"] = elapsed
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        record = {"format": ckpt_io.FORMAT, "config": cfg_dict, "model": model.state_dict(), "epoch": epoch + 1}
        if "test_acc" in metrics and metrics["test_acc"] > best_acc:
            best_acc = metrics["test_acc"]
            ckpt_io.save_atomic({**record, "test_acc": best_acc}, out / "best.pt")
        ckpt_io.save_atomic({**record, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                             "best_acc": best_acc, "train_seconds": elapsed, "rng": ckpt_io.rng_state()},
                            out / "last.pt")
        if "test_acc" in metrics:
            log(f"epoch {epoch + 1:>3}/{cfg.train.epochs}  loss {m['train_loss']:.4f}  train_acc {m['train_acc']:.4f}  "
                f"test_acc {metrics['test_acc']:.4f}  {m['img_per_s']:.0f} img/s  {m['seconds']:.1f}s")
        if stop_after is not None and epoch + 1 >= stop_after and not last:
            log(f"stopped after epoch {epoch + 1}; continue with `recurvit train --resume {out}`")
            return metrics
    if not metrics:  # resumed a finished run
        lines = (out / "metrics.jsonl").read_text().splitlines()
        metrics = json.loads(lines[-1]) if lines else {}
    return metrics


def _truncate_metrics(path: Path, epochs: int) -> None:
    """Drop metric lines written after the checkpoint we resume from (a crash between the two)."""
    if not path.exists():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    keep = [ln for ln in lines if json.loads(ln).get("epoch", 0) <= epochs]
    path.write_text("".join(ln + "\n" for ln in keep))
