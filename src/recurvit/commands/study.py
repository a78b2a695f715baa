"""recurvit study STUDY.yaml [--workers N] [--out DIR] [--only PATTERN ...] [--report-only] [--join] [--json]
                           [--launcher submitit [--cluster slurm|local] [--partition P] [--gpus-per-run N]
                            [--cpus-per-run C] [--timeout-min M] [--mem-gb G] [--slurm-dir DIR] ...]

``--launcher local`` (default): runs in worker processes on this machine. ``--launcher submitit``:
each pending run as a Slurm job through submitit (see recurvit/study/launch.py). ``--join``: more workers
for a study already running here or on a machine sharing the disk (each run is claimed by one worker)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ..errors import UserError
from . import print_json


def add_parser(sub):
    p = sub.add_parser("study", help="run a grid of runs and write results.csv, report.md and plots",
                       description="Expands a study file's grid (see recurvit/study/spec.py) into runs under one "
                                   "study directory, skips finished runs (an interrupted study resumes; a study that "
                                   "asks for more evaluation re-evaluates finished runs without training them), and "
                                   "writes results.csv, report.md (95% intervals over seeds) and plots.")
    p.add_argument("study", type=Path, help="study YAML (see studies/)")
    p.add_argument("--workers", type=int, default=None,
                   help="runs at a time, each in its own process with cores/N threads (default 1; --launcher local)")
    p.add_argument("--out", type=Path, help="study directory for the runs (default: the study's runs: entry, "
                                           "else runs/studies/<name>)")
    p.add_argument("--report-only", action="store_true", help="rewrite the report from finished runs, train nothing")
    p.add_argument("--only", nargs="+", action="extend", default=[], metavar="PATTERN",
                   help="run only the runs whose id matches a pattern (shell-style: 'rk4__*' 'euler__seed=0'; "
                        "--only given twice adds its patterns); the report covers every finished run and names "
                        "the ones not run yet")
    p.add_argument("--join", action="store_true",
                   help="work beside a `recurvit study` already running on the same study folder (another terminal, "
                        "or a machine sharing the disk): train the runs no worker holds; the last worker to end "
                        "writes the report (with no other worker, the same as without --join)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the report")
    _add_cluster_args(p)
    return p


def _add_cluster_args(p) -> None:
    c = p.add_argument_group("cluster (--launcher submitit)", "each pending run is one job; a preempted or timed-out "
                             "job is requeued and resumes from its last checkpoint; this command waits for the jobs "
                             "and writes the report")
    c.add_argument("--launcher", choices=("local", "submitit"), default="local",
                   help="local: worker processes here (default); submitit: Slurm jobs through submitit")
    c.add_argument("--cluster", choices=("slurm", "local"), default=None,
                   help="slurm (default) or local: the same jobs as local processes (submitit's LocalExecutor)")
    c.add_argument("--partition", help="Slurm partition")
    c.add_argument("--gpus-per-run", type=int, default=None, metavar="N",
                   help="GPUs per job (default 1 on Slurm, 0 locally); N > 1 trains the run in N processes "
                        "(torchrun/DDP, as recurvit train --nproc N)")
    c.add_argument("--cpus-per-run", type=int, default=None, metavar="C", help="CPU cores per job (default 4)")
    c.add_argument("--timeout-min", type=int, default=None, metavar="M",
                   help="time limit of a job in minutes (default 240); a run that needs longer is requeued")
    c.add_argument("--max-timeouts", type=int, default=None, metavar="K",
                   help="requeues of a job after its time limit (default 3; preemptions always requeue)")
    c.add_argument("--mem-gb", type=float, default=None, metavar="G", help="memory per job (default: the partition's)")
    c.add_argument("--slurm-dir", type=Path, default=None, metavar="DIR",
                   help="job logs and submitit files (default <study dir>/slurm)")
    c.add_argument("--slurm-arg", action="append", default=None, metavar="KEY=VALUE",
                   help="another sbatch option, e.g. account=myproj or qos=high (repeatable)")
    c.add_argument("--poll", type=float, default=None, metavar="S", help="seconds between job status checks (default 30)")


CLUSTER_FLAGS = ("cluster", "partition", "gpus_per_run", "cpus_per_run", "timeout_min", "max_timeouts", "mem_gb",
                 "slurm_dir", "slurm_arg", "poll")


def cluster_options(args):
    """The --launcher submitit flags as ClusterOptions (defaults where a flag is not given)."""
    from ..study.launch import ClusterOptions

    given = {k: getattr(args, k) for k in CLUSTER_FLAGS if getattr(args, k) is not None}
    extra = {}
    for item in given.pop("slurm_arg", []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--slurm-arg '{item}' is not of the form key=value (e.g. account=myproj)")
        extra[key.replace("-", "_")] = value
    if "poll" in given:
        given["poll_s"] = given.pop("poll")
    return ClusterOptions(**given, slurm_args=extra)


def run(args) -> int:
    from ..study.session import run_study_file

    workers = 1 if args.workers is None else args.workers
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
    opts = None
    if args.launcher == "submitit":
        if args.workers is not None:
            raise UserError("--workers is for --launcher local; with --launcher submitit every run is its own job")
        opts = cluster_options(args)
        opts.check()
    else:
        named = [f"--{k.replace('_', '-')}" for k in CLUSTER_FLAGS if getattr(args, k) is not None]
        if named:
            raise UserError(f"{', '.join(named)}: only with --launcher submitit")
    if args.join and (args.report_only or args.launcher == "submitit"):
        raise UserError("--join trains runs beside another local `recurvit study`; not with "
                        + ("--report-only" if args.report_only else "--launcher submitit"))
    argv = sys.argv[2:] if sys.argv[1:2] == ["study"] else None  # the command line the report names
    res = run_study_file(args.study, args.out, report_only=args.report_only, only=args.only, join=args.join,
                         workers=workers, cluster=opts, progress=not args.json,
                         invocation="" if argv is None else "recurvit study " + " ".join(shlex.quote(a) for a in argv),
                         log=(lambda *a, **k: None) if args.json else print)
    _show(res, args.json)
    return 1 if res.failed else 0


def _show(res, as_json: bool) -> None:
    """The rows as JSON or the report's text, and a line on stderr for failed runs or a joined worker's end."""
    if as_json:
        print_json({"study": res.name, "runs": len(res.rows), "failed": res.failed,
                    "report": None if res.report is None else str(res.report), "rows": res.rows})
    elif res.report is not None:
        print(res.report.read_text().split("![")[0].rstrip())
        print(f"\nwrote {res.report} and results.csv, plots beside it; runs in {res.out}")
    if res.report is None:  # joined another worker, who writes the report
        print(f"recurvit study: this worker ended ({len(res.rows) - res.failed} runs finished, {res.failed} failed); "
              "the worker still running writes the report when it ends", file=sys.stderr)
    elif res.failed:
        print(f"recurvit study: {res.failed} of {len(res.rows)} runs failed; their errors are in the report's "
              f"'Failed runs' and in {res.out / 'runs'}/<run>/error.txt", file=sys.stderr)


def __getattr__(name):
    """``study_lock``, which lives in :mod:`recurvit.study.session`, still found here (imported only when asked
    for: building the CLI's parser imports no study code)."""
    if name == "study_lock":
        from ..study.session import study_lock

        return study_lock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
