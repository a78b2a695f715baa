"""Study evaluators (recurvit.study.evaluators, recurvit.tasks.classify.evaluators): named in the study file,
recorded per run, run only where missing; a new evaluator is one class and one table entry."""
import json

import pytest
import torch

from recurvit.errors import UserError
from recurvit.study import load_study, run_study
from recurvit.study.evaluators import Evaluator, missing, recorded
from recurvit.tasks.classify import evaluators as classify_eval

BASE = """
model: {name: bvit_tiny, patch_size: 4, embed_dim: 24, num_heads: 2, global_pool: avg, class_token: false, steps: 3}
data: {name: digits}
train: {epochs: 1, batch_size: 256, progress: false}
"""
STUDY = """
name: ev
base: base.yaml
grid:
  regime:
    a: {{}}
    b: {{model.steps: 2}}
  train.seed: [0]
eval:
{eval}
results: res
"""


def _study(tmp_path, eval_lines):
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "s.yaml").write_text(STUDY.format(eval=eval_lines))
    return load_study(tmp_path / "s.yaml")


class Brightness(Evaluator):
    """The new evaluator of this test: mean test-image value and the share of images predicted as class 0."""

    name = "brightness"
    defaults = {"images": 64}
    calls = 0

    def __call__(self, run, options):
        Brightness.calls += 1
        x, _ = next(iter(run.test_loader))
        x = x[:options["images"]].to(run.device)
        with torch.no_grad():
            zero = (run.model(x).argmax(-1) == 0).float().mean().item()
        return {"mean_pixel": x.mean().item(), "share_class0": zero}


def test_a_new_evaluator_is_one_class_and_one_entry_and_runs_only_where_missing(tmp_path, monkeypatch):
    study = _study(tmp_path, "  max_steps_factor: 1")
    out = tmp_path / "runs"
    rows = run_study(study, out, progress=False, log=lambda *a: None)
    assert all("error" not in r for r in rows) and all("mean_pixel" not in r for r in rows)
    last = {r["run_id"]: (out / "runs" / r["run_id"] / "last.pt").stat().st_mtime_ns for r in rows}
    horizon_calls = []
    real_horizon = classify_eval.EVALUATORS["horizon"]
    monkeypatch.setitem(classify_eval.EVALUATORS, "brightness", Brightness())
    monkeypatch.setitem(classify_eval.EVALUATORS, "horizon",
                        type("Spy", (type(real_horizon),), {"__call__": lambda self, run, o: horizon_calls.append(1)
                                                            or type(real_horizon).__call__(self, run, o)})())
    # the study now names the new evaluator, for the runs of cell a only
    study = _study(tmp_path, "  max_steps_factor: 1\n  brightness: {images: 32, only: {regime: [a]}}")
    rows2 = {r["run_id"]: r for r in run_study(study, out, progress=False, log=lambda *a: None)}
    assert Brightness.calls == 1 and not horizon_calls  # only the missing evaluator ran, on a's run only
    a, b = rows2["a__seed=0"], rows2["b__seed=0"]
    assert 0 <= a["share_class0"] <= 1 and a["mean_pixel"] > 0 and "mean_pixel" not in b
    first = next(r for r in rows if r["run_id"] == "a__seed=0")
    assert a["acc_T"] == first["acc_T"]  # the sweep's figures kept
    assert a["eval_seconds"] > first["eval_seconds"]  # the cost of both evaluation passes, not the last one's
    assert {k: (out / "runs" / k / "last.pt").stat().st_mtime_ns for k in last} == last  # nothing trained again
    stored = json.loads((out / "runs" / "a__seed=0" / "result.json").read_text())
    assert stored["eval"] == {"horizon": {"max_steps_factor": 1},
                              "brightness": {"images": 32, "only": {"regime": ["a"]}}}
    # asking again: nothing to do; other options: the evaluator runs again, alone
    run_study(study, out, progress=False, log=lambda *a: None)
    assert Brightness.calls == 1
    study = _study(tmp_path, "  max_steps_factor: 1\n  brightness: {images: 16, only: {regime: [a]}}")
    run_study(study, out, progress=False, log=lambda *a: None)
    assert Brightness.calls == 2 and not horizon_calls


class Broken(Evaluator):
    """An evaluator that fails on this machine (as a study's data set missing here would)."""

    name = "broken"
    defaults = {"images": 8}

    def __call__(self, run, options):
        raise RuntimeError("the data set is not on this machine")


def test_a_failed_evaluation_again_keeps_the_runs_stored_result(tmp_path, monkeypatch):
    """A finished run evaluated again (a new evaluator) whose evaluation fails keeps its stored result in the
    rows and in the report: a committed row does not turn into a failure on a machine that cannot evaluate it."""
    study = _study(tmp_path, "  max_steps_factor: 1")
    out = tmp_path / "runs"
    first = {r["run_id"]: r for r in run_study(study, out, progress=False, log=lambda *a: None)}
    assert all(r["train_threads"] == torch.get_num_threads() for r in first.values())  # what its float sums used
    monkeypatch.setitem(classify_eval.EVALUATORS, "broken", Broken())
    study = _study(tmp_path, "  max_steps_factor: 1\n  broken: {images: 8}")
    lines = []
    rows = {r["run_id"]: r for r in run_study(study, out, progress=False, log=lines.append)}
    assert all("error" not in r for r in rows.values())
    assert {k: r["acc_T"] for k, r in rows.items()} == {k: r["acc_T"] for k, r in first.items()}
    assert sum("evaluating it again failed (RuntimeError: the data set is not on this machine)" in line
               for line in lines) == 2
    # without a stored copy, the failure is the row
    for k in first:
        (tmp_path / "res" / "runs" / k / "result.json").unlink()
    rows = run_study(study, out, progress=False, log=lambda *a: None)
    assert all("error" in r for r in rows)


def test_bad_evaluator_entries_are_one_line_errors(tmp_path):
    for lines, words in [("  nothing: {}", "unknown evaluator 'eval.nothing'"),
                         ("  per_step: {imgs: 3}", "per_step has no option imgs"),
                         ("  per_step: {only: {regime: [c]}}", "names c, which are not labels of 'regime'"),
                         ("  per_step: {only: {width: [a]}}", "names axis 'width'"),
                         ("  variants: {x: {methdo: rk4}}", "methdo, an option of no core"),
                         ("  max_steps_factor: 0", "max_steps_factor must be an integer >= 1"),
                         ("  step_pruning: {images: 3}", "images must be an integer >= 4, got 3"),
                         ("  step_pruning: {mlp_slices: 2.5}", "mlp_slices must be an integer >= 1, got 2.5"),
                         ("  continuation: {images: 0}", "images must be an integer >= 1, got 0")]:
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            _study(tmp_path, lines)


def test_a_result_records_its_evaluators_and_an_earlier_record_is_one_line(tmp_path):
    """A result records the evaluators it ran as parse_eval gives them; one of an earlier recurvit
    ({max_steps_factor, variants}, or none) is refused in one line naming the script that rewrites it."""
    from recurvit.study.archive import read_result

    res = {"run_id": "a", "eval": {"horizon": {"max_steps_factor": 64}}}
    assert recorded(res) == {"horizon": {"max_steps_factor": 64}}
    assert missing({"horizon": {"max_steps_factor": 64}}, res) == {}
    assert missing({"horizon": {"max_steps_factor": 64}, "per_step": {"images": 10}}, res) == {
        "per_step": {"images": 10}}
    for old in ({"max_steps_factor": 64, "variants": {}}, None):
        (tmp_path / "result.json").write_text(json.dumps({"run_id": "a", "eval": old}))
        with pytest.raises(UserError, match=r"earlier recurvit .*scripts/migrate_results\.py"):
            read_result(tmp_path / "result.json")


def test_a_variant_the_core_does_not_take_is_known_from_the_core():
    from recurvit.models import create_model

    rec = create_model("bvit_tiny", img_size=8, patch_size=4, in_chans=1, num_classes=10, embed_dim=16,
                       num_heads=2, steps=2)
    ode = create_model("bvit_tiny", img_size=8, patch_size=4, in_chans=1, num_classes=10, embed_dim=16,
                       num_heads=2, steps=2, core="ode", method="dopri5")
    assert "does not apply" in rec.cfg.core_cls.accepts(rec.cfg, method="rk4")
    assert ode.cfg.core_cls.accepts(ode.cfg, method="rk4") is None
    assert "fixed-step" in ode.cfg.core_cls.accepts(ode.cfg, refine=2)  # an adaptive solver picks its own steps


@pytest.mark.slow
def test_per_step_figures_on_a_trained_run(tmp_path):
    """skip_drop at step T of a recurrence is exactly the readout gain of its last step (skipping step T
    reads z_{T-1} with the same head), skipping any other step costs the same, and every figure is in range."""
    study = _study(tmp_path, "  max_steps_factor: 1\n  per_step: {images: 100}")
    rows = run_study(study, tmp_path / "runs", progress=False, log=lambda *a: None)
    for r in rows:
        T = r["steps"]
        ps = r["per_step"]
        assert len(ps["readout_accuracy"]) == len(ps["skip_drop"]) == len(ps["rel_update"]) == T
        assert r["skip_drop_T"] == pytest.approx(r["readout_gain_T"], abs=1e-9)
        # a step-independent recurrence skipped at ANY one step runs T - 1 steps: the same drop at every step
        assert max(ps["skip_drop"]) == pytest.approx(min(ps["skip_drop"]), abs=1e-9)
        assert 0 < r["cka_last_pair"] <= 1 + 1e-6 and r["rel_update_T"] > 0
        assert ps["images"] == 100 and ps["readout_accuracy"][-1] == pytest.approx(r["acc_T"], abs=0.1)


def test_loop_interventions_evaluator_on_a_tiny_loopvae(tmp_path):
    """The LoopVAE study's evaluator: the intervention rows, every loop's update size, and the figures its
    claims read, consistent with the rows (one loop fewer = the truncate row; skipping = factor 0)."""
    from tests.tasks.vae.test_task import TINY_RUN

    pairs = dict(o.split("=", 1) for o in TINY_RUN)
    pairs["train.threads"] = 1  # a study file gives each key once (a key given twice is refused)
    overrides = "\n".join(f"  {k}: {v}" for k, v in pairs.items())
    (tmp_path / "s.yaml").write_text(f"""
name: loops
task: vae
base: {str(__import__('recurvit').__file__).rsplit('/', 1)[0]}/configs/vae/photos.yaml
overrides:
{overrides}
grid:
  train.seed: [0]
eval:
  interventions: {{truncate: [1], factors: [0.0, 2.0]}}
results: res
""")
    study = load_study(tmp_path / "s.yaml")
    [r] = run_study(study, tmp_path / "runs", progress=False, log=lambda *a: None)
    assert "error" not in r, r.get("error")
    rows = {(x["kind"], x["side"], x["scale"], x["factor"]): x for x in r["interventions"]}
    trained = rows[("trained", "both", "", "")]
    assert trained["psnr"] == pytest.approx(r["psnr"], abs=1e-6)  # the trained row is the run's own evaluation
    one_fewer = next(x for x in r["interventions"] if x["kind"] == "truncate")
    assert r["trunc1_cost_db"] == pytest.approx(trained["psnr"] - one_fewer["psnr"])
    skipped = [x for x in r["interventions"] if x["kind"] == "scale_update" and x["factor"] == 0.0]
    assert r["skip_last_cost_db"] == pytest.approx(sum(trained["psnr"] - x["psnr"] for x in skipped) / len(skipped))
    sizes = {(u["side"], u["scale"], u["loop"]): u["rel"] for u in r["update_sizes"]}
    assert all(v > 0 for v in sizes.values()) and len(sizes) == 2 * sum(
        int(v) for v in trained["enc_loops"].split("-"))  # every trained loop of encoder and decoder
    assert r["last_update_rel"] > 0


@pytest.mark.slow
def test_exit_evaluator_calibrates_off_the_test_split(tmp_path):
    """The anytime-exit evaluator: a held-out split calibrates every criterion and chooses among them, the
    test split measures; a tagged second instance (``exit@deep``) runs with other options, its columns tagged."""
    (tmp_path / "base.yaml").write_text(BASE.replace("data: {name: digits}", "data: {name: digits, holdout: 0.2}"))
    (tmp_path / "s.yaml").write_text(STUDY.format(
        eval="  max_steps_factor: 1\n  exit: {criteria: [max_prob, kl], target_drop: 2.0, only: {regime: [a]}}\n"
             "  exit@deep: {criteria: kl, max_steps: 6, only: {regime: [a]}}"))
    rows = {r["run_id"]: r for r in run_study(load_study(tmp_path / "s.yaml"), tmp_path / "runs", progress=False,
                                              log=lambda *a: None)}
    a = rows["a__seed=0"]
    per = a["exit"]["per_criterion"]
    assert set(per) == {"max_prob", "kl"} and all(p["calibration_images"] == "held out from training" for p in per.values())
    chosen = a["exit"]["chosen"]
    assert per[chosen]["calibration"]["mean_steps"] == min(p["calibration"]["mean_steps"] for p in per.values())
    assert a["exit_accuracy"] == pytest.approx(per[chosen]["test"]["accuracy"])  # the chosen one's test point
    assert a["exit_calibration_steps"] == per[chosen]["calibration"]["mean_steps"] and a["exit_speedup"] > 0
    assert a["exit_steps_pct_T"] == pytest.approx(100 * a["exit_mean_steps"] / 3)
    deep = a["exit@deep"]["per_criterion"]["kl"]
    assert deep["max_steps"] == 6 and a["exit_mean_steps@deep"] == pytest.approx(deep["test"]["mean_steps"])
    assert "exit" not in rows["b__seed=0"] and "exit_accuracy@deep" not in rows["b__seed=0"]
    from recurvit.study import write_report

    report = write_report(list(rows.values()), load_study(tmp_path / "s.yaml"), tmp_path / "res").read_text()
    header = (tmp_path / "res" / "results.csv").read_text().splitlines()[0].split(",")
    assert {"exit_accuracy", "exit_accuracy@deep", "exit_speedup@deep"} <= set(header)
    assert "exit_speedup@deep" in report and "![anytime exit" in report
    assert (tmp_path / "res" / "exit.png").stat().st_size > 1000


def test_bad_exit_options_and_tags_are_one_clear_error(tmp_path):
    (tmp_path / "base.yaml").write_text(BASE)
    for bad, needle in (("exit: {criteria: [fastest]}", "criteria must be"), ("exit@: {}", "must be a name"),
                        ("horizon@x y: {}", "must be a name"), ("exits@b: {}", "unknown evaluator")):
        (tmp_path / "s.yaml").write_text(STUDY.format(eval="  " + bad))
        with pytest.raises(UserError, match=needle):
            load_study(tmp_path / "s.yaml")


def test_a_study_builds_on_another_studys_runs(tmp_path, monkeypatch):
    """``from:``: a fine-tuning study fine-tunes each run of another study (here the bViT and ViT of a
    tiny digits study) with every recipe of its grid; the source's labels stay, so seeds pair."""
    from recurvit.study import write_report

    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "src.yaml").write_text("name: src\nbase: base.yaml\ngrid:\n  regime:\n    rec: {}\n"
                                       "    vit: {model.name: vit_tiny, model.depth: 3}\n  train.seed: [0, 1]\n"
                                       "eval: {max_steps_factor: 1}\nresults: src_res\n")
    (tmp_path / "ft.yaml").write_text("name: ft\ntask: finetune\nfrom: {study: src.yaml, only: {train.seed: [0]}}\n"
                                      "overrides: {finetune.data: digits, train.epochs: 1}\n"
                                      "grid:\n  method:\n    head: {finetune.method: head}\n"
                                      "    lora: {finetune.method: lora, finetune.rank: 2}\n"
                                      "eval: {max_steps_factor: 1}\nresults: ft_res\n")
    ft = load_study(tmp_path / "ft.yaml")
    assert [r.run_id for r in ft.runs] == ["rec__seed=0__head", "rec__seed=0__lora", "vit__seed=0__head",
                                           "vit__seed=0__lora"]
    monkeypatch.chdir(tmp_path)  # runs/studies/<name> is relative to the working directory
    rows = run_study(ft, tmp_path / "runs" / "studies" / "ft", progress=False, log=lambda *a: None)
    assert all("no last.pt" in r["error"] for r in rows)  # the source study has not run yet: one clear line
    run_study(load_study(tmp_path / "src.yaml"), tmp_path / "runs" / "studies" / "src", progress=False,
              log=lambda *a: None, only=["*__seed=0"])
    rows = {r["run_id"]: r for r in run_study(ft, tmp_path / "runs" / "studies" / "ft", progress=False,
                                              log=lambda *a: None)}
    assert all("error" not in r for r in rows.values()), rows
    head, lora = rows["rec__seed=0__head"], rows["rec__seed=0__lora"]
    assert head["regime"] == "rec" and head["train.seed"] == "0" and head["method"] == "head"
    assert 0 < head["trainable_params"] < lora["trainable_params"] < head["params_stored"]
    assert 0 <= head["acc_T"] <= 1 and (tmp_path / "runs" / "studies" / "ft" / "runs" / "vit__seed=0__lora" /
                                        "finetune.json").is_file()
    report = write_report(list(rows.values()), ft, ft.results).read_text()
    assert "| rec | head |" in report and "| vit | lora |" in report
    with pytest.raises(UserError, match="from.only names regime"):
        (tmp_path / "bad.yaml").write_text("name: b\ntask: finetune\nfrom: {study: src.yaml, only: {regime: [x]}}\n"
                                           "grid:\n  method:\n    head: {finetune.method: head}\n")
        load_study(tmp_path / "bad.yaml")


def test_the_per_step_evaluators_record_their_figures_from_the_analyses(tmp_path):
    """per_step, continuation and step_pruning in a study: each run's columns are the analyses' own
    figures on its first test images (re-run here on the loaded run), only in the cells named."""
    from recurvit.analysis.per_step import continuation, step_specificity
    from recurvit.study.evaluators import Evaluated

    study = _study(tmp_path, "  max_steps_factor: 1\n  per_step: {images: 64}\n  continuation: {images: 64}\n"
                             "  step_pruning: {images: 256, mlp_slices: 4, only: {regime: [a]}}")
    (tmp_path / "base.yaml").write_text(BASE.replace("epochs: 1, batch_size: 256", "epochs: 4, batch_size: 64, lr: 3.0e-3"))
    study = load_study(tmp_path / "s.yaml")  # trained a little longer: masks that change some answers
    rows = {r["run_id"]: r for r in run_study(study, tmp_path / "runs", progress=False, log=lambda *a: None)}
    a, b = rows["a__seed=0"], rows["b__seed=0"]
    assert all("error" not in r for r in rows.values())
    assert "prune_split_r" in a and "prune_split_r" not in b and "continue_drop_T" in b
    p = a["step_pruning"]
    assert p["images"] == 256 and p["steps"] == 3 and p["units"] == ["head0", "head1", "mlp0", "mlp1", "mlp2", "mlp3"]
    assert len(p["drops"]) == 3 and all(len(row) == 6 for row in p["drops"]) and -1 <= a["prune_split_r"] <= 1
    assert len(a["per_step"]["skip_drop"]) == 3 and a["skip_drop_T"] == a["per_step"]["skip_drop"][-1]
    from recurvit.run.loaders import build_test_loader
    import recurvit

    out = tmp_path / "runs" / "runs" / "a__seed=0"
    loaded = recurvit.load(out / "last.pt")
    model, cfg = loaded.model, loaded.config
    loader, info = build_test_loader(cfg)
    run = Evaluated(model.eval(), cfg, out, torch.device("cpu"), loader, info)
    batches = classify_eval.first_images(run, 64)
    assert a["continue_drop_T"] == continuation(run.model, batches, device=run.device)["drop"]
    assert p == step_specificity(run.model, classify_eval.first_images(run, 256), mlp_slices=4, device=run.device)


def test_the_exit_evaluators_certify_option_is_checked_and_absent_from_old_records():
    """eval.exit.certify: {epsilon: points, delta} is checked when the study file is read; a study that does
    not ask for it records the options it always did, so its finished runs are not evaluated again."""
    from recurvit.study.evaluators import missing, parse_eval
    from recurvit.tasks.classify.evaluators import EVALUATORS

    axes = {"regime": ["a"]}
    plain = parse_eval({"exit": {"criteria": ["kl"]}}, EVALUATORS, "s", axes)
    assert "certify" not in plain["exit"]
    old = {"eval": {**plain}}
    assert missing(plain, old) == {}
    cert = parse_eval({"exit": {"certify": {"epsilon": 0.5, "delta": 0.1}}}, EVALUATORS, "s", axes)
    assert cert["exit"]["certify"] == {"epsilon": 0.5, "delta": 0.1} and missing(cert, old)
    for bad in ({"epsilon": 0.5}, {"epsilon": 0, "delta": 0.1}, {"epsilon": 0.5, "delta": 1.5}, "yes"):
        with pytest.raises(UserError, match="certify takes"):
            parse_eval({"exit": {"certify": bad}}, EVALUATORS, "s", axes)


def test_deploy_evaluator_certifies_on_the_held_out_split_and_times_the_exported_exit(tmp_path, monkeypatch):
    """The deploy evaluator: the exit threshold is certified with the exported step programs on exactly the
    run's held-out images, and only then is the test split read (a calibration on test images, or a test
    split read first, fails here); its figures agree with each other and, where no exit is certified,
    nothing is timed and nothing is lost."""
    pytest.importorskip("onnxruntime")
    import recurvit.export.certified as C
    from recurvit.config import DataConfig
    from recurvit.data import build_datasets
    from recurvit.data.calibration import holdout_split

    (tmp_path / "base.yaml").write_text(BASE.replace("data: {name: digits}", "data: {name: digits, holdout: 0.2}"))
    (tmp_path / "s.yaml").write_text(STUDY.format(
        eval="  max_steps_factor: 1\n  deploy: {epsilon: 5, delta: 0.2, rounds: 2, time_images: 256, "
             "only: {regime: [a]}}"))
    order, seen = [], {}
    real_certify, real_run = C.certified_threshold, C.deployed_exit

    def certify(prog, batches, *a, **kw):
        seen["calibration"] = torch.cat(list(batches))
        order.append("certify")
        return real_certify(prog, batches, *a, **kw)

    def deployed(model, calib, test_split, *a, **kw):
        def counted():
            order.append("test")
            return test_split()
        return real_run(model, calib, counted, *a, **kw)

    monkeypatch.setattr(C, "certified_threshold", certify)
    monkeypatch.setattr(classify_eval, "deployed_exit", deployed)
    rows = {r["run_id"]: r for r in run_study(load_study(tmp_path / "s.yaml"), tmp_path / "runs", progress=False,
                                              log=lambda *a: None)}
    assert order == ["certify", "test"]  # the test split is read once, after the threshold is fixed
    train, test, _ = build_datasets(DataConfig(name="digits"))  # the whole training split: holdout_split takes its part
    held = holdout_split(train, test, 0.2)
    assert torch.equal(seen["calibration"], torch.stack([held[i][0] for i in range(len(held))]))
    a = rows["a__seed=0"]
    d = a["deploy"]
    assert d["calibration_images"] == len(held) and d["test_images"] == len(test)
    assert a["deploy_drop_points"] <= a["deploy_disagree_points"] + 1e-9  # an unchanged answer cannot lose accuracy
    assert 0 < a["deploy_steps_pct_T"] <= 100 and a["deploy_int8_weight_ratio"] > 1
    if a["deploy_certified"]:
        assert a["deploy_speedup"] > 0 and d["timed_rounds"] == 2 and d["mean_steps"] <= 3
    else:
        assert a["deploy_speedup"] == 1.0 and a["deploy_disagree_points"] == 0 and d["mean_steps"] == 3
    assert "deploy" not in rows["b__seed=0"]
    for bad in ("{epsilon: 0}", "{delta: 1}", "{rounds: 1}"):
        (tmp_path / "s.yaml").write_text(STUDY.format(eval=f"  deploy: {bad}"))
        with pytest.raises(UserError, match="deploy"):
            load_study(tmp_path / "s.yaml")


def test_deploy_evaluator_refuses_a_run_without_a_held_out_split():
    class Run:
        cfg = type("C", (), {"data": type("D", (), {"holdout": 0.0})()})()
        out = "runs/x"

    with pytest.raises(UserError, match="held-out split"):
        classify_eval.EVALUATORS["deploy"](Run(), classify_eval.EVALUATORS["deploy"].check({}, "s"))
