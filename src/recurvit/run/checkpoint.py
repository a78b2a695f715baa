"""Checkpoints: the schema, safe load (weights_only=True), clear errors (saving is :mod:`.atomic`'s).

A checkpoint is a dict with ``format``, ``task`` (the task that wrote it), ``config`` (the resolved run
config as plain types), ``model`` (state_dict), ``data`` (the preprocessing record, :mod:`.preprocessing`)
and, for ``last.pt``, the optimizer / scheduler / RNG state to resume.
"""
from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn

from ..config import RunConfig, config_from_dict
from ..errors import UserError
from .. import task_table
from ..models import create_model
from ..models.adapters import attach_adapters
from .preprocessing import preprocessing_of, pretrained_cfg

FORMAT = "recurvit-checkpoint-v1"


def _validated(run_dir: Path) -> bool:
    """Whether the run's best.pt was not chosen on the test split: it held out a validation split, or its
    task writes a best.pt without one (:data:`recurvit.task_table.BEST_WITHOUT_HOLDOUT`)."""
    import yaml

    if any((run_dir / name).is_file() for name in task_table.BEST_WITHOUT_HOLDOUT):
        return True
    path = run_dir / "config.yaml"
    if not path.is_file():
        return False
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
        return float((cfg.get("data") or {}).get("holdout") or 0) > 0
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, ValueError, AttributeError) as e:
        # silently reading last.pt instead would give other figures than the run's own best.pt
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path} is unreadable ({reason}); it says whether best.pt was chosen on a validation "
                        f"split: restore it, or give the checkpoint file ({run_dir / 'best.pt'})") from None


def resolve_checkpoint(path: str | Path, prefer: str = "best.pt") -> Path:
    """A run directory -> its best.pt (or last.pt); a file -> itself.

    A best.pt is chosen on the run's validation split (``data.holdout``). A run directory without
    one (its config.yaml says ``holdout: 0``) may still hold a best.pt an older recurvit chose on
    the TEST split: that one is passed over for last.pt, so an evaluation never reads a test-chosen epoch."""
    p = Path(path)
    if p.is_dir():
        names = [n for n in (prefer, "best.pt", "last.pt") if n != "best.pt" or _validated(p)]
        for name in names:
            if (p / name).is_file():
                return p / name
        raise UserError(f"no checkpoint in {p}: expected best.pt or last.pt (is it a recurvit run directory?)")
    if not p.is_file():
        raise UserError(f"checkpoint not found: {p}")
    return p


def _zip_start(p: Path) -> bool:
    """Whether the file begins as a zip archive does (a torch.save file cut short keeps its first bytes)."""
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def load_checkpoint(path: str | Path, map_location: Any = "cpu") -> Dict[str, Any]:
    p = Path(path)
    try:
        ckpt = torch.load(p, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise UserError(f"checkpoint not found: {p}") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, KeyError,
            IndexError, TypeError, AttributeError) as e:  # the unpickler fails on junk in many ways
        if not zipfile.is_zipfile(p) and not _zip_start(p):  # random bytes, ONNX, text: not a torch.save archive
            raise UserError(f"cannot read checkpoint {p}: it is not a file written by torch.save (a zip archive); "
                            "give a run directory or its last.pt / best.pt") from None
        if isinstance(e, pickle.UnpicklingError) and "weights only load failed" in str(e).lower():
            # a pickle of objects other than tensors and plain types
            raise UserError(f"{p} is not a recurvit checkpoint: it contains code objects "
                            "(refusing to load it with weights_only)") from None
        raise UserError(f"cannot read checkpoint {p}: corrupt, truncated or not a safe torch file "
                        f"({_first_line(e)})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or "model" not in ckpt or "config" not in ckpt:
        raise UserError(f"{p} is not a recurvit checkpoint (expected a file written by `recurvit train`)")
    return ckpt


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__


def check_finite(model: nn.Module, source: str | Path) -> None:
    """UserError if any weight (parameter or floating-point buffer) of ``model`` is NaN or inf: such a
    model's figures (a constant argmax, "accuracy 0.1000") would be meaningless."""
    bad, total = [], 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() or t.is_complex():
            n = int((~torch.isfinite(t.detach())).sum())
            if n:
                bad.append(f"{name} ({n:,} of {t.numel():,})")
                total += n
    if bad:
        more = f" and {len(bad) - 3} more tensors" if len(bad) > 3 else ""
        raise UserError(f"{source}'s weights contain NaN/inf: {', '.join(bad[:3])}{more}; the run diverged or the "
                        "file was damaged: evaluate an earlier checkpoint or train again")


def config_from_checkpoint(ckpt: Dict[str, Any]) -> RunConfig:
    return config_from_dict(ckpt["config"])


def build_model_from_config(cfg: RunConfig, **overrides) -> nn.Module:
    """The run's model (fresh weights); ``overrides`` are model keys or core options."""
    from dataclasses import asdict

    opts = {k: v for k, v in asdict(cfg.model).items() if k not in ("name", "options") and v is not None}
    opts.update(cfg.model.options or {})
    opts.update({k: v for k, v in overrides.items() if v is not None})
    return create_model(cfg.model.name, **opts)


def load_state(model: nn.Module, state: Dict[str, torch.Tensor], source: str | Path) -> None:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0]
        raise UserError(f"checkpoint {source} does not match its model: {detail[:200]}") from None


def task_of(ckpt: Dict[str, Any], source: str | Path = "the checkpoint") -> str:
    """The task that wrote a checkpoint; one of an earlier recurvit, which named none, is one line naming the
    script that rewrites it."""
    task = ckpt.get("task")
    if task is None:
        run = Path(source).parent if str(source).endswith(".pt") else "RUN_DIR"
        raise UserError(f"{source} was written by an earlier recurvit (it names no task); rewrite it in the current "
                        f"form with `python scripts/migrate_results.py {run}`")
    return task


@dataclass(frozen=True)
class Reader:
    """How the checkpoints of one task become a model again: each task class holds its reader
    (``Task.reader``), found through :mod:`recurvit.task_table`, so loading branches on no task's name."""

    # (checkpoint, its path, **overrides) -> (model with the checkpoint's weights, the typed run config)
    read: Callable[..., Tuple[nn.Module, Any]]
    # None: the model gives class logits, so eval / predict / export read it; else the command that reads
    # this task's runs (a LoopVAE run: "recurvit vae eval"), named in the refusal of the others
    use: Optional[str] = None


def reader_of(ckpt: Dict[str, Any], source: str | Path) -> Reader:
    """The reader of the task that wrote ``ckpt`` (the task table imports its class on first use)."""
    task = task_of(ckpt, source)
    cls = task_table.task_class(task) if isinstance(task, str) else None
    if cls is None:
        raise UserError(f"{source} is a checkpoint of task '{task}', which has no reader here (tasks: "
                        f"{', '.join(task_table.task_names())})")
    return cls.reader


def read_model(ckpt: Dict[str, Any], source: str | Path, **overrides) -> Tuple[nn.Module, RunConfig]:
    """The reader of checkpoints whose config is a :class:`~recurvit.config.RunConfig` (classification,
    dense, fine-tunes): the run's model from the model registry (``overrides``: core options to run it
    with), the adapters a step-LoRA fine-tune was trained with (per-step adapters cannot be merged into one
    block: the checkpoint carries their spec), its weights, and its preprocessing as timm reads it."""
    cfg = config_from_checkpoint(ckpt)
    model = build_model_from_config(cfg, **overrides)
    if ckpt.get("adapter"):
        attach_adapters(model, ckpt["adapter"])
    load_state(model, ckpt["model"], source)
    model.eval()
    data = preprocessing_of(ckpt, cfg)
    if data is not None:  # timm.data.resolve_data_config(model=m) reads it
        model.pretrained_cfg = pretrained_cfg(data, model.cfg.num_classes)
    return model, cfg


def rng_state() -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Optional[Dict[str, Any]]) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
