"""Fine-tuning: classification from a trained run, after a model-preparation step.

    finetune(src_run, "digits", method="lora", rank=4, overrides=["train.epochs=10"], out=Path(...))
    finetune_resume(run_dir)                       # a killed fine-tune goes on from its last.pt

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

Training is :class:`~recurvit.tasks.classify.ClassifyTask`'s, through the one loop (resume, DDP,
TensorBoard, best/last): the run directory holds config.yaml (the model config with the target's
num_classes, the target data and the train settings used), metrics.jsonl, best.pt / last.pt and
finetune.json (the recipe from the start: method, source, data, rank, alpha; once the last epoch
is done also trainable / total params, accuracy, wall and CPU seconds). ``train.compile`` and
``train.activation_checkpointing`` apply as in ``recurvit train`` (step_lora included: the core
tells the block its step, so a recomputed block uses the same adapter).

Checkpoints and loading:
- full / head / scratch / lora: ``best.pt`` holds plain weights (lora: merged, W + (alpha/r) B A,
  the original state_dict keys), so ``recurvit eval|horizon|analyze RUN_DIR`` load it as any run.
  It is the epoch chosen on the validation split (``data.holdout``), else the last epoch.
  ``last.pt`` holds the training state (lora: unmerged adapters + an ``adapter`` entry).
- step_lora: T adapters cannot be merged into ONE shared weight. ``best.pt`` holds the compact
  model (shared block + adapters) and an ``adapter`` entry {method, rank, alpha, num_adapters,
  targets, calls_per_step}, which every command reads (``recurvit.run.load.load``
  rebuilds the adapters). When the core is unrollable (a plain recurrent bViT: no step
  conditioning, no re-injection), ``unrolled.pt`` also holds the equivalent stack ViT with T
  merged block copies (same logits, T x block params).

Adapters themselves (where they go, merging, unrolling) are :mod:`recurvit.models.adapters`.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch.nn as nn

from ...config import as_dict, DataConfig, load_config, RunConfig, to_object
from ...data import build_batch_transform
from ...errors import UserError
from ...models.adapters import adapter_spec, attach_adapters, plain_state, unroll_step_lora
from ...run import checkpoint as ckpt_io
from ...run.atomic import write_atomic
from ...run.device import seed_everything
from ...run.load import load
from ...run.loaders import build_loaders, build_val_loader
from ...run.rundir import never_trained, RunDir
from ...train.fit import fit
from .task import ClassifyTask

RECIPE = "finetune.json"  # the fine-tune's recipe (written before epoch 1) and, once done, its summary


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
        width = model.cfg.embed_dim  # every adapted weight (qkv, proj, fc1, fc2) has this many rows or columns
        if rank > width:  # no more expressive than full rank, at more parameters (--rank 100000: 153.6M on a 115k model)
            raise UserError(f"--rank {rank} is more than the rank of the adapted weights ({width}, the model's width); "
                            f"choose --rank <= {width}, or --method full")
        if alpha is not None and not (math.isfinite(alpha) and alpha > 0):
            raise UserError(f"--alpha must be a finite number > 0 (the update is alpha / rank * B A), got {alpha}")
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
    import yaml
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
    except (OmegaConfBaseException, ValueError, TypeError, yaml.YAMLError) as e:  # YAML: a !!python tag
        raise UserError(f"bad config (overrides): {str(e).splitlines()[0]}") from None
    return to_object(cfg)


# ------------------------------------------------------------------------------------ the task
class FinetuneTask(ClassifyTask):
    """Classification whose model is a trained run's, prepared by ``method`` (see the module docstring)."""

    def __init__(self, cfg: RunConfig, method: str, source: Path, data: str, rank: int = 4,
                 alpha: Optional[float] = None):
        super().__init__(cfg)
        if method not in METHODS:
            raise UserError(f"--method must be one of {', '.join(METHODS)}, got '{method}'")
        self.method, self.source, self.data, self.rank, self.alpha = method, Path(source), data, rank, alpha
        self.spec: Optional[dict] = None

    def recipe(self) -> Dict[str, Any]:
        return {"method": self.method, "source": str(self.source), "data": self.data, "rank": self.rank,
                "alpha": self.alpha}

    def build(self, env, device, log, force):
        """The source run's model, the target's loaders (resized to the model's input), new heads, the method."""
        model = load(self.source).model
        seed_everything(self.cfg.train.seed)  # what follows draws as if the source had been loaded before seeding
        cfg, mc = self.cfg, model.cfg
        if cfg.data.img_size is None:
            cfg.data.img_size = mc.img_size  # resize the target to the pretrained input size
        self.train_loader, self.test_loader, self.info = build_loaders(cfg, env=env)
        info = self.info
        if info.in_chans != mc.in_chans:
            raise UserError(f"{self.data} has {info.in_chans}-channel images but the pretrained model takes "
                            f"{mc.in_chans}; fine-tune on data with the same channels")
        if info.img_size != mc.img_size:
            raise UserError(f"data.img_size={info.img_size} but the pretrained model takes {mc.img_size}x{mc.img_size} "
                            f"images; drop data.img_size (the target is then resized to {mc.img_size})")
        self.cfg = cfg = replace(cfg, model=replace(cfg.model, num_classes=info.num_classes))
        if self.method == "scratch":  # the same architecture, re-initialised (seeded as a `recurvit train` run)
            seed_everything(cfg.train.seed)
            model = ckpt_io.build_model_from_config(cfg)
        new_heads(model, info.num_classes)
        self.spec = prepare(model, self.method, self.rank, self.alpha)
        self.model = model.to(device)
        self.counts = trainable_counts(model)
        self.val_loader = build_val_loader(cfg, self.train_loader, self.test_loader, env)
        self.batch_transform = build_batch_transform(cfg.data, info.num_classes)

    def run_files(self):
        return {RECIPE: json.dumps({**self.recipe(), **self.counts}, indent=2) + "\n"}

    def header(self, env, device):
        c, cfg, model = self.counts, self.cfg, self.model
        return (f"finetune {self.method}: {cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)} core, "
                f"steps={model.nominal_steps}) from {self.source} on {self.data} ({len(self.train_loader.dataset)} "
                f"train / {len(self.test_loader.dataset)} test, {self.info.img_size}px); trainable params "
                f"{c['trainable_params']:,} of {c['total_params']:,}")

    def info_record(self) -> Dict[str, Any]:
        c = self.counts
        return {"method": self.method, "source": str(self.source), "data": self.data,
                "rank": self.rank if self.spec else None, **c,
                "trainable_fraction": c["trainable_params"] / c["total_params"]}

    def record(self):
        return {**super().record(), "finetune": self.info_record()}

    def extra_state(self, env):
        return {**super().extra_state(env), **({"adapter": self.spec} if self.spec is not None else {})}

    def epoch_metrics(self, totals, seconds):
        return {**super().epoch_metrics(totals, seconds), "trainable_params": self.counts["trainable_params"]}

    def score(self, metrics, last):
        # best.pt: the weights to use, in their deployable form: the epoch chosen on the validation split
        # (data.holdout), or the last epoch when there is none; never an epoch chosen on the test split
        if self.val_loader is not None:
            return metrics.get("val_acc")
        return float(metrics["epoch"]) if last else None

    def best_files(self, record, metrics):
        accs = {"test_acc": metrics["test_acc"], "val_acc": metrics.get("val_acc")}
        if self.method != "step_lora":
            return {"best.pt": {**record, "model": plain_state(self.model), **accs}}
        files = {"best.pt": {**record, "adapter": self.spec, **accs}}
        u_model = unroll_step_lora(self.model)
        if u_model is not None:
            cfg = self.cfg
            u_cfg = replace(cfg, model=replace(cfg.model, core="stack", depth=u_model.nominal_steps,
                                               steps=u_model.nominal_steps, options={}))
            files["unrolled.pt"] = {**record, "config": as_dict(u_cfg), "model": u_model.state_dict(),
                                    "test_acc": metrics["test_acc"]}
        return files

    def result(self, metrics, run):
        summary = {**self.info_record(), "alpha": self.alpha, "run_dir": str(run.path), "epochs": self.cfg.train.epochs,
                   "lr": self.cfg.train.lr, "test_acc": metrics.get("test_acc"),
                   "best_pt_test_acc": _best_test(run.path), "train_seconds": metrics.get("train_seconds"),
                   "train_cpu_seconds": metrics.get("train_cpu_seconds")}
        if run.owner:
            write_atomic(run.path / RECIPE, json.dumps(summary, indent=2) + "\n")
        return summary


def _best_test(run_dir: Path) -> Optional[float]:
    """The test accuracy of the epoch best.pt holds (chosen on the validation split, else the last one; never
    chosen on test): finetune.json's ``best_pt_test_acc``."""
    rows = [m for m in _metrics(run_dir) if "test_acc" in m]
    if not rows:
        return None
    if any("val_acc" in m for m in rows):
        return max(rows, key=lambda m: (m.get("val_acc", -1.0), -m["epoch"]))["test_acc"]
    return rows[-1]["test_acc"]


def _metrics(run_dir: Path) -> List[Dict[str, Any]]:
    return RunDir(run_dir, created=False, owner=False).read_metrics()


# ----------------------------------------------------------------------------------- training
def finetune(src, data: str, method: str = "lora", rank: int = 4, alpha: Optional[float] = None,
             overrides: Optional[List[str]] = None, out: Optional[Path] = None, log=print,
             stop_after: Optional[int] = None) -> Dict[str, Any]:
    """Fine-tune run ``src`` on data set ``data`` with ``method`` into run directory ``out``;
    returns the summary written to finetune.json. ``stop_after=k`` stops after epoch k as an
    interruption would (:func:`finetune_resume` continues it)."""
    if method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, got '{method}'")
    src_path = ckpt_io.resolve_checkpoint(src)
    src_ckpt = ckpt_io.load_checkpoint(src_path)
    if src_ckpt.get("adapter"):
        raise UserError(f"{src_path} is a step_lora run (adapters that cannot be merged); fine-tune its source "
                        "run, or its unrolled.pt")
    if src_ckpt.get("task", "classify") != "classify":
        raise UserError(f"{src_path} is a {src_ckpt['task']} run; only classification runs can be fine-tuned")
    cfg = target_config(ckpt_io.config_from_checkpoint(src_ckpt), data, list(overrides or []))
    out = Path(out) if out is not None else _default_out(src_path, data, method)
    task = FinetuneTask(cfg, method, src_path, data, rank, alpha)
    return fit(task, out, log=log, stop_after=stop_after)


def finetune_resume(run_dir, overrides: Optional[List[str]] = None, log=print,
                    stop_after: Optional[int] = None) -> Dict[str, Any]:
    """Continue the fine-tune in ``run_dir`` from its last.pt (its recipe from finetune.json, its
    config from config.yaml with ``overrides``: the keys a resume may change, such as train.epochs)."""
    run_dir = Path(run_dir)
    try:
        recipe = json.loads((run_dir / RECIPE).read_text())
        method, source, data = recipe["method"], recipe["source"], recipe["data"]
    except (OSError, ValueError, KeyError, TypeError):
        if never_trained(run_dir):  # killed while it started: nothing to go on from, and its recipe is unknown
            raise UserError(f"cannot resume {run_dir}: it stopped before its first epoch ended, so its recipe is "
                            f"unknown; start it again with its original command and --out {run_dir}") from None
        raise UserError(f"cannot resume {run_dir}: it has no readable {RECIPE} (is it a fine-tune run directory?)") from None
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"cannot resume {run_dir}: it has no config.yaml; start the fine-tune again")
    cfg = load_config(run_dir / "config.yaml", list(overrides or []))
    task = FinetuneTask(cfg, method, Path(source), data, recipe.get("rank") or 4, recipe.get("alpha"))
    return fit(task, run_dir, resume=True, log=log, stop_after=stop_after)


def _default_out(src: Path, data: str, method: str) -> Path:
    run = src.parent if src.is_file() else src
    base = run.parent / f"{run.name}-ft-{data}-{method}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out
