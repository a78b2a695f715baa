"""Named presets -> config; ``create_model(name, **overrides)`` builds any of them.

Model files register their presets here (``register(name, builder, config_cls, **preset)``); this
module imports none of them, so there is no import cycle. A config class may define
``build(preset, overrides)`` (ViTConfig does: keys that are not its fields are its core's options);
otherwise it is called with the merged keywords.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, Dict, List, Tuple

import torch.nn as nn

from ..errors import UserError

WIDTHS = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}  # (embed_dim, num_heads)

_PRESETS: Dict[str, dict] = {}
_BUILDERS: Dict[str, Tuple[Callable[..., nn.Module], type]] = {}


def register(name: str, builder: Callable[..., nn.Module], config_cls: type, **preset: Any) -> None:
    """Register a preset: ``builder(config)`` with the config of ``preset`` + overrides."""
    _PRESETS[name] = dict(preset)
    _BUILDERS[name] = (builder, config_cls)


def list_models() -> List[str]:
    return sorted(_PRESETS)


def preset(name: str) -> dict:
    if name not in _PRESETS:
        raise UserError(f"unknown model '{name}'; choose one of: {', '.join(list_models())}")
    return dict(_PRESETS[name])


def model_config(name: str, **overrides):
    """The resolved config dataclass of preset ``name`` with ``overrides`` (None values ignored)."""
    base = preset(name)
    _, config_cls = _BUILDERS[name]
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        if hasattr(config_cls, "build"):
            return config_cls.build(base, overrides)
        valid = {f.name for f in fields(config_cls)}
        unknown = sorted(set(overrides) - valid)
        if unknown:
            raise UserError(f"model '{name}' has no option {', '.join(unknown)}; options: {', '.join(sorted(valid))}")
        return config_cls(**{**base, **overrides})
    except UserError:
        raise
    except TypeError as e:
        raise UserError(f"model '{name}': {e}") from None
    except ValueError as e:
        raise UserError(f"bad model option for '{name}': {e}") from None


def create_model(name: str, **overrides) -> nn.Module:
    """Build preset ``name`` (see ``list_models()``) with config overrides, e.g.
    ``create_model("bvit_tiny", img_size=32, patch_size=4, num_classes=100, steps=6)``."""
    if overrides.pop("pretrained", False):
        raise UserError(f"recurvit ships no pretrained weights for '{name}': train a run and load it with "
                        "recurvit.load_model(RUN), or export one and load it with "
                        "timm.create_model('local-dir:FOLDER', pretrained=True)")
    overrides.pop("pretrained_cfg_overlay", None)
    cfg = model_config(name, **overrides)
    builder, _ = _BUILDERS[name]
    try:
        model = builder(cfg)
    except UserError:
        raise
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build '{name}': {e}") from None
    model.preset_name = name
    return model
