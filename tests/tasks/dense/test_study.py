"""A dense (maze) study end to end (tasks/dense/study.py): two tiny cells train and are swept over sizes x
iterations; results.csv holds the columns its claims read, the report its tables and plots, and a claim
of each kind the mazes study registers loads and decides."""
import csv
import json

import pytest

from recurvit.study import load_study, run_study, write_report
from recurvit.study.claims import decide_all
from recurvit.tasks.dense.evaluators import best_iteration, columns_of, size_columns, slope

MAZES = """
data: {name: mazes, maze_size: 5, maze_test_sizes: [5, 9], maze_train: 64, maze_val: 16, maze_test: 8}
train: {epochs: 1, batch_size: 32, lr: 3.0e-3, warmup_epochs: 0, progress: false, device: cpu}
"""
DT = "model: {name: dt_net_recall, width: 4, steps: 2}\n" + MAZES
VIT = ("model: {name: bvit_tiny, core: recurrent, embed_dim: 16, num_heads: 2, patch_size: 2, class_token: false,\n"
       "        global_pool: avg, dense: true, dynamic_img_size: true, steps: 2, reinject: true}\n" + MAZES)
STUDY = """
name: tiny_mazes
task: dense
base: dt.yaml
grid:
  block:
    vit: {base: vit.yaml}
    dt: {}
  train.seed: [0]
eval:
  mazes: {max_steps_factor: 10, mazes: 8, batch_size: 8, patience: 2}
results: out_results
claims:
  recall_beats:
    source: Bansal et al. 2022
    words: the ViT solves more of the largest mazes at 10T than the anchor
    rule: superiority
    figure: solved_9_10T
    a: {block: vit}
    b: {block: dt}
    side: 1
  thinks_longer:
    source: recurvit
    words: at the largest size, solved rises with test-time iterations (per doubling)
    rule: superiority
    figure: solved_9_slope
    a: {block: vit}
    side: 1
  thinks_longer_10T:
    source: recurvit
    words: at the largest size, solved at 10T exceeds solved at T
    rule: superiority
    figure: solved_9_10T - solved_9
    a: {block: vit}
    side: 1
  no_overthinking:
    source: Bansal et al. 2022
    words: solved at 10T within 1 point of the iteration chosen on validation
    rule: noninferiority
    figure: drop_10T_9
    a: {block: vit}
    b: {block: dt}
    margin: 0.01
  rule_grows:
    source: recurvit
    words: the stopping rule uses more iterations on larger mazes
    rule: superiority
    figure: rule_stable_iters_slope
    a: {block: dt}
    side: 1
  target_4x:
    source: recurvit
    words: at least 90% of the largest mazes solved at 10T in every seed
    rule: target
    a: {block: vit}
    targets: {solved_9_10T: {min: 0.9}, drop_10T_9: {min: -0.01}}
"""


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one intra-op thread (conftest.one_thread)."""


def test_the_columns_read_a_sweep_and_choose_on_validation():
    T, K = 2, 20
    up = [min(1.0, k / 10) for k in range(1, K + 1)]  # rises to 1 at iteration 10
    rule = {"solved": 0.5, "steps_mean": 7.0}
    sweep = lambda solved: {"solved": solved, "accuracy": solved, "max_conf": rule, "stable": rule}  # noqa: E731
    val = sweep([0.0] * 3 + [0.9] * (K - 3))  # validation is best first at iteration 4
    row = columns_of({5: sweep(up), 9: sweep(up[:])}, val, T)
    assert row["val_best_iter"] == 4 and row["best_iter_9"] == 4 and row["val_solved"] == 0.0
    assert row["solved_9"] == 0.2 and row["solved_9_2T"] == 0.4 and row["solved_9_10T"] == 1.0
    assert row["best_solved_9"] == up[3] and row["drop_10T_9"] == pytest.approx(1.0 - 0.4)  # read on test
    assert row["solved_9_slope"] > 0 and row["rule_stable_iters_slope"] == 0.0
    assert best_iteration([0.1, 0.3, 0.3]) == 2 and slope([1, 1], [0, 1]) is None


def test_deepthinkings_solved_and_the_state_growth_are_columns_a_claim_can_read():
    T, K = 2, 20
    rule = {"solved": 0.5, "steps_mean": 7.0}
    strict, open_ = [0.0] * K, [0.1] * 3 + [0.8] * (K - 3)  # walls wrong everywhere: only the open pixels right
    rms = [1.0 + 0.1 * k for k in range(K)]  # 1.1 at T = 2, 2.9 at 10T = 20
    sweep = {"solved": strict, "solved_open": open_, "accuracy": strict, "max_conf": rule, "stable": rule,
             "state_rms": rms}
    row = columns_of({9: sweep}, sweep, T, "solved_open")
    assert row["solved_9"] == 0.1 and row["solved_9_10T"] == 0.8 and row["val_best_iter"] == 4
    assert row["state_growth_9"] == pytest.approx(2.9 / 1.1)
    plain = columns_of({9: {k: v for k, v in sweep.items() if k != "state_rms"}}, sweep, T)
    assert plain["solved_9_10T"] == 0.0 and plain["val_best_iter"] == 1 and plain["state_growth_9"] is None
    assert columns_of({9: sweep}, sweep, 11)["state_growth_9"] is None  # 10T = 110 is past the sweep


def test_the_solved_option_is_checked_and_left_out_of_the_record_unless_given():
    from recurvit.errors import UserError
    from recurvit.tasks.dense.evaluators import Mazes
    from recurvit.tasks.dense.study import DenseView, intro

    assert "solved" not in Mazes().check({}, "eval.mazes")  # results recorded before the option stay evaluated
    assert Mazes().check({"solved": "open"}, "eval.mazes")["solved"] == "open"
    with pytest.raises(UserError, match="solved must be one of strict, open"):
        Mazes().check({"solved": "any"}, "eval.mazes")
    assert "DeepThinking's: the share of test mazes with every open pixel right" in intro([], [0], "open")[0]
    assert "every pixel right" in intro([], [0])[0] and "open pixel" not in intro([], [0])[0]
    runs = [{"maze_sweeps": {"9": {"solved": [0.0, 0.0], "solved_open": [0.5, 1.0]}}, "maze_solved": solved}
            for solved in ("open", "strict")]
    for rs, want in ((runs[:1], [0.5, 1.0]), (runs[1:], [0.0, 0.0]), (runs, [0.25, 0.5])):
        c = {}
        DenseView.fill_cell(DenseView(), c, rs)
        assert c["sweeps"][9]["solved"] == want


def test_a_dense_study_runs_reports_and_decides(tmp_path):
    for name, text in (("dt.yaml", DT), ("vit.yaml", VIT), ("s.yaml", STUDY)):
        (tmp_path / name).write_text(text)
    study = load_study(tmp_path / "s.yaml")
    rows = run_study(study, tmp_path / "study", progress=False, log=lambda *a: None)
    assert [r.get("error") for r in rows] == [None, None]
    report = write_report(rows, study, study.results).read_text()
    with open(study.results / "results.csv") as f:
        table = list(csv.DictReader(f))
    cols = set(table[0])
    assert set(size_columns([5, 9])) <= cols
    assert {"params", "params_stored", "train_seconds", "eval_seconds", "val_solved", "val_best_iter",
            "rule_conf_iters_slope", "rule_stable_iters_slope", "max_iters", "mazes_per_size"} <= cols
    vit = next(r for r in table if r["block"] == "vit")
    assert int(vit["max_iters"]) == 20 and vit["best_iter_5"] == vit["best_iter_9"] == vit["val_best_iter"]
    assert 0 <= float(vit["solved_9_10T"]) <= 1 and vit["mazes_per_size"] == "8"
    res = json.loads((tmp_path / "study" / "runs" / "vit__seed=0" / "result.json").read_text())
    assert len(res["maze_sweeps"]["9"]["solved"]) == 20 and res["maze_sweeps"]["9"]["n"] == 8
    assert res["maze_sweeps"]["9"]["stable"]["min_steps"] == 2  # default: the trained depth
    ex = res["maze_example"]
    assert ex["size"] == 9 and len(ex["pred"]) == len(ex["image"]) == 24 and len(ex["image"][0]) == 6 * 24
    assert "Mazes solved (%) per test size" in report and "9: @10T" in report
    assert "What each maze stopping for itself gains over the fixed depth T" in report
    assert "How the recurrent state and the path move past T" in report and "9: state x T→10T" in report
    for png in ("solved_vs_iterations.png", "maze_solved.png"):
        assert (study.results / png).stat().st_size > 1000 and png in report
    (tmp_path / "predict").mkdir()
    _predict_writes_the_path_beside_the_maze(tmp_path / "study" / "runs" / "vit__seed=0", tmp_path / "predict")
    decided = decide_all(study.claims, table)
    assert set(decided) == {c.id for c in study.claims}
    # one seed a cell: no interval, so no comparison or trend decides; the target is counted per seed, from the row
    assert {k: d.verdict for k, d in decided.items() if k != "target_4x"} == dict.fromkeys(
        ["recall_beats", "thinks_longer", "thinks_longer_10T", "no_overthinking", "rule_grows"], "not measured")
    met = float(vit["solved_9_10T"]) >= 0.9 and float(vit["drop_10T_9"]) >= -0.01
    assert decided["target_4x"].verdict == f"target met in {int(met)} of 1 seeds"
    assert "per seed" in decided["target_4x"].note


def _predict_writes_the_path_beside_the_maze(run, tmp_path):
    from PIL import Image

    from recurvit.cli import main
    from recurvit.data.mazes import make_mazes

    x, _ = make_mazes(1, 9, 0, "test")  # a larger maze than the run trained on
    Image.fromarray(x[0].transpose(1, 2, 0)).save(tmp_path / "maze.png")
    assert main(["predict", str(run), str(tmp_path / "maze.png"), "--steps", "4"]) == 0
    with Image.open(tmp_path / "maze.path.png") as im:
        assert im.size == (24, 24)
    assert main(["predict", str(run), str(tmp_path)]) == 0  # its own output, read again, is left out
    assert not (tmp_path / "maze.path.path.png").exists()


def test_the_picture_shows_the_model_that_got_furthest_when_none_solves_the_largest_mazes():
    from recurvit.tasks.dense.plots import _best_cell

    def cell(name, **solved):
        c = {"cell": name, "sizes": [9, 13, 39], "rows": [{"maze_example": {}}]}
        c.update({k: {"mean": v} for k, v in solved.items()})
        return c

    cs = [cell("vit", solved_9=0.1, solved_13=0.0, solved_39=0.0, solved_39_10T=0.0),
          cell("conv", solved_9=0.99, solved_13=0.39, solved_39=0.0, solved_39_10T=0.0),
          cell("rope", solved_9=1.0, solved_13=0.2, solved_39=0.0, solved_39_10T=0.0)]
    assert _best_cell(cs)["cell"] == "conv"  # 39: a tie at 0; 13: 0.39 beats 0.2 and 0
    cs[0]["solved_39_10T"] = {"mean": 0.01}
    assert _best_cell(cs)["cell"] == "vit"  # the largest size decides first


def test_the_report_says_how_far_each_cell_is_behind_the_conv_anchor_and_which_closes_the_most():
    from recurvit.tasks.dense.study import anchor_gaps

    def cell(name, model, solved_9, stable_9):
        rows = [{"solved_9": a, "rule_stable_solved_9": b} for a, b in zip(solved_9, stable_9)]
        return {"cell": name, "model": model, "sizes": [9], "rows": rows, "solved_9": {}, "rule_stable_solved_9": {}}

    anchor = cell("conv", "dt_net_recall", [1.0, 0.9], [1.0, 1.0])
    near, far = cell("near", "bvit_tiny", [0.5, 0.3], [0.2, 0.2]), cell("far", "bvit_tiny", [0.1, 0.1], [0.2, 0.2])
    lines = "\n".join(anchor_gaps([near, anchor, far]))
    assert "| at T | `near` | -55.0 [" in lines and "| at T | `far` | -85.0 [" in lines
    assert "| at T | **closest to the anchor** | `near` (behind by 55.0) |" in lines
    assert "| stable rule | **closest to the anchor** | every cell (behind by 80.0) |" in lines
    assert "| at 10T |" not in lines  # no cell has the figure: no row
    one = cell("one", "bvit_tiny", [0.85], [1.0])
    assert "| at T | `one` | -10.0 (n = 1 / 2) |" in "\n".join(anchor_gaps([anchor, one]))
    assert anchor_gaps([near, far]) == []  # no anchor in the study (mazes_locality): no table


def test_the_stable_rules_gain_over_T_is_paired_per_seed():
    from recurvit.tasks.dense.study import _paired

    rows = [{"stable": 0.5, "at_T": 0.2}, {"stable": 0.6, "at_T": 0.2}, {"stable": 0.9, "at_T": None}]
    assert _paired({"rows": rows}, "stable", "at_T") == "+35.0 ± 63.5"  # seeds 1, 2: +30, +40 (t = 12.71)
    assert _paired({"rows": rows[:1]}, "stable", "at_T") == "+30.0" and _paired({"rows": []}, "a", "b") == "-"


def test_the_report_says_how_the_state_and_the_path_move_past_T():
    from recurvit.tasks.dense.study import state_drift

    def run(rms_T, rms_10T, recall, precision):  # T = 2: iterations 2 and 20 of a 20-step sweep
        rms = [1.0] * 20
        rms[1], rms[19] = rms_T, rms_10T
        sw = {"state_rms": rms, "path_recall": [None] * 19 + [recall], "path_precision": [0.0] * 19 + [precision]}
        return {"steps": 2, "maze_sweeps": {"9": sw, "13": sw}}

    grows = {"cell": "conv", "rows": [run(1.0, 800.0, 0.02, 0.4), run(2.0, 4.0, 0.04, 0.2)]}
    old = {"cell": "old", "rows": [{"steps": 2, "maze_sweeps": {"9": {"solved": [0.0] * 20}}}]}
    text = "\n".join(state_drift([grows, old], [9, 13]))
    assert "| `conv` | x800; x2 | 3.0 ± 12.7 | 30.0 ± 127.1 | x800; x2 |" in text
    assert "`old`" not in text  # its sweeps stored no state (an earlier recurvit): left out, not a row of dashes
    assert state_drift([old], [9, 13]) == [] and "9: state x T→10T" in text and "13: precision @10T" in text
