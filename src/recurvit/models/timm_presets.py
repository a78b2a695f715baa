"""recurvit's classification presets in timm's model registry.

    import recurvit, timm
    model = timm.create_model("bvit_small_patch16_224", steps=12, num_classes=100)
    feats = timm.create_model("bvit_tiny_patch4_32", features_only=True, out_indices=(3, 7, 11))

``import recurvit`` imports this module as soon as timm is imported (recurvit/_timm_hook.py): timm
finds models only in its own registry, and importing timm from recurvit would cost seconds to
every user who never asks for it. Importing this module registers the names below.

Names: only names timm does not have. recurvit's stack ViT (``vit_*`` presets) IS timm's
VisionTransformer (same state_dict, same logits; tests/models/test_vit.py), so no ``vit_*`` name is
registered here: timm's own ones are that model.

=========================================  ===========================================================
``bvit_{tiny,small,base}_patch16_224``     one shared block x 12 steps, ImageNet: 224 px, 1000 classes
``srvit_{tiny,small}_patch16_224``         SoftMoR (SR-ViT), 12 blocks, r = 2, ImageNet shape
``bvit_{tiny,small,base}_patch4_32``       the same at CIFAR-100's shape: 32 px, 4 px patches, 100 classes
``srvit_{tiny,small}_patch4_32``           (configs/cifar100/)
``{bvit,srvit}_{tiny,small,base}_patchP_S``   any other shape: registered on first lookup (below)
=========================================  ===========================================================

Any name of the form ``FAMILY_SIZE_patchP_S`` (``bvit_tiny_patch4_8``: an 8-pixel input in 4-pixel
patches) is a model timm finds: ``recurvit export --format hf`` names an export by its real shape, so
``timm.create_model("local-dir:OUT")`` must find that name in a fresh process. timm's registry is a
plain dict looked up with ``in`` / ``[]`` (``timm.models._registry``); :func:`install_shape_names`
swaps it for a dict that registers such a name the first time it is asked for. ``timm.list_models()``
lists the ten names above and every shape registered so far.

Keyword arguments are recurvit's ``create_model`` overrides: ``steps``, ``core`` and the core's
options (``core="ode", method="rk4"``, ``recursions=4``, ``step_cond="embed"``), ``num_classes``,
``img_size``, ``patch_size``, ...; timm's ``drop_path_rate`` is recurvit's ``drop_path``, and
``device`` / ``dtype`` are honoured. ``timm.create_model(name, **kw)`` builds the model that
``recurvit.create_model(PRESET, patch_size=..., img_size=..., num_classes=..., **kw)`` builds (same
state_dict for the same seed); it carries a ``pretrained_cfg`` (input size, mean / std, first
conv, classifier, class count) for timm's data pipeline. There are no weights to download:
``pretrained=True`` is timm's "no weight source" error; recurvit checkpoints load with
``recurvit.load_model``. ``features_only=True`` uses timm's FeatureGetterNet over
``forward_intermediates``, whose features are the states after STEPS (timm_contract.py);
``out_indices`` count steps (default: the last 3).

Weights loaded by timm (``pretrained=True`` with ``local-dir:`` / ``hf-hub:``, an export of
``recurvit export --format hf``) pass :func:`checkpoint_filter_fn`, as timm's ViT weights pass its own: a
learned position embedding of another grid is resampled to the model's (``img_size=32`` on an 8 px export).
"""
from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from functools import partial
from typing import Any, Dict, Tuple

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from .registry import TIMM_NAME, timm_classes
from .registry import create_model as recurvit_create_model
from .vit import VisionTransformer

# recurvit/data/datasets.py CIFAR_STATS["cifar100"] (not imported: that module imports torchvision)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)

# timm name -> (recurvit preset, model arguments timm's defaults do not already give)
TIMM_PRESETS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    **{f"{preset}_patch16_224": (preset, dict(patch_size=16))
       for preset in ("bvit_tiny", "bvit_small", "bvit_base", "srvit_tiny", "srvit_small")},
    **{f"{preset}_patch4_32": (preset, dict(patch_size=4))
       for preset in ("bvit_tiny", "bvit_small", "bvit_base", "srvit_tiny", "srvit_small")},
}


def _cfg(**kwargs: Any) -> Dict[str, Any]:
    """ImageNet input: recurvit's imagefolder evaluation (resize to 224 / 0.875, centre crop)."""
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.875, "interpolation": "bilinear", "fixed_input_size": True,
        "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj", "classifier": "head", **kwargs,
    }


def _cifar_cfg(**kwargs: Any) -> Dict[str, Any]:
    """CIFAR-100 input: 32 px as is (no resize, no crop), CIFAR-100 mean / std."""
    return _cfg(num_classes=100, input_size=(3, 32, 32), crop_pct=1.0, mean=CIFAR100_MEAN, std=CIFAR100_STD,
                **kwargs)


_WHAT = {
    "bvit": "bViT-{S}: ONE ViT-{S} block applied `steps` times (12 trained)",
    "srvit": "SR-ViT-{S}: SoftMoR, 12 ViT-{S} blocks each recursed r = 2 times, token-wise mixture",
}
_SIZE = {"tiny": "Ti", "small": "S", "base": "B"}


def _describe(name: str) -> str:
    family, size = TIMM_PRESETS[name][0].split("_")
    return _WHAT[family].format(S=_SIZE[size]) + (", ImageNet shape" if name.endswith("_224") else ", CIFAR-100 shape")


default_cfgs = generate_default_cfgs({
    name: (_cfg if name.endswith("_224") else _cifar_cfg)(description=_describe(name)) for name in TIMM_PRESETS
})


def _build(preset: str, img_size: Any = None, patch_size: Any = None, drop_path_rate: Any = None,
           device: Any = None, dtype: Any = None, **overrides: Any) -> VisionTransformer:
    """recurvit's ``create_model(preset, ...)`` from timm's keyword arguments (square sizes)."""
    for key, value in (("img_size", img_size), ("patch_size", patch_size)):
        if isinstance(value, (tuple, list)):
            if len(set(value)) != 1:
                raise ValueError(f"recurvit models take square inputs and patches; got {key}={tuple(value)}")
            value = value[0]
        if value is not None:
            overrides[key] = int(value)
    if drop_path_rate is not None:
        overrides.setdefault("drop_path", drop_path_rate)
    with torch.device(device) if device is not None else nullcontext():
        model = recurvit_create_model(preset, **overrides)
    return model if dtype is None else model.to(dtype=dtype)


def _create(variant: str, pretrained: bool = False, **kwargs: Any) -> VisionTransformer:
    preset, model_args = TIMM_PRESETS[variant]
    out_indices = kwargs.pop("out_indices", 3)  # features_only: the last 3 steps, as timm's ViT
    model = build_model_with_cfg(partial(_build, preset), variant, pretrained,
                                 pretrained_filter_fn=checkpoint_filter_fn,
                                 feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
                                 **dict(model_args, **kwargs))
    return _own_channels(model)


def checkpoint_filter_fn(state_dict: Dict[str, torch.Tensor], model: VisionTransformer) -> Dict[str, torch.Tensor]:
    """Pretrained weights for ``model``: a learned position embedding of another (square) patch grid resampled
    to the model's by timm's own ``resample_abs_pos_embed`` (bicubic, antialiased), as timm's ViT loads its
    checkpoints at another ``img_size``; everything else as it is."""
    from timm.layers import resample_abs_pos_embed

    pos, own = state_dict.get("pos_embed"), getattr(model, "pos_embed", None)
    if pos is None or own is None or pos.shape == own.shape:
        return state_dict
    n = model.num_prefix_tokens
    old = math.isqrt(pos.shape[1] - n)
    if old * old != pos.shape[1] - n or pos.shape[-1] != own.shape[-1]:
        return state_dict  # not a square grid of this width: load_state_dict names the mismatch
    new = model.patch_embed.grid_size
    return {**state_dict, "pos_embed": resample_abs_pos_embed(pos, [new, new], [old, old], num_prefix_tokens=n)}


def _own_channels(model):
    """A model built with another channel count than its weights' source (``in_chans=3`` on an export of a
    grey run, as timm's validate.py asks by default: timm adapts the patch embedding's convolution)
    describes its own input in ``pretrained_cfg``, so ``resolve_data_config(model=m)`` feeds it that many
    channels: grey images read as RGB give the grey model's logits. The mean / std of one channel are
    repeated; of other counts, averaged."""
    cfg, chans = getattr(model, "pretrained_cfg", None), getattr(getattr(model, "cfg", None), "in_chans", None)
    if not cfg or not chans or tuple(cfg.get("input_size", ()))[:1] == (chans,):
        return model
    fit = {}
    for key in ("mean", "std"):
        values = tuple(cfg.get(key) or ())
        if values and len(values) != chans:
            fit[key] = values * chans if len(values) == 1 else (sum(values) / len(values),) * chans
    model.pretrained_cfg = {**cfg, **fit, "input_size": (chans, *tuple(cfg["input_size"])[1:])}
    model.default_cfg = model.pretrained_cfg
    return model


@register_model
def bvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("bvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def bvit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("bvit_small_patch16_224", pretrained, **kwargs)


@register_model
def bvit_base_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("bvit_base_patch16_224", pretrained, **kwargs)


@register_model
def srvit_tiny_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("srvit_tiny_patch16_224", pretrained, **kwargs)


@register_model
def srvit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("srvit_small_patch16_224", pretrained, **kwargs)


@register_model
def bvit_tiny_patch4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("bvit_tiny_patch4_32", pretrained, **kwargs)


@register_model
def bvit_small_patch4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("bvit_small_patch4_32", pretrained, **kwargs)


@register_model
def bvit_base_patch4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("bvit_base_patch4_32", pretrained, **kwargs)


@register_model
def srvit_tiny_patch4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("srvit_tiny_patch4_32", pretrained, **kwargs)


@register_model
def srvit_small_patch4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    return _create("srvit_small_patch4_32", pretrained, **kwargs)


def register_shape(name: str) -> bool:
    """Register ``FAMILY_SIZE_patchP_S`` in timm (an entry point and its default cfg); False for another name."""
    m = TIMM_NAME.match(name)
    if not m or m[1] == "vit" or name in _REGISTERING:  # vit_*: timm's own names
        return False
    if name in TIMM_PRESETS:
        return True
    _REGISTERING.add(name)
    try:
        patch, img = int(m[3]), int(m[4])
        TIMM_PRESETS[name] = (f"{m[1]}_{m[2]}", dict(patch_size=patch, img_size=img))
        cfg = _cfg(num_classes=timm_classes(img), input_size=(3, img, img), crop_pct=0.875 if img >= 224 else 1.0,
                   description=_describe(name).rsplit(",", 1)[0] + f", {img} px in {patch} px patches")
        default_cfgs.update(generate_default_cfgs({name: cfg}))

        def entry(pretrained: bool = False, **kwargs) -> VisionTransformer:
            return _create(name, pretrained, **kwargs)

        entry.__name__ = entry.__qualname__ = name
        entry.__module__ = __name__
        register_model(entry)
        return True
    finally:
        _REGISTERING.discard(name)


_REGISTERING: set = set()


class _ShapeNames(dict):
    """timm's entry-point table, answering for any recurvit shape name on its first lookup."""

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or (isinstance(name, str) and register_shape(name))

    def __missing__(self, name):
        if isinstance(name, str) and register_shape(name):
            return dict.__getitem__(self, name)
        raise KeyError(name)


def install_shape_names() -> None:
    try:
        from timm.models import _registry
    except ImportError:  # pragma: no cover  (a timm without that module: only the ten names above)
        return
    table = getattr(_registry, "_model_entrypoints", None)
    if type(table) is dict:
        _registry._model_entrypoints = _ShapeNames(table)
    elif not isinstance(table, _ShapeNames):
        warnings.warn("recurvit: timm's model registry has changed shape; exports of other shapes than the ten "
                      "registered names will not load through timm", RuntimeWarning, stacklevel=2)


install_shape_names()
