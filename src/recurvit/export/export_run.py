"""One export of a trained run in the format asked (``recurvit export``): OUT checked as that format needs it,
the format's writer called (``hf``, ``program``, ``timm_format``, ``steps``, ``int8``), and what was written.

    res = export_run("runs/RUN", Path("exported/bvit"), "hf")          # OUT/config.json, OUT/model.safetensors
    export_run(RUN, Path("bvit.onnx"), "onnx", int8=True)              # int8 MatMul weights
    export_run(RUN, Path("steps"), "onnx", steps_program=True, fused=True)
    res.summary                                                        # what ``recurvit export --json`` prints
    print("\\n".join(res.lines))                                        # what it prints otherwise
"""
from __future__ import annotations

from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Union

from ..errors import UserError
from ..run.atomic import follow_umask

RGB_FORMATS = ("timm", "onnx", "torch-export")  # the whole model, exported to read 3-channel images


class Exported(NamedTuple):
    """What :func:`export_run` wrote: its summary (``recurvit export --json``) and the same in words."""

    summary: dict
    lines: List[str]


def export_run(run: Union[str, Path], out: Path, fmt: str = "hf", rgb: bool = False, steps_program: bool = False,
               fused: bool = False, int8: bool = False) -> Exported:
    """The run at ``run`` (a run directory or checkpoint) written to ``out`` (a folder for hf, timm and a
    steps program; else a file) in format ``fmt`` (hf, timm, safetensors, torch-export or onnx); ``rgb``: the
    whole model reading 3-channel images (:data:`RGB_FORMATS`); ``steps_program``: embed / step / readout
    programs (``fused``: also the step and readout in one); ``int8``: ONNX MatMul weights quantized. An
    ``out`` that exists, or is a link, is refused, as is an option its format does not take."""
    out = Path(out)
    if out.is_symlink():  # an OUT that exists, as every format refuses it: a link (to a folder, a file or
        raise UserError(f"{out} exists; choose another OUT")  # nothing) is never written through
    if rgb and (steps_program or fmt not in RGB_FORMATS):
        raise UserError("--rgb applies to --format timm, onnx or torch-export (the whole model), not "
                        f"{'--steps-program' if steps_program else '--format ' + fmt}")
    if fused and not steps_program:
        raise UserError("--fused joins the step and the readout of a --steps-program export; add --steps-program")
    if int8:
        return _int8(run, out, fmt, rgb, steps_program, fused)
    if steps_program:
        return _steps_program(run, out, fmt, fused)
    summary = {"run": str(run), "format": fmt, "rgb": rgb, "files": _whole_model(run, out, fmt, rgb)}
    if fmt == "onnx":
        from .program import onnx_validate_flags, read_preprocessing

        summary["onnx_validate_flags"] = onnx_validate_flags(read_preprocessing(out))
    lines = [f"wrote {', '.join(summary['files'])}"]
    if "onnx_validate_flags" in summary:
        lines.append(onnx_validate_line(summary["onnx_validate_flags"]))
    return Exported(summary, lines)


def _whole_model(run, out: Path, fmt: str, rgb: bool) -> List[str]:
    """The files of the whole model exported in ``fmt`` (umask-readable, as a plain write would leave them)."""
    if fmt in ("torch-export", "onnx"):
        from .program import export_program

        files = [str(export_program(run, out, fmt, rgb=rgb))]
    elif fmt == "timm":
        from .timm_format import export_timm

        files = sorted(str(p) for p in export_timm(run, out, rgb=rgb).iterdir())
    else:
        from ..run.load import load
        from .hf import export_hf, export_safetensors

        loaded = load(run).classifier(run)
        if fmt == "hf":
            files = sorted(str(p) for p in export_hf(loaded, out).iterdir())
        else:
            files = [str(export_safetensors(loaded, out))]
    follow_umask(out)  # what temp files and folders left private, as a plain write would have it
    return files


def onnx_validate_line(flags: Optional[Sequence[str]]) -> str:
    """How timm's onnx_validate.py reads an ONNX export (``flags``: :func:`.program.onnx_validate_flags`)."""
    if flags is None:
        return "timm's onnx_validate.py feeds RGB images: export with --rgb for a program it can read"
    return (f"timm's onnx_validate.py: python onnx_validate.py DATA --onnx-input OUT {' '.join(flags)}".rstrip()
            + ("" if flags else " (its defaults)"))


def _steps_program(run, out: Path, fmt: str, fused: bool) -> Exported:
    from .steps import export_steps

    files = sorted(str(p) for p in export_steps(run, out, fmt, fused=fused).iterdir())
    follow_umask(out)
    return Exported({"run": str(run), "format": fmt, "steps_program": True, "files": files},
                    [f"wrote {out}: {', '.join(Path(f).name for f in files)}"])


def _int8(run, final: Path, fmt: str, rgb: bool, steps_program: bool, fused: bool) -> Exported:
    """The fp32 export written to a scratch folder beside OUT, then quantized into OUT (which appears whole
    or not at all); the scratch goes either way (one a kill left behind: with the next such export)."""
    from ..run.atomic import scratch_dir
    from ..run.outputs import output_dir
    from .int8 import quantize_model, quantize_steps

    if fmt != "onnx":
        raise UserError(f"--int8 quantizes ONNX weights, not {fmt}: add --format onnx")
    if final.exists():
        raise UserError(f"{final} exists; choose another OUT")
    output_dir(final.parent, "OUT")
    with scratch_dir(final.parent, final.name, "fp32") as scratch:  # a killed export's goes with the next one
        fp32 = scratch / final.name
        if steps_program:
            from .steps import export_steps

            quantize_steps(export_steps(run, fp32, "onnx", fused=fused), final)
            files = sorted(str(p) for p in final.iterdir())
        else:
            from .program import export_program

            files = [str(quantize_model(export_program(run, fp32, "onnx", rgb=rgb), final))]
    follow_umask(final)
    return Exported({"run": str(run), "format": "onnx", "steps_program": steps_program, "int8": True,
                     "files": files}, [f"wrote {', '.join(files)} (int8 MatMul weights)"])


__all__ = ["Exported", "RGB_FORMATS", "export_run", "onnx_validate_line"]
