"""The tasks a study can run, by name, and the type of what a study asks of a task's runs: its *view*.

A view (:class:`StudyView`) trains and evaluates one grid point (``run``) and shapes the report: the columns
of results.csv, the figures of a cell, the figures a comparison reads, the task's tables and plots. Each
task's view is a subclass of :class:`View`, which gives every member a default (a simple task sets
``name``, ``run`` and a few column lists); the views are found through the one task table
(:data:`recurvit.task_table.VIEWS`, each imported on first use), so study/ never imports tasks/, branches
on no task's name, and needs nothing imported first.
"""
from __future__ import annotations

from pathlib import Path
from typing import (TYPE_CHECKING, Any, ClassVar, Dict, List, Mapping, NamedTuple, Optional, Protocol, Sequence,
                    Tuple, runtime_checkable)

from .. import task_table
from ..errors import UserError
from .grouping import table
from .stats import fmt_ci, mean_ci

if TYPE_CHECKING:
    from .evaluators import Evaluator

Row = Dict[str, Any]  # one run's result row (result.json, or a line of results.csv)
Cell = Dict[str, Any]  # the runs of one grid point but the seed, with their statistics
Study = Any  # a recurvit.study.spec.Study (spec imports this module: named here, not imported)


class Contrast(NamedTuple):
    """The figures ``report: {compare: ...}`` reads of each pair of cells."""

    keys: Sequence[str] = ()  # the row keys compared, in the report's order
    scale: float = 1.0  # a difference's scale in the report (100: fractions shown as points)
    unit: str = ""  # the unit the report names
    heads: Mapping[str, str] = {}  # a key's name in the report's table (the key itself when absent)


@runtime_checkable
class StudyView(Protocol):
    """What the study machinery (runner, spec, report) reads of a task's view."""

    name: str  # the study file's ``task:``
    EVALUATORS: Mapping[str, "Evaluator"]  # the evaluators a study file's ``eval:`` may name
    CONTRAST: Contrast
    CURVE_WORD: str  # the per-epoch figure of a registered study's every-run table and plot

    def run(self, base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
            threads: Optional[int] = None) -> Row: ...

    def check_run(self, base: str, overrides: List[str]) -> None: ...

    def csv_columns(self, rows: List[Row]) -> List[str]: ...

    def complete_row(self, row: Row) -> None: ...

    def fill_cell(self, c: Cell, rows: List[Row]) -> None: ...

    def tables(self, rows: List[Row], cs: List[Cell], study: Study, seeds: list) -> List[str]: ...

    def plots(self, cs: List[Cell], study: Study, out_dir: Path) -> List[Tuple[str, str]]: ...


class View:
    """The base of every task's view: a default for each member of :class:`StudyView`."""

    name: ClassVar[str] = ""
    EVALUATORS: ClassVar[Mapping[str, "Evaluator"]] = {}
    CSV_KEYS: ClassVar[Sequence[str]] = ()  # results.csv's columns after the grid's
    SHARED_KEYS: ClassVar[Sequence[str]] = ()  # a cell's figures read off its first run
    STAT_KEYS: ClassVar[Sequence[str]] = ()  # a cell's figures as mean and 95% interval over its seeds
    CURVE_KEY: ClassVar[str] = "test_acc_curve"  # the row key of the per-epoch curve a cell shows
    CURVE_WORD: ClassVar[str] = "accuracy"
    CONTRAST: ClassVar[Contrast] = Contrast()

    def run(self, base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
            threads: Optional[int] = None) -> Row:
        """Train (or resume) the run of config ``base`` with ``overrides`` in folder ``out``, run the evaluators
        of ``eval_spec`` ({name: options}) on it and return its result row."""
        raise NotImplementedError

    def check_run(self, base: str, overrides: List[str]) -> None:
        """A grid point's config, read when the study file is (a bad value: one UserError line)."""
        return None

    def csv_columns(self, rows: List[Row]) -> List[str]:
        """results.csv's columns after the grid's (those the rows have, where they vary with the runs)."""
        return list(self.CSV_KEYS)

    def complete_row(self, row: Row) -> None:
        """A row read back from results.csv: what it implies but does not store."""
        return None

    def fill_cell(self, c: Cell, rows: List[Row]) -> None:
        """Cell ``c`` (its grid labels, ``cell`` and ``rows`` set) from its runs: the shared figures, ``n``, the
        statistics over seeds and the first seed's curve."""
        c.update({k: rows[0].get(k) for k in self.SHARED_KEYS})
        c["n"] = len(rows)
        for k in self.STAT_KEYS:
            c[k] = mean_ci([r.get(k) for r in rows])
        first = min(rows, key=lambda r: (r.get("seed") is None, r.get("seed")))
        c["curve"] = first.get(self.CURVE_KEY)

    def tables(self, rows: List[Row], cs: List[Cell], study: Study, seeds: list) -> List[str]:
        """The report's lines of this task: what its figures are, then its tables (here: every statistic)."""
        axes = study.cell_axes() or ["cell"]
        body = [[str(c[a]) for a in axes] + [fmt_ci(c[k], 1.0, 4) for k in self.STAT_KEYS] for c in cs]
        return [f"{len(rows)} runs; seeds {seeds}; mean ± half-width of the 95% t-interval over seeds.", ""] + \
            table(axes + list(self.STAT_KEYS), body) + [""]

    def plots(self, cs: List[Cell], study: Study, out_dir: Path) -> List[Tuple[str, str]]:
        """The plots drawn into ``out_dir``, as (title, file name)."""
        return []


def view_of(task: str, where: str = "study file") -> StudyView:
    """The view of ``task``; one line naming the tasks a study can run when there is none."""
    found = task_table.view(task) if isinstance(task, str) else None
    if found is None:
        raise UserError(f"{where}: task must be one of {', '.join(task_table.view_names())}, got '{task}'")
    return found


def registrants() -> Dict[str, Dict[str, Any]]:
    """The tasks added at run time (``task_table.add``), by import path: what a run in a fresh process (a
    spawned worker, a cluster job) is given, so it finds them too."""
    return task_table.added()


def import_registrants(entries: Optional[Mapping[str, Mapping[str, Any]]]) -> None:
    """Make the tasks of :func:`registrants` (of the process that planned the run) known here."""
    task_table.restore(entries)
