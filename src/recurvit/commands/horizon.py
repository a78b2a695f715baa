"""recurvit horizon RUN_DIR [--steps K] [--json]"""
from __future__ import annotations

from pathlib import Path

from . import DeprecatedOption, add_device_arg, add_force_arg, check_cost, open_trained, print_json


def add_parser(sub):
    p = sub.add_parser("horizon", help="accuracy at every step up to K, beyond the training depth",
                       description="Writes horizon.csv (step, accuracy, loss, rel_change) and horizon.png into the "
                                   "run directory, in one pass of K block applications, and reports accuracy at "
                                   "T, 2T, 4T, 8T and 16T, the mean over T..4T and the data set's chance level.")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    p.add_argument("--steps", type=int, metavar="K",
                   help="steps to sweep (default 16T; a stack or SoftMoR model stops at its depth)")
    p.add_argument("--max-steps", dest="steps", type=int, action=DeprecatedOption, new="--steps")
    p.add_argument("--out", type=Path, help="directory for horizon.csv / horizon.png (default: the run directory)")
    p.add_argument("--data-root", help="where the run's data set lives now (overrides data.root)")
    add_force_arg(p)
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print the summary and the sweep as JSON")
    return p


def run(args) -> int:
    from ..analysis.horizon import horizon_sweep, plot, summarize, write_csv
    from ..errors import UserError
    from ..run.outputs import output_dir

    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    model, cfg, device, test_loader, info = open_trained(args)
    out_dir = output_dir(args.out or (args.run if args.run.is_dir() else args.run.parent))  # before the work
    T = model.nominal_steps
    K = args.steps or 16 * T
    note = None
    if model.core.limit is not None and K > model.core.limit:
        note = f"this {model.cfg.core} model runs at most {model.core.limit} steps; K capped"
        K = model.core.limit
    check_cost(model, test_loader, device, K, len(test_loader), args)
    sweep = horizon_sweep(model, test_loader, device, K, progress=not args.json)
    write_csv(sweep, out_dir / "horizon.csv")
    label = f"{cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)})"
    chance = 1.0 / info.num_classes
    run_name = (args.run if args.run.is_dir() else args.run.parent).resolve().name
    plot({label: sweep}, T, out_dir / "horizon.png", chance=chance,
         title=f"{run_name}: {label} on {cfg.data.name}, trained T = {T}, swept to {K} steps")
    summary = {"run": str(args.run), "model": cfg.model.name, "core": model.cfg.core, **summarize(sweep, T),
               "chance": chance,
               "csv": str(out_dir / "horizon.csv"), "png": str(out_dir / "horizon.png"), "note": note}
    if args.json:
        print_json({**summary, "sweep": sweep})
        return 0
    fmt = lambda v: "  -   " if v is None else f"{v:.4f}"  # noqa: E731
    print(f"{label}: trained T={T}, swept K={K}{'  (' + note + ')' if note else ''}")
    keys = [("T", "acc_T")] + [(f"{k}T", f"acc_{k}T") for k in (2, 4, 8, 16)]
    print("  " + "  ".join(f"acc@{name} {fmt(summary[key])}" for name, key in keys if summary[key] is not None)
          + f"  mean acc T..4T {fmt(summary['acc_mean_T_4T'])}  chance {chance:.4f}")
    print(f"  wrote {summary['csv']} and {summary['png']}")
    return 0
