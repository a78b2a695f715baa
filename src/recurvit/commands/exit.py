"""recurvit exit RUN [--criterion C] [--steps K] [--min-steps M] [--target-drop P | --step-budget F] [--json]"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from . import DeprecatedOption, add_device_arg, add_force_arg, open_trained, print_json


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
    p.add_argument("--max-steps", dest="steps", type=int, action=DeprecatedOption, new="--steps")
    p.add_argument("--steps", type=int, metavar="K",
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
    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
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

    from ..analysis import anytime as A
    from ..analysis.exit import calibrated_exit

    _check(args)
    model, cfg, device, _, _ = open_trained(args)
    most = (args.steps or model.nominal_steps) / model.nominal_steps  # the most steps an exit can take, x T
    if args.step_budget is not None and args.step_budget >= most:  # every threshold meets it: nothing is asked
        raise UserError(f"--step-budget {args.step_budget:g} x T allows every exit (at most {most:g} x T steps run); "
                        "give a fraction below that, e.g. 0.6")
    try:
        res = calibrated_exit(model, cfg, device, args.criterion, args.steps, args.min_steps, args.target_drop,
                              args.step_budget, args.batch_size, args.time_batches, force=args.force)
    except ValueError as e:
        raise UserError(str(e)) from None
    rows, test = res.pop("sweep"), res["test"]
    from ..run.atomic import file_set
    from ..run.outputs import output_dir, write_text

    out_dir = output_dir(args.out or (args.run if args.run.is_dir() else args.run.parent))
    label = f"{cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)})"
    summary = {"run": str(args.run), "model": cfg.model.name, "core": model.cfg.core,
               "runs_as": model.cfg.core_cls.describe(model.cfg), **res, "device": str(device),
               "threads": torch.get_num_threads(), "csv": str(out_dir / "exit.csv"), "png": str(out_dir / "exit.png")}
    with file_set(out_dir, ["exit.csv", "exit.png", "exit.json"]):  # all new or all as they were
        A.write_csv(rows, out_dir / "exit.csv")
        A.plot([{"title": f"{label}: exit by {args.criterion}", "T": res["trained_steps"],
                 "fixed": res["fixed_accuracy"], "curves": {args.criterion: {"rows": rows, "point": test}}}],
               out_dir / "exit.png")
        # what --json prints, for reports: only over an exit.json of exit's (never through a link)
        write_text(out_dir / "exit.json", json.dumps({**summary, "sweep": rows}, indent=1), b'{\n "run": ',
                   "exit.json")
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
