"""recurvit.study.claims: claims declared in a study file, decided by their rule from a study's rows,
with a label the study lacks an error and the rule's history read from git."""
import subprocess
from pathlib import Path

import pytest
import yaml

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.errors import UserError
from recurvit.study import rules
from recurvit.study.claims import decide_all
from recurvit.study.findings import claim_cells, seeds_per_cell
from recurvit.study.history import rule_came
from recurvit.study.spec import load_study
from recurvit.study.stats import welch


def study_file(folder: Path, claims: dict, grid=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text("model: {name: bvit_tiny}\n")
    doc = {"name": "tiny", "base": "base.yaml", "results": "results",
           "grid": grid or {"regime": {"naive": {}, "ds3": {}, "vit": {}}, "train.seed": [0, 1, 2]},
           "claims": claims}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def claim(rule="superiority", **kw):
    return {"source": "Crossroads", "words": "w", "rule": rule, **kw}


def rows_of(acc: dict, key="acc_T", axis="regime", spread=(0.0, 0.01, -0.012)):
    return [{"run_id": f"{g}__seed={s}", axis: g, "train.seed": str(s), key: a + spread[s], "chance": 0.1}
            for g, a in acc.items() for s in range(3)]


def test_a_label_or_axis_the_study_lacks_is_an_error_at_load(tmp_path):
    with pytest.raises(UserError, match="axis 'regime' has no label 'ds2'"):
        load_study(study_file(tmp_path / "a", {"c": claim(a={"regime": "ds2"}, b={"regime": "naive"})}))
    with pytest.raises(UserError, match="no axis 'regim'"):
        load_study(study_file(tmp_path / "b", {"c": claim(a={"regim": "ds3"}, b={"regime": "naive"})}))
    with pytest.raises(UserError, match="label 'x'"):  # a label inside a list of labels
        load_study(study_file(tmp_path / "c", {"c": claim(a={"regime": ["ds3", "x"]})}))
    with pytest.raises(UserError, match="unknown key"):
        load_study(study_file(tmp_path / "d", {"c": claim(a={"regime": "ds3"}, margn=0.1)}))
    with pytest.raises(UserError, match="names part 'nope'"):
        load_study(study_file(tmp_path / "e", {"c": claim("all_of", parts=["nope"])}))
    ok = load_study(study_file(tmp_path / "f", {"c": claim(a={"regime": "ds3"}, b={"regime": "naive"})}))
    assert [c.id for c in ok.claims] == ["c"]


def test_the_cells_a_trend_claim_reads_are_every_x_on_both_sides(tmp_path):
    grid = {"width": {"w1": {}, "w2": {}}, "model": {"b": {}, "v": {}}, "train.seed": [0, 1, 2]}
    trend = claim("trend", axis="width", x={"w1": 1, "w2": 2}, a={"model": "v"}, b={"model": "b"}, paired=True)
    (c,) = load_study(study_file(tmp_path, {"t": trend}, grid=grid)).claims
    assert claim_cells(c) == [{"width": "w1", "model": "v"}, {"width": "w1", "model": "b"},
                              {"width": "w2", "model": "v"}, {"width": "w2", "model": "b"}]
    runs = [{"width": w, "model": m, "train.seed": s, "acc_T": 0.5} for w in ("w1", "w2") for m in "bv" for s in (0, 1)]
    runs.append({"width": "w2", "model": "b", "train.seed": 2, "acc_T": None})  # a run without the figure
    assert seeds_per_cell(c, runs) == 2


def test_each_rule_kind_decides_from_the_rows(tmp_path):
    claims = {
        "sup": claim(a={"regime": "vit"}, b={"regime": "naive"}),
        "eq": claim("equivalence", margin=0.01, a={"regime": "ds3"}, b={"regime": "naive"}),
        "eq_fails": claim("equivalence", margin=0.01, a={"regime": "vit"}, b={"regime": "naive"}),
        "chance": claim("near_chance", margin=0.05, a={"regime": "naive"}, figure="acc_16T"),
        "het": claim("heterogeneity", margin=0.01, groups={"n": {"regime": "naive"}, "v": {"regime": "vit"}}),
        "both": claim("all_of", parts=["sup", "eq_fails"], qualified={"when": ["sup"], "verdict": "partly"}),
    }
    study = load_study(study_file(tmp_path, claims))
    rows = rows_of({"naive": 0.80, "ds3": 0.801, "vit": 0.85}, spread=(0.0, 0.002, -0.002))
    for r in rows:
        r["acc_16T"] = 0.10 + (0.005 if r["train.seed"] == "1" else 0.0)
    d = decide_all(study.claims, rows)
    w = welch([r["acc_T"] for r in rows if r["regime"] == "vit"], [r["acc_T"] for r in rows if r["regime"] == "naive"])
    assert d["sup"].verdict == rules.REPRODUCED and d["sup"].estimate == pytest.approx(w["diff"])
    assert (d["sup"].lo, d["sup"].hi) == pytest.approx((w["lo"], w["hi"]))
    assert d["eq"].verdict == rules.REPRODUCED  # 0.1 points apart, the same seed spread: within ±1 point
    assert d["eq_fails"].verdict == rules.NOT_REPRODUCED  # 5 points apart: outside the margin
    assert d["chance"].verdict == rules.REPRODUCED
    assert d["het"].verdict == rules.REPRODUCED
    assert d["both"].verdict == "partly"  # not all parts hold, but the qualifying one does


def test_a_qualified_verdict_needs_the_other_parts_decided(tmp_path):
    """'Euler-specific' (qualified) says the other parts failed: not while one is unmeasured or open."""
    claims = {
        "sup": claim(a={"regime": "vit"}, b={"regime": "naive"}),
        "open": claim(a={"regime": "ds3"}, b={"regime": "naive"}),  # +0.1 points in a 0.4-point spread
        "unmeasured": claim(a={"regime": "ds3"}, b={"regime": "naive"}, figure="acc_64T"),
        "q_open": claim("all_of", parts=["sup", "open"], qualified={"when": ["sup"], "verdict": "partly"}),
        "q_unmeasured": claim("all_of", parts=["sup", "unmeasured"], qualified={"when": ["sup"], "verdict": "partly"}),
    }
    study = load_study(study_file(tmp_path, claims))
    d = decide_all(study.claims, rows_of({"naive": 0.80, "ds3": 0.801, "vit": 0.85}, spread=(0.0, 0.004, -0.004)))
    assert d["sup"].verdict == rules.REPRODUCED and d["open"].verdict == rules.NOT_SEPARABLE
    assert d["unmeasured"].verdict == rules.NOT_MEASURED
    assert d["q_open"].verdict == rules.NOT_SEPARABLE
    assert d["q_unmeasured"].verdict == rules.NOT_MEASURED


def test_per_run_figures_list_labels_and_paired_trends(tmp_path):
    grid = {"solver": {"euler": {}, "rk4": {}, "heun3": {}}, "train.seed": [0, 1, 2]}
    claims = {
        # each run's mean over the OTHER solvers' evaluations, less its own accuracy
        "switch": claim(side=-1, a={"solver": ["rk4", "heun3"]},
                        figure={"mean_of": ["variant_eval_euler", "variant_eval_rk4", "variant_eval_heun3"],
                                "minus": "acc_T", "skip_own": "solver"}),
        "refine": claim("equivalence", margin=0.01, a={"solver": "euler"}, figure="variant_refine - acc_T"),
    }
    study = load_study(study_file(tmp_path / "s", claims, grid))
    rows = []
    for s in range(3):
        for solver, own in (("euler", 0.80), ("rk4", 0.82), ("heun3", 0.81)):
            evals = {f"variant_eval_{m}": own - 0.02 - 0.001 * s for m in ("euler", "rk4", "heun3")}
            evals[f"variant_eval_{solver}"] = own  # its own solver: skipped
            rows.append({"solver": solver, "train.seed": str(s), "acc_T": own, "variant_refine": own + 0.001 * s,
                         **evals})
    d = decide_all(study.claims, rows)
    assert d["switch"].n[0] == 6 and d["switch"].estimate == pytest.approx(-0.021)
    assert d["switch"].verdict == rules.REPRODUCED
    # a pooled cell decides only once each of its labels has runs: heun3 missing is not "rk4 and heun3"
    for less in ([r for r in rows if r["solver"] != "heun3"], [r for r in rows if r["solver"] != "heun3"
                                                                or r["train.seed"] == "0"]):
        got = decide_all(study.claims, less)["switch"]
        assert got.verdict == rules.NOT_MEASURED and got.note.endswith("solver = heun3"), got
    assert decide_all(study.claims, [r for r in rows if r["train.seed"] != "2"])["switch"].n[0] == 4
    assert d["refine"].verdict == rules.REPRODUCED and d["refine"].estimate == pytest.approx(0.001)

    grid = {"width": {"w32": {}, "w64": {}, "w128": {}}, "model": {"vit": {}, "bvit": {}}, "train.seed": [0, 1, 2]}
    trend = {"gap": claim("trend", side=-1, axis="width", x={"w32": 32, "w64": 64, "w128": 128}, log2=True,
                          paired=True, a={"model": "vit"}, b={"model": "bvit"})}
    study = load_study(study_file(tmp_path / "w", trend, grid))
    rows = []
    for s in range(3):
        for w, gap in (("w32", 0.04), ("w64", 0.03), ("w128", 0.02)):
            rows += [{"width": w, "model": "vit", "train.seed": str(s), "acc_T": 0.8 + 0.01 * s},
                     {"width": w, "model": "bvit", "train.seed": str(s), "acc_T": 0.8 + 0.01 * s - gap - 0.001 * s}]
    d = decide_all(study.claims, rows)["gap"]
    assert d.estimate == pytest.approx(-0.01) and d.n[0] == 9  # one point less gap per doubling
    assert d.verdict == rules.REPRODUCED


def test_a_reference_that_did_not_train_tests_nothing(tmp_path):
    grid = {"variant": {"shared": {}, "unshared": {}}, "train.seed": [0, 1, 2]}
    c = {"c": claim("noninferiority", margin=1.0, scale=1.0, unit="dB", figure="psnr", a={"variant": "shared"},
                    b={"variant": "unshared"}, reference_baseline={"column": "baseline_psnr", "margin": 1.0})}
    study = load_study(study_file(tmp_path, c, grid))
    rows = [{"variant": v, "train.seed": str(s), "psnr": p + 0.1 * s, "baseline_psnr": 9.7}
            for v, p in (("shared", 20.0), ("unshared", 10.0)) for s in range(3)]
    assert decide_all(study.claims, rows)["c"].verdict.startswith("not tested")
    for r in rows:
        r["psnr"] += 10 * (r["variant"] == "unshared")  # now the reference trained
    assert decide_all(study.claims, rows)["c"].verdict == rules.REPRODUCED


def git(root: Path, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_history_says_whether_a_rule_came_before_its_results(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@t")
    git(tmp_path, "config", "user.name", "t")
    first = {"early": claim(a={"regime": "vit"}, b={"regime": "naive"})}
    path = study_file(tmp_path, first)
    results = tmp_path / "results" / "results.csv"
    assert rule_came(tmp_path, path, "early", results) == "no results yet"
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "the rule")
    results.parent.mkdir()
    results.write_text("run_id\n")
    assert rule_came(tmp_path, path, "early", results) == "before"  # results not committed yet
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "the results")
    assert rule_came(tmp_path, path, "early", results) == "before"
    later = {**first, "late": claim(a={"regime": "ds3"}, b={"regime": "naive"})}
    study_file(tmp_path, later)
    assert rule_came(tmp_path, path, "late", results) == "after"  # in the work tree only
    git(tmp_path, "commit", "-qam", "a rule written after its results")
    assert rule_came(tmp_path, path, "late", results) == "after"
    assert rule_came(tmp_path, path, "early", results) == "before"  # other claims of the file unchanged
    reworded = {**later, "early": {**first["early"], "data": "Fashion-MNIST, 30 epochs", "label": "ViT − naive",
                                   "scale": 1, "unit": "iterations"}}
    study_file(tmp_path, reworded)
    git(tmp_path, "commit", "-qam", "the early row's description of its data and figure reworded, its unit too")
    assert rule_came(tmp_path, path, "early", results) == "before"  # presentation only: the rule is unchanged
    changed = {**later, "early": claim(a={"regime": "vit"}, b={"regime": "naive"}, side=-1)}
    study_file(tmp_path, changed)
    git(tmp_path, "commit", "-qam", "the early rule changed after its results")
    assert rule_came(tmp_path, path, "early", results) == "after"
    # a figure added to the results later (a new evaluator's column): its results begin with that commit
    newer = {**changed, "steps": claim(a={"regime": "naive"}, figure="skip_drop_T")}
    study_file(tmp_path, newer)
    git(tmp_path, "commit", "-qam", "a rule on a figure the results do not hold yet")
    assert rule_came(tmp_path, path, "steps", results, ["skip_drop_T"]) == "before"  # no such column yet
    assert rule_came(tmp_path, path, "steps", results) == "after"  # against the file's first commit
    results.write_text("run_id,skip_drop_T\n")
    git(tmp_path, "commit", "-qam", "the figure's results")
    assert rule_came(tmp_path, path, "steps", results, ["skip_drop_T"]) == "before"
    written_with = {**newer, "steps2": claim(a={"regime": "naive"}, figure="skip_drop_T")}
    study_file(tmp_path, written_with)
    git(tmp_path, "commit", "-qam", "a rule on that figure, after its results")
    assert rule_came(tmp_path, path, "steps2", results, ["skip_drop_T"]) == "after"



def test_history_outside_a_repository_is_unknown(tmp_path):
    path = study_file(tmp_path, {"c": claim(a={"regime": "vit"}, b={"regime": "naive"})})
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "results.csv").write_text("run_id\n")
    assert rule_came(tmp_path, path, "c", tmp_path / "results" / "results.csv") == "unknown"


def test_a_rule_met_only_at_the_floor_holds_vacuously(tmp_path):
    """Both cells solve nothing: "within 5 points" and "no drop" are met whatever the models do, so the
    verdict is "holds vacuously", never "reproduced"; off the floor the same rule reproduces."""
    claims = {
        "close": claim("noninferiority", margin=0.05, figure="solved", a={"regime": "vit"}, b={"regime": "naive"},
                       floor={"solved": 0}),
        "no_drop": claim("noninferiority", margin=0.01, figure="solved_10T - best", a={"regime": "vit"},
                         floor={"solved_10T": 0, "best": 0}),
    }
    study = load_study(study_file(tmp_path, claims))
    nothing = [{"regime": g, "train.seed": str(s), "solved": 0.0, "solved_10T": 0.0, "best": 0.0}
               for g in ("naive", "vit") for s in range(3)]
    d = decide_all(study.claims, nothing)
    assert d["close"].verdict == d["no_drop"].verdict == rules.HOLDS_VACUOUSLY
    assert d["close"].note.endswith("every run at the floor: solved = 0")
    learned = [{**r, "solved": 0.9, "solved_10T": 0.9, "best": 0.9} for r in nothing]
    d = decide_all(study.claims, learned)
    assert d["close"].verdict == d["no_drop"].verdict == rules.REPRODUCED
    one_off = [dict(r) for r in nothing]
    one_off[0]["solved"] = 0.01  # one naive run solved something: no longer at the floor, and within 5 points
    assert decide_all(study.claims, one_off)["close"].verdict == rules.REPRODUCED


def test_one_comparison_at_several_sizes_is_one_claim_decided_per_size(tmp_path):
    sized = claim("noninferiority", margin=0.05, sizes=[9, 17], figure="solved_{size}_10T", a={"regime": "vit"},
                  b={"regime": "naive"}, floor={"solved_{size}_10T": 0}, label="vit - naive")
    study = load_study(study_file(tmp_path, {"close": sized}))
    (c,) = study.claims
    from recurvit.study.claims import claim_columns
    assert claim_columns(c) == ["solved_9_10T", "solved_17_10T"]
    runs = [{"regime": g, "train.seed": str(s), "solved_9_10T": 0.9 + 0.01 * s, "solved_17_10T": 0.0}
            for g in ("naive", "vit") for s in range(3)]
    d = decide_all(study.claims, runs)["close"]
    assert [(name, p.verdict) for name, p in d.parts] == [("9x9", rules.REPRODUCED), ("17x17", rules.HOLDS_VACUOUSLY)]
    assert d.verdict == "holds, vacuously at some sizes"  # not a reproduction: one size holds only at the floor
    for r in runs:
        r["solved_9_10T"] = 0.0
    assert decide_all(study.claims, runs)["close"].verdict == rules.HOLDS_VACUOUSLY
    for r in runs:
        r["solved_17_10T"] = 0.5 if r["regime"] == "naive" else 0.1  # 40 points behind at 17x17
    assert decide_all(study.claims, runs)["close"].verdict == rules.NOT_REPRODUCED
    with pytest.raises(UserError, match="{size}"):
        load_study(study_file(tmp_path / "bad", {"c": {**sized, "figure": "solved_9_10T"}}))


def stopping_rows(cell, seed, iters, solved, cap=120):
    from recurvit.tasks.dense.evaluators import slope

    sizes = [9, 13, 17, 21, 25]
    row = {"cell": cell, "train.seed": str(seed), "max_iters": cap,
           "rule_stable_iters_slope": slope(sizes, iters)}
    for s, i, v in zip(sizes, iters, solved):
        row[f"rule_stable_iters_{s}"], row[f"rule_stable_solved_{s}"] = i, v
    return row


def test_a_stopping_rule_counts_iterations_only_where_it_solved_and_against_a_control(tmp_path):
    """Iterations that grow only by never settling (nothing solved, the cap) hold vacuously; growth where
    mazes were solved, steeper than a control that solves nothing, is reproduced."""
    grid = {"cell": {"vit": {}, "naive": {}}, "train.seed": [0, 1, 2]}
    stop = claim("stopping", figure="rule_stable_iters_slope", iters="rule_stable_iters_{size}",
                 solved="rule_stable_solved_{size}", cap="max_iters", a={"cell": "vit"}, control={"cell": "naive"},
                 scale=1, unit="iterations")
    study = load_study(study_file(tmp_path, {"stop": stop}, grid))
    never = [stopping_rows("naive", s, [70 + s, 100, 115, 120, 120], [0, 0, 0, 0, 0]) for s in range(3)]
    # the ViT solves 1 maze of 200 at 9x9 and nothing larger: its iterations climb to the cap all the same
    only_9 = [stopping_rows("vit", s, [40 + 5 * s, 80, 110, 119, 120], [0.005, 0, 0, 0, 0]) for s in range(3)]
    d = decide_all(study.claims, never + only_9)["stop"]
    assert d.verdict == rules.HOLDS_VACUOUSLY and dict(d.parts)["every size"].verdict == rules.REPRODUCED
    assert "seed 0: 9x9 only" in d.note
    # solved at 9x9 to 17x17, iterations rising there, far steeper than the control: thinking longer
    thinks = [stopping_rows("vit", s, [12 + s, 35, 65, 119, 120], [0.99, 0.5, 0.1 + 0.01 * s, 0, 0])
              for s in range(3)]
    d = decide_all(study.claims, never + thinks)["stop"]
    assert d.verdict == rules.REPRODUCED, d
    assert dict(d.parts)["where solved"].estimate > 0 and "seed 1: 9x9 to 17x17" in d.note
    assert "the control: naive, it solves nothing at any size" in dict(d.parts)["above the control"].note
    # the same growth where solved, but no steeper over every size than the control: not separated from it
    flat = [stopping_rows("vit", s, [12 + s, 35, 65, 119, 120], [0.99, 0.5, 0.1, 0, 0]) for s in range(3)]
    steep = [stopping_rows("naive", s, [5 + 3 * s, 40, 90, 120, 120], [0, 0, 0, 0, 0]) for s in range(3)]
    assert decide_all(study.claims, steep + flat)["stop"].verdict == rules.NOT_SEPARABLE
    with pytest.raises(UserError, match="`control` belongs to a stopping claim"):
        load_study(study_file(tmp_path / "bad", {"c": claim(a={"cell": "vit"}, control={"cell": "naive"})}, grid))
