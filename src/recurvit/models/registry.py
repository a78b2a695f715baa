"""Named presets -> ViTConfig; ``create_model(name, **overrides)`` builds any of them."""
from __future__ import annotations

from dataclasses import fields
from typing import Callable, Dict, List

import torch.nn as nn

from ..errors import UserError
from .vit import ViTConfig, VisionTransformer

WIDTHS = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}  # (embed_dim, num_heads)

_PRESETS: Dict[str, dict] = {}
_BUILDERS: Dict[str, Callable[..., nn.Module]] = {}


def register(name: str, builder: Callable[..., nn.Module] = VisionTransformer, config_cls=ViTConfig, **preset):
    """Register a preset: ``builder(config_cls(**{**preset, **overrides}))``."""
    _PRESETS[name] = dict(preset)
    _BUILDERS[name] = (builder, config_cls)


for _size, (_dim, _heads) in WIDTHS.items():
    register(f"vit_{_size}", embed_dim=_dim, num_heads=_heads, depth=12, core="stack")
    register(f"bvit_{_size}", embed_dim=_dim, num_heads=_heads, depth=1, steps=12, core="recurrent")
for _size in ("tiny", "small"):
    _dim, _heads = WIDTHS[_size]
    register(f"srvit_{_size}", embed_dim=_dim, num_heads=_heads, depth=12, core="softmor", recursions=2)


def list_models() -> List[str]:
    return sorted(_PRESETS)


def preset(name: str) -> dict:
    if name not in _PRESETS:
        raise UserError(f"unknown model '{name}'; choose one of: {', '.join(list_models())}")
    return dict(_PRESETS[name])


def model_config(name: str, **overrides):
    """The resolved config dataclass of preset ``name`` with ``overrides`` (None values ignored)."""
    base = preset(name)
    builder, config_cls = _BUILDERS[name]
    valid = {f.name for f in fields(config_cls)}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise UserError(f"model '{name}' has no option {', '.join(unknown)}; options: {', '.join(sorted(valid))}")
    if overrides.get("core", base.get("core")) == "stack":  # a stack's step count is its depth
        if "depth" in overrides:
            overrides["steps"] = overrides["depth"]
        elif "steps" in overrides:
            overrides["depth"] = overrides["steps"]
    try:
        return config_cls(**{**base, **overrides})
    except (TypeError, ValueError) as e:
        raise UserError(f"bad model option for '{name}': {e}") from None


def create_model(name: str, **overrides) -> nn.Module:
    """Build preset ``name`` (see ``list_models()``) with config overrides, e.g.
    ``create_model("bvit_tiny", img_size=32, patch_size=4, num_classes=100, steps=6)``."""
    cfg = model_config(name, **overrides)
    builder, _ = _BUILDERS[name]
    try:
        model = builder(cfg)
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build '{name}': {e}") from None
    model.preset_name = name
    return model
from . import loopvae as _loopvae  # noqa: E402,F401  (registers loopvae presets)
