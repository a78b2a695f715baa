"""The tasks a study can run, by name: what a study asks of a task's runs (its *view*: a result row, the
report's columns, cells, tables and plots, the evaluators its study files may name) is found through the
one task table (:data:`recurvit.task_table.VIEWS`, each view imported on first use), so study/ never imports
tasks/, branches on no task's name, and needs nothing imported first.

A view is a module (``recurvit.tasks.classify.study`` is classification's) that defines ``name`` (the study
file's ``task:``), ``run`` (train and evaluate one grid point), ``check_run``, ``EVALUATORS``, ``CSV_KEYS``,
``STAT_KEYS``, ``SHARED_KEYS``, ``CURVE_KEY``, ``CONTRAST``, ``ACC_HEAD`` and the report's hooks
(``complete_csv_row``, ``prepare_rows``, ``fill_cell``, ``chance``, ``intro``, ``tables``, ``report_plots``).
"""
from __future__ import annotations

from types import ModuleType
from typing import Dict, Mapping

from .. import task_table
from ..errors import UserError


def view_of(task: str, where: str = "study file") -> ModuleType:
    """The view of ``task``; one line naming the tasks a study can run when there is none."""
    found = task_table.view(task) if isinstance(task, str) else None
    if found is None:
        raise UserError(f"{where}: task must be one of {', '.join(task_table.view_names())}, got '{task}'")
    return found


def registrants() -> Dict[str, str]:
    """The study views by name and module: what a run in a fresh process (a spawned worker, a cluster job)
    is given, so a view added at run time (``task_table.add_view``) is found there too."""
    return dict(task_table.VIEWS)


def import_registrants(views: Mapping[str, str]) -> None:
    """Make the views of :func:`registrants` (of the process that planned the run) known here."""
    for name, module in dict(views or {}).items():
        task_table.add_view(name, module)
