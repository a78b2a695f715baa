"""The rows of the study-less claims file (``studies/claims.yaml``): counts held to the papers' figures,
identities held by a test (run when the table is built), what a claim needs, and targets on a benchmark's
figures."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import List, Sequence, Tuple

from ..errors import UserError
from . import speed
from .claims import Claim
from .targets import per_seed_target

FLAGGED = "not measured: flagged (a speed-up above its compute ceiling)"


def studyless_row(claim: Claim, root: Path, run_tests: bool = True) -> Tuple[str, str]:
    """(figure, verdict) of a study-less claim."""
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
    lower end of the 95% interval of ratio ``name``, and a ratio's bound must read its interval's end):
    **target met** or **target missed**; not measured when the file is absent, when the benchmark's machine
    was loaded or its load is not recorded, without an interval, or when a ratio is above the compute
    ceiling its entry records (:mod:`recurvit.study.speed`)."""
    s = claim.spec
    path = root / s["file"]
    if not path.is_file():
        return f"`{s['command']}` has not run", "not measured yet"
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"claim {claim.id}: {path} is not a benchmark's JSON ({e}); run `{s['command']}` again") from None
    got, notes, flagged = {}, [], []
    for key, bound in s["targets"].items():
        name, _, part = key.rpartition(".") if key.endswith((".lo", ".hi", ".mean")) else (key, "", "")
        if part and part != ("lo" if "min" in bound else "hi"):
            raise UserError(f"claim {claim.id}: a speed target decides on the end of its 95% interval: "
                            f"{name}.{'lo' if 'min' in bound else 'hi'}, not {key}")
        entry = data.get("ratios", {}).get(name) if part else data.get(key)
        v = entry.get(part) if part and isinstance(entry, dict) else entry
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise UserError(f"claim {claim.id}: {path} has no figure {key}")
        got[key] = float(v)
        flag = speed.ratio_flag(entry) if part else ""
        if flag:
            flagged.append(key)
            notes.append(f"{name} {flag} ({entry['rounds']} rounds)")
        elif part:
            notes.append(f"{name} {entry['mean']:.3f} [{entry['lo']:.3f}, {entry['hi']:.3f}] ({entry['rounds']} rounds)")
        else:
            notes.append(f"{key} {v:.3g}")
    figure = f"`{s['command']}`: " + "; ".join(notes)
    state = speed.json_state(data)
    if state == speed.LOADED:
        return figure + " — the machine was loaded: not quotable", state
    if state:
        return figure + " — the benchmark records no load: not quotable", state
    if any(math.isnan(v) for v in got.values()):  # an interval of one round
        return figure + " — no interval (one round)", speed.NO_INTERVAL
    if flagged:
        return figure, FLAGGED
    d = per_seed_target([got], s["targets"])
    return figure, "target met" if d.estimate == 1 else "target missed"
