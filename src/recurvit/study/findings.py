"""The findings table: every claim of the seed abstracts, with its data, rule, history and verdict.

Claims are declared in the study files (``claims:``, see :mod:`recurvit.study.claims`); claims that no
study here measures (counts, tested identities, what would need ImageNet or a GPU) in the study-less
file ``studies/claims.yaml``. Nothing here trains or evaluates: the table is computed from the
committed ``results/*/results.csv`` (and ``results/accounting/counts.json``),
and whether each rule came before its results is read from the repository's history, against every file
the claim reads (:mod:`recurvit.study.inputs`: a claim reading results from both sides of its rule is
"mixed", decided on the points after its rule and shown on every point beside). A rule met only at a floor
"holds vacuously" (:mod:`recurvit.study.vacuous`); each claim's kind decides it and words its row
(:mod:`recurvit.study.claim_kinds`); a speed-up decides only from a quiet machine, on its
interval, below its compute ceiling (:mod:`recurvit.study.speed`).

    python scripts/findings.py           # writes results/findings.md (and the SoftMoR figure)
    python scripts/findings.py --check   # CI: exit 1 when findings.md is out of date
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import yaml

from ..errors import UserError
from . import rules
from .claim_kinds import KINDS, Trend, build
from .claims import Claim, claim_columns, decide, decide_all, load_claims, with_budgets
from .history import file_commits, rule_came, show
from .inputs import (Input, after_rule, budget_inputs, claim_cells, data_with_seeds, mixed, reads_any,  # noqa: F401
                     seeds_per_cell)
from .registration import CONFIRMATORY, EXPLORATORY, PENDING, Evidence, evidence
from .report import rows_from_csv, rows_from_text
from .spec import load_study

SOURCES = ("Crossroads", "bViT", "SR-ViT", "LoopVAE", "recurvit")  # the table's order: the abstracts' claims first
STUDYLESS = "claims.yaml"
QUALIFIED = "reproduced (qualified)"  # a registered rule met, and its qualification (studies/claims.yaml) too


@dataclass
class Line:
    claim: Claim
    study: str               # the results folder's name ("" for a study-less claim)
    figure: str
    verdict: str
    came: str                # "before" / "after" / "mixed: k before, m after" / "no results yet" / "-"
    evidence: Evidence = Evidence(EXPLORATORY, "")  # confirmatory / registered, pending / exploratory
    data: str = ""           # the row's data with what the files say in it ("": the claim's words)
    all_points: Optional[str] = None  # a mixed row: the verdict on every point (exploratory); ``verdict`` is
    # then the one on the points committed after the rule (a registered study's: the confirmatory reading)


def rule_text(claim: Claim) -> str:
    """How the table names a claim's rule (its kind says)."""
    return claim.spec.rule_text()


def decision_text(claim: Claim, d: rules.Decision) -> str:
    """The row's deciding figure: the claim's label, then what decided it."""
    return claim.spec.decision_text(claim, d)


# --------------------------------------------------------------- history
def _decided_at(root: Path, study: Any, results: Path) -> Callable[[str], Tuple[list, Dict[str, rules.Decision]]]:
    """(rows, the study's claims decided on them) of its results.csv as each commit held it (computed
    once a commit)."""
    rel = str(results.resolve().relative_to(root.resolve()))
    cache: Dict[str, Tuple[list, Dict[str, rules.Decision]]] = {}

    def at(commit: str) -> Tuple[list, Dict[str, rules.Decision]]:
        if commit not in cache:
            text = show(root, commit, rel)
            rows = rows_from_text(text, study) if text else []
            cache[commit] = rows, decide_all(study.claims, rows) if rows else {}
        return cache[commit]

    return at


def _decides(earlier: Callable, commit: str, cid: str) -> bool:
    got = earlier(commit)[1].get(cid)
    return got is not None and got.verdict != rules.NOT_MEASURED


def _reads(earlier: Callable, commit: str, claim: Claim, claims: Dict[str, Claim]) -> bool:
    """Whether the results.csv of ``commit`` holds any run the claim reads (a claim made of others: any
    run one of its parts reads), decided or not: a rule written after seeing one seed came after it."""
    rows = earlier(commit)[0]
    if claim.spec.part_ids:
        return any(_reads(earlier, commit, claims[p], claims) for p in claim.spec.part_ids)
    return reads_any(claim, rows)


def _grown(came: str, claim: Claim, rows: list, earlier: Callable, root: Path, results: Path,
           registered: bool = False) -> str:
    """A rule that came before its results, whose cells got more seeds after a verdict on fewer was
    committed (seeds added after reading, e.g. where the report asked for them; not a cell filled up to the
    seeds the others already had): its p-value and interval hold at their nominal level only, and the row
    says so. Not for a registered study: its n was fixed before any run, its rows stay pending (no verdict)
    until every registered run is in, and a run beyond n makes it exploratory (``registration.py``), so a
    cell filling up to n is the registration carried out, not seeds added after reading."""
    if came != "before" or registered:
        return came
    rel = str(results.resolve().relative_to(root.resolve()))
    first = next((c for c in file_commits(root, rel) if _decides(earlier, c, claim.id)), None)
    if first is None:
        return came
    then, now = seeds_per_cell(claim, earlier(first)[0]), seeds_per_cell(claim, rows)
    if now <= then:
        return came
    return f"before; seeds per cell raised from {then} to {now} after a verdict was committed: nominal level"


def _points(inputs: List[Input], labels: List[str], unit: str) -> str:
    """"3, 10 and 30 epochs: 9 points" of the inputs named ``labels``."""
    mine = [i for i in inputs if i.label in labels]
    names = [i.label for i in mine]
    shown = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{shown}{f' {unit}' if unit else ''}: {sum(i.points for i in mine)} points"


def _mixed(line: Line, c: Claim, rows: list, inputs: List[Input], registered: bool) -> None:
    """A row whose inputs straddle its rule: its verdict on the points committed after the rule alone (a
    registered study's confirmatory reading) beside the one on every point (exploratory)."""
    late = after_rule(inputs)
    early = [i.label for i in inputs if i.points and i.label not in late]
    d_late = decide(with_budgets(c, late), rows)
    unit = c.spec.x_name or ""
    name = "registered points only" if registered else "points committed after the rule only"
    total = sum(i.points for i in inputs)
    line.figure = (f"{name} ({_points(inputs, late, unit)}): {decision_text(c, d_late)}; all {total} points "
                   f"({_points(inputs, early, unit)} committed before the rule): {line.figure}")
    line.all_points, line.verdict = line.verdict, d_late.verdict


def qualifications(root: Path) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """``qualify:`` of the study-less claims file: study file -> claim id -> a ``stopping`` check of that
    claim (its ``a`` and ``figure``) with a control, for a registered claim whose rule may not change."""
    path = root / "studies" / STUDYLESS
    doc = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    out = {}
    for study, claims in (doc.get("qualify") or {}).items():
        for cid, spec in (claims or {}).items():
            if not isinstance(spec, dict) or spec.get("rule") != "stopping" or not spec.get("why"):
                raise UserError(f"{path}: qualify {study} {cid}: a qualification is a stopping check with `why`")
            out[(str(study), str(cid))] = spec
    return out


def _qualify(line: Line, c: Claim, d: rules.Decision, spec: Dict[str, Any], rows: list) -> None:
    """A registered claim's verdict read beside its qualification, computed from the same runs."""
    where = f"{STUDYLESS}: qualify {c.study.name if c.study else ''} {c.id}"
    own = {k: getattr(c.spec, k) for k in ("a", "figure", "scale", "unit") if hasattr(c.spec, k)}
    stop = build(KINDS, "stopping", {"source": c.source, "words": c.words, **own,
                                     **{k: v for k, v in spec.items() if k not in ("rule", "why")}}, where)
    qc = Claim(c.id, "stopping", stop, c.study, c.results, c.labels)
    stop.check(qc, where)
    dq = stop.decide(rows, qc, {})
    line.figure += (f" · qualified ({spec['why']}; read from the same runs, not registered: exploratory): "
                    f"{stop.shown(dq)}")
    if d.verdict == rules.REPRODUCED:
        line.verdict = {rules.REPRODUCED: QUALIFIED, rules.HOLDS_VACUOUSLY: rules.HOLDS_VACUOUSLY}.get(
            dq.verdict, f"reproduced (qualified: {dq.verdict})")


def collect(root: Path) -> List[Line]:
    """Every claim with its verdict: the studies' claims, then the study-less ones, in the sources' order."""
    lines: List[Line] = []
    quals = qualifications(root)
    for path in sorted((root / "studies").glob("*.yaml")):
        if path.name == STUDYLESS:
            continue
        study = load_study(path)
        if not study.claims:
            continue
        results = study.results / "results.csv"
        rows = []
        if results.is_file():
            rows = rows_from_csv(results, study)
        decided = decide_all(study.claims, rows)
        ev = evidence(root, study, study.results, rows)
        earlier = _decided_at(root, study, results)
        by_id = {c.id: c for c in study.claims}
        for c in study.claims:
            d = decided[c.id]
            if ev.status == PENDING:  # a registered study decides once every registered run is in
                figure, verdict = decision_text(c, d) if rows else "no registered run in yet", f"pending ({ev.why})"
            elif not rows:
                figure, verdict = f"`recurvit study {path.relative_to(root)}` has not reported yet", "not measured yet"
            else:
                figure, verdict = decision_text(c, d), d.verdict
                if len(rows) < len(study.runs):  # decided on the runs in so far: say so
                    figure += f" (partial study: {len(rows)} of {len(study.runs)} runs in)"
            came = rule_came(root, path, c.id, results, claim_columns(c), c.spec.seen,
                             lambda commit, claim=c: _reads(earlier, commit, claim, by_id))
            registered = ev.status in (CONFIRMATORY, PENDING)
            line = Line(c, study.results.name, figure, verdict,
                        _grown(came, c, rows, earlier, root, results, registered), ev)
            if isinstance(c.spec, Trend) and c.spec.budgets is not None:  # its inputs: every budget's results
                inputs = budget_inputs(root, c, rows, line.came)
                line.data = data_with_seeds(c.data, inputs)
                line.came = mixed(inputs) or line.came
                if line.came.startswith("mixed") and rows and ev.status != PENDING:
                    _mixed(line, c, rows, inputs, registered)
            q = quals.pop((path.name, c.id), None)
            if q is not None and rows and ev.status != PENDING:
                _qualify(line, c, d, q, rows)
            lines.append(line)
        mine = {ln.claim.id: ln for ln in lines[len(lines) - len(study.claims):]}
        for ln in mine.values():  # a claim made of others came after when a part did, is nominal when one is
            parts = [mine[p].came for p in ln.claim.spec.part_ids]
            if ln.came.startswith("before") and "after" in parts:
                ln.came = "after"
            elif ln.came.startswith("before") and any(p.startswith("mixed") for p in parts):
                ln.came = "mixed: a part reads results committed before its rule"
            elif ln.came == "before" and ln.verdict != rules.NOT_MEASURED:
                ln.came = next((p for p in parts if p.startswith("before;")), ln.came)
    if quals:
        raise UserError(f"studies/{STUDYLESS}: qualify names claim(s) no study declares: "
                        + ", ".join(f"{f} {cid}" for f, cid in quals))
    studyless = root / "studies" / STUDYLESS
    if studyless.is_file():
        for c in load_claims(studyless):
            figure, verdict = c.spec.row(c, root)
            file = c.spec.file_read()  # its figures come from a file: the rule came before or after its first commit
            came = rule_came(root, studyless, c.id, root / file, (), c.spec.seen) if file else "-"
            lines.append(Line(c, "", figure, verdict, came))
    order = {s: i for i, s in enumerate(SOURCES)}
    return sorted(lines, key=lambda ln: order.get(ln.claim.source, len(order)))
