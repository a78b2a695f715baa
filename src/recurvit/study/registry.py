"""The tasks a study can run, by name: what a study asks of a task's runs (its *view*: a result row, the
report's columns, cells, tables and plots, the evaluators its study files may name) is registered here by
the task itself (``recurvit.tasks`` registers every task's), so study/ never imports tasks/ and branches on
no task's name.

A view is a module (``recurvit.tasks.classify.study`` is classification's) that defines ``name`` (the study
file's ``task:``), ``run`` (train and evaluate one grid point), ``check_run``, ``EVALUATORS``, ``CSV_KEYS``,
``STAT_KEYS``, ``SHARED_KEYS``, ``CURVE_KEY``, ``CONTRAST``, ``ACC_HEAD`` and the report's hooks
(``complete_csv_row``, ``prepare_rows``, ``fill_cell``, ``chance``, ``intro``, ``tables``, ``report_plots``).
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict, Iterable, List

from ..errors import UserError

STUDIES: Dict[str, ModuleType] = {}  # a study file's task: -> the view of that task's runs


def register(view: ModuleType) -> None:
    """Make ``view.name`` a task that study files may name."""
    STUDIES[view.name] = view


def view_of(task: str, where: str = "study file") -> ModuleType:
    """The view registered for ``task``; one line naming the registered ones when there is none."""
    if not STUDIES:  # a programming error, not a user's: nothing imported recurvit.tasks
        raise LookupError("no task is registered with recurvit.study: import recurvit.tasks first")
    if task not in STUDIES:
        raise UserError(f"{where}: task must be one of {', '.join(STUDIES)}, got '{task}'")
    return STUDIES[task]


def registrants() -> List[str]:
    """The modules that hold the registered views: what a run in a fresh process (a spawned worker, a
    cluster job) imports before it looks a task up (importing them registers every task again)."""
    return sorted(view.__name__ for view in STUDIES.values())


def import_registrants(modules: Iterable[str]) -> None:
    for name in modules:
        importlib.import_module(name)
