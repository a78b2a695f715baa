"""scripts/maze_widths.py: issue 55's widening rule (committed before the epochs it judges), on made-up curves, and
the committed results/mazes_pilot/widths.md regenerates byte for byte from the committed metrics."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("maze_widths", ROOT / "scripts" / "maze_widths.py")
mw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mw)


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
        path = a.rpartition(":")[0]
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text())
    subprocess.run([sys.executable, str(ROOT / "scripts" / "maze_widths.py"), *args, "--out", "results/mazes_pilot"],
                   check=True, capture_output=True, cwd=tmp_path)
    assert (tmp_path / "results" / "mazes_pilot" / "widths.md").read_text() == committed.read_text()
    assert json.loads((ROOT / args[0].rpartition(":")[0]).read_text().splitlines()[0])["epoch"] == 1
