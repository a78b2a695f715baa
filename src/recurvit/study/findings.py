"""The findings table: every claim of the seed abstracts, with its data, rule, history and verdict.

Claims are declared in the study files (``claims:``, see :mod:`recurvit.study.claims`); claims that no
study here measures (counts, tested identities, what would need ImageNet or a GPU) in the study-less
file ``studies/claims.yaml``. Nothing here trains or evaluates: the table is computed from the
committed ``results/*/results.csv`` (and ``results/accounting/counts.json``),
and whether each rule came before its results is read from the repository's history.

    python scripts/findings.py           # writes results/findings.md (and the SoftMoR figure)
    python scripts/findings.py --check   # CI: exit 1 when findings.md is out of date
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

from ..errors import UserError
from . import rules
from .cells import SEED_KEY, Row, as_number, figure_of, in_cell
from .claims import NOT_TESTED, POOLED, Claim, claim_columns, decide_all, load_claims
from .history import file_commits, rule_came, show
from .registration import CONFIRMATORY, EXPLORATORY, PENDING, Evidence, evidence
from .report import rows_from_csv, rows_from_text
from .spec import load_study
from .stats import fmt_p
from .targets import per_seed_target

SOURCES = ("Crossroads", "bViT", "SR-ViT", "LoopVAE", "recurvit")  # the table's order: the abstracts' claims first
STUDYLESS = "claims.yaml"
RULE_TEXT = {
    "superiority": "superiority (95% interval of the difference on the claimed side)",
    "noninferiority": "non-inferiority, margin {margin}",
    "equivalence": "equivalence, margin ±{margin} (two one-sided tests)",
    "trend": "trend (least-squares slope{over})",
    "near_chance": "near chance, margin {margin}",
    "heterogeneity": "heterogeneity (Welch ANOVA; uniform = pairwise equivalence within ±{margin})",
    "all_of": "all of: {parts}",
    "accounting": "accounting",
    "identity": "identity, tested",
    "needs": "needs",
    "benchmark": "a target on a benchmark's figures: {bounds}",
    "target": "a target met per seed (counted, no mean taken): {bounds}",
}


@dataclass
class Line:
    claim: Claim
    study: str               # the results folder's name ("" for a study-less claim)
    figure: str
    verdict: str
    came: str                # "before" / "after" / "no results yet" / "-"
    evidence: Evidence = Evidence(EXPLORATORY, "")  # confirmatory / registered, pending / exploratory


def _margin(claim: Claim) -> str:
    m = claim.spec.get("margin")
    if m is None:
        return "-"
    return f"{float(m) * claim.scale:g} {claim.unit}".strip()


def rule_text(claim: Claim) -> str:
    s = claim.spec
    axis = s.get("x_name", s.get("axis"))
    over = f" over log2({axis})" if s.get("log2") else f" over {axis}" if axis else ""
    bounds = ", ".join(f"{c} {'≤' if 'max' in b else '≥'} {b.get('max', b.get('min')):g}"
                       for c, b in (s.get("targets") or {}).items())
    text = RULE_TEXT[claim.rule].format(margin=_margin(claim), over=over, parts=", ".join(s.get("parts", [])),
                                        bounds=bounds)
    if claim.rule == "superiority" and s.get("by"):
        text = text.replace("on the claimed side", f"beyond {float(s['by']) * claim.scale:g} {claim.unit}")
    return text


def decision_text(claim: Claim, d: rules.Decision) -> str:
    label = claim.spec.get("label", claim.id)
    if claim.rule == "all_of" or d.verdict == NOT_TESTED:
        return f"{label}: {d.note}" if claim.rule != "all_of" else d.note
    if d.verdict == rules.NOT_MEASURED and d.note.startswith(POOLED):
        return f"{label}: {d.note}"
    if d.verdict == rules.NOT_MEASURED:
        return f"{label}: fewer than 2 runs per cell" if claim.rule != "target" else f"{label}: no run evaluated yet"
    if claim.rule == "target":
        return f"{label}: {d.note}"
    if claim.rule == "near_chance":  # a level, not a difference: no sign, and the chance it is held to
        text = (f"{label}: {d.estimate * claim.scale:.2f}% [{d.lo * claim.scale:.2f}, {d.hi * claim.scale:.2f}], "
                f"p = {fmt_p(d.p)} ({d.note})")
    else:
        text = f"{label}: " + rules.fmt_decision(d, scale=claim.scale, unit=claim.unit)
    n = min(d.n) if d.n else 0
    if not math.isnan(d.seeds_needed) and d.verdict == rules.NOT_SEPARABLE:
        need = "more than 1000" if math.isinf(d.seeds_needed) else f"{d.seeds_needed:.0f}"
        if claim.rule == "trend":  # n counts runs; seeds_needed counts repetitions of the x values
            per = claim.spec.get("x_name") or claim.spec.get("axis", "x")
            text += f" (n = {n} runs; at this effect and spread the rule decides with {need} seeds per {per})"
        else:
            text += f" (n = {n}; at this effect and spread the rule decides with {need} seeds)"
    return text


def _studyless(claim: Claim, root: Path, run_tests: bool = True) -> Tuple[str, str]:
    s = claim.spec
    if claim.rule == "identity":  # test: one test, or a list of them (each must exist, and is run)
        tests = s["test"] if isinstance(s["test"], list) else [s["test"]]
        for test in tests:
            file, _, name = test.partition("::")
            path = root / file
            if not path.is_file() or not re.search(rf"^def {re.escape(name)}\(", path.read_text(), re.M):
                raise UserError(f"claim {claim.id}: test {test} does not exist")
        failing = run_identity_tests(root, tests) if run_tests else []
        figure = ", ".join(f"`{t}`" for t in tests)
        if failing:
            return figure + f" (failing: {', '.join(f'`{t}`' for t in failing)})", "failing"
        return figure, "identity, tested"
    if claim.rule == "accounting":
        return _accounting(claim, root)
    if claim.rule == "benchmark":
        return _benchmark(claim, root)
    return f"`{s['command']}`", f"needs {s['needs']}"


def run_identity_tests(root: Path, tests: Sequence[str]) -> List[str]:
    """Run the identity tests now (pytest, in the repository); the ones that did not pass."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", *tests],
                         cwd=root, capture_output=True, text=True)
    if res.returncode == 0:
        return []
    out = res.stdout + res.stderr
    failed = [t for t in tests if re.search(rf"(FAILED|ERROR) {re.escape(t)}\b", out)]
    return failed or list(tests)


def _accounting(claim: Claim, root: Path) -> Tuple[str, str]:
    """A count at the paper's size against the paper's figure, within ``tolerance`` (relative, e.g. 0.05): the
    row is **within tolerance** or **outside tolerance** (it can fail). ``also``: more counts of the same
    entry held to their paper figures (e.g. the model's size, which a ratio's claim presupposes)."""
    s = claim.spec
    counts_file = root / "results" / "accounting" / "counts.json"
    if not counts_file.is_file():
        return "`python scripts/accounting.py` has not run", "not measured yet"
    entries = {e["claim"]: e for e in json.loads(counts_file.read_text())["claims"]}
    want = s["count"]  # {claim: <entry>, figure: <key of its measured counts>, text: "format {}"}
    entry = entries.get(want["claim"])
    if entry is None or want["figure"] not in entry["measured"]:
        raise UserError(f"claim {claim.id}: {counts_file} has no count {want['claim']}/{want['figure']}")
    got = entry["measured"][want["figure"]]
    text = want["text"].format(*got.values()) if isinstance(got, dict) else want["text"].format(got)
    paper = s.get("paper_value", entry["paper"].get(want.get("paper", want["figure"])))
    tol = s.get("tolerance")
    if tol is None:
        raise UserError(f"claim {claim.id}: an accounting row needs a tolerance (relative, e.g. 0.05)")
    checks = [(want["figure"], got, paper)] + [(f, entry["measured"].get(f), entry["paper"].get(f))
                                               for f in s.get("also", [])]
    worst, notes = 0.0, []
    for figure, value, ref in checks:
        if not isinstance(ref, (int, float)) or value is None:
            raise UserError(f"claim {claim.id}: {figure} needs a measured count and a numeric paper figure "
                            "(paper_value: in the claim where the paper states it in words)")
        for v in (value.values() if isinstance(value, dict) else [value]):
            off = abs(float(v) - ref) / abs(ref)
            worst = max(worst, off)
            notes.append(f"{figure} {v:,.4g} vs paper {ref:,.4g}: {100 * off:.1f}% off")
    verdict = "within tolerance" if worst <= float(tol) else "outside tolerance"
    return f"{text} ({'; '.join(notes)}; tolerance {100 * float(tol):g}%)", verdict


def _benchmark(claim: Claim, root: Path) -> Tuple[str, str]:
    """A project's target on the figures of a benchmark's JSON (``file``; a figure ``"name.lo"`` reads the
    lower end of the 95% interval of ratio ``name``): **target met** or **target missed**; not measured when
    the file is absent or the benchmark found its machine loaded (its speeds are then not quotable)."""
    s = claim.spec
    path = root / s["file"]
    if not path.is_file():
        return f"`{s['command']}` has not run", "not measured yet"
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"claim {claim.id}: {path} is not a benchmark's JSON ({e}); run `{s['command']}` again") from None
    got, notes = {}, []
    for key in s["targets"]:
        name, _, part = key.rpartition(".") if key.endswith((".lo", ".hi", ".mean")) else (key, "", "")
        entry = data.get("ratios", {}).get(name) if part else data.get(key)
        v = entry.get(part) if part and isinstance(entry, dict) else entry
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise UserError(f"claim {claim.id}: {path} has no figure {key}")
        got[key] = float(v)
        if part:
            notes.append(f"{name} {entry['mean']:.3f} [{entry['lo']:.3f}, {entry['hi']:.3f}] ({entry['rounds']} rounds)")
        else:
            notes.append(f"{key} {v:.3g}")
    figure = f"`{s['command']}`: " + "; ".join(notes)
    if data.get("loaded"):
        return figure + " — the machine was loaded: not quotable", "not measured (machine loaded)"
    if any(math.isnan(v) for v in got.values()):  # an interval of one round
        return figure + " — no interval (one round)", "not measured (no interval)"
    d = per_seed_target([got], s["targets"])
    return figure, "target met" if d.estimate == 1 else "target missed"


# --------------------------------------------------------------- which runs a claim reads (history)
def claim_cells(claim: Claim) -> List[Dict[str, Any]]:
    """The cells whose runs a claim reads (none for a claim made of others)."""
    s = claim.spec
    cells = [s[k] for k in ("a", "b") if isinstance(s.get(k), dict)] + list((s.get("groups") or {}).values())
    if claim.rule == "trend" and "budgets" in s:  # its own study's runs: the cells a and b
        return [s.get("a", {})] + ([s["b"]] if "b" in s else [])
    if claim.rule == "trend":
        cells = [{s["axis"]: label, **side} for label in s["x"] for side in ([s.get("a", {})] + (
            [s["b"]] if "b" in s else []))]
    return cells


def _has_figure(claim: Claim, row: Row) -> bool:
    if claim.rule == "target":
        return any(as_number(row.get(c)) is not None for c in claim.spec["targets"])
    return figure_of(row, claim.spec.get("figure", "acc_T")) is not None


def reads_any(claim: Claim, rows: Iterable[Row]) -> bool:
    """Whether ``rows`` hold any run of the claim's cells with its figure (results it reads, decided or not)."""
    cells = claim_cells(claim)
    return any(_has_figure(claim, r) for r in rows if any(in_cell(r, c) for c in cells))


def seeds_per_cell(claim: Claim, rows: Iterable[Row]) -> int:
    """The most seeds any one of the claim's cells has with its figure among ``rows`` (0 for a claim made
    of others)."""
    rows = [r for r in rows if _has_figure(claim, r)]
    return max((len({str(r.get(SEED_KEY, r.get("seed"))) for r in rows if in_cell(r, cell)})
                for cell in claim_cells(claim)), default=0)


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
    if claim.rule == "all_of":
        return any(_reads(earlier, commit, claims[p], claims) for p in claim.spec["parts"])
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


def collect(root: Path) -> List[Line]:
    """Every claim with its verdict: the studies' claims, then the study-less ones, in the sources' order."""
    lines: List[Line] = []
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
            came = rule_came(root, path, c.id, results, claim_columns(c), c.spec.get("seen", ()),
                             lambda commit, claim=c: _reads(earlier, commit, claim, by_id))
            registered = ev.status in (CONFIRMATORY, PENDING)
            lines.append(Line(c, study.results.name, figure, verdict,
                              _grown(came, c, rows, earlier, root, results, registered), ev))
        mine = {ln.claim.id: ln for ln in lines[len(lines) - len(study.claims):]}
        for ln in mine.values():  # a claim made of others came after when a part did, is nominal when one is
            parts = [mine[p].came for p in ln.claim.spec.get("parts", ())]
            if ln.came.startswith("before") and "after" in parts:
                ln.came = "after"
            elif ln.came == "before" and ln.verdict != rules.NOT_MEASURED:
                ln.came = next((p for p in parts if p.startswith("before;")), ln.came)
    studyless = root / "studies" / STUDYLESS
    if studyless.is_file():
        for c in load_claims(studyless):
            figure, verdict = _studyless(c, root)
            came = "-"
            if c.rule == "benchmark":  # its figures come from a file: the rule came before or after its first commit
                came = rule_came(root, studyless, c.id, root / c.spec["file"], (), c.spec.get("seen", ()))
            lines.append(Line(c, "", figure, verdict, came))
    order = {s: i for i, s in enumerate(SOURCES)}
    return sorted(lines, key=lambda ln: order.get(ln.claim.source, len(order)))
