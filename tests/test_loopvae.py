"""LoopVAE: shapes, gradients, loop/scale conditioning, interventions, metrics, data,
training with resume, and the `recurvit vae` command line. Small models only (CPU, < 60 s)."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from recurvit.analysis.accounting import count_params, measure_flops
from recurvit.cli import main
from recurvit.models import create_model, list_models, model_config
from recurvit.models.loopvae import LoopVAE, LoopVAEConfig

TINY = dict(img_size=16, embed_dim=16, groups=4, num_heads=2, z_channels=4)
PRESETS = [n for n in list_models() if isinstance(model_config(n), LoopVAEConfig)]  # the registry's VAE family


def test_the_registry_has_the_vae_presets():
    assert {"loopvae_conv", "loopvae_transformer", "vae_unshared", "vae_unshared_transformer"} <= set(PRESETS)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is as fast and immune to oversubscription on shared CPUs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _x(b=2, c=3, s=16, seed=0):
    return torch.randn(b, c, s, s, generator=torch.Generator().manual_seed(seed)).clamp(-1, 1)


# ------------------------------------------------------------------------------------ model
@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_presets_shapes_applications_and_accounting(name):
    torch.manual_seed(0)
    model = create_model(name, **TINY).eval()
    assert isinstance(model, LoopVAE)
    x = _x()
    y = model(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    # defaults: a 4-block core x loops (2, 2, 3) = 28 block applications per encoder and per decoder
    assert model.block_applications() == {"encoder": 28, "decoder": 28, "total": 56}
    posts = model.encode(x)
    assert len(posts) == 1 and posts[0].mean.shape == (2, 4, 2, 2)  # 16 / patch 2 / 2 / 2
    flops = measure_flops(model, (3, 16, 16), train=False)
    assert sum(flops["block_uses"]) == 56
    counts = count_params(model, block_uses=flops["block_uses"])
    shared = model.cfg.core == "shared"
    assert len(model.blocks) == (8 if shared else 56)
    assert set(flops["block_uses"]) == ({7} if shared else {1})
    if shared:  # the LoopVAE's "effective" size is exactly its unshared reference's size
        ref = create_model(name.replace("loopvae_", "vae_unshared_").replace("_conv", ""), **TINY)
        assert counts["params_effective"] == count_params(ref)["params"] > counts["params_stored"]
    else:
        assert counts["params_effective"] == counts["params_stored"]


@pytest.mark.parametrize("name, latent", [("loopvae_conv", "single"), ("loopvae_transformer", "multi"),
                                          ("vae_unshared", "multi")])
def test_every_parameter_gets_a_gradient(name, latent):
    torch.manual_seed(0)
    model = create_model(name, latent=latent, **TINY).train()
    xr, posts = model.reconstruct(_x())
    assert len(posts) == (3 if latent == "multi" else 1)
    loss = xr.square().mean() + sum(q.kl() for q in posts).mean() * 1e-3
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing
    zero = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0]
    assert not zero, zero


def test_multi_resolution_latents_have_one_grid_per_scale():
    model = create_model("loopvae_conv", latent="multi", **TINY).eval()
    posts = model.encode(_x())
    assert [tuple(q.mean.shape) for q in posts] == [(2, 4, 8, 8), (2, 4, 4, 4), (2, 4, 2, 2)]
    assert model.decode([q.mode() for q in posts]).shape == (2, 3, 16, 16)


def test_one_core_serves_every_scale_and_each_transition_is_its_own():
    """The shared LoopVAE: one core per encoder / decoder, applied at every scale and loop (each of its
    blocks runs once per application), and resolution-changing transitions with no parameter in common."""
    torch.manual_seed(0)
    model = create_model("loopvae_conv", **TINY).eval()
    for side, transitions in ((model.encoder, model.encoder.down), (model.decoder, model.decoder.up)):
        assert len(side.core.blocks) == model.cfg.depth  # one set of blocks, not one per scale
        owned = [{id(p) for p in t.parameters()} for t in transitions]
        assert len(owned) == len(model.cfg.loops) - 1 and all(owned)
        assert sum(map(len, owned)) == len(set().union(*owned))  # no tensor shared between transitions
        assert not set().union(*owned) & {id(p) for p in side.core.parameters()}
    calls = {"encoder": [], "decoder": []}
    hooks = [b.register_forward_hook(lambda *_, side=side: calls[side].append(1))
             for side in calls for b in getattr(model, side).core.blocks]
    with torch.no_grad():
        model.decode([q.mode() for q in model.encode(_x())])
    for h in hooks:
        h.remove()
    assert len(calls["encoder"]) == len(calls["decoder"]) == model.cfg.depth * sum(model.cfg.loops) == 28


@pytest.mark.parametrize("operator", ["conv", "transformer"])
def test_loop_and_scale_conditioning_change_the_core_output(operator):
    torch.manual_seed(0)
    model = create_model("loopvae_conv", operator=operator, **TINY)
    core = model.encoder.core
    h = torch.randn(2, 16, 4, 4)
    if operator == "transformer":
        h = h.flatten(2).transpose(1, 2)  # the core's token layout (B, N, C)
    with torch.no_grad():
        ref = core.step(h, scale=1, loop=0)
        assert not torch.allclose(ref, core.step(h, scale=0, loop=0), atol=1e-5)  # scale index matters
        assert not torch.allclose(ref, core.step(h, scale=1, loop=1), atol=1e-5)  # loop index matters
        assert torch.equal(ref, core.step(h, scale=1, loop=0))
        # beyond the trained loops a scale reuses its last trained loop's conditioning (scale 1: 2 loops)
        assert torch.equal(core.step(h, scale=1, loop=5), core.step(h, scale=1, loop=1))
    # the (scale, loop) embeddings are trained: they receive gradients
    core.step(h, scale=2, loop=2).square().sum().backward()
    assert core.cond.scale_embed.grad[2].abs().sum() > 0 and core.cond.scale_embed.grad[0].abs().sum() == 0
    assert core.cond.loop_embed.grad[2].abs().sum() > 0 and core.cond.loop_embed.grad[0].abs().sum() == 0
    # with the modulation initialised to zero the conditioning starts inert (documented option)
    inert = create_model("loopvae_conv", operator=operator, mod_init=0.0, **TINY).encoder.core
    with torch.no_grad():
        assert torch.equal(inert.step(h, 0, 0), inert.step(h, 2, 1))


@pytest.mark.parametrize("name", ["loopvae_conv", "vae_unshared_transformer"])
def test_interventions_are_consistent(name):
    torch.manual_seed(0)
    model = create_model(name, **TINY).eval()
    x = _x()
    with torch.no_grad():
        ref = model(x)
        assert torch.equal(model(x, loops=[2, 2, 3]), ref)
        # a factor of 1 is the trained model; 0 on a scale's last loop is that loop truncated
        assert torch.allclose(model(x, update_scale={("decoder", 1, 1): 1.0}), ref, atol=1e-6)
        cut = model(x, dec_loops=[2, 1, 3])
        assert torch.allclose(model(x, update_scale={("decoder", 1, 1): 0.0}), cut, atol=1e-6)
        assert not torch.allclose(cut, ref, atol=1e-4)
        assert model(x, loops=0).shape == x.shape  # every core skipped
        assert model(x, loops=5).shape == x.shape  # extra loops (unshared: the last loop's blocks again)
        assert model.block_applications(loops=5)["total"] == 2 * 4 * 15
    with pytest.raises(ValueError):
        model(x, loops=[1, 2])


def test_config_validation_is_a_user_error():
    from recurvit.errors import UserError

    with pytest.raises(UserError, match="img_size"):
        create_model("loopvae_conv", img_size=20)
    with pytest.raises(UserError, match="operator"):
        create_model("loopvae_conv", operator="mlp")


# ---------------------------------------------------------------------------------- metrics
def test_psnr_and_ssim_against_references():
    from scipy.signal import convolve2d

    from recurvit.tasks.vae.metrics import psnr, ssim

    g = torch.Generator().manual_seed(1)
    a = torch.rand(2, 3, 24, 24, generator=g, dtype=torch.float64)
    b = (a + 0.1 * torch.randn(2, 3, 24, 24, generator=g, dtype=torch.float64)).clamp(0, 1)
    mse = ((a - b) ** 2).flatten(1).mean(1)
    assert torch.allclose(psnr(a, b).double(), 10 * torch.log10(1 / mse), atol=1e-4)
    assert torch.allclose(ssim(a, a), torch.ones(2))

    r = np.arange(11) - 5.0  # Wang et al.: 11x11 Gaussian window, sigma 1.5, 'valid' positions
    w = np.exp(-r ** 2 / 4.5)
    w = np.outer(w, w) / np.outer(w, w).sum()

    def ref(x, y):
        f = lambda t: convolve2d(t, w, mode="valid")  # noqa: E731
        mx, my = f(x), f(y)
        sxx, syy, sxy = f(x * x) - mx ** 2, f(y * y) - my ** 2, f(x * y) - mx * my
        c1, c2 = 0.01 ** 2, 0.03 ** 2
        return (((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx ** 2 + my ** 2 + c1) * (sxx + syy + c2))).mean()

    expected = [np.mean([ref(a[i, c].numpy(), b[i, c].numpy()) for c in range(3)]) for i in range(2)]
    assert np.allclose(ssim(a, b).numpy(), expected, atol=1e-5)


def test_photo_crops_hold_out_a_fixed_test_region():
    from recurvit.tasks.vae.config import VAEDataConfig
    from recurvit.tasks.vae.data import build_vae_datasets

    train, test, info = build_vae_datasets(VAEDataConfig(img_size=16, train_crops=200), seed=3)
    assert (info.img_size, info.in_chans, info.n_train) == (16, 3, 200)
    for p, y, x, _ in train._items:  # training crops stay left of each photo's held-out columns
        assert x + 16 <= train.x_ends[p]
    assert all(x >= train.x_ends[p] for p, _, x in test._items)
    first = [train[i] for i in range(3)]
    train.set_epoch(1)
    assert not torch.equal(first[0], train[0])
    train.set_epoch(0)
    assert all(torch.equal(f, train[i]) for i, f in enumerate(first))  # a function of (seed, epoch)
    x = torch.stack([test[i] for i in range(len(test))])
    assert x.shape[1:] == (3, 16, 16) and x.min() >= -1 and x.max() <= 1


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
