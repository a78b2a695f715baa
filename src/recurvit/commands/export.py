"""recurvit export RUN --format hf|timm|safetensors|torch-export|onnx --out OUT [--rgb] [--steps-program [--fused]] [--int8]"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import add_out_arg, out_of, print_json


def add_parser(sub):
    p = sub.add_parser("export", help="a trained run in the Hugging Face / timm layout, or its weights as safetensors",
                       description="--format hf writes OUT/config.json (the timm architecture, every model argument "
                                   "and the preprocessing) and OUT/model.safetensors: timm.create_model("
                                   "'local-dir:OUT', pretrained=True) and recurvit.load_model(OUT) give the run's "
                                   "logits, and timm's push_to_hf_hub publishes it. --format safetensors writes the "
                                   "weights alone to OUT (a file). --format timm writes a STANDARD timm vit_* "
                                   "(the shared block copied into every block) that timm loads with no recurvit "
                                   "installed. Example: recurvit export runs/digits-bvit_tiny-... "
                                   "--format hf --out exported/bvit-digits")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    add_out_arg(p, "output folder (hf, timm) or file (safetensors, torch-export, onnx)", positional="out_positional")
    p.add_argument("--format", choices=("hf", "timm", "safetensors", "torch-export", "onnx"), default="hf",
                   help="what to write (timm: timm's own VisionTransformer, vit_{tiny,small,base}_patch16_224 with "
                        "the real shape in model_args and depth = the trained steps, for a plain bViT (no step "
                        "conditioning, no re-injection) or a stack ViT; other models are refused in one line; "
                        "torch-export: torch.export.export at the trained depth, dynamic batch, "
                        "saved with torch.export.save; load with torch.export.load(OUT).module()); onnx: the same through "
                        "torch.onnx.export (input 'images', output 'logits'; needs the onnx extra)")
    p.add_argument("--rgb", action="store_true",
                   help="with --format timm, onnx or torch-export: the export reads 3-channel images as timm's "
                        "scripts feed them at their defaults (a grey model's patch convolution adapted by timm's "
                        "adapt_input_conv; grey images read as RGB give the run's logits); onnx / torch-export "
                        "also take ImageNet's mean / std, what onnx_validate.py assumes (the run's own applied "
                        "inside), and the command prints the flags onnx_validate.py still needs")
    p.add_argument("--steps-program", action="store_true",
                   help="with --format onnx or torch-export: OUT is a folder of three programs, embed, step (one "
                        "application of the core's step) and readout, and manifest.json, that "
                        "recurvit.export.deploy.StepProgram runs with a per-image early exit (the ODE core has none)")
    p.add_argument("--fused", action="store_true",
                   help="with --steps-program: also write fused programs, the step and the readout after it in one "
                        "program (outputs: the next state, logits, max-softmax confidence), so a runtime deciding "
                        "an exit after every step makes one call a step")
    p.add_argument("--int8", action="store_true",
                   help="with --format onnx: the MatMul weights stored as int8 (onnxruntime's dynamic "
                        "quantization; LayerNorms, biases, embeddings and the patch convolution stay fp32), of the "
                        "whole model or of every step program")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    return p


def run(args) -> int:
    from . import load_trained
    from ..run.atomic import follow_umask

    out_of(args)
    if args.out.is_symlink():  # an OUT that exists, as every format refuses it: a link (to a folder, a file or
        raise UserError(f"{args.out} exists; choose another OUT")  # nothing) is never written through
    if args.rgb and (args.steps_program or args.format not in ("timm", "onnx", "torch-export")):
        raise UserError("--rgb applies to --format timm, onnx or torch-export (the whole model), not "
                        f"{'--steps-program' if args.steps_program else '--format ' + args.format}")
    if args.int8:
        return _int8(args)
    if args.steps_program:
        return _steps_program(args)
    extra = {}
    if args.format in ("torch-export", "onnx"):
        from ..export.program import export_program, onnx_validate_flags, read_preprocessing

        files = [str(export_program(args.run, args.out, args.format, rgb=args.rgb))]
        if args.format == "onnx":
            extra["onnx_validate_flags"] = onnx_validate_flags(read_preprocessing(args.out))
    elif args.format == "timm":
        from ..export.timm_format import export_timm

        files = sorted(str(p) for p in export_timm(args.run, args.out, rgb=args.rgb).iterdir())
    else:
        from ..export.hf import export_hf, export_safetensors

        loaded = load_trained(args.run).classifier(args.run)
        if args.format == "hf":
            files = sorted(str(p) for p in export_hf(loaded, args.out).iterdir())
        else:
            files = [str(export_safetensors(loaded, args.out))]
    follow_umask(args.out)  # what temp files and folders left private, as a plain write would have it
    if args.json:
        print_json({"run": str(args.run), "format": args.format, "rgb": args.rgb, "files": files, **extra})
    else:
        print(f"wrote {', '.join(files)}")
        if "onnx_validate_flags" in extra:
            print(_onnx_validate_line(extra["onnx_validate_flags"]))
    return 0


def _onnx_validate_line(flags) -> str:
    if flags is None:
        return "timm's onnx_validate.py feeds RGB images: export with --rgb for a program it can read"
    return (f"timm's onnx_validate.py: python onnx_validate.py DATA --onnx-input OUT {' '.join(flags)}".rstrip()
            + ("" if flags else " (its defaults)"))


def _steps_program(args) -> int:
    from ..export.steps import export_steps
    from ..run.atomic import follow_umask

    files = sorted(str(p) for p in export_steps(args.run, args.out, args.format, fused=args.fused).iterdir())
    follow_umask(args.out)
    if args.json:
        print_json({"run": str(args.run), "format": args.format, "steps_program": True, "files": files})
    else:
        print(f"wrote {args.out}: {', '.join(Path(f).name for f in files)}")
    return 0


def _int8(args) -> int:
    """The fp32 export written to a scratch folder beside OUT, then quantized into OUT (which appears whole
    or not at all); the scratch goes either way (one a kill left behind: with the next such export)."""
    from ..export.int8 import quantize_model, quantize_steps
    from ..run.atomic import follow_umask, scratch_dir
    from ..run.outputs import output_dir

    if args.format != "onnx":
        raise UserError(f"--int8 quantizes ONNX weights, not {args.format}: add --format onnx")
    final = Path(args.out)
    if final.exists():
        raise UserError(f"{final} exists; choose another OUT")
    output_dir(final.parent, "OUT")
    with scratch_dir(final.parent, final.name, "fp32") as scratch:  # a killed export's goes with the next one
        try:
            args.out = scratch / final.name
            if args.steps_program:
                from ..export.steps import export_steps

                quantize_steps(export_steps(args.run, args.out, "onnx", fused=args.fused), final)
                files = sorted(str(p) for p in final.iterdir())
            else:
                from ..export.program import export_program

                files = [str(quantize_model(export_program(args.run, args.out, "onnx", rgb=args.rgb), final))]
        finally:
            args.out = final
    follow_umask(final)
    if args.json:
        print_json({"run": str(args.run), "format": "onnx", "steps_program": args.steps_program, "int8": True,
                    "files": files})
    else:
        print(f"wrote {', '.join(files)} (int8 MatMul weights)")
    return 0
