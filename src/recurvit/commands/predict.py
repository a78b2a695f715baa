"""recurvit predict RUN IMAGE... | FOLDER [--topk K] [--steps K] [--json | --csv FILE]"""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from ..errors import UserError
from . import add_device_arg, add_force_arg, check_cost_of, load_trained, print_json


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


CSV_HEADER = ["image", "rank", "label", "prob"]  # the first line of every --csv file: the mark that it may be rewritten


def run(args) -> int:
    from ..export.predict import check_dense_sides, check_mazes, image_files, is_dense, predict, read_images
    from ..run.checkpoint import check_finite
    from ..run.device import pick_device
    from ..run.outputs import claim_file, write_text

    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    if args.csv:  # before any work: never over a file predict did not write (a checkpoint, a config)
        claim_file(args.csv, ",".join(CSV_HEADER).encode(), what="--csv")
    model = load_trained(args.run).classifier(args.run).model
    if not getattr(model, "pretrained_cfg", None):
        raise UserError(f"{args.run} carries no preprocessing and its data set is not at hand to derive it; "
                        "train it again with this recurvit (checkpoints now keep it)")
    check_finite(model, args.run)  # NaN weights would print "nan" probabilities
    model.to(pick_device(args.device))
    pairs, bad = read_images(image_files(args.images))
    if not pairs:  # one line: the first file's reason (the others are alike or listed with a readable one)
        name, why = bad[0] if bad else ("", "")
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UserError(f"none of the {len(bad)} files given could be read as an image: {name!r}: {why}{more}")
    for name, why in bad:
        print(f"skipped {name!r}: {why}", file=sys.stderr)
    dense = is_dense(model.pretrained_cfg)
    if dense and args.csv:
        raise UserError("--csv writes class rows; a maze run writes each image's path as NAME.path.png "
                        "(use --json for the list)")
    side = None
    if dense:  # each maze at its own size: checked, and the run priced at the largest, before any work
        pairs = [(n, im) for n, im in pairs if not Path(n).name.endswith(".path.png")] or pairs  # our own outputs
        check_mazes(pairs)  # a 1x1, 8x8 or 64x64 picture is no maze: one line, nothing written
        check_dense_sides(model, [(n, im.width) for n, im in pairs if im.width == im.height])
        side = max(im.width for _, im in pairs)
    if args.steps is not None:  # priced before it runs: --steps 1000000000 is refused, not a hang
        check_cost_of(model, len(pairs), args.batch_size, args.steps, args, side=side)
    preds = predict(model, [im for _, im in pairs], topk=args.topk, steps=args.steps, batch_size=args.batch_size,
                    names=[n for n, _ in pairs])
    if any(p.mask is not None for p in preds):
        return _write_paths(preds, bad, args)
    if args.json:
        print_json({"run": str(args.run), "predictions": [p.as_dict() for p in preds], "skipped": len(bad)})
    elif args.csv:
        f = io.StringIO(newline="")
        w = csv.writer(f)
        w.writerow(CSV_HEADER)
        for p in preds:
            w.writerows([p.source, k, name, f"{q:.6g}"] for k, (name, q) in enumerate(p.top, 1))
        write_text(args.csv, f.getvalue(), ",".join(CSV_HEADER).encode(), what="--csv")
        print(f"wrote {len(preds)} predictions to {args.csv}")
    else:
        for p in preds:
            print(p.source + "  " + "  ".join(f"{name} {q:.4f}" for name, q in p.top))
    if bad:
        print(f"{len(bad)} of {len(bad) + len(pairs)} files skipped (unreadable)", file=sys.stderr)
    return 0


def _write_paths(preds, bad, args) -> int:
    """A dense run's predictions: each image's predicted mask as NAME.path.png beside it (white: the path)."""
    from matplotlib.image import imsave

    from ..run.atomic import atomic_write
    from ..run.outputs import PNG, claim_file

    todo = [p for p in preds if not Path(p.source).name.endswith(".path.png")]  # an earlier predict's output
    dests = [Path(p.source).with_name(Path(p.source).stem + ".path.png") for p in todo]
    seen = {}
    for p, d in zip(todo, dests):  # maze.png and maze.bmp in one folder: one would overwrite the other
        if d in seen:
            raise UserError(f"{seen[d]} and {p.source} would both write {d}; rename one of them")
        seen[d] = p.source
    for d in dests:  # every destination before the first is written: a user's file stops it with nothing written
        claim_file(d, PNG, what="path image")
    out = []
    for p, dest in zip(todo, dests):
        mask = p.mask.numpy()
        atomic_write(dest, lambda f, m=mask: imsave(f, m, cmap="gray", vmin=0, vmax=1, format="png"))
        out.append({**p.as_dict(), "path_image": str(dest)})
    if args.json:
        print_json({"run": str(args.run), "predictions": out, "skipped": len(bad)})
    else:
        for d in out:
            print(f"{d['image']}  ->  {d['path_image']}  ({d['path_pixels']} path pixels)")
    if bad:
        print(f"{len(bad)} of {len(bad) + len(preds)} files skipped (unreadable)", file=sys.stderr)
    return 0
