"""scripts/maze_pilot.py's drift from initialisation: the weights it rebuilds are exactly the ones `recurvit train`
started from (a run whose steps cannot move a weight has drifted 0.0 in every part), and a run that learns has
moved its shared block by a measurable fraction, which the report states."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
mp = load_script("scripts/maze_pilot.py")

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


def _curve(solved_at_10t: dict, T: int = 30) -> dict:
    return {size: {T: (0.0, 0.0, 1.0), 10 * T: (0.0, v, 1.0)} for size, v in solved_at_10t.items()}


def test_rule_1_needs_both_sizes_at_10t():
    assert mp.rule1(_curve({9: 0.95, 13: 0.0, 33: 0.90}), 30) == "meets"  # the bars themselves pass
    assert mp.rule1(_curve({9: 0.94, 33: 0.95}), 30) == "fails: 9x9 94.0% < 95%"
    assert mp.rule1(_curve({9: 1.0, 33: 0.89}), 30) == "fails: 33x33 89.0% < 90%"
    assert mp.rule1(_curve({9: 1.0}), 30) == "undecided: 33x33 not swept to 300 iterations"
    assert mp.rule1(_curve({9: 1.0, 33: 1.0}, T=12), 30).startswith("undecided")  # swept to 120, not 10T = 300


@pytest.mark.slow
def test_report_decides_rule_1_on_the_last_checkpoint_and_best_once_the_run_is_complete(tmp_path):
    run = _train(tmp_path / "run", "train.lr=1e-3")
    out = tmp_path / "pilot"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "maze_pilot.py"), str(run), "--out", str(out),
                          "--steps", "30", "--sizes", "9", "33", "--mazes", "4"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (out / "best" / "horizon.csv").is_file() and (out / "epoch_0001" / "horizon.csv").is_file()
    report = (out / "report.md").read_text()
    rows = report.split("## Rule 1")[1].splitlines()
    last = next(r for r in rows if r.startswith("| epoch 1 (800 steps) |"))
    best = next(r for r in rows if r.startswith("| best.pt (epoch 1, chosen on validation) |"))
    c = mp.curves(out / "best")
    assert best.split(" | ")[1] == f"{100 * c[9][30][1]:.1f}" and best.split(" | ")[3].rstrip(" |") == mp.rule1(c, 3)
    assert last.split(" | ")[3].startswith("fails: ") and "33x33 0.0% < 90%" in last  # one epoch of 60 mazes
    assert "Undecided" not in report
    reading = json.loads((out / "rule1.json").read_text())
    assert reading["decided"] and [r["epoch"] for r in reading["rows"]] == [1, 1]
    assert reading["rows"][1]["verdict"] == mp.rule1(c, 3)
