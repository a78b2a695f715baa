"""One study run from its file to its report, as ``recurvit study`` runs it: the study folder locked for one
writer (:func:`study_lock`; workers that join train beside it), the pending runs trained here
(:func:`~recurvit.study.runner.run_study`) or as cluster jobs (:func:`~recurvit.study.launch.run_study_submitit`),
or, for a report only, the finished runs read back (from the results table when the runs are gone), then
results.csv, report.md and the plots written by the writer (:func:`~recurvit.study.report.write_report`)."""
from __future__ import annotations

import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import UserError
from ..run import lock
from ..run.atomic import DiskFull
from ..run.outputs import output_dir
from .archive import archive, archived
from .report import report_command, rows_from_csv, write_report
from .runner import collect, run_study
from .spec import Study, load_study, run_dir_root


@dataclass
class StudyOutcome:
    """How a study run ended: its rows, the folder of its runs, and the report it wrote (None: this worker
    joined a study that another worker, still running, reports)."""

    name: str
    rows: List[Dict[str, Any]]
    out: Path
    report: Optional[Path]

    @property
    def failed(self) -> int:
        """How many of the rows are failed runs."""
        return sum("error" in r for r in self.rows)


@contextmanager
def study_lock(out: Path, reading: bool = False, join: bool = False):
    """One writer for a study folder's report: a second `recurvit study` on the same folder is refused at
    once, unless it ``join``s (then this yields False: it trains beside the writer, each run under its claim,
    :func:`recurvit.study.runner.run_one_safe`; True: this process is the writer). The lock is a run
    directory's (recurvit.run.lock), on STUDY/.study.lock."""
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


def run_study_file(path: Path, out: Optional[Path] = None, *, report_only: bool = False, only: Sequence[str] = (),
                   join: bool = False, workers: int = 1, cluster=None, invocation: str = "", progress: bool = True,
                   log: Callable = print) -> StudyOutcome:
    """The study of file ``path`` run into ``out`` (default: its runs: entry; an ``out`` given moves its results
    folder there too): ``report_only`` trains nothing, ``only`` trains the runs matching those patterns, ``join``
    works beside a writer already running, ``cluster`` (ClusterOptions) submits the runs as jobs, else
    ``workers`` local processes. ``invocation``: the command line the report names."""
    study = load_study(path)
    root = Path(out or run_dir_root(study))
    if out is not None:  # out moves everything the study writes, its results folder too
        study.results = Path(out) / "results"
    with study_lock(root, report_only, join=join) as writer:
        rows, from_table = _rows(study, root, report_only, only, workers, cluster, progress, log)
        if not writer:  # joined a running study: the report is the last worker's
            with study_lock(root, join=True) as writer:
                if writer:  # the others have ended (rows holds what they finished: runner.finished_elsewhere)
                    return _report(study, root, rows, from_table, report_only, path, invocation)
            return StudyOutcome(study.name, rows, root, None)
        return _report(study, root, rows, from_table, report_only, path, invocation)


def _rows(study: Study, out: Path, report_only: bool, only: Sequence[str], workers: int, cluster, progress: bool,
          log: Callable) -> Tuple[List[Dict[str, Any]], bool]:
    """(the study's rows, whether they were rebuilt from its results table): trained, or read back."""
    if report_only and only:
        raise UserError("--only picks runs to train; --report-only trains none")
    output_dir(study.results or out, "results folder")  # a file or a read-only place there: one line now, not
    if not report_only:  # after hours of runs
        output_dir(out / "runs", "runs folder")
        if cluster is not None:
            from .launch import run_study_submitit

            return run_study_submitit(study, out, cluster, progress=progress, log=log, only=only), False
        return run_study(study, out, workers=workers, progress=progress, log=log, only=only), False
    saved = (study.results or out) / "results.csv"
    rows = collect(out, study)
    for r in rows:  # a result the results folder does not keep yet (a run of an older runner)
        copy = archived(study, r.get("run_id", ""))
        if copy is not None and not copy.is_file() and "error" not in r:
            archive(study, r)
    if rows:
        return rows, False
    if saved.is_file():  # the runs are gone (another machine): rebuild from the table
        rows = rows_from_csv(saved, study)  # (a table's rows are not results: nothing is archived from them)
    if not rows:
        raise UserError(f"no finished runs in {out} and {'no rows in' if saved.is_file() else 'no'} {saved}; "
                        "run the study first")
    return rows, True


def _report(study: Study, out: Path, rows: List[Dict[str, Any]], from_table: bool, report_only: bool, path: Path,
            invocation: str) -> StudyOutcome:
    """results.csv, report.md and the plots of ``rows``; a report rewritten from finished runs keeps naming the
    command that made them (its own), not the one that re-read them."""
    results = study.results or out
    command = invocation
    if report_only:
        command = (report_command(results / "report.md")
                   or (command and f"recurvit study {shlex.quote(str(path))}    # this report: --report-only"))
    try:
        report = write_report(rows, study, results, command=command)
    except (KeyError, TypeError) as e:  # rows rebuilt from a hand-edited or foreign results.csv
        if not from_table:
            raise
        raise UserError(f"{results / 'results.csv'} lacks what the report needs ({type(e).__name__}: {e}); run the "
                        "study again to rebuild it") from None
    except DiskFull as e:  # the runs that failed on the same full disk say more than the plot that failed last
        failed = [r["run_id"] for r in rows if "error" in r]
        if not failed:
            raise
        shown = ", ".join(failed[:4]) + (f" and {len(failed) - 4} more" if len(failed) > 4 else "")
        raise UserError(f"{len(failed)} of {len(rows)} runs failed ({shown}: their error.txt says why) and the "
                        f"report could not be written ({e.what}); free some space, then run the same command "
                        "(finished runs are kept)") from None
    return StudyOutcome(study.name, rows, out, report)


__all__ = ["StudyOutcome", "study_lock", "run_study_file"]
