"""recurvit exit RUN [--criterion C] [--max-steps K] [--min-steps M] [--target-drop P | --step-budget F] [--json]"""
from __future__ import annotations

import json
from pathlib import Path

from . import apply_data_root, add_device_arg, add_force_arg, print_json


CRITERIA = ("kl", "entropy", "max_prob", "state")  # models.adaptive.CRITERIA (a test keeps them equal); no torch
                                                   # import here, so that `recurvit --help` stays fast


def add_parser(sub):
    p = sub.add_parser("exit", help="anytime inference: each image stops when its prediction has settled",
                       description="Calibrates an exit threshold on 10% of the TRAINING split (seeded, no "
                                   "augmentation; the test split is not read for it), then evaluates it once on the "
                                   "test split with exited images leaving the batch, timed against fixed depth T "
                                   "(alternating batches, medians). Writes exit.csv (a threshold sweep on the test "
                                   "split: accuracy, mean / median / p90 steps, measured images/s), exit.png "
                                   "(accuracy against mean steps, with the fixed-depth curve) and exit.json (what "
                                   "--json prints). A stack exits early only with a readout trained after every "
                                   "block (deep supervision at every block); otherwise it is an error, unless "
                                   "--min-steps is its depth.")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    p.add_argument("--criterion", default="kl", choices=CRITERIA,
                   help="kl: KL of consecutive predictions <= t (default); entropy <= t; max_prob >= t; "
                        "state: ||z_k - z_k-1|| / ||z_k-1|| <= t")
    p.add_argument("--max-steps", type=int, metavar="K",
                   help="steps an image may run (default T; above T hard images run past the training horizon; "
                        "a stack caps at its depth)")
    p.add_argument("--min-steps", type=int, default=1, metavar="M", help="steps every image runs (default 1)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--target-drop", type=float, metavar="P",
                        help="fewest mean steps with calibration accuracy within P points of fixed T (default 0.5)")
    target.add_argument("--step-budget", type=float, metavar="F",
                        help="best calibration accuracy at mean steps <= F x T (e.g. 0.6)")
    p.add_argument("--batch-size", type=int, default=256, metavar="B", help="images per batch (default 256)")
    p.add_argument("--time-batches", type=int, default=4, metavar="N",
                   help="test batches each sweep threshold is timed on (default 4; the calibrated point is timed "
                        "on the whole test split)")
    p.add_argument("--out", type=Path, help="directory for exit.csv / exit.png (default: the run directory)")
    p.add_argument("--data-root", help="where the run's data set lives now (overrides data.root)")
    add_device_arg(p)
    add_force_arg(p)
    p.add_argument("--json", action="store_true", help="print the operating point and the sweep as JSON")
    return p


def _check(args) -> None:
    from ..errors import UserError

    if args.max_steps is not None and args.max_steps < 1:
        raise UserError(f"--max-steps must be >= 1, got {args.max_steps}")
    if args.min_steps < 1:
        raise UserError(f"--min-steps must be >= 1, got {args.min_steps}")
    if args.target_drop is not None and not args.target_drop >= 0:
        raise UserError(f"--target-drop must be >= 0 (points of accuracy), got {args.target_drop}")
    if args.step_budget is not None and not args.step_budget > 0:
        raise UserError(f"--step-budget must be > 0 (a fraction of T's steps), got {args.step_budget}")
    if args.batch_size < 1 or args.time_batches < 1:
        raise UserError("--batch-size and --time-batches must be >= 1")


def run(args) -> int:
    import torch
    from torch.utils.data import DataLoader

    from ..analysis import anytime as A
    from ..data import build_datasets
    from dataclasses import replace

    from ..data.calibration import CALIBRATION_FRACTION, calibration_split, holdout_split
    from ..errors import UserError
    from ..models.adaptive import has_step_readouts, plan_steps
    from ..analysis.budget import check_eval_cost
    from ..train.checkpoint import load_model_and_config
    from ..runtime import pick_device

    _check(args)
    model, cfg = load_model_and_config(args.run)
    T = model.nominal_steps
    # a stack's readouts after every block are trained by per-block heads or by deep supervision at every block
    readouts = has_step_readouts(model) or cfg.train.supervision.stages >= T
    try:
        K, m = plan_steps(model, args.max_steps, args.min_steps, readouts)
    except ValueError as e:
        raise UserError(str(e)) from None
    note = None
    if args.max_steps is not None and K < args.max_steps:
        note = f"this {model.cfg.core} model runs at most {K} steps; --max-steps capped"
    apply_data_root(cfg, args.data_root)
    device = pick_device(args.device)
    model.to(device)
    amp = cfg.train.amp
    train_set, test_set, _ = build_datasets(replace(cfg.data, holdout=0.0))  # the whole training split
    kw = dict(batch_size=args.batch_size, shuffle=False, num_workers=cfg.data.num_workers)
    held_out = cfg.data.holdout > 0  # the run never trained on these: an honest calibration split
    calib_set = (holdout_split(train_set, test_set, cfg.data.holdout) if held_out
                 else calibration_split(train_set, test_set))
    calib_loader = DataLoader(calib_set, **kw)
    test_loader = DataLoader(test_set, **kw)
    # calibration and the test sweep each run every image to max(K, T) steps, then timed passes
    check_eval_cost(model, next(iter(calib_loader))[0].to(device), max(K, T),  # (a calibration batch)
                    len(calib_loader) + 3 * len(test_loader), force=args.force)

    cal = A.calibrate(model, calib_loader, device, args.criterion, K, m, args.target_drop, args.step_budget, amp,
                      readouts)
    thr = cal["threshold"]
    test_traj = A.trajectories(model, test_loader, device, max(K, T), amp)
    batches = []
    for x, _ in test_loader:
        batches.append(x.to(device))
        if len(batches) == args.time_batches:
            break
    sweep = sorted(set(A.thresholds(cal["trajectory"], args.criterion, K, m)) | ({thr} if thr is not None else set()))
    rows = []
    for t in sweep:
        row = A.point(test_traj, args.criterion, t, K, m)
        ips = A.interleaved(A.runners(model, args.criterion, t, K, m, device, amp, readouts), batches, device)
        rows.append({**row, "images_per_s": ips["adaptive"], "fixed_images_per_s": ips["fixed"],
                     "speedup": ips["adaptive"] / ips["fixed"]})
    test = A.measure(model, test_loader, device, args.criterion, thr, K, m, amp, readouts)
    test["steps_pct_T"] = 100 * test["mean_steps"] / T

    out_dir = args.out or (args.run if args.run.is_dir() else args.run.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    A.write_csv(rows, out_dir / "exit.csv")
    fixed = A.fixed_accuracy(test_traj)[:K]
    label = f"{cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)})"
    A.plot([{"title": f"{label}: exit by {args.criterion} (star: calibrated)", "T": T, "fixed": fixed,
             "curves": {args.criterion: {"rows": rows, "point": test}}}], out_dir / "exit.png")
    calib = {k: v for k, v in cal.items() if k != "trajectory"}
    summary = {"run": str(args.run), "model": cfg.model.name, "core": model.cfg.core,
               "runs_as": model.cfg.core_cls.describe(model.cfg), "criterion": args.criterion, "trained_steps": T,
               "max_steps": K, "min_steps": m, "batch_size": args.batch_size,
               "calibration_fraction": cfg.data.holdout if held_out else CALIBRATION_FRACTION,
               "calibration_images": "held out from training" if held_out else "seen in training", **calib, "test": test, "fixed_accuracy": fixed,
               "device": str(device), "threads": torch.get_num_threads(),
               "csv": str(out_dir / "exit.csv"), "png": str(out_dir / "exit.png"), "note": note}
    with open(out_dir / "exit.json", "w") as f:  # what --json prints, for reports (experiments/anytime.py)
        json.dump({**summary, "sweep": rows}, f, indent=1)
    if args.json:
        print_json({**summary, "sweep": rows})
        return 0
    _print(summary, label)
    return 0


def _print(s: dict, label: str) -> None:
    c, t = s["calibration"], s["test"]
    target = (f"mean steps <= {s['step_budget']:g} x T" if s.get("step_budget") is not None
              else f"accuracy within {s['target_drop']:g} points of fixed T")
    thr = "none (never exit early)" if s["threshold"] is None else f"{s['threshold']:.4g}"
    print(f"{label}: exit by {s['criterion']}, steps {s['min_steps']}..{s['max_steps']} "
          f"(trained T={s['trained_steps']})"
          + (f"  ({s['note']})" if s["note"] else ""))
    print(f"  calibrated on {c['n']} training images ({s['calibration_fraction']:.0%}, no augmentation) for {target}:"
          f" threshold {thr}{'' if s['met'] else '  (target not met on the calibration split)'}")
    print(f"    calibration: accuracy {c['accuracy']:.4f} vs {c['acc_T']:.4f} at T, mean steps {c['mean_steps']:.2f}")
    print(f"  test (n={t['n']}): accuracy {t['accuracy']:.4f} vs {t['acc_T']:.4f} at fixed T (drop "
          f"{t['drop_points']:.2f} points), mean steps {t['mean_steps']:.2f} ({t['steps_pct_T']:.0f}% of T), "
          f"median {t['median_steps']:g}, p90 {t['p90_steps']:g}")
    print(f"  speed: {t['images_per_s']:.0f} images/s vs {t['fixed_images_per_s']:.0f} at fixed T: "
          f"{t['speedup']:.2f}x (batch {s['batch_size']}, medians of {t['batches']} alternating batches each, "
          f"{s['device']}, {s['threads']} threads)")
    print(f"  wrote {s['csv']} and {s['png']}")
