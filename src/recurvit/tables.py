"""Rows of figures to CSV with floats to 6 significant digits: the writer of the LoopVAE intervention and
profile tables, the horizon and anytime sweeps (the study results.csv, recurvit.study.report, formats its own rows the same way)."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence

from .run.outputs import write_text


def fmt(v: Any) -> Any:
    return f"{v:.6g}" if isinstance(v, float) else v


def write_csv(rows: Iterable[Dict[str, Any]], path: str | Path, columns: Sequence[str]) -> Path:
    """``rows`` (dicts) as a CSV with ``columns``, in that order; keys outside them are left out. Written
    atomically, and only over a file whose header starts as this one (one this writer wrote)."""
    path, f = Path(path), io.StringIO(newline="")
    w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: fmt(r.get(k)) for k in columns})
    mark = ",".join(list(columns)[:2]).encode()  # its first two columns: a table of an older version (a column
    return write_text(path, f.getvalue(), mark, "table")  # added since) is ours too; a foreign file is not


__all__: List[str] = ["write_csv", "fmt"]
