"""recurvit mixture RUN_DIR [--examples N] [--out DIR] [--json]"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import add_run_args, check_cost, open_trained, print_json


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
    from ..analysis.mixture import mixture_weights, plot_mixture, write_mean_csv
    if args.examples < 1:
        raise UserError(f"--examples must be >= 1, got {args.examples}")
    model, cfg, device, test_loader, info = open_trained(args)
    try:
        check_cost(model, test_loader, device, model.nominal_steps, len(test_loader), args)
        res = mixture_weights(model, test_loader, device, images=args.examples)
    except ValueError as e:
        raise UserError(str(e)) from None
    from ..run.outputs import output_dir

    out = output_dir(args.out or (args.run if args.run.is_dir() else args.run.parent))
    n = res["examples"].shape[0]
    imgs = next(iter(test_loader))[0][:n]
    mean_t = res["mean"]
    std = __import__("torch").tensor(info.std).view(-1, 1, 1)
    mu = __import__("torch").tensor(info.mean).view(-1, 1, 1)
    plot_mixture(res["examples"], (imgs * std + mu).clamp(0, 1), mean_t, out / "mixture.png",
                 title=f"{cfg.model.name}: {model.cfg.core_cls.describe(model.cfg)}")
    write_mean_csv(mean_t, out / "mixture_mean.csv")
    per_step = mean_t.mean(dim=0).tolist()
    if args.json:
        print_json({"run": str(args.run), "runs_as": model.cfg.core_cls.describe(model.cfg),
                    "mean_weight_per_step": per_step, "mean_weight_per_unit_step": mean_t.tolist(),
                    "png": str(out / "mixture.png"), "csv": str(out / "mixture_mean.csv")})
    else:
        print("mean weight per recursion step (over units and test tokens): "
              + "  ".join(f"step {i + 1}: {w:.3f}" for i, w in enumerate(per_step)))
        print(f"wrote {out / 'mixture.png'} and {out / 'mixture_mean.csv'}")
    return 0
