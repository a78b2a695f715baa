"""Does every committed study report regenerate byte for byte from what this machine has?

    python scripts/check_reports.py            # a line per study: identical, or which file differs and why
    python scripts/check_reports.py STUDY ...  # only these study files

For each study file with a committed results folder, the rows come from the run directories when this machine
has them (``runs/studies/<name>``, as ``recurvit study --report-only`` reads them), else from the committed
``results.csv``; the report is written into a temporary folder holding copies of the committed plots (a report
links the plots its folder has) under the command the committed report names, and ``report.md`` and
``results.csv`` are compared with the committed ones. Nothing in the repository is written. A report that
differs only where its rows lack what the committed one was made from (the per-epoch curves of runs this
machine no longer has, read by the plateau column) is named with that reason. Exit status 1 when any differs.
"""
from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import recurvit.tasks  # noqa: E402,F401  (registers the tasks the study files name)
from recurvit.study import collect, load_study, write_report  # noqa: E402
from recurvit.study.report import report_command, rows_from_csv  # noqa: E402
from recurvit.study.spec import run_dir_root  # noqa: E402

FILES = ("report.md", "results.csv")


def check(path: Path) -> str:
    study = load_study(path)
    committed = study.results
    if committed is None or not (committed / "report.md").is_file():
        return ""
    runs = Path(run_dir_root(study))
    runs = runs if runs.is_absolute() else ROOT / runs
    rows = collect(runs, study) if runs.is_dir() else []
    source = f"{len(rows)} runs in {runs}" if rows else "results.csv"
    if not rows:
        rows = rows_from_csv(committed / "results.csv", study)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for png in committed.glob("*.png"):
            shutil.copy(png, out / png.name)
        study.results = out
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            write_report(rows, study, out, command=report_command(committed / "report.md") or "")
        differ = [f for f in FILES if not filecmp.cmp(committed / f, out / f, shallow=False)]
    if not differ:
        return f"{path.name}: identical (from {source})"
    why = ""
    if source == "results.csv" and not any(r.get("plateau_test") is not None for r in rows):
        why = " — its results.csv predates the plateau columns and its runs are not on this machine"
    return f"{path.name}: DIFFERS in {', '.join(differ)} (from {source}){why}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("studies", nargs="*", type=Path, help="study files (default: every one in studies/)")
    args = p.parse_args(argv)
    paths = args.studies or sorted(p for p in (ROOT / "studies").glob("*.yaml") if p.name != "claims.yaml")
    lines = [line for line in map(check, paths) if line]
    print("\n".join(lines))
    bad = sum("DIFFERS" in line for line in lines)
    print(f"{len(lines) - bad} of {len(lines)} reports regenerate byte for byte")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
