"""The findings table (recurvit.study.findings, scripts/findings.py): every claim declared in a study
file or in studies/claims.yaml gets a row with its data, rule, history and verdict, read from results
files in the format `recurvit study` writes."""
import csv
import subprocess
from pathlib import Path

import pytest
import yaml

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.errors import UserError
from recurvit.study.findings import collect
from recurvit.study.findings_md import render
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
script = load_script("scripts/findings.py")


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
    interval), met or missed; a benchmark whose machine was loaded, or that records no load, decides nothing;
    a ratio above the compute ceiling its entry records is flagged, not reported; a figure the file lacks, or
    a bound on a ratio's mean, is an error, not a silent miss."""
    import json

    spec = c("benchmark", source="recurvit", file="bench/deploy.json", command="python bench.py",
             targets={"b1 onnx bvit over vit.lo": {"min": 1.0}, "b256 onnx bvit over vit.lo": {"min": 0.95}})
    root = repo(tmp_path, {}, {"speed": spec})
    (line,) = collect(root)
    assert line.verdict == "not measured yet" and "`python bench.py` has not run" in line.figure
    (root / "bench").mkdir()

    def write(loaded, b1_lo, b256_lo, **more):
        ratios = {"b1 onnx bvit over vit": {"mean": 1.1, "lo": b1_lo, "hi": 1.2, "rounds": 10},
                  "b256 onnx bvit over vit": {"mean": 1.0, "lo": b256_lo, "hi": 1.05, "rounds": 10}}
        doc = {"loaded": loaded, "load_before": [0.2, 0.3, 0.4], "load_after": [1.1, 0.5, 0.4], "ratios": ratios}
        (root / "bench" / "deploy.json").write_text(json.dumps({**doc, **more}))

    write(False, 1.02, 0.96)
    (line,) = collect(root)
    assert line.verdict == "target met" and "b1 onnx bvit over vit 1.100 [1.020, 1.200] (10 rounds)" in line.figure
    write(False, 0.98, 0.96)  # the mean clears 1.0, the interval does not: missed
    assert verdicts(root) == {"speed": "target missed"}
    write(True, 1.02, 0.96)
    assert verdicts(root) == {"speed": "not measured: loaded"}
    # with its cores recorded, the claim judges the load itself: 1.5 before the run is above half of 2 cores
    write(False, 1.02, 0.96, cores=2, load_before=[1.5, 1.0, 1.0])
    assert verdicts(root) == {"speed": "not measured: loaded"}
    write(False, 1.02, 0.96, cores=2, load_after=[2.2, 1.0, 1.0])  # 2.2 less its own thread: loaded during it
    assert verdicts(root) == {"speed": "not measured: loaded"}
    write(False, 1.02, 0.96, cores=2)
    assert verdicts(root) == {"speed": "target met"}
    write(False, 1.02, 0.96, load_before=None)  # no record of the load: decides nothing
    assert verdicts(root) == {"speed": "not measured: load not recorded"}
    write(False, float("nan"), 0.96)  # one round: no interval, no verdict
    assert verdicts(root) == {"speed": "not measured: no interval"}
    doc = json.loads((root / "bench" / "deploy.json").read_text())
    doc["ratios"]["b1 onnx bvit over vit"].update(lo=1.02, ceiling=1.05)  # 1.1 measured, 1.05 possible
    (root / "bench" / "deploy.json").write_text(json.dumps(doc))
    (line,) = collect(root)
    assert line.verdict.startswith("not measured: flagged") and "1.100" not in line.figure
    assert "b1 onnx bvit over vit flagged: above its compute ceiling of 1.05x" in line.figure
    (root / "bench" / "deploy.json").write_text("{half a file")
    with pytest.raises(UserError, match="not a benchmark's JSON"):
        collect(root)
    write(False, 1.02, 0.96)
    repo(tmp_path, {}, {"speed": {**spec, "targets": {"b1 eager bvit over vit.lo": {"min": 1.0}}}})
    with pytest.raises(UserError, match="no figure b1 eager bvit over vit.lo"):
        collect(root)
    repo(tmp_path, {}, {"speed": {**spec, "targets": {"b1 onnx bvit over vit.mean": {"min": 1.0}}}})
    with pytest.raises(UserError, match="end of its 95% interval: b1 onnx bvit over vit.lo"):
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
    quiet = {"exit_load_before": 0.1, "exit_load_during": 1.0, "exit_cores": 2}  # a speed-up needs its load
    res = [{**r, **quiet, "exit_speedup_lo": r["exit_speedup"] - 0.05, "exit_speedup_hi": r["exit_speedup"] + 0.05}
           for r in res]
    write_csv(root / "results" / "tiny", [{**r, **(res[r["train.seed"]] if r["regime"] == "ds3" else {})}
                                          for r in rows({"naive": 0.8, "ds3": 0.8, "vit": 0.8})])
    (line,) = collect(root)
    assert line.verdict == "target met in 2 of 3 seeds"  # the means (0.37, 45%, 1.83x) would meet it
    assert "seed 1: 0.7, 40, 2x [1.95, 2.05]" in line.figure and "exit_speedup ≥ 1.4" in render(root)
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


def test_a_vacuous_row_is_counted_apart_and_never_as_reproduced(tmp_path):
    from recurvit.study.findings_md import by_source

    root = repo(tmp_path, {"close": c("noninferiority", source="recurvit", margin=0.05, figure="solved",
                                      a={"regime": "vit"}, b={"regime": "naive"}, floor={"solved": 0})})
    write_csv(root / "results" / "tiny", [{**r, "solved": 0.0} for r in rows({"naive": 0.8, "ds3": 0.8, "vit": 0.8})])
    (line,) = collect(root)
    assert line.verdict == "holds vacuously"
    assert "solved = 0 in every run: it holds whatever the model does" in line.figure
    table = by_source([line])
    got = dict(zip(table[0].strip("| ").split(" | "), table[2].strip("| ").split(" | ")))
    assert got["holds vacuously"] == "1" and got["reproduced (exploratory)"] == got["confirmed"] == "0"


def test_a_registered_rule_is_read_beside_its_qualification(tmp_path):
    """``qualify:`` in studies/claims.yaml: a stopping check of a claim whose rule may not change, from the same
    runs; met, the row reads "reproduced (qualified)" (never a plain confirmation), met only where nothing is
    solved, "holds vacuously"; a qualification of a claim no study declares is an error."""
    from recurvit.tasks.dense.evaluators import slope

    sizes = [9, 13, 17, 21]

    def run(g, s, iters, solved):
        out = {"run_id": f"{g}__seed={s}", "regime": g, "train.seed": s, "max_iters": 120,
               "rule_stable_iters_slope": slope(sizes, iters)}
        for size, i, v in zip(sizes, iters, solved):
            out[f"rule_stable_iters_{size}"], out[f"rule_stable_solved_{size}"] = i, v
        return out

    grows = c(source="recurvit", figure="rule_stable_iters_slope", a={"regime": "vit"}, scale=1, unit="iterations")
    qual = {"rule": "stopping", "why": "never settling passes the rule", "iters": "rule_stable_iters_{size}",
            "solved": "rule_stable_solved_{size}", "cap": "max_iters", "control": {"regime": "naive"}}
    root = repo(tmp_path, {"grows": grows}, {})
    studyless = root / "studies" / "claims.yaml"
    studyless.write_text(yaml.safe_dump({"claims": {}, "qualify": {"tiny.yaml": {"grows": qual}}}))
    never = [run("naive", s, [60 + s, 100, 118, 120], [0, 0, 0, 0]) for s in range(3)]
    thinks = [run("vit", s, [12 + s, 30, 70, 110], [0.95, 0.4, 0.1 + 0.01 * s, 0]) for s in range(3)]
    write_csv(root / "results" / "tiny", never + thinks)
    (line,) = collect(root)
    assert line.verdict == "reproduced (qualified)"
    assert "qualified (never settling passes the rule; read from the same runs, not registered: exploratory)" \
        in line.figure and "where solved: +" in line.figure
    only_9 = [run("vit", s, [40 + 4 * s, 90, 115, 120], [0.005, 0, 0, 0]) for s in range(3)]
    write_csv(root / "results" / "tiny", never + only_9)
    assert verdicts(root) == {"grows": "holds vacuously"}
    studyless.write_text(yaml.safe_dump({"claims": {}, "qualify": {"tiny.yaml": {"nope": qual}}}))
    with pytest.raises(UserError, match="tiny.yaml nope"):
        collect(root)


SPEED = {"deploy_disagree_points": {"max": 0.5}, "deploy_speedup": {"min": 1.4}}


def speed_rows(**per_run):
    """The ds3 cell's runs with a certified exit's figures: 40% of T's steps, 1.6x [1.5, 1.7] on a quiet
    machine of 2 cores, unless ``per_run`` says otherwise (column -> one value per seed)."""
    out = []
    for r in rows({"naive": 0.8, "ds3": 0.8, "vit": 0.8}):
        if r["regime"] == "ds3":
            r.update({"deploy_disagree_points": 0.3, "deploy_steps_pct_T": 40.0, "deploy_speedup": 1.6,
                      "deploy_speedup_lo": 1.5, "deploy_speedup_hi": 1.7, "deploy_load_before": 0.2,
                      "deploy_load_during": 1.1, "deploy_cores": 2})
            r.update({k: v[r["train.seed"]] for k, v in per_run.items()})
        out.append(r)
    return out


def test_a_speed_target_decides_only_from_a_quiet_machine_on_its_interval_below_its_ceiling(tmp_path):
    root = repo(tmp_path, {"exit": c("target", source="recurvit", a={"regime": "ds3"}, targets=SPEED, label="ds3")})
    write_csv(root / "results" / "tiny", speed_rows())
    assert verdicts(root) == {"exit": "target met in every seed"}
    # a machine loaded before the timing (2.4 of 2 cores), or during it: the row decides nothing
    write_csv(root / "results" / "tiny", speed_rows(deploy_load_before=[0.2, 2.4, 0.2]))
    (line,) = collect(root)
    assert line.verdict == "not measured: loaded"
    assert "a speed-up timed on a loaded machine decides nothing" in line.figure
    write_csv(root / "results" / "tiny", speed_rows(deploy_load_during=[1.1, 1.1, 3.0]))
    assert verdicts(root) == {"exit": "not measured: loaded"}
    write_csv(root / "results" / "tiny", [{k: v for k, v in r.items() if "load" not in k} for r in speed_rows()])
    assert verdicts(root) == {"exit": "not measured: load not recorded"}
    # the lower end of the interval decides: 1.45x on the mean, [1.35, 1.55]: missed in that seed
    write_csv(root / "results" / "tiny", speed_rows(deploy_speedup=[1.6, 1.45, 1.6],
                                                    deploy_speedup_lo=[1.5, 1.35, 1.5]))
    assert verdicts(root) == {"exit": "target met in 2 of 3 seeds"}
    write_csv(root / "results" / "tiny", [{k: v for k, v in r.items() if not k.endswith("_lo")} for r in speed_rows()])
    assert verdicts(root) == {"exit": "not measured: no interval"}
    # 2.8x while running 40% of T's steps: above the 2.5x the skipped steps allow, flagged and not reported
    write_csv(root / "results" / "tiny", speed_rows(deploy_speedup=[1.6, 2.8, 1.6], deploy_speedup_lo=[1.5, 2.6, 1.5]))
    (line,) = collect(root)
    assert line.verdict == "target met in 2 of 3 seeds; 1 flagged (speed-up above its compute ceiling)"
    assert "seed 1: 0.3, flagged: above its compute ceiling of 2.5x (40.0% of T's steps; the step ratio alone" \
        in line.figure
    assert "2.8" not in line.figure
    # the embedding and the readout counted: 2.2x is under the step ratio's 2.5x but above what they allow
    write_csv(root / "results" / "tiny", speed_rows(deploy_speedup=[1.6, 2.2, 1.6], deploy_speedup_lo=[1.5, 2.0, 1.5],
                                                    steps=[6] * 3, deploy_flops_step=[1e6] * 3,
                                                    deploy_flops_embed=[5e5] * 3, deploy_flops_readout=[5e5] * 3))
    (line,) = collect(root)  # (0.5 + 6 + 0.5) / (0.5 + 2.4 + 0.5) = 2.06x
    assert line.verdict.endswith("1 flagged (speed-up above its compute ceiling)")
    assert "ceiling of 2.06x (40.0% of T's steps; embedding and readout counted)" in line.figure
    # flagged, but missed on another bound anyway: counted as missed
    write_csv(root / "results" / "tiny", speed_rows(deploy_speedup=[1.6, 2.8, 1.6], deploy_speedup_lo=[1.5, 2.6, 1.5],
                                                    deploy_disagree_points=[0.3, 0.9, 0.3]))
    assert verdicts(root) == {"exit": "target met in 2 of 3 seeds"}
