"""recurvit study STUDY.yaml [--workers N] [--out DIR] [--only PATTERN ...] [--report-only] [--join] [--json]
                           [--launcher submitit [--cluster slurm|local] [--partition P] [--gpus-per-run N]
                            [--cpus-per-run C] [--timeout-min M] [--mem-gb G] [--slurm-dir DIR] ...]

``--launcher local`` (default): runs in worker processes on this machine. ``--launcher submitit``:
each pending run as a Slurm job through submitit (see recurvit/study/launch.py). ``--join``: more workers
for a study already running here or on a machine sharing the disk (each run is claimed by one worker)."""
from __future__ import annotations

import shlex
import sys
from contextlib import contextmanager
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
    p.add_argument("--only", nargs="+", default=(), metavar="PATTERN",
                   help="run only the runs whose id matches a pattern (shell-style: 'rk4__*' 'euler__seed=0'); "
                        "the report covers every finished run and names the ones not run yet")
    p.add_argument("--join", action="store_true",
                   help="work beside a `recurvit study` already running on the same study folder (another terminal, "
                        "or a machine sharing the disk): train the runs no worker holds; the last worker to end "
                        "writes the report (with no other worker, the same as without --join)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of the report")
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
    return p


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
    from ..study import load_study, run_dir_root
    workers = 1 if args.workers is None else args.workers
    if workers < 1:
        raise UserError(f"--workers must be >= 1, got {workers}")
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
    study = load_study(args.study)
    out = args.out or run_dir_root(study)
    if args.out is not None:  # --out moves everything the study writes, its results folder too
        study.results = Path(args.out) / "results"
    with study_lock(Path(out), args.report_only, join=args.join) as writer:
        return _run(args, study, Path(out), workers, opts if args.launcher == "submitit" else None, writer)


def _run(args, study, out, workers, opts, writer: bool = True) -> int:
    from ..study import collect, run_study
    from ..study.archive import archive, archived

    from ..run.outputs import output_dir

    log = (lambda *a, **k: None) if args.json else print
    if args.report_only and args.only:
        raise UserError("--only picks runs to train; --report-only trains none")
    output_dir(study.results or out, "results folder")  # a file or a read-only place there: one line now, not
    if not args.report_only:  # after hours of runs
        output_dir(out / "runs", "runs folder")
    from_table, saved = False, (study.results or out) / "results.csv"
    if args.report_only:
        rows = collect(out, study)
        for r in rows:  # a result the results folder does not keep yet (a run of an older runner)
            copy = archived(study, r.get("run_id", ""))
            if copy is not None and not copy.is_file() and "error" not in r:
                archive(study, r)
        if not rows and saved.is_file():  # the runs are gone (another machine): rebuild from the table
            from ..study.report import rows_from_csv

            rows = rows_from_csv(saved, study)  # (a table's rows are not results: nothing is archived from them)
            from_table = True
        if not rows:
            raise UserError(f"no finished runs in {out} and {'no rows in' if saved.is_file() else 'no'} {saved}; "
                            "run the study first")
    elif args.launcher == "submitit":
        from ..study.launch import run_study_submitit

        rows = run_study_submitit(study, out, opts, progress=not args.json, log=log, only=args.only)
    else:
        rows = run_study(study, out, workers=workers, progress=not args.json, log=log, only=args.only)
    if not writer:  # joined a running study: the report is the last worker's
        with study_lock(out, join=True) as writer:
            if writer:  # the others have ended (rows holds what they finished: runner.finished_elsewhere)
                return _report(args, study, out, rows, from_table, saved)
        failed = [r for r in rows if "error" in r]
        if args.json:
            print_json({"study": study.name, "runs": len(rows), "failed": len(failed), "report": None, "rows": rows})
        print(f"recurvit study: this worker ended ({len(rows) - len(failed)} runs finished, {len(failed)} failed); "
              "the worker still running writes the report when it ends", file=sys.stderr)
        return 1 if failed else 0
    return _report(args, study, out, rows, from_table, saved)


def _report(args, study, out, rows, from_table, saved) -> int:
    from ..study import write_report

    command = "recurvit study " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["study"] else ""
    if args.report_only:  # the command that made the runs (the report's own), not the one that re-read them
        from ..study.report import report_command

        command = (report_command((study.results or out) / "report.md")
                   or (command and f"recurvit study {shlex.quote(str(args.study))}    # this report: --report-only"))
    try:
        report = write_report(rows, study, study.results or out, command=command)
    except (KeyError, TypeError) as e:  # rows rebuilt from a hand-edited or foreign results.csv
        if not from_table:
            raise
        raise UserError(f"{saved} lacks what the report needs ({type(e).__name__}: {e}); run the study again "
                        "to rebuild it") from None
    failed = [r for r in rows if "error" in r]
    if args.json:
        print_json({"study": study.name, "runs": len(rows), "failed": len(failed), "report": str(report),
                    "rows": rows})
    else:
        print(report.read_text().split("![")[0].rstrip())
        print(f"\nwrote {report} and results.csv, plots beside it; runs in {out}")
    if failed:
        print(f"recurvit study: {len(failed)} of {len(rows)} runs failed; their errors are in the report's "
              f"'Failed runs' and in {out / 'runs'}/<run>/error.txt", file=sys.stderr)
        return 1
    return 0


@contextmanager
def study_lock(out: Path, reading: bool = False, join: bool = False):
    """One writer for a study folder's report: a second `recurvit study` on the same folder is refused at
    once, unless it ``join``s (then this yields False: it trains beside the writer, each run under its claim,
    :func:`recurvit.study.runner.run_one_safe`; True: this process is the writer). The lock is a run
    directory's (recurvit.run.lock), on STUDY/.study.lock."""
    from ..run import lock
    from ..run.outputs import output_dir

    output_dir(out)
    try:
        fd = lock.acquire(out / ".study.lock")
    except lock.Busy as e:
        if join:
            yield False
            return
        raise UserError(f"another `recurvit study` is writing {out} (pid {e.pid}); wait for it to end"
                        + ("" if reading else " (or give this one another --out)")) from None
    except OSError as e:  # (a full disk is DiskFull, one line already)
        raise UserError(f"cannot write in {out}: {e.strerror or e}; choose a writable --out") from None
    try:
        yield True
    finally:
        lock.release(fd)
