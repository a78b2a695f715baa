"""Studies: a grid of runs from one study file (spec), trained and evaluated resumably (runner),
reported with seed statistics and plots (report, plots, stats). ``recurvit study STUDY.yaml``.

The names below are imported on first use (PEP 562): the tasks' study files (recurvit/tasks/
*_study.py) import this package's plots and statistics, and the report imports the tasks."""
from importlib import import_module

_LAZY = {"write_report": ".report", "collect": ".runner", "run_dir_root": ".spec", "run_study": ".runner",
         "Study": ".spec", "load_study": ".spec"}
__all__ = ["Study", "load_study", "run_study", "collect", "run_dir_root", "write_report"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'recurvit.study' has no attribute {name!r}")
