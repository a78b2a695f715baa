"""Issue 55's pilot report: a maze run trained on DeepThinking's recipe, its kept checkpoints (train.keep_every)
each swept to K iterations at several sizes, and the budget curve across them. Exploratory: it decides nothing.

    python scripts/maze_pilot.py RUN --out results/mazes_pilot/dt16 --steps 300 --sizes 9 13 17 21 33 --mazes 100

For each ``RUN/epoch_NNNN.pt`` without a sweep in ``OUT/epoch_NNNN/`` it runs ``recurvit horizon`` (a fresh
process; the folder gets horizon.csv / .json / .png), then writes ``OUT/report.md`` (the training curve from
RUN/metrics.jsonl, and per checkpoint DeepThinking's solved and the strict one at T, 2T, 4T and 10T a size,
the best iteration and the state's growth from T to 10T), ``OUT/budget.png`` (solved at T and at K against
training steps, a line a size) and a copy of ``metrics.jsonl``. Rerun it as checkpoints arrive: sweeps done
are kept. Each horizon.png is drawn again from its CSV with DeepThinking's solved dotted beside the strict one.

The report also says how far each part of the network has moved from its initialisation at each kept checkpoint
(the relative RMS change ||w - w0|| / ||w0|| of the projection, the shared recurrent block and the head; w0 rebuilt
from the run's config and seed exactly as ``recurvit train`` builds it, before any step), and, with
``--reference RUN`` (another run, e.g. one trained on a different recipe), the same for that run's last.pt.

It ends with the pilot's rule 1 (docs/results.md, "The pilot's rules", committed before the epochs it judges): the run
*reproduces* DeepThinking where DeepThinking's solved at 10T is at least 95% at 9x9 and 90% at 33x33, both for the
checkpoint kept at the run's last epoch (40,000 steps on the recipe) and for best.pt (chosen on validation), which is
swept into ``OUT/best/`` once the run has trained all its epochs. Before that the rule is "undecided", and the
latest kept checkpoint's reading is shown as such. The same reading is written to ``OUT/rule1.json``
(``scripts/maze_widths.py --rule1`` reads it into the pilot's summary).
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

from recurvit.run.rundir import RunDir

RULE1 = {9: 0.95, 33: 0.90}  # size -> DeepThinking's solved at 10T that rule 1 asks (issue 55's target)


def sweep(ckpt: Path, out: Path, steps: int, sizes, mazes: int) -> None:
    if (out / "horizon.json").is_file():
        return
    cmd = [sys.executable, "-m", "recurvit", "horizon", str(ckpt), "--steps", str(steps), "--sizes",
           *map(str, sizes), "--mazes", str(mazes), "--out", str(out)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def curves(folder: Path) -> dict:
    """{size: {step: (solved, solved_open, state_rms)}} from a horizon.csv."""
    out: dict = {}
    with open(folder / "horizon.csv") as f:
        for r in csv.DictReader(f):
            out.setdefault(int(r["size"]), {})[int(r["step"])] = (
                float(r["solved"]), float(r["solved_open"]), float(r["state_rms"]))
    return out


def replot(c: dict, folder: Path, epoch: int, K: int) -> None:
    """folder/horizon.png drawn again from its horizon.csv, DeepThinking's solved dotted beside the strict one."""
    from recurvit.analysis.mazes import plot_solved

    T = json.loads((folder / "horizon.json").read_text())["trained_steps"]
    sweeps = {size: {"step": sorted(by), "solved": [by[k][0] for k in sorted(by)],
                     "solved_open": [by[k][1] for k in sorted(by)]} for size, by in c.items()}
    plot_solved(sweeps, T, folder / "horizon.png", title=f"epoch {epoch}: trained at 9x9, T = {T}, swept to {K}")


def initial_weights(run: Path) -> dict:
    """The weights ``recurvit train`` started RUN from: its config's seed, the loaders built, then the model (the
    order of train.fit and the dense task's build, so the same draws)."""
    from recurvit.config import load_config
    from recurvit.run.checkpoint import build_model_from_config
    from recurvit.run.device import seed_everything
    from recurvit.run.loaders import build_loaders, resolve_model_config

    cfg = load_config(run / "config.yaml")
    seed_everything(cfg.train.seed)
    _, _, info = build_loaders(cfg)
    return build_model_from_config(resolve_model_config(cfg, info)).state_dict()


def part(name: str) -> str:
    from recurvit.train.optim import BLOCKS

    return "recurrent block" if name.startswith(BLOCKS) else name.split(".")[0]


def drift(init: dict, ckpt: Path | dict) -> dict:
    """{part: ||w - w0|| / ||w0||} over each part's weights (the projection, the shared block, the head); ``ckpt``
    a checkpoint file or one already loaded."""
    from recurvit.run.checkpoint import load_checkpoint

    state, sums = (ckpt if isinstance(ckpt, dict) else load_checkpoint(ckpt))["model"], {}
    for name, w0 in init.items():
        d, n = sums.get(part(name), (0.0, 0.0))
        sums[part(name)] = (d + (state[name].float() - w0.float()).pow(2).sum().item(), n + w0.float().pow(2).sum().item())
    return {p: (d / n) ** 0.5 for p, (d, n) in sums.items()}


def drift_lines(run: Path, reference: Path | None, steps_per_epoch: int) -> list:
    init = initial_weights(run)
    rows = [(f"{run.name} epoch {int(c.stem.split('_')[1])} ({int(c.stem.split('_')[1]) * steps_per_epoch:,} steps)",
             drift(init, c)) for c in sorted(run.glob("epoch_*.pt"))]
    if reference is not None:
        from recurvit.run.checkpoint import load_checkpoint

        ckpt = load_checkpoint(reference / "last.pt")  # its steps and block lr scale as trained, not recomputed
        scale = ckpt["optimizer"]["param_groups"][-1].get("lr_scale", 1.0)
        rows.append((f"reference: {reference.name}, last.pt ({ckpt['scheduler']['last_epoch']:,} steps, T = "
                     f"{ckpt['config']['model']['steps']}, block lr x {scale:.3g})",
                     drift(initial_weights(reference), ckpt)))
    parts = list(rows[0][1]) if rows else []
    lines = ["", "## How far each part has moved from its initialisation", "",
             "||w - w0|| / ||w0|| over the part's weights, w0 rebuilt from the run's config and seed as `recurvit train` "
             "builds it.", "", "| checkpoint | " + " | ".join(parts) + " |", "|---|" + "---|" * len(parts)]
    lines += [f"| {name} | " + " | ".join(f"{d[p]:.3f}" for p in parts) + " |" for name, d in rows]
    return lines


def rule1(c: dict, T: int) -> str:
    """Rule 1 on one sweep's curves ({size: {step: (strict, solved, rms)}}): 'meets', 'fails: ...' (each size
    below its bar, with its figure) or 'undecided: ...' (a size or 10T not swept)."""
    short = []
    for size, need in RULE1.items():
        if 10 * T not in c.get(size, {}):
            return f"undecided: {size}x{size} not swept to {10 * T} iterations"
        got = c[size][10 * T][1]
        if round(got, 9) < need:
            short.append(f"{size}x{size} {100 * got:.1f}% < {100 * need:.0f}%")
    return "meets" if not short else "fails: " + "; ".join(short)


def rule1_reading(run: Path, out: Path, T: int, epochs: int, done: int, steps_per_epoch: int) -> dict:
    """Rule 1 as data (the report's table and OUT/rule1.json): the last epoch's kept checkpoint and best.pt once
    the run is complete (``decided``), else the latest kept checkpoint's reading, marked as not the rule's."""
    def row(label: str, folder: Path, epoch: int) -> dict:
        c = curves(folder)
        at = lambda s: c[s][10 * T][1] if 10 * T in c.get(s, {}) else None  # noqa: E731
        return {"checkpoint": label, "epoch": epoch, "steps": epoch * steps_per_epoch, "solved_9_10T": at(9),
                "solved_33_10T": at(33), "verdict": rule1(c, T)}

    reading = {"run": run.name, "T": T, "epochs": epochs, "done": done, "steps": epochs * steps_per_epoch,
               "decided": False, "rows": []}
    last, best = out / f"epoch_{epochs:04d}", out / "best"
    if done >= epochs and (last / "horizon.csv").is_file() and (best / "horizon.csv").is_file():
        from recurvit.run.checkpoint import load_checkpoint

        epoch = load_checkpoint(run / "best.pt")["epoch"]
        reading["decided"] = True
        reading["rows"] = [row(f"epoch {epochs} ({epochs * steps_per_epoch:,} steps)", last, epochs),
                           row(f"best.pt (epoch {epoch}, chosen on validation)", best, epoch)]
        return reading
    kept = sorted(out.glob("epoch_*/horizon.csv"))
    if kept:
        e = int(kept[-1].parent.name.split("_")[1])
        reading["rows"] = [row(f"epoch {e} ({e * steps_per_epoch:,} steps): not the rule's checkpoint", kept[-1].parent,
                               e)]
    return reading


def rule1_lines(reading: dict) -> list:
    """The report's rule-1 section from :func:`rule1_reading`."""
    T, epochs = reading["T"], reading["epochs"]
    lines = ["", "## Rule 1: does the run reproduce DeepThinking?", "",
             f"DeepThinking's solved at 10T ({10 * T} iterations) must be at least 95% at 9x9 and 90% at 33x33, for "
             f"the checkpoint kept at the last epoch ({reading['steps']:,} steps) and for best.pt (docs/results.md, "
             "\"The pilot's rules\", committed before the epochs it judges).", "",
             "| checkpoint | 9x9 at 10T (%) | 33x33 at 10T (%) | verdict |", "|---|---|---|---|"]
    lines += [f"| {r['checkpoint']} | {pct(r['solved_9_10T'])} | {pct(r['solved_33_10T'])} | {r['verdict']} |"
              for r in reading["rows"]]
    if not reading["decided"]:
        lines += ["", f"**Undecided**: the run has trained {reading['done']} of its {epochs} epochs."]
    return lines


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def report(run: Path, out: Path, steps_per_epoch: int, reference: Path | None = None) -> None:
    metrics = RunDir(run, created=False, owner=False).read_metrics()
    shutil.copy(run / "metrics.jsonl", out / "metrics.jsonl")
    T = json.loads(next(iter(sorted(out.glob("epoch_*/horizon.json")))).read_text())["trained_steps"] \
        if list(out.glob("epoch_*/horizon.json")) else None
    lines = ["# Pilot: the conv anchor on DeepThinking's recipe (exploratory)", "",
             f"Run `{run.name}`; generated by `python scripts/maze_pilot.py` from its metrics.jsonl and the horizon "
             "sweeps of its kept checkpoints. **solved** is DeepThinking's (its predictions on walls zeroed: every open "
             "pixel right); **strict**: every pixel right. Test mazes are fresh (the generator's test split).", "",
             "## Training", "", "| epoch | steps | lr (after the epoch) | train loss | train solved (%) | val solved (%, DeepThinking's) | "
             "val solved (%, strict) |", "|---|---|---|---|---|---|---|"]
    for m in metrics:
        lines.append(f"| {m['epoch']} | {m['epoch'] * steps_per_epoch:,} | {m['lr']:.2e} | {m['train_loss']:.4f} | "
                     f"{pct(m.get('train_solved_open'))} | {pct(m.get('val_solved_open'))} | {pct(m.get('val_solved'))} |")
    sweeps = sorted(out.glob("epoch_*/horizon.csv"))
    budget = {}
    for path in sweeps:
        epoch = int(path.parent.name.split("_")[1])
        c = curves(path.parent)
        K = max(max(v) for v in c.values())
        replot(c, path.parent, epoch, K)
        lines += ["", f"## Checkpoint at epoch {epoch} ({epoch * steps_per_epoch:,} steps), swept to {K} iterations",
                  "", f"![solved against iterations]({path.parent.name}/horizon.png)", "",
                  "| size | solved at T | 2T | 4T | 10T | at K | best (iteration) | strict at T | strict at 10T | "
                  "state RMS 10T / T |", "|---|---|---|---|---|---|---|---|---|---|"]
        for size, by_step in sorted(c.items()):
            at = lambda k, i=1: by_step[k][i] if k in by_step else None  # noqa: E731
            best = max(by_step, key=lambda k: (by_step[k][1], -k))
            growth = by_step[10 * T][2] / by_step[T][2] if 10 * T in by_step and by_step[T][2] else None
            lines.append(f"| {size}x{size} | {pct(at(T))} | {pct(at(2 * T))} | {pct(at(4 * T))} | {pct(at(10 * T))} | "
                         f"{pct(at(K))} | {pct(by_step[best][1])} ({best}) | {pct(at(T, 0))} | {pct(at(10 * T, 0))} | "
                         f"{'-' if growth is None else f'{growth:.2f}'} |")
            budget.setdefault(size, []).append((epoch * steps_per_epoch, at(T), at(K)))
    lines += drift_lines(run, reference, steps_per_epoch)
    if T is not None:
        reading = rule1_reading(run, out, T, epochs_of(run), metrics[-1]["epoch"] if metrics else 0, steps_per_epoch)
        lines += rule1_lines(reading)
        (out / "rule1.json").write_text(json.dumps(reading, indent=1) + "\n")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    if budget:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for size, pts in sorted(budget.items()):
            xs = [p[0] for p in pts]
            line, = ax.plot(xs, [100 * p[2] for p in pts], marker="o", label=f"{size}x{size} at K")
            ax.plot(xs, [100 * p[1] for p in pts], ls="--", color=line.get_color(), alpha=0.6)
        ax.set_xlabel("training steps (batch 50)")
        ax.set_ylabel("mazes solved (%); dashed: at T")
        ax.set_title("budget curve: solved against training steps")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "budget.png", dpi=100)
    print(f"wrote {out / 'report.md'}")


def epochs_of(run: Path) -> int:
    from recurvit.config import load_config

    return load_config(run / "config.yaml").train.epochs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--sizes", type=int, nargs="+", default=[9, 13, 17, 21, 33])
    ap.add_argument("--mazes", type=int, default=100)
    ap.add_argument("--steps-per-epoch", type=int, default=800)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--reference", type=Path, help="another run whose last.pt's drift from init the report shows")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for ckpt in sorted(args.run.glob("epoch_*.pt")):
            sweep(ckpt, args.out / ckpt.stem, args.steps, args.sizes, args.mazes)
        done = RunDir(args.run, created=False, owner=False).read_metrics()
        if done and done[-1]["epoch"] >= epochs_of(args.run) and (args.run / "best.pt").is_file():
            sweep(args.run / "best.pt", args.out / "best", args.steps, args.sizes, args.mazes)
    report(args.run, args.out, args.steps_per_epoch, args.reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
