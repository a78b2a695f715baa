"""LoopVAE (models/loopvae*.py): shapes, gradients, loop/scale conditioning, interventions, config validation.
Its metrics, data, training with resume and the `recurvit vae` command line: tests/tasks/vae/. Small models
only (CPU, < 60 s)."""
from __future__ import annotations

import pytest
import torch

from recurvit.analysis.accounting import count_params, measure_flops
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
