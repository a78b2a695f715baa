"""scripts/fork_run.py (issue 55's ablations): a fork with nothing changed trains its parent's next epoch bit for bit;
a fork with the block's lr scale changed trains that epoch with the new scale and nothing else changed; a fork with
the depth changed trains at the new depth, its block's lr scale the parent's; bad input is one line and exit 2 with
nothing written. Every command in a fresh process, from a folder outside the repository."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
FORK = ROOT / "scripts" / "fork_run.py"
TINY = ["data.maze_train=60", "data.maze_val=20", "data.maze_test=10", "data.maze_test_sizes=[9]", "model.steps=3",
        "train.progress=false", "train.warmup_epochs=0"]


def _run(cwd: Path, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *cmd], capture_output=True, text=True, cwd=cwd)


def _epochs(run: Path) -> list:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def _block_groups(run: Path) -> list:
    groups = torch.load(run / "last.pt", map_location="cpu", weights_only=False)["optimizer"]["param_groups"]
    return [(g["lr_scale"], g["lr"]) for g in groups if "lr_scale" in g]


@pytest.mark.slow
def test_a_fork_replays_its_parent_or_changes_only_the_block_lr(tmp_path):
    res = _run(tmp_path, "-m", "recurvit", "train", str(ROOT / "configs/mazes/dt_recall_deepthinking.yaml"), *TINY,
               "train.epochs=1", "--out", "parent")
    assert res.returncode == 0, res.stderr
    assert _run(tmp_path, str(FORK), "parent", "--out", "same").returncode == 0
    res = _run(tmp_path, str(FORK), "parent", "--out", "fast", "--block-lr-scale", "1")
    assert res.returncode == 0 and "block lr_scale 0.333333 -> 1" in res.stdout, res.stdout + res.stderr
    assert json.loads((tmp_path / "fast" / "fork.json").read_text())["changed"] == {"block lr_scale": [1 / 3, 1.0]}
    res = _run(tmp_path, str(FORK), "parent", "--out", "shallow", "--steps", "2")
    assert res.returncode == 0 and "model.steps 3 -> 2" in res.stdout, res.stdout + res.stderr
    before, after = (torch.load(tmp_path / r / "last.pt", weights_only=False) for r in ("parent", "shallow"))
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    for run in ("parent", "same", "fast", "shallow"):
        res = _run(tmp_path, "-m", "recurvit", "train", "--resume", run, "train.epochs=2")
        assert res.returncode == 0, res.stderr
    parent, same, fast, shallow = (_epochs(tmp_path / r) for r in ("parent", "same", "fast", "shallow"))
    assert [m["train_loss"] for m in same] == [m["train_loss"] for m in parent]  # bit for bit, both epochs
    assert fast[0] == parent[0] and fast[1]["train_loss"] != parent[1]["train_loss"]
    assert shallow[0] == parent[0] and shallow[1]["train_loss"] != parent[1]["train_loss"]
    assert _block_groups(tmp_path / "parent") == [(1 / 3, 1e-3 / 3)]  # the throttle: lr / T, T = 3
    assert _block_groups(tmp_path / "fast") == [(1.0, 1e-3)]
    assert _block_groups(tmp_path / "shallow") == [(1 / 3, 1e-3 / 3)]  # the depth changed, not the block's lr
    from recurvit.config import load_config

    assert load_config(tmp_path / "shallow" / "config.yaml").model.steps == 2  # resumed at T = 2, and says so
    assert json.loads((tmp_path / "shallow" / "fork.json").read_text())["changed"] == {"model.steps": [3, 2]}


def test_a_depth_fork_changes_one_line_of_its_parents_config(tmp_path):
    """The fork writes the parent's config.yaml with model.steps changed and nothing else: a key this checkout's
    schema added since would make the fork unreadable to the older code a pilot's worktree resumes it with."""
    import yaml

    fr = load_script("scripts/fork_run.py")
    (tmp_path / "run").mkdir()
    parent = "model:\n  name: dt_net_recall\n  steps: 30\ntrain:\n  depth:\n    progressive: 0.01\n"
    (tmp_path / "run" / "config.yaml").write_text(parent)  # an older schema: no train.depth.random_start
    from recurvit.run.checkpoint import FORMAT

    torch.save({"format": FORMAT, "config": yaml.safe_load(parent), "model": {}, "epoch": 3,
                "optimizer": {"param_groups": []}}, tmp_path / "run" / "last.pt")
    assert fr.fork(tmp_path / "run", tmp_path / "deep", None, 12)["changed"] == {"model.steps": [30, 12]}
    assert (tmp_path / "deep" / "config.yaml").read_text() == parent.replace("steps: 30", "steps: 12")
    assert torch.load(tmp_path / "deep" / "last.pt", weights_only=False)["config"]["model"]["steps"] == 12


def test_bad_input_is_one_line_and_exit_2_with_nothing_written(tmp_path):
    res = _run(tmp_path, str(FORK), "nowhere", "--out", "f1")  # the command, as a user runs it
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("error: ")
    assert not (tmp_path / "f1").exists()
    fr = load_script("scripts/fork_run.py")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("kept")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    (tmp_path / "run" / "last.pt").write_bytes(b"")
    for run, out, scale, why in ((tmp_path, "f2", None, "not a run directory"), ("run", "busy", None, "not empty"),
                                 ("run", "f3", 0.0, "positive"), ("run", "f4", float("nan"), "positive")):
        with pytest.raises(ValueError, match=why):
            fr.fork(tmp_path / run, tmp_path / out, scale)
    with pytest.raises(ValueError, match="positive integer"):
        fr.fork(tmp_path / "run", tmp_path / "f5", None, 0)
    assert (tmp_path / "busy" / "x").read_text() == "kept" and not list(tmp_path.glob("f[2345]"))
