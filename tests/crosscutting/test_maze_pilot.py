"""scripts/maze_pilot.py's drift from initialisation: the weights it rebuilds are exactly the ones `recurvit train`
started from (a run whose steps cannot move a weight has drifted 0.0 in every part), and a run that learns has
moved its shared block by a measurable fraction, which the report states."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("maze_pilot", ROOT / "scripts" / "maze_pilot.py")
mp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mp)

TINY = ["data.maze_train=60", "data.maze_val=20", "data.maze_test=10", "data.maze_test_sizes=[9]", "train.epochs=1",
        "model.steps=3", "train.progress=false", "train.keep_every=1"]


def _train(out: Path, *overrides: str) -> Path:
    subprocess.run([sys.executable, "-m", "recurvit", "train", str(ROOT / "configs/mazes/dt_recall_deepthinking.yaml"),
                    *TINY, *overrides, "--out", str(out)], check=True, capture_output=True, cwd=out.parent)
    return out


@pytest.mark.slow
def test_the_rebuilt_initialisation_is_the_one_training_started_from(tmp_path):
    still = _train(tmp_path / "still", "train.lr=1e-30")  # Adam's step of 1e-30 leaves float32 weights as they are
    assert mp.drift(mp.initial_weights(still), still / "last.pt") == {
        "projection": 0.0, "recurrent block": 0.0, "head": 0.0}
    moved = _train(tmp_path / "moved", "train.lr=1e-2", "train.lr_throttle=false", "train.warmup_epochs=0")
    d = mp.drift(mp.initial_weights(moved), moved / "epoch_0001.pt")
    assert 0 < d["recurrent block"] < 1 and 0 < d["head"], d  # a wrong w0 (another draw) would be about 1.4
    lines = mp.drift_lines(moved, still, 800)
    assert lines[-2].startswith("| moved epoch 1 (800 steps) | ") and lines[-1].startswith("| reference: still, ")
