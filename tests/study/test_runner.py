"""The study runner: grid expansion, resumable runs, generated results; the mixture command."""
import csv
import json
import math

import pytest

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.study import load_study, run_study, write_report
from recurvit.study.runner import collect
from recurvit.cli import main
from recurvit.errors import UserError

STUDY = """
name: tiny
base: {base}
grid:
  regime:
    rec: {{model.name: bvit_tiny, model.steps: 2}}
    vit: {{model.name: vit_tiny, model.depth: 2}}
    bad: {{model.name: bvit_tiny, model.steps: 0}}
  train.seed: [0, 1]
eval:
  max_steps_factor: 2
results: out_results
"""
BASE = """
model: {name: bvit_tiny, patch_size: 4, embed_dim: 24, num_heads: 2, global_pool: avg, class_token: false}
data: {name: digits}
train: {epochs: 1, batch_size: 256, progress: false}
"""


@pytest.fixture
def study_file(tmp_path):
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "s.yaml").write_text(STUDY.format(base="base.yaml"))
    return tmp_path / "s.yaml"


@pytest.mark.slow
def test_study_runs_grid_resumes_and_reports(study_file, tmp_path):
    study = load_study(study_file)
    assert [r.run_id for r in study.runs] == ["rec__seed=0", "rec__seed=1", "vit__seed=0", "vit__seed=1",
                                              "bad__seed=0", "bad__seed=1"]
    out = tmp_path / "study"
    rows = run_study(study, out, progress=False, log=lambda *a: None)
    ok = [r for r in rows if "error" not in r]
    assert len(ok) == 4 and all("steps must be >= 1" in r["error"] for r in rows if "error" in r)
    rec = next(r for r in ok if r["run_id"] == "rec__seed=0")
    assert rec["steps"] == 2 and len(rec["horizon_accuracy"]) == 4  # swept to 2T
    assert rec["params_stored"] < next(r for r in ok if r["run_id"] == "vit__seed=0")["params_stored"]
    # an interrupted/finished study resumes: nothing finished is trained again
    mtime = (out / "runs" / "rec__seed=0" / "last.pt").stat().st_mtime
    run_study(study, out, progress=False, log=lambda *a: None)
    assert (out / "runs" / "rec__seed=0" / "last.pt").stat().st_mtime == mtime
    report = write_report(rows, study, study.results)
    text = report.read_text()
    assert "| rec | bvit_tiny |" in text and "Failed runs" in text and "± " in text
    with open(study.results / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 4 and {"regime", "train.seed", "params_stored", "flops_forward", "acc_T", "acc_2T",
                                "train_seconds"} <= set(table[0])
    for png in ("acc_vs_params.png", "acc_vs_flops.png", "acc_vs_steps.png"):
        assert (study.results / png).stat().st_size > 1000


def test_only_given_twice_adds_its_patterns():
    """`--only 'a__*' --only 'b__*'` picks both cells (argparse's default would keep the last --only alone and
    leave the first cell's runs untouched without a word)."""
    from recurvit.cli import build_parser

    args = build_parser().parse_args(["study", "s.yaml", "--only", "a__*", "--only", "b__*", "c__seed=0"])
    assert args.only == ["a__*", "b__*", "c__seed=0"]
    assert build_parser().parse_args(["study", "s.yaml"]).only == []


@pytest.mark.slow
def test_only_runs_the_chosen_runs_and_the_report_names_the_rest(study_file, tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", str(study_file), "--out", str(out), "--only", "rec__*", "vit__seed=1", "--json"]) == 0
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["rec__seed=0", "rec__seed=1", "vit__seed=1"]
    report = (out / "results" / "report.md").read_text()  # --out moves the results too
    assert not (tmp_path / "out_results").exists()
    assert "**Partial study**: 3 of its 6 runs are in; not run yet (runs): `vit` (1), `bad` (2)." in report
    capsys.readouterr()
    assert main(["study", str(study_file), "--out", str(out), "--only", "nothing*"]) == 2
    assert "--only nothing* matches none of the study's 6 runs" in capsys.readouterr().err
    assert main(["study", str(study_file), "--out", str(out), "--only", "vit__*", "--json"]) == 0
    assert "Partial study**: 4 of its 6" in (out / "results" / "report.md").read_text()
    # the rest: complete; its two bad runs fail, so the study exits 1 (and says where the errors are)
    assert main(["study", str(study_file), "--out", str(out), "--json"]) == 1
    assert "2 of 6 runs failed" in capsys.readouterr().err
    assert "Partial" not in (out / "results" / "report.md").read_text()


def test_study_file_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_study(tmp_path / "none.yaml")
    (tmp_path / "s.yaml").write_text("name: x\ngrid: {}\n")
    with pytest.raises(UserError, match="needs a 'base:'"):
        load_study(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text("name: x\nbase: nope.yaml\ngrid: {}\n")
    with pytest.raises(UserError, match="base config not found"):
        load_study(tmp_path / "s.yaml")


@pytest.mark.slow
def test_mixture_command_on_a_softmor_run(tmp_path, capsys):
    run = tmp_path / "sr"
    assert main(["train", "model.name=srvit_tiny", "model.patch_size=4", "model.embed_dim=24", "model.num_heads=2",
                 "model.depth=2", "model.recursions=3", "model.steps=null", "model.global_pool=avg",
                 "model.class_token=false", "train.epochs=1", "train.progress=false", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["mixture", str(run), "--examples", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["mean_weight_per_step"]) == 3
    assert sum(res["mean_weight_per_step"]) == pytest.approx(1.0, abs=1e-5)
    assert (run / "mixture.png").stat().st_size > 1000
    assert (run / "mixture_mean.csv").read_text().startswith("unit,step_1,step_2,step_3")
    bvit = tmp_path / "b"
    assert main(["train", "model.embed_dim=24", "model.steps=2", "train.epochs=1", "train.progress=false",
                 "--out", str(bvit)]) == 0
    capsys.readouterr()
    assert main(["mixture", str(bvit)]) == 2
    assert "cores that mix steps" in capsys.readouterr().err


FRONTIER = """
name: tiny-frontier
base: base.yaml
overrides: {model.steps: 2}
grid:
  regime:
    naive: {}
    ds2: {train.supervision.stages: 2}
  train.seed: [0, 1]
eval:
  max_steps_factor: 16
  variants:
    as_ode: {method: rk4}
report:
  frontier: true
  compare: [[naive, ds2]]
results: res
"""


@pytest.mark.slow
def test_frontier_16t_columns_intervals_and_reevaluation(tmp_path):
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "f.yaml").write_text(FRONTIER)
    study = load_study(tmp_path / "f.yaml")
    out = tmp_path / "runs"
    rows = run_study(study, out, progress=False, log=lambda *a: None)
    assert all("error" not in r for r in rows) and len(rows) == 4
    r = rows[0]
    assert len(r["horizon_accuracy"]) == 32 and r["acc_16T"] == r["horizon_accuracy"][31]
    assert r["acc_8T"] == r["horizon_accuracy"][15] and r["chance"] == pytest.approx(0.1)
    assert r["variants"] == {"as_ode": None}  # a recurrent core has no solver: not applicable
    report = write_report(rows, study, study.results).read_text()
    assert "acc@8T" in report and "acc@16T" in report and "chance level 10.0%" in report
    assert "95% t-interval" in report and "naive − ds2" in report and "Cost:" in report
    # where each setting sits: on the front, or behind the settings that beat it on both axes
    placed = [ln for ln in report.splitlines() if ln.startswith(("| naive |", "| ds2 |")) and "front" in ln]
    assert len(placed) == 2 and any("on the front" in ln for ln in placed)
    for png in ("frontier.png", "acc_vs_epoch.png", "acc_vs_steps.png"):
        assert (study.results / png).stat().st_size > 1000
    with open(study.results / "results.csv") as f:
        assert {"acc_8T", "acc_16T", "chance"} <= set(next(csv.DictReader(f)))
    # a study that asks for more evaluation re-evaluates finished runs without training them again
    mtime = (out / "runs" / "naive__seed=0" / "last.pt").stat().st_mtime
    (tmp_path / "f.yaml").write_text(FRONTIER.replace("max_steps_factor: 16", "max_steps_factor: 4"))
    rows = run_study(load_study(tmp_path / "f.yaml"), out, progress=False, log=lambda *a: None)
    assert len(rows[0]["horizon_accuracy"]) == 8 and rows[0]["acc_16T"] is None
    assert (out / "runs" / "naive__seed=0" / "last.pt").stat().st_mtime == mtime
    # ... and keeps what training cost (the time logged with the last epoch)
    trained = r["train_seconds"]
    assert trained > 0 and rows[0]["train_seconds"] == pytest.approx(trained)
    assert collect(out, load_study(tmp_path / "f.yaml"))[0]["train_seconds"] == pytest.approx(trained)


SOLVERS = """
name: solvers
base: base.yaml
overrides: {model.core: ode, model.field: state_subtracted, model.steps: 2, model.t_end: 2.0}
grid:
  solver:
    euler: {model.method: euler}
    midpoint: {model.method: midpoint}
  train.seed: [0, 1]
eval:
  max_steps_factor: 1
  variants:
    eval_euler: {method: euler}
    refine_h/2: {refine: 2}
results: res
"""


def _tiny_study(tmp_path, text: str):
    """(study, rows) of a study file ``text`` over BASE, run in tmp_path."""
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "study.yaml").write_text(text)
    study = load_study(tmp_path / "study.yaml")
    return study, run_study(study, tmp_path / "runs", progress=False, log=lambda *a: None)


@pytest.mark.slow
def test_solver_matrix_and_paired_changes_from_as_trained(tmp_path):
    study, rows = _tiny_study(tmp_path, SOLVERS)
    assert all("error" not in r for r in rows) and len(rows) == 4
    euler = [r for r in rows if r["run_id"].startswith("euler")]
    assert all(r["variants"]["eval_euler"]["acc_T"] == r["acc_T"] for r in euler)  # its own solver: the same
    report = write_report(rows, study, study.results).read_text()
    matrix = report.split("as the change from the run's own accuracy")[1]
    line = next(ln for ln in matrix.splitlines() if ln.startswith("| euler |"))
    assert line.split("|")[3].strip() == "+0.0 ± 0.0"  # eval_euler on an Euler-trained run: no change
    mid = [r for r in rows if r["run_id"].startswith("midpoint")]
    change = [100 * (r["variants"]["eval_euler"]["acc_T"] - r["acc_T"]) for r in mid]
    expected = sum(change) / 2
    shown = next(ln for ln in matrix.splitlines() if ln.startswith("| midpoint |")).split("|")[3].strip()
    assert shown.startswith(f"{expected:+.1f}")


WIDTHS = """
name: widths
base: base.yaml
overrides: {model.steps: 1}
grid:
  width:
    w8: {model.embed_dim: 8}
    w16: {model.embed_dim: 16}
    w24: {model.embed_dim: 24}
  model:
    bvit: {model.name: bvit_tiny}
    vit: {model.name: vit_tiny, model.depth: 1}
  train.seed: [0, 1]
eval:
  max_steps_factor: 1
report:
  compare: [[vit, bvit]]
results: res
"""


@pytest.mark.slow
def test_a_comparison_across_an_axis_is_plotted_and_an_axis_named_model_is_one_column(tmp_path):
    study, rows = _tiny_study(tmp_path, WIDTHS)
    report = write_report(rows, study, study.results).read_text()
    assert "![vit − bvit against width](vit_minus_bvit.png)" in report
    assert (study.results / "vit_minus_bvit.png").stat().st_size > 1000
    assert "| width | model | params (stored) |" in report  # not "| model | model |"
    assert [ln.split("|")[1].strip() for ln in report.splitlines() if ln.startswith("| vit − bvit")] == \
        ["vit − bvit (w8)", "vit − bvit (w16)", "vit − bvit (w24)"]


@pytest.mark.slow
def test_a_study_that_changed_a_run_is_refused(tmp_path):
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "f.yaml").write_text(FRONTIER.replace("train.seed: [0, 1]", "train.seed: [0]"))
    out = tmp_path / "runs"
    run_study(load_study(tmp_path / "f.yaml"), out, progress=False, log=lambda *a: None)
    (tmp_path / "f.yaml").write_text(FRONTIER.replace("train.seed: [0, 1]", "train.seed: [0]")
                                     .replace("{model.steps: 2}", "{model.steps: 3}"))
    with pytest.raises(UserError, match="other settings"):
        run_study(load_study(tmp_path / "f.yaml"), out, progress=False, log=lambda *a: None)


def test_welch_and_intervals_match_scipy():
    from scipy import stats

    from recurvit.study.stats import mean_ci, welch

    a, b = [0.80, 0.82, 0.81], [0.76, 0.79, 0.75]
    ci = mean_ci(a)
    lo, hi = stats.t.interval(0.95, 2, loc=sum(a) / 3, scale=stats.sem(a))
    assert ci["ci"] == pytest.approx((hi - lo) / 2)
    w = welch(a, b)
    assert w["p"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert w["lo"] < w["diff"] < w["hi"] and w["diff"] == pytest.approx(0.81 - 0.7666666, abs=1e-6)



def test_ols_contrast_is_scipys_regression_and_two_sample_t():
    from scipy import stats

    from recurvit.study.stats import ols_contrast

    r, acc = [1, 1, 2, 2, 3, 3, 4, 4], [0.80, 0.81, 0.81, 0.83, 0.82, 0.82, 0.84, 0.85]
    lr = stats.linregress(r, acc)
    w = ols_contrast([[1.0, x] for x in r], acc, [0, 1])
    assert w["diff"] == pytest.approx(lr.slope) and w["p"] == pytest.approx(lr.pvalue)
    assert (w["hi"] - w["lo"]) / 2 == pytest.approx(stats.t.ppf(0.975, len(r) - 2) * lr.stderr)
    # a group indicator's coefficient is the pooled-variance two-sample t-test
    a, b = [0.80, 0.82, 0.81], [0.76, 0.79, 0.75]
    w = ols_contrast([[1.0, 1.0]] * 3 + [[1.0, 0.0]] * 3, a + b, [0, 1])
    assert w["diff"] == pytest.approx(0.81 - 0.7666666, abs=1e-6)
    assert w["p"] == pytest.approx(stats.ttest_ind(a, b).pvalue)
    # a model it cannot fit (collinear columns) has no estimate
    assert math.isnan(ols_contrast([[1.0, 1.0]] * 4, [1, 2, 3, 4], [0, 1])["diff"])


VAE_STUDY = """
name: tiny-vae
task: vae
base: {base}
overrides: {{data.img_size: 16, data.train_crops: 32, data.max_test: 16, model.embed_dim: 8, model.groups: 4,
            model.depth: 1, model.z_channels: 2, train.batch_size: 16, train.threads: 1, train.epochs: 1}}
grid:
  variant:
    shared: {{}}
    unshared: {{model.name: vae_unshared}}
  train.seed: [0, 1]
report:
  compare: [[shared, unshared]]
results: vae_res
"""


@pytest.mark.slow
def test_loopvae_grid_runs_through_the_study_runner(tmp_path):
    from recurvit.tasks.vae.config import default_config_path

    (tmp_path / "v.yaml").write_text(VAE_STUDY.format(base=default_config_path()))
    study = load_study(tmp_path / "v.yaml")
    rows = run_study(study, tmp_path / "runs", progress=False, log=lambda *a: None)
    assert all("error" not in r for r in rows) and len(rows) == 4
    shared = next(r for r in rows if r["run_id"] == "shared__seed=0")
    unshared = next(r for r in rows if r["run_id"] == "unshared__seed=0")
    assert shared["params_stored"] < unshared["params_stored"] and shared["flops_forward"] == unshared["flops_forward"]
    assert 0 < shared["psnr"] < 100 and 0 < shared["ssim"] <= 1 and shared["ms_per_img"] > 0
    report = write_report(rows, study, study.results).read_text()
    assert "PSNR dB" in report and "shared − unshared" in report
    assert (study.results / "psnr_vs_params.png").stat().st_size > 1000


@pytest.mark.parametrize("text,needle", [
    ("name: x\nbase: base.yaml\ngrid: [1, 2]\n", "'grid:' must be a mapping"),
    ("name: x\nbase: base.yaml\ngrid: {a: {v: [1]}}\n", "must be a mapping of dotted"),
    ("name: x\nbase: base.yaml\ngrid: {train.seed: [0]}\noverrides: [a]\n", "'overrides:' must be a mapping"),
    ("name: x\nbase: base.yaml\ngrid: {train.seed: [0]}\neval: [1]\n", "'eval:' must be a mapping"),
    ("name: x\nbase: base.yaml\ngrid: {train.seed: [0]}\nreport: {compare: [a, b]}\n", "pairs of variant labels"),
])
def test_malformed_study_files_are_one_line(tmp_path, text, needle):
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(UserError, match=needle) as e:
        load_study(tmp_path / "s.yaml")
    assert "\n" not in str(e.value)


def test_comparisons_pair_cells_on_every_other_axis():
    from recurvit.study.grouping import pairs

    cs = [{"w": w, "m": m, "n": 3, "rows": []} for w in ("w32", "w64") for m in ("vit", "bvit")]
    got = [(ca["w"], cb["w"], where) for ca, cb, where in pairs(cs, ["w", "m"], "vit", "bvit")]
    assert got == [("w32", "w32", " (w32)"), ("w64", "w64", " (w64)")]  # one comparison per width


def test_labels_win_over_result_keys_and_any_crash_is_a_failed_row(tmp_path, monkeypatch):
    from recurvit.study import runner

    def fake(base, overrides, out, eval_spec, **kw):
        out.mkdir(parents=True, exist_ok=True)
        return {"model": "bvit_tiny", "acc_T": 0.5}

    from recurvit.tasks.classify.study import ClassifyView

    monkeypatch.setattr(ClassifyView, "run", lambda self, *a, **kw: fake(*a, **kw))
    kw = dict(task="classify", base="b.yaml", overrides=[], out=str(tmp_path / "a"), eval_spec={}, labels={"model": "bvit"})
    assert runner.run_one(**kw)["model"] == "bvit"  # a grid axis named like a result key keeps its label

    def crash(base, overrides, out, eval_spec, **kw):
        out.mkdir(parents=True, exist_ok=True)
        raise RuntimeError("CUDA out of memory\ndetails")

    monkeypatch.setattr(ClassifyView, "run", lambda self, *a, **kw: crash(*a, **kw))
    row = runner.run_one_safe({**kw, "out": str(tmp_path / "b")})
    assert row["error"] == "RuntimeError: CUDA out of memory" and row["model"] == "bvit"
    assert (tmp_path / "b" / "error.txt").read_text().startswith("RuntimeError")


def test_beyond_horizon_mean_only_when_the_sweep_reaches_4t():
    from recurvit.analysis.horizon import summarize

    stack = summarize({"step": [1, 2, 3], "accuracy": [0.5, 0.6, 0.7]}, trained=3)  # a stack stops at T
    assert stack["acc_T"] == 0.7 and stack["acc_2T"] is None and stack["acc_mean_T_4T"] is None
    rec = summarize({"step": list(range(1, 13)), "accuracy": [i / 12 for i in range(1, 13)]}, trained=3)
    assert rec["acc_4T"] == 1.0 and rec["acc_mean_T_4T"] == pytest.approx(sum(range(3, 13)) / 12 / 10)


@pytest.mark.slow
def test_a_study_resumes_from_its_results_folder_on_a_machine_without_its_runs(study_file, tmp_path):
    import shutil

    study = load_study(study_file)
    out = tmp_path / "study"
    rows = run_study(study, out, progress=False, log=lambda *a: None, only=["rec__*"])
    assert {r["run_id"] for r in rows} == {"rec__seed=0", "rec__seed=1"}
    kept = study.results / "runs" / "rec__seed=0" / "result.json"
    assert json.loads(kept.read_text())["acc_T"] == next(r for r in rows if r["run_id"] == "rec__seed=0")["acc_T"]
    shutil.rmtree(out)  # a new machine: the run directories (checkpoints) are gone, the results folder is not
    again = run_study(study, tmp_path / "elsewhere", progress=False, log=lambda *a: None, only=["rec__*"])
    assert not (tmp_path / "elsewhere" / "runs" / "rec__seed=0").exists()  # nothing trained again
    assert [r["acc_T"] for r in again] == [r["acc_T"] for r in rows]
    assert {r["run_id"] for r in collect(tmp_path / "elsewhere", study)} == {"rec__seed=0", "rec__seed=1"}
    assert rows[0]["plateau_test"] is None  # one epoch: no plateau to read


def test_a_report_rebuilt_from_its_table_archives_nothing_and_keeps_its_comparisons(tmp_path, capsys, monkeypatch):
    """On a machine without the run directories, --report-only rebuilds the report from results.csv; the
    table's rows are not results, so no result.json is made from them (a later report would read those)."""
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "s.yaml").write_text(STUDY.format(base="base.yaml").replace(
        "results: out_results", "report: {compare: [[rec, vit]]}\nresults: out_results"))
    study = load_study(tmp_path / "s.yaml")
    rows = [{"run_id": f"{g}__seed={s}", "regime": g, "train.seed": str(s), "model": "m", "core": "recurrent",
             "runs_as": "recurrent", "shares_blocks": g == "rec", "embed_dim": 8, "depth": 1, "steps": 2, "seed": s,
             "epochs": 1, "params": 10, "params_stored": 10, "flops_forward": 100, "nfe": 2, "chance": 0.1,
             "acc_T": 0.5 + 0.1 * (g == "rec") + 0.01 * s, "train_seconds": 1.0}
            for g in ("rec", "vit") for s in (0, 1)]
    write_report(rows, study, study.results, command="recurvit study s.yaml --workers 2")
    before = (study.results / "report.md").read_text()
    assert "| rec − vit | acc@T | +10.00 |" in before
    assert main(["study", str(tmp_path / "s.yaml"), "--report-only"]) == 0
    assert not (study.results / "runs").exists()
    after = (study.results / "report.md").read_text()
    assert "| rec − vit | acc@T | +10.00 |" in after
    assert after == before  # the command that made the runs is kept: a rewrite changes nothing it need not
    (study.results / "report.md").write_text(before.replace("Command:", "Comand:"))  # none to keep: say so
    monkeypatch.setattr("sys.argv", ["recurvit", "study", str(tmp_path / "s.yaml"), "--report-only"])
    assert main(["study", str(tmp_path / "s.yaml"), "--report-only"]) == 0
    assert "s.yaml    # this report: --report-only" in (study.results / "report.md").read_text()


def test_a_report_rebuilt_from_its_table_keeps_the_variant_table_and_the_curve_plots(tmp_path):
    """What results.csv does not hold (per-step and per-epoch curves) is not dropped from a rebuilt report:
    its plots stay beside it and are still shown; the core-option variants come back from their columns."""
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "s.yaml").write_text(STUDY.format(base="base.yaml"))
    study = load_study(tmp_path / "s.yaml")
    rows = [{"run_id": f"{g}__seed={s}", "regime": g, "train.seed": str(s), "model": "m", "core": "recurrent",
             "runs_as": "recurrent", "shares_blocks": True, "embed_dim": 8, "depth": 1, "steps": 2, "seed": s,
             "epochs": 1, "params": 10, "params_stored": 10, "flops_forward": 100, "nfe": 2, "chance": 0.1,
             "acc_T": 0.5 + 0.01 * s, "train_seconds": 1.0, "horizon_accuracy": [0.3, 0.5 + 0.01 * s],
             "test_acc_curve": [0.5], "variants": {"eval_rk4": {"acc_T": 0.4 + 0.01 * s, "nfe": 8}}}
            for g in ("rec", "vit") for s in (0, 1)]
    write_report(rows, study, study.results)
    before = (study.results / "report.md").read_text()
    assert "acc_vs_steps.png" in before and "acc_vs_epoch.png" in before and "| eval_rk4 |" in before
    from recurvit.study.report import rows_from_csv

    write_report(rows_from_csv(study.results / "results.csv", study), study, study.results)
    assert (study.results / "report.md").read_text() == before


def test_the_time_estimate_reads_each_runs_own_cost_per_cell():
    """A run copied in and evaluated here has a wall time of seconds; its training time is its cost. A run
    to do is priced at its own cell's finished runs, and at the mean of all where its cell has none."""
    from recurvit.study.workers import estimate

    done = [{"width": "w32", "train.seed": "0", "train_seconds": 1000.0, "eval_seconds": 0.0, "wall_seconds": 10.0},
            {"width": "w64", "train.seed": "0", "train_seconds": 2600.0, "eval_seconds": 200.0, "wall_seconds": 9.0},
            {"width": "w64", "train.seed": "1", "error": "diverged", "wall_seconds": 5.0}]
    todo = [{"labels": {"width": "w64", "train.seed": "1"}}, {"labels": {"width": "w128", "train.seed": "0"}}]
    # w64: 2800 s; w128: no run of its own cell, the mean of all (1900 s); two workers share the 4700 s
    assert estimate(done, todo, workers=2) == ("; about 0.7 h more at the mean of the finished runs of each cell "
                                               "(1 in cells with none finished, at the mean of all)")
    assert estimate(done, todo[:1], workers=1) == "; about 0.8 h more at the mean of the finished runs of each cell"
    assert estimate([], todo, workers=1) == "" and estimate(done, [], workers=1) == ""
