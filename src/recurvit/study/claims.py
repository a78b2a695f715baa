"""Claims: what a study is run to decide, declared next to its grid.

A study file may carry a ``claims:`` section, one entry a claim of a seed abstract::

    claims:
      matched_flops:
        source: Crossroads                      # which abstract
        words: standard ViTs remain preferable when FLOPs are the constraint
        data: Fashion-MNIST                     # the data the row's runs use
        rule: superiority                       # its kind: a key of recurvit.study.claim_kinds.KINDS
        figure: acc_T                           # a results.csv column (see ``figure`` forms below)
        a: {regime: vit_matched_flops}          # the cells compared: grid labels, axis -> label
        b: {regime: naive}
        side: +1                                # superiority / trend: the claimed sign of a - b
        label: ViT (matched FLOPs) − bViT       # how the table names the deciding figure

Each ``rule`` is a claim kind, a typed class of :mod:`recurvit.study.claim_kinds` that declares the keys it
takes and decides itself: ``superiority``, ``noninferiority``, ``equivalence`` and ``near_chance`` (cells
compared, optionally at several ``sizes``), ``heterogeneity``, ``trend`` (over a grid axis or over ``budgets``,
other studies' results folders), ``target`` (a project's own target, met per seed), ``all_of`` (a claim made of
others), ``stopping`` (a stopping rule against a control). A key the kind does not take is an error, one line.

Any comparison or level may name ``floor`` (results columns -> the value at which its rule holds whatever
the model does: it then "holds vacuously", never "reproduced"; :mod:`recurvit.study.vacuous`).
A ``figure`` is a column, ``"col_a - col_b"`` (per run), or a mapping
``{mean_of: [cols], minus: col, skip_own: axis}``: the per-run mean of the columns less ``minus``,
leaving out the column that ends in the run's own label on ``axis`` (for example each solver's own
evaluation in a train-solver x eval-solver matrix).

Claims that no study here can measure live in a study-less claims file with kinds ``accounting``, ``identity``,
``needs`` and ``benchmark`` (:mod:`recurvit.study.claim_kinds.rows`). The study-less file's ``qualify:`` reads
a registered claim, whose rule may not change, beside a ``stopping`` check from the same runs
(:func:`recurvit.study.findings.qualifications`).

Any claim may name ``seen``: earlier results files (paths from the repository's root) that held the
same figures before they moved to this study's results, so that whether its rule came before its
results is read against the first of them (:mod:`recurvit.study.history`). Whether its rule came before
its results is read against every file it reads (its study's results, each ``budgets`` folder, ``seen``,
a benchmark's ``file``): a claim reading results from both sides of its rule is "mixed"
(:mod:`recurvit.study.inputs`).

A label that a claim names and its study does not have is an error (:class:`UserError`), never a
silent "not measured". No claim branches on a core's name: cells are grid labels.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import yaml

from ..errors import UserError
from . import rules
from .cells import Row
from .claim_kinds import KINDS, NOT_TESTED, POOLED, Kind, build  # noqa: F401  (NOT_TESTED, POOLED: re-exported)


@dataclass
class Claim:
    """A claim where it sits: its id, its kind's name (``rule``) and typed keys (``spec``), and its study."""

    id: str
    rule: str
    spec: Kind
    study: Optional[Path] = None          # the study file that declares it
    results: Optional[Path] = None        # that study's results folder
    labels: Dict[str, List[str]] = field(default_factory=dict)  # the study's grid: axis -> labels

    @property
    def source(self) -> str:
        return self.spec.source

    @property
    def words(self) -> str:
        return self.spec.words

    @property
    def data(self) -> str:
        return self.spec.data


# ----------------------------------------------------------------------------------- loading
def load_claims(path: Path, labels: Optional[Dict[str, List[str]]] = None,
                results: Optional[Path] = None) -> List[Claim]:
    """The claims of a study file (or of a study-less claims file), checked against the grid's labels."""
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    entries = doc.get("claims") or {}
    if not isinstance(entries, dict):
        raise UserError(f"{path}: `claims` must map claim ids to claims")
    out = []
    for cid, raw in entries.items():
        where = f"{path}: claim {cid}"
        if not isinstance(raw, dict):
            raise UserError(f"{where} must be a mapping")
        keys = dict(raw)
        rule = keys.pop("rule", None)
        if rule not in KINDS:
            raise UserError(f"{where}: rule must be one of {', '.join(KINDS)}, got {rule!r}")
        claim = Claim(str(cid), rule, build(KINDS, rule, keys, where), path, results, labels or {})
        claim.spec.check(claim, where)
        out.append(claim)
    ids = {c.id for c in out}
    for c in out:
        for part in c.spec.named_ids:
            if part not in ids:
                raise UserError(f"{path}: claim {c.id} names part {part!r}, which is not a claim of this file")
    return out


# ---------------------------------------------------------------------------------- deciding
def claim_columns(claim: Claim) -> List[str]:
    """The results.csv columns a claim's rule reads (none for a claim made of others)."""
    return claim.spec.columns()


def decide(claim: Claim, rows: List[Row], decided: Optional[Dict[str, rules.Decision]] = None) -> rules.Decision:
    """The claim's rule applied to a study's rows (``decided``: the study's other claims, for one made of them)."""
    return claim.spec.decide(rows, claim, decided or {})


def decide_all(claims: Sequence[Claim], rows: List[Row]) -> Dict[str, rules.Decision]:
    """Every claim of one study, parts before the claims made of them."""
    out: Dict[str, rules.Decision] = {}
    for c in sorted(claims, key=lambda c: bool(c.spec.part_ids)):
        out[c.id] = decide(c, rows, out)
    return out


def with_budgets(claim: Claim, labels: Sequence[str]) -> Claim:
    """A budgets trend restricted to the budgets ``labels`` (its reading on part of its inputs)."""
    return replace(claim, spec=claim.spec.with_budgets(labels))
