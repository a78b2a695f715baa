"""Cells of a study side by side: which axis two labels share, and the cell pairs a comparison reads."""
from __future__ import annotations

from typing import Any, Dict, List


def table(head: List[str], body: List[List[str]]) -> List[str]:
    """A markdown table: the header line, the rule, one line a row."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in body]


def axis_of(cs: List[Dict[str, Any]], axes: List[str], a: str, b: str):
    """The axis whose labels include both ``a`` and ``b`` (None: no such axis)."""
    return next((x for x in axes if any(str(c[x]) == a for c in cs) and any(str(c[x]) == b for c in cs)), None)


def pairs(cs: List[Dict[str, Any]], axes: List[str], a: str, b: str):
    """(cell a, cell b, ' (other labels)') for every combination of the OTHER axes' labels: in a
    width x model grid, ``[vit, bvit]`` is one comparison per width, never a mix of widths."""
    axis = axis_of(cs, axes, a, b)
    if axis is None:
        return []
    others = [x for x in axes if x != axis]
    out = []
    for ca in (c for c in cs if str(c[axis]) == a):
        key = tuple(str(ca[x]) for x in others)
        cb = next((c for c in cs if str(c[axis]) == b and tuple(str(c[x]) for x in others) == key), None)
        if cb is not None:
            out.append((ca, cb, f" ({', '.join(key)})" if others else ""))
    return out
