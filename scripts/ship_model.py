"""Ship a trained maze run inside the package (issue 55): its checkpoint exported as safetensors into
``src/recurvit/pretrained/NAME.safetensors``, measured there, and listed in ``src/recurvit/pretrained/index.yaml``.

    python scripts/ship_model.py RUN NAME --about "..." --trained-by "recurvit train mazes/... train.seed=3" \
        --commit 9adf6f9 [--checkpoint last.pt] [--mazes 1000]
    python scripts/ship_model.py --check     # models.md is what index.yaml gives (tests run it)

The figures in the index are measured here, on the EXPORTED file (what a user loads), at its trained depth, on
the run's own test split at every size of its ``data.maze_test_sizes`` (``--mazes`` a size; at the training
size the split holds no training or validation maze): DeepThinking's solved (``solved_open_<size>``: every open
pixel right) and the strict one (``solved_<size>``). The checkpoint is last.pt unless said: a run's last-epoch
test figures are last.pt's. tests/pretrained/test_shipped.py then holds every shipped model to its figure at
the training size on mazes the run never saw.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "recurvit" / "pretrained"


def measure(export: Path, cfg, mazes: int) -> dict:
    """{solved_<size>, solved_open_<size>} of the export on the run's test split at every test size."""
    from dataclasses import replace

    from torch.utils.data import DataLoader

    import recurvit
    from recurvit.data.mazes import maze_test_sets
    from recurvit.tasks.dense.task import evaluate_dense

    model = recurvit.load_model(export)
    out = {}
    for size, data in maze_test_sets(replace(cfg.data, maze_test=mazes)).items():
        ev = evaluate_dense(model, DataLoader(data, batch_size=50), next(model.parameters()).device, amp="off")
        out[f"solved_{size}"] = round(ev["solved"], 6)
        out[f"solved_open_{size}"] = round(ev["solved_open"], 6)
        print(f"{size}x{size}: solved {ev['solved']:.3f} (DeepThinking's {ev['solved_open']:.3f}) of {ev['n']}",
              flush=True)
    return out


def table(rows: dict) -> str:
    """src/recurvit/pretrained/models.md: every shipped model, its size, recipe and measured figures."""
    lines = ["# Shipped models", "",
             "Written by `python scripts/ship_model.py` from index.yaml (do not edit). Load one with "
             "`recurvit.load_model(NAME)`; run it with `recurvit predict NAME maze.png` (the path written as "
             "maze.path.png). solved: every pixel right; DeepThinking's: every open pixel right (its walls "
             "zeroed); measured on the shipped file at its trained depth, on its run's test split.", ""]
    for name, r in sorted(rows.items()):
        m = r["measured"]
        sizes = sorted({int(k.rsplit("_", 1)[1]) for k in m})
        lines += [f"## {name}", "", r["about"], "",
                  f"Trained by `{r['trained_by']}` at {r['commit']}; {r['train_size']}x{r['train_size']} mazes, "
                  f"{r['steps']} iterations. {r['measured_on']}:", "",
                  "| size | " + " | ".join(f"{s}x{s}" for s in sizes) + " |",
                  "|---|" + "---|" * len(sizes),
                  "| solved | " + " | ".join(f"{100 * m[f'solved_{s}']:.1f}%" for s in sizes) + " |",
                  "| DeepThinking's | " + " | ".join(f"{100 * m[f'solved_open_{s}']:.1f}%" for s in sizes) + " |", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="?")
    ap.add_argument("name", nargs="?")
    ap.add_argument("--about", help="one paragraph: what it is, which recipe trained it")
    ap.add_argument("--trained-by", help="the command that trained it")
    ap.add_argument("--commit", help="the commit it was trained at")
    ap.add_argument("--check", action="store_true", help="only check that models.md is what index.yaml gives")
    ap.add_argument("--checkpoint", default="last.pt")
    ap.add_argument("--mazes", type=int, default=1000, help="test mazes a size (default: 1000)")
    args = ap.parse_args(argv)
    index = PACKAGE / "index.yaml"
    rows = (yaml.safe_load(index.read_text()) or {}) if index.is_file() else {}
    if args.check:
        md = PACKAGE / "models.md"
        if rows and (not md.is_file() or md.read_text() != table(rows)):
            sys.exit(f"error: {md} is not what {index} gives: both are written by scripts/ship_model.py, "
                     "never by hand")
        return 0
    if not (args.run and args.name and args.about and args.trained_by and args.commit):
        ap.error("RUN, NAME, --about, --trained-by and --commit are needed to ship a model")

    import recurvit
    from recurvit.export.hf import export_safetensors

    if args.name in rows:
        sys.exit(f"error: {args.name} is shipped already; remove its entry and file first")
    loaded = recurvit.load(args.run / args.checkpoint)
    cfg = loaded.config
    if cfg.data.name != "mazes":
        sys.exit(f"error: {args.run} is a {cfg.data.name} run; only maze runs are shipped")
    out = PACKAGE / f"{args.name}.safetensors"
    export_safetensors(loaded, out)
    try:
        measured = measure(out, cfg, args.mazes)
    except BaseException:
        out.unlink()
        raise
    rows[args.name] = {
        "file": out.name, "about": " ".join(args.about.split()), "trained_by": args.trained_by,
        "commit": args.commit, "task": "mazes", "train_size": int(cfg.data.maze_size),
        "steps": int(cfg.model.steps),
        "data": {"maze_seed": int(cfg.data.maze_seed), "maze_train": int(cfg.data.maze_train),
                 "maze_val": int(cfg.data.maze_val)},
        "measured_on": f"{args.mazes} test mazes a size at {cfg.model.steps} iterations "
                       f"(scripts/ship_model.py, the exported file)",
        "measured": measured,
    }
    index.write_text("# Written by scripts/ship_model.py: one entry a shipped model (see recurvit/pretrained/__init__.py).\n"
                     + yaml.safe_dump(rows, sort_keys=True, width=100))
    (PACKAGE / "models.md").write_text(table(rows))
    print(f"shipped {args.name}: {out} ({out.stat().st_size / 1024:.0f} KB); listed in {index} and models.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
