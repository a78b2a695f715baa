"""A run in the Hugging Face / timm layout: a folder with ``config.json`` (the timm architecture, its
arguments and the preprocessing) and ``model.safetensors``.

    recurvit export RUN --format hf OUT
    timm.create_model("local-dir:OUT", pretrained=True)      # the same logits as the run
    recurvit.load_model(OUT)                                 # the same model, through recurvit
    timm.models.push_to_hf_hub(model, "user/name")           # publishing (network: not tested here)

The architecture is one of the names recurvit registers in timm (``bvit_tiny_patch16_224`` etc.) and
``model_args`` hold every setting of the run's model config, so a model of any width, depth, core or
step count (not only a preset) comes back as it was trained.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict

ARCH = "{preset}_patch16_224"  # a timm entry point; every argument below overrides its defaults
PRESET_FAMILY = {"vit": "bvit", "bvit": "bvit", "srvit": "srvit"}  # the timm names recurvit registers


def model_args(cfg) -> Dict[str, Any]:
    """The run's model config as ``create_model`` keyword arguments (core options flat)."""
    mc = {k: v for k, v in dataclasses.asdict(cfg.model).items() if v is not None and k != "name"}
    options = mc.pop("options", None) or {}
    return {**mc, **options}


def architecture(cfg) -> str:
    family, _, size = cfg.model.name.partition("_")
    if family not in PRESET_FAMILY or size not in ("tiny", "small", "base"):
        from ..errors import UserError

        raise UserError(f"model {cfg.model.name} has no timm entry point to export under")
    return ARCH.format(preset=f"{PRESET_FAMILY[family]}_{size}")  # a stack too: its core is in model_args


def export_hf(run: Path, out: Path) -> Path:
    """``out``: a new folder with config.json and model.safetensors, written under a temporary name and
    renamed when complete (a kill leaves no half folder that the same export would then refuse)."""
    from safetensors.torch import save

    from ..errors import UserError
    from ..train.checkpoint import atomic_write, check_finite, load_model_and_config
    from ..train.outputs import staged_dir

    model, cfg = load_model_and_config(run)
    check_finite(model, run)
    if getattr(model, "adapters", None):
        raise UserError("a step-LoRA fine-tune cannot be exported as one set of weights; export its unrolled.pt")
    out = Path(out)
    args = {**model_args(cfg), "core": model.cfg.core}  # the entry point's preset may default to another core
    pre = dict(getattr(model, "pretrained_cfg", None) or {})
    pre.pop("recurvit_data", None)
    config = {"architecture": architecture(cfg), "model_args": args, "num_classes": cfg.model.num_classes,
              "label_names": pre.get("label_names", []), "pretrained_cfg": pre,
              "recurvit": {"model": cfg.model.name, "data": (getattr(model, "pretrained_cfg", {}) or {}).get("recurvit_data")}}
    text = (json.dumps(config, indent=2) + "\n").encode()
    weights = save({k: v.contiguous() for k, v in model.state_dict().items()})
    with staged_dir(out) as tmp:
        atomic_write(tmp / "config.json", lambda f: f.write(text), needed=len(text))
        atomic_write(tmp / "model.safetensors", lambda f: f.write(weights), needed=len(weights))
    return out


def is_hf_folder(path: Path) -> bool:
    return (Path(path) / "config.json").is_file() and (Path(path) / "model.safetensors").is_file()


def hf_run_config(path: Path):
    """The run config an evaluation of an exported folder needs: the model's name and classes, and the
    data set (name and root) it was trained on, as the folder's config.json records them."""
    from ..config import DataConfig, ModelConfig, RunConfig
    from ..errors import UserError

    config = json.loads((Path(path) / "config.json").read_text())
    data = (config.get("recurvit") or {}).get("data")
    if not data or not data.get("name"):
        raise UserError(f"{path} does not say which data set its model was trained on (exported by an older "
                        "recurvit?); evaluate the run directory it came from")
    return RunConfig(model=ModelConfig(name=config["recurvit"]["model"], num_classes=config.get("num_classes")),
                     data=DataConfig(name=data["name"], root=data.get("root")))


def read_hf(path: Path):
    """(model, run config) of an exported folder; a damaged config.json or model.safetensors is one line."""
    from safetensors import SafetensorError

    from ..errors import UserError

    try:
        return load_hf(path), hf_run_config(path)
    except UserError:
        raise
    except (SafetensorError, ValueError, KeyError, TypeError, AttributeError, OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot read the exported folder {path}: its config.json or model.safetensors is damaged "
                        f"({first}); export the run again") from None


def load_hf(path: Path):
    """A folder written by :func:`export_hf`, as recurvit's model with its preprocessing."""
    from safetensors.torch import load_file

    from ..models import create_model
    from .preprocessing import pretrained_cfg

    config = json.loads((Path(path) / "config.json").read_text())
    model = create_model(config["recurvit"]["model"], **config["model_args"])
    model.load_state_dict(load_file(str(Path(path) / "model.safetensors")))
    data = config["recurvit"].get("data")
    if data:
        model.pretrained_cfg = pretrained_cfg(data, config["num_classes"])
    return model.eval()
