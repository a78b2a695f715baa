"""recurvit analyze RUN_DIR [--what readout,norms,attention,cka,pruning] [--num-images N] [--out DIR] [--json]"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import DeprecatedOption, add_device_arg, add_force_arg, print_json


def add_parser(sub):
    p = sub.add_parser(
        "analyze", help="look inside a trained model step by step: readouts, attention, CKA, step-specific pruning",
        description="Writes CSVs and PNGs into DIR (default RUN_DIR/analysis): steps.csv/png (readout accuracy, "
                    "token-state norm, relative update per step), attention.csv/png (entropy and mean attention "
                    "distance per step and head), cka_tokens.csv / cka_pooled.csv / cka.png (linear CKA between "
                    "every pair of steps; 'emb' = the embedding), pruning_heads.csv / pruning_mlp.csv / "
                    "pruning_skip.csv / pruning.png (accuracy drop when one head, one MLP hidden slice, or the "
                    "whole block is masked at ONE step; with it, the fixed-point control: the accuracy lost when "
                    "the last step's update is replaced by the previous update continued, and the split-half "
                    "correlation of the map's step-specific part, even against odd images), summary.json. A stack "
                    "ViT is analysed layer by layer.")
    p.add_argument("run", type=Path, help="run directory or checkpoint (finetuned runs included)")
    p.add_argument("--what", default="readout,norms,attention,cka,pruning",
                   help="comma-separated subset of readout,norms,attention,cka,pruning (default: all)")
    p.add_argument("--num-images", type=int, default=512, help="test images used (a fixed random subset; default 512)")
    p.add_argument("--images", dest="num_images", type=int, action=DeprecatedOption, new="--num-images")
    p.add_argument("--steps", type=int, help="steps to run (default: the trained depth)")
    p.add_argument("--mlp-slices", type=int, help="MLP hidden units cut into this many slices (default: heads)")
    p.add_argument("--batch-size", type=int, default=256, help="images per forward pass (default 256)")
    p.add_argument("--out", type=Path, help="output directory (default RUN_DIR/analysis)")
    p.add_argument("--data-root", help="override data.root (data moved since training)")
    add_device_arg(p)
    add_force_arg(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def run(args) -> int:
    from ..analysis.per_step import ANALYSES
    from ..analysis.per_step_run import analyze_run, summary_lines

    what = [w.strip() for w in args.what.split(",") if w.strip()]
    bad = [w for w in what if w not in ANALYSES]
    if bad or not what:
        raise UserError(f"--what takes a comma-separated subset of {','.join(ANALYSES)}; got '{args.what}'")
    if args.num_images < 1:
        raise UserError(f"--num-images must be >= 1, got {args.num_images}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {args.batch_size}")
    res = analyze_run(args.run, what, args.num_images, args.steps, args.mlp_slices, args.batch_size, args.out,
                      device=args.device, data_root=args.data_root, force=args.force, progress=not args.json)
    if args.json:
        print_json({**res.summary, "files": res.files})
        return 0
    print(res.label)
    for line in summary_lines(res.summary):
        print(line)
    print(f"  wrote {len(res.files)} files to {res.summary['out']}")
    return 0
