"""train.tensorboard=true: event files in RUN/tb hold the numbers of metrics.jsonl (train, finetune, vae)."""
import json
import sys

import pytest

pytest.importorskip("tensorboard")

from recurvit.cli import main  # noqa: E402
from recurvit.config import load_config  # noqa: E402
from recurvit.errors import UserError  # noqa: E402
from recurvit.tasks.classify.task import train  # noqa: E402
from recurvit.train.tensorboard import read_scalars, scalars, tag  # noqa: E402

FAST = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false",
        "train.tensorboard=true"]


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _check_events_equal_metrics(run):
    """Every numeric entry of every metrics line is one event at step = epoch, with the same value."""
    events = read_scalars(run)
    rows = _metrics(run)
    expect = {}
    for row in rows:
        for name, value in scalars(row).items():
            expect.setdefault(name, []).append((row["epoch"], value))
    assert set(events) == set(expect)
    for name, pairs in expect.items():
        got = events[name]
        assert [s for s, _ in got] == [s for s, _ in pairs], name  # each epoch once, in order
        assert [v for _, v in got] == pytest.approx([v for _, v in pairs], rel=1e-6, abs=1e-7), name  # float32
    return events, rows


def test_tags():
    assert tag("train_loss") == "train/loss" and tag("test_acc") == "test/acc" and tag("test_psnr") == "test/psnr"
    assert tag("lr") == "train/lr" and tag("img_per_s") == "train/img_per_s" and tag("seconds") == "time/epoch_seconds"
    assert scalars({"epoch": 3, "train_stage_losses": [1.0, 0.5], "flag": True, "name": "x"}) == {
        "train/stage_losses/1": 1.0, "train/stage_losses/2": 0.5}


@pytest.mark.slow
def test_train_events_equal_metrics_and_continue_on_resume(tmp_path):
    """Deep supervision (per-stage losses), stopped after epoch 2, a stale event of a killed epoch 3,
    resumed to 4 epochs: TensorBoard shows epochs 1..4 once each, equal to metrics.jsonl."""
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    overrides = FAST + ["train.epochs=4", "train.supervision.stages=2", "train.supervision.weights=linear"]
    train(load_config("configs/digits/bvit.yaml", overrides), run, log=lambda *a: None, stop_after=2)
    with SummaryWriter(str(run / "tb")) as w:  # what a run killed after logging epoch 3 leaves behind
        w.add_scalar("train/loss", 999.0, 3)
    train(load_config(run / "config.yaml"), run, resume=True, log=lambda *a: None)
    events, rows = _check_events_equal_metrics(run)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert {"train/loss", "train/acc", "test/acc", "test/loss", "train/lr", "train/img_per_s",
            "train/stage_losses/1", "train/stage_losses/2"} <= set(events)
    for r in rows:  # the loss is the weighted sum of the readouts' losses (linear weights 1/3, 2/3)
        s1, s2 = r["train_stage_losses"]
        assert r["train_loss"] == pytest.approx(s1 / 3 + 2 * s2 / 3, rel=1e-5)
    assert 999.0 not in [v for _, v in events["train/loss"]]

    # fine-tuning writes its own events the same way
    ft = tmp_path / "ft"
    assert main(["finetune", str(run), "--data", "digits", "--method", "head", "train.epochs=2",
                 "train.progress=false", "train.tensorboard=true", "--out", str(ft), "--json"]) == 0
    events, rows = _check_events_equal_metrics(ft)
    assert len(rows) == 2 and "test/acc" in events


def test_vae_events_hold_psnr_and_ssim(tmp_path):
    from recurvit.tasks.vae.config import load_vae_config
    from recurvit.tasks.vae.task import train_vae

    tiny = ["data.img_size=16", "data.train_crops=32", "data.max_test=16", "model.embed_dim=8", "model.groups=4",
            "model.depth=1", "model.z_channels=2", "train.batch_size=16", "train.progress=false", "train.threads=1",
            "train.epochs=2", "train.tensorboard=true"]
    train_vae(load_vae_config(None, tiny), tmp_path / "vae", log=lambda *a: None)
    events, rows = _check_events_equal_metrics(tmp_path / "vae")
    assert {"test/psnr", "test/ssim", "train/loss", "train/lr", "train/img_per_s"} <= set(events)


def test_without_tensorboard_one_line_and_no_run_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were missing
    with pytest.raises(UserError, match=r'pip install -e "\.\[tb\]"'):
        train(load_config("configs/digits/bvit.yaml", FAST), tmp_path / "run", log=lambda *a: None)
    assert not (tmp_path / "run").exists()
    assert main(["vae", "train", "train.tensorboard=true", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert 'pip install -e ".[tb]"' in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "v").exists()


# --------------------------------------------------------------------------------------- DDP
DDP_SMALL = ["model.name=bvit_tiny", "model.embed_dim=24", "model.num_heads=2", "model.steps=2", "model.patch_size=4",
             "data.name=synthetic", "data.synthetic_train=64", "data.synthetic_test=32", "data.synthetic_size=16",
             "data.synthetic_classes=5", "train.batch_size=32", "train.progress=false", "train.device=cpu",
             "train.epochs=2", "train.supervision.stages=2", "train.tensorboard=true"]


def _ddp_worker(rank, world, port, out):
    from tests.conftest import gloo_group

    with gloo_group(rank, world, port):
        train(load_config(None, DDP_SMALL), out, log=lambda *a: None)


@pytest.mark.slow
def test_ddp_rank0_writes_the_events_with_global_stage_losses(tmp_path):
    """Two gloo processes: one event file (rank 0's), per-stage losses all-reduced (= one process's)."""
    import socket

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(None, DDP_SMALL), tmp_path / "single", log=lambda *a: None)
    finally:
        torch.set_num_threads(n)
    mp.spawn(_ddp_worker, args=(2, port, str(tmp_path / "ddp")), nprocs=2, join=True)
    assert len(list((tmp_path / "ddp" / "tb").glob("events.out.tfevents.*"))) == 1
    _check_events_equal_metrics(tmp_path / "ddp")
    for a, b in zip(_metrics(tmp_path / "single"), _metrics(tmp_path / "ddp")):
        assert b["train_stage_losses"] == pytest.approx(a["train_stage_losses"], rel=1e-5)
