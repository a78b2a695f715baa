"""The one training loop: ``fit(task, out)`` trains any task (recurvit.tasks) into a run directory.

What the loop owns, for every task alike:

- the run directory (:class:`~recurvit.run.rundir.RunDir`: created or resumed, locked for the
  life of the run, removed again if nothing was written): config.yaml before epoch 1, one
  metrics.jsonl line an epoch, ``last.pt`` every epoch and ``best.pt`` when the task's score
  improves, written atomically;
- the checkpoint schema: format, task, config (the config.yaml of the run, as plain types), model, epoch
  and the task's record; ``last.pt`` adds optimizer, schedule, RNG state (every rank's under DDP), the best
  score, training seconds and the epoch's metrics;
- resume: the config changes a resume makes are checked (:mod:`recurvit.train.resume`), model,
  optimizer, schedule and RNG are restored, metric lines past the checkpoint are dropped;
- processes: under torchrun every rank calls ``fit`` (the task's loaders shard by the
  :class:`~recurvit.run.distributed.DistEnv` it is given), rank 0 alone writes and logs;
- the batch loop (:mod:`recurvit.train.loop`: the task gives one step, the loop steps the optimizer,
  sums, reduces and checks the figures);
- TensorBoard (a copy of each metrics line), divergence, out-of-memory and full-disk messages, and
  ``stop_after=k``: end after epoch k as an interruption would (a later resume continues it).

The RNG is seeded from ``cfg.train.seed`` before the task builds anything, so a task's numbers
depend on its config only.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from ..errors import UserError
from ..run import checkpoint as ckpt_io, distributed as dist_io
from ..run.atomic import DiskFull, write_atomic
from ..run.device import pick_device, seed_everything
from ..run.progress import quiet
from ..run.rundir import RunDir, default_run_dir, open_run
from .checks import Diverged, how_to_go_on
from .loop import train_epoch
from .optim import follow_config
from .resume import check_resume
from .tensorboard import EpochWriter


def fit(task, out: Optional[Path] = None, resume: bool = False, log=print, stop_after: Optional[int] = None,
        force: bool = False) -> Dict[str, Any]:
    """Train ``task`` into run directory ``out`` (or continue it from last.pt); returns
    ``task.result(...)`` after the last epoch (the last metrics when stopped early). ``out`` None: a new
    ``runs/<data>-<model>-<time>`` (``task.run_dir`` says which, once fit has started).

    ``force`` starts even when a memory estimate says the run will not fit."""
    tc = task.cfg.train
    with dist_io.session(tc.device) as env:
        # rank 0's run directory for every rank (a default one carries a time stamp)
        out = Path(env.broadcast(str(out if out is not None else default_run_dir(task.cfg)) if env.is_main else None))
        task.run_dir = out
        log = log if env.is_main else quiet
        task.check()
        run = env.on_main(lambda: open_run(out, resume, log=log)) or RunDir(out, created=False, owner=False)
        try:
            with run, EpochWriter(run.path, tc.tensorboard and env.is_main) as tb:
                resume = env.broadcast(run.has_checkpoint()) if resume else False
                try:
                    return _fit(task, run, resume, log, stop_after, env, tb, force)
                except (torch.OutOfMemoryError, MemoryError) as e:
                    raise task.out_of_memory(e) from None
                except RuntimeError as e:
                    if "allocate" not in str(e):
                        raise
                    raise task.out_of_memory(e) from None
        except Diverged as e:  # the directory is closed now (removed if it held nothing): advise what is true of it
            raise how_to_go_on(e, run.path) from None
        except DiskFull as e:  # a checkpoint or metrics write found the disk full: the run can go on from it
            if not run.path.is_dir():
                raise
            raise e.then(f"--resume {run.path}") from None


def check_task(state: Dict[str, Any], task, out: Path) -> None:
    """A resume continues a run of the same task (a checkpoint that names none is refused by ``task_of``)."""
    found = ckpt_io.task_of(state)
    if found != task.name:
        raise UserError(f"cannot resume {out}: it is a {found} run, not a {task.name} run "
                        f"(resume it with the command that trained it)")


def _fit(task, run: RunDir, resume: bool, log, stop_after: Optional[int], env: dist_io.DistEnv,
         tb: Optional[EpochWriter], force: bool) -> Dict[str, Any]:
    out, tc = run.path, task.cfg.train
    state = run.load_last() if resume else None  # every rank resumes from it
    if state is not None:
        check_task(state, task, out)
        log(check_resume(str(out), state["epoch"], task.config_changes(state)))
    seed_everything(tc.seed)
    device = dist_io.rank_device(env, pick_device(tc.device))
    task.setup(env, device, log, force)

    start_epoch, best, elapsed, cpu = 0, -1.0, 0.0, 0.0
    if state is not None:
        ckpt_io.load_state(task.model, state["model"], out / "last.pt")
        task.opt.load_state_dict(state["optimizer"])
        task.sched.load_state_dict(state["scheduler"])
        follow_config(task.opt, task.sched, tc, task.steps_per_epoch)
        start_epoch = state["epoch"]
        best = state["best_score"]
        elapsed, cpu = state.get("train_seconds", 0.0), state.get("train_cpu_seconds", 0.0)
        _restore_rng(state, env, tc.seed)
        task.restore(state, env)
        run.truncate_metrics(start_epoch)
    elif env.enabled and env.rank > 0:
        torch.manual_seed(dist_io.rank_seed(tc.seed, env.rank))  # own dropout / augmentation draws
    task.prepare_training(env, device, log, force)
    config = task.config_dict()  # the config every checkpoint holds: config.yaml's, as plain types
    run.write_config(task.config_yaml())  # what the run actually uses, overrides of a resume included
    if run.owner:
        for name, text in task.run_files().items():  # what else the task keeps from the start (a recipe)
            write_atomic(out / name, text)
    log(task.header(env, device))

    metrics: Dict[str, Any] = (state or {}).get("metrics") or {}
    for epoch in range(start_epoch, tc.epochs):
        task.start_epoch(epoch)
        c0 = time.process_time()
        m = train_epoch(task, epoch, env, log)
        cpu += time.process_time() - c0  # this process's CPU time: robust to other jobs on a shared machine
        elapsed += m["seconds"]
        metrics = {"epoch": epoch + 1, **m}
        last = epoch + 1 == tc.epochs
        if last or (epoch + 1) % tc.eval_every == 0:
            metrics.update(task.evaluate(env))
        metrics.update(train_seconds=elapsed, train_cpu_seconds=cpu)
        score, line = task.score(metrics, last), task.epoch_line(metrics)  # the line is logged once saved
        rng = ckpt_io.rng_state()
        extra = {"rng_ranks": env.gather(rng), "world_size": env.world_size} if env.enabled else {}
        extra.update(task.extra_state(env))  # a collective under DDP: every rank takes part, rank 0 writes
        improved = score is not None and score > best
        best = score if improved else best
        run.append_metrics(metrics)
        if tb is not None:
            tb.add_epoch(metrics)  # TensorBoard (train.tensorboard=true, rank 0): a copy of the metrics line
        record = {"format": ckpt_io.FORMAT, "task": task.name, "config": config, "model": task.model.state_dict(),
                  "epoch": epoch + 1, **task.record()}  # what every checkpoint holds
        if improved:
            for name, obj in task.best_files(record, metrics).items():
                run.save(name, obj)
        run.save("last.pt", {**record, "optimizer": task.opt.state_dict(), "scheduler": task.sched.state_dict(),
                             "best_score": best, "train_seconds": elapsed, "train_cpu_seconds": cpu, "rng": rng,
                             "metrics": metrics, **extra})
        keep = getattr(tc, "keep_every", 0)
        if keep and (epoch + 1) % keep == 0:  # the model as it was at this epoch, kept for a budget curve
            run.save(f"epoch_{epoch + 1:04d}.pt", {**record, "metrics": metrics})
        if line:
            log(line)
        if stop_after is not None and epoch + 1 >= stop_after and not last:
            log(f"stopped after epoch {epoch + 1}; continue with --resume {out}")
            env.barrier()  # last.pt is on disk before any rank returns
            return metrics
    env.barrier()
    return task.result(metrics, run)


def _restore_rng(state: dict, env: dist_io.DistEnv, seed: int) -> None:
    """The RNG state of this rank at the checkpoint (each rank's own when the world size is unchanged)."""
    ranks = state.get("rng_ranks")
    if env.enabled and ranks is not None and len(ranks) == env.world_size:
        ckpt_io.set_rng_state(ranks[env.rank])
    else:
        ckpt_io.set_rng_state(state.get("rng"))
        if env.enabled and env.rank > 0:  # a new world size: fresh, distinct streams
            torch.manual_seed(dist_io.rank_seed(seed + state["epoch"], env.rank))
