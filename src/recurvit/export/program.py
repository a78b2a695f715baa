"""A run as a program: ``torch.export`` (saved with ``torch.export.save``; ``torch.export.load(OUT).module()(x)``
gives the run's logits) or ONNX (``torch.onnx.export`` through the same tracer; run it with onnxruntime),
the model at its trained depth with a dynamic batch dimension."""
from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import torch

MAX_BATCH = 4096
TOOLS = {"torch-export": "torch.export", "onnx": "torch.onnx.export"}


def export_program(run: Path, out: Path, fmt: str = "torch-export") -> Path:
    from ..errors import UserError
    from ..train.checkpoint import atomic_write, check_finite, load_model
    from ..train.outputs import claim_file, output_dir, write_by_name

    out = Path(out)
    if out.exists():
        raise UserError(f"{out} exists; choose another OUT")
    output_dir(out.parent, "OUT")  # a missing parent folder is made; an unwritable one is one line, before the work
    if fmt == "onnx":
        try:
            import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
        except ImportError:
            raise UserError("--format onnx needs the onnx extra: pip install -e '.[onnx]'") from None
    model = load_model(run).cpu().eval()
    check_finite(model, run)
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
            else:
                program = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    except Exception as e:  # noqa: BLE001  (torch.export's failures are many kinds; each is one line here)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = (" (a data-dependent check in the forward pass: the ODE core's solver, torchdiffeq, asserts on its "
                "time grid)" if "data-dependent" in first else "")
        raise UserError(f"the {c.core_cls.describe(c)} core cannot be exported with {TOOLS[fmt]}: "
                        f"{first[:160]}{hint}") from None
    finally:
        logging.disable(logging.NOTSET)
    if fmt == "onnx":
        return write_by_name(out, program.save)
    buf = io.BytesIO()  # in memory first: torch's own file writer aborts the process on a full disk
    torch.export.save(program, buf)
    data = buf.getvalue()
    atomic_write(claim_file(out, None, "OUT"), lambda f: f.write(data), needed=len(data))
    return out
