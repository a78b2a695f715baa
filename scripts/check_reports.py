"""Does every committed study report regenerate byte for byte from what is committed (and this machine has)?

    python scripts/check_reports.py              # a line per study: identical, or which file differs and why
    python scripts/check_reports.py STUDY ...    # only these study files
    python scripts/check_reports.py --keep DIR   # also keep each regenerated folder as DIR/<study file's stem>

For each study file with a committed results folder, the rows are read as ``recurvit study --report-only`` reads
them: each run's result.json from its run directory when this machine has it (``runs/studies/<name>``), else the
copy the results folder keeps (``runs/<id>/result.json``, committed); only a study with neither is rebuilt from
its committed ``results.csv``. The report is written into a temporary folder holding copies of the committed
plots (a report links the plots its folder has) under the command the committed report names, and ``report.md``
and ``results.csv`` are compared with the committed ones. Nothing in the repository is written. Exit status 1
when any differs.
"""
from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from recurvit.errors import UserError  # noqa: E402
from recurvit.study import collect, load_study, write_report  # noqa: E402
from recurvit.study.report import report_command, rows_from_csv  # noqa: E402
from recurvit.study.spec import run_dir_root  # noqa: E402

FILES = ("report.md", "results.csv")


def check(path: Path, keep: Optional[Path] = None) -> str:
    """One study file's line: identical, or which generated file differs (and why, when the rows came from
    results.csv alone); '' for a study without a committed report. ``keep``: where to copy the regenerated folder."""
    study = load_study(path)
    committed = study.results
    if committed is None or not (committed / "report.md").is_file():
        return ""
    runs = Path(run_dir_root(study))
    runs = runs if runs.is_absolute() else ROOT / runs
    rows = collect(runs, study)  # the run directories' results, else the results folder's copies
    here = sum((runs / "runs" / r["run_id"] / "result.json").is_file() for r in rows)
    source = (f"{len(rows)} runs: {here} in {runs}, {len(rows) - here} kept in the results folder" if here else
              f"{len(rows)} runs kept in the results folder") if rows else "results.csv"
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
        if keep is not None:
            shutil.copytree(out, keep / path.stem, dirs_exist_ok=True)
    if not differ:
        return f"{path.name}: identical (from {source})"
    why = ""
    if source == "results.csv":
        why = (" — no result.json of its runs here or in its results folder: results.csv alone lacks the per-epoch "
               "curves and the full precision the committed report was made from")
    return f"{path.name}: DIFFERS in {', '.join(differ)} (from {source}){why}"


def _line(path: Path, keep: Optional[Path]) -> str:
    try:
        return check(path, keep)
    except UserError as e:  # a result file of an earlier recurvit, a broken results.csv: one line
        return f"{path.name}: UNREADABLE: {e}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("studies", nargs="*", type=Path, help="study files (default: every one in studies/)")
    p.add_argument("--keep", type=Path, help="keep each regenerated folder as KEEP/<study file's stem>")
    args = p.parse_args(argv)
    paths = args.studies or sorted(p for p in (ROOT / "studies").glob("*.yaml") if p.name != "claims.yaml")
    lines = [line for line in (_line(x, args.keep) for x in paths) if line]
    print("\n".join(lines))
    bad = sum("DIFFERS" in line or "UNREADABLE" in line for line in lines)
    print(f"{len(lines) - bad} of {len(lines)} reports regenerate byte for byte")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
