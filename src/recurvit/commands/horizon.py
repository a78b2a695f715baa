"""recurvit horizon RUN_DIR [--max-steps K] [--json]"""
from __future__ import annotations

from pathlib import Path

from . import print_json


def add_parser(sub):
    p = sub.add_parser("horizon", help="accuracy at every step up to K, beyond the training depth",
                       description="Writes horizon.csv (step, accuracy, loss, rel_change) and horizon.png into the "
                                   "run directory, in one pass of K block applications, and reports accuracy at "
                                   "T, 2T, 4T and the mean over T..4T.")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("--max-steps", type=int, help="K (default 4T; a stack or SoftMoR model stops at its depth)")
    p.add_argument("--out", type=Path, help="directory for horizon.csv / horizon.png (default: the run directory)")
    p.add_argument("--device", default="auto")
    p.add_argument("--json", action="store_true")
    return p


def run(args) -> int:
    from ..analysis.horizon import horizon_sweep, plot, summarize, write_csv
    from ..errors import UserError
    from ..train.checkpoint import load_model_and_config
    from ..train.loop import build_loaders, pick_device

    model, cfg = load_model_and_config(args.run)
    T = model.nominal_steps
    K = args.max_steps or 4 * T
    if K < 1:
        raise UserError(f"--max-steps must be >= 1, got {K}")
    note = None
    if model.core.max_steps is not None and K > model.core.max_steps:
        note = f"{model.cfg.core} model runs at most {model.core.max_steps} steps; K capped"
        K = model.core.max_steps
    device = pick_device(args.device)
    model.to(device)
    _, test_loader, _ = build_loaders(cfg)
    sweep = horizon_sweep(model, test_loader, device, K)
    out_dir = args.out or (args.run if args.run.is_dir() else args.run.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(sweep, out_dir / "horizon.csv")
    label = f"{cfg.model.name} ({model.cfg.core})"
    plot({label: sweep}, T, out_dir / "horizon.png", title=str(args.run))
    summary = {"run": str(args.run), "model": cfg.model.name, "core": model.cfg.core, **summarize(sweep, T),
               "csv": str(out_dir / "horizon.csv"), "png": str(out_dir / "horizon.png"), "note": note}
    if args.json:
        print_json({**summary, "sweep": sweep})
        return 0
    fmt = lambda v: "  -   " if v is None else f"{v:.4f}"  # noqa: E731
    print(f"{label}: trained T={T}, swept K={K}{'  (' + note + ')' if note else ''}")
    print(f"  acc@T {fmt(summary['acc_T'])}  acc@2T {fmt(summary['acc_2T'])}  acc@4T {fmt(summary['acc_4T'])}  "
          f"mean acc T..4T {fmt(summary['acc_mean_T_4T'])}")
    print(f"  wrote {summary['csv']} and {summary['png']}")
    return 0
