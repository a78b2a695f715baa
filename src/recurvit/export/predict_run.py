"""The whole of ``recurvit predict``: a run's predictions for image files and folders (:mod:`.predict`, with the
run's own preprocessing), each unreadable file skipped with a line, written where asked: a CSV of class rows, or
a dense (maze) run's predicted path beside each maze as NAME.path.png.

    res = predict_files("runs/RUN", ["my_digits/"], topk=3, csv=Path("predictions.csv"))
    res.summary                                 # what ``recurvit predict --json`` prints
    print("\n".join(res.lines))                 # what it prints otherwise
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from ..errors import UserError
from .predict import Prediction, check_dense_sides, check_mazes, image_files, is_dense, predict, read_images

CSV_HEADER = ["image", "rank", "label", "prob"]  # the first line of every --csv file: the mark that it may be rewritten
PATH_SUFFIX = ".path.png"  # a dense run's predicted path, written beside its maze as NAME.path.png


class PredictRun(NamedTuple):
    """What :func:`predict_files` made: the predictions (``recurvit predict --json``), the same in words (or
    the CSV written), and the count of unreadable files skipped (None: none)."""

    summary: dict
    lines: List[str]
    note: Optional[str]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def predict_files(run: Union[str, Path], images: Sequence[Union[str, Path]], topk: int = 5,
                  steps: Optional[int] = None, batch_size: int = 64, csv: Optional[Path] = None,
                  device: str = "auto", force: bool = False, warn: Callable[[str], None] = _stderr) -> PredictRun:
    """The predictions of the run at ``run`` (a run directory, checkpoint or export) for the image files and
    folders ``images``: each unreadable file one line to ``warn`` and skipped; ``csv``: class rows written to
    that file (claimed before any work); a dense (maze) run's masks written beside each maze as NAME.path.png.
    ``steps`` (priced first: ``force`` runs work estimated far beyond this machine) and ``device`` as the run
    is run."""
    from ..analysis.budget import check_images_cost
    from ..run.checkpoint import check_finite
    from ..run.device import pick_device
    from ..run.load import load
    from ..run.outputs import claim_file

    if steps is not None and steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    if csv:  # before any work: never over a file predict did not write (a checkpoint, a config)
        claim_file(csv, ",".join(CSV_HEADER).encode(), what="--csv")
    model = load(run).classifier(run).model
    if not getattr(model, "pretrained_cfg", None):
        raise UserError(f"{run} carries no preprocessing and its data set is not at hand to derive it; "
                        "train it again with this recurvit (checkpoints now keep it)")
    check_finite(model, run)  # NaN weights would print "nan" probabilities
    model.to(pick_device(device))
    pairs, bad = _readable(images, warn)
    dense = is_dense(model.pretrained_cfg)
    if dense and csv:
        raise UserError("--csv writes class rows; a maze run writes each image's path as NAME.path.png "
                        "(use --json for the list)")
    side = None
    if dense:  # each maze at its own size: checked, and the run priced at the largest, before any work
        pairs = [(n, im) for n, im in pairs if not Path(n).name.endswith(PATH_SUFFIX)] or pairs  # our own outputs
        check_mazes(pairs)  # a 1x1, 8x8 or 64x64 picture is no maze: one line, nothing written
        check_dense_sides(model, [(n, im.width) for n, im in pairs if im.width == im.height])
        side = max(im.width for _, im in pairs)
    if steps is not None:  # priced before it runs: --steps 1000000000 is refused, not a hang
        check_images_cost(model, len(pairs), batch_size, steps, force=force, side=side)
    preds = predict(model, [im for _, im in pairs], topk=topk, steps=steps, batch_size=batch_size,
                    names=[n for n, _ in pairs])
    note = f"{len(bad)} of {len(bad) + len(pairs)} files skipped (unreadable)" if bad else None
    if any(p.mask is not None for p in preds):
        out = _write_paths(preds)
        return PredictRun({"run": str(run), "predictions": out, "skipped": len(bad)},
                          [f"{d['image']}  ->  {d['path_image']}  ({d['path_pixels']} path pixels)" for d in out], note)
    if csv:
        lines = [_write_csv(preds, csv)]
    else:
        lines = [p.source + "  " + "  ".join(f"{name} {q:.4f}" for name, q in p.top) for p in preds]
    return PredictRun({"run": str(run), "predictions": [p.as_dict() for p in preds], "skipped": len(bad)}, lines,
                      note)


def _readable(images: Sequence[Union[str, Path]], warn: Callable[[str], None]) -> Tuple[list, list]:
    """(readable (name, image) pairs, unreadable (name, reason) pairs) of the files and folders ``images``:
    each unreadable one a line to ``warn``; none readable is one line."""
    pairs, bad = read_images(image_files(images))
    if not pairs:  # one line: the first file's reason (the others are alike or listed with a readable one)
        name, why = bad[0] if bad else ("", "")
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UserError(f"none of the {len(bad)} files given could be read as an image: {name!r}: {why}{more}")
    for name, why in bad:
        warn(f"skipped {name!r}: {why}")
    return pairs, bad


def _write_csv(preds: Sequence[Prediction], path: Path) -> str:
    """Class rows (image, rank, label, prob) to ``path``; the line that says so."""
    import csv
    import io

    from ..run.outputs import write_text

    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(CSV_HEADER)
    for p in preds:
        w.writerows([p.source, k, name, f"{q:.6g}"] for k, (name, q) in enumerate(p.top, 1))
    write_text(path, f.getvalue(), ",".join(CSV_HEADER).encode(), what="--csv")
    return f"wrote {len(preds)} predictions to {path}"


def _write_paths(preds: Sequence[Prediction]) -> List[Dict[str, Any]]:
    """A dense run's predictions: each image's predicted mask as NAME.path.png beside it (white: the path);
    each prediction's dict with its ``path_image``."""
    from matplotlib.image import imsave

    from ..run.atomic import atomic_write
    from ..run.outputs import PNG, claim_file

    todo = [p for p in preds if not Path(p.source).name.endswith(PATH_SUFFIX)]  # an earlier predict's output
    dests = [Path(p.source).with_name(Path(p.source).stem + PATH_SUFFIX) for p in todo]
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
    return out


__all__ = ["CSV_HEADER", "PredictRun", "predict_files"]
