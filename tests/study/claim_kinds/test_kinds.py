"""recurvit.study.claim_kinds: one typed class per claim kind. A key the kind does not take (unknown, or a key
of another kind), a missing key or a value of the wrong type is one line naming the claim, the key and the
kind; a new kind is one class and one entry of KINDS, and works end to end."""
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from recurvit.errors import UserError
from recurvit.study import rules
from recurvit.study.cells import Row, values
from recurvit.study.claim_kinds import KINDS, OnFigure, RowKind, key
from recurvit.study.claims import decide_all, load_claims
from recurvit.study.findings import decision_text, rule_text

ROOT = Path(__file__).resolve().parents[3]
LABELS = {"regime": ["naive", "vit"], "train.seed": ["0", "1", "2"]}
A, B = {"regime": "vit"}, {"regime": "naive"}
BOUNDS = {"acc_T": {"min": 0.5}}
# the fewest keys each kind takes (besides source, words and rule)
MINIMAL: Dict[str, Dict[str, Any]] = {
    "superiority": {"a": A, "b": B},
    "noninferiority": {"a": A, "b": B, "margin": 0.01},
    "equivalence": {"a": A, "b": B, "margin": 0.01},
    "trend": {"axis": "regime", "x": {"naive": 1, "vit": 2}},
    "near_chance": {"a": A, "margin": 0.05},
    "heterogeneity": {"groups": {"n": B, "v": A}, "margin": 0.01},
    "target": {"a": A, "targets": BOUNDS},
    "all_of": {"parts": ["other"]},
    "stopping": {"a": A, "figure": "slope", "iters": "iters_{size}", "solved": "solved_{size}"},
    "accounting": {"count": {"claim": "c", "figure": "f", "text": "{}"}, "tolerance": 0.05},
    "identity": {"test": "tests/test_x.py::test_y"},
    "needs": {"needs": "ImageNet", "command": "recurvit train ..."},
    "benchmark": {"file": "bench.json", "command": "python bench.py", "targets": BOUNDS},
}
OTHER = {"source": "s", "words": "w", "rule": "superiority", "a": A, "b": B}  # the part an all_of names


def names(cls) -> List[str]:
    return [f.name for f in fields(cls)]


def load(tmp_path: Path, rule: str, **keys):
    """The claim ``c`` of a claims file (beside ``other``, which an all_of names), read as its study reads it."""
    doc = {"claims": {"c": {"source": "s", "words": "w", "rule": rule, **keys},
                      **({"other": OTHER} if rule == "all_of" else {})}}
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    study_kind = not issubclass(KINDS[rule], RowKind)
    return {c.id: c for c in load_claims(path, LABELS if study_kind else None)}["c"]


def one_line(tmp_path: Path, rule: str, **keys) -> str:
    with pytest.raises(UserError) as e:
        load(tmp_path, rule, **keys)
    msg = str(e.value)
    assert "\n" not in msg and "claim c" in msg, msg
    return msg


def test_every_kind_has_its_minimal_keys_here():
    assert set(MINIMAL) == set(KINDS)


@pytest.mark.parametrize("rule", sorted(KINDS))
def test_each_kind_loads_into_its_class(tmp_path, rule):
    c = load(tmp_path, rule, **MINIMAL[rule])
    assert type(c.spec) is KINDS[rule] and c.rule == rule and c.source == "s" and rule_text(c)


@pytest.mark.parametrize("rule", sorted(KINDS))
def test_an_unknown_key_is_one_line_naming_the_claim_the_key_and_the_kind(tmp_path, rule):
    msg = one_line(tmp_path, rule, **MINIMAL[rule], bogus=1)
    assert "unknown key `bogus`" in msg and f" {rule} claim" in msg, msg


@pytest.mark.parametrize("rule", sorted(KINDS))
def test_a_key_of_another_kind_is_refused_by_the_type(tmp_path, rule):
    mine = set(names(KINDS[rule]))
    other, misplaced = next((k, n) for k, cls in KINDS.items() for n in names(cls) if n not in mine)
    msg = one_line(tmp_path, rule, **MINIMAL[rule], **{misplaced: MINIMAL.get(other, {}).get(misplaced, 1)})
    assert f"`{misplaced}` belongs to" in msg and other in msg and f"not {'an' if rule[0] in 'aeiou' else 'a'} " \
        f"{rule} claim" in msg, msg


@pytest.mark.parametrize("rule,missing", [(r, k) for r, keys in sorted(MINIMAL.items()) for k in keys
                                          if k not in ("b", "x")])
def test_a_missing_key_is_one_line(tmp_path, rule, missing):
    keys = {k: v for k, v in MINIMAL[rule].items() if k != missing}
    msg = one_line(tmp_path, rule, **keys)
    assert f"`{missing}`" in msg and rule in msg, msg


def test_a_value_of_the_wrong_type_is_one_line(tmp_path):
    msg = one_line(tmp_path, "superiority", **MINIMAL["superiority"], side="left")
    assert "`side` of a superiority claim (the claimed sign of a - b: +1 or -1)" in msg, msg
    msg = one_line(tmp_path, "equivalence", **{**MINIMAL["equivalence"], "a": "vit"})
    assert "`a` of an equivalence claim (a cell" in msg, msg
    assert "no label 'ds3'" in one_line(tmp_path, "near_chance", **{**MINIMAL["near_chance"], "a": {"regime": "ds3"}})


def test_a_shell_variable_in_a_command_stays_text(tmp_path):
    c = load(tmp_path, "needs", needs="LPIPS", command="for v in a b; do run x_${v}; done")
    assert c.spec.command == "for v in a b; do run x_${v}; done"


def test_yaml_merge_keys_fill_a_claim(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text("shared: &t {source: s, words: w, rule: target, targets: {acc_T: {min: 0.5}}}\n"
                    "claims:\n  c:\n    <<: *t\n    a: {regime: vit}\n    label: vit\n")
    (c,) = load_claims(path, LABELS)
    assert c.spec.targets == BOUNDS and c.spec.a == A and c.spec.label == "vit"


def test_every_committed_claim_loads_into_its_kind():
    import recurvit.tasks  # noqa: F401  (registers the tasks study files name)
    from recurvit.study.spec import load_study

    claims = load_claims(ROOT / "studies" / "claims.yaml")
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        if path.name != "claims.yaml":
            claims += load_study(path).claims
    assert len(claims) > 100 and all(type(c.spec) is KINDS[c.rule] for c in claims)


# ------------------------------------------------------------------------------- a new kind
@dataclass
class Ratio(OnFigure):
    """a's mean figure is at least ``least`` times b's (a toy kind: one class and one table entry)."""

    a: Dict[str, Any] = key(help="a cell")
    b: Dict[str, Any] = key(help="a cell")
    least: float = key(help="the smallest ratio that holds")

    def cells(self):
        return [self.a, self.b]

    def decide(self, rows: List[Row], claim: Any, decided) -> rules.Decision:
        a, b = ([v for _, v in values(rows, cell, self.figure)] for cell in (self.a, self.b))
        if not a or not b:
            return rules.Decision(rules.NOT_MEASURED, math.nan, math.nan, math.nan, math.nan, (), math.nan)
        ratio = (sum(a) / len(a)) / (sum(b) / len(b))
        verdict = rules.REPRODUCED if ratio >= self.least else rules.NOT_REPRODUCED
        return rules.Decision(verdict, ratio, math.nan, math.nan, math.nan, (len(a), len(b)), math.nan)

    def rule_text(self) -> str:
        return f"a ratio of at least {self.least:g}"

    def shown(self, d: rules.Decision, short: bool = False) -> str:
        return f"{d.estimate:.2f}x"


def test_a_new_kind_is_one_class_and_one_table_entry(tmp_path, monkeypatch):
    monkeypatch.setitem(KINDS, "ratio", Ratio)
    c = load(tmp_path, "ratio", a=A, b=B, least=1.5, figure="flops", label="vit / naive")
    rows = [{"regime": g, "train.seed": str(s), "flops": f}
            for g, f in (("vit", 3.0), ("naive", 1.0)) for s in range(3)]
    d = decide_all([c], rows)["c"]
    assert d.verdict == rules.REPRODUCED and d.estimate == pytest.approx(3.0)
    assert rule_text(c) == "a ratio of at least 1.5" and decision_text(c, d) == "vit / naive: 3.00x"
    assert decide_all([c], [{**r, "flops": 1.0} for r in rows])["c"].verdict == rules.NOT_REPRODUCED
    msg = one_line(tmp_path, "ratio", a=A, b=B, least=1.5, margin=0.1)  # its keys are refused elsewhere and here
    assert "`margin` belongs to" in msg and "not a ratio claim" in msg
    assert "`least` belongs to a ratio claim, not a superiority claim" in one_line(tmp_path, "superiority", a=A,
                                                                                   least=2.0)
    assert "no label 'ds3'" in one_line(tmp_path, "ratio", a={"regime": "ds3"}, b=B, least=1.5)
