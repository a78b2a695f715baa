"""scripts/migrate_results.py: result files of an earlier recurvit (result.json, results.csv, checkpoints) rewritten
in the current form, only where they are in an earlier form (a second run changes nothing), ``--check`` without
writing; the readers refuse the earlier forms in one line naming the script."""
import csv
import json
from pathlib import Path

import pytest
import torch

from recurvit.errors import UserError
from recurvit.models import create_model
from recurvit.run.checkpoint import FORMAT, task_of
from recurvit.run.load import load
from recurvit.study import load_study
from recurvit.study.archive import read_result
from recurvit.study.evaluators import recorded
from recurvit.study.plateau import plateau_change
from recurvit.study.report import results_csv, rows_from_csv
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
migrate = load_script("scripts/migrate_results.py")

BASE = "model: {name: bvit_tiny, patch_size: 4, embed_dim: 16, num_heads: 2}\ndata: {name: digits}\n"
STUDY = "name: old\nbase: base.yaml\ngrid:\n  regime:\n    a: {model.steps: 2}\n  train.seed: [0, 1]\nresults: res\n"
OLD_COLUMNS = ("run_id,regime,train.seed,model,core,runs_as,embed_dim,depth,steps,seed,epochs,params,params_stored,"
               "flops_forward,nfe,chance,acc_T,acc_2T,acc_4T,acc_8T,acc_16T,acc_mean_T_4T,test_acc_final,"
               "train_seconds,eval_seconds")
CURVE = [0.5, 0.6, 0.65, 0.7, 0.72, 0.73]


def _old_folder(tmp_path: Path) -> dict:
    """A study file, its results folder and a run directory as an earlier recurvit left them."""
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "base.yaml").write_text(BASE)
    (studies / "old.yaml").write_text(STUDY)
    res = studies / "res"
    rows = [f"a__seed={s},a,{s},bvit_tiny,recurrent,recurrent,16,1,2,{s},6,100,100,2000,2,0.1,0.8{s + 1},0.7,0.6,,,"
            f"0.7,0.8{s + 1},12.5,1.25" for s in (0, 1)]
    res.mkdir()
    (res / "results.csv").write_bytes(("\r\n".join([OLD_COLUMNS, *rows]) + "\r\n").encode())
    old = {"run_id": "a__seed=0", "acc_T": 0.8, "test_acc_curve": CURVE, "train_seconds": 12.5,
           "eval": {"max_steps_factor": 4, "variants": {}}}
    archived = res / "runs" / "a__seed=0" / "result.json"
    archived.parent.mkdir(parents=True)
    archived.write_text(json.dumps(old, indent=1))
    run = tmp_path / "runs" / "a__seed=1"  # a run directory: no eval record, no training time, its log beside it
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"run_id": "a__seed=1", "acc_T": 0.81, "test_acc_curve": CURVE,
                                                 "val_acc_curve": CURVE, "train_seconds": None}, indent=1))
    (run / "metrics.jsonl").write_text('{"epoch": 1, "train_seconds": 6.0}\n{"epoch": 2, "train_seconds": 12.0}\n')
    model = {"name": "bvit_tiny", "img_size": 8, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 16,
             "num_heads": 2, "steps": 2}
    weights = create_model(**model).state_dict()  # a checkpoint of before checkpoints named their task
    torch.save({"format": FORMAT, "config": {"model": {**model, "reinject": True}, "data": {"name": "digits"}},
                "model": weights, "epoch": 2, "optimizer": {}, "best_acc": 0.5}, run / "last.pt")
    return {"studies": studies, "res": res, "archived": archived, "run": run}


def _bytes(*folders: Path) -> dict:
    return {p: p.read_bytes() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


def test_an_earlier_results_folder_is_migrated_once_and_check_says_so(tmp_path, capsys):
    f = _old_folder(tmp_path)
    args = [str(f["res"]), str(f["run"]), "--studies", str(f["studies"])]
    before = _bytes(f["res"], f["run"])

    assert migrate.main([*args, "--check"]) == 1  # four files would change; none is written
    said = capsys.readouterr().out
    assert said.count("would rewrite") == 4 and "4 file(s) in an earlier form" in said
    assert _bytes(f["res"], f["run"]) == before
    for old in (f["archived"], f["run"] / "result.json"):  # the readers refuse the earlier form in one line
        with pytest.raises(UserError, match=r"earlier recurvit .*scripts/migrate_results\.py"):
            read_result(old)
    with pytest.raises(UserError, match=r"names no task.*scripts/migrate_results\.py .*a__seed=1"):
        load(f["run"] / "last.pt")

    assert migrate.main(args) == 0
    archived = read_result(f["archived"])  # the {max_steps_factor, variants} record, the plateau off the curve
    assert archived["eval"] == {"horizon": {"max_steps_factor": 4}} and recorded(archived) == archived["eval"]
    assert archived["plateau_test"] == pytest.approx(plateau_change(CURVE)) and archived["acc_T"] == 0.8
    run = read_result(f["run"] / "result.json")  # no record: the horizon to 4T it ran; the time of its last epoch
    assert run["eval"] == {"horizon": {"max_steps_factor": 4}} and run["train_seconds"] == 12.0
    assert run["plateau_val"] == pytest.approx(plateau_change(CURVE))
    ckpt = torch.load(f["run"] / "last.pt", weights_only=True)  # its task, options, score, metrics, preprocessing
    assert task_of(ckpt) == "classify" and ckpt["config"]["model"]["options"] == {"reinject": True}
    assert ckpt["best_score"] == 0.5 and "best_acc" not in ckpt and ckpt["metrics"]["train_seconds"] == 12.0
    assert ckpt["data"]["name"] == "digits" and len(ckpt["data"]["class_names"]) == 10
    assert load(f["run"] / "last.pt").model.cfg.options.reinject is True  # it loads as a current one
    study = load_study(f["studies"] / "old.yaml")
    with open(f["res"] / "results.csv", newline="") as fh:
        text = fh.read()
    assert text == results_csv(rows_from_csv(f["res"] / "results.csv", study), study)  # the current writer's
    table = list(csv.DictReader(text.splitlines()))
    assert {"acc_32T", "acc_64T", "plateau_val", "plateau_test"} <= set(table[0])
    assert [(r["run_id"], r["acc_T"]) for r in table] == [("a__seed=0", "0.81"), ("a__seed=1", "0.82")]
    assert all(r["plateau_test"] == "" for r in table)  # a figure the table never held stays empty

    after = _bytes(f["res"], f["run"])
    capsys.readouterr()
    assert migrate.main([*args, "--check"]) == 0 and "0 file(s)" in capsys.readouterr().out
    assert migrate.main(args) == 0 and _bytes(f["res"], f["run"]) == after  # idempotent


@pytest.mark.slow
def test_the_committed_results_are_in_the_current_form(capsys):
    """Every committed result.json, results.csv and checkpoint reads as it is (the script was run on them)."""
    assert migrate.main(["--check"]) == 0, capsys.readouterr().out
