"""A run in the Hugging Face / timm layout: a folder with ``config.json`` (the timm architecture, its
arguments and the preprocessing) and ``model.safetensors``, written by timm's own ``save_for_hf``.

    recurvit export RUN --format hf --out OUT
    timm.create_model("local-dir:OUT", pretrained=True)                 # the same logits as the run
    timm.create_model("local-dir:OUT", pretrained=True, num_classes=5)  # fine-tuning: a new head
    recurvit.load_model(OUT, core="ode")                                # through recurvit (run.load), with overrides
    timm.models.push_to_hf_hub(model, "user/name")                      # publishing (network: not tested here)

The architecture is named by the model's real shape, ``FAMILY_SIZE_patchP_S`` (``bvit_tiny_patch4_8`` for
the digits run: 8 px in 4 px patches), which recurvit registers in timm on first lookup
(models/timm_presets.py); a stack ViT is ``bvit_*`` with ``core="stack"``. ``model_args`` hold every
setting of the run's model config, so a model of any width, depth, core or step count comes back as it
was trained; ``pretrained_cfg`` holds the run's preprocessing and timm's ``first_conv`` / ``classifier``
(``in_chans=3`` adapts the patch embedding's convolution of a grey model, as timm does for any stem).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Dict

from ..errors import UserError
from ..models import timm_presets
from ..models.registry import timm_name
from ..run.atomic import atomic_write
from ..run.checkpoint import check_finite
from ..run.load import SAFETENSORS_KEY
from ..run.outputs import output_dir, staged_dir

PRESET_FAMILY = {"vit": "bvit", "bvit": "bvit", "srvit": "srvit"}  # the timm families recurvit registers


def model_args(cfg) -> Dict[str, Any]:
    """The run's model config as ``create_model`` keyword arguments (core options flat)."""
    mc = {k: v for k, v in dataclasses.asdict(cfg.model).items() if v is not None and k != "name"}
    options = mc.pop("options", None) or {}
    return {**mc, **options}


def architecture(cfg, model) -> str:
    family = cfg.model.name.partition("_")[0]
    if getattr(model.cfg, "patch_size", None) is None:  # DeepThinking's conv net: no patches, no timm family
        raise UserError(f"model {cfg.model.name} is not a ViT and has no timm entry point to export under; "
                        "use --format safetensors (recurvit.load reads it)")
    name = timm_name(cfg.model.name, model.cfg.patch_size, model.cfg.img_size, PRESET_FAMILY.get(family))
    if name is None:
        raise UserError(f"model {cfg.model.name} has no timm entry point to export under")
    return name


def _timm_twin(model, cfg):
    """The run's model built by ``timm.create_model`` (so it carries what ``save_for_hf`` reads: the factory's
    arguments, traits, ``pretrained_cfg``), holding the run's weights and preprocessing."""
    import timm

    args = {**model_args(cfg), "core": model.cfg.core}  # the entry point's preset may default to another core
    twin = timm.create_model(architecture(cfg, model), **args)
    twin.load_state_dict(model.state_dict())
    pre = {k: v for k, v in (getattr(model, "pretrained_cfg", None) or {}).items() if k != "recurvit_data"}
    twin.pretrained_cfg = {**twin.pretrained_cfg, **pre, "description": description(model, cfg)}
    return twin.eval(), args


def description(model, cfg) -> str:
    """What the exported model is, from the run itself (the preset's own words describe the preset: a bViT-Ti
    of "12 trained" steps, whatever the run was trained at): its model and core, the steps it was trained at,
    its width and its input."""
    c, T = model.cfg, model.nominal_steps
    how = {"recurrent": f"ONE block applied `steps` times ({T} trained)",
           "stack": f"a stack of {T} blocks"}.get(c.core, f"{c.core_cls.describe(c)} core, {T} steps trained")
    data = ((getattr(model, "pretrained_cfg", None) or {}).get("recurvit_data") or {}).get("name")
    return (f"{cfg.model.name}: {how}, width {c.embed_dim}, {c.img_size} px in {c.patch_size} px patches, "
            f"{c.in_chans} channel{'s' if c.in_chans != 1 else ''}, {c.num_classes} classes"
            + (f" ({data})" if data else ""))


def _exportable(loaded, source) -> None:
    """What an export refuses: NaN weights, and per-step adapters (they cannot be one set of weights)."""
    check_finite(loaded.model, source)
    if getattr(loaded.model, "adapters", None):
        raise UserError("a step-LoRA fine-tune cannot be exported as one set of weights; export its unrolled.pt")


def export_hf(loaded, out: Path) -> Path:
    """``out``: a new folder with config.json and model.safetensors of a loaded classifier
    (:func:`recurvit.run.load.load`), written by ``timm.models.save_for_hf`` under a temporary name and
    renamed when complete (a kill leaves no half folder)."""
    from timm.models import save_for_hf

    _exportable(loaded, loaded.source)
    model, cfg = loaded.model, loaded.config
    twin, args = _timm_twin(model, cfg)
    extra = {"label_names": twin.pretrained_cfg.get("label_names") or [],
             "recurvit": {"model": cfg.model.name, "data": loaded.data_record}}
    with staged_dir(Path(out)) as tmp:
        save_for_hf(twin, tmp, model_config=extra, model_args=args, safe_serialization=True)
    return Path(out)


def export_safetensors(loaded, out: Path) -> Path:
    """``out``: the weights of a loaded classifier as one new safetensors file whose header names the model and
    its preprocessing (``recurvit.load(out)`` rebuilds it), written atomically."""
    from safetensors.torch import save

    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; choose another OUT")
    output_dir(out.parent, "OUT")
    _exportable(loaded, loaded.source)
    model = loaded.model
    data = save({k: v.contiguous() for k, v in model.state_dict().items()},
                metadata=safetensors_metadata(model, loaded.config))
    atomic_write(out, lambda f: f.write(data), needed=len(data))
    return out


def safetensors_metadata(model, cfg) -> Dict[str, str]:
    """What ``load(FILE.safetensors)`` needs to rebuild the model, as a safetensors header entry."""
    data = (getattr(model, "pretrained_cfg", None) or {}).get("recurvit_data")
    args = {**model_args(cfg), "core": model.cfg.core}
    return {SAFETENSORS_KEY: json.dumps({"model": cfg.model.name, "model_args": args, "data": data})}
