"""Registry-wide model tests, timm parity, the ViT/bViT parameter relation, forward_steps."""
import pytest
import torch

import recurvit
from recurvit import create_model, list_models, model_config
from recurvit.errors import UserError
from recurvit.models.vit import ViTConfig

from tests.conftest import TINY

VIT_FAMILY = [n for n in list_models() if isinstance(model_config(n), ViTConfig)]


@pytest.mark.parametrize("name", VIT_FAMILY)
def test_every_model_shapes_finite_and_all_params_get_gradients(name):
    model = create_model(name, **TINY)
    x = torch.randn(2, 3, 16, 16)
    out = model(x)
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()
    steps = model.forward_steps(x)
    assert steps.shape == (model.nominal_steps, 2, 7)
    # every parameter gets a gradient; routers that start uniform need a non-constant loss
    (out.square().sum() + steps.pow(3).sum()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


def test_public_api():
    assert {"vit_tiny", "vit_small", "vit_base", "bvit_tiny", "bvit_small", "bvit_base"} <= set(list_models())
    with pytest.raises(UserError, match="unknown model"):
        create_model("vit_huge_nope")
    with pytest.raises(UserError, match="no option"):
        create_model("vit_tiny", not_an_option=3)


def _timm_vit(**kw):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**kw)


@pytest.mark.slow
@pytest.mark.parametrize("size,dim,heads", [("tiny", 192, 3), ("small", 384, 6), ("base", 768, 12)])
def test_timm_parity_both_directions(size, dim, heads):
    ours = create_model(f"vit_{size}", img_size=32, patch_size=4, num_classes=100).eval()
    theirs = _timm_vit(img_size=32, patch_size=4, num_classes=100, embed_dim=dim, depth=12, num_heads=heads).eval()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(2, 3, 32, 32)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)
    theirs2 = _timm_vit(img_size=32, patch_size=4, num_classes=100, embed_dim=dim, depth=12, num_heads=heads).eval()
    ours.load_state_dict(theirs2.state_dict(), strict=True)
    torch.testing.assert_close(ours(x), theirs2(x), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pool,cls_token,init_values", [("avg", False, None), ("avg", True, 1e-5), ("token", True, 0.1)])
def test_timm_parity_pooling_and_layerscale(pool, cls_token, init_values):
    kw = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=48, depth=3, num_heads=3)
    ours = create_model("vit_tiny", global_pool=pool, class_token=cls_token, init_values=init_values, **kw).eval()
    theirs = _timm_vit(global_pool=pool, class_token=cls_token, init_values=init_values, **kw).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=0)


def _block_params(model):
    return sum(p.numel() for p in model.blocks[0].parameters())


@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_vit_has_exactly_eleven_more_blocks_than_bvit(size):
    kw = dict(img_size=32, patch_size=4, num_classes=100)
    with torch.device("meta"):
        vit, bvit = create_model(f"vit_{size}", **kw), create_model(f"bvit_{size}", **kw)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(vit) == n(bvit) + 11 * _block_params(bvit)
    assert set(bvit.state_dict()) <= set(vit.state_dict())  # bViT keys are the ViT's first block's


def test_bvit_runs_its_first_block_like_a_one_block_vit():
    vit = create_model("vit_tiny", depth=1, **TINY).eval()
    bvit = create_model("bvit_tiny", steps=1, **TINY).eval()
    bvit.load_state_dict(vit.state_dict())
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(bvit(x), vit(x), atol=0, rtol=0)


@pytest.mark.parametrize("step_cond,reinject", [("none", False), ("embed", False), ("scale", True), ("embed", True)])
def test_forward_steps_equals_separate_forwards_beyond_training_depth(step_cond, reinject):
    model = create_model("bvit_tiny", steps=3, step_cond=step_cond, reinject=reinject, **TINY).eval()
    with torch.no_grad():  # make the learned conditioning non-trivial
        for p in model.core.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 3, 16, 16)
    K = 8  # well beyond the trained 3 steps
    all_steps = model.forward_steps(x, steps=K)
    assert all_steps.shape == (K, 2, 7)
    for k in range(1, K + 1):
        torch.testing.assert_close(all_steps[k - 1], model(x, steps=k), atol=1e-6, rtol=0)
    torch.testing.assert_close(model(x), model(x, steps=3))
    assert model.nfe == 3


def test_forward_steps_is_one_pass():
    model = create_model("bvit_tiny", steps=4, **TINY).eval()
    calls = []
    model.blocks[0].register_forward_hook(lambda *a: calls.append(1))
    model.forward_steps(torch.randn(1, 3, 16, 16), steps=10)
    assert len(calls) == 10


def test_stack_forward_steps_is_layerwise_and_bounded():
    vit = create_model("vit_tiny", depth=4, **TINY).eval()
    x = torch.randn(2, 3, 16, 16)
    ys = vit.forward_steps(x)
    assert ys.shape == (4, 2, 7)
    for k in range(1, 5):
        torch.testing.assert_close(ys[k - 1], vit(x, steps=k), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="steps must be <= 4"):
        vit(x, steps=5)


def test_step_conditioning_starts_as_plain_recurrence():
    plain = create_model("bvit_tiny", steps=3, **TINY).eval()
    x = torch.randn(2, 3, 16, 16)
    for kind in ("embed", "scale"):
        cond = create_model("bvit_tiny", steps=3, step_cond=kind, **TINY).eval()
        cond.load_state_dict(plain.state_dict(), strict=False)
        torch.testing.assert_close(cond(x, steps=6), plain(x, steps=6), atol=1e-5, rtol=0)


def test_bad_model_options_are_user_errors():
    for kw in (dict(steps=0), dict(patch_size=5), dict(global_pool="max"), dict(step_cond="film"),
               dict(embed_dim=50, num_heads=3), dict(num_classes=-1)):
        with pytest.raises(UserError):
            create_model("bvit_tiny", **{**TINY, **kw})


def test_stack_steps_override_sets_depth():
    vit = create_model("vit_tiny", steps=5, **TINY)
    assert len(vit.blocks) == 5 and vit.nominal_steps == 5
    assert recurvit.model_config("bvit_tiny").steps == 12


def test_forward_head_has_timms_signature_and_keeps_the_stage_head_keyword():
    """forward_head(z, pre_logits=False, *, step=None): timm's positional pre_logits; our stage
    head selection stays a keyword (callers use forward_head(z, step=k))."""
    import inspect

    model = create_model("bvit_tiny", steps=4, stage_heads=2, **TINY).eval()
    params = inspect.signature(model.forward_head).parameters
    assert list(params)[:2] == ["z", "pre_logits"] and params["step"].kind is inspect.Parameter.KEYWORD_ONLY
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        z = model.forward_features(x, steps=1)
        pooled = model.forward_head(z, True)
        assert pooled.shape == (2, 48)
        torch.testing.assert_close(model.forward_head(z, step=1), model.stage_heads[0](pooled))
        torch.testing.assert_close(model.forward_head(z, step=4), model.head(pooled))
        torch.testing.assert_close(model.forward_head(z), model.head(pooled))
        torch.testing.assert_close(model(x, steps=1), model.forward_steps(x)[0])
    with pytest.raises(TypeError):
        model.forward_head(z, False, 1)  # step is keyword-only


def test_headless_model_returns_pooled_features():
    model = create_model("bvit_tiny", steps=2, **{**TINY, "num_classes": 0}).eval()
    assert isinstance(model.head, torch.nn.Identity) and model.num_classes == 0
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, model.head_hidden_size)


def test_invalid_api_arguments_are_value_errors():
    """Python callers catch what Python users expect; the CLI still prints the same message as one line."""
    from recurvit.errors import UserError

    with pytest.raises(ValueError, match="depth=3 does not apply"):
        create_model("bvit_tiny", depth=3)
    assert issubclass(UserError, ValueError)


def test_pretrained_weights_are_refused_with_the_real_reason():
    with pytest.raises(ValueError, match="ships no pretrained weights"):
        create_model("bvit_tiny", pretrained=True)
    assert create_model("bvit_tiny", pretrained=False, **TINY) is not None  # timm's spelling of "no weights"
