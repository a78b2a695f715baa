"""The LoopVAE task (recurvit.tasks.vae.task): training with resume, and the `recurvit vae` command line (train,
eval, intervene, profile, a user's mistakes). Small models only (CPU, < 60 s)."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from recurvit.cli import main


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is as fast and immune to oversubscription on shared CPUs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------- training / resume
TINY_RUN = ["data.img_size=16", "data.train_crops=64", "data.max_test=32", "model.embed_dim=8", "model.groups=4",
            "model.depth=1", "model.z_channels=2", "train.batch_size=16", "train.progress=false", "train.threads=1"]


@pytest.mark.slow
def test_resume_equals_an_uninterrupted_run(tmp_path):
    from recurvit.tasks.vae.config import load_vae_config
    from recurvit.tasks.vae.task import train_vae

    overrides = TINY_RUN + ["train.epochs=2", "train.adv.start_step=3", "train.adv.channels=8"]
    cfg = load_vae_config(None, overrides)
    full = train_vae(cfg, tmp_path / "full", log=lambda *a: None)
    part = train_vae(load_vae_config(None, overrides), tmp_path / "part", log=lambda *a: None, stop_after=1)
    assert part["epoch"] == 1
    resumed = train_vae(load_vae_config(tmp_path / "part" / "config.yaml"), tmp_path / "part", resume=True,
                        log=lambda *a: None)
    for key in ("test_psnr", "test_ssim", "train_loss", "train_d_loss", "step"):
        assert resumed[key] == full[key], key
    a = torch.load(tmp_path / "full" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "part" / "last.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["disc"][k], b["disc"][k]) for k in a["disc"])
    lines = (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["epoch"] for ln in lines] == [1, 2]
    assert full["test_psnr"] > full["baseline_psnr"]


@pytest.mark.slow
def test_cli_train_eval_intervene_profile_on_digits(tmp_path, capsys):
    run = tmp_path / "run"
    digits = ["data.name=digits", "model.patch_size=1", "model.loops=[1,2]", "model.embed_dim=8", "model.groups=4",
              "model.depth=1", "model.z_channels=2", "train.epochs=1", "train.progress=false", "train.threads=1",
              "data.max_test=64"]
    assert main(["vae", "train", *digits, "--out", str(run), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"test_psnr", "test_ssim", "baseline_psnr"} <= res.keys()
    assert main(["vae", "train", *digits, "--out", str(run)]) == 2  # not empty: refuses to overwrite
    assert "already exists" in capsys.readouterr().err

    assert main(["vae", "eval", str(run), "--loops", "1", "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["enc_loops"] == [1, 1] and ev["n"] == 64 and (run / "recon_grid.png").is_file()
    assert ev["block_applications"] == 4

    assert main(["vae", "eval", str(run), "--lpips", "--vgg-weights", str(tmp_path / "vgg16.pth")]) == 2
    err = capsys.readouterr().err
    assert "vgg16.pth" in err and err.count("\n") == 1
    assert main(["vae", "eval", str(run), "--rfid"]) == 2
    assert "--inception-weights" in capsys.readouterr().err

    assert main(["vae", "intervene", str(run), "--truncate", "1", "--extra", "1", "--factors", "0,2", "--json"]) == 0
    rows = list(csv.DictReader(open(run / "intervene.csv")))
    assert [r["kind"] for r in rows[:3]] == ["trained", "truncate", "extra"]
    assert len(rows) == 3 + 2 * 2 * 2 and (run / "intervene.png").is_file()
    capsys.readouterr()

    out = tmp_path / "profile" / "vae_profile.csv"
    assert main(["vae", "profile", str(run), "--batch-size", "2", "--repeats", "1", "--out", str(out.parent), "--json"]) == 0
    prof = {r["model"]: r for r in csv.DictReader(open(out))}
    assert set(prof) == {f"{v}_{op}" for v in ("loopvae", "unshared", "matched") for op in ("conv", "transformer")}
    assert prof["loopvae_conv"]["flops_forward"] == prof["unshared_conv"]["flops_forward"]
    assert int(prof["loopvae_conv"]["params_stored"]) < int(prof["unshared_conv"]["params_stored"])
    # the conventional VAE with the LoopVAE's block budget (1 block here, at least one per scale: 1 + 1)
    assert int(prof["matched_conv"]["block_applications"]) == 2 * 2 < int(prof["loopvae_conv"]["block_applications"])
    assert int(prof["matched_conv"]["flops_forward"]) < int(prof["loopvae_conv"]["flops_forward"])


def test_cli_user_errors(tmp_path, capsys):
    assert main(["vae", "train", "train.perceptual_weight=0.1", *TINY_RUN, "--out", str(tmp_path / "p")]) == 2
    assert "train.vgg_weights=FILE" in capsys.readouterr().err
    assert main(["vae", "train", "model.name=bvit_tiny", "--out", str(tmp_path / "b")]) == 2
    assert "not a VAE preset" in capsys.readouterr().err
    assert main(["vae", "train", "train.nope=1"]) == 2
    assert main(["vae", "eval", str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err
