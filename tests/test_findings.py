"""The findings table (recurvit.study.findings, scripts/findings.py): every claim declared in a study
file or in studies/claims.yaml gets a row with its data, rule, history and verdict, read from results
files in the format `recurvit study` writes."""
import csv
import importlib.util
import subprocess
from pathlib import Path

import pytest
import yaml

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.errors import UserError
from recurvit.study.findings import collect
from recurvit.study.findings_md import render

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("findings_script", ROOT / "scripts" / "findings.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def write_csv(folder: Path, rows):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)


def repo(tmp_path: Path, claims: dict, studyless: dict = None) -> Path:
    """A tiny repository: one study file with claims, its base config, optionally studies/claims.yaml."""
    (tmp_path / "studies").mkdir(parents=True, exist_ok=True)
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "base.yaml").write_text("model: {name: bvit_tiny}\n")
    doc = {"name": "tiny", "base": "../configs/base.yaml", "results": "../results/tiny",
           "grid": {"regime": {"naive": {}, "ds3": {}, "vit": {}}, "train.seed": [0, 1, 2]}, "claims": claims}
    (tmp_path / "studies" / "tiny.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    if studyless is not None:
        (tmp_path / "studies" / "claims.yaml").write_text(yaml.safe_dump({"claims": studyless}, sort_keys=False))
    return tmp_path


def rows(acc: dict, spread=(0.0, 0.002, -0.002)):
    return [{"run_id": f"{g}__seed={s}", "regime": g, "train.seed": s, "acc_T": a + spread[s]}
            for g, a in acc.items() for s in range(3)]


def c(rule="superiority", source="Crossroads", words="w", **kw):
    return {"source": source, "words": words, "rule": rule, **kw}


def verdicts(root: Path) -> dict:
    return {ln.claim.id: ln.verdict for ln in collect(root)}


def test_rows_follow_their_rules_and_a_no_gain_claim_can_fail(tmp_path):
    root = repo(tmp_path, {
        "vit_ahead": c(a={"regime": "vit"}, b={"regime": "naive"}),
        "ds_no_gain": c("equivalence", margin=0.01, a={"regime": "ds3"}, b={"regime": "naive"}),
    })
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.801, "vit": 0.85}))
    assert verdicts(root) == {"vit_ahead": "reproduced", "ds_no_gain": "reproduced"}
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.85, "vit": 0.80}))
    # a real gain of deep supervision: the "no gain" claim fails; a tie is not a ViT lead
    assert verdicts(root) == {"vit_ahead": "not separable at this scale", "ds_no_gain": "not reproduced"}
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.80}, spread=(0, 0.03, -0.03)))
    # equal means, wide spread: an equivalence claim cannot pass on a wide interval (the old rule passed it)
    assert verdicts(root)["ds_no_gain"] == "not separable at this scale"


def test_a_study_without_results_says_so_and_a_renamed_label_is_an_error(tmp_path):
    root = repo(tmp_path, {"vit_ahead": c(a={"regime": "vit"}, b={"regime": "naive"})})
    (line,) = collect(root)
    assert line.verdict == "not measured yet" and "recurvit study studies/tiny.yaml" in line.figure
    repo(tmp_path, {"vit_ahead": c(a={"regime": "vit_tiny"}, b={"regime": "naive"})})
    with pytest.raises(UserError, match="no label 'vit_tiny'"):
        collect(root)


def test_studyless_rows_name_their_test_or_what_they_need(tmp_path):
    root = repo(tmp_path, {}, {
        "ident": c("identity", test="tests/test_x.py::test_y"),
        "big": c("needs", source="bViT", needs="ImageNet-1K and GPU time", command="recurvit train ..."),
    })
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("def test_y():\n    assert True\n")
    got = {ln.claim.id: (ln.verdict, ln.figure) for ln in collect(root)}
    assert got["ident"] == ("identity, tested", "`tests/test_x.py::test_y`")
    assert got["big"] == ("needs ImageNet-1K and GPU time", "`recurvit train ...`")
    (root / "tests" / "test_x.py").write_text("def test_z():\n    assert True\n")
    with pytest.raises(UserError, match="does not exist"):  # a renamed test is an error, not a stale row
        collect(root)


def test_a_benchmark_target_reads_the_interval_and_a_loaded_machine_is_not_a_verdict(tmp_path):
    """A benchmark row: its targets read the JSON a benchmark writes (``ratio.lo``: the lower end of the 95%
    interval), met or missed; a benchmark that found its machine loaded decides nothing; a figure the file
    lacks is an error, not a silent miss."""
    import json

    spec = c("benchmark", source="recurvit", file="bench/deploy.json", command="python bench.py",
             targets={"b1 onnx bvit over vit.lo": {"min": 1.0}, "b256 onnx bvit over vit.lo": {"min": 0.95}})
    root = repo(tmp_path, {}, {"speed": spec})
    (line,) = collect(root)
    assert line.verdict == "not measured yet" and "`python bench.py` has not run" in line.figure
    (root / "bench").mkdir()

    def write(loaded, b1_lo, b256_lo):
        ratios = {"b1 onnx bvit over vit": {"mean": 1.1, "lo": b1_lo, "hi": 1.2, "rounds": 10},
                  "b256 onnx bvit over vit": {"mean": 1.0, "lo": b256_lo, "hi": 1.05, "rounds": 10}}
        (root / "bench" / "deploy.json").write_text(json.dumps({"loaded": loaded, "ratios": ratios}))

    write(False, 1.02, 0.96)
    (line,) = collect(root)
    assert line.verdict == "target met" and "b1 onnx bvit over vit 1.100 [1.020, 1.200] (10 rounds)" in line.figure
    write(False, 0.98, 0.96)  # the mean clears 1.0, the interval does not: missed
    assert verdicts(root) == {"speed": "target missed"}
    write(True, 1.02, 0.96)
    assert verdicts(root) == {"speed": "not measured (machine loaded)"}
    write(False, float("nan"), 0.96)  # one round: no interval, no verdict
    assert verdicts(root) == {"speed": "not measured (no interval)"}
    (root / "bench" / "deploy.json").write_text("{half a file")
    with pytest.raises(UserError, match="not a benchmark's JSON"):
        collect(root)
    write(False, 1.02, 0.96)
    repo(tmp_path, {}, {"speed": {**spec, "targets": {"b1 eager bvit over vit.lo": {"min": 1.0}}}})
    with pytest.raises(UserError, match="no figure b1 eager bvit over vit.lo"):
        collect(root)
    with pytest.raises(UserError, match="needs `file`"):
        repo(tmp_path, {}, {"speed": {k: v for k, v in spec.items() if k != "file"}})
        collect(root)


def test_the_history_column_reads_git(tmp_path):
    root = repo(tmp_path, {"vit_ahead": c(a={"regime": "vit"}, b={"regime": "naive"})})
    for args in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"], ["add", "-A"],
                 ["commit", "-qm", "rule"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.85}))
    text = render(root)
    assert "| superiority (95% interval of the difference on the claimed side) | before |" in text
    assert ("Exploratory verdicts from study results: 1 rows (1 reproduced); 1 of them had their rule committed "
            "before their results with no seeds added after a verdict.") in text


def test_results_date_a_rule_from_its_own_cells_and_added_seeds_are_named(tmp_path):
    """The results of a claim are the runs of its cells (not a file that already has the columns from other
    cells); seeds added to its cells after a committed verdict, beyond the seeds a cell had then, make its
    level nominal (filling a cell up to them does not)."""
    def git(*args):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)

    def commit(msg):
        git("add", "-A"), git("commit", "-qm", msg)

    ahead = c(a={"regime": "vit"}, b={"regime": "naive"})
    root = repo(tmp_path, {"vit_ahead": ahead})
    git("init", "-q"), git("config", "user.email", "t@t"), git("config", "user.name", "t")
    commit("rule")
    full = rows({"naive": 0.80, "ds3": 0.80, "vit": 0.85})
    write_csv(root / "results" / "tiny", [r for r in full if r["regime"] == "vit"])  # one cell's runs only
    commit("vit results")
    late = {"vit_ahead": ahead, "both": c("all_of", parts=["vit_ahead", "ds_no_gain"]),
            "ds_no_gain": c("equivalence", margin=0.01, a={"regime": "ds3"}, b={"regime": "naive"}),
            "vit_over_ds3": c(a={"regime": "vit"}, b={"regime": "ds3"})}  # its vit cell was in view
    repo(tmp_path, late)
    commit("rules on cells with and without results")
    write_csv(root / "results" / "tiny", [r for r in full if r["run_id"] != "naive__seed=2"])
    commit("results but one naive seed")
    came = {ln.claim.id: ln.came for ln in collect(root)}
    # "both" reads vit_ahead's runs too, and vit's were in view when it was written
    assert came == {"vit_ahead": "before", "ds_no_gain": "before", "both": "after", "vit_over_ds3": "after"}
    write_csv(root / "results" / "tiny", full)  # naive filled up to the seeds the other cells had
    commit("the last naive seed")
    assert {ln.claim.id: ln.came for ln in collect(root)}["vit_ahead"] == "before"
    more = [{**r, "run_id": r["run_id"][:-1] + "3", "train.seed": 3} for r in full if r["run_id"] == "naive__seed=0"]
    write_csv(root / "results" / "tiny", full + more)  # a fourth naive seed, after reading three
    came = {ln.claim.id: ln.came for ln in collect(root)}
    nominal = "before; seeds per cell raised from 3 to 4 after a verdict was committed: nominal level"
    assert came["vit_ahead"] == came["ds_no_gain"] == nominal and came["both"] == "after"  # naive: in both
    assert ("Exploratory verdicts from study results: 4 rows (4 reproduced); 0 of them had their rule committed "
            "before their results with no seeds added after a verdict.") in render(root)


TARGETS = {"exit_drop_points": {"max": 0.5}, "exit_steps_pct_T": {"max": 60}, "exit_speedup": {"min": 1.4}}


def test_a_target_is_counted_per_seed_not_on_means(tmp_path):
    root = repo(tmp_path, {"exits": c("target", source="recurvit", a={"regime": "ds3"}, targets=TARGETS, label="ds3")})
    res = [{"exit_drop_points": 0.3, "exit_steps_pct_T": 40, "exit_speedup": 2.0},
           {"exit_drop_points": 0.7, "exit_steps_pct_T": 40, "exit_speedup": 2.0},  # drops too much
           {"exit_drop_points": 0.1, "exit_steps_pct_T": 55, "exit_speedup": 1.5}]
    write_csv(root / "results" / "tiny", [{**r, **(res[r["train.seed"]] if r["regime"] == "ds3" else {})}
                                          for r in rows({"naive": 0.8, "ds3": 0.8, "vit": 0.8})])
    (line,) = collect(root)
    assert line.verdict == "target met in 2 of 3 seeds"  # the means (0.37, 45%, 1.83x) would meet it
    assert "0.7, 40, 2" in line.figure and "exit_speedup ≥ 1.4" in render(root)
    with pytest.raises(UserError, match="targets"):
        collect(repo(tmp_path, {"exits": c("target", a={"regime": "ds3"}, targets={"exit_speedup": {"above": 1}})}))


def test_a_rule_set_after_an_earlier_copy_of_its_results_came_after(tmp_path):
    """``seen``: figures read in another file before they moved to the study's results date the results."""
    def git(*args):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)

    root = repo(tmp_path, {})
    git("init", "-q"), git("config", "user.email", "t@t"), git("config", "user.name", "t")
    (root / "results" / "old").mkdir(parents=True)
    (root / "results" / "old" / "report.md").write_text("the same figures, read first\n")
    git("add", "-A"), git("commit", "-qm", "old results")
    git("rm", "-rq", "results/old"), git("commit", "-qm", "old results go")
    claim = c(a={"regime": "vit"}, b={"regime": "naive"})
    repo(tmp_path, {"fresh": claim, "read_before": {**claim, "seen": ["results/old/report.md"]}})
    git("add", "-A"), git("commit", "-qm", "rules")
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.85}))
    git("add", "-A"), git("commit", "-qm", "results")
    came = {ln.claim.id: ln.came for ln in collect(root)}
    assert came == {"fresh": "before", "read_before": "after"}
    repo(tmp_path, {"typo": {**claim, "seen": ["results/olf/report.md"]}})
    with pytest.raises(UserError, match="never committed"):
        collect(root)


def test_check_fails_when_the_table_is_out_of_date(tmp_path):
    root = repo(tmp_path, {"vit_ahead": c(a={"regime": "vit"}, b={"regime": "naive"})})
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.85}))
    assert script.main(["--root", str(root)]) == 0
    assert script.main(["--root", str(root), "--check"]) == 0
    write_csv(root / "results" / "tiny", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.80}))
    assert script.main(["--root", str(root), "--check"]) == 1


def test_survival_table_compares_the_3_epoch_and_10_epoch_verdicts(tmp_path):
    def converged(acc):
        return [{"run_id": f"{g}__seed={s}", "regime": g, "train.seed": s, "acc_T": a + 0.01 * s, "acc_4T": 0.1}
                for g, a in acc.items() for s in range(3)]

    write_csv(tmp_path / "fashion_mnist_crossroads", converged(
        {"naive": 0.78, "deep_supervision": 0.77, "random_depth": 0.72, "vit_matched_flops": 0.85,
         "vit_matched_params": 0.70}))
    write_csv(tmp_path / "fashion_converged", converged(
        {"naive": 0.85, "ds3": 0.85, "random_depth": 0.79, "vit_matched_flops": 0.85, "vit_matched_params": 0.75}))
    lines = {tuple(ln.split(" | ")[:2]): ln for ln in script.survival(tmp_path) if ln.startswith("| ")}
    assert "(+) | +0.0 [" in lines[("| ViT (matched FLOPs) − bViT", "acc@T")]  # ahead after 3 epochs, tied later
    assert lines[("| ViT (matched FLOPs) − bViT", "acc@T")].endswith("(none) | no |")
    assert lines[("| bViT − ViT (matched parameters)", "acc@T")].endswith("(+) | yes |")
    assert lines[("| random depth − naive", "acc@T")].endswith("(−) | yes |")
    write_csv(tmp_path / "fashion_converged", converged(  # a renamed regime is an error, not a dropped row
        {"naive": 0.85, "ds_3": 0.85, "random_depth": 0.79, "vit_matched_flops": 0.85, "vit_matched_params": 0.75}))
    with pytest.raises(UserError, match="fashion_converged has no regime ds3"):
        script.survival(tmp_path)


@pytest.mark.slow
def test_every_study_claim_of_the_repository_loads_and_the_table_is_current():
    assert script.main(["--check"]) == 0
