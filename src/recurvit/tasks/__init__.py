"""Training tasks: what the one loop (:func:`recurvit.train.fit.fit`) trains, one folder a task.

    from recurvit.tasks import train, finetune, finetune_resume, train_vae

- ``classify/``: classification (task), its study evaluators (evaluators), what a study asks of its runs
  (study), and fine-tuning, classification after a model-preparation step (finetune, finetune_study);
- ``dense/``: per-pixel targets (mazes): task, evaluators, plots, study;
- ``vae/``: the LoopVAE tokenizer: task, config, data, losses, metrics, evaluate, interventions, profile,
  evaluators, study.

A task is its folder plus one entry in :data:`TASKS` (the checkpoint's ``task`` key -> class); what it
must define is :class:`recurvit.tasks.base.Task`'s docstring. Importing this package registers every task
where the floors below look tasks up by name, so they import none: its checkpoint reader
(:data:`recurvit.run.checkpoint.READERS`) and what a study asks of its runs (its ``study`` module, into
:data:`recurvit.study.registry.STUDIES`).
"""
from ..run.checkpoint import BEST_WITHOUT_HOLDOUT, register_reader
from ..study.registry import register as register_study
from .base import Task
from .classify import finetune_study, study as classify_study
from .classify.finetune import RECIPE, FinetuneTask, finetune, finetune_resume
from .classify.task import ClassifyTask, evaluate, train, train_one_epoch
from .dense import study as dense_study
from .dense.task import DenseTask, train_dense
from .vae import study as vae_study
from .vae.task import VAETask, train_vae

TASKS = {ClassifyTask.name: ClassifyTask, VAETask.name: VAETask, DenseTask.name: DenseTask}  # a fine-tune is a classify run
for _task in TASKS.values():  # how recurvit.run.load.load opens each task's checkpoints
    register_reader(_task.name, _task.reader)
BEST_WITHOUT_HOLDOUT.add(RECIPE)  # a fine-tune's best.pt is its deployable weights, with or without a holdout
for _view in (classify_study, finetune_study, vae_study, dense_study):  # the tasks a study file may name
    register_study(_view)

__all__ = ["Task", "TASKS", "ClassifyTask", "DenseTask", "FinetuneTask", "VAETask", "train_dense", "train",
           "train_one_epoch", "evaluate", "finetune", "finetune_resume", "train_vae"]
