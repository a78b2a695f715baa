"""A claim's keys checked when its study file loads (:func:`recurvit.study.claims.load_claims`): a label, an
axis or a key a claim names and its study lacks is an error (:class:`UserError`), never a silent "not
measured"."""
from __future__ import annotations

from typing import Any

from ..errors import UserError

ROW_KINDS = ("accounting", "identity", "needs", "benchmark")
SIZED = ("superiority", "noninferiority", "equivalence", "near_chance")  # the kinds ``sizes`` may decide


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bounds_ok(t: Any) -> bool:
    return isinstance(t, dict) and bool(t) and all(
        isinstance(b, dict) and len(b) == 1 and set(b) <= {"max", "min"} and all(_number(v) for v in b.values())
        for b in t.values())


def _check_targets(claim: Any, where: str) -> None:
    if not _bounds_ok(claim.spec.get("targets")):
        raise UserError(f"{where}: a {claim.rule} claim needs `targets` mapping figures to {{max: number}} or "
                        "{min: number}")


def _check_sized(claim: Any, where: str) -> None:
    s = claim.spec
    sizes = s.get("sizes")
    if sizes is not None:
        if claim.rule not in SIZED or not isinstance(sizes, list) or not sizes or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in sizes):
            raise UserError(f"{where}: `sizes` (a list of sizes, one comparison decided at each) belongs to a "
                            f"{', '.join(SIZED)} claim")
        if "{size}" not in str(s.get("figure", "")):
            raise UserError(f"{where}: a claim with `sizes` names its figure with {{size}} in it")
    floor = s.get("floor")
    if floor is not None and (not isinstance(floor, dict) or not floor or not all(_number(v) for v in floor.values())):
        raise UserError(f"{where}: `floor` maps results columns to the value at which the rule holds whatever "
                        "the model does")
    if claim.rule == "stopping":
        ok = all("{size}" in str(s.get(k, "")) for k in ("iters", "solved")) and isinstance(s.get("a"), dict)
        cap = s.get("cap")
        if not ok or not s.get("figure") or (cap is not None and not isinstance(cap, str) and not _number(cap)):
            raise UserError(f"{where}: a stopping claim needs `a`, `figure` (the per-run slope over every size), "
                            "`iters` and `solved` (per-size columns with {size}) and optionally `cap` and `control`")
    elif "control" in s:
        raise UserError(f"{where}: `control` belongs to a stopping claim")


def check_claim(claim: Any, where: str) -> None:
    """Every key of ``claim`` against its kind and its study's grid (``claim.labels``: axis -> labels)."""
    if claim.rule == "benchmark":
        _check_targets(claim, where)
        if not claim.spec.get("file") or not claim.spec.get("command"):
            raise UserError(f"{where}: a benchmark claim needs `file` (its JSON) and `command` (what writes it)")
    if claim.rule in ROW_KINDS:
        return
    if claim.rule == "target" and (not _bounds_ok(claim.spec.get("targets")) or "a" not in claim.spec):
        raise UserError(f"{where}: a target claim needs `a` and `targets` mapping columns to "
                        "{max: number} or {min: number}")
    if claim.rule != "all_of" and not claim.labels:
        raise UserError(f"{where}: a {claim.rule} claim needs a study grid")
    _check_sized(claim, where)
    cells = [claim.spec.get(k) for k in ("a", "b", "control")] + list((claim.spec.get("groups") or {}).values())
    for cell in cells:
        if cell is None:
            continue
        if not isinstance(cell, dict):
            raise UserError(f"{where}: a cell is a mapping axis -> label, got {cell!r}")
        for axis, label in cell.items():
            if axis not in claim.labels:
                raise UserError(f"{where}: the study has no axis {axis!r} (axes: {', '.join(claim.labels)})")
            for one in (label if isinstance(label, list) else [label]):
                if str(one) not in claim.labels[axis]:
                    raise UserError(f"{where}: the study's axis {axis!r} has no label {one!r} "
                                    f"(labels: {', '.join(claim.labels[axis])})")
    budgets = claim.spec.get("budgets")
    if budgets is not None and (claim.rule != "trend" or not isinstance(budgets, dict) or len(budgets) < 3
                                or "axis" in claim.spec):
        raise UserError(f"{where}: `budgets` (x -> results folder, 3 or more) belongs to a trend claim without `axis`")
    axis = claim.spec.get("axis")
    if axis is not None:
        if axis not in claim.labels:
            raise UserError(f"{where}: the study has no axis {axis!r}")
        missing = sorted(set(map(str, claim.spec.get("x", {}))) - set(claim.labels[axis]))
        if missing:
            raise UserError(f"{where}: the study's axis {axis!r} has no label(s) {', '.join(missing)}")
