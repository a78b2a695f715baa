"""A run in the Hugging Face / timm layout: a folder with ``config.json`` (the timm architecture, its
arguments and the preprocessing) and ``model.safetensors``, written by timm's own ``save_for_hf``.

    recurvit export RUN --format hf --out OUT
    timm.create_model("local-dir:OUT", pretrained=True)                 # the same logits as the run
    timm.create_model("local-dir:OUT", pretrained=True, num_classes=5)  # fine-tuning: a new head
    recurvit.load_model(OUT, core="ode")                                # through recurvit, with overrides
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

PRESET_FAMILY = {"vit": "bvit", "bvit": "bvit", "srvit": "srvit"}  # the timm families recurvit registers


def model_args(cfg) -> Dict[str, Any]:
    """The run's model config as ``create_model`` keyword arguments (core options flat)."""
    mc = {k: v for k, v in dataclasses.asdict(cfg.model).items() if v is not None and k != "name"}
    options = mc.pop("options", None) or {}
    return {**mc, **options}


def architecture(cfg, model) -> str:
    from ..models.registry import timm_name

    family = cfg.model.name.partition("_")[0]
    name = timm_name(cfg.model.name, model.cfg.patch_size, model.cfg.img_size, PRESET_FAMILY.get(family))
    if name is None:
        from ..errors import UserError

        raise UserError(f"model {cfg.model.name} has no timm entry point to export under")
    return name


def _timm_twin(model, cfg):
    """The run's model built by ``timm.create_model`` (so it carries what ``save_for_hf`` reads: the factory's
    arguments, traits, ``pretrained_cfg``), holding the run's weights and preprocessing."""
    import timm

    from ..models import timm_presets  # noqa: F401  (registers the names)

    args = {**model_args(cfg), "core": model.cfg.core}  # the entry point's preset may default to another core
    twin = timm.create_model(architecture(cfg, model), **args)
    twin.load_state_dict(model.state_dict())
    pre = {k: v for k, v in (getattr(model, "pretrained_cfg", None) or {}).items() if k != "recurvit_data"}
    twin.pretrained_cfg = {**twin.pretrained_cfg, **pre}
    return twin.eval(), args


def export_hf(run: Path, out: Path) -> Path:
    """``out``: a new folder with config.json and model.safetensors, written by ``timm.models.save_for_hf``
    under a temporary name and renamed when complete (a kill leaves no half folder)."""
    from timm.models import save_for_hf

    from ..errors import UserError
    from ..run.checkpoint import check_finite, load_model_and_config
    from ..run.outputs import staged_dir

    model, cfg = load_model_and_config(run)
    check_finite(model, run)
    if getattr(model, "adapters", None):
        raise UserError("a step-LoRA fine-tune cannot be exported as one set of weights; export its unrolled.pt")
    twin, args = _timm_twin(model, cfg)
    data = (getattr(model, "pretrained_cfg", None) or {}).get("recurvit_data")
    extra = {"label_names": twin.pretrained_cfg.get("label_names") or [],
             "recurvit": {"model": cfg.model.name, "data": data}}
    with staged_dir(Path(out)) as tmp:
        save_for_hf(twin, tmp, model_config=extra, model_args=args, safe_serialization=True)
    return Path(out)


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


def _recurvit_args(args: Dict[str, Any]) -> Dict[str, Any]:
    """timm's ``model_args`` as recurvit's ``create_model`` keywords (timm writes a size as [H, W])."""
    args = dict(args)
    for key in ("img_size", "patch_size"):
        if isinstance(args.get(key), (list, tuple)):
            args[key] = int(args[key][0])
    return args


def load_hf(path: Path, **overrides):
    """A folder written by :func:`export_hf`, as recurvit's model with its preprocessing; ``overrides`` are
    core options to run it with (``core="ode"``, ``steps=24``), as for a run directory."""
    from safetensors.torch import load_file

    from ..models import create_model
    from ..run.checkpoint import load_state
    from ..run.preprocessing import pretrained_cfg

    config = json.loads((Path(path) / "config.json").read_text())
    args = {**_recurvit_args(config["model_args"]), **{k: v for k, v in overrides.items() if v is not None}}
    model = create_model(config["recurvit"]["model"], **args)
    load_state(model, load_file(str(Path(path) / "model.safetensors")), path)
    data = config["recurvit"].get("data")
    if data:
        model.pretrained_cfg = pretrained_cfg(data, config["num_classes"])
    return model.eval()


SAFETENSORS_KEY = "recurvit"  # the safetensors header entry: {"model": preset, "model_args": ..., "data": ...}


def safetensors_metadata(model, cfg) -> Dict[str, str]:
    """What ``load_model(FILE.safetensors)`` needs to rebuild the model, as a safetensors header entry."""
    data = (getattr(model, "pretrained_cfg", None) or {}).get("recurvit_data")
    args = {**model_args(cfg), "core": model.cfg.core}
    return {SAFETENSORS_KEY: json.dumps({"model": cfg.model.name, "model_args": args, "data": data})}


def load_safetensors(path: Path, **overrides):
    """A ``.safetensors`` file written by ``recurvit export --format safetensors`` (its header says which
    model), or the ``model.safetensors`` of an exported folder (its ``config.json`` does)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from ..errors import UserError
    from ..models import create_model
    from ..run.checkpoint import load_state
    from ..run.preprocessing import pretrained_cfg

    path = Path(path)
    if is_hf_folder(path.parent) and path.name == "model.safetensors":
        return load_hf(path.parent, **overrides)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get(SAFETENSORS_KEY)
    except Exception as e:  # noqa: BLE001  (safetensors' errors are of several kinds)
        raise UserError(f"cannot read {path}: not a safetensors file ({str(e).strip()[:120]})") from None
    if not meta:
        raise UserError(f"{path} does not say which model its weights are for (not written by recurvit export "
                        "--format safetensors); build the model with recurvit.create_model and load_state_dict")
    meta = json.loads(meta)
    model = create_model(meta["model"], **{**meta["model_args"], **{k: v for k, v in overrides.items() if v is not None}})
    load_state(model, load_file(str(path)), path)
    if meta.get("data"):
        model.pretrained_cfg = pretrained_cfg(meta["data"], model.cfg.num_classes)
    return model.eval()
