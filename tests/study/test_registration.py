"""Confirmatory or exploratory (recurvit.study.registration) and the rows that must be able to fail: a study's
rows are confirmatory only when git shows its registration before every result, unchanged since, with
exactly the registered runs; accounting rows hold a tolerance, identity rows run their tests, and a figure
without variance is compared exactly."""
import subprocess
from pathlib import Path

import yaml

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.study import rules
from recurvit.study.findings import collect
from recurvit.study.findings_md import headline, render
from tests.study.test_findings import c, repo, rows, write_csv

REG = {"n": 3, "seeds": [0, 1, 2], "checkpoint": "last", "budget": "3 epochs"}


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def commit(root: Path, msg: str) -> None:
    git(root, "add", "-A"), git(root, "commit", "-qm", msg)


def registered(tmp_path: Path, registration=REG) -> Path:
    root = repo(tmp_path, {"vit_ahead": c(a={"regime": "vit"}, b={"regime": "naive"})})
    path = root / "studies" / "tiny.yaml"
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "registration": registration}, sort_keys=False))
    git(root, "init", "-q"), git(root, "config", "user.email", "t@t"), git(root, "config", "user.name", "t")
    return root


def status(root: Path) -> str:
    (line,) = collect(root)
    return line.evidence.status


RESULTS = rows({"naive": 0.80, "ds3": 0.80, "vit": 0.85})


def test_a_registration_before_its_results_with_exactly_its_runs_is_confirmatory(tmp_path):
    root = registered(tmp_path)
    commit(root, "register")
    write_csv(root / "results" / "tiny", RESULTS[:4])
    commit(root, "four runs")
    (line,) = collect(root)
    assert line.evidence.status == "registered, pending" and line.verdict.startswith("pending")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "every registered run")
    (line,) = collect(root)
    assert line.evidence.status == "confirmatory" and line.verdict == "reproduced"
    assert "## Confirmatory" in render(root) and "Confirmatory verdicts: 1 rows (1 reproduced)" in render(root)


def test_a_registered_cell_filling_up_to_its_n_is_not_a_top_up(tmp_path):
    """Finished runs are committed as they come: two seeds a cell (pending, though the rule could already
    be computed), then the third. That is the registration carried out, not seeds added after a verdict."""
    root = registered(tmp_path)
    commit(root, "register")
    write_csv(root / "results" / "tiny", [r for r in RESULTS if r["train.seed"] in (0, 1)])
    commit(root, "two seeds a cell")
    (line,) = collect(root)
    assert line.evidence.status == "registered, pending" and line.came == "before"
    assert headline([line]).endswith("1 claim, each with its rule committed before any run, decided once every "
                                     "registered run is in ([findings](docs/findings.md)).\n")  # no partial figure
    assert "- w" not in headline([line])  # nor its claims' words: the front page stays short while it runs
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "every registered run")
    (line,) = collect(root)
    assert line.evidence.status == "confirmatory" and line.came == "before", line.came
    assert headline([line]).endswith(f"- w: **reproduced**. {line.figure}\n")
    assert "`tiny`" in headline([line]) and "[tiny](results/tiny/report.md)" not in headline([line], root)
    (root / "results" / "tiny" / "report.md").write_text("# the report\n")
    assert "[tiny](results/tiny/report.md)" in headline([line], root)  # linked once the report exists


def test_each_registered_study_has_its_own_paragraph_data_and_status(tmp_path):
    from dataclasses import replace

    root = registered(tmp_path)
    commit(root, "register")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "every registered run")
    (line,) = collect(root)
    other = replace(line, study="later", verdict="pending",
                    claim=replace(line.claim, spec=replace(line.claim.spec, words="v", data="mazes")),
                    evidence=replace(line.evidence, status="registered, pending", why="0 of 6 runs in"))
    text = headline([line, other], root)
    first, second = text.split("\n\n**Pre-registered replication**")
    assert "- w: **reproduced**" in first and "pending" not in first and "0 of 6" not in first
    assert second.startswith(" (mazes): `later`, registered, pending (0 of 6 runs in): 1 claim, each") and "- v" not in second


def test_a_registered_studys_data_is_what_most_of_its_claims_say_else_their_common_start():
    from recurvit.study.findings_md import _shared_data

    assert _shared_data(["F, 60 epochs", "F, 60 epochs", "F, 3 / 60 epochs"]) == "F, 60 epochs"
    assert _shared_data(["mazes, trained at 9x9", "mazes, trained at 9x9, tested at 39x39", "mazes, tested"]) == "mazes"
    assert _shared_data(["digits", "mazes"]) == ""


def test_the_summary_puts_each_registered_row_beside_the_exploratory_rows_of_its_claim(tmp_path):
    from recurvit.study.findings_md import summary_page

    root = registered(tmp_path)
    explored = yaml.safe_load((root / "studies" / "tiny.yaml").read_text())
    explored.pop("registration")
    explored.update(name="tiny-short", results="../results/tiny_short")
    explored["claims"]["vit_ahead"]["data"] = "10 epochs"
    (root / "studies" / "tiny_short.yaml").write_text(yaml.safe_dump(explored, sort_keys=False))
    write_csv(root / "results" / "tiny_short", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.80}))
    commit(root, "an exploratory study of the same claim, then the registration")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "every registered run")
    side = summary_page(root, collect(root)).split("| claim | pre-registered replication |")[1].splitlines()
    assert len(side) == 3  # the header's rest, the rule line, ONE registered row
    registered_cell, explored_cell = side[2].split(" | ")[1:3]
    assert "**reproduced**" in registered_cell and explored_cell.startswith("10 epochs: **not")


def test_a_study_registered_after_one_of_its_results_is_exploratory(tmp_path):
    root = registered(tmp_path)
    write_csv(root / "results" / "tiny", RESULTS[:1])  # a result exists before (or with) the registration
    commit(root, "register with a result in view")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "the rest")
    assert status(root) == "exploratory"
    assert "## Confirmatory" not in render(root)


def test_a_top_up_beyond_the_registered_n_is_exploratory(tmp_path):
    root = registered(tmp_path)
    commit(root, "register")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "results")
    assert status(root) == "confirmatory"
    more = [{**r, "run_id": r["run_id"][:-1] + "3", "train.seed": 3} for r in RESULTS if r["train.seed"] == 0]
    write_csv(root / "results" / "tiny", RESULTS + more)  # a fourth seed, as a report's "seeds needed" asks
    commit(root, "top-up")
    (line,) = collect(root)
    assert line.evidence.status == "exploratory" and "beyond the registration" in line.evidence.why


def test_a_registration_edited_after_it_was_committed_is_exploratory(tmp_path):
    root = registered(tmp_path)
    commit(root, "register")
    path = root / "studies" / "tiny.yaml"
    path.write_text(path.read_text().replace("superiority", "noninferiority\n    margin: 0.01"))
    commit(root, "the rule changed")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "results")
    (line,) = collect(root)
    assert line.evidence.status == "exploratory" and "changed after" in line.evidence.why


def test_a_registration_whose_config_changed_after_it_is_exploratory(tmp_path):
    root = registered(tmp_path)
    commit(root, "register")
    (root / "configs" / "base.yaml").write_text("model: {name: bvit_tiny, embed_dim: 24}\n")  # changed through it
    commit(root, "the base config changed")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "results")
    (line,) = collect(root)
    assert line.evidence.status == "exploratory" and "configs/base.yaml changed" in line.evidence.why


def test_a_trend_over_budgets_reads_each_budgets_results_folder(tmp_path):
    trend = c("trend", budgets={3: "../results/short", 10: "../results/mid", 30: "../results/tiny"}, x_name="epochs",
              log2=True, side=-1, paired=True, a={"regime": "vit"}, b={"regime": "naive"})
    root = repo(tmp_path, {"gap_shrinks": trend})
    for folder, gap in (("short", 0.06), ("mid", 0.04), ("tiny", 0.02)):
        write_csv(root / "results" / folder, rows({"naive": 0.80, "ds3": 0.80, "vit": 0.80 + gap}))
    (line,) = collect(root)
    assert line.verdict == "reproduced" and line.figure.startswith("gap_shrinks: -")
    write_csv(root / "results" / "short", rows({"naive": 0.80, "ds3": 0.80, "vit": 0.80}))  # no gap early on
    assert collect(root)[0].verdict == "not separable at this scale"


def test_an_accounting_row_outside_its_tolerance_fails(tmp_path):
    import json

    root = repo(tmp_path, {}, {
        "ratio": c("accounting", tolerance=0.05, count={"claim": "X", "figure": "ratio", "text": "ratio {:.2f}"}),
        "size": c("accounting", tolerance=0.05, also=["params"],
                  count={"claim": "X", "figure": "ratio", "text": "ratio {:.2f}"}),
    })
    (root / "results" / "accounting").mkdir(parents=True)
    entry = {"claim": "X", "paper": {"ratio": 0.65, "params": 29e6}, "measured": {"ratio": 0.63, "params": 31.4e6}}
    (root / "results" / "accounting" / "counts.json").write_text(json.dumps({"claims": [entry]}))
    got = {ln.claim.id: ln.verdict for ln in collect(root)}
    # 0.63 is 3.1% from 0.65: within 5%; the model it is measured on is 8.3% larger than the paper's
    assert got == {"ratio": "within tolerance", "size": "outside tolerance"}


def test_an_identity_row_whose_test_fails_says_failing(tmp_path):
    root = repo(tmp_path, {}, {"ident": c("identity", test="tests/test_x.py::test_y")})
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("def test_y():\n    assert True\n")
    assert collect(root)[0].verdict == "identity, tested"
    (root / "tests" / "test_x.py").write_text("def test_y():\n    assert 1 + 1 == 3\n")
    (line,) = collect(root)
    assert line.verdict == "failing" and "failing: `tests/test_x.py::test_y`" in line.figure


def test_a_figure_without_variance_is_compared_exactly():
    flops_a, flops_b = [177.3e6] * 5, [0.0] * 5  # a deterministic count: every seed gives the same value
    d = rules.superiority(flops_a, flops_b)
    assert d.verdict == rules.REPRODUCED and d.estimate == 177.3e6
    assert d.lo == d.hi == d.estimate and d.p != d.p  # a point, no p-value: nothing was tested
    assert rules.fmt_decision(d, scale=1e-6, unit="MFLOPs") == "+177.30 MFLOPs (exact: no variance over seeds, no test)"
    assert rules.superiority(flops_b, flops_a).verdict == rules.NOT_REPRODUCED
    assert rules.equivalence([1.0] * 3, [1.004] * 3, margin=0.005).verdict == rules.REPRODUCED
    assert rules.equivalence([1.0] * 3, [1.006] * 3, margin=0.005).verdict == rules.NOT_REPRODUCED
    assert rules.noninferiority([1.0] * 3, [1.02] * 3, margin=0.01).verdict == rules.NOT_REPRODUCED
    assert rules.superiority([1.0, 1.1, 0.9], [0.0, 0.1, -0.1], paired=True).note.startswith(rules.EXACT)


def test_a_registered_studys_report_shows_every_runs_curve_and_its_last_20_percent(tmp_path):
    from recurvit.study import load_study, write_report
    from recurvit.study.plateau import plateau_change

    (tmp_path / "base.yaml").write_text("model: {name: bvit_tiny}\ndata: {name: digits}\n")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "name": "reg", "base": "base.yaml", "grid": {"regime": {"a": {}, "b": {}}, "train.seed": [0, 1]},
        "registration": {"n": 2, "seeds": [0, 1], "checkpoint": "last", "budget": "10 epochs"}}))
    flat, rising = [0.5 + 0.04 * min(e, 5) for e in range(10)], [0.5 + 0.02 * e for e in range(10)]
    runs = [{"run_id": f"{g}__seed={s}", "regime": g, "train.seed": s, "seed": s, "acc_T": 0.8, "train_seconds": 1.0, "model": "bvit_tiny", "params_stored": 1,
             "flops_forward": 1, "nfe": 1, "steps": 1, "epochs": 10,
             "val_acc_curve": flat if g == "a" else rising,
             "plateau_val": plateau_change(flat if g == "a" else rising)} for g in "ab" for s in (0, 1)]
    report = write_report(runs, load_study(tmp_path / "s.yaml"), tmp_path / "res").read_text()
    assert (tmp_path / "res" / "every_run.png").is_file() and "![validation accuracy of every run" in report
    assert "| a__seed=0 | 10 | 70.00 | +0.00 | plateau |" in report
    assert "| b__seed=1 | 10 | 68.00 | +4.00 | still rising |" in report
    assert "Plateau: 2 of 4 runs changed by 0.3 points or more" in report


def test_a_comment_added_to_a_registered_config_changes_nothing_a_value_changed_back_still_does(tmp_path):
    """Labelling a registered study's config ("not DeepThinking's recipe", issue 55) leaves what it trained as it
    was; a value changed in any later commit, even one changed back since, makes the study exploratory."""
    root = registered(tmp_path)
    commit(root, "register")
    base = root / "configs" / "base.yaml"
    base.write_text("# a label, added after the registration\n" + base.read_text())
    commit(root, "a comment")
    write_csv(root / "results" / "tiny", RESULTS)
    commit(root, "results")
    (line,) = collect(root)
    assert line.evidence.status != "exploratory", line.evidence.why
    text = base.read_text()
    base.write_text(text.replace("model:", "model_changed:", 1))
    commit(root, "a value changed")
    base.write_text(text)
    commit(root, "and changed back")
    (line,) = collect(root)
    assert line.evidence.status == "exploratory" and "configs/base.yaml changed" in line.evidence.why
