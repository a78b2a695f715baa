"""Rules met by solving nothing, and one comparison decided at several sizes.

**Holds vacuously.** A claim may name ``floor``: the quantities (results.csv columns) whose value there
makes its rule hold whatever the model does, ``{column: value}`` (a floor or a ceiling: solved 0 at 10T in
both cells, a drop of 0 because nothing is solved at any iteration). When the rule is met and every run of
every cell the claim reads sits at every one of them, the verdict is :data:`HOLDS_VACUOUSLY`, never a
reproduction: the rule was met by numbers that any model solving nothing would give.

**One comparison at several sizes** is one claim: ``sizes: [9, 17, 25]`` with ``{size}`` in its ``figure``
(and ``floor``), decided at each size and reported per size; the claim holds when it holds at every size
(:func:`of_sizes`), and is counted once.

A stopping rule with a control is its own kind (:mod:`recurvit.study.claim_kinds.stopping`).
"""
from __future__ import annotations

import math
from typing import Any, Sequence, Tuple

from .cells import Row, as_number, in_cell
from .decision import HOLDS_VACUOUSLY, NOT_MEASURED, NOT_REPRODUCED, NOT_SEPARABLE, REPRODUCED, Decision

AT_FLOOR = "every run at the floor: "  # how a vacuous decision's note names its floor (findings reads it)
PARTLY = "holds, vacuously at some sizes"  # every size met, some only at the floor: not a reproduction


# ----------------------------------------------------------------------------------------- floors
def at_floor(spec: Any, rows: Sequence[Row]) -> str:
    """"column = value, ..." when every run of the claim's cells (``spec.cells()``: a, b, control, groups) sits
    at each of the claim's ``floor`` quantities ("" when it names none, has no run, or one run is off its floor)."""
    floor = spec.floor or {}
    cells = spec.cells()
    runs = [r for r in rows if any(in_cell(r, c) for c in cells)]
    if not floor or not runs:
        return ""
    for col, at in floor.items():
        for r in runs:
            v = as_number(r.get(col))
            if v is None or abs(v - float(at)) > 1e-12:
                return ""
    return ", ".join(f"{col} = {float(at):g}" for col, at in floor.items())


def vacuous(d: Decision, spec: Any, rows: Sequence[Row]) -> Decision:
    """``d``, or HOLDS_VACUOUSLY when it is met only at the claim's floor (see the module docstring)."""
    if d.verdict != REPRODUCED:
        return d
    where = at_floor(spec, rows)
    if not where:
        return d
    return Decision(HOLDS_VACUOUSLY, d.estimate, d.lo, d.hi, d.p, d.n, d.seeds_needed,
                    f"{d.note}; {AT_FLOOR}{where}", d.parts)


# ------------------------------------------------------------------------------------------ sizes
def fill_size(value: Any, size: Any) -> Any:
    """``value`` (a figure, a floor, a label) with ``{size}`` filled in, in strings, keys and lists alike."""
    if isinstance(value, str):
        return value.replace("{size}", str(size))
    if isinstance(value, dict):
        return {fill_size(k, size): fill_size(v, size) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_size(v, size) for v in value]
    return value


def size_name(size: Any) -> str:
    return f"{size}x{size}"


def of_sizes(parts: Sequence[Tuple[str, Decision]]) -> Decision:
    """One claim decided at several sizes: not measured while one size is, not reproduced when one size is
    not, reproduced when every size is, holds vacuously when every size does (only at the floor), else not
    separable; a mix of reproduced and vacuous sizes is :data:`PARTLY`."""
    got = [d.verdict for _, d in parts]
    if not got or NOT_MEASURED in got:
        verdict = NOT_MEASURED
    elif NOT_REPRODUCED in got:
        verdict = NOT_REPRODUCED
    elif all(v == REPRODUCED for v in got):
        verdict = REPRODUCED
    elif all(v == HOLDS_VACUOUSLY for v in got):
        verdict = HOLDS_VACUOUSLY
    elif all(v in (REPRODUCED, HOLDS_VACUOUSLY) for v in got):
        verdict = PARTLY
    else:
        verdict = NOT_SEPARABLE
    n = tuple(min(k) for k in zip(*(d.n for _, d in parts if d.n))) if any(d.n for _, d in parts) else ()
    return Decision(verdict, math.nan, math.nan, math.nan, math.nan, n, math.nan,
                    "per size: " + ", ".join(f"{name} {d.verdict}" for name, d in parts), tuple(parts))


__all__ = ["AT_FLOOR", "PARTLY", "at_floor", "vacuous", "fill_size", "of_sizes", "size_name"]
