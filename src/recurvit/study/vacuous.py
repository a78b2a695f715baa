"""Rules met by solving nothing, one comparison at several sizes, and stopping rules with a control.

**Holds vacuously.** A claim may name ``floor``: the quantities (results.csv columns) whose value there
makes its rule hold whatever the model does, ``{column: value}`` (a floor or a ceiling: solved 0 at 10T in
both cells, a drop of 0 because nothing is solved at any iteration). When the rule is met and every run of
every cell the claim reads sits at every one of them, the verdict is :data:`HOLDS_VACUOUSLY`, never a
reproduction: the rule was met by numbers that any model solving nothing would give.

**One comparison at several sizes** is one claim: ``sizes: [9, 17, 25]`` with ``{size}`` in its ``figure``
(and ``floor``), decided at each size and reported per size; the claim holds when it holds at every size
(:func:`of_sizes`), and is counted once.

**A stopping rule with a control** (rule kind ``stopping``): "the iterations a per-input stopping rule uses
grow with the input's size" cannot tell adaptive stopping from never settling (a model that solves nothing
iterates to the rule's cap, and more so on larger inputs). Its keys: ``a`` (the cell), ``figure`` (the
per-run slope of the rule's mean iterations over every size, as the evaluator writes it), ``iters`` and
``solved`` (the per-size columns, ``{size}`` in them; the sizes are those the results hold), ``cap`` (a column
or a number: the rule's cap) and optional ``control`` (a cell that solves nothing, which the rule must
separate from). Iterations count as thinking longer only where the mazes the rule stopped on were solved:
each run's slope is taken over the sizes at which the rule solved a maze and stopped below its cap (the
resolution the results file holds: per size, not per maze). The verdict is **reproduced** when that slope is
above 0 and the every-size slope is above the control's; **holds vacuously** when the every-size slope is
above 0 but no two runs have two sizes where they solved anything (their iterations grow only where they
solve nothing or sit at the cap).
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import rules
from .cells import SEED_KEY, Row, as_number, in_cell, values
from .decision import HOLDS_VACUOUSLY, NOT_MEASURED, NOT_REPRODUCED, NOT_SEPARABLE, REPRODUCED, Decision

AT_FLOOR = "every run at the floor: "  # how a vacuous decision's note names its floor (findings reads it)
PARTLY = "holds, vacuously at some sizes"  # every size met, some only at the floor: not a reproduction


# ----------------------------------------------------------------------------------------- floors
def at_floor(spec: Mapping[str, Any], rows: Sequence[Row]) -> str:
    """"column = value, ..." when every run of the claim's cells (a, b, control, groups) sits at each of the
    claim's ``floor`` quantities ("" when it names none, has no run, or one run is off its floor)."""
    floor = spec.get("floor") or {}
    cells = [spec[k] for k in ("a", "b", "control") if isinstance(spec.get(k), dict)]
    cells += list((spec.get("groups") or {}).values())
    runs = [r for r in rows if any(in_cell(r, c) for c in cells)]
    if not floor or not runs:
        return ""
    for col, at in floor.items():
        for r in runs:
            v = as_number(r.get(col))
            if v is None or abs(v - float(at)) > 1e-12:
                return ""
    return ", ".join(f"{col} = {float(at):g}" for col, at in floor.items())


def vacuous(d: Decision, spec: Mapping[str, Any], rows: Sequence[Row]) -> Decision:
    """``d``, or HOLDS_VACUOUSLY when it is met only at the claim's floor (see the module docstring)."""
    if d.verdict != REPRODUCED:
        return d
    where = at_floor(spec, rows)
    if not where:
        return d
    return Decision(HOLDS_VACUOUSLY, d.estimate, d.lo, d.hi, d.p, d.n, d.seeds_needed,
                    f"{d.note}; {AT_FLOOR}{where}", d.parts)


# ------------------------------------------------------------------------------------------ sizes
def _format(value: Any, size: Any) -> Any:
    if isinstance(value, str):
        return value.replace("{size}", str(size))
    if isinstance(value, dict):
        return {_format(k, size): _format(v, size) for k, v in value.items()}
    if isinstance(value, list):
        return [_format(v, size) for v in value]
    return value


def with_size(spec: Mapping[str, Any], size: Any) -> Dict[str, Any]:
    """The claim at one of its ``sizes``: ``{size}`` filled in in its figure, floor and label."""
    out = {k: v for k, v in spec.items() if k != "sizes"}
    for key in ("figure", "floor", "label"):
        if key in out:
            out[key] = _format(out[key], size)
    return out


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


# --------------------------------------------------------------------------------------- stopping
def sizes_of(rows: Sequence[Row], template: str) -> List[int]:
    """The sizes a per-size column template (``rule_stable_iters_{size}``) has in the rows, ascending."""
    pattern = re.compile("^" + re.escape(template).replace(re.escape("{size}"), r"(\d+)") + "$")
    return sorted({int(m.group(1)) for r in rows for k in r for m in [pattern.match(str(k))] if m})


def _slope(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def _cap(row: Row, cap: Any) -> Optional[float]:
    if cap is None:
        return None
    return float(cap) if isinstance(cap, (int, float)) else as_number(row.get(cap))


def _span(sizes: Sequence[int]) -> str:
    if not sizes:
        return "none"
    if len(sizes) == 1:
        return f"{size_name(sizes[0])} only"
    return f"{size_name(sizes[0])} to {size_name(sizes[-1])}"


def counted_sizes(spec: Mapping[str, Any], row: Row, sizes: Sequence[int]) -> List[int]:
    """The sizes at which a run's stopping rule solved a maze and stopped, on the mean, below its cap."""
    cap = _cap(row, spec.get("cap"))
    out = []
    for s in sizes:
        it = as_number(row.get(spec["iters"].replace("{size}", str(s))))
        solved = as_number(row.get(spec["solved"].replace("{size}", str(s))))
        if it is not None and solved is not None and solved > 0 and (cap is None or it < cap):
            out.append(s)
    return out


def _solves_up_to(spec: Mapping[str, Any], rows: Sequence[Row], sizes: Sequence[int]) -> str:
    """What a control cell solves with the rule: "nothing at any size" / "nothing past 9x9"."""
    solving = [s for s in sizes for r in rows
               if (as_number(r.get(spec["solved"].replace("{size}", str(s)))) or 0.0) > 0]
    if not solving:
        return "it solves nothing at any size"
    return f"it solves nothing past {size_name(max(solving))}" if max(solving) < max(sizes) else \
        "it solves mazes up to the largest size"


def _against_zero(vals: Sequence[float]) -> Decision:
    return rules.superiority(list(vals), [0.0] * len(vals), paired=True)


def stopping(spec: Mapping[str, Any], rows: Sequence[Row]) -> Decision:
    """A stopping rule's iterations grow with size where its inputs were solved, beyond a control's (see the
    module docstring). ``parts``: the slope where solved, over every size, and against the control."""
    fig = spec.get("figure")
    mine = sorted((r for r in rows if in_cell(r, spec["a"])), key=lambda r: str(r.get(SEED_KEY, r.get("seed"))))
    sizes = sizes_of(mine, spec["iters"])
    every = _against_zero([v for _, v in values(mine, spec["a"], fig)])
    where, counted = [], []
    for r in mine:
        used = counted_sizes(spec, r, sizes)
        seed = str(r.get(SEED_KEY, r.get("seed")))
        counted.append(f"seed {seed}: {_span(used)}")
        pts = [(float(s), as_number(r.get(spec["iters"].replace("{size}", str(s))))) for s in used]
        got = _slope(pts)
        if got is not None:
            where.append(got)
    parts: List[Tuple[str, Decision]] = []
    note = "sizes counted (the rule solved a maze there, below its cap): " + "; ".join(counted)
    control: Optional[Decision] = None
    if isinstance(spec.get("control"), dict):
        ctl_rows = [r for r in rows if in_cell(r, spec["control"])]
        control = rules.superiority([v for _, v in values(mine, spec["a"], fig)],
                                    [v for _, v in values(ctl_rows, spec["control"], fig)])
        control = Decision(control.verdict, control.estimate, control.lo, control.hi, control.p, control.n,
                           control.seeds_needed, f"{control.note}; the control: "
                           f"{'/'.join(map(str, spec['control'].values()))}, "
                           f"{_solves_up_to(spec, ctl_rows, sizes_of(ctl_rows, spec['iters']))}")
    if len(where) < 2:  # nothing to count: its iterations grow, if at all, only where it solves nothing
        parts = [("every size", every)] + ([("above the control", control)] if control else [])
        if every.verdict == REPRODUCED:
            return Decision(HOLDS_VACUOUSLY, every.estimate, every.lo, every.hi, every.p, every.n,
                            every.seeds_needed, f"{note}; fewer than 2 runs solved a maze at two sizes: the "
                            "iterations grow only where nothing is solved or at the cap", tuple(parts))
        return Decision(every.verdict, every.estimate, every.lo, every.hi, every.p, every.n, every.seeds_needed,
                        note, tuple(parts))
    solved = _against_zero(where)
    parts = [("where solved", solved), ("every size", every)] + ([("above the control", control)] if control else [])
    got = [solved.verdict] + ([control.verdict] if control else [])
    if all(v == REPRODUCED for v in got):
        verdict = REPRODUCED
    elif NOT_MEASURED in got:
        verdict = NOT_MEASURED
    elif NOT_REPRODUCED in got:
        verdict = NOT_REPRODUCED
    else:
        verdict = NOT_SEPARABLE
    return Decision(verdict, solved.estimate, solved.lo, solved.hi, solved.p, solved.n, solved.seeds_needed,
                    note, tuple(parts))


__all__ = ["AT_FLOOR", "PARTLY", "at_floor", "vacuous", "with_size", "of_sizes", "size_name", "sizes_of",
           "counted_sizes", "stopping"]
