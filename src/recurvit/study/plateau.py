"""Has a run stopped moving? The change of a per-epoch figure over the last 20% of the epochs, per seed,
as a study's report prints it (validation accuracy where the runs hold a split out)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

PLATEAU_TOL = 0.003  # a budget's criterion: every seed changes by under about 0.3 points over its last 20%


def plateau_column(curve) -> str:
    """Change of the first seed's test figure over the last 20% of its epochs (points)."""
    ys = [y for y in curve or [] if y is not None]
    if len(ys) < 5:
        return "-"
    k = max(1, round(0.2 * len(ys)))
    return f"{100 * (ys[-1] - ys[-1 - k]):+.1f}"


def plateau_change(curve) -> Optional[float]:
    """The change of a per-epoch figure over the last 20% of the epochs, read off a least-squares line
    through those epochs' values (epochs E-k..E, k = 20% of E), so that one noisy epoch does not
    decide it; None for fewer than 5 epochs. A plateau is a change near 0."""
    ys = [y for y in curve or [] if y is not None]
    if len(ys) < 5:
        return None
    k = max(1, round(0.2 * len(ys)))
    window = ys[-1 - k:]
    xs = list(range(len(window)))
    mx, my = sum(xs) / len(xs), sum(window) / len(window)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, window)) / sum((x - mx) ** 2 for x in xs)
    return slope * k


def _key(rows: List[Dict[str, Any]]) -> str:
    """The per-seed plateau column the rows hold: validation accuracy where the runs hold a split out."""
    return "plateau_val" if any(r.get("plateau_val") is not None for r in rows) else "plateau_test"


def plateau_text(rows: List[Dict[str, Any]]) -> str:
    if any(r.get("plateau_val") is not None for r in rows):
        return ("Δ last 20% epochs, each seed = the change of each seed's validation accuracy (the held-out "
                "part of the training split) over its last 20% of epochs, read off a least-squares line through "
                "them, in the order of the seeds (a plateau is near 0).")
    if any(r.get("plateau_test") is not None for r in rows):
        return ("Δ last 20% epochs, each seed = the change of each seed's test accuracy over its last 20% of "
                "epochs, read off a least-squares line through them (a plateau is near 0).")
    return ("Δ last 20% epochs = change of the first seed's test accuracy over its last 20% of epochs (a plateau is "
            "near 0; '-': a run of fewer than 5 epochs, too short to say).")


def plateau_per_seed(c: Dict[str, Any]) -> str:
    """Every seed's plateau change (validation accuracy where the runs hold a split out, else test), points."""
    key = _key(c["rows"])
    got = [r.get(key) for r in sorted(c["rows"], key=lambda r: (r.get("seed") is None, r.get("seed")))]
    return " / ".join("-" if v is None else f"{100 * v:+.1f}" for v in got)


def plateau_summary(rows: List[Dict[str, Any]]) -> str:
    """How many runs still moved by PLATEAU_TOL or more over their last 20% of epochs ('' when no run has a
    per-seed figure), so that a report says in words whether its budget held for every seed."""
    key = _key(rows)
    got = [r[key] for r in rows if r.get(key) is not None]
    if not got:
        return ""
    moving = [v for v in got if abs(v) >= PLATEAU_TOL]
    split = "validation" if key == "plateau_val" else "test"
    text = (f"Plateau: {len(moving)} of {len(got)} runs changed by {100 * PLATEAU_TOL:.1f} points or more over "
            f"their last 20% of epochs ({split} accuracy; changes from {100 * min(got):+.1f} to "
            f"{100 * max(got):+.1f} points)")
    return text + (": every run is at a plateau by that criterion." if not moving else
                   ": by that criterion those runs were still moving when training stopped.")
