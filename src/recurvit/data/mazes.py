"""Mazes generated in-process (seeded, no download) in the easy-to-hard format of Schwarzschild et al. 2021.

A maze of size s (s odd, s >= 3: the data sets' names, "9x9" ... "33x33", "59x59") is a perfect maze of
k x k cells, k = (s + 1) / 2, carved by a randomized depth-first search (the recursive backtracker) that
starts at the start cell. It is drawn on a (2k + 1) = (s + 2)-square grid (cells at odd coordinates, the
walls between them at mixed ones, a wall all round), each grid square as 2 x 2 pixels inside a 1-pixel
black frame: an RGB image of side 2(s + 2) + 2 = 2s + 6 (24 pixels for 9x9, 72 for 33x33, 124 for 59x59).
Walls are black, open squares white, the start cell green and the goal cell red (the colours of
easy-to-hard-data's ``make_mazes.py``). The target is the unique path from start to goal (its cells and
the open walls between them): 1 on its pixels and 0 elsewhere, an (H, W) mask.

    images, targets = make_mazes(1000, size=9, seed=0)     # uint8 (N, 3, 24, 24), uint8 (N, 24, 24)
    train, val, info = build_datasets(cfg.data)            # data.name=mazes; items: (float (3, H, W), long (H, W))
    tests = maze_test_sets(cfg.data)                       # {size: MazeDataset} over data.maze_test_sizes

All mazes of a batch are carved in lockstep (numpy over the batch), in fixed chunks each seeded by
(seed, split, size, chunk index), so a split of n mazes is the first n of any longer one. The validation
split and the test split at the training size hold no maze of the training split (nor of each other).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Set, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import UserError

if TYPE_CHECKING:
    from ..config import DataConfig

CHUNK = 1024  # mazes carved together; also the unit of seeding (prefix-stable splits)
SPLITS = {"train": 0, "val": 1, "test": 2}
WALL, OPEN = (0, 0, 0), (255, 255, 255)
START, GOAL = (0, 255, 0), (255, 0, 0)  # green start (where the search begins), red goal
CLASS_NAMES = ("off path", "path")
STATS = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))  # mean / std: the network reads the image in [0, 1], as DeepThinking's
_MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))  # N S W E, in cells


def cells_per_side(size: int) -> int:
    """k, the cells a side of a size-s maze has (s = 2k - 1); UserError for a size that is not odd >= 3."""
    if int(size) != size or size < 3 or size % 2 == 0:
        raise UserError(f"a maze size must be an odd integer >= 3 (9 is the easy-to-hard training size), got {size}")
    return (int(size) + 1) // 2


def maze_pixels(size: int) -> int:
    """The side in pixels of a size-s maze image: 2 (s + 2) + 2."""
    return 4 * cells_per_side(size) + 4  # = 2s + 6


def _neighbours(k: int) -> np.ndarray:
    """(k*k, 4) index of each cell's N/S/W/E neighbour, -1 outside the maze."""
    r, c = np.divmod(np.arange(k * k), k)
    out = np.full((k * k, 4), -1, dtype=np.int64)
    for j, (dr, dc) in enumerate(_MOVES):
        rr, cc = r + dr, c + dc
        ok = (rr >= 0) & (rr < k) & (cc >= 0) & (cc < k)
        out[ok, j] = rr[ok] * k + cc[ok]
    return out


def carve(n: int, k: int, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n perfect k x k mazes by the recursive backtracker, in lockstep over the batch.

    Returns (parent (n, k*k): each cell's parent in the search tree, the root its own parent; start (n,);
    goal (n,)), start != goal uniform over cell pairs. The search starts at the start cell and moves to
    a uniformly chosen unvisited neighbour, backtracking at dead ends; the carved passages are the tree
    edges cell -> parent."""
    C = k * k
    nb = _neighbours(k)
    rows = np.arange(n)
    start = rng.integers(0, C, n)
    goal = (start + 1 + rng.integers(0, C - 1, n)) % C  # any other cell, uniformly
    visited = np.zeros((n, C), dtype=bool)
    parent = np.empty((n, C), dtype=np.int64)
    stack = np.empty((n, C), dtype=np.int64)
    sp = np.zeros(n, dtype=np.int64)  # stack depth
    cur = start.copy()
    visited[rows, start] = True
    parent[rows, start] = start
    left = np.full(n, C - 1)  # cells still to visit
    while True:
        live = left > 0
        if not live.any():
            break
        cand = nb[cur]  # (n, 4)
        free = (cand >= 0) & ~visited[rows[:, None], np.maximum(cand, 0)]
        keys = np.where(free, rng.random((n, 4)), -1.0)
        nxt = cand[rows, keys.argmax(1)]
        go = live & free.any(1)
        back = live & ~go
        g = rows[go]  # advance: push the current cell, visit the chosen neighbour
        stack[g, sp[g]] = cur[g]
        sp[g] += 1
        visited[g, nxt[g]] = True
        parent[g, nxt[g]] = cur[g]
        left[g] -= 1
        b = rows[back]  # dead end: pop
        sp[b] -= 1
        cur = np.where(go, nxt, cur)
        cur[b] = stack[b, sp[b]]
    return parent, start, goal


def draw(parent: np.ndarray, start: np.ndarray, goal: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid-level maze: (open (n, g, g) bool, path (n, g, g) bool, colour (n, g, g, 3) uint8), g = 2k + 1."""
    n, C = parent.shape
    g = 2 * k + 1
    rows = np.arange(n)[:, None]
    on = np.zeros((n, C), dtype=bool)  # the path's cells: the goal's ancestors up to the start (the root)
    cell = goal.copy()
    on[rows[:, 0], cell] = True
    while (cell != start).any():
        cell = parent[rows[:, 0], cell]
        on[rows[:, 0], cell] = True
    r, c = np.divmod(np.arange(C), k)
    pr, pc = np.divmod(parent, k)
    mid_r, mid_c = r + pr + 1, c + pc + 1  # the wall square between a cell and its parent (the root: itself)
    opened = np.zeros((n, g, g), dtype=bool)
    opened[:, 1::2, 1::2] = True
    opened[rows, mid_r, mid_c] = True
    path = np.zeros((n, g, g), dtype=bool)
    path[:, 1::2, 1::2] = on.reshape(n, k, k)
    path[rows, mid_r, mid_c] = on  # a path cell's passage to its parent (the root writes its own cell)
    colour = np.where(opened[..., None], np.array(OPEN, np.uint8), np.array(WALL, np.uint8))  # (n, g, g, 3)
    for idx, rgb in ((start, START), (goal, GOAL)):
        sr, sc = np.divmod(idx, k)
        colour[rows[:, 0], 2 * sr + 1, 2 * sc + 1] = rgb
    return opened, path, colour


def to_pixels(grid: np.ndarray) -> np.ndarray:
    """(n, g, g[, 3]) grid -> (n, 2g + 2, 2g + 2[, 3]) pixels: each square 2 x 2, a 1-pixel zero frame."""
    up = grid.repeat(2, axis=1).repeat(2, axis=2)
    pad = [(0, 0), (1, 1), (1, 1)] + [(0, 0)] * (grid.ndim - 3)
    return np.pad(up, pad)


def sweep_bytes(sizes, n: int, width: int, batch: int = 50) -> Tuple[int, int]:
    """(bytes of ``n`` generated test mazes at every size of ``sizes``: the uint8 image and mask, the
    generator's grids; bytes of one batch of the largest as a ``width``-channel model's float states),
    priced before anything is generated: ``--sizes 100001`` or ``--mazes 1000000000`` is refused, not tried."""
    stored = sum(n * 5 * maze_pixels(s) ** 2 for s in sizes)  # RGB + mask + generator grids, a byte each
    side = maze_pixels(max(sizes))
    return stored, batch * side * side * 4 * (3 + 8 * max(int(width), 1))


def maze_problem(rgb: np.ndarray) -> Optional[str]:
    """Why an image (H, W, 3) uint8 is not a maze in the easy-to-hard format (:func:`to_pixels` of
    :func:`draw`), or None: square, 2s + 6 pixels a side for an odd s >= 3, a black 1-pixel frame, 2 x 2
    squares of wall, open, start and goal colours (within 64 of each channel: a lossy copy still reads), one
    start and one goal."""
    if rgb.ndim != 3 or rgb.shape[-1] != 3:
        return f"an image of shape {tuple(rgb.shape)}, not RGB"
    h, w = rgb.shape[:2]
    if h != w:
        return f"a {w}x{h} image; a maze is square"
    if h < 12 or h % 4:
        return f"a {h}-pixel side; a size-s maze is 2s + 6 pixels for an odd s >= 3 (12, 16, 20, ...; 24 for 9x9)"
    palette = np.array([WALL, OPEN, START, GOAL], dtype=np.int16)  # (4, 3)
    dist = np.abs(rgb.astype(np.int16)[:, :, None, :] - palette).max(-1)  # (H, W, 4)
    colour = dist.argmin(-1)
    if (dist.min(-1) > 64).any():
        return "pixels of other colours than a maze's (black walls, white paths, a green start, a red goal)"
    frame = np.concatenate([colour[0], colour[-1], colour[:, 0], colour[:, -1]])
    if (frame != 0).any():
        return "no black 1-pixel frame around it"
    inner = colour[1:-1, 1:-1]
    squares = inner[::2, ::2]
    if not all((inner[i::2, j::2] == squares).all() for i in (0, 1) for j in (0, 1)):
        return "its squares are not 2 x 2 pixels of one colour each"
    starts, goals = int((squares == 2).sum()), int((squares == 3).sum())
    if (starts, goals) != (1, 1):
        return f"{starts} start and {goals} goal squares; a maze has one of each"
    return None


def _keys(opened: np.ndarray, start: np.ndarray, goal: np.ndarray) -> List[bytes]:
    """One identity per maze (walls, start, goal): equal keys <=> equal images."""
    bits = np.packbits(opened.reshape(len(opened), -1), axis=1)
    ends = np.stack([start, goal], 1).astype(np.uint32)
    return [a.tobytes() + b.tobytes() for a, b in zip(bits, ends)]


def _chunks(size: int, seed: int, split: str) -> Iterator[Tuple[np.ndarray, np.ndarray, List[bytes]]]:
    """Endless (images (m, 3, H, W), targets (m, H, W), keys) chunks of one split's stream."""
    k = cells_per_side(size)
    j = 0
    while True:
        rng = np.random.default_rng([int(seed), SPLITS[split], int(size), j])
        parent, start, goal = carve(CHUNK, k, rng)
        opened, path, colour = draw(parent, start, goal, k)
        images = np.ascontiguousarray(to_pixels(colour).transpose(0, 3, 1, 2))
        yield images, to_pixels(path).astype(np.uint8), _keys(opened, start, goal)
        j += 1


def make_mazes(n: int, size: int = 9, seed: int = 0, split: str = "train",
               exclude: Optional[Set[bytes]] = None, keys_out: Optional[Set[bytes]] = None
               ) -> Tuple[np.ndarray, np.ndarray]:
    """The first ``n`` mazes of a split's stream: uint8 images (n, 3, H, W) in {0, 255} and uint8 path
    masks (n, H, W) in {0, 1}, H = W = 2 size + 6. Mazes whose key is in ``exclude`` are skipped (a split
    disjoint from another); the keys taken are added to ``keys_out``."""
    if n < 0:
        raise UserError(f"a number of mazes must be >= 0, got {n}")
    imgs, tgts, got = [], [], 0
    patience = 8 + 4 * (n // CHUNK)  # chunks that bring nothing new end the search: too few distinct mazes
    for images, targets, keys in _chunks(size, seed, split):
        if got >= n:
            break
        keep = np.array([exclude is None or key not in exclude for key in keys], dtype=bool)
        take = np.flatnonzero(keep)[: n - got]
        if len(take) == 0:
            patience -= 1
            if patience <= 0:
                raise UserError(f"too few distinct {size}x{size} mazes for a {split} split of {n} disjoint from "
                                f"the others; use a larger data.maze_size or fewer mazes")
            continue
        imgs.append(images[take])
        tgts.append(targets[take])
        if keys_out is not None:
            keys_out.update(keys[i] for i in take)
        got += len(take)
    px = maze_pixels(size)
    if not imgs:
        return np.zeros((0, 3, px, px), np.uint8), np.zeros((0, px, px), np.uint8)
    return np.concatenate(imgs), np.concatenate(tgts)


class MazeDataset(Dataset):
    """Mazes in memory: uint8 images (N, 3, H, W) and uint8 path masks (N, H, W); items are
    (float image (3, H, W) in [0, 1], long mask (H, W)), the inputs DeepThinking's networks read."""

    def __init__(self, images: np.ndarray, targets: np.ndarray, size: int) -> None:
        self.images = torch.from_numpy(images)
        self.targets = torch.from_numpy(targets)
        self.size = int(size)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.images[index].float().div_(255.0), self.targets[index].long()


def check_maze_cfg(cfg: DataConfig) -> None:
    """One line for a maze option the generator cannot honour."""
    for size in [cfg.maze_size, *cfg.maze_test_sizes]:
        cells_per_side(size)
    if not cfg.maze_test_sizes:
        raise UserError("data.maze_test_sizes is empty: give the sizes to test at, e.g. [9, 13, 17]")
    if int(cfg.maze_seed) != cfg.maze_seed or cfg.maze_seed < 0:
        raise UserError(f"data.maze_seed must be an integer >= 0, got {cfg.maze_seed}")
    bad = [f"data.maze_{k}={getattr(cfg, 'maze_' + k)}" for k in ("train", "val", "test")
           if getattr(cfg, "maze_" + k) < 1]
    if bad:
        raise UserError(f"maze split sizes must be >= 1: {', '.join(bad)}")
    px = maze_pixels(cfg.maze_size)
    if cfg.img_size is not None and cfg.img_size != px:
        raise UserError(f"mazes are not resized: a {cfg.maze_size}x{cfg.maze_size} maze is {px} pixels, so "
                        f"data.img_size must be null or {px} (got {cfg.img_size})")


def build_mazes(cfg: DataConfig, with_train: bool = True) -> Tuple[Optional[MazeDataset], MazeDataset]:
    """(train, validation) at the training size ``data.maze_size``; the validation split (what a run
    evaluates and picks its best checkpoint on) holds no training maze."""
    check_maze_cfg(cfg)
    size, seed = cfg.maze_size, cfg.maze_seed
    seen: Set[bytes] = set()
    xtr, ytr = make_mazes(cfg.maze_train, size, seed, "train", keys_out=seen)
    xva, yva = make_mazes(cfg.maze_val, size, seed, "val", exclude=seen)
    return (MazeDataset(xtr, ytr, size) if with_train else None), MazeDataset(xva, yva, size)


def maze_test_sets(cfg: DataConfig) -> Dict[int, MazeDataset]:
    """{size: test mazes} for every size of ``data.maze_test_sizes`` (``data.maze_test`` each); at the
    training size the test split holds no maze of the training or validation split."""
    check_maze_cfg(cfg)
    seed, out = cfg.maze_seed, {}
    for size in sorted(set(cfg.maze_test_sizes)):
        exclude = seen_keys(cfg.maze_train, cfg.maze_val, size, seed) if size == cfg.maze_size else None
        out[size] = MazeDataset(*make_mazes(cfg.maze_test, size, seed, "test", exclude=exclude), size)
    return out


def seen_keys(n_train: int, n_val: int, size: int, seed: int) -> Set[bytes]:
    """The keys of every maze a run with these splits trained or validated on (its training split, then its
    validation split, drawn as build_mazes draws them): what a test split at the training size excludes."""
    seen: Set[bytes] = set()
    make_mazes(n_train, size, seed, "train", keys_out=seen)
    make_mazes(n_val, size, seed, "val", exclude=set(seen), keys_out=seen)
    return seen


__all__ = ["CLASS_NAMES", "MazeDataset", "build_mazes", "carve", "cells_per_side", "draw", "make_mazes",
           "maze_pixels", "maze_test_sets", "seen_keys", "to_pixels"]
