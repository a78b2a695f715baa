"""The study runner: grid expansion, resumable runs, generated results; the mixture command."""
import csv
import json

import pytest

from recurvit.study import load_study, run_study, write_report
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


def test_study_file_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_study(tmp_path / "none.yaml")
    (tmp_path / "s.yaml").write_text("name: x\ngrid: {}\n")
    with pytest.raises(UserError, match="needs a 'base:'"):
        load_study(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text("name: x\nbase: nope.yaml\ngrid: {}\n")
    with pytest.raises(UserError, match="base config not found"):
        load_study(tmp_path / "s.yaml")


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
