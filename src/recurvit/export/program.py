"""A run as a program: ``torch.export`` (saved with ``torch.export.save``; ``torch.export.load(OUT).module()(x)``
gives the run's logits) or ONNX (``torch.onnx.export`` through the same tracer; run it with onnxruntime),
the model at its trained depth with a dynamic batch dimension.

``rgb=True`` (``--rgb``): the program takes what timm's onnx_validate.py feeds at its defaults, RGB images
normalised with ImageNet's mean / std (:class:`TimmDefaultInput`); its metadata then says so, and
:func:`onnx_validate_flags` gives the flags onnx_validate.py still needs for the run's resize and crop
(``--img-size`` unless 224; ``--crop-pct`` unless 0.875; ``--interpolation`` unless bicubic), which no
program can take over: they act on the image before it becomes a tensor."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..errors import UserError
from ..run.atomic import atomic_write
from ..run.checkpoint import check_finite
from ..run.load import load_model
from ..run.outputs import claim_file, output_dir, write_by_name

MAX_BATCH = 4096
TOOLS = {"torch-export": "torch.export", "onnx": "torch.onnx.export"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ONNX_KEY = "recurvit.preprocessing"  # the ONNX metadata entry: timm's data config keys, as JSON
DATA_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


def _reason(e: BaseException) -> str:
    """The first line of the innermost error, without terminal colour codes: torch.onnx wraps torch.export's
    failure in a several-line banner ("This is step 1/3 ... Next steps:") whose first line says nothing."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in ANSI.sub("", str(e)).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def preprocessing(model) -> Dict[str, Any]:
    """timm's data config of a model (its ``pretrained_cfg``) plus its class names, as stored in an export."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items() if k in DATA_KEYS}
    return {**out, "label_names": list(cfg.get("label_names") or [])}


def rgb_channels(model) -> int:
    """The channels a ``--rgb`` export of ``model`` reads (its own, or 3 for a grey model); one line why not
    for another count."""
    chans = model.cfg.in_chans
    if chans not in (1, 3):
        raise UserError(f"--rgb turns a grey (1-channel) model into a 3-channel one; this model takes {chans}")
    return 3


class TimmDefaultInput(torch.nn.Module):
    """``model`` behind the input timm's onnx_validate.py feeds at its defaults: RGB normalised with ImageNet's
    mean / std. Per channel, ``x * std_c / std + (mean_c - mean) / std`` gives back the run's normalisation
    (for a grey run that of the grey value: exact for a grey image read as RGB, R = G = B), and a grey model's
    patch convolution is replaced by timm's own ``adapt_input_conv`` of it (1 -> 3: the weights repeated and
    scaled by 1/3), so the three equal channels sum to the grey one (an RGB image is seen as the mean of its
    channels). The model is copied; ``pretrained_cfg`` describes the new input."""

    def __init__(self, model: torch.nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
        from timm.models import adapt_input_conv

        chans = rgb_channels(model)
        model = copy.deepcopy(model)
        proj = model.patch_embed.proj
        if proj.in_channels != chans:
            rgb = torch.nn.Conv2d(chans, proj.out_channels, proj.kernel_size, proj.stride, proj.padding,
                                  bias=proj.bias is not None)
            rgb.weight = torch.nn.Parameter(adapt_input_conv(chans, proj.weight.detach(), base_chans=proj.in_channels))
            rgb.bias = proj.bias
            model.patch_embed.proj = rgb
        own_mean, own_std = (torch.tensor([float(v) for v in vs] * (chans // len(vs))) for vs in (mean, std))
        in_mean, in_std = torch.tensor(IMAGENET_DEFAULT_MEAN), torch.tensor(IMAGENET_DEFAULT_STD)
        self.register_buffer("scale", (in_std / own_std).view(1, chans, 1, 1))  # (1, 3, 1, 1)
        self.register_buffer("shift", ((in_mean - own_mean) / own_std).view(1, chans, 1, 1))
        self.model, self.cfg = model, model.cfg
        pre = dict(getattr(model, "pretrained_cfg", None) or {})
        size = tuple(pre.get("input_size") or (model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size))
        self.pretrained_cfg = {**pre, "input_size": (chans, *size[1:]), "mean": IMAGENET_DEFAULT_MEAN,
                               "std": IMAGENET_DEFAULT_STD}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x * self.scale + self.shift)


def timm_default_input(model: torch.nn.Module) -> TimmDefaultInput:
    """:class:`TimmDefaultInput` of a model with its run's mean / std (one line when they are not known)."""
    pre = getattr(model, "pretrained_cfg", None) or {}
    if not pre.get("mean") or not pre.get("std"):
        raise UserError("--rgb needs the run's mean / std, and this model carries none (export a run directory, "
                        "a checkpoint or an hf export)")
    if getattr(getattr(model, "patch_embed", None), "proj", None) is None:
        raise UserError(f"--rgb adapts a patch embedding's convolution; a {type(model).__name__} has none")
    return TimmDefaultInput(model, pre["mean"], pre["std"])


def onnx_validate_flags(pre: Dict[str, Any]) -> Optional[List[str]]:
    """The flags timm's onnx_validate.py needs, beyond its defaults, to feed a program with preprocessing
    ``pre`` (:func:`preprocessing`) as the run was fed: None when it cannot (its loader reads RGB images, so
    a program of other than 3 channels needs ``--rgb``; mean / std are flags too without it)."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    size = tuple(pre.get("input_size") or ())
    if len(size) != 3 or size[0] != 3:
        return None
    flags = [] if size[1:] == (224, 224) else ["--img-size", str(size[-1])]
    if pre.get("crop_pct") is not None and float(pre["crop_pct"]) != 0.875:
        flags += ["--crop-pct", f"{float(pre['crop_pct']):g}"]
    if pre.get("interpolation") and pre["interpolation"] != "bicubic":  # its default without a model
        flags += ["--interpolation", pre["interpolation"]]
    for key, default in (("mean", IMAGENET_DEFAULT_MEAN), ("std", IMAGENET_DEFAULT_STD)):
        values = tuple(float(v) for v in pre.get(key) or default)
        if any(abs(a - b) > 1e-9 for a, b in zip(values, default)):
            flags += [f"--{key}", *(f"{v:g}" for v in values)]
    return flags


def compact_onnx(program) -> None:
    """Store every weight once in a ``torch.onnx.export`` program (in place). The exporter's optimizer folds a
    weight's Transpose into a constant only below a size limit and merges equal constants only below another,
    so in a model that applies one block T times a small weight came out once per application (a bViT of
    width 64: six copies of the 64 x 64 attention projection, 295 KiB stored for 215 KiB of parameters) and
    the larger ones stayed behind a Transpose, which onnxruntime's int8 quantizer does not see through.
    Folding every constant and merging equal ones, without the limits, leaves one initializer a weight, in
    the layout MatMul reads (tests/export/test_steps.py checks the bytes and the outputs)."""
    import onnxscript
    from onnx_ir.passes.common import DeduplicateInitializersPass

    unlimited = 1 << 62
    onnxscript.optimizer.optimize(program.model, input_size_limit=unlimited, output_size_limit=unlimited)
    DeduplicateInitializersPass(size_limit=unlimited)(program.model)


def read_preprocessing(path: Path) -> Dict[str, Any]:
    """The preprocessing an ONNX file exported by recurvit carries (``metadata_props``): pass it to
    ``timm.data.resolve_data_config(args)`` to build the run's own eval transform."""
    import onnx

    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    if ONNX_KEY not in props:
        raise UserError(f"{path} carries no preprocessing (not exported by this recurvit); pass timm's --img-size "
                        "--mean --std --crop-pct --interpolation by hand")
    data = json.loads(props[ONNX_KEY])
    return {k: tuple(v) if isinstance(v, list) and k != "label_names" else v for k, v in data.items()}


def export_program(run, out: Path, fmt: str = "torch-export", rgb: bool = False) -> Path:
    """``recurvit export RUN --format onnx|torch-export --out OUT [--rgb]``: the whole model at its trained depth,
    one program. ``run``: anything ``recurvit.load_model`` reads, or a model instance. ``rgb``: the program
    takes RGB normalised with ImageNet's mean / std (:class:`TimmDefaultInput`)."""
    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; choose another OUT")
    output_dir(out.parent, "OUT")  # a missing parent folder is made; an unwritable one is one line, before the work
    if fmt == "onnx":
        try:
            import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
        except ImportError:
            raise UserError("--format onnx needs the onnx extra: pip install -e '.[onnx]'") from None
    model = run if isinstance(run, torch.nn.Module) else load_model(run)
    check_finite(model, "the model" if isinstance(run, torch.nn.Module) else run)
    model = model.cpu().eval()
    if rgb:
        model = timm_default_input(model).eval()
    c = model.cfg
    chans = model.pretrained_cfg["input_size"][0] if rgb else c.in_chans
    x = torch.zeros(2, chans, c.img_size, c.img_size)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    logging.disable(logging.CRITICAL)  # torch's tracing warnings would print dozens of lines before the one below
    try:
        # its progress lines, and the graph it prints when tracing fails
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            if fmt == "onnx":
                program = torch.onnx.export(model, (x,), None, dynamo=True, dynamic_shapes=({0: batch},),
                                            input_names=["images"], output_names=["logits"])
                compact_onnx(program)
            else:
                program = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    except Exception as e:  # noqa: BLE001  (torch.export's failures are many kinds; each is one line here)
        first = _reason(e)
        hint = (" (a data-dependent check in the forward pass: the ODE core's solver, torchdiffeq, asserts on its "
                "time grid)" if "data-dependent" in first else "")
        raise UserError(f"the {c.core_cls.describe(c)} core cannot be exported with {TOOLS[fmt]}: "
                        f"{first[:160]}{hint}") from None
    finally:
        logging.disable(logging.NOTSET)
    if fmt == "onnx":
        program.model.metadata_props[ONNX_KEY] = json.dumps(preprocessing(model))
        return write_by_name(out, program.save)
    buf = io.BytesIO()  # in memory first: torch's own file writer aborts the process on a full disk
    torch.export.save(program, buf)
    data = buf.getvalue()
    atomic_write(claim_file(out, None, "OUT"), lambda f: f.write(data), needed=len(data))
    return out
