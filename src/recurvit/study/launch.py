"""Studies on a cluster: every pending run of a grid as a submitit job (Slurm).

    recurvit study STUDY.yaml --launcher submitit --partition gpu --gpus-per-run 1 --timeout-min 240

The same study directory, run directories, resumption and report as the local runner
(:func:`recurvit.study.runner.run_study`): the finished runs are skipped, each other run becomes one
job (a Slurm job array, submitted at once) that calls :func:`~recurvit.study.runner.run_one_safe` on
a compute node, and this process waits for the jobs (polling every ``--poll`` seconds, with a
progress bar), collects their results and writes the report.

- **Preemption and time limits.** A job is a :class:`StudyJob`, a callable with submitit's
  checkpointing hook: when Slurm preempts it or its time runs out (submitit asks Slurm for USR2
  ``signal_delay_s`` before the limit), ``checkpoint()`` hands submitit the same job again and
  submitit requeues it. Nothing needs saving at that moment: the requeued job calls ``run_one`` on the
  same run directory, which resumes it from its ``last.pt`` (the last whole epoch; training saves it
  after every epoch, atomically). Time-outs requeue at most ``--max-timeouts`` times, preemptions
  always.
- **Failures.** A run that fails with a user error (diverged, bad option) is reported in the study
  as in a local study; a job that fails otherwise (an exception, killed, out of memory, timed out too
  often) is reported as a failed run naming its job id, its last error line and its log, and its
  ``error.txt`` is written. Running the command again resumes what is unfinished.
- **Interrupting the waiting command** (Ctrl-C, a closed login session) leaves the jobs running. The
  ids of submitted jobs are kept in ``SLURM_DIR/jobs.json``; running the same command again
  re-attaches to those still queued or running instead of submitting the runs twice.
- **Several GPUs per run.** ``--gpus-per-run N`` (N > 1) asks for N GPUs in one job (one task) and
  trains the run data-parallel in N processes through torchrun, exactly as ``recurvit train --nproc
  N`` does (``train.batch_size`` stays the global batch); the job then evaluates it on one GPU. A
  preempted multi-GPU job stops its torchrun ranks and resumes as above. This path is tested with
  processes on CPU (gloo), not on a multi-GPU node. LoopVAE runs use one GPU.
- ``--cluster local`` runs the same jobs as local processes through submitit's LocalExecutor (no
  Slurm needed): how the tests exercise submission, requeueing and collection.

Job logs and submitit's pickles are in ``--slurm-dir`` (default ``<study dir>/slurm``).
"""
from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..errors import UserError
from ..run.atomic import write_atomic
from ..run.progress import show_progress
from .runner import finished_elsewhere, pending, run_one_safe, take
from .spec import Study

CLUSTERS = ("slurm", "local")
JOBS_FILE = "jobs.json"


@dataclass
class ClusterOptions:
    """How the jobs of a study are asked for (``recurvit study --launcher submitit`` flags)."""

    cluster: str = "slurm"  # slurm | local (submitit's LocalExecutor: jobs as local processes)
    partition: Optional[str] = None
    gpus_per_run: Optional[int] = None  # default: 1 on Slurm, 0 locally
    cpus_per_run: int = 4
    timeout_min: int = 240
    mem_gb: Optional[float] = None  # None: the partition's default
    slurm_dir: Optional[Path] = None  # default: <study dir>/slurm
    max_timeouts: int = 3  # requeues after hitting the time limit (preemptions requeue regardless)
    poll_s: float = 30.0
    slurm_args: Dict[str, str] = field(default_factory=dict)  # more sbatch options (account=..., qos=...)

    @property
    def gpus(self) -> int:
        if self.gpus_per_run is not None:
            return self.gpus_per_run
        return 1 if self.cluster == "slurm" else 0

    def check(self) -> None:
        if self.cluster not in CLUSTERS:
            raise UserError(f"--cluster must be one of {', '.join(CLUSTERS)}, got '{self.cluster}'")
        for name, value, low in (("--gpus-per-run", self.gpus, 0), ("--cpus-per-run", self.cpus_per_run, 1),
                                 ("--timeout-min", self.timeout_min, 1), ("--max-timeouts", self.max_timeouts, 0)):
            if value < low:
                raise UserError(f"{name} must be >= {low}, got {value}")
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise UserError(f"--mem-gb must be > 0, got {self.mem_gb}")
        if not self.poll_s > 0:
            raise UserError(f"--poll must be > 0 seconds, got {self.poll_s}")


class StudyJob:
    """One grid point as a submitit job: ``job()`` trains / resumes / evaluates it (``run_one_safe``).

    ``checkpoint()`` is submitit's hook, called in the job when it is preempted or times out: the
    same job is requeued, and resumes its run directory from ``last.pt``."""

    def __init__(self, kw: Dict[str, Any]):
        self.kw = kw

    def __call__(self) -> Dict[str, Any]:
        return run_one_safe(self.kw)

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit

        out = Path(self.kw["out"])
        print(f"recurvit: run {out.name} interrupted (preempted or out of time); requeued, it resumes from "
              f"{out / 'last.pt'}", flush=True)
        return submitit.helpers.DelayedSubmission(StudyJob(self.kw))


def _submitit():
    try:
        import submitit
    except ImportError:
        raise UserError('--launcher submitit needs the submitit package: pip install -e ".[cluster]" '
                        "(or pip install submitit)") from None
    return submitit


def make_executor(opts: ClusterOptions, folder: Path, name: str):
    """submitit's executor for ``opts`` (Slurm, or local processes)."""
    submitit = _submitit()
    if opts.cluster == "slurm" and shutil.which("sbatch") is None:
        raise UserError("--launcher submitit: Slurm's sbatch is not found here; run the command on the cluster's "
                        "login node, or add --cluster local to run the jobs as local processes")
    folder.mkdir(parents=True, exist_ok=True)
    ex = submitit.AutoExecutor(folder=folder, cluster=opts.cluster, slurm_max_num_timeout=opts.max_timeouts,
                               local_max_num_timeout=opts.max_timeouts)
    params: Dict[str, Any] = dict(name=name, timeout_min=opts.timeout_min, cpus_per_task=opts.cpus_per_run,
                                  gpus_per_node=opts.gpus, tasks_per_node=1, nodes=1, mem_gb=opts.mem_gb)
    if opts.cluster == "slurm":
        params.update(slurm_partition=opts.partition, slurm_additional_parameters=dict(opts.slurm_args) or None)
    try:
        ex.update_parameters(**params)
    except (ValueError, NameError, AssertionError) as e:
        raise UserError(f"submitit rejected the job settings: {str(e).splitlines()[0]}") from None
    return ex


def run_study_submitit(study: Study, out: Path, opts: ClusterOptions, progress: bool = True,
                       log=print, only: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Submit the pending runs of ``study`` as jobs, wait for them, return every run's row (as
    :func:`~recurvit.study.runner.run_study` does)."""
    from tqdm.auto import tqdm

    opts.check()
    out = Path(out).resolve()
    folder = Path(opts.slurm_dir).resolve() if opts.slurm_dir else out / "slurm"
    ex = make_executor(opts, folder, f"recurvit-{study.name}")  # (its checks come before any directory is made)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    done, todo = pending(study, out, only)
    for kw in todo:  # what the job needs: absolute paths (a node may start elsewhere), its share of the node
        kw.update(base=str(Path(kw["base"]).resolve()), out=str(Path(kw["out"]).resolve()),
                  threads=opts.cpus_per_run, nproc=max(1, opts.gpus))
    jobs = _attach(folder, opts.cluster, todo)
    new = [kw for kw in todo if kw["out"] not in jobs]
    log(f"study {study.name}: {len(study.runs)} runs, {len(done)} finished, {len(todo)} to run or evaluate as "
        f"submitit jobs on {opts.cluster} ({len(todo) - len(new)} still queued or running from before) in {out}; "
        f"job logs in {folder}")
    if new:
        with ex.batch():  # one Slurm job array
            submitted = [(kw, ex.submit(StudyJob(kw))) for kw in new]
        for kw, job in submitted:
            jobs[kw["out"]] = job
        _record(folder, {Path(kw["out"]).name: job.job_id for kw, job in submitted})
    by_out = {kw["out"]: kw for kw in todo}
    bar = tqdm(total=len(study.runs), initial=len(done), desc=study.name, disable=not show_progress(progress),
               dynamic_ncols=True)
    waiting, held = dict(jobs), []
    try:
        while waiting:
            for key, job in list(waiting.items()):
                if job.done():
                    take(study, _row(job, by_out[key]), done, held, log)
                    del waiting[key]
                    bar.update()
            if waiting:
                bar.set_postfix_str(_states(waiting.values()))
                time.sleep(opts.poll_s)
    except KeyboardInterrupt:
        bar.close()
        log(f"stopped waiting: {len(waiting)} job(s) still queued or running "
            f"({', '.join(str(j.job_id) for j in waiting.values())}); run the same command again to collect them")
        raise
    bar.close()
    done += finished_elsewhere(study, out, held, log)
    order = {s.run_id: i for i, s in enumerate(study.runs)}
    return sorted(done, key=lambda r: order.get(r["run_id"], 1 << 30))


def _row(job, kw: Dict[str, Any]) -> Dict[str, Any]:
    """A finished job's row: run_one_safe's, or a failed run naming the job, its error and its log."""
    submitit = _submitit()
    out = Path(kw["out"])
    try:
        return job.result()
    except Exception as e:  # submitit's FailedJobError (an exception in the job), UncompletedJobError (killed)
        utils = submitit.core.utils
        killed = isinstance(e, utils.UncompletedJobError) and not isinstance(e, utils.FailedJobError)
        kind = "was killed or timed out too often" if killed else "failed"
        error = f"job {job.job_id} {kind}: {_last_error(str(e))} (log: {job.paths.stderr})"
    if out.is_dir():
        (out / "error.txt").write_text(error + "\n")
    return {"run_id": out.name, **kw["labels"], "error": error}


def _last_error(message: str) -> str:
    """The exception line of a job's traceback (else the message's first line)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?", ln)]
    return (errors[-1] if errors else lines[0] if lines else "no message")[:300]


def _states(jobs) -> str:
    counts: Dict[str, int] = {}
    for job in jobs:
        state = str(job.state).split()[0].lower()
        counts[state] = counts.get(state, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _record(folder: Path, ids: Dict[str, str]) -> None:
    f = folder / JOBS_FILE
    known = json.loads(f.read_text()) if f.is_file() else {}
    write_atomic(f, json.dumps({**known, **ids}, indent=1))


def _attach(folder: Path, cluster: str, todo: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Jobs submitted by an earlier command for runs still to do that are queued or running
    (out -> job). Local jobs cannot be re-attached from another process: they are submitted again
    (a run a leftover local job still holds then fails on its run directory's lock)."""
    f = folder / JOBS_FILE
    if cluster != "slurm" or not f.is_file():
        return {}
    import submitit

    ids = json.loads(f.read_text())
    found = {}
    for kw in todo:
        job_id = ids.get(Path(kw["out"]).name)
        if job_id is None:
            continue
        job = submitit.SlurmJob(folder=folder, job_id=job_id)
        if not job.done():
            found[kw["out"]] = job
    return found
