"""Named presets -> config; ``create_model(name, **overrides)`` builds any of them.

Model files register their presets here (``register(name, builder, config_cls, **preset)``); this
module imports none of them, so there is no import cycle. A config class may define
``build(preset, overrides)`` (ViTConfig does: keys that are not its fields are its core's options);
otherwise it is called with the merged keywords.
"""
from __future__ import annotations

import re
from dataclasses import fields
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch.nn as nn

from ..errors import UserError

WIDTHS = {"tiny": (192, 3), "small": (384, 6), "base": (768, 12)}  # (embed_dim, num_heads)

_PRESETS: Dict[str, dict] = {}
_BUILDERS: Dict[str, Tuple[Callable[..., nn.Module], type]] = {}


# timm-style names: FAMILY_SIZE_patchP_IMG (bvit_tiny_patch4_32) = preset FAMILY_SIZE at that patch / input size
TIMM_NAME = re.compile(r"^(vit|bvit|srvit)_(tiny|small|base)_patch(\d+)_(\d+)$")


def timm_classes(img_size: int) -> int:
    """The class count a timm-style name implies: CIFAR-100 at 32 px, ImageNet-1k otherwise (timm's defaults)."""
    return 100 if img_size == 32 else 1000


def timm_name(name: str, patch_size: int, img_size: int, family: Optional[str] = None) -> Optional[str]:
    """The timm-style name of preset ``name`` at a patch / input size (None for a preset without one)."""
    fam, _, size = name.partition("_")
    if fam not in ("vit", "bvit", "srvit") or size not in WIDTHS:
        return None
    return f"{family or fam}_{size}_patch{int(patch_size)}_{int(img_size)}"


def resolve_name(name: str) -> Tuple[str, Dict[str, Any]]:
    """(preset, overrides) for a preset name or a timm-style one: ``bvit_tiny_patch4_32`` is ``bvit_tiny``
    with ``patch_size=4, img_size=32, num_classes=100``, as ``timm.create_model`` builds it."""
    m = TIMM_NAME.match(name)
    if name in _PRESETS or not m or f"{m[1]}_{m[2]}" not in _PRESETS:
        return name, {}
    img = int(m[4])
    return f"{m[1]}_{m[2]}", {"patch_size": int(m[3]), "img_size": img, "num_classes": timm_classes(img)}


def register(name: str, builder: Callable[..., nn.Module], config_cls: type, **preset: Any) -> None:
    """Register a preset: ``builder(config)`` with the config of ``preset`` + overrides."""
    _PRESETS[name] = dict(preset)
    _BUILDERS[name] = (builder, config_cls)


def list_models() -> List[str]:
    return sorted(_PRESETS)


def preset(name: str) -> dict:
    base, shape = resolve_name(name)
    if base not in _PRESETS:
        raise UserError(f"unknown model '{name}'; choose one of: {', '.join(list_models())} "
                        "(or a timm-style name such as bvit_tiny_patch4_32)")
    return {**_PRESETS[base], **shape}


def model_config(name: str, **overrides):
    """The resolved config dataclass of preset ``name`` with ``overrides`` (None values ignored)."""
    base = preset(name)
    _, config_cls = _BUILDERS[resolve_name(name)[0]]
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
    builder, _ = _BUILDERS[resolve_name(name)[0]]
    try:
        model = builder(cfg)
    except UserError:
        raise
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build '{name}': {e}") from None
    model.preset_name = name
    return model
