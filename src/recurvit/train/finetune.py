"""Fine-tune a trained run on another data set: full, head, lora, step_lora (and scratch, the baseline).

    finetune(src_run, "digits", method="lora", rank=4, overrides=["train.epochs=10"], out=Path(...))

The pretrained model keeps its input shape (img_size, in_chans): the target data are resized to the
model's img_size (``data.img_size`` defaults to it); a channel mismatch is a UserError. The head
(and any deep-supervision stage heads) is replaced by a fresh one for the target's classes.

Methods (trainable parameters):
- ``full``: everything.
- ``head``: the new classifier only (linear probe).
- ``lora``: rank-r adapters (layers/lora.py) on qkv, proj, fc1, fc2 of every block (bViT: the ONE
  shared block) + the new head. B starts at zero: training starts from the pretrained function.
- ``step_lora``: as ``lora`` but a separate adapter per step on the shared block (recurrent core, or
  an ODE core with a fixed-step method: one adapter per grid interval). Step-dependent computation
  for T x the lora adapter cost. Beyond the trained steps the last adapter is reused.
- ``scratch``: the same model config re-initialised, everything trained (the baseline a transfer is
  compared with at the same budget).

The run directory is like ``recurvit train``'s: config.yaml (the model config with the target's
num_classes, the target data and the train settings used), metrics.jsonl (one line per epoch),
best.pt / last.pt written atomically, and finetune.json (method, source, trainable / total params,
accuracy, wall and CPU seconds of training). Not resumable (runs are short); ``train.compile`` and
``train.activation_checkpointing`` are ignored here (checkpointing would recompute a step_lora
block in backward with the adapter index of the LAST step: the selector is read at call time).

Checkpoints and loading:
- full / head / scratch / lora: ``best.pt`` holds plain weights (lora: merged, W + (alpha/r) B A,
  the original state_dict keys), so ``recurvit eval|horizon|analyze RUN_DIR`` load it as any run.
  ``last.pt`` holds the training state (lora: unmerged adapters + an ``adapter`` entry).
- step_lora: T adapters cannot be merged into ONE shared weight. ``best.pt`` holds the compact
  model (shared block + adapters) and an ``adapter`` entry {method, rank, alpha, num_adapters,
  targets, calls_per_step}, which every command reads (``checkpoint.load_model_and_config``
  rebuilds the adapters). When the core is unrollable (a plain recurrent bViT: no step
  conditioning, no re-injection), ``unrolled.pt`` also holds the equivalent stack ViT with T
  merged block copies (same logits, T x block params).

Adapters themselves (where they go, merging, unrolling) are :mod:`recurvit.models.adapters`.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from ..config import DataConfig, RunConfig, as_dict, to_object, to_yaml
from ..errors import UserError
from ..models.adapters import adapter_spec, attach_adapters, plain_state, unroll_step_lora
from . import checkpoint as ckpt_io
from .rundir import write_atomic
from .tensorboard import EpochWriter

METHODS = ("full", "head", "lora", "step_lora", "scratch")


# ------------------------------------------------------------------------------- model surgery
def new_heads(model: nn.Module, num_classes: int) -> None:
    """Fresh classifier(s) for ``num_classes`` (trunc-normal 0.02, zero bias, as the model's init)."""
    def fresh(old: nn.Linear) -> nn.Linear:
        lin = nn.Linear(old.in_features, num_classes, device=old.weight.device, dtype=old.weight.dtype)
        nn.init.trunc_normal_(lin.weight, std=0.02)
        nn.init.zeros_(lin.bias)
        return lin

    model.head = fresh(model.head)
    if model.stage_heads is not None:
        model.stage_heads = nn.ModuleList([fresh(h) for h in model.stage_heads])
    model.num_classes = num_classes
    model.cfg.num_classes = num_classes


def head_parameters(model: nn.Module) -> List[nn.Parameter]:
    ps = list(model.head.parameters())
    if model.stage_heads is not None:
        ps += list(model.stage_heads.parameters())
    return ps


def prepare(model: nn.Module, method: str, rank: int = 4, alpha: Optional[float] = None) -> Optional[dict]:
    """Freeze / add adapters for ``method`` (in place) on a model whose heads are already new.
    Returns the adapter spec (None for full / head / scratch)."""
    if method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, got '{method}'")
    if method in ("full", "scratch"):
        for p in model.parameters():
            p.requires_grad_(True)
        return None
    for p in model.parameters():
        p.requires_grad_(False)
    spec = None
    if method in ("lora", "step_lora"):
        if rank < 1:
            raise UserError(f"--rank must be >= 1, got {rank}")
        try:
            spec = adapter_spec(model, method, rank, alpha)
        except ValueError as e:
            raise UserError(str(e)) from None
        attach_adapters(model, spec)  # new adapter parameters are trainable
    for p in head_parameters(model):
        p.requires_grad_(True)
    return spec


def trainable_counts(model: nn.Module) -> Dict[str, int]:
    return {"trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total_params": sum(p.numel() for p in model.parameters())}


# ------------------------------------------------------------------------------------ config
def target_config(src_cfg: RunConfig, data: str, overrides: List[str]) -> RunConfig:
    """The source run's config with the target data set (its defaults) and ``key=value`` overrides."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for ov in overrides:
        if "=" not in ov:
            raise UserError(f"override '{ov}' is not of the form key=value (e.g. train.epochs=5)")
    model_keys = sorted({ov.split("=")[0] for ov in overrides if ov.startswith("model.")})
    if model_keys:
        raise UserError(f"fine-tuning keeps the pretrained model; drop {', '.join(model_keys)} "
                        "(only data.* and train.* may change)")
    base = as_dict(src_cfg)
    base["data"] = as_dict(DataConfig(name=data))
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), base, OmegaConf.from_dotlist(list(overrides)))
    except (OmegaConfBaseException, ValueError, TypeError) as e:
        raise UserError(f"bad config (overrides): {str(e).splitlines()[0]}") from None
    return to_object(cfg)


# ----------------------------------------------------------------------------------- training
def finetune(src, data: str, method: str = "lora", rank: int = 4, alpha: Optional[float] = None,
             overrides: Optional[List[str]] = None, out: Optional[Path] = None, log=print) -> Dict[str, Any]:
    """Fine-tune run ``src`` on data set ``data`` with ``method`` into run directory ``out``."""
    from .checks import Diverged, check_train_config, how_to_go_on
    from .rundir import RunDir
    from .runtime import build_loaders, pick_device, seed_everything

    if method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, got '{method}'")
    src_path = ckpt_io.resolve_checkpoint(src)
    src_ckpt = ckpt_io.load_checkpoint(src_path)
    if src_ckpt.get("adapter"):
        raise UserError(f"{src_path} is a step_lora run (adapters that cannot be merged); fine-tune its source "
                        "run, or its unrolled.pt")
    model, src_cfg = ckpt_io.load_model_and_config(src_path)
    cfg = target_config(src_cfg, data, list(overrides or []))
    check_train_config(cfg)
    mc = model.cfg
    if cfg.data.img_size is None:
        cfg.data.img_size = mc.img_size  # resize the target to the pretrained input size
    out = Path(out) if out is not None else _default_out(src_path, data, method)
    seed_everything(cfg.train.seed)
    device = pick_device(cfg.train.device)
    train_loader, test_loader, info = build_loaders(cfg)
    if info.in_chans != mc.in_chans:
        raise UserError(f"{data} has {info.in_chans}-channel images but the pretrained model takes {mc.in_chans}; "
                        "fine-tune on data with the same channels")
    if info.img_size != mc.img_size:
        raise UserError(f"data.img_size={info.img_size} but the pretrained model takes {mc.img_size}x{mc.img_size} "
                        f"images; drop data.img_size (the target is then resized to {mc.img_size})")
    if method == "scratch":  # the same architecture, re-initialised (seeded as a `recurvit train` run)
        seed_everything(cfg.train.seed)
        model = ckpt_io.build_model_from_config(replace(cfg, model=replace(cfg.model, num_classes=info.num_classes)))
    new_heads(model, info.num_classes)
    cfg = replace(cfg, model=replace(cfg.model, num_classes=info.num_classes))
    spec = prepare(model, method, rank, alpha)
    try:
        with RunDir.create(out) as run, EpochWriter(out, cfg.train.tensorboard) as tb:  # once everything chosen works
            return _finetune(model, cfg, run, method, spec, src_path, data, train_loader, test_loader, info, device,
                             rank, log, tb)
    except Diverged as e:  # a fine-tune cannot be resumed: advise what is true of its (closed) directory
        raise how_to_go_on(e, out, resumable=False) from None


def _finetune(model, cfg, run, method, spec, src_path, data, train_loader, test_loader, info, device, rank, log,
              tb=None):
    from ..data import build_batch_transform
    from .loop import evaluate, train_one_epoch
    from .losses import DepthSampler, stage_weights
    from .optim import build_optimizer, build_scheduler
    from .runtime import build_val_loader, set_epoch

    out = run.path
    model.to(device)
    counts = trainable_counts(model)
    try:
        depth = DepthSampler(cfg.train.depth, model.nominal_steps, cap=model.core.limit)
        stage_weights(cfg.train.supervision.weights, 1)
    except ValueError as e:
        raise UserError(str(e)) from None
    opt = build_optimizer(model, cfg.train, device)
    sched = build_scheduler(opt, cfg.train, len(train_loader))
    batch_transform = build_batch_transform(cfg.data, info.num_classes)
    run.write_config(to_yaml(cfg))
    cfg_dict = as_dict(cfg)
    info_rec = {"method": method, "source": str(src_path), "data": data, "rank": rank if spec else None,
                **counts, "trainable_fraction": counts["trainable_params"] / counts["total_params"]}
    log(f"finetune {method}: {cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)} core, steps={model.nominal_steps}) from {src_path} "
        f"on {data} ({len(train_loader.dataset)} train / {len(test_loader.dataset)} test, {info.img_size}px); "
        f"trainable params {counts['trainable_params']:,} of {counts['total_params']:,}")

    best_acc, best_test, elapsed, cpu, metrics = -1.0, None, 0.0, 0.0, {}
    val_loader = build_val_loader(cfg, train_loader, test_loader)
    for epoch in range(cfg.train.epochs):
        set_epoch(train_loader, cfg.train.seed * 100_003 + epoch)  # the shuffle depends on (seed, epoch) only
        c0 = time.process_time()
        m = train_one_epoch(model, train_loader, opt, sched, device, cfg, depth, batch_transform, epoch)
        cpu += time.process_time() - c0  # CPU time of this process: robust to other jobs on a shared machine
        elapsed += m["seconds"]
        metrics = {"epoch": epoch + 1, "lr": sched.get_last_lr()[0], **m}
        last = epoch + 1 == cfg.train.epochs
        if last or (epoch + 1) % cfg.train.eval_every == 0:
            ev = evaluate(model, test_loader, device, amp=cfg.train.amp)
            metrics.update(test_loss=ev["loss"], test_acc=ev["accuracy"])
            if val_loader is not None:
                with torch.random.fork_rng(devices=[]):  # validating must not move the run's random streams
                    ev = evaluate(model, val_loader, device, amp=cfg.train.amp)
                metrics.update(val_loss=ev["loss"], val_acc=ev["accuracy"])
        metrics.update(train_seconds=elapsed, train_cpu_seconds=cpu, trainable_params=counts["trainable_params"])
        run.append_metrics(metrics)
        if tb is not None:
            tb.add_epoch(metrics)  # TensorBoard (train.tensorboard=true): a copy of the metrics line
        record = {"format": ckpt_io.FORMAT, "config": cfg_dict, "epoch": epoch + 1, "finetune": info_rec}
        # best.pt: the weights to use, in their deployable form: the epoch chosen on the validation split
        # (data.holdout), or the last epoch when there is none; never an epoch chosen on the test split
        score = metrics.get("val_acc") if val_loader is not None else (epoch + 1 if last else None)
        if score is not None and score > best_acc:
            best_acc, best_test = score, metrics["test_acc"]
            if method == "step_lora":
                best = {**record, "model": model.state_dict(), "adapter": spec}
                u_model = unroll_step_lora(model)
                if u_model is not None:
                    u_cfg = replace(cfg, model=replace(cfg.model, core="stack", depth=u_model.nominal_steps,
                                                       steps=u_model.nominal_steps, options={}))
                    run.save("unrolled.pt", {**record, "config": as_dict(u_cfg), "model": u_model.state_dict(),
                                             "test_acc": metrics["test_acc"]})
            else:
                best = {**record, "model": plain_state(model)}
            run.save("best.pt", {**best, "test_acc": metrics["test_acc"], "val_acc": metrics.get("val_acc")})
        last_rec = {**record, "model": model.state_dict(), "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(), "best_acc": best_acc, "train_seconds": elapsed,
                    "rng": ckpt_io.rng_state()}
        if spec is not None:
            last_rec["adapter"] = spec
        run.save("last.pt", last_rec)
        if "test_acc" in metrics:
            log(f"epoch {epoch + 1:>3}/{cfg.train.epochs}  loss {m['train_loss']:.4f}  train_acc {m['train_acc']:.4f}  "
                f"test_acc {metrics['test_acc']:.4f}  {m['seconds']:.1f}s")
    summary = {**info_rec, "run_dir": str(out), "epochs": cfg.train.epochs, "lr": cfg.train.lr,
               "test_acc": metrics.get("test_acc"), "best_acc": best_test, "train_seconds": elapsed,
               "train_cpu_seconds": cpu}
    write_atomic(out / "finetune.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _default_out(src: Path, data: str, method: str) -> Path:
    run = src.parent if src.is_file() else src
    base = run.parent / f"{run.name}-ft-{data}-{method}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out
