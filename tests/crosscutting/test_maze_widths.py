"""scripts/maze_widths.py: issue 55's widening rule (committed before the epochs it judges), on made-up curves, and
the committed results/mazes_pilot/widths.md regenerates byte for byte from the committed metrics."""
import json
import subprocess
import sys
from pathlib import Path
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
mw = load_script("scripts/maze_widths.py")


def curve(losses):
    return {e: {"epoch": e, "train_loss": v} for e, v in enumerate(losses, start=1)}


def test_the_rule_needs_every_epoch_from_5_below_by_the_margin():
    ref = curve([0.68, 0.64, 0.62, 0.60, 0.59, 0.57])
    assert mw.verdict(ref, curve([0.60, 0.60, 0.60, 0.60])) == "undecided"  # nothing from epoch 5 yet
    assert mw.verdict(ref, curve([0.68, 0.64, 0.62, 0.60, 0.58, 0.56])) == "faster a step (epochs 5-6)"
    # 0.005 below is inside the margin: not faster, and the first epoch that misses is named
    assert mw.verdict(ref, curve([0.5, 0.5, 0.5, 0.5, 0.585, 0.50])) == "not faster (epoch 5 misses)"
    assert mw.verdict(ref, curve([0.5, 0.5, 0.5, 0.5, 0.50, 0.575])) == "not faster (epoch 6 misses)"


def test_bad_spec_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "maze_widths.py"), "nope.jsonl", "--out",
                          str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "METRICS.jsonl:WIDTH" in res.stderr


def test_committed_table_regenerates(tmp_path):
    committed = ROOT / "results" / "mazes_pilot" / "widths.md"
    first = committed.read_text().splitlines()[2]
    args = first.split("`python scripts/maze_widths.py ")[1].split(" --out")[0].split()
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "maze_widths.py"), *args, "--out",
                          "results/mazes_pilot"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2  # from outside the repository the relative paths do not exist: one line, no file
    for a in args:
        if a.startswith("--"):
            continue
        path = a.rpartition(":")[0]
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text())
    subprocess.run([sys.executable, str(ROOT / "scripts" / "maze_widths.py"), *args, "--out", "results/mazes_pilot"],
                   check=True, capture_output=True, cwd=tmp_path)
    assert (tmp_path / "results" / "mazes_pilot" / "widths.md").read_text() == committed.read_text()
    assert json.loads((ROOT / args[0].rpartition(":")[0]).read_text().splitlines()[0])["epoch"] == 1


def _reading(decided, *verdicts, done=50):
    rows = [{"checkpoint": "epoch 50 (40,000 steps)" if i == 0 else "best.pt (epoch 44, chosen on validation)",
             "epoch": 50 if i == 0 else 44, "steps": 40000, "solved_9_10T": 0.5, "solved_33_10T": 0.0, "verdict": v}
            for i, v in enumerate(verdicts)]
    return {"decided": decided, "done": done, "epochs": 50, "steps": 40000, "rows": rows}


def test_rule_4_stops_only_when_every_width_has_failed_its_rule():
    fails, meets = _reading(True, "fails: 33x33 0.0% < 90%", "meets"), _reading(True, "meets", "meets")
    pending = _reading(False, "fails: 9x9 50.0% < 95%", done=33)
    assert mw.rule1_word(fails) == "fails" and mw.rule1_word(meets) == "meets" and mw.rule1_word(pending) == "undecided"
    stop = "stop at the pilot"
    assert stop in mw.stop_rule(16, {16: fails}, {32: "not faster (epoch 5 misses)"})
    assert stop in mw.stop_rule(16, {16: fails, 32: fails}, {32: "faster a step (epochs 5-50)"})
    assert "undecided" in mw.stop_rule(16, {16: fails}, {32: "faster a step (epochs 5-9)"})  # width 32 still running
    assert "undecided" in mw.stop_rule(16, {16: pending}, {32: "not faster (epoch 5 misses)"})
    assert "width 32 reproduces" in mw.stop_rule(16, {16: fails, 32: meets}, {32: "faster a step (epochs 5-50)"})
    line = mw.rule1_line(16, pending)
    assert "**undecided** after 33 of 50 epochs" in line and "epoch 50 at 40,000 steps, 50.0% of 9x9" in line
    assert "**fails** at 40,000 steps: the last checkpoint (epoch 50) 50.0% of 9x9" in mw.rule1_line(16, fails)
    assert "best.pt (epoch 44)" in mw.rule1_line(16, fails)
