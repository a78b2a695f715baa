"""Claims: what a study is run to decide, declared next to its grid.

A study file may carry a ``claims:`` section, one entry a claim of a seed abstract::

    claims:
      matched_flops:
        source: Crossroads                      # which abstract
        words: standard ViTs remain preferable when FLOPs are the constraint
        data: Fashion-MNIST                     # the data the row's runs use
        rule: superiority                       # a rule kind of recurvit.study.rules (below)
        figure: acc_T                           # a results.csv column (see ``figure`` forms below)
        a: {regime: vit_matched_flops}          # the cells compared: grid labels, axis -> label
        b: {regime: naive}
        side: +1                                # superiority / trend: the claimed sign of a - b
        label: ViT (matched FLOPs) − bViT       # how the table names the deciding figure

Rule kinds and their keys (margins are in the figure's own units: accuracy as a fraction):

- ``superiority`` (``a``, ``b``, ``side``, optional ``paired``, optional ``by``): the 95% interval of a − b on the
  claimed side (of ``by``, a size the claim states, e.g. 0.01 for "more than a point").
- ``noninferiority`` (``a``, ``b``, ``margin``): a is not worse than b by more than ``margin``.
- ``equivalence`` (``a``, ``b``, ``margin``): two one-sided tests; how a "no gain" claim is decided.
  With ``b`` left out, ``a``'s values are themselves differences (a per-run figure such as
  ``variant_refine_h/4 - acc_T``), tested against 0.
- ``trend`` (``axis``, ``x``: label -> number, optional ``log2``; ``a`` and, for a paired gap a − b at
  each x, ``b`` with ``paired: true``): the least-squares slope over x, every run one point; not measured
  below 3 distinct x.
  With ``budgets`` (x -> a results folder, relative to the study file) instead of ``axis``, each x's runs
  are that folder's cells ``a`` (and ``b``): a trend over studies that differ only in their budget.
- ``near_chance`` (``a``, ``margin``, optional ``chance``, else the rows' ``chance`` column).
- ``heterogeneity`` (``groups``: name -> cells, ``margin``): the groups' means are not all equal.
- ``target`` (``a``, ``targets``: column -> ``{max: v}`` or ``{min: v}``): a project's own target, met
  per seed or not (every seed of ``a`` is checked against every bound and counted; no mean is taken).
- ``all_of`` (``parts``: claim ids of the same study, optional ``qualified: {when: [ids], verdict: ...}``):
  not measured when any part is, reproduced when every part is, not reproduced when any part is not;
  ``qualified`` names the verdict when the claim as a whole is not reproduced but the parts in ``when``
  are (never while another part is not measured or not separable: it could still hold); it holds
  vacuously when every part holds, some only vacuously.
- ``stopping`` (``a``, ``figure``, ``iters``, ``solved``, optional ``cap`` and ``control``): a per-input stopping
  rule's iterations grow with size where the inputs it stopped on were solved, and beyond a control cell
  that solves nothing (:mod:`recurvit.study.vacuous`).

Any comparison or level may name ``floor`` (results columns -> the value at which its rule holds whatever
the model does: it then "holds vacuously", never "reproduced") and ``sizes`` (one comparison decided at
each size, ``{size}`` in its figure, floor and label; one claim, counted once): :mod:`recurvit.study.vacuous`.
A target's speed-up bounds are read through :mod:`recurvit.study.speed` (load, interval, compute ceiling).

A ``figure`` is a column, ``"col_a - col_b"`` (per run), or a mapping
``{mean_of: [cols], minus: col, skip_own: axis}``: the per-run mean of the columns less ``minus``,
leaving out the column that ends in the run's own label on ``axis`` (for example each solver's own
evaluation in a train-solver x eval-solver matrix).

Claims that no study here can measure live in a study-less claims file with kinds ``accounting``
(a count of :mod:`scripts.accounting` against the paper's figure), ``identity`` (a test that holds an
exact identity, named ``tests/file.py::test``), ``needs`` (what it needs, and the command that
would test it) and ``benchmark`` (``file``: a benchmark's JSON of figures, ``command``: what writes it,
``targets``: figure -> ``{max: v}`` or ``{min: v}``, a figure named ``"ratio.lo"`` (``max``: ``.hi``) for a key
of one of its ratios; met or missed, and not measured where its machine was loaded or its load is not
recorded, or a ratio is above the compute ceiling it records: :mod:`recurvit.study.speed`). The study-less
file's ``qualify:`` reads a registered claim, whose rule may not change, beside a ``stopping`` check from the
same runs (:func:`recurvit.study.findings.qualifications`).

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

import csv
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from ..errors import UserError
from . import rules, vacuous
from .cells import SEED_KEY, Row, as_number, by_seed, figure_columns, in_cell, pair, values
from .claim_checks import ROW_KINDS, check_claim
from .targets import decide_target

RULE_KINDS = ("superiority", "noninferiority", "equivalence", "trend", "near_chance", "heterogeneity", "target",
              "all_of", "stopping")
NOT_TESTED = "not tested (the reference did not train)"
KEYS = {"source", "words", "data", "rule", "figure", "a", "b", "side", "margin", "by", "paired", "label", "axis", "x",
        "log2", "x_name", "chance", "groups", "parts", "qualified", "scale", "unit", "count", "paper", "test", "needs",
        "command", "note", "reference_baseline", "targets", "seen", "budgets",
        "tolerance", "also", "paper_value", "file", "sizes", "floor", "control", "iters", "solved", "cap"}


@dataclass
class Claim:
    id: str
    source: str
    words: str
    rule: str
    spec: Dict[str, Any]
    study: Optional[Path] = None          # the study file that declares it
    results: Optional[Path] = None        # that study's results folder
    labels: Dict[str, List[str]] = field(default_factory=dict)  # the study's grid: axis -> labels

    @property
    def data(self) -> str:
        return self.spec.get("data", "")

    @property
    def scale(self) -> float:
        return float(self.spec.get("scale", 100.0))

    @property
    def unit(self) -> str:
        return self.spec.get("unit", "points")


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
    for cid, spec in entries.items():
        where = f"{path}: claim {cid}"
        if not isinstance(spec, dict):
            raise UserError(f"{where} must be a mapping")
        unknown = sorted(set(spec) - KEYS)
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}")
        rule = spec.get("rule")
        if rule not in RULE_KINDS + ROW_KINDS:
            raise UserError(f"{where}: rule must be one of {', '.join(RULE_KINDS + ROW_KINDS)}, got {rule!r}")
        for key in ("source", "words"):
            if not spec.get(key):
                raise UserError(f"{where}: `{key}` is missing")
        claim = Claim(str(cid), spec["source"], spec["words"], rule, spec, path, results, labels or {})
        check_claim(claim, where)
        out.append(claim)
    ids = {c.id for c in out}
    for c in out:
        for part in c.spec.get("parts", []) + (c.spec.get("qualified") or {}).get("when", []):
            if part not in ids:
                raise UserError(f"{path}: claim {c.id} names part {part!r}, which is not a claim of this file")
    return out


# ---------------------------------------------------------------------------------- figures
def claim_figures(claim: Claim) -> List[Any]:
    """The figures a claim reads: its figure, or one a size (``sizes``)."""
    fig = claim.spec.get("figure", "acc_T")
    return [vacuous.with_size(claim.spec, size)["figure"] for size in claim.spec["sizes"]] if "sizes" in claim.spec \
        else [fig]


def claim_columns(claim: Claim) -> List[str]:
    """The results.csv columns a claim's rule reads (none for a claim made of others)."""
    if claim.rule == "all_of":
        return []
    if claim.rule == "target":
        return list(claim.spec["targets"])
    return [c for fig in claim_figures(claim) for c in figure_columns(fig)]


# ---------------------------------------------------------------------------------- deciding
def decide(claim: Claim, rows: List[Row], decided: Optional[Dict[str, rules.Decision]] = None) -> rules.Decision:
    """The claim's rule applied to a study's rows (``decided``: the study's other claims, for ``all_of``): one
    decision a size with ``sizes``, "holds vacuously" where met only at its ``floor``."""
    if "sizes" in claim.spec:
        return vacuous.of_sizes([(vacuous.size_name(size), decide(
            replace(claim, spec=vacuous.with_size(claim.spec, size)), rows, decided)) for size in claim.spec["sizes"]])
    if claim.rule == "all_of":
        return _all_of(claim, decided or {})
    if claim.rule == "stopping":
        return vacuous.stopping(claim.spec, rows)
    return vacuous.vacuous(_decide(claim, rows), claim.spec, rows)


def _decide(claim: Claim, rows: List[Row]) -> rules.Decision:
    s, fig = claim.spec, claim.spec.get("figure", "acc_T")
    paired = bool(s.get("paired", False))
    if claim.rule == "trend":
        xs, ys = [], []
        for _, x, got in trend_values(claim, rows):
            xs += [float(x)] * len(got)
            ys += [v for _, v in got]
        return rules.trend(xs, ys, side=int(s.get("side", 1)), log2_x=bool(s.get("log2", False)))
    if claim.rule == "heterogeneity":
        groups = {name: [v for _, v in values(rows, cell, fig)] for name, cell in s["groups"].items()}
        return rules.heterogeneity(groups, float(s["margin"]))
    if claim.rule == "target":
        cell = sorted((r for r in rows if in_cell(r, s["a"])), key=lambda r: str(r.get(SEED_KEY, r.get("seed"))))
        return decide_target(cell, s["targets"])
    a = values(rows, s["a"], fig)
    unfilled = _unfilled_labels(rows, s["a"], fig) + (_unfilled_labels(rows, s["b"], fig) if "b" in s else [])
    if unfilled:
        return rules.Decision(rules.NOT_MEASURED, math.nan, math.nan, math.nan, math.nan, (len(a),), math.nan,
                              note=f"{POOLED} {', '.join(unfilled)}")
    untrained = _reference_untrained(claim, rows)
    if untrained:
        return rules.Decision(NOT_TESTED, math.nan, math.nan, math.nan, math.nan, (), math.nan, note=untrained)
    if claim.rule == "near_chance":
        chance = s.get("chance")
        if chance is None:
            found = [as_number(r.get("chance")) for r in rows if in_cell(r, s["a"])]
            found = [c for c in found if c is not None]
            chance = found[0] if found else math.nan
        return rules.near_chance([v for _, v in a], float(chance), float(s["margin"]))
    if "b" in s:
        x, y = pair(a, values(rows, s["b"], fig), paired)
    else:  # a's values are differences already: test them against 0
        x, y, paired = [v for _, v in a], [0.0] * len(a), True
    if claim.rule == "superiority":
        return rules.superiority(x, y, side=int(s.get("side", 1)), paired=paired, by=float(s.get("by", 0.0)))
    if claim.rule == "noninferiority":
        return rules.noninferiority(x, y, float(s["margin"]), paired=paired)
    return rules.equivalence(x, y, float(s["margin"]), paired=paired)


def budget_folder(claim: Claim, folder: Any) -> Path:
    """A ``budgets`` entry's results folder (relative to the study file)."""
    return (claim.study.parent / str(folder)).resolve() if claim.study else Path(str(folder))


def _trend_points(claim: Claim, rows: List[Row]):
    """(label, x, the rows it reads, the cell that picks its x) of each point of a trend claim: a grid axis's
    labels, or with ``budgets`` the runs of each named results folder (this study's own rows for its own)."""
    s = claim.spec
    if "budgets" not in s:
        return [(label, x, rows, {s["axis"]: label}) for label, x in s["x"].items()]
    out = []
    for x, folder in s["budgets"].items():
        where = budget_folder(claim, folder)
        if claim.results is not None and where == Path(claim.results).resolve():
            here = rows
        else:
            csv_path = where / "results.csv"
            here = list(csv.DictReader(csv_path.open())) if csv_path.is_file() else []
        out.append((str(x), float(x), here, {}))
    return out


def trend_values(claim: Claim, rows: List[Row]) -> List[Tuple[str, float, List[Tuple[str, float]]]]:
    """(x label, x, [(seed, value)]) of each x of a trend claim: a's figure, or the paired gap a - b per seed."""
    s, fig = claim.spec, claim.spec.get("figure", "acc_T")
    out = []
    for label, x, here, cell in _trend_points(claim, rows):
        a = values(here, {**cell, **s.get("a", {})}, fig)
        if "b" in s:
            da, db = by_seed(a, "a"), by_seed(values(here, {**cell, **s["b"]}, fig), "b")
            got = [(seed, da[seed] - db[seed]) for seed in sorted(da.keys() & db.keys())]
        else:
            got = a
        out.append((label, x, got))
    return out


def with_budgets(claim: Claim, labels: Sequence[str]) -> Claim:
    """A budgets trend restricted to the budgets ``labels`` (its reading on part of its inputs)."""
    return replace(claim, spec={**claim.spec, "budgets": {x: f for x, f in claim.spec["budgets"].items()
                                                          if str(x) in set(labels)}})


POOLED = "fewer than 2 runs yet of the pooled label(s)"


def _unfilled_labels(rows: List[Row], cell: Mapping[str, Any], figure: Any) -> List[str]:
    """The labels of a pooled cell (an axis given as a list, e.g. ``solver: [midpoint, heun3, rk4]``) with
    fewer than 2 runs that have the figure, as ``"solver = rk4"``. A claim about several cells is not
    decided on the runs of some of them: "higher-order fields" read from midpoint alone would be a claim
    about midpoint under the pooled label."""
    out = []
    for axis, label in cell.items():
        if isinstance(label, list):
            for one in label:
                if len(values(rows, {**cell, axis: one}, figure)) < 2:
                    out.append(f"{axis} = {one}")
    return out


def _reference_untrained(claim: Claim, rows: List[Row]) -> str:
    """A comparison against a reference that did not learn tests nothing: with
    ``reference_baseline: {column: baseline_psnr, margin: 1.0}`` the claim is "not tested" when b's mean
    figure is within ``margin`` of b's mean baseline column (e.g. a VAE still at the mean image)."""
    ref = claim.spec.get("reference_baseline")
    if not ref or "b" not in claim.spec:
        return ""
    got = [v for _, v in values(rows, claim.spec["b"], claim.spec.get("figure", "acc_T"))]
    base = [v for _, v in values(rows, claim.spec["b"], ref["column"])]
    if not got or not base or statistics.fmean(got) >= statistics.fmean(base) + float(ref["margin"]):
        return ""
    return (f"the reference is at its baseline ({statistics.fmean(got) * claim.scale:.2f} vs "
            f"{statistics.fmean(base) * claim.scale:.2f} {claim.unit}): it did not train")


def _all_of(claim: Claim, decided: Dict[str, rules.Decision]) -> rules.Decision:
    parts = [decided[p] for p in claim.spec["parts"]]
    verdicts = [d.verdict for d in parts]
    if any(v == rules.NOT_MEASURED for v in verdicts):
        verdict = rules.NOT_MEASURED
    elif all(v == rules.REPRODUCED for v in verdicts):
        verdict = rules.REPRODUCED
    elif all(v in (rules.REPRODUCED, rules.HOLDS_VACUOUSLY) for v in verdicts):
        verdict = rules.HOLDS_VACUOUSLY
    elif any(v == rules.NOT_REPRODUCED for v in verdicts):
        verdict = rules.NOT_REPRODUCED
    else:
        verdict = rules.NOT_SEPARABLE
    q = claim.spec.get("qualified")
    if q and verdict == rules.NOT_REPRODUCED and all(decided[p].verdict == rules.REPRODUCED for p in q["when"]):
        verdict = q["verdict"]
    return rules.Decision(verdict, math.nan, math.nan, math.nan, math.nan, (), math.nan,
                          note="parts: " + ", ".join(f"{p} {d.verdict}" for p, d in zip(claim.spec["parts"], parts)))


def decide_all(claims: Sequence[Claim], rows: List[Row]) -> Dict[str, rules.Decision]:
    """Every claim of one study, parts before the claims made of them."""
    out: Dict[str, rules.Decision] = {}
    for c in sorted(claims, key=lambda c: c.rule == "all_of"):
        out[c.id] = decide(c, rows, out)
    return out
