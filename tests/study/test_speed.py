"""The deploy evaluator's speed figures carry what recurvit.study.speed decides from: the machine's load around
the timing (before it, and the highest reading during it), its cores and the threads timed, and the FLOPs per
image of the deployed programs, whose compute ceiling lies between 1 and the step ratio. A row of a loaded
machine decides nothing, one above its ceiling is flagged, and a run whose deploy record predates these figures
is evaluated again."""
import math
from types import SimpleNamespace

import pytest
import torch

import recurvit
from recurvit.analysis import timing
from recurvit.errors import UserError
from recurvit.export.certified import deployed_exit, program_flops
from recurvit.study import speed
from recurvit.study.evaluators import missing, parse_eval
from recurvit.tasks.classify.evaluators import EVALUATORS, Deploy

pytestmark = pytest.mark.usefixtures("one_thread")
SHAPE = dict(img_size=8, patch_size=4, in_chans=3, num_classes=5, embed_dim=24, num_heads=2)
NEW = ("deploy_load_before", "deploy_load_during", "deploy_cores", "deploy_threads", "deploy_flops_step",
       "deploy_flops_embed", "deploy_flops_readout", "deploy_flops_check")
BOUND = {"min": 1.4}


def tiny(name="bvit_tiny", **kw):
    torch.manual_seed(0)
    return recurvit.create_model(name, **SHAPE, **kw).eval()


@pytest.fixture(scope="module")
def deployed():
    """deployed_exit on a random 3-step bViT (every image may exit: a loose certificate), timed on 2 rounds
    while the load average reads 0.1 before and rises to 3.5 in the middle of the timing, on 2 cores."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    readings = [0.1, 0.3, 3.5, 0.4]  # on entering, after round 1, after round 2, on leaving

    def reading():
        return readings.pop(0) if len(readings) > 1 else readings[0]

    g = torch.Generator().manual_seed(1)
    calib, test_x = torch.randn(200, 3, 8, 8, generator=g), torch.randn(300, 3, 8, 8, generator=g)
    test_y = torch.randint(0, 5, (300,), generator=g)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timing, "load_average", reading)
        mp.setattr(timing, "cores", lambda: 2)
        res = deployed_exit(tiny(steps=3), calib, lambda: (test_x, test_y), epsilon=0.5, delta=0.5, rounds=2,
                            time_images=128, batch_size=64, int8=False, per_step_readouts=True)
    assert res["certified"] and res["timed_rounds"] == 2  # timed: the load and the speed-up are figures
    return res


def csv_row(res, **change):
    """The row results.csv holds for a run with these deploy figures (its numbers as the writer formats them)."""
    row = {"steps": res["trained_steps"], **Deploy.row({**res, **change})}
    return {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items() if k != "deploy"}


def test_the_deployed_exit_records_the_load_around_its_timing_and_the_flops_of_its_programs(deployed):
    r = deployed
    assert r["load_before"] == 0.1 and r["load_during"] == 3.5  # the highest reading, not the last one
    assert r["cores"] == 2 and r["threads"] == 1
    assert r["flops_step"] > 0 and r["flops_embed"] > 0 and r["flops_readout"] > 0 and r["flops_check"] > 0
    assert r["flops_embed"] + r["flops_readout"] < r["flops_step"]  # a step of this model outweighs both
    row = csv_row(r)
    assert all(row[c] not in (None, "") for c in NEW)
    top, how = speed.ceiling(row, "deploy_speedup")
    assert 1 <= top <= 100 / r["steps_pct_T"] and "embedding and readout counted" in how


def test_the_flops_split_sums_to_the_models_forward_and_bounds_a_12_step_bvit_near_its_step_ratio():
    from recurvit.analysis.accounting import measure_flops

    for model in (tiny(steps=3), tiny("vit_tiny", depth=3, stage_heads=3)):
        f, c, T = program_flops(model), model.cfg, model.nominal_steps
        whole = measure_flops(model, (c.in_chans, c.img_size, c.img_size), train=False)["flops_forward"]
        assert f["flops_embed"] + T * f["flops_step"] + f["flops_readout"] == whole
    assert program_flops(tiny(steps=3), exits=False)["flops_check"] == 0
    model = recurvit.create_model("bvit_tiny", steps=12).eval()  # 224 px, 12 steps
    f = program_flops(model)
    assert f["flops_embed"] + f["flops_readout"] < 0.05 * 12 * f["flops_step"]
    row = {"steps": 12, "deploy_steps_pct_T": 50.0, **{f"deploy_{k}": v for k, v in f.items()}}
    top, _ = speed.ceiling(row, "deploy_speedup")
    assert 1.9 < top < 2.0  # half the steps: under the step ratio's 2x, by the embedding's share


def test_a_row_timed_on_a_loaded_machine_decides_nothing_and_one_above_its_ceiling_is_flagged(deployed):
    r, col = deployed, "deploy_speedup"
    assert speed.read(csv_row(r), col, BOUND).state == speed.LOADED  # 3.5 - 1 own thread > 0.5 x 2 cores
    assert speed.read(csv_row(r, load_before=2.5, load_during=1.2), col, BOUND).state == speed.LOADED
    # its own warm-up calls just before the timing (one thread on 2 cores) leave the machine quiet
    assert speed.read(csv_row(r, load_before=1.3, load_during=1.2), col, BOUND).state != speed.LOADED
    top, _ = speed.ceiling(csv_row(r), col)
    quiet = dict(load_before=0.2, load_during=1.1)
    under = speed.read(csv_row(r, speedup=0.9 * top, speedup_lo=0.8 * top, speedup_hi=top, **quiet), col, BOUND)
    assert under.state == "" and under.value == pytest.approx(0.8 * top, rel=1e-5)
    above = speed.read(csv_row(r, speedup=1.2 * top, speedup_lo=1.1 * top, speedup_hi=1.3 * top, **quiet), col,
                       BOUND)
    assert above.state == speed.FLAGGED and above.value is None and "above its compute ceiling" in above.text


def test_without_a_certified_exit_nothing_is_timed_and_the_row_says_so():
    res = {"certified": False, "threshold": None, "speedup": 1.0, "speedup_lo": math.nan, "speedup_hi": math.nan,
           "steps_pct_T": 100.0, "trained_steps": 3, "load_before": None, "load_during": None, "cores": None,
           "threads": None, **program_flops(tiny(steps=3), exits=False)}
    row = csv_row(res)
    assert [row[c] for c in NEW[:4]] == [None] * 4
    assert speed.ceiling(row, "deploy_speedup")[0] == pytest.approx(1.0)  # full depth: nothing to gain
    reading = speed.read(row, "deploy_speedup", BOUND)
    assert reading.state == speed.UNRECORDED and not reading.text.startswith(speed.FLAGGED)


def test_the_load_watch_reads_the_load_before_and_the_highest_during():
    with timing.LoadWatch() as load:
        load.sample("round 1")
    assert load.before is not None and load.during is not None and load.during >= 0
    assert load.cores >= 1 and load.during == max(load.readings) and len(load.readings) == 2


def test_a_deploy_record_without_the_load_and_flops_figures_is_evaluated_again():
    axes = {"regime": ["a"]}
    asked = parse_eval({"deploy": {"epsilon": 0.5}}, EVALUATORS, "s", axes)
    assert asked["deploy"]["record"] == Deploy.record
    old = {"eval": {"horizon": asked["horizon"], "deploy": {k: v for k, v in asked["deploy"].items()
                                                            if k != "record"}}}
    assert list(missing(asked, old)) == ["deploy"]  # the horizon record still counts
    assert missing(asked, {"eval": dict(asked)}) == {}
    with pytest.raises(UserError, match="no option record"):
        parse_eval({"deploy": {"record": 1}}, EVALUATORS, "s", axes)  # not a study file's to set


def test_an_exit_record_without_the_interval_and_load_is_evaluated_again():
    """The anytime exit's speed-up decides only with its interval and load record (rows of the fashion_anytime
    study): a run's exit record from before them counts as not evaluated, the instance ``exit@beyond`` too."""
    axes = {"regime": ["a"]}
    asked = parse_eval({"exit": {"criteria": ["kl"]}, "exit@beyond": {"max_steps": 12}}, EVALUATORS, "s", axes)
    assert asked["exit"]["record"] == asked["exit@beyond"]["record"] == EVALUATORS["exit"].record == 2
    old = {"eval": {k: ({kk: vv for kk, vv in v.items() if kk != "record"} if k.startswith("exit") else v)
                    for k, v in asked.items()}}
    assert sorted(missing(asked, old)) == ["exit", "exit@beyond"]
    assert missing(asked, {"eval": dict(asked)}) == {}
    with pytest.raises(UserError, match="no option record"):
        parse_eval({"exit": {"record": 1}}, EVALUATORS, "s", axes)


def test_results_csv_carries_the_new_columns():
    from recurvit.study.report import evaluator_columns

    study = SimpleNamespace(task="classify", evaluators={"horizon": {}, "deploy": {}})
    row = {"deploy_speedup": 1.5, **{c: 1.0 for c in NEW}}
    assert set(NEW) <= set(evaluator_columns([row], study)) and set(NEW) <= set(Deploy.columns)
