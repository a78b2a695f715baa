"""The horizon sweep of a trained run, whatever the run is (``recurvit horizon``): a classifier's accuracy, loss
and state change at every step 1..K (:mod:`.horizon`), or a maze run's share of mazes solved at every
iteration 1..K and every test size with its two stopping rules (:mod:`.mazes`), with its files written and its
summary in words.

    res = horizon_run("runs/RUN", steps=96)                        # horizon.csv, horizon.png in the run
    res = horizon_run("runs/MAZE_RUN", sizes=[9, 13], mazes=100)   # also horizon.json, horizon_maze.png
    res.summary                                                    # what ``recurvit horizon --json`` prints
    print("\\n".join(res.lines))                                    # what it prints otherwise

Which sweep a run gets follows from its data set (:func:`recurvit.data.datasets.dense_target`: a class for
every pixel, the dense task's runs), so a caller never says which task a run is.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..data.datasets import dense_target
from ..errors import UserError
from ..run.atomic import file_set
from ..run.load import load
from ..run.outputs import PNG, claim_files, output_dir, write_text

MAZE_CSV = ["size", "step", "solved", "pixel_acc", "path_recall", "path_precision", "state_rms", "state_change",
            "solved_open"]
JSON_MARK = b'{\n "run": '  # how horizon.json begins (a file of that name that does not is the user's)
MAZE_PICTURE = "horizon_maze.png"  # one maze: input, where the stable rule stopped, the last iteration, target
MAZE_BATCH = 50  # mazes a forward pass


class HorizonRun(NamedTuple):
    """What :func:`horizon_run` made: the summary (``recurvit horizon --json``) and the same in words."""

    summary: dict
    lines: List[str]


def horizon_run(path: str | Path, steps: Optional[int] = None, out: Optional[Path] = None,
                sizes: Optional[Sequence[int]] = None, mazes: Optional[int] = None, min_steps: Optional[int] = None,
                patience: Optional[int] = None, data_root: Optional[str] = None, device: str = "auto",
                force: bool = False, progress: bool = True) -> HorizonRun:
    """The sweep of the trained run at ``path`` (a run directory or checkpoint) up to ``steps`` (default 16T;
    10T for a maze run), its files written into ``out`` (default: the run directory). A maze run sweeps
    ``mazes`` test mazes (default 200) at each of ``sizes`` (default: the run's data.maze_test_sizes), its
    stable rule from ``min_steps`` with ``patience``; those options are an error for any other run, and
    ``data_root`` (where its data set lives now) is one for a classifier. ``force`` runs work estimated far
    beyond this machine; ``progress``: a classifier's bar over the batches, on a terminal."""
    path = Path(path)
    if steps is not None and steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    loaded = load(path)
    if dense_target(loaded.config.data.name):
        if data_root is not None:
            raise UserError("--data-root is for a run whose data set lives in files; a maze run's test mazes "
                            "are generated from its config")
        return _mazes(path, loaded, steps, out, sizes, mazes, min_steps, patience, device, force)
    for flag, value in (("--sizes", sizes), ("--mazes", mazes), ("--min-steps", min_steps),
                        ("--patience", patience)):
        if value is not None:
            raise UserError(f"{flag} is for a maze run's sweep; {path} is a {loaded.config.data.name} run")
    return _classifier(path, loaded, steps, out, data_root, device, force, progress)


def capped(model, K: int) -> Tuple[int, Optional[str]]:
    """(K, None), or the core's limit and a note when K is past it (a stack or SoftMoR model stops at its depth)."""
    if model.core.limit is not None and K > model.core.limit:
        return model.core.limit, f"this {model.cfg.core} model runs at most {model.core.limit} steps; K capped"
    return K, None


def _run_dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def _classifier(path: Path, loaded, steps, out, data_root, device, force, progress) -> HorizonRun:
    """A classifier's accuracy, loss and state change at every step: horizon.csv and horizon.png."""
    from .budget import check_loader_cost
    from .horizon import horizon_sweep, plot, summarize, write_csv
    from .trained import open_classifier

    model, cfg, dev, test_loader, info = open_classifier(path, device, data_root, loaded)
    out_dir = output_dir(out or _run_dir(path))  # before the work
    T = model.nominal_steps
    K, note = capped(model, steps or 16 * T)
    check_loader_cost(model, test_loader, dev, K, len(test_loader), force=force)
    claim_files(out_dir, {"horizon.csv": b"step,accuracy", "horizon.png": PNG})
    sweep = horizon_sweep(model, test_loader, dev, K, progress=progress)
    label = f"{cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)})"
    chance = 1.0 / info.num_classes
    with file_set(out_dir, ["horizon.csv", "horizon.png"]):  # both new or both as they were
        write_csv(sweep, out_dir / "horizon.csv")
        plot({label: sweep}, T, out_dir / "horizon.png", chance=chance,
             title=f"{_run_dir(path).resolve().name}: {label} on {cfg.data.name}, trained T = {T}, swept to {K} steps")
    summary = {"run": str(path), "model": cfg.model.name, "core": model.cfg.core, **summarize(sweep, T),
               "chance": chance,
               "csv": str(out_dir / "horizon.csv"), "png": str(out_dir / "horizon.png"), "note": note}
    return HorizonRun({**summary, "sweep": sweep}, classifier_lines(summary, label))


def classifier_lines(summary: dict, label: str) -> List[str]:
    """A classifier's summary in words: accuracy at T, 2T, ... 16T, the mean over T..4T, chance, the files."""
    fmt = lambda v: "  -   " if v is None else f"{v:.4f}"  # noqa: E731
    note = summary["note"]
    keys = [("T", "acc_T")] + [(f"{k}T", f"acc_{k}T") for k in (2, 4, 8, 16)]
    return [f"{label}: trained T={summary['trained_steps']}, swept K={summary['max_steps']}"
            f"{'  (' + note + ')' if note else ''}",
            "  " + "  ".join(f"acc@{name} {fmt(summary[key])}" for name, key in keys if summary[key] is not None)
            + f"  mean acc T..4T {fmt(summary['acc_mean_T_4T'])}  chance {summary['chance']:.4f}",
            f"  wrote {summary['csv']} and {summary['png']}"]


def _maze_options(mazes: Optional[int], sizes, min_steps, patience) -> int:
    """The number of test mazes a size (default 200), every option checked first."""
    from ..data.mazes import cells_per_side

    mazes = 200 if mazes is None else mazes
    if mazes < 1:
        raise UserError(f"--mazes must be >= 1, got {mazes}")
    for s in sizes or ():
        try:
            cells_per_side(s)
        except UserError as e:
            raise UserError(f"--sizes: {e}") from None
    for flag, value in (("--min-steps", min_steps), ("--patience", patience)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be >= 1, got {value}")
    return mazes


def _check_maze_memory(model, data, mazes: int, device, force: bool) -> None:
    """The mazes a size, and one batch of the largest, against the free memory (before a maze is generated)."""
    from ..data.mazes import sweep_bytes
    from .budget import free_memory

    width = getattr(model.cfg, "width", None) or getattr(model.cfg, "embed_dim", 64)
    stored, batch_bytes = sweep_bytes(data.maze_test_sizes, mazes, width)
    free = free_memory(device)
    if not force and max(stored, batch_bytes) > free:
        what = (f"{mazes:,} mazes a size hold about {stored / 2**30:,.1f} GiB" if stored >= batch_bytes else
                f"one batch of {max(data.maze_test_sizes)}x{max(data.maze_test_sizes)} mazes takes about "
                f"{batch_bytes / 2**30:,.1f} GiB")
        raise UserError(f"{what} and {free / 2**30:,.1f} GiB are free; choose fewer or smaller mazes (--mazes, "
                        "--sizes), or --force")


def _mazes(path: Path, loaded, steps, out, sizes, mazes, min_steps, patience, device, force) -> HorizonRun:
    """A maze run's share solved at every iteration and size, and the stopping rules: horizon.csv,
    horizon.png, horizon_maze.png (one maze) and horizon.json."""
    from torch.utils.data import DataLoader

    from ..data.mazes import maze_test_sets
    from ..run.checkpoint import check_finite
    from ..run.device import pick_device
    from .budget import check_loader_cost
    from .mazes import maze_sweep_sizes, stable_rule, summarize_mazes

    mazes = _maze_options(mazes, sizes, min_steps, patience)
    model, cfg = loaded.model, loaded.config
    check_finite(model, path)
    out_dir = output_dir(out or _run_dir(path))
    dev = pick_device(device)
    model = model.to(dev)
    T = model.nominal_steps
    K, note = capped(model, steps or 10 * T)
    if min_steps is not None and min_steps > K:
        raise UserError(f"--min-steps {min_steps} is past the sweep's last iteration ({K}): the stable rule "
                        f"could never stop; raise --steps or lower --min-steps")
    data = replace(cfg.data, maze_test_sizes=sorted(set(sizes or cfg.data.maze_test_sizes)), maze_test=mazes)
    _check_maze_memory(model, data, mazes, dev, force)
    sets = maze_test_sets(data)
    check_loader_cost(model, DataLoader(sets[max(sets)], batch_size=MAZE_BATCH), dev, K,
                      len(sets) * -(-mazes // MAZE_BATCH), force=force)
    outputs = claim_files(out_dir, {"horizon.csv": ",".join(MAZE_CSV[:2]).encode(), "horizon.png": PNG,
                                      "horizon.json": JSON_MARK, MAZE_PICTURE: PNG})
    rule = stable_rule(T, K, min_steps, patience)
    sweeps = maze_sweep_sizes(model, sets, dev, K, batch_size=MAZE_BATCH, example=True, **rule)
    examples = {size: sw.pop("example") for size, sw in sweeps.items()}
    # the picture: the largest size where the stable rule solved a maze (none: the largest size's first maze)
    size = max((s for s, ex in examples.items() if ex["solved"]), default=max(examples))
    ex = examples[size]
    summary = {"run": str(path), "model": cfg.model.name, "trained_steps": T, "max_steps": K, "note": note,
               "mazes": mazes, "stable_rule": rule, "rows": summarize_mazes(sweeps, T),
               "csv": str(out_dir / "horizon.csv"), "png": str(out_dir / "horizon.png"),
               "picture": {"png": str(outputs[MAZE_PICTURE]), "size": size, "stable_solved": ex["solved"],
                           "stable_step": ex["step"], "stable_stopped": ex["stopped"],
                           "solved_at_max_steps": ex["solved_last"]}}
    _write_maze_files(outputs, sweeps, ex, summary, _run_dir(path).resolve().name, cfg.data.maze_size)
    return HorizonRun(summary, maze_lines(summary, cfg.data.maze_size, out_dir / "horizon.json"))


def _maze_table(sweeps: Dict[int, Dict[str, object]]) -> str:
    """horizon.csv of a maze run: a row a size and iteration."""
    table = io.StringIO(newline="")
    w = csv.writer(table)
    w.writerow(MAZE_CSV)
    for size, sw in sorted(sweeps.items()):
        w.writerows(zip(*([size] * len(sw["step"]), sw["step"], sw["solved"], sw["accuracy"], sw["path_recall"],
                            sw["path_precision"], sw["state_rms"], sw["state_change"], sw["solved_open"])))
    return table.getvalue()


def _write_maze_files(outputs: Dict[str, Path], sweeps, ex, summary: dict, run_name: str, trained_size: int) -> None:
    """The four files of a maze run's sweep, all new or all as they were."""
    from .mazes import draw_maze, example_panels, plot_solved

    T, K, size = summary["trained_steps"], summary["max_steps"], summary["picture"]["size"]
    # the file names its siblings by name (the folder moves: results are copied out of the run), stdout in full
    saved = {**summary, "csv": "horizon.csv", "png": "horizon.png",
             "picture": {**summary["picture"], "png": MAZE_PICTURE}}
    with file_set(outputs["horizon.csv"].parent, list(outputs)):
        write_text(outputs["horizon.csv"], _maze_table(sweeps), ",".join(MAZE_CSV[:2]).encode(), "horizon.csv")
        plot_solved(sweeps, T, outputs["horizon.png"],
                    title=f"{run_name}: trained at {trained_size}x{trained_size}, T = {T}, swept to {K}")
        draw_maze(example_panels(ex, K), f"{run_name}: a {size}x{size} test maze (trained at "
                  f"{trained_size}x{trained_size}, T = {T})", outputs[MAZE_PICTURE])
        write_text(outputs["horizon.json"], json.dumps(saved, indent=1) + "\n", JSON_MARK, "horizon.json")


def maze_lines(summary: dict, trained_size: int, json_path: Path) -> List[str]:
    """A maze run's summary in words: solved at T..10T, at the peak and by each rule a size, how the path is
    wrong, how the recurrent state moves, the picture and the files."""
    pct = lambda v: "   -  " if v is None else f"{100 * v:5.1f}%"  # noqa: E731
    rows, rule, pic, K = summary["rows"], summary["stable_rule"], summary["picture"], summary["max_steps"]
    lines = [f"{summary['model']}: trained at {trained_size}x{trained_size} with T={summary['trained_steps']}, "
             f"swept K={K}, {summary['mazes']} test mazes a size; solved at"]
    if summary["note"]:
        lines.append(f"  ({summary['note']})")
    lines.append(f"   size      T     2T     4T    10T   peak (iter)  max_conf  (open)  stable (mean iters; from "
                 f"iteration {rule['min_steps']}, {rule['patience']} unchanged)")
    lines += [f"  {r['size']:>2}x{r['size']:<2} {pct(r['solved_T'])} {pct(r['solved_2T'])} {pct(r['solved_4T'])} "
              f"{pct(r['solved_10T'])} {pct(r['solved_best'])} ({r['best_step']:>3})  {pct(r['max_conf_solved'])} "
              f"{pct(r['max_conf_open_solved'])}"
              f"  {pct(r['stable_solved'])} ({r['stable_steps_mean']:.1f})" for r in rows]
    lines += ["  max_conf: the iteration of most confidence over every pixel; (open): over open pixels only, "
              "DeepThinking's own",
              "  peak: the most solved at any iteration of this test sweep (the curve's top, chosen on test: a "
              "description, not a choice; the study chooses its iteration on validation)",
              "  path recall / precision (eroded past the answer: recall falls; spilled into dead ends: precision)"]
    lines += [f"  {r['size']:>2}x{r['size']:<2}  @T {pct(r['path_recall_T'])} / {pct(r['path_precision_T'])}"
              f"   @10T {pct(r['path_recall_10T'])} / {pct(r['path_precision_10T'])}" for r in rows]
    if rows[0]["state_rms_10T"] is not None:
        lines.append("  the recurrent state: RMS at T and 10T (growth), and its relative change per iteration there "
                     "(0 at a fixed point)")
        lines += [f"  {r['size']:>2}x{r['size']:<2}  RMS {r['state_rms_T']:.3g} -> {r['state_rms_10T']:.3g} "
                  f"(x{r['state_rms_10T'] / max(r['state_rms_T'], 1e-12):.3g})   change "
                  f"{r['state_change_T'] or 0:.3g} -> {r['state_change_10T']:.3g}" for r in rows]
    if pic["stable_solved"]:
        how = f"solved by the stable rule at iteration {pic['stable_step']}"
        how += "" if pic["stable_stopped"] else " (never stable: read there)"
    else:
        how = "the first one (the stable rule solved none at any size)"
    return lines + [f"  picture: a {pic['size']}x{pic['size']} maze, {how}; at {K} iterations "
                    f"{'solved' if pic['solved_at_max_steps'] else 'not solved'}",
                    f"  wrote {summary['csv']}, {summary['png']}, {pic['png']} and {json_path}"]


__all__ = ["HorizonRun", "MAZE_CSV", "MAZE_PICTURE", "capped", "classifier_lines", "horizon_run", "maze_lines"]
