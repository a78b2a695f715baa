"""SoftMoR core (models/softmor.py): reduction to the ViT, step semantics, router, accounting."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import recurvit.tasks  # noqa: F401  (registers the tasks study files name: study/ imports none)
from recurvit.analysis.accounting import count_params, measure_flops
from recurvit.errors import UserError
from recurvit.models import ViTConfig, create_model
from recurvit.models.cores.softmor import MAX_RECURSIONS, SoftMoRCore, router_params

SMALL = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, num_heads=2, depth=3)
LAYOUTS = ("inplace", "cycle")
ROUTER_KEYS = {"core.weight", "core.bias"}


def _srvit(r: int, layout: str, seed: int = 0, random_router: bool = True):
    torch.manual_seed(seed)
    m = create_model("srvit_tiny", recursions=r, layout=layout, **SMALL).eval()
    if random_router:  # the zero-initialised router mixes uniformly; test a non-trivial one
        with torch.no_grad():
            m.core.weight.normal_(0, 1.0)
            m.core.bias.normal_(0, 1.0)
    return m


def _x(b: int = 2, seed: int = 1):
    return torch.randn(b, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def _reference(model, x):
    """SoftMoR written out directly from its definition (block calls, softmax over steps)."""
    core, blocks, r = model.core, model.blocks, model.core.recursions

    def mixture(u, hs):
        s = torch.stack([F.layer_norm(h, h.shape[-1:], eps=1e-6) @ core.weight[u] + core.bias[u, i]
                         for i, h in enumerate(hs)], dim=-1)
        p = s.softmax(dim=-1)
        return sum(p[..., i:i + 1] * h for i, h in enumerate(hs))

    z = model.embed(x)
    if core.layout == "inplace":
        for l, block in enumerate(blocks):
            hs = []
            for _ in range(r):
                z = block(z)
                hs.append(z)
            z = mixture(l, hs)
    else:
        hs = []
        for _ in range(r):
            for block in blocks:
                z = block(z)
            hs.append(z)
        z = mixture(0, hs)
    return model.forward_head(model.norm(z))


# ------------------------------------------------------------------------------ definition
@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("r", [2, 3])
def test_matches_the_written_out_definition(layout, r):
    m = _srvit(r, layout)
    x = _x()
    with torch.no_grad():
        assert torch.allclose(m(x), _reference(m, x), atol=1e-5)
    assert m.nfe == SMALL["depth"] * r


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_recursion_is_exactly_the_vit(layout):
    torch.manual_seed(0)
    vit = create_model("vit_tiny", **SMALL).eval()
    sr = create_model("srvit_tiny", recursions=1, layout=layout, **SMALL).eval()
    res = sr.load_state_dict(vit.state_dict(), strict=False)
    assert set(res.missing_keys) == ROUTER_KEYS and not res.unexpected_keys  # everything else strict
    with torch.no_grad():
        sr.core.weight.normal_()  # whatever the router holds, one step has weight exactly 1
        sr.core.bias.normal_()
        x = _x(3)
        assert torch.allclose(sr(x), vit(x), atol=1e-6, rtol=0)
        if layout == "inplace":  # the layer-wise readout is the ViT's too
            assert torch.allclose(sr.forward_steps(x), vit.forward_steps(x), atol=1e-6, rtol=0)
    assert sr.nfe == SMALL["depth"]
    assert torch.equal(sr.core.last_weights[0], torch.ones(3, 17, 1))


# ---------------------------------------------------------------------------------- steps
@pytest.mark.slow
@pytest.mark.parametrize("layout, r, nominal", [("inplace", 2, 3), ("inplace", 4, 3), ("cycle", 3, 3), ("cycle", 4, 4)])
def test_forward_steps_equal_truncated_forwards(layout, r, nominal):
    m = _srvit(r, layout)
    x = _x()
    assert m.nominal_steps == m.core.limit == nominal
    with torch.no_grad():
        all_steps = m.forward_steps(x)
        assert all_steps.shape == (nominal, 2, 10)
        for k in range(1, nominal + 1):
            out = m(x, steps=k)
            assert m.nfe == (k * r if layout == "inplace" else k * SMALL["depth"])
            assert torch.allclose(all_steps[k - 1], out, atol=1e-6, rtol=0)
        assert torch.allclose(m.forward_steps(x, at=[1, nominal])[0], all_steps[0], atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        m(x, steps=nominal + 1)


def test_cycle_steps_are_fewer_recursions():
    """cycle: running c < r cycles is the same model recursed c times (bias prior truncated)."""
    m4 = _srvit(4, "cycle")
    m2 = create_model("srvit_tiny", recursions=2, layout="cycle", **SMALL).eval()
    sd = m4.state_dict()
    sd["core.bias"] = sd["core.bias"][:, :2]
    m2.load_state_dict(sd)
    x = _x()
    with torch.no_grad():
        assert torch.allclose(m4(x, steps=2), m2(x), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- mixture weights
@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_last_weights_are_token_wise_distributions(layout):
    r = 3
    m = _srvit(r, layout)
    x = _x()
    m(x)
    w = m.core.last_weights
    assert len(w) == (SMALL["depth"] if layout == "inplace" else 1)
    for p in w:
        assert p.shape == (2, 17, r) and not p.requires_grad
        assert (p > 0).all()
        assert torch.allclose(p.sum(-1), torch.ones(2, 17), atol=1e-6)
        assert p.std(dim=1).max() > 1e-3  # token-wise: tokens get different weights
    m(x, steps=2)
    assert len(m.core.last_weights) == (2 if layout == "inplace" else 1)
    if layout == "cycle":
        assert m.core.last_weights[0].shape[-1] == 2
    fresh = create_model("srvit_tiny", recursions=r, layout=layout, **SMALL)  # zero router: uniform
    fresh(x)
    assert all(torch.allclose(p, torch.full_like(p, 1 / r)) for p in fresh.core.last_weights)


# ------------------------------------------------------------------------------ gradients
@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("r", [1, 2, 3, 4])
def test_every_parameter_gets_a_gradient(layout, r):
    torch.manual_seed(r)
    m = create_model("srvit_tiny", recursions=r, layout=layout, **SMALL).train()  # zero-init router
    out = m(_x())
    F.cross_entropy(out, torch.tensor([1, 7])).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        if name in ROUTER_KEYS and r == 1:
            assert torch.count_nonzero(p.grad) == 0, name  # softmax over one step is constant
        else:
            assert torch.count_nonzero(p.grad) > 0, name
    if r > 1:  # every unit's router gets its own gradient, every step's bias too
        assert (m.core.weight.grad.abs().sum(-1) > 0).all()
        assert (m.core.bias.grad != 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_truncated_backprop_keeps_logits_and_trains_the_last_router(layout):
    m = _srvit(2, layout)
    x = _x()
    full = m(x)
    trunc = m.forward_head(m.forward_features(x, grad_last=1))
    assert torch.allclose(full, trunc, atol=1e-6)
    trunc.sum().backward()
    assert torch.count_nonzero(m.core.weight.grad[-1]) > 0
    first = m.blocks[0].attn.qkv.weight.grad  # inplace: unit 1 ran without a graph; cycle: the last pass has one
    assert (first is None) if layout == "inplace" else (torch.count_nonzero(first) > 0)


# ------------------------------------------------------------------------------ accounting
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("r", [1, 2, 3, 4])
def test_parameter_overhead_is_the_router(layout, r):
    torch.manual_seed(0)
    cfg_kw = dict(recursions=r, layout=layout, **SMALL)
    with torch.device("meta"):
        sr, vit = create_model("srvit_tiny", **cfg_kw), create_model("vit_tiny", **SMALL)
    L, D = SMALL["depth"], SMALL["embed_dim"]
    assert router_params(sr.cfg) == (L if layout == "inplace" else 1) * (D + r)
    assert count_params(sr)["params_stored"] - count_params(vit)["params_stored"] == router_params(sr.cfg)


def test_srvit_small_r4_imagenet_overhead():
    with torch.device("meta"):  # shapes only: 224/16, 1000 classes
        vit = create_model("vit_small")
        inplace = create_model("srvit_small", recursions=4)
        cycle = create_model("srvit_small", recursions=4, layout="cycle")
    base = count_params(vit)["params_stored"]
    assert base == 22_050_664
    assert count_params(inplace)["params_stored"] - base == router_params(inplace.cfg) == 12 * (384 + 4) == 4656
    assert count_params(cycle)["params_stored"] - base == router_params(cycle.cfg) == 384 + 4 == 388


@pytest.mark.parametrize("layout", LAYOUTS)
def test_block_uses_and_nfe(layout):
    r = 3
    m = _srvit(r, layout)
    got = measure_flops(m, (1, 8, 8), train=False)
    assert got["nfe"] == SMALL["depth"] * r
    assert got["block_uses"] == [r] * SMALL["depth"]
    counts = count_params(m, block_uses=got["block_uses"])
    assert counts["params_effective"] == counts["params_stored"] + (r - 1) * counts["params_blocks"]


# ----------------------------------------------------------------------------- validation
def test_presets_and_overrides():
    m = create_model("srvit_tiny", **SMALL)
    assert isinstance(m.core, SoftMoRCore) and m.core.name == "softmor"
    assert m.core.recursions == 2 and m.core.layout == "inplace" and m.nominal_steps == SMALL["depth"]
    c = create_model("srvit_tiny", recursions=MAX_RECURSIONS, layout="cycle", **SMALL)
    assert c.core.recursions == 4 and c.nominal_steps == 4


@pytest.mark.parametrize("bad", [
    dict(recursions=0), dict(recursions=5), dict(recursions=-1), dict(recursions=2.5), dict(recursions=True),
    dict(layout="stacked"), dict(steps=2), dict(layout="cycle", steps=5), dict(step_cond="embed"),
    dict(reinject=True),
])
def test_invalid_options_are_user_errors(bad):
    with pytest.raises(UserError) as e:
        create_model("srvit_tiny", **{**SMALL, **bad})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError):
        SoftMoRCore(ViTConfig.build({}, {"core": "softmor", **SMALL, **bad}))


# --------------------------------------------------------------- query router, plain recursion
@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("router", ["linear", "query"])
@pytest.mark.parametrize("r", [1, 2, 4])
def test_router_parameters_and_flops_match_their_closed_forms(layout, router, r):
    from recurvit.models.cores.softmor import router_flops

    kw = dict(recursions=r, layout=layout, router=router, **SMALL)
    with torch.device("meta"):
        sr, vit = create_model("srvit_tiny", **kw), create_model("vit_tiny", **SMALL)
    U, D = (SMALL["depth"] if layout == "inplace" else 1), SMALL["embed_dim"]
    per_unit = D * D if router == "query" else D
    assert router_params(sr.cfg) == U * (per_unit + r)
    assert count_params(sr)["params_stored"] - count_params(vit)["params_stored"] == U * (per_unit + r)
    m = create_model("srvit_tiny", **kw)
    if router == "query":
        with torch.no_grad():
            m.core.query.normal_()
    counted = measure_flops(m, (1, 8, 8), train=False)["flops_forward"]
    plain = measure_flops(create_model("srvit_tiny", recursions=r, layout=layout, mixture="last", **SMALL),
                          (1, 8, 8), train=False)["flops_forward"]
    assert counted - plain == router_flops(sr.cfg)  # the counter sees exactly the router's matmuls


def test_srvit_small_r4_query_router_is_sized_like_the_paper():
    with torch.device("meta"):  # 224 px, 16 px patches, 1000 classes: the SR-ViT-S of the paper
        vit = create_model("vit_small")
        sr = create_model("srvit_small", recursions=4, router="query")
    extra = count_params(sr)["params_stored"] - count_params(vit)["params_stored"]
    assert extra == router_params(sr.cfg) == 12 * (384 * 384 + 4)
    assert 1.6e6 <= extra <= 1.8e6


@pytest.mark.parametrize("layout", LAYOUTS)
def test_query_router_starts_uniform_and_r1_is_the_vit(layout):
    torch.manual_seed(0)
    sr = create_model("srvit_tiny", recursions=3, layout=layout, router="query", **SMALL).eval()
    x = _x()
    with torch.no_grad():
        sr(x)
    for p in sr.core.last_weights:  # zero-initialised query and bias: every step weighs 1/r
        torch.testing.assert_close(p, torch.full_like(p, 1 / 3))
    torch.manual_seed(0)
    one = create_model("srvit_tiny", recursions=1, layout=layout, router="query", **SMALL).eval()
    vit = create_model("vit_tiny", **SMALL).eval()
    vit.load_state_dict({k: v for k, v in one.state_dict().items() if not k.startswith("core.")})
    with torch.no_grad():
        one.core.query.normal_()
        assert torch.equal(one(x), vit(x))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_plain_recursion_passes_the_last_step_on(layout):
    torch.manual_seed(0)
    last = create_model("srvit_tiny", recursions=3, layout=layout, mixture="last", **SMALL).eval()
    assert not list(last.core.parameters())  # no router
    x = _x()
    z = last.embed(x)
    with torch.no_grad():
        if layout == "inplace":
            for block in last.blocks:
                for _ in range(3):
                    z = block(z)
        else:
            for _ in range(3):
                for block in last.blocks:
                    z = block(z)
        torch.testing.assert_close(last(x), last.forward_head(last.norm(z)), atol=1e-6, rtol=0)
    torch.manual_seed(0)
    one = create_model("srvit_tiny", recursions=1, layout=layout, mixture="last", **SMALL).eval()
    vit = create_model("vit_tiny", **SMALL).eval()
    vit.load_state_dict(one.state_dict())
    with torch.no_grad():
        assert torch.equal(one(x), vit(x))
    with pytest.raises(UserError, match="router does not apply"):
        create_model("srvit_tiny", recursions=2, mixture="last", router="query", **SMALL)


def test_the_matched_plain_recursion_of_the_softmor_study_stores_the_query_routers_parameters():
    """studies/fashion_softmor_plateau.yaml compares SoftMoR with plain recursion at matched stored
    parameters: plain recursion gets a wider MLP instead of the router (within 0.1%)."""
    from recurvit.config import load_config
    from recurvit.study import load_study
    from recurvit.run import checkpoint as ckpt_io

    study = load_study("studies/fashion_softmor_plateau.yaml")
    runs = {r.labels["variant"]: r for r in study.runs if r.labels["train.seed"] == "0"}

    def stored(label):
        cfg = load_config(str(runs[label].base), runs[label].overrides + ["model.img_size=28", "model.in_chans=1",
                                                                         "model.num_classes=10"])
        return sum(p.numel() for p in ckpt_io.build_model_from_config(cfg).parameters())

    query, matched, plain = stored("r4_query"), stored("r4_last_matched"), stored("r4_last")
    assert abs(matched / query - 1) < 1e-3 and plain < 0.95 * query


def test_a_cycle_state_kept_for_some_images_still_reads_their_mixture():
    """Stepping the cycle layout by hand: after ``select`` (images that exited leave the batch) the state
    still reads the mixture of the kept images, and stepping on gives what one pass gives them."""
    torch.manual_seed(0)
    m = create_model("srvit_tiny", img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=24, num_heads=2,
                     depth=2, recursions=3, layout="cycle", router="query").eval()
    with torch.no_grad():
        for p in m.core.parameters():
            p.add_(0.1 * torch.randn_like(p))
        x = torch.randn(4, 3, 16, 16)
        every = list(m.core.states(m.blocks, m.embed(x), 3))
        state = m.core.begin(m.blocks, m.embed(x))
        m.core.advance(state)
        m.core.advance(state)
        keep = torch.tensor([0, 2])
        kept = state.select(keep)
        torch.testing.assert_close(m.core.read(kept), every[1][keep])
        torch.testing.assert_close(m.core.advance(kept), every[2][keep])
