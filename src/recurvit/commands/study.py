"""recurvit study STUDY.yaml [--workers N] [--out DIR] [--report-only] [--json]"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from . import print_json


def add_parser(sub):
    p = sub.add_parser("study", help="run a grid of runs and write results.csv, report.md and plots",
                       description="Expands a study file's grid (see recurvit/study/spec.py) into runs under one "
                                   "study directory, skips finished runs (an interrupted study resumes; a study that "
                                   "asks for more evaluation re-evaluates finished runs without training them), and "
                                   "writes results.csv, report.md (95%% intervals over seeds) and plots.")
    p.add_argument("study", type=Path, help="study YAML (see studies/)")
    p.add_argument("--workers", type=int, default=1,
                   help="runs at a time, each in its own process with cores/N threads (default 1)")
    p.add_argument("--out", type=Path, help="study directory for the runs (default: the study's runs: entry, "
                                           "else runs/studies/<name>)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from finished runs, train nothing")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the report")
    return p


def run(args) -> int:
    from ..errors import UserError
    from ..study import collect, load_study, run_dir_root, run_study, write_report

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    study = load_study(args.study)
    out = args.out or run_dir_root(study)
    log = (lambda *a, **k: None) if args.json else print
    if args.report_only:
        rows = collect(out, study)
        if not rows:
            raise UserError(f"no finished runs in {out}; run the study first")
    else:
        rows = run_study(study, out, workers=args.workers, progress=not args.json, log=log)
    command = "recurvit study " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["study"] else ""
    report = write_report(rows, study, study.results or out, command=command)
    if args.json:
        print_json({"study": study.name, "runs": len(rows), "report": str(report), "rows": rows})
    else:
        print(report.read_text().split("![")[0].rstrip())
        print(f"\nwrote {report} and results.csv, plots beside it; runs in {out}")
    return 0
