"""Rows of figures to CSV with floats to 6 significant digits: the writer of the LoopVAE intervention and
profile tables (the study results.csv, recurvit.study.report, formats its own rows the same way)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence


def fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def write_csv(rows: Iterable[Dict[str, Any]], path: str | Path, columns: Sequence[str]) -> Path:
    """``rows`` (dicts) as a CSV with ``columns``, in that order; keys outside them are left out."""
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: fmt(r.get(k)) for k in columns})
    return path


__all__: List[str] = ["write_csv", "fmt"]
