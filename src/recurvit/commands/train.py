"""recurvit train [CONFIG.yaml] [key=value ...] [--out DIR] | --resume RUN_DIR  [--nproc N]

Several processes: ``torchrun --nproc_per_node N -m recurvit train ...`` or, the same thing,
``recurvit train --nproc N ...``. ``train.batch_size`` is then the global batch (divided among
the processes); rank 0 writes the run directory and prints.
"""
from __future__ import annotations

from pathlib import Path

from ..config import load_config, to_yaml
from ..errors import UserError
from . import launch_processes, load_run_config, print_json


def add_parser(sub):
    p = sub.add_parser("train", help="train a model (default: a small bViT on digits)",
                       description="Train a model. With no arguments: configs/digits/bvit.yaml's model on digits.")
    p.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]",
                   help="optional YAML config, then dotted overrides such as train.epochs=5 model.steps=8")
    p.add_argument("--out", type=Path, help="run directory (default runs/<data>-<model>-<time>)")
    p.add_argument("--resume", type=Path, metavar="RUN_DIR",
                   help="continue a run from its last.pt; key=value overrides of train.* (and data.root, "
                        "data.num_workers) apply from there, the optimizer and schedule following them; the model, "
                        "the data, train.seed, train.batch_size and per-stage heads cannot change")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("--force", action="store_true", help="start even when the memory estimate says it will not fit")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON (no per-epoch lines)")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="train data-parallel in N processes (launches torchrun --standalone --nproc_per_node N); "
                        "train.batch_size is the global batch")
    return p


def run(args) -> int:
    from ..run import distributed as dist_io
    from ..tasks.base import data_task
    from ..tasks.classify.task import ClassifyTask
    from ..train.fit import fit

    cfg = load_run_config(args, load_config, _default_config())
    if args.print_config:
        from ..data import build_datasets
        from ..run.loaders import resolve_model_config

        _, _, info = build_datasets(cfg.data, with_train=False)  # the sizes the data set gives the model
        print(to_yaml(resolve_model_config(cfg, info)), end="")
        return 0
    out = args.resume if args.resume is not None else args.out
    if args.nproc is not None and args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}")
    if args.nproc is not None and args.nproc > 1:
        return launch_processes(args, cfg, out, ["train"])
    task = data_task(cfg.data.name, ClassifyTask)(cfg)  # the data's task: classification, or the mazes' dense task
    log = (lambda *a, **k: None) if args.json else print  # fit quiets every rank but 0 itself
    metrics = fit(task, out, resume=args.resume is not None, log=log, force=args.force)
    if not dist_io.launched_main():
        return 0
    out = task.run_dir
    if args.json:
        print_json({"run_dir": str(out), **metrics})
    else:
        print(f"run {out}  test_acc {metrics.get('test_acc', float('nan')):.4f}  "
              f"train_seconds {metrics.get('train_seconds', 0):.1f}")
    return 0


def _default_config():
    """The embedded default: the packaged digits bViT config."""
    from importlib.resources import files

    return str(files("recurvit") / "configs" / "digits" / "bvit.yaml")
