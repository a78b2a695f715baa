"""ONE way to open a trained model: :func:`load` reads a run directory, a checkpoint file, a folder written by
``recurvit export --format hf`` or a ``.safetensors`` file written by ``--format safetensors``, and gives
the model (eval mode, its weights, its preprocessing as timm reads it) with its run config.

    loaded = load("runs/digits-bvit_tiny-...")          # or RUN/best.pt, exported/bvit-digits, bvit.safetensors
    loaded.model(x)                                      # logits at the trained depth
    load(path, core="ode", method="rk4", steps=24)       # core options to run the same weights with

A checkpoint becomes a model through its task's reader (found in :mod:`recurvit.task_table`: nothing has to
be imported first); an export is always a classifier rebuilt from the model arguments it records. The
Python API (``recurvit.load`` / ``recurvit.load_model``) and every command that reads a trained model
(eval, predict, export, horizon, analyze, ...) go through here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import torch.nn as nn

from ..config import config_from_dict
from ..errors import UserError
from ..models import create_model
from . import checkpoint as ckpt_io
from .preprocessing import check_record, pretrained_cfg

SAFETENSORS_KEY = "recurvit"  # a safetensors export's header entry: {"model": preset, "model_args": ..., "data": ...}


@dataclass
class Loaded:
    """What :func:`load` opened."""

    model: nn.Module                    # eval mode, with its weights; ``pretrained_cfg`` where its preprocessing is known
    config: Any                         # the run config (a RunConfig, or the task's own: a LoopVAE run's VAERunConfig)
    source: Path                        # the file the weights came from (a checkpoint, a model.safetensors)
    checkpoint: Optional[Dict[str, Any]] = None  # the checkpoint read (None for an export)
    task: Optional[str] = None          # the task that wrote the checkpoint (None for an export: a classifier)
    use: Optional[str] = None           # None: a classifier; else the command that reads such runs ("recurvit vae eval")

    @property
    def data_record(self) -> Optional[Dict[str, Any]]:
        """The run's preprocessing record (data set name and root, size, mean / std, class names), if known."""
        return (getattr(self.model, "pretrained_cfg", None) or {}).get("recurvit_data")

    def classifier(self, path: str | Path) -> "Loaded":
        """Itself when its model gives class logits (what eval, predict and export read); else one line
        naming the command that reads such runs."""
        if self.use is not None:
            raise UserError(f"{path} is a {self.task} run, not a classifier; use `{self.use} {path}`")
        return self


def load(path: str | Path, map_location: Any = "cpu", **overrides) -> Loaded:
    """The model at ``path`` (a run directory, a checkpoint, an hf-exported folder or a safetensors export)
    with its weights, in eval mode, on ``map_location``; ``overrides`` are core options to run it with
    (``core="ode"``, ``method="rk4"``, ``steps=24``: parameters must still match the weights). ``path`` may
    also name a model shipped with the package (:mod:`recurvit.pretrained`); a path that exists wins."""
    p = _shipped_or_path(path)
    if is_hf_folder(p) or (p.suffix == ".safetensors" and is_hf_folder(p.parent) and p.name == "model.safetensors"):
        folder = p if p.is_dir() else p.parent
        config = _json(folder / "config.json", folder)
        rec = config.get("recurvit") or {}
        if "model" not in rec or "model_args" not in config:
            raise UserError(f"{folder} is not a folder written by `recurvit export --format hf` (its config.json "
                            "names no recurvit model); load it with timm.create_model('local-dir:...')")
        loaded = _exported(folder / "model.safetensors", rec["model"], config["model_args"], rec.get("data"),
                           overrides, folder)
    elif p.suffix == ".safetensors":
        meta = _safetensors_header(p)
        loaded = _exported(p, meta["model"], meta["model_args"], meta.get("data"), overrides, p)
    else:
        source = ckpt_io.resolve_checkpoint(p)
        ckpt = ckpt_io.load_checkpoint(source, map_location)
        reader = ckpt_io.reader_of(ckpt, source)
        model, cfg = reader.read(ckpt, source, **overrides)
        loaded = Loaded(model.eval(), cfg, source, ckpt, ckpt_io.task_of(ckpt, source), reader.use)
    loaded.model.to(map_location)
    return loaded


def load_model(path: str | Path, map_location: Any = "cpu", **overrides) -> nn.Module:
    """The classifier at ``path`` (see :func:`load`), its model alone; a run of a task whose model is not a
    classifier (a LoopVAE run) is one line naming the command that reads it."""
    return load(path, map_location, **overrides).classifier(path).model


def _shipped_or_path(path: str | Path) -> Path:
    """``path``, or the file of the shipped model it names; a bare name that is neither is one line that
    lists the shipped names."""
    from ..pretrained import list_pretrained, looks_like_a_name, path_of

    shipped = path_of(path)
    if shipped is not None:
        return shipped
    if looks_like_a_name(path):
        raise UserError(f"no run, checkpoint or shipped model named {path!s} (shipped: "
                        f"{', '.join(list_pretrained()) or 'none'})")
    return Path(path)


def is_hf_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder in the Hugging Face / timm layout (config.json + model.safetensors)."""
    return (Path(path) / "config.json").is_file() and (Path(path) / "model.safetensors").is_file()


def _exported(weights: Path, name: str, args: Dict[str, Any], data: Optional[Dict[str, Any]],
              overrides: Dict[str, Any], where: Path) -> Loaded:
    """An export's model (preset ``name`` with the ``args`` it records; ``overrides`` win) with its weights
    and preprocessing, and the run config those records give (model; data set name and root, when known)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not isinstance(args, dict):
        raise UserError(f"cannot read the export {where}: its model_args is a {type(args).__name__}, not a mapping; "
                        "export the run again")
    args = _recurvit_args(args)
    try:
        model = create_model(name, **{**args, **{k: v for k, v in overrides.items() if v is not None}})
        state = load_file(str(weights))
        cfg = config_from_dict({"model": {"name": name, **args},
                                "data": {"name": data["name"], "root": data.get("root")} if data else {}})
    except UserError:
        raise
    except (SafetensorError, ValueError, KeyError, TypeError, AttributeError, OSError, RuntimeError) as e:
        raise UserError(f"cannot read the exported {'folder' if where.is_dir() else 'file'} {where}: it is damaged "
                        f"({_first_line(e)}); export the run again") from None
    not_float = sorted(k for k, v in state.items() if not v.is_floating_point())
    if not_float:  # load_state_dict would cast a bool / int64 tensor silently
        raise UserError(f"cannot read the export {where}: its weights hold {state[not_float[0]].dtype} tensors "
                        f"({', '.join(not_float[:3])}{', ...' if len(not_float) > 3 else ''}); an export's weights "
                        "are floating point: export the run again")
    ckpt_io.load_state(model, state, weights)
    if data:
        check_record(data, model.cfg.num_classes, model.cfg.in_chans, where)
    if data:  # timm.data.resolve_data_config(model=m) reads it
        model.pretrained_cfg = pretrained_cfg(data, model.cfg.num_classes)
    return Loaded(model.eval(), cfg, weights)


def _recurvit_args(args: Dict[str, Any]) -> Dict[str, Any]:
    """timm's ``model_args`` as recurvit's ``create_model`` keywords (timm writes a size as [H, W])."""
    args = dict(args)
    for key in ("img_size", "patch_size"):
        if isinstance(args.get(key), (list, tuple)):
            args[key] = int(args[key][0])
    return args


def _safetensors_header(path: Path) -> Dict[str, Any]:
    """The recurvit entry of a safetensors export's header: which model the weights are for."""
    from safetensors import safe_open

    if not path.is_file():
        raise UserError(f"no such file: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get(SAFETENSORS_KEY)
    except Exception as e:  # noqa: BLE001  (safetensors' errors are of several kinds)
        raise UserError(f"cannot read {path}: not a safetensors file ({str(e).strip()[:120]})") from None
    if not meta:
        raise UserError(f"{path} does not say which model its weights are for (not written by recurvit export "
                        "--format safetensors); build the model with recurvit.create_model and load_state_dict")
    return json.loads(meta)


def _json(path: Path, folder: Path) -> Dict[str, Any]:
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read the exported folder {folder}: its config.json is damaged ({_first_line(e)}); "
                        "export the run again") from None
    if not isinstance(out, dict):
        raise UserError(f"cannot read the exported folder {folder}: its config.json is not a mapping; export the run again")
    return out


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__


__all__ = ["load", "load_model", "Loaded", "is_hf_folder", "SAFETENSORS_KEY"]
