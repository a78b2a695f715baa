"""recurvit export RUN --format hf|safetensors|torch-export|onnx --out OUT"""
from __future__ import annotations

from pathlib import Path

from . import add_out_arg, out_of, print_json


def add_parser(sub):
    p = sub.add_parser("export", help="a trained run in the Hugging Face / timm layout, or its weights as safetensors",
                       description="--format hf writes OUT/config.json (the timm architecture, every model argument "
                                   "and the preprocessing) and OUT/model.safetensors: timm.create_model("
                                   "'local-dir:OUT', pretrained=True) and recurvit.load_model(OUT) give the run's "
                                   "logits, and timm's push_to_hf_hub publishes it. --format safetensors writes the "
                                   "weights alone to OUT (a file). Example: recurvit export runs/digits-bvit_tiny-... "
                                   "--format hf --out exported/bvit-digits")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    add_out_arg(p, "output folder (hf) or file (safetensors, torch-export, onnx)", positional="out_positional")
    p.add_argument("--format", choices=("hf", "safetensors", "torch-export", "onnx"), default="hf",
                   help="what to write (torch-export: torch.export.export at the trained depth, dynamic batch, "
                        "saved with torch.export.save; load with torch.export.load(OUT).module()); onnx: the same through "
                        "torch.onnx.export (input 'images', output 'logits'; needs the onnx extra)")
    p.add_argument("--steps-program", action="store_true",
                   help="with --format onnx or torch-export: OUT is a folder of three programs, embed, step (one "
                        "application of the core's step) and readout, and manifest.json, that "
                        "recurvit.export.deploy.StepProgram runs with a per-image early exit (the ODE core has none)")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    return p


def run(args) -> int:
    from ..errors import UserError
    from ..export.hf import export_hf

    out_of(args)
    if args.steps_program:
        return _steps_program(args)
    if args.format == "hf":
        written = export_hf(args.run, args.out)
        files = sorted(str(p) for p in written.iterdir())
    elif args.format in ("torch-export", "onnx"):
        from ..export.program import export_program

        files = [str(export_program(args.run, args.out, args.format))]
    else:
        from safetensors.torch import save

        from ..run.atomic import atomic_write
        from ..run.checkpoint import check_finite
        from ..run.outputs import output_dir

        if args.out.exists():
            raise UserError(f"{args.out} exists; choose another OUT")
        output_dir(args.out.parent, "OUT")
        from ..export.hf import safetensors_metadata
        from ..run.checkpoint import load_model_and_config

        model, cfg = load_model_and_config(args.run)
        check_finite(model, args.run)
        data = save({k: v.contiguous() for k, v in model.state_dict().items()}, metadata=safetensors_metadata(model, cfg))
        atomic_write(args.out, lambda f: f.write(data), needed=len(data))
        files = [str(args.out)]
    if args.json:
        print_json({"run": str(args.run), "format": args.format, "files": files})
    else:
        print(f"wrote {', '.join(files)}")
    return 0


def _steps_program(args) -> int:
    from ..export.steps import export_steps

    files = sorted(str(p) for p in export_steps(args.run, args.out, args.format).iterdir())
    if args.json:
        print_json({"run": str(args.run), "format": args.format, "steps_program": True, "files": files})
    else:
        print(f"wrote {args.out}: {', '.join(Path(f).name for f in files)}")
    return 0
