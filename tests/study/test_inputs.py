"""The history column from every file a claim reads (recurvit.study.inputs): a trend over budgets reads other
studies' results folders, and when some of them were committed before its rule the row is "mixed", decided on
the points committed after the rule alone (a registered study's confirmatory reading) beside every point."""
import subprocess
from pathlib import Path

import yaml

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.study.findings import collect
from recurvit.study.findings_md import by_source, render, strongest
from recurvit.study.inputs import seed_ranges
from tests.study.test_findings import c, repo, rows, write_csv

REG = {"n": 3, "seeds": [0, 1, 2], "checkpoint": "last", "budget": "30 epochs"}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def commit(root: Path, msg: str) -> None:
    git(root, "add", "-A"), git(root, "commit", "-qm", msg)


def trend(data: str = "") -> dict:
    return c("trend", budgets={3: "../results/short", 10: "../results/mid", 30: "../results/tiny"},
             x_name="epochs", log2=True, side=-1, paired=True, a={"regime": "vit"}, b={"regime": "naive"},
             label="gap slope", **({"data": data} if data else {}))


def test_a_trend_reading_folders_committed_before_its_rule_is_mixed_and_decided_on_the_rest(tmp_path):
    root = repo(tmp_path, {})
    (root / "studies" / "tiny.yaml").unlink()  # no study yet: only the earlier budgets' results
    git(root, "init", "-q"), git(root, "config", "user.email", "t@t"), git(root, "config", "user.name", "t")
    for folder, gap in (("short", 0.06), ("mid", 0.04)):
        write_csv(root / "results" / folder, rows({"naive": 0.80, "ds3": 0.80, "vit": 0.80 + gap}))
    commit(root, "two budgets' results, read before any rule")
    repo(tmp_path, {"gap_shrinks": trend("Fashion-MNIST, 3 / 10 / 30 epochs (seeds 0-4 / 0-2 / 7)")})
    path = root / "studies" / "tiny.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "registration": REG}, sort_keys=False))
    commit(root, "the registration, with the trend over the budgets")
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.82}))
    commit(root, "the registered budget's results")
    (line,) = collect(root)
    assert line.evidence.status == "confirmatory"
    # 6 points (2 budgets x 3 seeds) were committed before the rule, 3 after: not "before"
    assert line.came == "mixed: 6 before, 3 after"
    # the confirmatory reading: the registered points alone, one budget, no slope; every point: exploratory
    assert line.verdict == "not measured" and line.all_points == "reproduced"
    assert line.figure.startswith("registered points only (30 epochs: 3 points): gap slope: fewer than 3 distinct x")
    assert "all 9 points (3 and 10 epochs: 6 points committed before the rule): gap slope: -" in line.figure
    # the seeds of each budget are read from the files, not from the typed words
    assert line.data == "Fashion-MNIST, 3 / 10 / 30 epochs (seeds 0-2 / 0-2 / 0-2)"
    text = render(root)
    assert "| mixed: 6 before, 3 after |" in text
    assert "**not measured** (registered points); all points: **reproduced** (exploratory) |" in text
    assert "Mixed rows (results read from before and after their rule), read on every point: 1 (1 reproduced" in text
    # counted once, by its decided (exploratory) reading: never a confirmed claim
    (best,) = strongest([line]).values()
    assert best.verdict == "reproduced" and best.evidence.status == "exploratory"
    summary = by_source([line])
    got = dict(zip(summary[0].strip("| ").split(" | "), summary[2].strip("| ").split(" | ")))
    assert got["confirmed"] == "0" and got["reproduced (exploratory)"] == "1"


def test_a_trend_whose_every_input_came_after_its_rule_is_before(tmp_path):
    root = repo(tmp_path, {"gap_shrinks": trend()})
    git(root, "init", "-q"), git(root, "config", "user.email", "t@t"), git(root, "config", "user.name", "t")
    commit(root, "the rule")
    for folder, gap in (("short", 0.06), ("mid", 0.04), ("tiny", 0.02)):
        write_csv(root / "results" / folder, rows({"naive": 0.80, "ds3": 0.80, "vit": 0.80 + gap}))
    commit(root, "every budget's results")
    (line,) = collect(root)
    assert line.came == "before" and line.all_points is None and line.verdict == "reproduced"
    # a rule rewritten after every input it reads came after all of them: "after", not mixed
    git(root, "mv", "results/short", "results/early"), commit(root, "a folder moved")
    repo(tmp_path, {"gap_shrinks": {**trend(), "budgets": {3: "../results/early", 10: "../results/mid",
                                                           30: "../results/tiny"}}})
    commit(root, "the rule names the moved folder")
    (line,) = collect(root)
    assert line.came.startswith("after")  # every input was committed before this version of the rule


def test_seed_ranges():
    assert seed_ranges(["2", "0", "1", "5", "10", "11"]) == "0-2, 5, 10-11"
    assert seed_ranges([]) == "none"
