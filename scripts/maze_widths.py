"""Issue 55's widening rule: does a wider conv anchor learn DeepThinking's recipe faster a step than width 16?
Exploratory (one seed a width), and the rule below was committed before the epochs it judges (docs/results.md,
"Where the pilot stands"):

    python scripts/maze_widths.py results/mazes_pilot/dt16/resume/metrics.jsonl:16 \\
        results/mazes_pilot/dt32/resume/metrics.jsonl:32 --out results/mazes_pilot

Rule: a width learns faster a step than the first one given (the reference) where its train loss over open pixels
(the epoch's mean over 800 steps, same recipe, same data, same seed) is below the reference's at the same epoch by
at least MARGIN (0.01: about one epoch of width 16's progress after its warmup) at EVERY epoch from FROM (5: the
warmup's lr has passed 45% of its peak) that both runs reached; it is "not faster" as soon as one such epoch
misses, and "undecided" while none is reached. Writes OUT/widths.md (the table and the verdict) and
OUT/widths.png (train loss against steps, a line a width).

With ``--rule1 RULE1.json:WIDTH`` (what ``scripts/maze_pilot.py`` writes beside a run's report) for each width,
widths.md ends with where the pilot stands by all its rules: each width's rule 1 (reproduces DeepThinking: decided
at the run's last epoch and on best.pt, else undecided with its latest sweep's reading) and rule 4, the issue's
stop (the first width fails rule 1 and every other one is "not faster" or fails rule 1: stop at the pilot; a width
meets rule 1: the study may be built on it; otherwise undecided). Its last paragraph is what the README quotes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recurvit.run.rundir import METRICS, RunDir

MARGIN = 0.01
FROM = 5


def read(path: Path) -> dict[int, dict]:
    """{epoch: metrics line} of a run's metrics.jsonl (read as the runner reads it)."""
    return {r["epoch"]: r for r in RunDir(path.parent, created=False, owner=False).read_metrics()}


def verdict(ref: dict[int, dict], other: dict[int, dict], margin: float = MARGIN, start: int = FROM) -> str:
    """'faster a step', 'not faster' or 'undecided' by the rule above (epochs from ``start`` both reached)."""
    shared = [e for e in sorted(set(ref) & set(other)) if e >= start]
    if not shared:
        return "undecided"
    miss = [e for e in shared if round(ref[e]["train_loss"] - other[e]["train_loss"], 9) < margin]
    if miss:
        return f"not faster (epoch {miss[0]} misses)"
    return f"faster a step (epochs {shared[0]}-{shared[-1]})"


def pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def rule1_word(reading: dict) -> str:
    """'meets', 'fails' or 'undecided' from a run's rule1.json."""
    if not reading["decided"]:
        return "undecided"
    return "meets" if all(r["verdict"] == "meets" for r in reading["rows"]) else "fails"


def rule1_line(width: int, reading: dict) -> str:
    word = rule1_word(reading)
    solved = lambda r: (f"{pct(r['solved_9_10T'])}% of 9x9 and {pct(r['solved_33_10T'])}% of 33x33 mazes "  # noqa: E731
                        "solved at 10T")
    if word == "undecided":
        last = reading["rows"][-1] if reading["rows"] else None
        read = (f"its latest swept checkpoint, epoch {last['epoch']} at {last['steps']:,} steps, {solved(last)}"
                if last else "no checkpoint swept yet")
        return (f"width {width}, rule 1 (reproduces DeepThinking): **undecided** after {reading['done']} of "
                f"{reading['epochs']} epochs ({read})")
    read = " and ".join(f"{'best.pt' if r['checkpoint'].startswith('best') else 'the last checkpoint'} (epoch "
                        f"{r['epoch']}) {solved(r)}" for r in reading["rows"])
    return f"width {width}, rule 1 (reproduces DeepThinking): **{word}** at {reading['steps']:,} steps: {read}"


def stop_rule(ref_w: int, readings: dict, faster: dict) -> str:
    """Rule 4 from each width's rule-1 word and rule-3 verdict (``faster``: width -> verdict against ``ref_w``)."""
    words = {w: rule1_word(r) for w, r in readings.items()}
    met = sorted(w for w, x in words.items() if x == "meets")
    if met:
        return (f"rule 4: width {met[0]} reproduces DeepThinking here; the registered study may be built on it "
                "(its cost a width: width_cost.md)")
    if words.get(ref_w) == "fails" and all(v.startswith("not faster") or words.get(w) == "fails"
                                           for w, v in faster.items()):
        return ("rule 4: **stop at the pilot**: no width affordable here reproduces DeepThinking on its recipe "
                "(the study's runs are stated with their cost instead)")
    return "rule 4 (stop at the pilot, or widen): **undecided** until the rules above are"


def plot_losses(curves: list, path: Path, title: str, steps_per_epoch: int = 800) -> None:
    """Train loss against steps, one line a (label, {epoch: metrics}) curve, to ``path`` (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, m in curves:
        es = sorted(m)
        ax.plot([e * steps_per_epoch for e in es], [m[e]["train_loss"] for e in es], marker="o", ms=3, label=label)
    ax.set_xlabel("training steps (batch 50)")
    ax.set_ylabel("train loss over open pixels")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="METRICS.jsonl:WIDTH, the reference first")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps-per-epoch", type=int, default=800)
    ap.add_argument("--rule1", action="append", default=[], metavar="RULE1.json:WIDTH",
                    help="a width's rule-1 reading (scripts/maze_pilot.py's OUT/rule1.json)")
    args = ap.parse_args()
    runs = []
    for spec in args.runs:
        path, _, width = spec.rpartition(":")
        if not path or not width.isdigit() or not Path(path).is_file() or Path(path).name != METRICS:
            print(f"error: {spec!r} is not METRICS.jsonl:WIDTH with an existing run's {METRICS}", file=sys.stderr)
            return 2
        runs.append((int(width), Path(path), read(Path(path))))
    readings = {}
    for spec in args.rule1:
        path, _, width = spec.rpartition(":")
        if not path or not width.isdigit() or not Path(path).is_file():
            print(f"error: --rule1 {spec!r} is not RULE1.json:WIDTH with an existing file", file=sys.stderr)
            return 2
        readings[int(width)] = json.loads(Path(path).read_text())
    ref_w, _, ref = runs[0]
    epochs = sorted(set().union(*(m for _, _, m in runs)))
    widths = [w for w, _, _ in runs]
    lines = ["# The conv anchor's width on DeepThinking's recipe: train loss at matched steps (exploratory)", "",
             "Generated by `python scripts/maze_widths.py " + " ".join(args.runs)
             + "".join(f" --rule1 {r}" for r in args.rule1) + f" --out {args.out}`. One seed "
             "a width; train loss over open pixels (the epoch's mean; ln 2 = 0.693 at the start), DeepThinking's "
             "validation solved in brackets (%). The rule (committed before these epochs): a width learns faster a "
             f"step than width {ref_w} where its loss is below width {ref_w}'s by at least {MARGIN} at every epoch "
             f"from {FROM} both reached.", "",
             "| epoch | steps | " + " | ".join(f"width {w}" for w in widths) + " |",
             "|---|---|" + "---|" * len(widths)]
    for e in epochs:
        cells = [f"{m[e]['train_loss']:.4f} ({pct(m[e].get('val_solved_open'))})" if e in m else "-"
                 for _, _, m in runs]
        lines.append(f"| {e} | {e * args.steps_per_epoch:,} | " + " | ".join(cells) + " |")
    lines.append("")
    faster = {}
    for w, path, m in runs[1:]:
        faster[w] = verdict(ref, m)
        lines.append(f"- width {w} against width {ref_w}: **{faster[w]}** ({len(m)} epochs of {path})")
    if readings:
        lines += ["", "## Where the pilot stands", "",
                  "Each width's rule 1 (from its report's rule1.json), then rule 4 (docs/results.md, \"The pilot's "
                  "rules\").", ""]
        stands = [rule1_line(w, r) for w, r in sorted(readings.items())]
        stands += [f"width {w} against width {ref_w}, rule 3 (learns faster a step): **{v}**" for w, v in faster.items()]
        stands.append(stop_rule(ref_w, readings, faster))
        lines.append("; ".join(stands) + ".")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "widths.md").write_text("\n".join(lines) + "\n")

    plot_losses([(f"width {w}", m) for w, _, m in runs], args.out / "widths.png",
                "conv anchor on DeepThinking's recipe: width", args.steps_per_epoch)
    print(f"wrote {args.out / 'widths.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
