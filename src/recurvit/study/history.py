"""Whether a claim's rule came before its results, read from git: the commit that last changed the
claim (in its study file) against the first commit that holds the results it reads (the results file,
in it the columns of the claim's figure, and, with ``reads``, any run of the claim's cells)."""
from __future__ import annotations

import csv
import functools
import io
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import yaml

from ..errors import UserError


def _git(root: Path, *args: str) -> Optional[str]:
    try:
        res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return res.stdout


@functools.lru_cache(maxsize=None)
def _claims_at(root: Path, commit: str, rel: str) -> Dict[str, Any]:
    text = _git(root, "show", f"{commit}:{rel}")
    try:
        doc = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return {}
    return (doc.get("claims") if isinstance(doc, dict) else None) or {}


# how a row describes its data and figure, and the unit its figure is printed in (margins and thresholds are
# in the figure's own units, so ``scale`` and ``unit`` never reach a decision): not part of the rule
PRESENTATION = ("data", "label", "scale", "unit")


def _rule(claim: Any) -> Any:
    """A claim as its rule: every key but the presentation ones (rewording a row's description of its
    data or figure, or the unit it is printed in, does not make its rule later; its words, cells, figure,
    kind and margin do)."""
    return {k: v for k, v in claim.items() if k not in PRESENTATION} if isinstance(claim, dict) else claim


def _claim_at(root: Path, commit: str, rel: str, cid: str) -> Any:
    return _rule(_claims_at(root, commit, rel).get(cid))


@functools.lru_cache(maxsize=None)
def _header_at(root: Path, commit: str, rel: str) -> tuple:
    """The header row of the CSV ``rel`` at ``commit`` (every claim of a study reads the same file)."""
    return tuple(next(csv.reader(io.StringIO(_git(root, "show", f"{commit}:{rel}") or "")), []))


def rule_commit(root: Path, study_file: Path, cid: str) -> Optional[str]:
    """The commit that last changed claim ``cid`` of ``study_file`` ("worktree" when the working copy
    differs from HEAD; None outside a repository)."""
    rel = str(study_file.resolve().relative_to(root.resolve()))
    log = _git(root, "log", "--format=%H", "--", rel)
    if log is None:
        return None
    with open(study_file) as f:
        now = _rule(((yaml.safe_load(f) or {}).get("claims") or {}).get(cid))
    commits = log.split()
    if not commits or _claim_at(root, commits[0], rel, cid) != now:
        return "worktree"
    for newer, older in zip(commits, commits[1:] + [None]):
        if older is None or _claim_at(root, older, rel, cid) != now:
            return newer
    return None  # pragma: no cover


def file_commits(root: Path, rel: str) -> List[str]:
    """The commits that changed the file ``rel``, oldest first."""
    return list(reversed((_git(root, "log", "--format=%H", "--", rel) or "").split()))


def show(root: Path, commit: str, rel: str) -> str:
    """The file ``rel`` as committed at ``commit`` ("" when it did not exist there)."""
    return _git(root, "show", f"{commit}:{rel}") or ""


def results_commit(root: Path, results_file: Path, columns: Sequence[str] = (),
                   reads: Optional[Callable[[str], bool]] = None) -> Optional[str]:
    """The first commit that holds ``results_file`` ("worktree" when it is not committed yet); with
    ``columns``, the first commit whose copy of that CSV has every one of them in its header (a figure
    added to a study's results later, for example by a new evaluator, has results from then on); with
    ``reads(commit)``, the first whose copy also holds what the claim reads (a run of its cells, decided or
    not: a file that has the columns but only other cells' runs holds none of its results yet)."""
    rel = str(results_file.resolve().relative_to(root.resolve()))
    log = _git(root, "log", "--format=%H", "--diff-filter=A", "--", rel)
    if log is None:
        return None
    commits = log.split()
    if not commits:
        return "worktree"
    if not columns and reads is None:
        return commits[-1]
    for commit in file_commits(root, rel):
        if set(columns) <= set(_header_at(root, commit, rel)) and (reads is None or reads(commit)):
            return commit
    return "worktree"


def first_commit(root: Path, rel: str) -> Optional[str]:
    """The first commit that added the file ``rel`` (it may be gone since); None when none did."""
    commits = (_git(root, "log", "--format=%H", "--diff-filter=A", "--", rel) or "").split()
    return commits[-1] if commits else None


def _earliest(root: Path, commits: Sequence[str]) -> str:
    known = [c for c in commits if c not in (None, "worktree")]
    if not known:
        return "worktree"
    order = (_git(root, "rev-list", "--topo-order", "--reverse", "HEAD") or "").split()
    return min(known, key=lambda c: order.index(c) if c in order else len(order))


def rule_came(root: Path, study_file: Path, cid: str, results_file: Path, columns: Sequence[str] = (),
              seen: Sequence[str] = (), reads: Optional[Callable[[str], bool]] = None) -> str:
    """"before" when the claim's rule was committed before the first commit of the results it reads
    (``columns``: the results.csv columns of its figure; ``seen``: earlier files, relative to ``root``,
    that held the same figures, which count from their own first commit; ``reads``: see
    :func:`results_commit`), "after" otherwise; "no results yet" when there are none; "unknown" outside
    a git repository."""
    if not results_file.is_file():
        return "no results yet"
    rule, res = rule_commit(root, study_file, cid), results_commit(root, results_file, columns, reads)
    if seen and res is not None:
        firsts = [first_commit(root, f) for f in seen]
        never = [f for f, c in zip(seen, firsts) if c is None]
        if never:  # a misspelt path would make the results look newer than they are

            raise UserError(f"claim {cid}: seen file(s) {', '.join(never)} were never committed in this repository")
        res = _earliest(root, [res, *firsts])
    if rule is None or res is None:
        return "unknown"
    if rule == "worktree":
        return "after"
    if res == "worktree":
        return "before"
    if rule == res:
        return "after"  # committed together: the rule was written with its results in view
    is_ancestor = subprocess.run(["git", "-C", str(root), "merge-base", "--is-ancestor", rule, res],
                                 capture_output=True).returncode == 0
    return "before" if is_ancestor else "after"
