"""Anytime inference: per-image exits equal fixed-depth readouts, compaction shrinks the
work, calibration reads only training images (held out from training with data.holdout), never the test
split, the exit command and the experiment script."""
import json

import pytest
import torch

import recurvit.data
from recurvit.analysis import anytime
from recurvit.run import loaders
from recurvit.cli import main
from recurvit.data.calibration import calibration_split
from recurvit.models import create_model
from recurvit.models.adaptive import CRITERIA, exit_steps, forward_adaptive, plan_steps, step_signals

TINY = dict(img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=48, num_heads=3)
BUILDERS = (loaders,)  # the modules that build data sets for an exit: the test split, the calibration one
MODELS = {  # (preset, options, max_steps): conditioning and re-injection so the step index and x0 matter
    "recurrent": ("bvit_tiny", dict(steps=3, step_cond="embed", reinject=True), 5),
    "ode_euler": ("bvit_tiny", dict(steps=3, core="ode", method="euler", step_cond="scale", reinject=True), 5),
    "ode_rk4": ("bvit_tiny", dict(steps=3, core="ode", method="rk4", time_cond=True, reinject=True), 5),
    "stack_heads": ("vit_tiny", dict(depth=4, stage_heads=4), 4),
    # SoftMoR steps too: a unit a step (inplace), or a pass whose readout reads the mixture so far (cycle)
    "softmor_inplace": ("srvit_tiny", dict(depth=4, recursions=2, layout="inplace"), 4),
    "softmor_cycle": ("srvit_tiny", dict(depth=2, recursions=4, layout="cycle", router="query"), 4),
}
_CACHE = {}


def _model(kind):
    """A perturbed tiny model (zero-initialised conditioning becomes non-trivial), a batch, and
    ``model(x, steps=k)`` for k = 1..K."""
    if kind not in _CACHE:
        torch.manual_seed(1)
        name, kw, K = MODELS[kind]
        model = create_model(name, **TINY, **kw).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
            x = torch.randn(12, 3, 16, 16)
            ref = torch.stack([model(x, steps=k) for k in range(1, K + 1)])
        _CACHE[kind] = (model, x, ref, K)
    return _CACHE[kind]


def _between(sig, step=3, q=0.5):
    """A threshold between two signal values after ``step`` (no image sits on it): about a fraction
    ``q`` of the images meets it there."""
    vals = sorted(set(v for v in sig[step - 1].tolist() if v == v and abs(v) != float("inf")))
    i = min(int(q * (len(vals) - 1)), len(vals) - 2)
    return (vals[i] + vals[i + 1]) / 2


@pytest.mark.parametrize("criterion", CRITERIA)
@pytest.mark.parametrize("kind", list(MODELS))
def test_exit_logits_equal_fixed_depth_logits(kind, criterion):
    model, x, ref, K = _model(kind)
    _, sigs = step_signals(model, x, K)
    m = 2
    thr = _between(sigs[criterion])
    logits, steps = forward_adaptive(model, x, criterion, thr, max_steps=K, min_steps=m, compact=True)
    assert steps.min() >= m and steps.max() <= K
    assert len(steps.unique()) >= 2  # images exit at different steps: the batch was compacted
    assert torch.equal(steps, exit_steps(sigs[criterion], criterion, thr, m))
    torch.testing.assert_close(logits, ref[steps - 1, torch.arange(len(x))], atol=1e-5, rtol=0)
    plain, steps_plain = forward_adaptive(model, x, criterion, thr, max_steps=K, min_steps=m, compact=False)
    assert torch.equal(steps_plain, steps)
    torch.testing.assert_close(plain, logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["recurrent", "stack_heads"])
def test_compaction_shrinks_the_work(kind):
    model, x, _, K = _model(kind)
    rows = []
    hooks = [b.register_forward_pre_hook(lambda mod, inp: rows.append(inp[0].shape[0])) for b in model.blocks]
    try:
        _, sigs = step_signals(model, x, K)
        rows.clear()
        thr = _between(sigs["entropy"])
        _, steps = forward_adaptive(model, x, "entropy", thr, max_steps=K, compact=True)
        assert sum(rows) == steps.sum().item() < len(x) * K  # one block row per image and step run
        rows.clear()
        forward_adaptive(model, x, "entropy", thr, max_steps=K, compact=False)
        assert sum(rows) == len(x) * steps.max().item()  # the whole batch until its last image exits
    finally:
        for h in hooks:
            h.remove()


def test_steps_respect_min_and_max():
    model, x, ref, K = _model("recurrent")
    _, steps = forward_adaptive(model, x, "max_prob", 0.0, max_steps=K, min_steps=2)  # everyone may exit
    assert steps.tolist() == [2] * len(x)
    logits, steps = forward_adaptive(model, x, "kl", None, max_steps=K)  # no one exits early
    assert steps.tolist() == [K] * len(x)
    torch.testing.assert_close(logits, ref[K - 1], atol=1e-5, rtol=0)
    _, steps = forward_adaptive(model, x, "kl", 1e9, max_steps=K)  # kl needs a previous step
    assert steps.tolist() == [2] * len(x)
    stack, xs, _, L = _model("stack_heads")
    assert plan_steps(stack, 10, 1) == (L, 1)  # a stack caps at its depth
    assert forward_adaptive(stack, xs, "kl", None, max_steps=10)[1].max().item() == L


def test_what_cannot_exit_is_a_value_error():
    model, x, _, _ = _model("recurrent")
    for kw, msg in [(dict(criterion="nope"), "criterion must be one of"), (dict(max_steps=0), "max_steps must be"),
                    (dict(max_steps=2, min_steps=3), "min_steps must be in")]:
        with pytest.raises(ValueError, match=msg):
            forward_adaptive(model, x, **kw)
    plain = create_model("vit_tiny", **TINY, depth=3).eval()
    with pytest.raises(ValueError, match="no readout trained after every block"):
        forward_adaptive(plain, x, "kl", 1.0)
    _, steps = forward_adaptive(plain, x, "kl", 1.0, min_steps=3)  # every block runs: allowed
    assert steps.tolist() == [3] * len(x)
    assert forward_adaptive(plain, x, "kl", 1.0, per_step_readouts=True)[1].max() <= 3
    with pytest.raises(ValueError, match="one step at a time"):
        forward_adaptive(create_model("bvit_tiny", **TINY, core="ode", method="dopri5", steps=2).eval(), x, "kl", 1.0)


def _traj(K=4, N=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (N,), generator=g)
    preds = torch.where(torch.rand(K, N, generator=g) < torch.linspace(0.4, 0.9, K)[:, None], labels,
                        (labels + 1) % 3)
    sig = torch.rand(K, N, generator=g).cumsum(0) / K  # max_prob-like: rising with the steps
    return {"preds": preds, "labels": labels, "signals": {c: sig for c in CRITERIA}}


def test_calibration_chooses_the_cheapest_threshold_within_the_target():
    traj = _traj()
    K = T = 4
    acc_T = anytime.fixed_accuracy(traj)[T - 1]
    every = [anytime.point(traj, "max_prob", t, K) for t in traj["signals"]["max_prob"].unique().tolist()]
    for drop in (0.0, 5.0, 20.0):
        got = anytime.choose(traj, "max_prob", T, K, target_drop=drop)
        ok = [p for p in every if p["accuracy"] >= acc_T - drop / 100 - 1e-12]
        assert got["calibration"]["mean_steps"] == pytest.approx(min(p["mean_steps"] for p in ok))
        assert got["calibration"]["accuracy"] >= acc_T - drop / 100 - 1e-12
    got = anytime.choose(traj, "max_prob", T, K, step_budget=0.6)
    best = max(p["accuracy"] for p in every if p["mean_steps"] <= 0.6 * T)
    assert got["met"] and got["calibration"]["mean_steps"] <= 0.6 * T
    assert got["calibration"]["accuracy"] == pytest.approx(best)


class _Sentinel(torch.utils.data.Dataset):
    """The test split, counting the images read from it."""

    def __init__(self, inner):
        self.inner, self.reads = inner, 0
        self.transform = inner.transform

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        self.reads += 1
        return self.inner[i]


def test_calibration_split_is_training_data_without_augmentation():
    from recurvit.config import DataConfig

    train, test, _ = recurvit.data.build_datasets(DataConfig(name="digits"))
    split = calibration_split(train, test)
    assert len(split) == round(0.1 * len(train)) and split.dataset.images is train.images
    assert split.indices == calibration_split(train, test).indices != calibration_split(train, test, seed=1).indices
    i = split.indices[3]
    x, y = split[3]
    assert torch.equal(x, split[3][0]) and torch.equal(x, test.transform(train.images[i]))  # no augmentation
    assert y == train[i][1]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Tiny digits runs named as in the converged study: two kinds x two seeds, and a plain stack."""
    root = tmp_path_factory.mktemp("anytime") / "runs"
    common = ["model.embed_dim=24", "train.epochs=1", "train.progress=false", "train.supervision.stages=3",
              "train.supervision.weights=uniform"]
    kinds = {"ds3": ["model.steps=3"],
             "vit_ds6_heads": ["model.name=vit_tiny", "model.depth=3", "train.supervision.per_stage_heads=true"]}
    for kind, extra in kinds.items():
        for seed in (0, 1):
            assert main(["train", *common, *extra, f"train.seed={seed}", "--out",
                         str(root / f"{kind}__seed={seed}")]) == 0
    assert main(["train", "model.name=vit_tiny", "model.depth=2", "model.embed_dim=24", "train.epochs=1",
                 "train.progress=false", "--out", str(root / "plain_vit")]) == 0
    return root


@pytest.mark.slow
def test_exit_command_writes_csv_png_and_json(tiny_runs, tmp_path, capsys):
    run = tiny_runs / "ds3__seed=0"
    capsys.readouterr()
    assert main(["exit", str(run), "--steps", "5", "--min-steps", "2", "--out", str(tmp_path), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["trained_steps"] == 3 and res["max_steps"] == 5 and res["criterion"] == "kl"
    t = res["test"]
    assert 2 <= t["mean_steps"] <= 5 and t["n"] == 360 and t["speedup"] > 0 and t["images_per_s"] > 0
    # the speed-up a claim decides on: per-batch geometric mean in its interval, the load around its timing
    assert t["speedup_lo"] <= t["speedup"] <= t["speedup_hi"] and t["cores"] >= 1 and t["threads"] >= 1
    assert t["load_before"] is not None and t["load_during"] is not None
    assert t["drop_points"] == pytest.approx(100 * (t["acc_T"] - t["accuracy"]))
    assert res["calibration"]["n"] == 144 and len(res["fixed_accuracy"]) == 5 and res["sweep"]
    lines = (tmp_path / "exit.csv").read_text().splitlines()
    assert lines[0].startswith("threshold,accuracy,mean_steps,median_steps,p90_steps,images_per_s")
    assert len(lines) == len(res["sweep"]) + 1
    assert (tmp_path / "exit.png").stat().st_size > 1000
    assert json.loads((tmp_path / "exit.json").read_text())["threshold"] == res["threshold"]
    assert main(["exit", str(run), "--criterion", "max_prob", "--step-budget", "0.6", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mean steps <= 0.6 x T" in out and "speed:" in out and "x (batch 256" in out


@pytest.mark.slow
def test_exit_calibration_never_reads_the_test_split(tiny_runs, tmp_path, monkeypatch, capsys):
    seen = {}
    real_build, real_calibrate = recurvit.data.build_datasets, anytime.calibrate

    def build(cfg, log=None, **kw):
        train, test, info = real_build(cfg, log, **kw)
        seen["test"] = _Sentinel(test)
        return train, seen["test"], info

    def calibrate(*a, **kw):
        out = real_calibrate(*a, **kw)
        seen["reads_at_calibration"] = seen["test"].reads
        return out

    for reader in BUILDERS:  # every module that builds the data sets on the exit command's way
        monkeypatch.setattr(reader, "build_datasets", build)
    monkeypatch.setattr(anytime, "calibrate", calibrate)
    assert main(["exit", str(tiny_runs / "ds3__seed=1"), "--criterion", "entropy", "--out", str(tmp_path)]) == 0
    assert seen["reads_at_calibration"] == 0 and seen["test"].reads > 0


@pytest.mark.slow
def test_exit_command_bad_input_is_one_line_and_exit_2(tiny_runs, tmp_path, capsys):
    run = str(tiny_runs / "ds3__seed=0")
    for argv in (["--criterion", "nope"], ["--target-drop", "1", "--step-budget", "0.5"]):
        with pytest.raises(SystemExit) as e:
            main(["exit", run, *argv])
        assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    for argv, msg in ((["--steps", "0"], "--steps must be >= 1"), (["--min-steps", "0"], "--min-steps"),
                      (["--step-budget", "0"], "--step-budget must be > 0"),
                      (["--step-budget", "7"], "allows every exit"),
                      (["--steps", "2", "--min-steps", "3"], "min_steps must be in")):
        assert main(["exit", run, *argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0]
    # a stack without a readout after every block: an error (an early exit would read an untrained head) ...
    plain = str(tiny_runs / "plain_vit")
    assert main(["exit", plain, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no readout trained after every block" in err[0]
    # ... unless every block runs
    assert main(["exit", plain, "--min-steps", "2", "--json", "--out", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["test"]["mean_steps"] == 2


def test_forward_adaptive_is_a_model_method():
    from recurvit import create_model

    torch.manual_seed(0)
    m = create_model("bvit_tiny", img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, num_heads=2,
                     steps=4).eval()
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        logits, steps = m.forward_adaptive(x, criterion="max_prob", threshold=0.0, max_steps=6)
        assert steps.tolist() == [1] * 5  # a threshold every image meets at once
        torch.testing.assert_close(logits, m(x, steps=1))


def test_holdout_keeps_calibration_images_out_of_training():
    from recurvit.config import DataConfig
    from recurvit.data import build_datasets
    from recurvit.data.calibration import holdout_indices, holdout_split

    full, test, _ = build_datasets(DataConfig(name="digits"))
    train, _, _ = build_datasets(DataConfig(name="digits", holdout=0.1))
    kept, held = holdout_indices(len(full), 0.1)
    assert len(train) == len(kept) == len(full) - len(held) and len(held) == round(0.1 * len(full))
    assert set(kept).isdisjoint(held) and train.indices == kept  # training never sees a held-out image
    calib = holdout_split(full, test, 0.1)
    assert calib.indices == held and calib.dataset.transform is test.transform  # no augmentation


@pytest.mark.parametrize("holdout", [0.1, 0.0])
def test_a_runs_held_out_images_are_the_ones_its_training_never_read(holdout):
    """run/loaders.held_out_sets: the held-out part of the training split (the indices training left out),
    with the test transform; without data.holdout none, or with fallback the seeded calibration split."""
    from recurvit.config import load_config
    from recurvit.data import build_datasets
    from recurvit.data.calibration import calibration_split
    from recurvit.run.loaders import held_out_sets, run_data

    cfg = load_config("src/recurvit/configs/digits/bvit.yaml", [f"data.holdout={holdout}"])
    train, test, _ = build_datasets(run_data(cfg))  # what the run trains on
    held, test2 = held_out_sets(cfg)
    fallback, _ = held_out_sets(cfg, fallback=True)
    assert torch.equal(torch.stack([x for x, _ in test2]), torch.stack([x for x, _ in test]))
    if holdout:
        assert set(held.indices).isdisjoint(train.indices) and len(held) + len(train) == len(train.dataset)
        assert held.dataset.transform is test2.transform and fallback.indices == held.indices
    else:
        assert held is None and fallback.indices == calibration_split(train, test).indices


@pytest.mark.slow
def test_a_certified_exit_is_chosen_on_the_calibration_split_alone(tiny_runs, monkeypatch):
    """calibrated_exit(certify=(epsilon, delta)): Learn-then-Test picks the threshold from the held-out
    images before the test split is read once, and the result says what was certified."""
    from recurvit.analysis import exit as exit_mod
    import recurvit

    seen = {}
    real_build, real_certify = recurvit.data.build_datasets, exit_mod.certify_exit

    def build(cfg, log=None, **kw):
        train, test, info = real_build(cfg, log, **kw)
        seen["test"] = _Sentinel(test)
        return train, seen["test"], info

    def certify(*a, **kw):
        seen["reads_at_certify"] = seen["test"].reads
        return real_certify(*a, **kw)

    for reader in BUILDERS:
        monkeypatch.setattr(reader, "build_datasets", build)
    monkeypatch.setattr(exit_mod, "certify_exit", certify)
    loaded = recurvit.load(tiny_runs / "ds3__seed=0" / "last.pt")
    model, cfg = loaded.model, loaded.config
    res = exit_mod.calibrated_exit(model, cfg, torch.device("cpu"), "max_prob", certify=(0.2, 0.1), time_batches=1)
    assert seen["reads_at_certify"] == 0 and seen["test"].reads > 0
    cert = res["certify"]
    assert cert["epsilon"] == 0.2 and cert["delta"] == 0.1 and cert["n"] == res["calibration"]["n"]
    assert res["threshold"] == cert["threshold"] and res["met"] == cert["certified"]
    assert cert["risk"] <= 0.2 and 1 <= res["test"]["mean_steps"] <= res["max_steps"]
