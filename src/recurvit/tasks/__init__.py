"""Training tasks: what the one loop (:func:`recurvit.train.fit.fit`) trains.

    from recurvit.tasks import train, finetune, finetune_resume, train_vae

A task is one file here plus one entry in :data:`TASKS` (the checkpoint's ``task`` key -> class);
what it must define is :class:`recurvit.tasks.base.Task`'s docstring.
"""
from .base import Task
from .classify import ClassifyTask, evaluate, train, train_one_epoch
from .finetune import FinetuneTask, finetune, finetune_resume
from .vae import VAETask, train_vae

TASKS = {ClassifyTask.name: ClassifyTask, VAETask.name: VAETask}  # a fine-tune is a classify run

__all__ = ["Task", "TASKS", "ClassifyTask", "FinetuneTask", "VAETask", "train", "train_one_epoch", "evaluate",
           "finetune", "finetune_resume", "train_vae"]
