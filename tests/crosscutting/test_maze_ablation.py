"""scripts/maze_ablation.py: issue 55's from-scratch ablation rule (committed before the ablation's first epoch) on
made-up curves, and the command as a user runs it, in a fresh process from a folder outside the repository."""
import json
import subprocess
import sys
from pathlib import Path
from tests.conftest import load_script
from tests.crosscutting.test_maze_widths import curve

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "maze_ablation.py"
ma = load_script("scripts/maze_ablation.py")


def test_the_rule_reads_every_epoch_from_5_both_ways():
    ref = curve([0.68, 0.64, 0.62, 0.60, 0.59, 0.57])
    assert ma.verdict(ref, curve([0.3, 0.3, 0.3, 0.3])) == "undecided"  # nothing from epoch 5 yet
    assert ma.verdict(ref, curve([0.7, 0.7, 0.7, 0.7, 0.58, 0.56])) == "faster (epochs 5-6)"  # exactly the margin
    assert ma.verdict(ref, curve([0.1, 0.1, 0.1, 0.1, 0.60, 0.60])) == "slower (epochs 5-6)"
    assert ma.verdict(ref, curve([0.1, 0.1, 0.1, 0.1, 0.50, 0.60])) == "not separated (epochs 5-6)"  # one each way
    assert ma.verdict(ref, curve([0.1, 0.1, 0.1, 0.1, 0.585, 0.50])) == "not separated (epochs 5-6)"  # inside


def _metrics(folder: Path, losses, solved) -> Path:
    folder.mkdir(parents=True)
    lines = [json.dumps({"epoch": e, "train_loss": v, "val_solved_open": s})
             for e, (v, s) in enumerate(zip(losses, solved), start=1)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "metrics.jsonl"


def test_the_command_writes_the_table_and_verdict_from_outside_the_repository(tmp_path):
    pilot = _metrics(tmp_path / "pilot", [0.68, 0.64, 0.62, 0.60, 0.59, 0.57, 0.56], [0] * 7)
    abl = _metrics(tmp_path / "abl", [0.66, 0.60, 0.55, 0.50, 0.45, 0.40], [0, 0, 0, 0.01, 0.05, 0.2])
    res = subprocess.run([sys.executable, str(SCRIPT), f"{pilot}:the pilot", f"{abl}:no throttle", "--out", "out"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "out" / "compare.md").read_text()
    assert "no throttle against the pilot: **faster (epochs 5-6)**" in text
    assert "| 6 | 4,800 | 0.5700 (0.0) | 0.4000 (20.0) | -0.1700 |" in text  # the ablation's epochs only
    assert "| 7 |" not in text and (tmp_path / "out" / "compare.png").stat().st_size > 1000


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (["nope.jsonl", "x"], [str(tmp_path / "metrics.jsonl:a"), str(tmp_path / "metrics.jsonl:b")]):
        res = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", "o"], capture_output=True, text=True,
                             cwd=tmp_path)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and "METRICS.jsonl:LABEL" in res.stderr
        assert not (tmp_path / "o").exists()
