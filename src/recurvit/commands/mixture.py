"""recurvit mixture RUN_DIR [--examples N] [--out DIR] [--json]"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import add_run_args, print_json


def add_parser(sub):
    p = sub.add_parser("mixture", help="SoftMoR: picture of the token-wise mixture weights over recursion steps",
                       description="Saves mixture.png (weights of each recursion step over the patch grid for a few "
                                   "test images) and mixture_mean.csv (mean weight per unit and step over the test set).")
    add_run_args(p, "run directory of a SoftMoR (srvit_*) model")
    p.add_argument("--examples", type=int, default=4, help="test images drawn in mixture.png (default 4)")
    p.add_argument("--out", type=Path, help="output directory (default: the run directory)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def run(args) -> int:
    from ..analysis.mixture import mixture_run

    if args.examples < 1:
        raise UserError(f"--examples must be >= 1, got {args.examples}")
    res = mixture_run(args.run, args.examples, args.out, device=args.device, data_root=args.data_root,
                      force=args.force)
    if args.json:
        print_json(res)
    else:
        print("mean weight per recursion step (over units and test tokens): "
              + "  ".join(f"step {i + 1}: {w:.3f}" for i, w in enumerate(res["mean_weight_per_step"])))
        print(f"wrote {res['png']} and {res['csv']}")
    return 0
