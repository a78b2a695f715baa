"""timm's model contract for the recurvit presets timm can create (models/timm_presets.py).

Modelled on timm's own tests/test_models.py (test_model_backward, test_model_default_cfgs_non_std,
test_model_forward_intermediates, test_model_forward_intermediates_features, the grad-checkpointing
checks of test_model_forward) at tiny shapes, parametrized over every registered name. What differs
for a recurrent model: an intermediate is the state after a STEP, not a block's output, so the
checks compare against ``iter_states``, and ``steps=`` (beyond the trained depth) is checked too.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

timm = pytest.importorskip("timm")

import recurvit  # noqa: E402
from recurvit.models import timm_presets  # noqa: E402
from recurvit.models.speed import activation_checkpointing  # noqa: E402
from timm.models import group_parameters  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402

NAMES = sorted(timm_presets.TIMM_PRESETS)
TINY = dict(img_size=16, patch_size=4, embed_dim=48, num_heads=3, num_classes=7)
D, G, T = 48, 4, 1 + 16  # width, patch grid side, tokens with [CLS]
# other cores and options through the same timm names
VARIANTS = [
    ("bvit_tiny_patch4_32", dict(core="ode", method="rk4")),
    ("bvit_tiny_patch4_32", dict(step_cond="embed", reinject=True)),
    ("srvit_tiny_patch4_32", dict(layout="cycle", recursions=3)),
    ("srvit_tiny_patch4_32", dict(router="query")),
]
CASES = [(n, {}) for n in NAMES] + VARIANTS
CASE_IDS = [n + "".join(f"-{k}={v}" for k, v in kw.items()) for n, kw in CASES]


def shallow(name):
    """Three steps: a bViT runs its block 3 times, an SR-ViT has 3 blocks."""
    return dict(steps=3) if timm_presets.TIMM_PRESETS[name][0].startswith("bvit") else dict(depth=3)


def make(name, **kw):
    torch.manual_seed(0)
    return timm.create_model(name, **{**TINY, **shallow(name), **kw})


def x_in(batch=2):
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def patch_grid(z):
    """(B, T, D) state -> (B, D, G, G) patch grid, as forward_intermediates' NCHW."""
    return z[:, 1:].reshape(z.shape[0], G, G, -1).permute(0, 3, 1, 2)


# ------------------------------------------------------------------------------ registration
def test_registered_names_are_new_names_without_weights():
    from recurvit.models.registry import TIMM_NAME

    ours = timm.list_models(module="timm_presets")
    # the ten fixed presets, plus any shape another test (or an hf export) had timm build by its name
    assert set(NAMES) <= set(ours) and len(NAMES) == 10 and all(TIMM_NAME.match(n) for n in ours)
    assert not [n for n in ours if n.startswith("vit_")]  # timm's vit_* are timm's (our stack IS that model)
    assert not [n for n in NAMES if timm.models.is_model_pretrained(n)]
    assert set(NAMES) <= set(timm.list_models("bvit_*") + timm.list_models("srvit_*"))


@pytest.mark.slow
def test_import_recurvit_registers_once_timm_is_imported():
    """`import recurvit` imports neither torch nor timm; `import timm` afterwards registers the names."""
    code = ("import sys, recurvit; assert 'torch' not in sys.modules and 'timm' not in sys.modules; import timm; "
            "m = timm.create_model('bvit_small_patch16_224', device='meta'); "
            "assert type(m).__module__ == 'recurvit.models.vit' and m.cfg.embed_dim == 384; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_hook_registers_now_when_timm_is_imported_and_never_breaks_timm(monkeypatch):
    from recurvit import _timm_hook

    _timm_hook.install()  # timm is imported here: registers at once, adds no finder
    assert not [f for f in sys.meta_path if isinstance(f, _timm_hook._RegisterAfterTimm)]
    monkeypatch.setattr(_timm_hook, "PRESETS_MODULE", "recurvit.models.no_such_module")
    with pytest.warns(RuntimeWarning, match="could not register"):
        _timm_hook.register()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_pretrained_cfg_resolves_to_real_modules_at_the_default_shape(name):
    imagenet = name.endswith("_224")
    size, patch, classes = (224, 16, 1000) if imagenet else (32, 4, 100)
    model = timm.create_model(name, device="meta")
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (3, size, size) and cfg["fixed_input_size"] and cfg["num_classes"] == classes
    assert not cfg.get("url") and not cfg.get("hf_hub_id") and cfg["description"]
    mean, std = (timm.data.IMAGENET_DEFAULT_MEAN, timm.data.IMAGENET_DEFAULT_STD) if imagenet else \
        (timm_presets.CIFAR100_MEAN, timm_presets.CIFAR100_STD)
    assert (cfg["mean"], cfg["std"]) == (mean, std)
    assert (model.cfg.img_size, model.cfg.patch_size, model.num_classes) == (size, patch, classes)
    conv, head = model.get_submodule(cfg["first_conv"]), model.get_submodule(cfg["classifier"])
    assert isinstance(conv, nn.Conv2d) and conv.in_channels == 3 and conv.out_channels == model.embed_dim
    assert conv.kernel_size == (patch, patch)
    assert isinstance(head, nn.Linear) and (head.in_features, head.out_features) == (model.head_hidden_size, classes)
    sd = model.state_dict()
    assert cfg["first_conv"] + ".weight" in sd and cfg["classifier"] + ".weight" in sd
    data = timm.data.resolve_model_data_config(model)
    assert data["input_size"] == (3, size, size) and data["mean"] == mean


def test_cifar_stats_are_the_data_modules():
    from recurvit.data.datasets import CIFAR_STATS

    assert CIFAR_STATS["cifar100"] == (timm_presets.CIFAR100_MEAN, timm_presets.CIFAR100_STD)


# ------------------------------------------------------------------------------ same model as recurvit's
@pytest.mark.parametrize("name,kw", CASES, ids=CASE_IDS)
def test_timm_create_model_equals_recurvit_create_model(name, kw):
    preset, args = timm_presets.TIMM_PRESETS[name]
    a = make(name, **kw).eval()
    torch.manual_seed(0)
    b = recurvit.create_model(preset, **{**args, **TINY, **shallow(name), **kw}).eval()
    assert a.cfg == b.cfg
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    x = x_in()
    torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)


def test_cifar_default_shape_equals_recurvit_preset():
    torch.manual_seed(0)
    a = timm.create_model("bvit_tiny_patch4_32", drop_path_rate=0.1).eval()
    torch.manual_seed(0)
    b = recurvit.create_model("bvit_tiny", img_size=32, patch_size=4, num_classes=100, drop_path=0.1).eval()
    assert a.cfg == b.cfg and a.nominal_steps == 12
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)


# ------------------------------------------------------------------------------ timm's model tests
@pytest.mark.parametrize("name", NAMES)
def test_backward_every_parameter_gets_a_gradient(name):
    model = make(name, num_classes=42).train()
    out = model(x_in())
    assert out.shape == (2, 42) and torch.isfinite(out).all()
    out.square().mean().backward()  # not constant in the (zero-initialised) routers
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


@pytest.mark.parametrize("name", NAMES)
def test_default_cfg_contract_features_pre_logits_and_reset_classifier(name):
    model = make(name).eval()
    x = x_in()
    assert model.num_classes == 7 and model.num_features == model.head_hidden_size == model.embed_dim == D
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, T, model.num_features)  # unpooled, normed tokens
        pre = model.forward_head(feats, pre_logits=True)
        assert pre.shape == (2, model.head_hidden_size)
        torch.testing.assert_close(model.forward_head(feats), model(x))
        assert model.get_classifier() is model.head

        model.reset_classifier(0)  # no head: pooled features
        assert model.num_classes == 0 and isinstance(model.get_classifier(), nn.Identity)
        torch.testing.assert_close(model(x), pre)
        model.reset_classifier(0, "")  # no pooling either: the tokens
        assert model(x).shape == feats.shape
        model.reset_classifier(5, "token")
        assert model(x).shape == (2, 5) and model.get_classifier().out_features == 5 and model.cfg.num_classes == 5

        assert make(name, num_classes=0).eval()(x).shape == (2, D)
        assert make(name, num_classes=0, global_pool="").eval()(x).shape == (2, T, D)


def test_reset_classifier_resets_the_stage_heads_too():
    model = make("bvit_tiny_patch4_32", steps=4, stage_heads=2).eval()
    x = x_in()
    model.reset_classifier(5)
    assert len(model.stage_heads) == 1 and model.stage_heads[0].out_features == 5
    assert model(x, steps=1).shape == (2, 5) and model.forward_steps(x).shape == (4, 2, 5)
    with torch.no_grad():  # step 1 reads the stage head, step 4 the last one
        z = model.forward_features(x, steps=1)
        torch.testing.assert_close(model(x, steps=1), model.stage_heads[0](model.forward_head(z, pre_logits=True)))
    model.reset_classifier(0)
    assert model.stage_heads is None and model(x, steps=1).shape == (2, D)


@pytest.mark.parametrize("name,kw", CASES, ids=CASE_IDS)
def test_forward_intermediates_are_the_states_after_steps(name, kw):
    model = make(name, **kw).eval()
    K = model.nominal_steps
    x = x_in()
    with torch.no_grad():
        states = list(model.iter_states(x))
        final, inter = model.forward_intermediates(x)  # NCHW, every step
        assert len(inter) == len(states) == len(model.feature_info) == K
        for y, z in zip(inter, states):
            assert y.shape == (2, D, G, G)
            torch.testing.assert_close(y, patch_grid(z))
        torch.testing.assert_close(final, model.forward_features(x))
        torch.testing.assert_close(model.forward_head(final), model(x))

        nlc = model.forward_intermediates(x, indices=2, output_fmt="NLC", intermediates_only=True)
        assert [y.shape for y in nlc] == [(2, G * G, D)] * 2
        torch.testing.assert_close(nlc[0], states[K - 2][:, 1:])

        pairs = model.forward_intermediates(x, indices=[0, -1], norm=True, return_prefix_tokens=True,
                                            output_fmt="NLC", intermediates_only=True)
        assert len(pairs) == 2 and pairs[1][1].shape == (2, 1, D)
        torch.testing.assert_close(pairs[0][0], model.norm(states[0])[:, 1:])

        early_final, early = model.forward_intermediates(x, indices=[0], stop_early=True)
        assert len(early) == 1
        torch.testing.assert_close(early_final, model.forward_features(x, steps=1), atol=1e-5, rtol=1e-5)

        d = model.forward_intermediates(x, indices=1, output_dict=True, return_prefix_tokens=True)
        assert set(d) == {"image_intermediates", "image_intermediates_prefix", "image_features"}

        if model.core.limit is None:  # a recurrence runs beyond its trained depth
            deep_final, (deep,) = model.forward_intermediates(x, indices=1, steps=K + 2)
            torch.testing.assert_close(deep_final, model.forward_features(x, steps=K + 2))
            assert deep.shape == (2, D, G, G)
        with pytest.raises(ValueError, match="out of range"):
            model.forward_intermediates(x, indices=K + 1)


@pytest.mark.parametrize("name", NAMES)
def test_features_only_through_timms_feature_getter(name):
    feat = make(name, features_only=True).eval()  # default out_indices: the last 3 steps
    model = make(name).eval()
    assert type(feat).__name__ == "FeatureGetterNet"
    assert feat.feature_info.channels() == [D] * 3 and feat.feature_info.reduction() == [4] * 3
    x = x_in()
    with torch.no_grad():
        outs = feat(x)
        want = model.forward_intermediates(x, indices=3, intermediates_only=True)
    assert [o.shape for o in outs] == [(2, D, G, G)] * 3
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w)

    two = make(name, features_only=True, out_indices=(0, 1)).eval()  # pruned: runs 2 steps only
    inner = two.model
    assert inner.nominal_steps == 2 and "head.weight" not in inner.state_dict()
    uses = inner.cfg.core_cls.block_uses(inner.cfg, 2)
    assert [isinstance(b, nn.Identity) for b in inner.blocks] == [u == 0 for u in uses]
    with torch.no_grad():
        outs = two(x)
    assert len(outs) == 2
    for o, w in zip(outs, model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)):
        torch.testing.assert_close(o, w)


@pytest.mark.parametrize("name", NAMES)
def test_layer_decay_optimizer_builds_and_groups_the_shared_block_as_one_layer(name):
    model = make(name)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == len(named) == len(scale)
    s = {n: scale[id(p)] for n, p in named.items()}
    last = len(model.blocks) - 1
    assert s["patch_embed.proj.weight"] == s["pos_embed"] < s["blocks.0.attn.qkv.weight"]
    assert s["blocks.0.attn.qkv.weight"] <= s[f"blocks.{last}.mlp.fc2.weight"] < s["head.weight"] == 1.0
    assert s["norm.weight"] == s[f"blocks.{last}.norm1.weight"]
    assert all(v == s[f"blocks.{last}.norm1.weight"] for n, v in s.items() if n.startswith("core."))
    if len(model.blocks) == 1:  # ONE shared block: stem, block, head
        assert sorted(set(s.values())) == pytest.approx([0.75 ** 2, 0.75, 1.0])
    model(x_in()).square().mean().backward()
    opt.step()


def test_group_matcher_of_a_stack_is_timms():
    from timm.models.vision_transformer import VisionTransformer

    kw = dict(img_size=16, patch_size=4, num_classes=7, embed_dim=48, depth=3, num_heads=3)
    ours = recurvit.create_model("vit_tiny", **kw)
    theirs = VisionTransformer(**kw)
    assert group_parameters(ours, ours.group_matcher(), reverse=True) == \
        group_parameters(theirs, theirs.group_matcher(), reverse=True)


def test_forward_intermediates_and_pruning_of_a_stack_are_timms():
    from timm.models.vision_transformer import VisionTransformer

    kw = dict(img_size=16, patch_size=4, num_classes=7, embed_dim=48, depth=3, num_heads=3)
    ours = recurvit.create_model("vit_tiny", **kw).eval()
    theirs = VisionTransformer(**kw).eval()
    theirs.load_state_dict(ours.state_dict())
    x = x_in()
    with torch.no_grad():
        for opts in (dict(), dict(indices=2, output_fmt="NLC", norm=True), dict(indices=[0], stop_early=True)):
            (fa, ia), (fb, ib) = ours.forward_intermediates(x, **opts), theirs.forward_intermediates(x, **opts)
            torch.testing.assert_close(fa, fb, atol=1e-5, rtol=0)
            for a, b in zip(ia, ib, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        assert ours.prune_intermediate_layers([0, 1]) == theirs.prune_intermediate_layers([0, 1]) == [0, 1]
        assert list(ours.state_dict()) == list(theirs.state_dict())
        a = ours.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
        b = theirs.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    for ya, yb in zip(a, b, strict=True):
        torch.testing.assert_close(ya, yb, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="at most 2 steps"):
        ours(x, steps=3)


@pytest.mark.parametrize("name", NAMES)
def test_grad_checkpointing_leaves_logits_and_gradients_unchanged(name):
    plain, ckpt = make(name).train(), make(name).train()
    ckpt.set_grad_checkpointing()
    assert ckpt.grad_checkpointing and activation_checkpointing(ckpt)
    x = x_in()
    ya, yb = plain(x), ckpt(x)
    torch.testing.assert_close(ya, yb, atol=0, rtol=0)
    ya.square().mean().backward()
    yb.square().mean().backward()
    for (n, pa), pb in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-6, rtol=1e-5, msg=n)
    ckpt.set_grad_checkpointing(False)
    assert not ckpt.grad_checkpointing and not activation_checkpointing(ckpt)


@pytest.mark.slow
def test_registration_survives_a_find_spec_probe_before_timm_is_imported():
    """Libraries probe importlib.util.find_spec("timm") without importing it; the hook must stay."""
    import subprocess
    import sys

    code = ("import importlib.util, recurvit; importlib.util.find_spec('timm'); import timm; "
            "assert 'bvit_small_patch16_224' in timm.list_models('bvit*'), timm.list_models('bvit*')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
