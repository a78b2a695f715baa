"""The files a claim reads and whether its rule came before each: the history column from every input.

A claim reads its own study's results and, as it names them, the results folders of a trend over budgets
(``budgets:``), earlier copies of the same figures (``seen:``) and a benchmark's file (``file:``). Its history
compares the commit of its rule with the first commit of *every* one of them that holds what it reads (a run
of its cells with its figure). When the rule came before some and after others, the row is **mixed**, with
the points from each side ("mixed: 9 before, 5 after": 9 points committed before the rule, 5 after), and
its verdict is read twice: on the points committed after the rule alone (for a registered study, the
registered points: the confirmatory reading) and on every point (exploratory).
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence

from .cells import SEED_KEY, Row, in_cell
from .claims import Claim
from .history import rule_came, show


# ------------------------------------------------------------------ which runs a claim reads
def claim_cells(claim: Claim) -> List[Dict[str, Any]]:
    """The cells whose runs a claim reads (none for a claim made of others)."""
    return claim.spec.read_cells()


def has_figure(claim: Claim, row: Row) -> bool:
    return claim.spec.has_figure(row)


def reads_any(claim: Claim, rows: Iterable[Row]) -> bool:
    """Whether ``rows`` hold any run of the claim's cells with its figure (results it reads, decided or not)."""
    cells = claim_cells(claim)
    return any(has_figure(claim, r) for r in rows if any(in_cell(r, c) for c in cells))


def seeds_per_cell(claim: Claim, rows: Iterable[Row]) -> int:
    """The most seeds any one of the claim's cells has with its figure among ``rows`` (0 for a claim made
    of others)."""
    rows = [r for r in rows if has_figure(claim, r)]
    return max((len({str(r.get(SEED_KEY, r.get("seed"))) for r in rows if in_cell(r, cell)})
                for cell in claim_cells(claim)), default=0)


# --------------------------------------------------------------------------- every input
@dataclass(frozen=True)
class Input:
    label: str     # the budget's x (its own study's results included)
    rel: str       # its results file, from the repository's root
    points: int    # the claim's points it holds
    seeds: tuple   # their seeds
    came: str      # whether the rule came before it: "before" / "after" / "no results yet" / "unknown"


def _reads_file(root: Path, rel: str, claim: Claim):
    def reads(commit: str) -> bool:
        text = show(root, commit, rel)
        return bool(text) and reads_any(claim, csv.DictReader(io.StringIO(text)))
    return reads


def budget_inputs(root: Path, claim: Claim, rows: List[Row], own_came: str) -> List[Input]:
    """Each budget of a trend over budgets as an input: its results file, its points and seeds, and whether
    the claim's rule came before its first commit holding a run of the claim's cells (``own_came``: the
    history of the study's own results, already read)."""
    out = []
    trend = claim.spec
    for (label, _, got), folder in zip(trend.by_x(rows, claim), trend.budgets.values()):
        csv_path = trend.folder(claim, folder) / "results.csv"
        try:
            rel = str(csv_path.relative_to(root.resolve()))
        except ValueError:
            rel = str(csv_path)
        if claim.results is not None and csv_path.parent == Path(claim.results).resolve():
            came = own_came
        else:
            came = rule_came(root, claim.study, claim.id, csv_path, (), reads=_reads_file(root, rel, claim))
        out.append(Input(label, rel, len(got), tuple(s for s, _ in got), came))
    return out


def mixed(inputs: Sequence[Input]) -> str:
    """"mixed: k before, m after" when the rule came after some inputs (their k points were committed before
    it) and before others (m points); "" when it came on one side of them all."""
    sides = {i.came.split(";")[0] for i in inputs if i.points and i.came.startswith(("before", "after"))}
    if len(sides) < 2:
        return ""
    early = sum(i.points for i in inputs if i.came.startswith("after"))
    late = sum(i.points for i in inputs if i.came.startswith("before"))
    return f"mixed: {early} before, {late} after"


def after_rule(inputs: Sequence[Input]) -> List[str]:
    """The labels of the inputs first committed after the rule (the registered points, for a registered study)."""
    return [i.label for i in inputs if i.came.startswith("before")]


# ------------------------------------------------------------------------ seeds in the data
def seed_ranges(seeds: Iterable[Any]) -> str:
    """"0-2", "0-2, 5", "10-14": the seeds, runs of consecutive integers joined."""
    got = sorted({int(s) for s in seeds if str(s).lstrip("-").isdigit()})
    parts: List[str] = []
    for s in got:
        if parts and int(parts[-1].split("-")[-1]) == s - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{s}"
        else:
            parts.append(str(s))
    return ", ".join(parts) or "none"


_RANGES = r"[0-9]+(?:-[0-9]+)?(?:, [0-9]+(?:-[0-9]+)?)*"
SEEDS = re.compile(rf"seeds {_RANGES}(?: / {_RANGES})+")


def data_with_seeds(data: str, inputs: Sequence[Input]) -> str:
    """A budget trend's data as its claim words it, with the seeds of each budget read from the files (a
    typed "seeds 0-2 / 0-2 / 0-4 / 10-14" replaced by the seeds its points have)."""
    seeds = "seeds " + " / ".join(seed_ranges(i.seeds) for i in inputs)
    if SEEDS.search(data):
        return SEEDS.sub(seeds, data, count=1)
    return f"{data} ({seeds})" if data else ""


__all__ = ["claim_cells", "has_figure", "reads_any", "seeds_per_cell", "Input", "budget_inputs", "mixed",
           "after_rule", "seed_ranges", "data_with_seeds"]
