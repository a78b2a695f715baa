"""Confirmatory or exploratory: whether a study's rows may be read as a pre-registered replication.

A study file with a ``registration:`` block (``n`` runs per cell, its ``seeds``, the ``checkpoint`` its
figures are read from, its ``budget``; see :mod:`recurvit.study.spec`) is a registration. Its rows are
**confirmatory** only when git shows all three of:

1. the registration precedes every result it reads: the commit that added the study file is a strict
   ancestor of the first commit of its results.csv (or no result is committed yet);
2. nothing in it changed afterwards: the file has that one commit and the working copy is unchanged, and
   neither did the config files it trains from (its base and its variants' bases: a registration that
   points at a config could otherwise be changed through it);
3. its cells hold exactly the registered runs: every cell has the registered seeds, no other seed and no
   second run of one (a top-up beyond n, whatever a report asked, makes the study exploratory).

While a cell still lacks registered runs the rows are **registered, pending** (their figures are shown;
no verdict of theirs is counted). Every other row of the table is **exploratory**.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence

import yaml

from .cells import SEED_KEY, Row
from .history import file_commits, first_commit, show

CONFIRMATORY = "confirmatory"
EXPLORATORY = "exploratory"
PENDING = "registered, pending"


@dataclass(frozen=True)
class Evidence:
    status: str  # CONFIRMATORY / EXPLORATORY / PENDING
    why: str     # one clause: what git and the cells show
    commit: str = ""  # the registration commit ("" for a study without one)

    @property
    def text(self) -> str:
        return f"{self.status} ({self.why})" if self.why else self.status


def _is_strict_ancestor(root: Path, old: str, new: str) -> bool:
    if old == new:
        return False
    return subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", old, new],
                          capture_output=True).returncode == 0


def _values(text: str) -> Any:
    """What a config file says, as YAML reads it (its comments are not part of what is trained)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # unreadable: compared as text


def _configs_changed(root: Path, study: Any, registered: str) -> str:
    """The first config file the study trains from whose values changed after the registration commit, in any
    later commit or in the working copy ('' if none). A comment is not a value: labelling an old config (issue
    55: "not DeepThinking's recipe") leaves what its registered runs trained unchanged."""
    paths = {Path(study.base)} | {Path(r.base) for r in study.runs if r.base is not None}
    for path in sorted(paths):
        try:
            rel = str(path.resolve().relative_to(root.resolve()))
        except ValueError:  # a config outside the repository: git cannot vouch for it
            return str(path)
        later = subprocess.run(["git", "-C", str(root), "log", "--format=%H", f"{registered}..HEAD", "--", rel],
                               capture_output=True, text=True).stdout.split()
        then = _values(show(root, registered, rel))
        if any(_values(show(root, c, rel)) != then for c in later) or _values(path.read_text()) != then:
            return rel
    return ""


def _cells(study: Any, rows: Sequence[Row]) -> Dict[tuple, List[str]]:
    """Each grid cell (its labels on every axis but the seed) -> the seeds of the rows in it."""
    axes = study.cell_axes()
    out: Dict[tuple, List[str]] = {}
    for spec in study.runs:
        out.setdefault(tuple(spec.labels.get(a) for a in axes), [])
    for r in rows:
        out.setdefault(tuple(str(r.get(a)) for a in axes), []).append(str(r.get(SEED_KEY, r.get("seed"))))
    return out


def evidence(root: Path, study: Any, results: Path, rows: Sequence[Row]) -> Evidence:
    """The evidence status of a study's rows (see the module docstring)."""
    reg = study.registration
    if not reg:
        return Evidence(EXPLORATORY, "")
    rel = str(Path(study.path).resolve().relative_to(root.resolve()))
    commits = file_commits(root, rel)
    if not commits:
        return Evidence(EXPLORATORY, "the registration is not committed")
    registered = commits[0]
    if len(commits) > 1 or show(root, registered, rel) != Path(study.path).read_text():
        return Evidence(EXPLORATORY, f"the registration changed after {registered[:7]}", registered)
    changed = _configs_changed(root, study, registered)
    if changed:
        return Evidence(EXPLORATORY, f"its config {changed} changed after the registration {registered[:7]}",
                        registered)
    res_rel = str(results.resolve().relative_to(root.resolve()))
    first = first_commit(root, res_rel)
    if first is not None and not _is_strict_ancestor(root, registered, first):
        return Evidence(EXPLORATORY, f"results committed before or with the registration {registered[:7]}",
                        registered)
    seeds, n = sorted(map(str, reg.seeds)), int(reg.n)
    got = 0
    for cell, have in _cells(study, rows).items():
        extra = sorted(set(have) - set(seeds)) or sorted({s for s in have if have.count(s) > 1})
        if extra or len(have) > n:
            return Evidence(EXPLORATORY, f"cell {'/'.join(map(str, cell))} holds runs beyond the registration "
                            f"(seed {', '.join(extra) or '?'}; registered n = {n}, seeds {', '.join(seeds)})",
                            registered)
        got += len(have)
    total = n * len(_cells(study, ()))
    if got < total:
        return Evidence(PENDING, f"registered in {registered[:7]}; {got} of {total} runs in", registered)
    return Evidence(CONFIRMATORY, f"registered in {registered[:7]}, before every result; n = {n} per cell",
                    registered)
