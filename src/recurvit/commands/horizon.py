"""recurvit horizon RUN_DIR [--steps K] [--json]; a maze run: [--sizes S ...] [--mazes N]"""
from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from . import DeprecatedOption, add_device_arg, add_force_arg, check_cost, load_trained, open_trained, print_json


MAZE_CSV = ["size", "step", "solved", "pixel_acc", "path_recall", "path_precision", "state_rms", "state_change",
            "solved_open"]
JSON_MARK = b'{\n "run": '  # how horizon.json begins (a file of that name that does not is the user's)
MAZE_PICTURE = "horizon_maze.png"  # one maze: input, where the stable rule stopped, the last iteration, target


def add_parser(sub):
    p = sub.add_parser("horizon", help="accuracy at every step up to K, beyond the training depth",
                       description="Writes horizon.csv (step, accuracy, loss, rel_change) and horizon.png into the "
                                   "run directory, in one pass of K block applications, and reports accuracy at "
                                   "T, 2T, 4T, 8T and 16T, the mean over T..4T and the data set's chance level. "
                                   "A maze run (model.dense): the share of mazes solved after every iteration up to "
                                   "K (default 10T) at every test size, in one pass a batch, written as "
                                   "horizon.csv / horizon.png / horizon.json, with solved at T, 2T, 4T, 10T a size "
                                   "and the two stopping rules (max confidence, a stable mask), and how the path is "
                                   "wrong (path recall: eroded past the answer; precision: spilled into dead ends).")
    p.add_argument("run", type=Path, help="run directory or checkpoint file")
    p.add_argument("--steps", type=int, metavar="K",
                   help="steps to sweep (default 16T, 10T for a maze run; a stack or SoftMoR model stops at "
                        "its depth)")
    p.add_argument("--max-steps", dest="steps", type=int, action=DeprecatedOption, new="--steps")
    p.add_argument("--out", type=Path, help="directory for horizon.csv / horizon.png (default: the run directory)")
    p.add_argument("--sizes", type=int, nargs="+", metavar="S",
                   help="maze run: the maze sizes to test (default: the run's data.maze_test_sizes)")
    p.add_argument("--mazes", type=int, metavar="N",
                   help="maze run: test mazes a size (default: 200)")
    p.add_argument("--min-steps", type=int, metavar="M",
                   help="maze run: the stable rule's first possible stop (default: the trained depth T)")
    p.add_argument("--patience", type=int, metavar="P",
                   help="maze run: iterations the predicted path must stay unchanged for the stable rule to stop "
                        "(default 3, as the study evaluator)")
    p.add_argument("--data-root", help="where the run's data set lives now (overrides data.root)")
    add_force_arg(p)
    add_device_arg(p)
    p.add_argument("--json", action="store_true", help="print the summary and the sweep as JSON")
    return p


def _capped(model, K: int):
    """(K, None), or the core's limit and a note when K is past it (a stack or SoftMoR model stops at its depth)."""
    if model.core.limit is not None and K > model.core.limit:
        return model.core.limit, f"this {model.cfg.core} model runs at most {model.core.limit} steps; K capped"
    return K, None


def run(args) -> int:
    from ..analysis.horizon import horizon_sweep, plot, summarize, write_csv
    from ..run.atomic import file_set
    from ..run.outputs import PNG, claim_files, output_dir

    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be >= 1, got {args.steps}")
    loaded = load_trained(args.run)
    if loaded.config.data.name == "mazes":  # the dense task (its data chooses it)
        return _mazes(args, loaded)
    for flag, value in (("--sizes", args.sizes), ("--mazes", args.mazes), ("--min-steps", args.min_steps),
                        ("--patience", args.patience)):
        if value is not None:
            raise UserError(f"{flag} is for a maze run's sweep; {args.run} is a {loaded.config.data.name} run")
    model, cfg, device, test_loader, info = open_trained(args, loaded)
    out_dir = output_dir(args.out or (args.run if args.run.is_dir() else args.run.parent))  # before the work
    T = model.nominal_steps
    K, note = _capped(model, args.steps or 16 * T)
    check_cost(model, test_loader, device, K, len(test_loader), args)
    claim_files(out_dir, {"horizon.csv": b"step,accuracy", "horizon.png": PNG})
    sweep = horizon_sweep(model, test_loader, device, K, progress=not args.json)
    label = f"{cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)})"
    chance = 1.0 / info.num_classes
    run_name = (args.run if args.run.is_dir() else args.run.parent).resolve().name
    with file_set(out_dir, ["horizon.csv", "horizon.png"]):  # both new or both as they were
        write_csv(sweep, out_dir / "horizon.csv")
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


def _mazes(args, loaded) -> int:
    """The thinking-longer sweep of a maze run (see :mod:`recurvit.analysis.mazes`)."""
    import csv
    import io
    import json
    from dataclasses import replace

    from torch.utils.data import DataLoader

    from ..analysis.mazes import draw_maze, example_panels, maze_sweep_sizes, plot_solved, stable_rule, summarize_mazes
    from ..analysis.budget import free_memory
    from ..data.mazes import cells_per_side, maze_test_sets, sweep_bytes
    from ..run.atomic import file_set
    from ..run.checkpoint import check_finite
    from ..run.device import pick_device
    from ..run.outputs import PNG, claim_files, output_dir, write_text

    args.mazes = 200 if args.mazes is None else args.mazes
    if args.mazes < 1:
        raise UserError(f"--mazes must be >= 1, got {args.mazes}")
    for s in args.sizes or ():
        try:
            cells_per_side(s)
        except UserError as e:
            raise UserError(f"--sizes: {e}") from None
    for flag, value in (("--min-steps", args.min_steps), ("--patience", args.patience)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    model, cfg = loaded.model, loaded.config
    check_finite(model, args.run)
    out_dir = output_dir(args.out or (args.run if args.run.is_dir() else args.run.parent))
    device = pick_device(args.device)
    model = model.to(device)
    T = model.nominal_steps
    K, note = _capped(model, args.steps or 10 * T)
    if args.min_steps is not None and args.min_steps > K:
        raise UserError(f"--min-steps {args.min_steps} is past the sweep's last iteration ({K}): the stable rule "
                        f"could never stop; raise --steps or lower --min-steps")
    data = replace(cfg.data, maze_test_sizes=sorted(set(args.sizes or cfg.data.maze_test_sizes)),
                   maze_test=args.mazes)
    width = getattr(model.cfg, "width", None) or getattr(model.cfg, "embed_dim", 64)
    stored, batch_bytes = sweep_bytes(data.maze_test_sizes, args.mazes, width)
    free = free_memory(device)
    if not args.force and max(stored, batch_bytes) > free:  # priced before a maze is generated
        what = (f"{args.mazes:,} mazes a size hold about {stored / 2**30:,.1f} GiB" if stored >= batch_bytes else
                f"one batch of {max(data.maze_test_sizes)}x{max(data.maze_test_sizes)} mazes takes about "
                f"{batch_bytes / 2**30:,.1f} GiB")
        raise UserError(f"{what} and {free / 2**30:,.1f} GiB are free; choose fewer or smaller mazes (--mazes, "
                        "--sizes), or --force")
    sets = maze_test_sets(data)
    largest = sets[max(sets)]
    batch = 50
    check_cost(model, DataLoader(largest, batch_size=batch), device, K, len(sets) * -(-args.mazes // batch), args)
    outputs = claim_files(out_dir, {"horizon.csv": ",".join(MAZE_CSV[:2]).encode(), "horizon.png": PNG,
                                      "horizon.json": JSON_MARK, MAZE_PICTURE: PNG})
    rule = stable_rule(T, K, args.min_steps, args.patience)
    sweeps = maze_sweep_sizes(model, sets, device, K, batch_size=batch, example=True, **rule)
    examples = {size: sw.pop("example") for size, sw in sweeps.items()}
    rows = summarize_mazes(sweeps, T)
    table = io.StringIO(newline="")
    w = csv.writer(table)
    w.writerow(MAZE_CSV)
    for size, sw in sorted(sweeps.items()):
        w.writerows(zip(*([size] * len(sw["step"]), sw["step"], sw["solved"], sw["accuracy"], sw["path_recall"],
                            sw["path_precision"], sw["state_rms"], sw["state_change"], sw["solved_open"])))
    run_name = (args.run if args.run.is_dir() else args.run.parent).resolve().name
    # the picture: the largest size where the stable rule solved a maze (none: the largest size's first maze)
    size = max((s for s, ex in examples.items() if ex["solved"]), default=max(examples))
    ex = examples[size]
    summary = {"run": str(args.run), "model": cfg.model.name, "trained_steps": T, "max_steps": K, "note": note,
               "mazes": args.mazes, "stable_rule": rule, "rows": rows, "csv": str(out_dir / "horizon.csv"),
               "png": str(out_dir / "horizon.png"),
               "picture": {"png": str(outputs[MAZE_PICTURE]), "size": size, "stable_solved": ex["solved"],
                           "stable_step": ex["step"], "stable_stopped": ex["stopped"],
                           "solved_at_max_steps": ex["solved_last"]}}
    # the file names its siblings by name (the folder moves: results are copied out of the run), stdout in full
    saved = {**summary, "csv": "horizon.csv", "png": "horizon.png", "picture": {**summary["picture"], "png": MAZE_PICTURE}}
    with file_set(out_dir, list(outputs)):  # the four files all new or all as they were
        write_text(outputs["horizon.csv"], table.getvalue(), ",".join(MAZE_CSV[:2]).encode(), "horizon.csv")
        plot_solved(sweeps, T, out_dir / "horizon.png",
                    title=f"{run_name}: trained at {cfg.data.maze_size}x{cfg.data.maze_size}, T = {T}, swept to {K}")
        draw_maze(example_panels(ex, K), f"{run_name}: a {size}x{size} test maze (trained at "
                  f"{cfg.data.maze_size}x{cfg.data.maze_size}, T = {T})", outputs[MAZE_PICTURE])
        write_text(outputs["horizon.json"], json.dumps(saved, indent=1) + "\n", JSON_MARK, "horizon.json")
    if args.json:
        print_json(summary)
        return 0
    pct = lambda v: "   -  " if v is None else f"{100 * v:5.1f}%"  # noqa: E731
    print(f"{cfg.model.name}: trained at {cfg.data.maze_size}x{cfg.data.maze_size} with T={T}, swept K={K}, "
          f"{args.mazes} test mazes a size; solved at")
    if note:
        print(f"  ({note})")
    print(f"   size      T     2T     4T    10T   peak (iter)  max_conf  (open)  stable (mean iters; from iteration "
          f"{rule['min_steps']}, {rule['patience']} unchanged)")
    for r in rows:
        print(f"  {r['size']:>2}x{r['size']:<2} {pct(r['solved_T'])} {pct(r['solved_2T'])} {pct(r['solved_4T'])} "
              f"{pct(r['solved_10T'])} {pct(r['solved_best'])} ({r['best_step']:>3})  {pct(r['max_conf_solved'])} "
              f"{pct(r['max_conf_open_solved'])}"
              f"  {pct(r['stable_solved'])} ({r['stable_steps_mean']:.1f})")
    print("  max_conf: the iteration of most confidence over every pixel; (open): over open pixels only, "
          "DeepThinking's own")
    print("  peak: the most solved at any iteration of this test sweep (the curve's top, chosen on test: a "
          "description, not a choice; the study chooses its iteration on validation)")
    print("  path recall / precision (eroded past the answer: recall falls; spilled into dead ends: precision)")
    for r in rows:
        print(f"  {r['size']:>2}x{r['size']:<2}  @T {pct(r['path_recall_T'])} / {pct(r['path_precision_T'])}"
              f"   @10T {pct(r['path_recall_10T'])} / {pct(r['path_precision_10T'])}")
    if rows[0]["state_rms_10T"] is not None:
        print("  the recurrent state: RMS at T and 10T (growth), and its relative change per iteration there "
              "(0 at a fixed point)")
        for r in rows:
            print(f"  {r['size']:>2}x{r['size']:<2}  RMS {r['state_rms_T']:.3g} -> {r['state_rms_10T']:.3g} "
                  f"(x{r['state_rms_10T'] / max(r['state_rms_T'], 1e-12):.3g})   change "
                  f"{r['state_change_T'] or 0:.3g} -> {r['state_change_10T']:.3g}")
    pic = summary["picture"]
    if pic["stable_solved"]:
        how = f"solved by the stable rule at iteration {pic['stable_step']}"
        how += "" if pic["stable_stopped"] else " (never stable: read there)"
    else:
        how = "the first one (the stable rule solved none at any size)"
    print(f"  picture: a {size}x{size} maze, {how}; at {K} iterations "
          f"{'solved' if pic['solved_at_max_steps'] else 'not solved'}")
    print(f"  wrote {summary['csv']}, {summary['png']}, {pic['png']} and {out_dir / 'horizon.json'}")
    return 0
