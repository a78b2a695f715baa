"""Training end to end on digits: learning, resume equivalence, checkpoints, regimes."""
import json

import pytest
import torch

import recurvit
from recurvit.config import load_config
from recurvit.errors import UserError
from recurvit.run import checkpoint as ckpt_io
from recurvit.run.atomic import save_atomic
from recurvit.tasks.classify.task import train
from recurvit.train.losses import DepthSampler, readout_steps, stage_weights
from recurvit.config import DepthConfig

FAST = ["model.embed_dim=48", "model.steps=4", "train.batch_size=128", "train.progress=false"]


def _cfg(*overrides):
    return load_config("configs/digits/bvit.yaml", FAST + list(overrides))


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_digits_run_learns_and_writes_its_run_directory(tmp_path):
    m = train(_cfg("train.epochs=6", "train.lr=2e-3"), tmp_path / "run", log=lambda *a: None)
    assert m["test_acc"] > 0.6  # chance is 0.1
    run = tmp_path / "run"
    assert {"config.yaml", "metrics.jsonl", "last.pt"} <= {p.name for p in run.iterdir()}
    assert not (run / "best.pt").exists()  # no validation split: nothing to choose a best epoch on
    rows = _metrics(run)
    assert [r["epoch"] for r in rows] == list(range(1, 7))
    assert {"epoch", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "img_per_s", "seconds"} <= set(rows[-1])
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    model = recurvit.load_model(run)
    assert model.cfg.img_size == 8 and model.cfg.in_chans == 1 and model.cfg.num_classes == 10


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(tmp_path):
    cfg = _cfg("train.epochs=4")
    full = train(cfg, tmp_path / "full", log=lambda *a: None)
    train(cfg, tmp_path / "part", log=lambda *a: None, stop_after=2)
    assert len(_metrics(tmp_path / "part")) == 2
    resumed = train(load_config(tmp_path / "part" / "config.yaml"), tmp_path / "part", resume=True, log=lambda *a: None)
    for key in ("train_loss", "train_acc", "test_loss", "test_acc"):
        assert resumed[key] == pytest.approx(full[key], abs=1e-6), key
    a = torch.load(tmp_path / "full" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "part" / "last.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)


def test_existing_run_directory_is_never_overwritten(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "precious.txt").write_text("keep me")
    with pytest.raises(UserError, match="already exists"):
        train(_cfg("train.epochs=1"), run, log=lambda *a: None)
    assert (run / "precious.txt").read_text() == "keep me"


@pytest.mark.slow
def test_checkpoint_errors_are_user_errors(tmp_path):
    train(_cfg("train.epochs=1"), tmp_path / "run", log=lambda *a: None)
    last = (tmp_path / "run" / "last.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(last[: len(last) // 2])
    with pytest.raises(UserError, match="corrupt, truncated"):
        recurvit.load_model(tmp_path / "trunc.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(UserError, match="not a recurvit checkpoint"):
        recurvit.load_model(tmp_path / "foreign.pt")
    ck = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    ck["config"]["model"]["embed_dim"] = 24  # the weights no longer fit the config
    torch.save(ck, tmp_path / "mismatch.pt")
    with pytest.raises(UserError, match="does not match"):
        recurvit.load_model(tmp_path / "mismatch.pt")


def test_atomic_save_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "x.pt"
    save_atomic({"a": 1}, path)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        save_atomic({"a": Boom()}, path)
    assert torch.load(path, weights_only=True) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.pt"]  # no temp file left behind


def test_readouts_and_weights():
    assert readout_steps(12, 4) == [3, 6, 9, 12]
    assert readout_steps(6, 1) == [6]
    assert readout_steps(2, 4) == [1, 2]
    assert stage_weights("uniform", 4).tolist() == [0.25] * 4
    torch.testing.assert_close(stage_weights("linear", 4), torch.tensor([0.1, 0.2, 0.3, 0.4]))
    assert stage_weights("last", 3).tolist() == [0.0, 0.0, 1.0]


def test_depth_sampler_schedules():
    g = torch.Generator().manual_seed(0)
    uni = DepthSampler(DepthConfig(schedule="uniform", min_steps=2, max_steps=9), 6, g)
    ks = [uni() for _ in range(500)]
    assert min(ks) == 2 and max(ks) == 9
    pln = DepthSampler(DepthConfig(schedule="poisson_lognormal", sigma=0.5), 6, g)
    ks = torch.tensor([pln() for _ in range(4000)], dtype=torch.float)
    assert ks.min() >= 1 and abs(ks.mean().item() - 6) < 0.5
    capped = DepthSampler(DepthConfig(schedule="uniform"), 6, g, cap=6)
    assert max(capped() for _ in range(200)) == 6


# --------------------------------------------- deep supervision and random depth through the loop
def _epoch_with_spy(*overrides, batches=3):
    """One train_one_epoch on a few digits batches, recording every forward the loop makes."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from recurvit.tasks.classify.task import train_one_epoch
    from recurvit.train.optim import build_optimizer, build_scheduler

    cfg = _cfg("model.img_size=8", "model.in_chans=1", "model.num_classes=10", "train.weight_decay=0",
               *overrides)
    torch.manual_seed(0)
    model = ckpt_io.build_model_from_config(cfg)
    x, y = torch.randn(batches * 16, 1, 8, 8), torch.randint(0, 10, (batches * 16,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    sched = build_scheduler(opt, cfg.train, len(loader))
    calls = []

    def spy(xb, steps=None, at=None, grad_last=None):
        out = model.forward_steps(xb, steps=steps, at=at, grad_last=grad_last)
        calls.append({"steps": steps, "at": at, "grad_last": grad_last, "nfe": model.nfe, "logits": out.detach()})
        return out

    depth = DepthSampler(cfg.train.depth, model.nominal_steps, cap=model.core.limit)
    m = train_one_epoch(model, loader, opt, sched, torch.device("cpu"), cfg, depth, forward=spy)
    for c, (_, yb) in zip(calls, DataLoader(TensorDataset(x, y), batch_size=16)):
        c["ce"] = [F.cross_entropy(lg, yb).item() for lg in c["logits"]]
    return model, calls, m


def test_deep_supervision_reads_out_every_stage_and_weighs_them():
    _, calls, m = _epoch_with_spy("train.supervision.stages=2", "train.supervision.weights=linear")
    assert all(c["at"] == [2, 4] for c in calls)  # T = 4, two stages: readouts after steps 2 and 4
    # the loss is the weighted sum over the stages (linear: 1/3, 2/3), not the last readout alone
    expect = sum(c["ce"][0] / 3 + 2 * c["ce"][1] / 3 for c in calls) / len(calls)
    assert m["train_loss"] == pytest.approx(expect, rel=1e-5)
    last_only = sum(c["ce"][1] for c in calls) / len(calls)
    assert m["train_loss"] != pytest.approx(last_only, rel=1e-5)
    assert len(m["train_stage_losses"]) == 2


def test_per_stage_heads_each_get_their_stage_gradient():
    model, calls, _ = _epoch_with_spy("train.supervision.stages=4", "train.supervision.weights=uniform",
                                      "train.supervision.per_stage_heads=true", "model.stage_heads=4", batches=1)
    assert calls[0]["at"] == [1, 2, 3, 4] and len(model.stage_heads) == 3
    for head in [*model.stage_heads, model.head]:  # a stage the loss ignored would leave its head without
        assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0
    model, _, _ = _epoch_with_spy("train.supervision.stages=4", "train.supervision.weights=last",
                                  "train.supervision.per_stage_heads=true", "model.stage_heads=4", batches=1)
    assert all(h.weight.grad.abs().sum() == 0 for h in model.stage_heads)  # weights=last: only the last counts


def test_random_depth_runs_the_sampled_depth_and_truncates_backprop():
    torch.manual_seed(1)
    _, calls, _ = _epoch_with_spy("train.depth.schedule=uniform", "train.depth.min_steps=1",
                                  "train.depth.max_steps=7", "train.depth.truncate=2", batches=8)
    steps = [c["steps"] for c in calls]
    assert len(set(steps)) > 1 and all(1 <= k <= 7 for k in steps)  # a depth sampled per batch
    assert all(c["nfe"] == c["steps"] and c["at"] == [c["steps"]] for c in calls)  # ...and actually run
    assert all(c["grad_last"] == 2 for c in calls)


def test_truncation_changes_the_gradient_of_the_shared_block():
    grads = []
    for trunc in (0, 1):
        model, _, _ = _epoch_with_spy(f"train.depth.truncate={trunc}", batches=1)
        grads.append(model.blocks[0].mlp.fc1.weight.grad.clone())
    assert not torch.allclose(grads[0], grads[1])  # only the last step's graph: another gradient


class _Scrambled(torch.utils.data.Dataset):
    """A split whose labels are shifted by one: accuracy on it is a different, wrong number."""

    def __init__(self, inner):
        self.inner, self.transform = inner, inner.transform

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        x, y = self.inner[i]
        return x, (y + 1) % 10


@pytest.mark.slow
def test_best_pt_is_chosen_on_the_validation_split_never_on_the_test_split(tmp_path, monkeypatch):
    import recurvit.tasks.classify.task as loop

    cfg = _cfg("train.epochs=5", "data.holdout=0.2")
    train(cfg, tmp_path / "plain", log=lambda *a: None)
    real = loop.build_loaders

    def scrambled_test(cfg, **kw):
        tr, te, info = real(cfg, **kw)
        return tr, torch.utils.data.DataLoader(_Scrambled(te.dataset), batch_size=te.batch_size), info

    monkeypatch.setattr(loop, "build_loaders", scrambled_test)
    train(cfg, tmp_path / "scrambled", log=lambda *a: None)
    plain, scrambled = _metrics(tmp_path / "plain"), _metrics(tmp_path / "scrambled")
    assert [r["val_acc"] for r in plain] == [r["val_acc"] for r in scrambled]  # the same training
    assert [r["test_acc"] for r in plain] != [r["test_acc"] for r in scrambled]  # a different test split
    vals = [r["val_acc"] for r in plain]
    for run in ("plain", "scrambled"):  # the same best epoch, the first with the highest validation accuracy
        best = torch.load(tmp_path / run / "best.pt", weights_only=True)
        assert best["epoch"] == vals.index(max(vals)) + 1 and best["val_acc"] == max(vals)


@pytest.mark.slow
def test_eval_of_a_run_without_validation_reads_its_last_epoch(tmp_path, capsys):
    from recurvit.cli import main

    m = train(_cfg("train.epochs=2"), tmp_path / "run", log=lambda *a: None)
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(m["test_acc"])


def test_the_header_names_resolution_and_tokens_and_an_upscaling(tmp_path):
    lines = []
    train(_cfg("train.epochs=1"), tmp_path / "native", log=lines.append)
    assert "8x8 px, 4 tokens an image" in lines[0] and not any("upscaled" in ln for ln in lines)
    lines.clear()
    train(_cfg("train.epochs=1", "data.img_size=32"), tmp_path / "up", log=lines.append)
    assert "32x32 px, 64 tokens an image" in lines[0]
    assert "digits's 8 px images are upscaled 4x to 32 px" in lines[0]
