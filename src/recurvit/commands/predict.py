"""recurvit predict RUN IMAGE... | FOLDER [--topk K] [--steps K] [--json | --csv FILE]"""
from __future__ import annotations

import sys
from pathlib import Path

from . import add_device_arg, add_force_arg, print_json


def add_parser(sub):
    p = sub.add_parser("predict", help="class names and probabilities for your own images",
                       description="Predicts each image with the run's own preprocessing (its input size, channels "
                                   "and mean / std, kept in the checkpoint). A folder is read recursively. An "
                                   "unreadable file is one line on stderr and skipped (with a count at the end). "
                                   "Examples: recurvit predict runs/digits-bvit_tiny-... my_digits/ --topk 3; "
                                   "recurvit predict RUN cat.png --json. A dense (maze) run writes each image's "
                                   "predicted path beside it, as NAME.path.png: recurvit predict MAZE_RUN maze.png "
                                   "--steps 120")
    p.add_argument("run", type=Path, help="run directory, checkpoint, or a model written by recurvit export "
                   "(an hf folder or a .safetensors file)")
    p.add_argument("images", nargs="+", type=Path, help="image files or folders of images")
    p.add_argument("--topk", type=int, default=5, help="classes to print per image")
    p.add_argument("--steps", type=int, help="steps to run (default: the trained depth)")
    p.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    add_force_arg(p)
    add_device_arg(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the predictions as JSON")
    out.add_argument("--csv", type=Path, metavar="FILE", help="write image, rank, label, prob rows to FILE")
    return p


def run(args) -> int:
    from ..export.predict_run import predict_files

    res = predict_files(args.run, args.images, topk=args.topk, steps=args.steps, batch_size=args.batch_size,
                        csv=args.csv, device=args.device, force=args.force)
    if args.json:
        print_json(res.summary)
    else:
        for line in res.lines:
            print(line)
    if res.note:
        print(res.note, file=sys.stderr)
    return 0
