"""Where each task lives: ONE explicit table, read by every floor that looks a task up by name.

A checkpoint names the task that wrote it (``ckpt["task"]``), a study file names the task its runs train
(``task:``) and a data set may train as a task of its own (mazes: the dense task). The floors that look
these up (``run/`` loading a checkpoint, ``study/`` running a grid, ``train`` choosing the task) sit below
``tasks/`` and import nothing from it; they find a task here, by its import path (``module:Class``),
imported on first use. So nothing has to be imported first for a lookup to work: a command in a fresh
process, a spawned study worker and ``python -c "from recurvit.export import export_steps"`` find every
task alike.

    task_class("dense")          # -> recurvit.tasks.dense.task.DenseTask (imported now)
    view("finetune")             # -> a recurvit.tasks.classify.finetune_study.FinetuneView
    data_task("mazes")           # -> "dense"

A task defined outside the package is added with one call, in the program that defines it::

    task_table.add(MyTask, view=MyView, data=("my_data",))

Its entries are kept by import path too (:func:`added`), so a process that did not make the call (a
spawned study worker, a cluster job) is given them (:func:`restore`) and imports what they name.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

# checkpoint["task"] -> "module:Class" of the task (its ``reader`` turns its checkpoints into a model)
TASKS: Dict[str, str] = {
    "classify": "recurvit.tasks.classify.task:ClassifyTask",  # a fine-tune is a classify run
    "dense": "recurvit.tasks.dense.task:DenseTask",
    "vae": "recurvit.tasks.vae.task:VAETask",
}
# a study file's ``task:`` -> "module:Class" of the view of that task's runs (recurvit.study.registry.View)
VIEWS: Dict[str, str] = {
    "classify": "recurvit.tasks.classify.study:ClassifyView",
    "finetune": "recurvit.tasks.classify.finetune_study:FinetuneView",
    "vae": "recurvit.tasks.vae.study:VAEView",
    "dense": "recurvit.tasks.dense.study:DenseView",
}
# data.name -> the task its runs train as, where that is not classification
DATA_TASKS: Dict[str, str] = {"mazes": "dense"}
# files that mark a run directory whose best.pt was never chosen on the test split even without a validation
# split (a fine-tune's recipe, finetune.json: its best.pt is its deployable weights)
BEST_WITHOUT_HOLDOUT = {"finetune.json"}

Entry = Union[str, type]  # "module:Class", or the class itself
_ADDED: Dict[str, Dict[str, Any]] = {}  # tasks added at run time (add): name -> {"task", "view", "data"}


def _path(obj: Optional[Entry]) -> Optional[str]:
    """The import path of a class (``module:Qualname``); a path is returned as it is."""
    return obj if obj is None or isinstance(obj, str) else f"{obj.__module__}:{obj.__qualname__}"


def _resolve(entry: Entry) -> Any:
    if not isinstance(entry, str):
        return entry
    module, _, attr = entry.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def add(task: Entry, view: Optional[Entry] = None, data: Iterable[str] = (), name: Optional[str] = None) -> None:
    """A task defined outside the package: its checkpoints load (``task.reader``, so ``recurvit.load_model``
    reads its runs), ``view`` (a :class:`recurvit.study.registry.View` subclass) runs it as a study file's
    ``task: <name>``, and ``recurvit train`` picks it for the data sets named in ``data``. ``task`` and
    ``view`` are classes or import paths ("module:Class"); ``name`` defaults to ``task.name``."""
    if name is None:
        name = _resolve(task).name
    _ADDED[str(name)] = {"task": task, "view": view, "data": list(data)}


def remove(name: str) -> None:
    """Undo :func:`add` (nothing when ``name`` was not added)."""
    _ADDED.pop(name, None)


def added() -> Dict[str, Dict[str, Any]]:
    """The tasks added at run time, by import path: what a fresh process is given (:func:`restore`)."""
    return {name: {"task": _path(e["task"]), "view": _path(e["view"]), "data": list(e["data"])}
            for name, e in _ADDED.items()}


def restore(entries: Optional[Mapping[str, Mapping[str, Any]]]) -> None:
    """Make the tasks of :func:`added` (of the process that planned a run) known here."""
    for name, e in dict(entries or {}).items():
        if name not in _ADDED:  # this process's own call wins: it holds the class itself
            add(e["task"], e.get("view"), e.get("data") or (), name=name)


def task_names() -> List[str]:
    return sorted(set(TASKS) | set(_ADDED))


def task_class(name: str) -> Optional[type]:
    """The task class of ``name`` (None for a name no task has)."""
    if name in _ADDED:
        return _resolve(_ADDED[name]["task"])
    return _resolve(TASKS[name]) if name in TASKS else None


def view(name: str) -> Any:
    """The study view of ``name``, an instance of its class (None for a name no study task has)."""
    entry = _ADDED[name]["view"] if name in _ADDED else VIEWS.get(name)
    if entry is None:
        return None
    found = _resolve(entry)
    return found() if isinstance(found, type) else found


def view_names() -> List[str]:
    return list(VIEWS) + [n for n, e in _ADDED.items() if e["view"] is not None and n not in VIEWS]


def data_task(data_name: str) -> Optional[str]:
    """The task that trains data set ``data_name`` when it is not classification (else None)."""
    for name, e in _ADDED.items():
        if data_name in e["data"]:
            return name
    return DATA_TASKS.get(data_name)
