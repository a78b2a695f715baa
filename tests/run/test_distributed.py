"""Data-parallel training (DDP, gloo on CPU): 2 processes follow the 1-process loss trajectory.

The comparison is exact by design: synthetic data without augmentation, no dropout / drop path,
a fixed depth, and the same global batch; the 2 ranks' shards of a batch are together the single
process's batch (ShardedBatches), so only float summation order differs.
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.conftest import gloo_group
from torch.utils.data import DataLoader, RandomSampler

from recurvit.config import load_config
from recurvit.run import distributed as dist_io
from recurvit.tasks.classify.task import train

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")

@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one intra-op thread (conftest.one_thread)."""


SMALL = ["model.name=bvit_tiny", "model.embed_dim=48", "model.num_heads=3", "model.steps=3", "model.patch_size=4",
         "data.name=synthetic", "data.synthetic_train=64", "data.synthetic_test=40", "data.synthetic_size=16",
         "data.synthetic_classes=10", "train.batch_size=32", "train.lr=2e-3", "train.warmup_epochs=0.5",
         "train.progress=false", "train.device=cpu", "train.seed=3"]
# Two processes average their gradients in another float order than one process summing the batch, and Adam
# carries that rounding through every step: the metrics get the same tolerance as the weights (rtol 1e-4). A
# wrong reduction (a sum instead of a mean, a rank left out) is off by far more. Measured: ~1e-7 here, 1.1e-5
# on the CI machine (a LoopVAE's test_kl after 8 steps).
FLOAT_ORDER = dict(rel=1e-4, abs=1e-5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_sharded_batches_split_the_single_process_batches():
    from tqdm.auto import tqdm  # as the training loop iterates (it touches the generator too)

    n, batch, world, seed = 50, 8, 2, 1234
    data = list(range(n))

    def epoch(loader):
        loader.generator.manual_seed(seed)
        return [b.tolist() for b in tqdm(loader, disable=True)]

    single = epoch(DataLoader(data, batch_size=batch, shuffle=True, generator=torch.Generator()))
    shards = []
    for rank in range(world):
        g = torch.Generator()
        sampler = dist_io.ShardedBatches(RandomSampler(data, generator=g), batch, rank, world)
        shards.append(epoch(DataLoader(data, batch_sampler=sampler, generator=g)))
    assert len(shards[0]) == len(shards[1]) == len(single) == 7
    for i, full in enumerate(single[:-1]):  # every whole batch is split exactly between the ranks
        assert shards[0][i] == full[0::2] and shards[1][i] == full[1::2]
    # the last batch (50 = 6 x 8 + 2) is the single one's, split 1 + 1
    assert shards[0][-1] + shards[1][-1] == single[-1]
    # 7 = 6 x 1 + 1 images on 2 ranks: the odd last batch is padded with the epoch's first index
    odd = [list(dist_io.ShardedBatches(list(range(7)), 6, r, 2)) for r in range(2)]
    assert odd[0] == [[0, 2, 4], [6]] and odd[1] == [[1, 3, 5], [0]]
    assert dist_io.per_rank_batch(32, 2) == 16
    with pytest.raises(Exception, match="divisible by the number of processes"):
        dist_io.per_rank_batch(30, 4)


def _worker(rank, world, port, overrides, out):
    with gloo_group(rank, world, port):
        cfg = load_config(None, overrides)
        train(cfg, out, log=lambda *a: None, stop_after=2)  # interrupted after epoch 2 ...
        train(load_config(out + "/config.yaml"), out, resume=True, log=lambda *a: None)  # ... resumed by all ranks


@pytest.mark.slow
def test_two_process_gloo_run_matches_one_process(tmp_path):
    overrides = SMALL + ["train.epochs=3"]
    single = train(load_config(None, overrides), tmp_path / "single", log=lambda *a: None)
    mp.spawn(_worker, args=(2, _free_port(), overrides, str(tmp_path / "ddp")), nprocs=2, join=True)

    one, two = _rows(tmp_path / "single"), _rows(tmp_path / "ddp")
    assert [r["epoch"] for r in two] == [1, 2, 3]  # written once (rank 0), resume continued at epoch 3
    for a, b in zip(one, two):  # 2 steps per epoch: the trajectory of 6 optimizer steps
        for key in ("train_loss", "test_loss"):
            assert b[key] == pytest.approx(a[key], **FLOAT_ORDER), (a["epoch"], key)
        for key in ("train_acc", "test_acc"):
            assert b[key] == pytest.approx(a[key], abs=1.5 / 40), (a["epoch"], key)  # at most one flipped argmax
    assert two[0]["train_loss"] > two[-1]["train_loss"]  # it learns
    w1 = torch.load(tmp_path / "single" / "last.pt", weights_only=True)
    w2 = torch.load(tmp_path / "ddp" / "last.pt", weights_only=True)
    for k in w1["model"]:
        torch.testing.assert_close(w2["model"][k], w1["model"][k], rtol=1e-4, atol=1e-5)
    assert len(w2["rng_ranks"]) == 2 and w2["world_size"] == 2
    # rank 0 alone writes: the run files and the run's lock (no validation split, so no best.pt)
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == [".lock", "config.yaml", "last.pt",
                                                                    "metrics.jsonl"]
    assert single["test_loss"] == pytest.approx(two[-1]["test_loss"], **FLOAT_ORDER)


def _cli(*args, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "recurvit", "train", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.slow
def test_cli_nproc_launches_torchrun(tmp_path):
    run = tmp_path / "run"
    r = _cli("--nproc", "2", "--out", str(run), "--json", *SMALL, "train.epochs=1")
    assert r.returncode == 0, r.stderr[-2000:]
    first = json.loads(r.stdout)  # one JSON document: only rank 0 printed
    assert first["epoch"] == 1 and first["run_dir"] == str(run)
    assert [row["epoch"] for row in _rows(run)] == [1]
    assert "2 processes" not in r.stdout  # --json: no log lines


def test_cli_nproc_command_lines(tmp_path, monkeypatch):
    """What `recurvit train --nproc N` hands to torchrun (resume under torchrun is run above)."""
    from recurvit.cli import main

    calls = []
    monkeypatch.setattr(dist_io, "launch", lambda n, argv: calls.append((n, argv)) or 0)
    assert main(["train", "--nproc", "4", "--out", str(tmp_path / "new"), "train.batch_size=64", "train.epochs=1"]) == 0
    assert calls[-1] == (4, ["train", "--out", str(tmp_path / "new"), "train.batch_size=64", "train.epochs=1"])
    run = tmp_path / "old"
    run.mkdir()
    (run / "config.yaml").write_text("train:\n  batch_size: 64\n")
    (run / "last.pt").write_bytes(b"")
    assert main(["train", "--nproc", "2", "--resume", str(run), "train.epochs=3", "--json"]) == 0
    assert calls[-1] == (2, ["train", "--resume", str(run), "train.epochs=3", "--json"])
    assert dist_io.torchrun_command(2, ["train"])[1:6] == ["-m", "torch.distributed.run", "--standalone",
                                                          "--nproc_per_node=2", "-m"]


@pytest.mark.slow
def test_cli_nproc_rejects_an_indivisible_batch_before_launching(tmp_path):
    r = _cli("--nproc", "2", "--out", str(tmp_path / "run"), *SMALL, "train.batch_size=33", timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "divisible by the number of processes (2)" in r.stderr
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------- LoopVAE
VAE_RUN = ["data.img_size=16", "data.train_crops=64", "data.max_test=32", "model.embed_dim=8", "model.groups=4",
           "model.depth=1", "model.z_channels=2", "train.batch_size=16", "train.progress=false", "train.epochs=2",
           "train.sample=false", "train.device=cpu"]  # posterior means: no per-rank noise, so the runs can agree


def _vae_worker(rank, world, port, overrides, out):
    from recurvit.tasks.vae.config import load_vae_config
    from recurvit.tasks.vae.task import train_vae

    with gloo_group(rank, world, port):
        train_vae(load_vae_config(None, overrides), out, log=lambda *a: None)


@pytest.mark.slow
def test_a_loopvae_trains_in_two_gloo_processes_to_the_one_process_metrics(tmp_path):
    from recurvit.tasks.vae.config import load_vae_config
    from recurvit.tasks.vae.task import train_vae

    torch.set_num_threads(1)
    train_vae(load_vae_config(None, VAE_RUN), tmp_path / "single", log=lambda *a: None)
    mp.spawn(_vae_worker, args=(2, _free_port(), VAE_RUN, str(tmp_path / "ddp")), nprocs=2, join=True)
    one, two = _rows(tmp_path / "single"), _rows(tmp_path / "ddp")
    assert [r["epoch"] for r in two] == [1, 2] and [r["step"] for r in two] == [4, 8]  # 64 crops / 16 a step
    for a, b in zip(one, two):
        for key in ("train_loss", "train_recon", "train_kl", "test_psnr", "test_ssim", "test_l1", "test_kl"):
            assert b[key] == pytest.approx(a[key], **FLOAT_ORDER), (a["epoch"], key)
        assert b["baseline_psnr"] == a["baseline_psnr"]
    assert two[-1]["test_psnr"] > two[0]["test_psnr"] - 5  # trained, not diverged
    w1 = torch.load(tmp_path / "single" / "last.pt", weights_only=True)
    w2 = torch.load(tmp_path / "ddp" / "last.pt", weights_only=True)
    assert w2["task"] == "vae" and w2["world_size"] == 2
    for k in w1["model"]:
        torch.testing.assert_close(w2["model"][k], w1["model"][k], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_the_adversarial_stage_refuses_several_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    r = subprocess.run([sys.executable, "-m", "recurvit", "vae", "train", *VAE_RUN, "train.adv.start_step=0",
                        "--nproc", "2", "--out", str(tmp_path / "adv")], capture_output=True, text=True, env=env,
                       timeout=240)
    assert r.returncode != 0 and "trains in one process" in r.stderr, r.stderr
