"""Mazes generated in-process (data/mazes.py): the easy-to-hard image layout, perfect mazes whose one path
is the target, seeded and prefix-stable streams, splits disjoint from the training split."""
from collections import deque

import numpy as np
import pytest
import torch

from recurvit.config import DataConfig
from recurvit.data import build_datasets
from recurvit.data.mazes import (GOAL, START, MazeDataset, make_mazes, maze_pixels, maze_test_sets)
from recurvit.errors import UserError


def _grid(image):
    """(3, H, W) image -> (open (g, g) bool, start (r, c), goal (r, c)) read back from the pixels."""
    g = image[:, 1:-1:2, 1:-1:2]  # one pixel per 2 x 2 square, inside the 1-pixel frame
    rgb = g.transpose(1, 2, 0)
    start = np.argwhere((rgb == START).all(-1))
    goal = np.argwhere((rgb == GOAL).all(-1))
    assert len(start) == 1 and len(goal) == 1
    return rgb.any(-1), tuple(start[0]), tuple(goal[0])


def _bfs(opened, src):
    parent, todo = {src: None}, deque([src])
    while todo:
        r, c = todo.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if opened[nr, nc] and (nr, nc) not in parent:  # the wall all round keeps nr, nc inside
                parent[(nr, nc)] = (r, c)
                todo.append((nr, nc))
    return parent


@pytest.mark.parametrize("size", [9, 33])
def test_the_image_layout_is_the_easy_to_hard_format(size):
    images, targets = make_mazes(20, size, seed=0)
    px = 2 * size + 6  # 24 for 9x9, 72 for 33x33
    assert maze_pixels(size) == px
    assert images.shape == (20, 3, px, px) and images.dtype == np.uint8
    assert targets.shape == (20, px, px) and targets.dtype == np.uint8
    assert set(np.unique(targets)) == {0, 1}
    for a in (images, targets[:, None]):  # every grid square is a uniform 2 x 2 block inside a black frame
        inner = a[..., 1:-1, 1:-1]
        for dr, dc in ((0, 1), (1, 0), (1, 1)):
            assert (inner[..., dr::2, dc::2] == inner[..., ::2, ::2]).all()
        assert not a[..., 0, :].any() and not a[..., -1, :].any() and not a[..., :, 0].any() and not a[..., :, -1].any()
    colours = {tuple(p) for p in images.transpose(0, 2, 3, 1).reshape(-1, 3)}
    assert colours == {(0, 0, 0), (255, 255, 255), START, GOAL}
    k = (size + 1) // 2
    for image in images:
        opened, start, goal = _grid(image)
        assert opened.shape == (2 * k + 1,) * 2
        assert opened[1::2, 1::2].all() and not opened[::2, ::2].any()  # cells open, wall corners closed
        assert not opened[0].any() and not opened[-1].any() and not opened[:, 0].any() and not opened[:, -1].any()
        assert start != goal and start[0] % 2 == start[1] % 2 == goal[0] % 2 == goal[1] % 2 == 1
        assert opened.sum() - k * k == k * k - 1  # a spanning tree: one passage fewer than cells


@pytest.mark.parametrize("size", [9, 13])
def test_the_path_is_unique_and_connects_start_and_goal(size):
    images, targets = make_mazes(30, size, seed=3)
    for image, target in zip(images, targets):
        opened, start, goal = _grid(image)
        parent = _bfs(opened, start)
        assert len(parent) == opened.sum()  # connected; with cells - 1 passages, a tree: one path between two cells
        path, node = np.zeros_like(opened), goal
        while node is not None:
            path[node] = True
            node = parent[node]
        assert (target[1:-1:2, 1:-1:2] == path).all()
        assert target[1:-1:2, 1:-1:2][start] and target[1:-1:2, 1:-1:2][goal]


def test_the_same_seed_gives_the_same_mazes_and_another_seed_others():
    a, ta = make_mazes(1500, 9, seed=0)
    b, tb = make_mazes(1500, 9, seed=0)
    c, _ = make_mazes(1500, 9, seed=1)
    assert (a == b).all() and (ta == tb).all()
    assert (a != c).any(axis=(1, 2, 3)).mean() > 0.99
    short, _ = make_mazes(700, 9, seed=0)  # a split is the prefix of any longer one
    assert (short == a[:700]).all()
    val, _ = make_mazes(1500, 9, seed=0, split="val")
    assert (val != a).any(axis=(1, 2, 3)).mean() > 0.99


def test_validation_and_test_splits_hold_no_training_maze():
    # 5x5 mazes (3 x 3 cells) come in 864 kinds: 300 training mazes meet about a third of the validation draws
    cfg = DataConfig(name="mazes", maze_size=5, maze_train=300, maze_val=100, maze_test=100, maze_test_sizes=[5, 9])
    train, val, info = build_datasets(cfg)
    seen = {bytes(x.numpy()) for x in train.images}
    assert len(val) == 100 and not {bytes(x.numpy()) for x in val.images} & seen
    assert (val.images[:5] != torch.from_numpy(make_mazes(5, 5, split="val")[0])).any()  # something was skipped
    tests = maze_test_sets(cfg)
    assert sorted(tests) == [5, 9] and len(tests[5]) == len(tests[9]) == 100
    held = {bytes(x.numpy()) for x in tests[5].images}
    assert not held & seen and not held & {bytes(x.numpy()) for x in val.images}
    assert tests[9].images.shape[-1] == 24


def test_mazes_load_through_the_data_layer():
    cfg = DataConfig(name="mazes", maze_train=64, maze_val=16, maze_test=8, maze_test_sizes=[9, 17])
    train, val, info = build_datasets(cfg)
    assert isinstance(train, MazeDataset) and (len(train), len(val)) == (64, 16)
    assert (info.img_size, info.in_chans, info.num_classes) == (24, 3, 2)
    x, y = train[0]
    assert x.shape == (3, 24, 24) and x.dtype == torch.float32 and set(x.unique().tolist()) <= {0.0, 1.0}
    assert y.shape == (24, 24) and y.dtype == torch.long
    x, y = next(iter(torch.utils.data.DataLoader(val, batch_size=4)))
    assert x.shape == (4, 3, 24, 24) and y.shape == (4, 24, 24)
    assert maze_test_sets(cfg)[17][0][0].shape == (3, 40, 40)
    train, _, _ = build_datasets(DataConfig(name="mazes", maze_train=64, maze_val=16, holdout=0.25))
    assert len(train) == 48


def test_bad_maze_options_are_one_line_errors():
    for bad, match in ((dict(maze_size=8), "odd integer >= 3"), (dict(maze_test_sizes=[9, 1]), "odd integer"),
                       (dict(maze_val=0), "maze_val=0"), (dict(img_size=32), "img_size must be null or 24"),
                       (dict(maze_seed=-1), "maze_seed must be an integer >= 0"),
                       (dict(maze_test_sizes=[]), "maze_test_sizes is empty")):
        with pytest.raises(UserError, match=match):
            build_datasets(DataConfig(name="mazes", maze_train=8, **bad))
    with pytest.raises(UserError, match="too few distinct 3x3 mazes"):  # the search makes 24 kinds of 3x3 maze
        build_datasets(DataConfig(name="mazes", maze_size=3, maze_train=500, maze_val=10))
