"""A study's results folder keeps a copy of every finished run's result.json
(``<results>/runs/<id>/result.json``, committed with the results): a study resumes from it on a machine
that has lost its run directories, and its report is rebuilt from it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

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


def read_result(f: Path) -> Optional[Dict[str, Any]]:
    """A result.json, or None when it is not a readable result (a torn write, a hand edit)."""
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return res if isinstance(res, dict) and "run_id" in res else None
