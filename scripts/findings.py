"""The README's findings: each claim of the seed abstracts against the study that measures it here.

    python scripts/findings.py          # writes results/findings.md, findings_summary.md, findings_headline.md,
                                        # findings_softmor_r.png
    python scripts/findings.py --check  # CI: fails when findings.md is out of date

The claims, their rules and the table live in the library (``recurvit.study.claims``, ``rules``,
``findings``) and in the study files' ``claims:`` sections; this script adds the two pictures around
them: which verdicts of the 3-epoch table survive a longer budget, and SoftMoR's accuracy against r.
Nothing here trains or evaluates.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from recurvit.errors import UserError  # noqa: E402
from recurvit.study.findings import collect  # noqa: E402
from recurvit.study.findings_md import headline, render, summary_page  # noqa: E402
from recurvit.study.stats import mean_ci, welch  # noqa: E402

Row = Dict[str, str]


def load(results: Path, name: str) -> Optional[List[Row]]:
    path = results / name / "results.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def values(rows: List[Row], key: str, **where: str) -> List[float]:
    return [float(r[key]) for r in rows
            if all(r.get(k) == v for k, v in where.items()) and r.get(key) not in (None, "")]


def softmor_figure(rows, path: Path) -> str:
    """acc@T against r, one line per mixture (r = 1 is the same runs for all), 95% t-intervals over seeds."""
    from recurvit.study import plots

    names = {"query": "SoftMoR, query router", "linear": "SoftMoR, linear router", "last": "plain recursion"}
    lines = {}
    for mix, label in names.items():
        pts = []
        for depth in range(1, 5):
            acc = values(rows, "acc_T", variant="r1" if depth == 1 else f"r{depth}_{mix}")
            if acc:
                pts.append((depth, mean_ci(acc)))
        lines[label] = pts
    return plots.series(lines, path, "SR-ViT, Fashion-MNIST: acc@T against r (95% intervals)",
                        "recursions per block r", "test accuracy at T (%)")


# The 3-epoch table (fashion_mnist_crossroads) against the same regimes trained to a plateau (fashion_converged):
# (comparison, figure, regime a and b in the 3-epoch study, the same in the converged study, claimed sign).
SURVIVAL = [
    ("ViT (matched FLOPs) − bViT", "acc_T", ("vit_matched_flops", "naive"), ("vit_matched_flops", "naive")),
    ("bViT − ViT (matched parameters)", "acc_T", ("naive", "vit_matched_params"), ("naive", "vit_matched_params")),
    ("deep supervision − naive", "acc_T", ("deep_supervision", "naive"), ("ds3", "naive")),
    ("deep supervision − naive", "acc_4T", ("deep_supervision", "naive"), ("ds3", "naive")),
    ("random depth − naive", "acc_T", ("random_depth", "naive"), ("random_depth", "naive")),
    ("random depth − naive", "acc_4T", ("random_depth", "naive"), ("random_depth", "naive")),
]


def survival(results: Path) -> List[str]:
    """Which verdicts of the 3-epoch table survive a 10-epoch budget."""
    short, long = load(results, "fashion_mnist_crossroads"), load(results, "fashion_converged")
    if short is None or long is None:
        return []
    lines = ["Which verdicts of the 3-epoch table survive a 10-epoch budget; a verdict here is "
             "the side of zero the 95% interval lies on (\"none\": it straddles zero):", "",
             "| comparison | figure | 3 epochs | 10 epochs | survives |", "|---|---|---|---|---|"]

    def side(w: Dict[str, float]) -> str:
        return "+" if w["lo"] > 0 else "−" if w["hi"] < 0 else "none"

    for label, key, (a3, b3), (a10, b10) in SURVIVAL:
        for name, rows, regimes in (("fashion_mnist_crossroads", short, (a3, b3)), ("fashion_converged", long, (a10, b10))):
            missing = sorted(set(regimes) - {str(r.get("regime")) for r in rows})
            if missing:  # a renamed regime is an error, not a silently dropped row
                raise UserError(f"survival table: results/{name} has no regime {', '.join(missing)}")
        w3 = welch(values(short, key, regime=a3), values(short, key, regime=b3))
        w10 = welch(values(long, key, regime=a10), values(long, key, regime=b10))
        if math.isnan(w3["diff"]) or math.isnan(w10["diff"]):
            continue
        cell = [f"{w['diff'] * 100:+.1f} [{w['lo'] * 100:+.1f}, {w['hi'] * 100:+.1f}] ({side(w)})" for w in (w3, w10)]
        # a verdict survives when the longer budget puts the interval on the same side of zero; two intervals
        # that both straddle zero decided nothing at either budget, so nothing survived
        same = "no verdict at either" if side(w3) == side(w10) == "none" else "yes" if side(w3) == side(w10) else "no"
        lines.append(f"| {label} | {key.replace('acc_', 'acc@')} | {cell[0]} | {cell[1]} | {same} |")
    return [""] + lines


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (its studies/ and results/; default: this one)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when findings.md differs from what the results files give (CI)")
    args = ap.parse_args(list(argv))
    args.results = args.root / "results"
    try:
        lines = collect(args.root)
        pages = {args.results / "findings.md": render(args.root, extra=survival(args.results), lines=lines),
                 args.results / "findings_summary.md": summary_page(args.root, lines),
                 args.results / "findings_headline.md": headline(lines, args.root)}
    except UserError as e:  # a renamed label, a missing test: one line, exit code 2
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        stale = [out for out, text in pages.items() if not out.is_file() or out.read_text() != text]
        for out in stale:
            print(f"{out} is out of date: run python scripts/findings.py")
        if not stale:
            print(f"{', '.join(map(str, pages))} up to date")
        return 1 if stale else 0
    for out, text in pages.items():
        out.write_text(text)
        print(f"wrote {out}")
    softmor = load(args.results, "fashion_softmor")
    if softmor is not None:  # the README's SoftMoR figure (a picture of the two trend rows above)
        print(f"wrote {args.results / softmor_figure(softmor, args.results / 'findings_softmor_r.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
