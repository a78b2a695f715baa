"""The kinds of the study-less claims file (``studies/claims.yaml``): claims no study here can measure.
Counts held to the papers' figures (``accounting``), identities held by a test that runs when the table is
built (``identity``), what a claim needs and the command that would test it (``needs``), and targets on a
benchmark's figures (``benchmark``). Each gives its row as (figure, verdict) from the repository (:meth:`row`)."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import UserError
from .. import speed
from ..targets import per_seed_target
from .base import BOUNDS, Kind, an, bounds_ok, bounds_text, key

FLAGGED = "not measured: flagged (a speed-up above its compute ceiling)"


@dataclass
class RowKind(Kind):
    """A study-less claim: its row comes from the repository, not from a study's runs."""

    def check(self, claim: Any, where: str) -> None:
        super().check(claim, where)
        if claim.labels:
            raise UserError(f"{where}: {an(claim.rule)} claim belongs in the study-less claims file")

    def row(self, claim: Any, root: Path, run_tests: bool = True) -> Tuple[str, str]:
        """(figure, verdict) of its row."""
        raise NotImplementedError

    def file_read(self) -> Optional[str]:
        """The file its figures come from (from the repository's root), whose first commit its rule is
        read against; None for a row without one."""
        return None


@dataclass
class Needs(RowKind):
    """What a claim needs that this machine lacks, and the command that would test it."""

    needs: str = key(help="what it needs, e.g. ImageNet-1K and GPU time")
    command: str = key(help="the command that would test it")

    def row(self, claim: Any, root: Path, run_tests: bool = True) -> Tuple[str, str]:
        return f"`{self.command}`", f"needs {self.needs}"

    def rule_text(self) -> str:
        return "needs"


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


@dataclass
class Identity(RowKind):
    """An exact identity held by a test (or several), each of which must exist and is run."""

    test: Any = key(help="tests/file.py::test, or a list of them")

    def check(self, claim: Any, where: str) -> None:
        super().check(claim, where)
        tests = self.test if isinstance(self.test, list) else [self.test]
        if not tests or not all(isinstance(t, str) and "::" in t for t in tests):
            raise UserError(f"{where}: `test` names tests/file.py::test, or a list of them")

    def row(self, claim: Any, root: Path, run_tests: bool = True) -> Tuple[str, str]:
        tests = self.test if isinstance(self.test, list) else [self.test]
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

    def rule_text(self) -> str:
        return "identity, tested"


@dataclass
class Count:
    """Which count of ``results/accounting/counts.json`` a row reads, and how its row prints it."""

    claim: str = key(help="the counts file's entry")
    figure: str = key(help="the key of its measured counts")
    text: str = key(help="how the row prints it: a format with {}")
    paper: Optional[str] = key(None, "the key of the paper's figure (default: figure)")


@dataclass
class Accounting(RowKind):
    """A count at the paper's size against the paper's figure, within ``tolerance`` (relative, e.g. 0.05): the
    row is **within tolerance** or **outside tolerance** (it can fail). ``also``: more counts of the same
    entry held to their paper figures (e.g. the model's size, which a ratio's claim presupposes)."""

    count: Count = key(help="{claim: entry, figure: its measured count, text: 'format {}'}")
    tolerance: float = key(help="relative, e.g. 0.05")
    paper_value: Optional[float] = key(None, "the paper's figure, where the paper states it in words")
    also: List[str] = key(help="more measured counts of the entry held to their paper figures", factory=list)

    def row(self, claim: Any, root: Path, run_tests: bool = True) -> Tuple[str, str]:
        counts_file = root / "results" / "accounting" / "counts.json"
        if not counts_file.is_file():
            return "`python scripts/accounting.py` has not run", "not measured yet"
        entries = {e["claim"]: e for e in json.loads(counts_file.read_text())["claims"]}
        want = self.count
        entry = entries.get(want.claim)
        if entry is None or want.figure not in entry["measured"]:
            raise UserError(f"claim {claim.id}: {counts_file} has no count {want.claim}/{want.figure}")
        got = entry["measured"][want.figure]
        text = want.text.format(*got.values()) if isinstance(got, dict) else want.text.format(got)
        paper = self.paper_value if self.paper_value is not None else entry["paper"].get(want.paper or want.figure)
        checks = [(want.figure, got, paper)] + [(f, entry["measured"].get(f), entry["paper"].get(f))
                                                for f in self.also]
        worst, notes = 0.0, []
        for figure, value, ref in checks:
            if not isinstance(ref, (int, float)) or value is None:
                raise UserError(f"claim {claim.id}: {figure} needs a measured count and a numeric paper figure "
                                "(paper_value: in the claim where the paper states it in words)")
            for v in (value.values() if isinstance(value, dict) else [value]):
                off = abs(float(v) - ref) / abs(ref)
                worst = max(worst, off)
                notes.append(f"{figure} {v:,.4g} vs paper {ref:,.4g}: {100 * off:.1f}% off")
        verdict = "within tolerance" if worst <= float(self.tolerance) else "outside tolerance"
        return f"{text} ({'; '.join(notes)}; tolerance {100 * float(self.tolerance):g}%)", verdict

    def rule_text(self) -> str:
        return "accounting"


@dataclass
class Benchmark(RowKind):
    """A project's target on the figures of a benchmark's JSON (``file``; a figure ``"name.lo"`` reads the
    lower end of the 95% interval of ratio ``name``, and a ratio's bound must read its interval's end):
    **target met** or **target missed**; not measured when the file is absent, when the benchmark's machine
    was loaded or its load is not recorded, without an interval, or when a ratio is above the compute
    ceiling its entry records (:mod:`recurvit.study.speed`)."""

    file: str = key(help="the benchmark's JSON, from the repository's root")
    command: str = key(help="what writes it")
    targets: Dict[str, Dict[str, float]] = key(help=BOUNDS)

    def check(self, claim: Any, where: str) -> None:
        if not bounds_ok(self.targets):
            raise UserError(f"{where}: a benchmark claim needs `targets` mapping figures to {{max: number}} or "
                            "{min: number}")
        if not self.file or not self.command:
            raise UserError(f"{where}: a benchmark claim needs `file` (its JSON) and `command` (what writes it)")
        super().check(claim, where)

    def file_read(self) -> Optional[str]:
        return self.file

    def _figures(self, claim: Any, path: Path, data: Dict[str, Any]):
        got, notes, flagged = {}, [], []
        for name_key, bound in self.targets.items():
            name, _, part = name_key.rpartition(".") if name_key.endswith((".lo", ".hi", ".mean")) \
                else (name_key, "", "")
            if part and part != ("lo" if "min" in bound else "hi"):
                raise UserError(f"claim {claim.id}: a speed target decides on the end of its 95% interval: "
                                f"{name}.{'lo' if 'min' in bound else 'hi'}, not {name_key}")
            entry = data.get("ratios", {}).get(name) if part else data.get(name_key)
            v = entry.get(part) if part and isinstance(entry, dict) else entry
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise UserError(f"claim {claim.id}: {path} has no figure {name_key}")
            got[name_key] = float(v)
            flag = speed.ratio_flag(entry) if part else ""
            if flag:
                flagged.append(name_key)
                notes.append(f"{name} {flag} ({entry['rounds']} rounds)")
            elif part:
                notes.append(f"{name} {entry['mean']:.3f} [{entry['lo']:.3f}, {entry['hi']:.3f}] "
                             f"({entry['rounds']} rounds)")
            else:
                notes.append(f"{name_key} {v:.3g}")
        return got, notes, flagged

    def row(self, claim: Any, root: Path, run_tests: bool = True) -> Tuple[str, str]:
        path = root / self.file
        if not path.is_file():
            return f"`{self.command}` has not run", "not measured yet"
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise UserError(f"claim {claim.id}: {path} is not a benchmark's JSON ({e}); run `{self.command}` "
                            "again") from None
        got, notes, flagged = self._figures(claim, path, data)
        figure = f"`{self.command}`: " + "; ".join(notes)
        state = speed.json_state(data)
        if state == speed.LOADED:
            return figure + " — the machine was loaded: not quotable", state
        if state:
            return figure + " — the benchmark records no load: not quotable", state
        if any(math.isnan(v) for v in got.values()):  # an interval of one round
            return figure + " — no interval (one round)", speed.NO_INTERVAL
        if flagged:
            return figure, FLAGGED
        d = per_seed_target([got], self.targets)
        return figure, "target met" if d.estimate == 1 else "target missed"

    def rule_text(self) -> str:
        return f"a target on a benchmark's figures: {bounds_text(self.targets)}"
