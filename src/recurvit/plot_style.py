"""What every recurvit plot shares: accuracies (stored as fractions) shown in % with as many decimals as
the ticks need, and titles wrapped to the width they are drawn in (never cut off at the figure's edge)."""
from __future__ import annotations

import math
import textwrap
from typing import Sequence

from matplotlib.ticker import PercentFormatter

CHAR_EM = 0.6  # mean width of a DejaVu Sans character, in em (a little generous: a wrapped line never overflows)


class Percent(PercentFormatter):
    """Fractions in %: 97%, 98% for whole-point ticks, 97.2%, 97.4% for finer ones (never 97%, 97%, 97%)."""

    def __init__(self, max_decimals: int = 3):
        super().__init__(xmax=1.0, decimals=0)
        self.max_decimals = max_decimals

    def format_ticks(self, values: Sequence[float]):
        self.decimals = decimals_for([100 * v for v in values], self.max_decimals)
        return super().format_ticks(values)


def decimals_for(values: Sequence[float], most: int = 3) -> int:
    """The fewest decimals (up to ``most``) that write every value exactly and tell them all apart."""
    finite = [v for v in values if math.isfinite(v)]
    for d in range(most + 1):
        shown = [round(v, d) for v in finite]
        if len(set(shown)) == len(set(finite)) and all(abs(s - v) < 1e-6 * max(1.0, abs(v))
                                                         for s, v in zip(shown, finite)):
            return d
    return most


def percent(ax, *which: str) -> None:
    """The axes ``which`` ("x", "y"; default "y") of ``ax`` read fractions as %, each with its own formatter."""
    for w in which or ("y",):
        getattr(ax, f"{w}axis").set_major_formatter(Percent())


def wrap(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize`` points."""
    chars = max(20, int(width_in * 72 / (CHAR_EM * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in text.splitlines()) if text else text


def axes_width(ax) -> float:
    """Width of ``ax`` in inches (from its position in the figure)."""
    return ax.get_position().width * ax.figure.get_figwidth()


__all__ = ["Percent", "decimals_for", "percent", "wrap", "axes_width"]
