"""A run as a program: ``torch.export`` (saved with ``torch.export.save``; ``torch.export.load(OUT).module()(x)``
gives the run's logits) or ONNX (``torch.onnx.export`` through the same tracer; run it with onnxruntime),
the model at its trained depth with a dynamic batch dimension."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from pathlib import Path
from typing import Any, Dict

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


def compact_onnx(program) -> None:
    """Store every weight once in a ``torch.onnx.export`` program (in place). The exporter's optimizer folds a
    weight's Transpose into a constant only below a size limit and merges equal constants only below another,
    so in a model that applies one block T times a small weight came out once per application (a bViT of
    width 64: six copies of the 64 x 64 attention projection, 295 KiB stored for 215 KiB of parameters) and
    the larger ones stayed behind a Transpose, which onnxruntime's int8 quantizer does not see through.
    Folding every constant and merging equal ones, without the limits, leaves one initializer a weight, in
    the layout MatMul reads (tests/test_steps_export.py checks the bytes and the outputs)."""
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


def export_program(run, out: Path, fmt: str = "torch-export") -> Path:
    """``recurvit export RUN --format onnx|torch-export --out OUT``: the whole model at its trained depth, one
    program. ``run``: anything ``recurvit.load_model`` reads, or a model instance."""
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
    c = model.cfg
    x = torch.zeros(2, c.in_chans, c.img_size, c.img_size)
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
