"""Training tasks: what the one loop (:func:`recurvit.train.fit.fit`) trains.

    from recurvit.tasks import train, finetune, finetune_resume, train_vae

A task is one file here plus one entry in :data:`TASKS` (the checkpoint's ``task`` key -> class);
what it must define is :class:`recurvit.tasks.base.Task`'s docstring. What a study asks of the
task's runs (a result row, report columns, tables, plots) is a second file, ``<task>_study.py``,
and one entry in :data:`STUDIES`; the study runner and report branch on no task's name.
"""
from ..run.checkpoint import BEST_WITHOUT_HOLDOUT, register_reader
from .base import Task
from .classify import ClassifyTask, evaluate, train, train_one_epoch
from .dense import DenseTask, train_dense
from .finetune import RECIPE, FinetuneTask, finetune, finetune_resume
from .vae import VAETask, train_vae
from . import classify_study, dense_study, finetune_study, vae_study

TASKS = {ClassifyTask.name: ClassifyTask, VAETask.name: VAETask, DenseTask.name: DenseTask}  # a fine-tune is a classify run
for _task in TASKS.values():  # how recurvit.run.load.load opens each task's checkpoints
    register_reader(_task.name, _task.reader)
BEST_WITHOUT_HOLDOUT.add(RECIPE)  # a fine-tune's best.pt is its deployable weights, with or without a holdout
STUDIES = {m.name: m for m in (classify_study, finetune_study, vae_study, dense_study)}  # what a study asks of each task's runs

__all__ = ["Task", "TASKS", "STUDIES", "ClassifyTask", "DenseTask", "FinetuneTask", "VAETask", "train_dense", "train", "train_one_epoch", "evaluate",
           "finetune", "finetune_resume", "train_vae"]
