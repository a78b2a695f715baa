"""Study runs in worker processes: each run in a process of its own, a worker that dies fails its own run
only, and a worker ends when the study process that started it is gone."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ..errors import UserError
from ..run import distributed as dist_io
from ..run.rundir import RunDir


def estimate(done: List[Dict[str, Any]], todo: List[Dict[str, Any]], workers: int) -> str:
    """'; about 2.1 h more at the mean of the finished runs of each cell' (nothing when no run has finished).

    A run's cost is its own training and evaluation seconds (its ``wall_seconds`` only covers the last
    pass, a few seconds for a run copied in and evaluated here). A run to do (a keyword set of
    :func:`recurvit.study.runner.pending`) is estimated from the finished runs of its own cell (its
    grid labels but the seed), else from all finished runs: a wider cell costs more than a narrow one."""
    def cost(r: Dict[str, Any]) -> float:
        return (r.get("train_seconds") or 0.0) + (r.get("eval_seconds") or 0.0) or r.get("wall_seconds") or 0.0

    def cell(labels: Dict[str, Any]) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in labels.items() if not k.endswith("seed")))

    axes = {k for kw in todo for k in kw["labels"]}
    spent: Dict[tuple, List[float]] = {}
    for r in done:
        if "error" not in r and cost(r):
            spent.setdefault(cell({k: r.get(k) for k in axes}), []).append(cost(r))
    every = [s for ss in spent.values() for s in ss]
    if not todo or not every:
        return ""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    total = sum(mean(spent.get(cell(kw["labels"]), every)) for kw in todo)
    unseen = sum(cell(kw["labels"]) not in spent for kw in todo)
    note = f" ({unseen} in cells with none finished, at the mean of all)" if unseen else ""
    return f"; about {total / workers / 3600:.1f} h more at the mean of the finished runs of each cell{note}"


def in_processes(run: Callable[[Dict[str, Any]], Dict[str, Any]], todo: List[Dict[str, Any]], workers: int,
                 threads: int):
    """``run(kw)`` for each run of ``todo`` in a process of its own, ``workers`` at a time; yields results as
    they finish (``run`` is a module-level function, so that a spawned process can import it).

    A process of its own per run (not a shared pool): a worker killed from outside (OOM killer,
    ``kill``) fails its own run only ("worker process died"), and the study carries on with the others."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    queue, running = list(todo), {}
    ctx = mp.get_context("spawn")
    try:
        while queue or running:
            while queue and len(running) < workers:
                kw = queue.pop(0)
                ex = ProcessPoolExecutor(1, mp_context=ctx, initializer=stop_with_parent, initargs=(os.getpid(),))
                running[ex.submit(run, {**kw, "threads": threads})] = (ex, kw)
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in finished:
                ex, kw = running.pop(fut)
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    msg = "its worker process died (killed from outside?); run the study again to resume it"
                    res = {"run_id": Path(kw["out"]).name, **kw["labels"], "error": msg}
                ex.shutdown(wait=False)
                yield res
    except BaseException:  # Ctrl-C or a signal to the study process alone: its workers stop too, at once
        interrupt_workers([ex for ex, _ in running.values()])
        raise
    finally:
        for ex, _ in running.values():
            ex.shutdown(wait=False, cancel_futures=True)


def interrupt_workers(executors) -> None:
    """SIGINT to the worker process of each executor: its run stops as on Ctrl-C (last.pt stays the last
    whole epoch's; the study resumes it). A terminal's Ctrl-C reaches the workers by itself; a signal sent
    to the study process alone (``kill -INT PID``, a scheduler) left it waiting for every running run to
    finish, hours later."""
    import signal

    for ex in executors:
        for proc in list((getattr(ex, "_processes", None) or {}).values()):
            try:
                os.kill(proc.pid, signal.SIGINT)
            except OSError:
                pass


def stop_with_parent(parent: int, every_s: float = 1.0) -> None:
    """In a worker process: end it when the study process that started it is gone.

    A killed study (``kill``, ``kill -9``, an OOM kill) would otherwise leave its workers training on as
    orphans, each holding its run directory's lock, so the study started again finds those runs
    "in use". A stopped worker's run resumes from its last checkpoint when the study is run again.
    """
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


def run_config(load: Callable, out: Path, base: str, overrides: List[str]):
    """A run's config: its own config.yaml once it exists (resolved values), else the study's."""
    return load(out / "config.yaml" if (out / "config.yaml").is_file() else base, overrides)


def train_in_processes(command: List[str], base: str, overrides: List[str], out: Path, nproc: int,
                       threads: Optional[int]) -> Dict[str, Any]:
    """Train (or resume) ``out`` with ``recurvit <command>`` in ``nproc`` processes under torchrun (DDP,
    one GPU each when the run is on CUDA); returns the last metrics line. The ranks' output goes to
    this process's (the job's log)."""
    import subprocess

    resume = (out / "config.yaml").is_file()  # else: a new run (or one killed before it wrote anything)
    args = [*command, *([] if resume else [str(base)]), *overrides, "train.progress=false",
            *(["--resume", str(out)] if resume else ["--out", str(out)])]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (threads or nproc) // nproc))}
    proc = subprocess.Popen(dist_io.torchrun_command(nproc, args), env=env)
    try:
        rc = proc.wait()
    except BaseException:  # preempted (submitit's handler exits this process): stop the ranks first
        proc.terminate()  # torchrun passes it on to its workers; last.pt stays the last whole epoch's
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if rc != 0:
        raise UserError(f"recurvit {' '.join(command)} in {nproc} processes (torchrun) ended with exit status {rc}; "
                        "its own message is above in this run's log")
    rows = RunDir(out, created=False, owner=False).read_metrics()
    return rows[-1] if rows else {}
