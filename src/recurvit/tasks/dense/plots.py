"""The plots of a dense (maze) study's report: solved against test-time iterations, one line a maze size,
a panel a cell (cells of the first grid axis side by side: the recurrent ViT beside the conv anchor), and
one large maze (input, prediction, target) of the first seed of the best cell."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...analysis.mazes import draw_maze, plot_solved
from ...run.outputs import save_figure

PANELS = ("mazes solved against test-time iterations", "solved_vs_iterations.png")
PICTURE = "maze_solved.png"


def _layout(cs: List[Dict[str, Any]], axes: List[str]) -> List[List[Optional[Dict[str, Any]]]]:
    """Rows of panels: with two or more cell axes, a column per label of the first; else up to 4 a row."""
    if len(axes) >= 2:
        cols = list(dict.fromkeys(str(c[axes[0]]) for c in cs))
        rows: Dict[tuple, Dict[str, Any]] = {}
        for c in cs:
            rows.setdefault(tuple(str(c[a]) for a in axes[1:]), {})[str(c[axes[0]])] = c
        return [[r.get(k) for k in cols] for r in rows.values()]
    width = min(4, len(cs))
    return [cs[i:i + width] + [None] * (width - len(cs[i:i + width])) for i in range(0, len(cs), width)]


def solved_panels(cs: List[Dict[str, Any]], study, out_dir: Path) -> Tuple[str, str]:
    """Solved (mean over the cell's seeds) against iterations on a log axis, a line a size, a panel a cell."""
    from matplotlib.figure import Figure

    grid = _layout(cs, study.cell_axes())
    nr, nc = len(grid), max(len(r) for r in grid)
    fig = Figure(figsize=(4.2 * nc, 3.2 * nr), dpi=110)
    for i, row in enumerate(grid):
        for j, c in enumerate(row):
            ax = fig.add_subplot(nr, nc, i * nc + j + 1)
            if c is None or not c["sweeps"]:
                ax.axis("off")
                continue
            sweeps = {s: sw for s, sw in c["sweeps"].items()}
            plot_solved(sweeps, int(c["steps"]), Path(), title=f"{c['cell']} ({c['model']}, n={c['n']})", ax=ax)
    fig.tight_layout()
    save_figure(fig, out_dir / PANELS[1])
    return PANELS


def _best_cell(cs: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The cell with the most solved at the largest size (at 10T or at T, the larger), among cells with an
    example; a tie (none solves any there) goes to the next size down, and so on: the model that got furthest."""
    def solved(c, key):
        return c[key]["mean"] if key in c and not math.isnan(c[key]["mean"]) else -1.0

    def score(c):
        return tuple(max(solved(c, f"solved_{s}_10T"), solved(c, f"solved_{s}")) for s in sorted(c["sizes"])[::-1])

    have = [c for c in cs if any(isinstance(r.get("maze_example"), dict) for r in c["rows"])]
    return max(have, key=score) if have else None


def maze_picture(cs: List[Dict[str, Any]], out_dir: Path) -> Optional[Tuple[str, str]]:
    """Input, prediction and target of the example maze kept by the first seed (with one) of the best cell."""
    import numpy as np

    c = _best_cell(cs)
    if c is None:
        return None
    r = min((r for r in c["rows"] if isinstance(r.get("maze_example"), dict)),
            key=lambda r: (r.get("seed") is None, r.get("seed")))
    ex = r["maze_example"]
    img = np.array([[[int(px[i:i + 2], 16) for i in (0, 2, 4)] for px in _split(row)] for row in ex["image"]],
                   dtype=np.uint8)
    mask = lambda rows: np.array([[int(v) for v in row] for row in rows], dtype=np.uint8)  # noqa: E731
    state = "solved" if ex["solved"] else "not solved"
    draw_maze([("input", img), (f"prediction after {ex['iterations']} iterations ({state})", mask(ex["pred"])),
               ("target path", mask(ex["target"]))],
              f"{c['cell']}, seed {r.get('seed')}: a {ex['size']}x{ex['size']} test maze (trained at T = "
              f"{r.get('steps')})", out_dir / PICTURE)
    return (f"one {ex['size']}x{ex['size']} maze ({c['cell']}, seed {r.get('seed')}): input, prediction, target",
            PICTURE)


def _split(row: str) -> List[str]:
    return [row[i:i + 6] for i in range(0, len(row), 6)]
