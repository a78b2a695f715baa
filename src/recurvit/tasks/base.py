"""What a training mode must say for the one loop (:func:`recurvit.train.fit.fit`) to train it.

A task is one folder in ``tasks/`` (its task, evaluators and study view) plus one entry in
:data:`recurvit.task_table.TASKS` (and one in ``VIEWS`` for its study view, a
:class:`recurvit.study.registry.View`); a task defined elsewhere is one call, :func:`recurvit.task_table.add`.
It defines ``name``, ``reader``, ``setup`` and ``train_step``; everything else has a default here:

- ``name``: the checkpoint's ``task`` key (a resume of another task's run is refused).
- ``reader``: how its checkpoints become a model again (:class:`recurvit.run.checkpoint.Reader`), which
  :func:`recurvit.run.load.load` finds through the task table.
- (optional) the data it trains: an entry of :data:`recurvit.task_table.DATA_TASKS` (or ``data=`` of
  ``task_table.add``) makes ``recurvit train`` pick it for that data (the mazes: the dense task).
- ``cfg``: its typed run config (a dataclass; ``cfg.train`` has at least seed, epochs, eval_every, device,
  tensorboard); ``config_dict()`` / ``config_yaml()`` give the plain and written forms.
- ``check()``: config values that make no sense, one line each (before any directory exists);
  ``run_files()``: what the run directory holds from the start besides config.yaml.
- ``setup(env, device, log, force)``: data, model, optimizer and schedule (``self.model``,
  ``self.opt``, ``self.sched``, ``self.steps_per_epoch``), after the loop seeded the RNG.
- ``restore(state, env)``: the task's own state from ``last.pt`` (model / optimizer / schedule are
  restored by the loop); ``extra_state(env)``: what the task adds to ``last.pt``.
- ``prepare_training(env, device, log, force)``: what wraps the model once its weights are final
  (compilation, activation checkpointing, DDP, memory checks); ``header(env, device)``: one line.
- ``start_epoch(epoch)``: a loader with a generator of its own is reseeded here from seed and epoch
  (``recurvit.run.loaders.set_epoch``), so a resumed run shuffles as an uninterrupted one;
  ``train_step(batch, amp)``: one batch's loss and figures (:class:`recurvit.train.loop.Step`; ``amp()`` is
  the autocast context to run the forward under), which the loop's batch loop
  (:func:`recurvit.train.loop.train_epoch`) steps, sums, reduces and checks;
  ``epoch_metrics(totals, seconds)``: the metrics of one pass from its sums; ``progress(totals)``: the
  figures the progress bar and ``train.log_every`` lines show; ``batch_guard(epoch)``: a callable the loop
  calls after each of the first two batches (a time guard), or None.
- ``evaluate(env)`` (the figures of an evaluation epoch), ``epoch_line(metrics)``.
- ``score(metrics, last)``: the figure best.pt is judged by (higher is better; None: no best.pt
  this epoch; a task without a validation split returns None and writes no best.pt, so nothing
  is ever chosen on the test split), ``best_files(record, metrics)``: the files a new best writes.
- ``record()``: what every checkpoint of the task carries beyond model and config;
  ``result(metrics, run)``: what ``fit`` returns once the last epoch is done.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

import torch

from .. import task_table
from ..config import as_dict, to_yaml
from ..errors import UserError
from ..train.resume import config_changes


def data_task(data_name: str, default: type) -> type:
    """The task that trains data set ``data_name`` (:data:`recurvit.task_table.DATA_TASKS`), else ``default``."""
    name = task_table.data_task(data_name)
    return default if name is None else task_table.task_class(name)


class Task:
    """Base of the tasks: the defaults a simple task keeps (see the module docstring)."""

    name = "task"
    reader = None  # a run.checkpoint.Reader: what load(path) builds from this task's checkpoints

    def __init__(self, cfg):
        self.cfg = cfg
        self.model = self.opt = self.sched = None
        self.steps_per_epoch = 0

    # ---------------------------------------------------------------- config
    def config_dict(self) -> Dict[str, Any]:
        """The config as plain types (what a checkpoint stores)."""
        return as_dict(self.cfg)

    def config_yaml(self) -> str:
        """The config as config.yaml holds it."""
        return to_yaml(self.cfg)

    def config_changes(self, state: Dict[str, Any]) -> list:
        """The keys whose values differ between the checkpoint's config and this task's."""
        new = self.config_dict()
        return config_changes(self.checkpoint_config(state), new)

    def checkpoint_config(self, state: Dict[str, Any]) -> Dict[str, Any]:
        return state["config"]

    def check(self) -> None:
        return None

    def run_files(self) -> Dict[str, str]:
        """Files (name -> text) written into the run directory with config.yaml, before epoch 1."""
        return {}

    def out_of_memory(self, e: BaseException) -> Exception:
        return UserError(f"out of memory ({str(e).splitlines()[0][:100]}) with train.batch_size="
                         f"{self.cfg.train.batch_size}; make it or the model smaller")

    # ---------------------------------------------------------------- building
    def setup(self, env, device: torch.device, log, force: bool = False) -> None:
        raise NotImplementedError

    def restore(self, state: Dict[str, Any], env) -> None:
        return None

    def extra_state(self, env) -> Dict[str, Any]:
        return {}

    def prepare_training(self, env, device: torch.device, log, force: bool = False) -> None:
        return None

    def header(self, env, device: torch.device) -> str:
        return f"{self.name} on device {device}"

    # ---------------------------------------------------------------- each epoch
    def start_epoch(self, epoch: int) -> None:
        return None

    def train_step(self, batch, amp):
        """One batch: a :class:`recurvit.train.loop.Step` (the loss to minimise, the batch's figures)."""
        raise NotImplementedError

    def epoch_metrics(self, totals, seconds: float) -> Dict[str, Any]:
        return {"lr": self.sched.get_last_lr()[0], "train_loss": totals.mean("loss"),
                "img_per_s": totals.n / seconds, "seconds": seconds}

    def progress(self, totals) -> Dict[str, str]:
        return {"loss": f"{totals.mean('loss'):.4f}"}

    def batch_guard(self, epoch: int):
        return None

    def evaluate(self, env) -> Dict[str, Any]:
        return {}

    def epoch_line(self, metrics: Dict[str, Any]) -> Optional[str]:
        return None

    def score(self, metrics: Dict[str, Any], last: bool) -> Optional[float]:
        return None

    def best_files(self, record: Dict[str, Any], metrics: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
        return {"best.pt": record}

    def record(self) -> Dict[str, Any]:
        return {}

    def result(self, metrics: Dict[str, Any], run_dir: Path) -> Dict[str, Any]:
        return metrics
