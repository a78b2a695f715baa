"""Training tasks: what the one loop (:func:`recurvit.train.fit.fit`) trains, one folder a task.

    from recurvit.tasks import train, finetune, finetune_resume, train_vae

- ``classify/``: classification (task), its study evaluators (evaluators), what a study asks of its runs
  (study), and fine-tuning, classification after a model-preparation step (finetune, finetune_study);
- ``dense/``: per-pixel targets (mazes): task, evaluators, plots, study;
- ``vae/``: the LoopVAE tokenizer: task, config, data, losses, metrics, evaluate, interventions, profile,
  evaluators, study.

A task is its folder plus one entry in :data:`recurvit.task_table.TASKS` (and one in ``VIEWS`` for its study
view): the floors below look tasks up there by name, so nothing needs this package imported first.
"""
from .. import task_table
from .base import Task
from .classify.finetune import FinetuneTask, finetune, finetune_resume
from .classify.task import ClassifyTask, evaluate, train, train_one_epoch
from .dense.task import DenseTask, train_dense
from .vae.task import VAETask, train_vae

TASKS = {name: task_table.task_class(name) for name in task_table.TASKS}  # a fine-tune is a classify run

__all__ = ["Task", "TASKS", "ClassifyTask", "DenseTask", "FinetuneTask", "VAETask", "train_dense", "train",
           "train_one_epoch", "evaluate", "finetune", "finetune_resume", "train_vae"]
