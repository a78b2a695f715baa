"""A maze model reads mazes (issue 57, item 6): an image that is not a maze in the easy-to-hard format (1x1,
8x8, 64x64 px, a photo, a maze without its frame, start or goal) is refused in one line, nothing written."""
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from recurvit.data.mazes import make_mazes, maze_problem


def _maze(size=9):
    images, _ = make_mazes(1, size=size, seed=0, split="test")
    return images[0].transpose(1, 2, 0).copy()  # (H, W, 3) uint8


def test_real_mazes_of_every_size_pass_and_broken_ones_say_why():
    for size in (3, 9, 13, 33):
        assert maze_problem(_maze(size)) is None, size
    m = _maze()
    assert "not RGB" in maze_problem(m[..., 0])
    assert "square" in maze_problem(m[:, :20])
    assert "2s + 6 pixels" in maze_problem(np.zeros((8, 8, 3), np.uint8))
    assert "2s + 6 pixels" in maze_problem(np.zeros((1, 1, 3), np.uint8))
    rng = np.random.default_rng(0)
    assert "other colours" in maze_problem(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    framed = m.copy()
    framed[0, 5] = 255
    assert "frame" in maze_problem(framed)
    half = m.copy()
    half[1, 1] = 255 - half[1, 1]
    assert "2 x 2" in maze_problem(half)
    no_goal = m.copy()
    no_goal[(no_goal == [255, 0, 0]).all(-1)] = 255
    assert "0 goal" in maze_problem(no_goal)
    jpeg_like = np.clip(m.astype(int) + rng.integers(-30, 30, m.shape), 0, 255).astype(np.uint8)
    assert maze_problem(jpeg_like) is None  # a lossy copy still reads


@pytest.mark.slow
def test_predict_refuses_a_picture_that_is_no_maze_in_one_line(tmp_path):
    def recurvit(*args):
        return subprocess.run([sys.executable, "-m", "recurvit", *map(str, args)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)

    r = recurvit("train", "mazes/dt_recall_deepthinking", "model.width=4", "model.steps=2", "data.maze_train=50",
                 "data.maze_val=10", "data.maze_test=5", "data.maze_test_sizes=[9]", "train.epochs=1",
                 "train.progress=false", "--out", "run")
    assert r.returncode == 0, r.stderr[-1000:]
    Image.fromarray(_maze(13)).save(tmp_path / "maze.png")
    r = recurvit("predict", "run", "maze.png", "--json")
    assert r.returncode == 0 and (tmp_path / "maze.path.png").is_file(), r.stderr
    for side in (1, 8, 64):
        Image.fromarray(np.full((side, side, 3), 255, np.uint8)).save(tmp_path / f"p{side}.png")
        r = recurvit("predict", "run", f"p{side}.png")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert f"p{side}.png is not a maze image" in r.stderr and not (tmp_path / f"p{side}.path.png").exists()
