"""A study's results folder keeps a copy of every finished run's result.json
(``<results>/runs/<id>/result.json``, committed with the results): a study resumes from it on a machine
that has lost its run directories, and its report is rebuilt from it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

from ..errors import UserError
from ..run.atomic import write_atomic
from .spec import Study


def archived(study: Study, run_id: str) -> Optional[Path]:
    """Where the study's results folder keeps a copy of a finished run's result.json
    (``<results>/runs/<id>/result.json``, committed with the results): a study resumes from it on a
    machine that has lost the run directories, and its report is rebuilt from it."""
    return study.results / "runs" / run_id / "result.json" if study.results is not None else None


def archive(study: Study, res: Dict[str, Any]) -> None:
    """Keep a finished run's result in the study's results folder (see :func:`archived`)."""
    path = archived(study, res.get("run_id", ""))
    if path is None or "error" in res:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(res, indent=1))


MIGRATE = "python scripts/migrate_results.py"  # rewrites result files of an earlier recurvit in the current form


def read_result(f: Path) -> Optional[Dict[str, Any]]:
    """A result.json, or None when it is not a readable result (a torn write, a hand edit). One written by an
    earlier recurvit (see :func:`earlier_form`) is one line naming the script that rewrites it."""
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(res, dict) or "run_id" not in res:
        return None
    why = earlier_form(res)
    if why:
        raise UserError(f"{f} was written by an earlier recurvit ({why}); rewrite it in the current form with "
                        f"`{MIGRATE} {f.parent}`")
    return res


def earlier_form(res: Dict[str, Any]) -> str:
    """What marks a run's result as one an earlier recurvit wrote ('' for the current form): no record of its
    evaluators, the ``{max_steps_factor, variants}`` record, or a per-epoch curve without its plateau figure."""
    rec = res.get("eval")
    if not isinstance(rec, dict):
        return "it records no evaluators"
    if "max_steps_factor" in rec:
        return "its evaluators recorded as {max_steps_factor, variants}"
    for curve, key in (("test_acc_curve", "plateau_test"), ("val_acc_curve", "plateau_val")):
        if curve in res and key not in res:
            return f"{curve} without {key}"
    return ""
