"""Fork a run's resume state into a new run directory, the recurrent block's lr scale or the recurrent depth
changed: how issue 55's ablations branch off a pilot that keeps training, by a command instead of a hand edit.

    python scripts/fork_run.py ../pilot/dt16 --out ../pilot/ablate_clip --block-lr-scale 1
    recurvit train --resume ../pilot/ablate_clip train.epochs=31 train.grad_clip=2.0
    python scripts/fork_run.py ../pilot/dt16 --out ../pilot/ablate_t12 --steps 12

Copies RUN's config.yaml, metrics.jsonl and last.pt to OUT (not best.pt or kept checkpoints: the fork starts at
last.pt's epoch). With ``--block-lr-scale S`` every optimizer group that carries an ``lr_scale`` (the shared
recurrent block's, under ``train.lr_throttle`` / ``train.block_lr_scale``) gets ``lr_scale`` S; ``recurvit train
--resume`` sets each group's lr from it (train/optim.py ``follow_config``). A resume cannot change
``train.lr_throttle`` or ``train.block_lr_scale`` (they define what is trained), so OUT's config.yaml still says the
parent's values and OUT/fork.json records the parent, its epoch and what was changed. Keys a resume may change
(``train.grad_clip``, ``train.epochs``, ...) are given on the resume's command line, as above. Without
``--block-lr-scale`` the fork is an exact copy: resumed, it trains the parent's next epoch bit for bit.

With ``--steps T`` OUT's config.yaml says ``model.steps=T`` (the recurrent depth it trains and validates at from
here on; the shared block's weights do not depend on it), and so does the config last.pt carries. A resume
refuses ``model.steps`` (the model defines what is trained), so the fork is where it changes, recorded in
fork.json. The block's lr scale is NOT rescaled to 1 / T: it stays the parent's unless ``--block-lr-scale`` says
otherwise, so depth and lr are separate ablations.

A RUN without last.pt, an OUT that exists and is not empty, a scale that is not a positive number, a depth that is
not a positive integer, or a last.pt with no group carrying an lr_scale: one line on stderr, exit status 2, nothing
written.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

from recurvit.errors import UserError
from recurvit.run.checkpoint import load_checkpoint
from recurvit.run.rundir import CONFIG, LAST, METRICS


def fork(run: Path, out: Path, block_lr_scale: float | None = None, steps: int | None = None) -> dict:
    """Write the fork; return what fork.json records. Raises ValueError or UserError (the one line) on bad input."""
    import torch

    if not (run / LAST).is_file() or not (run / CONFIG).is_file():
        raise ValueError(f"{run} is not a run directory with {CONFIG} and {LAST}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not empty; choose another folder")
    if block_lr_scale is not None and not (math.isfinite(block_lr_scale) and block_lr_scale > 0):
        raise ValueError(f"--block-lr-scale must be a positive number, got {block_lr_scale}")
    if steps is not None and not (isinstance(steps, int) and steps > 0):
        raise ValueError(f"--steps must be a positive integer, got {steps}")
    state = load_checkpoint(run / LAST)  # the runner's own loader: tensors and plain types only
    record = {"parent": str(run.resolve()), "epoch": state["epoch"], "changed": {}}
    if block_lr_scale is not None:
        groups = [g for g in state["optimizer"]["param_groups"] if "lr_scale" in g]
        if not groups:
            raise ValueError(f"{run / LAST} has no optimizer group with an lr_scale (train.lr_throttle or "
                             "train.block_lr_scale): nothing to fork")
        record["changed"]["block lr_scale"] = [groups[0]["lr_scale"], block_lr_scale]
        for g in groups:
            g["lr_scale"] = block_lr_scale
    config = None
    if steps is not None:
        # the parent's config as written, one value changed: not re-serialised through this checkout's schema,
        # which may hold keys the code that resumes the fork (a pilot's worktree at an older commit) does not know
        from omegaconf import OmegaConf

        raw = OmegaConf.load(run / CONFIG)
        if OmegaConf.select(raw, "model.steps") is None:
            raise ValueError(f"{run / CONFIG} has no model.steps (not a recurrent model): no depth to fork")
        record["changed"]["model.steps"] = [raw.model.steps, steps]
        raw.model.steps = steps
        config = OmegaConf.to_yaml(raw)
        state["config"]["model"]["steps"] = steps  # the checkpoint's copy, which a resume compares against
    out.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG, METRICS):
        if (run / name).is_file():
            shutil.copy(run / name, out / name)
    if config is not None:
        (out / CONFIG).write_text(config)
    if record["changed"]:
        torch.save(state, out / LAST)
    else:
        shutil.copy(run / LAST, out / LAST)
    (out / "fork.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--block-lr-scale", type=float, help="the recurrent block's lr multiplier from here on")
    ap.add_argument("--steps", type=int, help="the recurrent depth T (model.steps) from here on")
    args = ap.parse_args()
    try:
        record = fork(args.run, args.out, args.block_lr_scale, args.steps)
    except (ValueError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"forked {args.run} at epoch {record['epoch']} into {args.out}"
          + "".join(f"; {k} {a:.6g} -> {b:.6g}" for k, (a, b) in record["changed"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
