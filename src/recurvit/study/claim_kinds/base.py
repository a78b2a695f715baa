"""What every claim kind shares: its keys declared as typed fields (:func:`key`), read from a study file by
OmegaConf's structured configs (:func:`build`: an unknown key, a key of another kind, a missing key or a value
of the wrong type is one line naming the claim, the key and the kind), and the row text a decision is shown
with (:meth:`StudyKind.shown`).

Bases: :class:`Kind` (every claim: source, words, data, seen), :class:`StudyKind` (a claim decided on a
study's rows: label, scale, unit), :class:`OnFigure` (one that reads a ``figure``) and :class:`Floored` (one
whose rule a ``floor`` can meet whatever the model does: it then holds vacuously).
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from ...errors import UserError
from .. import rules, vacuous
from ..cells import SEED_KEY, Row, figure_columns, figure_of, in_cell

NOT_TESTED = "not tested (the reference did not train)"
POOLED = "fewer than 2 runs yet of the pooled label(s)"
CELL = "a cell: grid axis -> label (or a list of labels, pooled)"
BOUNDS = "figure -> {max: number} or {min: number}"


def key(default: Any = MISSING, help: str = "", factory: Any = None) -> Any:
    """A claim's key: its default (none given: the key is required) and what it is, which its errors quote."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def an(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def bounds_ok(bounds: Any) -> bool:
    """Whether ``bounds`` maps figures to exactly one of ``{max: number}`` / ``{min: number}``."""
    return isinstance(bounds, dict) and bool(bounds) and all(
        isinstance(b, dict) and len(b) == 1 and set(b) <= {"max", "min"} and all(is_number(v) for v in b.values())
        for b in bounds.values())


def bounds_text(bounds: Mapping[str, Mapping[str, float]]) -> str:
    return ", ".join(f"{c} {'≤' if 'max' in b else '≥'} {b.get('max', b.get('min')):g}" for c, b in bounds.items())


# ------------------------------------------------------------------------------------------- reading
def _escaped(value: Any) -> Any:
    """A claim's values with ``${`` kept as text (OmegaConf would read it as an interpolation: a command's
    shell variable)."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {k: _escaped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    return value


def _help(cls: type, name: str) -> str:
    f = next((f for f in fields(cls) if f.name == name.split(".")[0]), None)
    return f.metadata.get("help", "") if f is not None else ""


def _error(e: OmegaConfBaseException, cls: type, rule: str, table: Mapping[str, type], where: str) -> str:
    """One line for an OmegaConf error: the claim (``where``), the key and the kind."""
    name = str(getattr(e, "full_key", "") or "")
    top = name.split(".")[0]
    own = [f.name for f in fields(cls)]
    if isinstance(e, ConfigKeyError) and "." not in name:
        owners = [k for k, c in table.items() if top in {f.name for f in fields(c)}]
        if owners:
            return f"{where}: `{name}` belongs to {an(', '.join(owners))} claim, not {an(rule)} claim"
        near = difflib.get_close_matches(name, own, n=1)
        hint = f" (did you mean `{near[0]}`?)" if near else f" (its keys: {', '.join(own)})"
        return f"{where}: unknown key `{name}` for {an(rule)} claim{hint}"
    what = _help(cls, top)
    what = f" ({what})" if what else ""
    if isinstance(e, MissingMandatoryValue):
        return f"{where}: {an(rule)} claim needs `{name}`{what}"
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, ConfigKeyError):
        return f"{where}: unknown key `{name}` for {an(rule)} claim: {msg}"
    return f"{where}: `{name}` of {an(rule)} claim{what}: {msg}"


def structured(cls: type, raw: Mapping[str, Any]) -> Any:
    """``cls`` (a dataclass) filled from a mapping read from YAML, by OmegaConf's structured configs: an unknown
    key, a missing one (no default) or a value of the wrong type raises its ``OmegaConfBaseException``, whose
    ``full_key`` names the key (a whole section of the wrong type included)."""
    cfg = OmegaConf.structured(cls)
    for name, value in _escaped(dict(raw)).items():
        try:
            cfg.merge_with({name: value})
        except OmegaConfBaseException as e:
            if not getattr(e, "full_key", None):
                e.full_key = str(name)
            raise
    return OmegaConf.to_object(cfg)


def build(table: Mapping[str, type], rule: str, raw: Mapping[str, Any], where: str) -> "Kind":
    """The typed claim of kind ``rule`` (a class of ``table``) from a study file's mapping (without ``rule``)."""
    cls = table[rule]
    try:
        return structured(cls, raw)
    except OmegaConfBaseException as e:
        raise UserError(_error(e, cls, rule, table, where)) from None


# ---------------------------------------------------------------------------------------------- kinds
@dataclass
class Kind:
    """Every claim: which abstract (``source``), its words, the data its row names and the earlier results
    files that held the same figures (``seen``, paths from the repository's root)."""

    source: str = key(help="which abstract it comes from")
    words: str = key(help="the claim in its abstract's words")
    data: str = key("", "the data the row's runs use")
    seen: List[str] = key(help="earlier results files that held the same figures", factory=list)

    def check(self, claim: Any, where: str) -> None:
        """What the types cannot say, against the claim's place (``claim.labels``: its study's grid)."""
        for name in ("source", "words"):
            if not getattr(self, name):
                raise UserError(f"{where}: `{name}` is missing")

    def rule_text(self) -> str:
        """How the findings table names the rule."""
        raise NotImplementedError

    @property
    def part_ids(self) -> Tuple[str, ...]:
        """The claims of the same study it is made of (decided before it)."""
        return ()

    @property
    def named_ids(self) -> Tuple[str, ...]:
        """Every claim id it names (each must be a claim of the same file)."""
        return self.part_ids


@dataclass
class StudyKind(Kind):
    """A claim decided on its study's rows: how its row labels the deciding figure and prints it."""

    label: Optional[str] = key(None, "how the table names the deciding figure")
    scale: float = key(100.0, "what the figure is multiplied by when printed (accuracy: 100)")
    unit: str = key("points", "the printed figure's unit")

    def check(self, claim: Any, where: str) -> None:
        super().check(claim, where)
        if not claim.labels:
            raise UserError(f"{where}: {an(claim.rule)} claim needs a study grid")
        for cell in self.cells():
            for axis, label in cell.items():
                if axis not in claim.labels:
                    raise UserError(f"{where}: the study has no axis {axis!r} (axes: {', '.join(claim.labels)})")
                for one in (label if isinstance(label, list) else [label]):
                    if str(one) not in claim.labels[axis]:
                        raise UserError(f"{where}: the study's axis {axis!r} has no label {one!r} "
                                        f"(labels: {', '.join(claim.labels[axis])})")

    # what it reads
    def cells(self) -> List[Dict[str, Any]]:
        """The cells it names (a, b, control, groups): checked against the grid, and where a floor is read."""
        return []

    def read_cells(self) -> List[Dict[str, Any]]:
        """The cells whose runs it reads."""
        return self.cells()

    def figures(self) -> List[Any]:
        return []

    def columns(self) -> List[str]:
        """The results.csv columns its rule reads."""
        return [c for fig in self.figures() for c in figure_columns(fig)]

    def has_figure(self, row: Row) -> bool:
        return any(figure_of(row, fig) is not None for fig in self.figures())

    # deciding
    def decide(self, rows: List[Row], claim: Any, decided: Dict[str, rules.Decision]) -> rules.Decision:
        """Its rule on a study's rows (``claim``: where it sits; ``decided``: the study's other claims)."""
        raise NotImplementedError

    # showing
    def decision_text(self, claim: Any, d: rules.Decision) -> str:
        """The row's deciding figure: the claim's label, then what decided it."""
        return f"{claim.id if self.label is None else self.label}: {self.shown(d)}"

    def fmt(self, d: rules.Decision) -> str:
        return rules.fmt_decision(d, scale=self.scale, unit=self.unit)

    def margin_text(self, margin: float) -> str:
        return f"{float(margin) * self.scale:g} {self.unit}".strip()

    def estimate_text(self, d: rules.Decision) -> str:
        return self.fmt(d)

    def seeds_text(self, n: int, need: str) -> str:
        return f" (n = {n}; at this effect and spread the rule decides with {need} seeds)"

    def shown(self, d: rules.Decision, short: bool = False) -> str:
        """What decided it: the estimate and interval, what is missing, how many seeds would decide it."""
        if d.verdict == NOT_TESTED or (d.verdict == rules.NOT_MEASURED and d.note.startswith(POOLED)):
            return d.note
        if d.verdict == rules.NOT_MEASURED:
            return d.note if "distinct x" in d.note else "fewer than 2 runs per cell"
        text = self.estimate_text(d)
        n = min(d.n) if d.n else 0
        if not math.isnan(d.seeds_needed) and d.verdict == rules.NOT_SEPARABLE:
            text += self.seeds_text(n, "more than 1000" if math.isinf(d.seeds_needed) else f"{d.seeds_needed:.0f}")
        if d.verdict == rules.HOLDS_VACUOUSLY:
            text += f", {d.note.split(vacuous.AT_FLOOR, 1)[-1]} in every run" + (
                "" if short else ": it holds whatever the model does")
        return text


@dataclass
class OnFigure(StudyKind):
    """A claim on one figure of each run: a results.csv column, ``"col_a - col_b"`` (per run) or
    ``{mean_of: [cols], minus: col, skip_own: axis}`` (:mod:`recurvit.study.cells`)."""

    figure: Any = key("acc_T", "a results.csv column, 'col_a - col_b' or {mean_of: [cols], minus: col, skip_own: axis}")

    def figures(self) -> List[Any]:
        return [self.figure]


@dataclass
class Floored(OnFigure):
    """A claim whose rule ``floor`` can meet whatever the model does (both cells solve nothing): met only there,
    it holds vacuously, never "reproduced" (:mod:`recurvit.study.vacuous`)."""

    floor: Optional[Dict[str, float]] = key(None, "results columns -> the value at which the rule holds whatever "
                                                 "the model does")

    def check(self, claim: Any, where: str) -> None:
        super().check(claim, where)
        if self.floor is not None and not self.floor:
            raise UserError(f"{where}: `floor` maps results columns to the value at which the rule holds whatever "
                            "the model does")

    def verdict(self, rows: List[Row], claim: Any) -> rules.Decision:
        """Its rule on the rows, before the floor is read."""
        raise NotImplementedError

    def decide(self, rows: List[Row], claim: Any, decided: Dict[str, rules.Decision]) -> rules.Decision:
        return vacuous.vacuous(self.verdict(rows, claim), self, rows)


def seed_sorted(rows: Sequence[Row], cell: Mapping[str, Any]) -> List[Row]:
    """The rows of a cell in seed order."""
    return sorted((r for r in rows if in_cell(r, cell)), key=lambda r: str(r.get(SEED_KEY, r.get("seed"))))
