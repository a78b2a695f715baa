"""Where each task lives: ONE explicit table, read by every floor that looks a task up by name.

A checkpoint names the task that wrote it (``ckpt["task"]``), a study file names the task its runs train
(``task:``) and a data set may train as a task of its own (mazes: the dense task). The floors that look
these up (``run/`` loading a checkpoint, ``study/`` running a grid, ``train`` choosing the task) sit below
``tasks/`` and import nothing from it; they find a task here, by its dotted name, imported on first use.
So nothing has to be imported first for a lookup to work: a command in a fresh process, a spawned study
worker and ``python -c "from recurvit.export import export_steps"`` find every task alike.

    task_class("dense")          # -> recurvit.tasks.dense.task.DenseTask (imported now)
    view("finetune")             # -> the module recurvit.tasks.classify.finetune_study
    data_task("mazes")           # -> "dense"

A task defined outside the package adds itself with :func:`add_task` (and :func:`add_view` for studies):
an explicit call, in the program that defines it.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Dict, List, Optional

# checkpoint["task"] -> "module:Class" of the task (its ``reader`` turns its checkpoints into a model)
TASKS: Dict[str, str] = {
    "classify": "recurvit.tasks.classify.task:ClassifyTask",  # a fine-tune is a classify run
    "dense": "recurvit.tasks.dense.task:DenseTask",
    "vae": "recurvit.tasks.vae.task:VAETask",
}
# a study file's ``task:`` -> the module that is the view of that task's runs
VIEWS: Dict[str, str] = {
    "classify": "recurvit.tasks.classify.study",
    "finetune": "recurvit.tasks.classify.finetune_study",
    "vae": "recurvit.tasks.vae.study",
    "dense": "recurvit.tasks.dense.study",
}
# data.name -> the task its runs train as, where that is not classification
DATA_TASKS: Dict[str, str] = {"mazes": "dense"}
# files that mark a run directory whose best.pt was never chosen on the test split even without a validation
# split (a fine-tune's recipe, finetune.json: its best.pt is its deployable weights)
BEST_WITHOUT_HOLDOUT = {"finetune.json"}

_ADDED: Dict[str, Any] = {}  # task classes added at run time (add_task), by name


def _resolve(dotted: str) -> Any:
    module, _, attr = dotted.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def task_names() -> List[str]:
    return sorted(set(TASKS) | set(_ADDED))


def task_class(name: str) -> Optional[type]:
    """The task class of ``name`` (None for a name no task has)."""
    if name in _ADDED:
        return _ADDED[name]
    return _resolve(TASKS[name]) if name in TASKS else None


def view(name: str) -> Optional[ModuleType]:
    """The study view of ``name`` (None for a name no study task has)."""
    return _resolve(VIEWS[name]) if name in VIEWS else None


def view_names() -> List[str]:
    return list(VIEWS)


def data_task(data_name: str) -> Optional[str]:
    """The task that trains data set ``data_name`` when it is not classification (else None)."""
    return DATA_TASKS.get(data_name)


def add_task(cls: type, data: tuple = ()) -> type:
    """A task defined outside the package: its checkpoints load (``cls.reader``) and ``recurvit train``
    picks it for the data sets named in ``data``. Returns ``cls`` (usable as a class decorator)."""
    _ADDED[cls.name] = cls
    DATA_TASKS.update({d: cls.name for d in data})
    return cls


def add_view(name: str, module: str) -> None:
    """A study view defined outside the package, by the dotted name of its module (a spawned study worker
    imports it by that name)."""
    VIEWS[name] = module
