"""Studies: a grid of runs from one study file (spec), trained and evaluated resumably (runner),
reported with seed statistics and plots (report, plots, stats). ``recurvit study STUDY.yaml``.

What a study asks of a task's runs is the task's, found by name in :mod:`recurvit.task_table` (:mod:`.registry`);
study/ never imports tasks/."""
from .report import write_report
from .runner import collect, run_study
from .spec import Study, load_study, run_dir_root

__all__ = ["Study", "load_study", "run_study", "collect", "run_dir_root", "write_report"]
