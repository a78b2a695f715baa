"""recurvit export RUN --format hf|timm|safetensors|torch-export|onnx --out OUT [--rgb] [--steps-program [--fused]] [--int8]"""
from __future__ import annotations

from pathlib import Path

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
    from ..export.export_run import export_run

    res = export_run(args.run, out_of(args), args.format, rgb=args.rgb, steps_program=args.steps_program,
                     fused=args.fused, int8=args.int8)
    if args.json:
        print_json(res.summary)
    else:
        for line in res.lines:
            print(line)
    return 0
