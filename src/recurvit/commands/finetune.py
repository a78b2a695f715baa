"""recurvit finetune RUN_DIR --data NAME [--method full|head|lora|step_lora|scratch] [--rank R] [key=value ...]
   recurvit finetune --resume FT_RUN_DIR [key=value ...]"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import print_json


METHODS = ("full", "head", "lora", "step_lora", "scratch")  # = recurvit.tasks.finetune.METHODS (kept import-free)


def add_parser(sub):
    p = sub.add_parser(
        "finetune", help="adapt a trained run to another data set (full, head, lora, step_lora; scratch baseline)",
        description="Loads RUN_DIR's model, replaces its head for the target's classes (the target is resized to the "
                    "model's input size) and trains: full (all weights), head (the new classifier), lora (low-rank "
                    "adapters on the shared block's qkv/proj/fc1/fc2, merged into best.pt), step_lora (a separate "
                    "adapter per step of the shared block), or scratch (same model re-initialised: the baseline). "
                    "Writes a run directory (config.yaml, metrics.jsonl, best.pt, last.pt, finetune.json); a killed "
                    "fine-tune goes on with --resume FT_RUN_DIR.")
    p.add_argument("run", type=Path, nargs="?", help="pretrained run directory or checkpoint")
    p.add_argument("--data", help="target data set (digits, fashion_mnist, cifar10, cifar100, ...)")
    p.add_argument("--resume", type=Path, metavar="FT_RUN_DIR",
                   help="continue a fine-tune from its last.pt (its recipe and config are read from it)")
    p.add_argument("--method", default="lora", choices=METHODS,
                   help="what trains: full, head (linear probe), lora, step_lora (an adapter per step), scratch")
    p.add_argument("--rank", type=int, default=4, help="LoRA rank (lora, step_lora)")
    p.add_argument("--alpha", type=float, help="LoRA scale numerator: update = alpha / rank * B A (default: rank)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="data.* / train.* overrides, e.g. train.epochs=3")
    p.add_argument("--out", type=Path, help="run directory (default: next to RUN_DIR)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.__class__ = _intermixed(type(p))  # key=value overrides may come before or after the options
    return p


def _intermixed(base):
    """``base`` parsing with positionals and options intermixed (argparse's parse_known_intermixed_args:
    ``RUN --data digits train.epochs=3`` would otherwise leave train.epochs=3 unrecognised)."""
    class Intermixed(base):
        _busy = False

        def parse_known_args(self, args=None, namespace=None):
            if self._busy:  # the inner calls made by parse_known_intermixed_args
                return super().parse_known_args(args, namespace)
            self._busy = True
            try:
                return self.parse_known_intermixed_args(args, namespace)
            finally:
                self._busy = False

    return Intermixed


def run(args) -> int:
    from ..tasks.classify.finetune import finetune, finetune_resume

    log = (lambda *a, **k: None) if args.json else print
    key, eq, _ = str(args.run).partition("=")
    if args.resume is not None and args.run is not None and eq and "/" not in key:  # --resume FT train.epochs=3:
        args.overrides, args.run = [str(args.run), *args.overrides], None  # an override, not a RUN_DIR
    if args.resume is not None:
        if args.run is not None or args.data is not None or args.out is not None:
            raise UserError("--resume FT_RUN_DIR continues a fine-tune with its own source, data and directory; "
                            "drop RUN_DIR, --data and --out")
        res = finetune_resume(args.resume, args.overrides, log=log)
    elif args.run is None or args.data is None:
        raise UserError("recurvit finetune needs RUN_DIR and --data NAME (or --resume FT_RUN_DIR)")
    else:
        res = finetune(args.run, args.data, args.method, args.rank, args.alpha, args.overrides, args.out, log=log)
    if args.json:
        print_json(res)
    else:
        print(f"run {res['run_dir']}  {res['method']}  trainable params {res['trainable_params']:,} "
              f"({100 * res['trainable_fraction']:.1f}%)  test_acc {res['test_acc']:.4f}  "
              f"train_seconds {res['train_seconds']:.1f}")
    return 0
