"""The ViT's dense head (per-pixel logits from every patch token) and inputs larger than training
(dynamic_img_size: the learned position embedding resampled to the input's grid, as timm does)."""
import pytest
import timm
import torch
import torch.nn.functional as F

from conftest import TINY
from recurvit import create_model
from recurvit.analysis.accounting import analytic_flops, measure_flops

MAZE = dict(img_size=24, patch_size=2, in_chans=3, num_classes=2, embed_dim=48, num_heads=3)


def _x(size, batch=2, seed=1):
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _dense(**kw):
    torch.manual_seed(0)
    return create_model("bvit_tiny", **{**MAZE, "steps": 3, "dense": True, **kw}).eval()


def test_the_dense_head_gives_logits_per_pixel_after_every_step():
    m = _dense()
    x = _x(24)
    with torch.no_grad():
        out, steps = m(x), m.forward_steps(x, steps=4)
        assert out.shape == (2, 2, 24, 24) and steps.shape == (4, 2, 2, 24, 24)
        torch.testing.assert_close(steps[2], out)
        torch.testing.assert_close(steps[3], m(x, steps=4))
    assert m.head.out_features == 2 * 2 * 2  # each token: its 2 x 2 pixels, 2 classes


def test_unpatchify_puts_each_tokens_outputs_on_its_pixels():
    m, g, p, C = _dense(), 12, 2, 2
    tok, a, c, k = torch.meshgrid(torch.arange(g * g), torch.arange(p), torch.arange(p), torch.arange(C), indexing="ij")
    y = (tok * 1000 + a * 100 + c * 10 + k).float().reshape(1, g * g, p * p * C)
    out = m.unpatchify(y)
    assert out.shape == (1, C, g * p, g * p)
    for cls, row, col in ((0, 0, 0), (1, 5, 8), (0, 23, 22), (1, 13, 2)):
        i, j = divmod(row, p)[0], divmod(col, p)[0]
        assert out[0, cls, row, col] == (i * g + j) * 1000 + (row % p) * 100 + (col % p) * 10 + cls


def test_a_model_built_at_one_size_runs_at_a_larger_one():
    m = _dense(dynamic_img_size=True)
    fixed = _dense()
    fixed.load_state_dict(m.state_dict())  # same parameters: resampling is computed, not stored
    with torch.no_grad():
        assert torch.equal(m(_x(24)), fixed(_x(24)))  # at the built size nothing is resampled
        for size in (40, 72):  # 9x9 -> 17x17 -> 33x33 mazes
            out = m.forward_steps(_x(size), steps=5)
            assert out.shape == (5, 2, 2, size, size) and torch.isfinite(out).all()
    with pytest.raises(RuntimeError):
        fixed(_x(40))  # without dynamic_img_size the position embedding does not fit
    y = torch.randint(0, 2, (2, 40, 40))
    m.train()
    F.cross_entropy(m(_x(40)), y).backward()
    assert m.pos_embed.grad is not None and m.pos_embed.grad.abs().sum() > 0


def test_the_position_embedding_is_resampled_as_timm_does():
    torch.manual_seed(0)
    ours = create_model("vit_tiny", **TINY, depth=2, dynamic_img_size=True).eval()
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=48, depth=2, num_heads=3,
        dynamic_img_size=True).eval()
    ref.load_state_dict(ours.state_dict())
    with torch.no_grad():
        x = _x(32)
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-5)


def test_the_dense_heads_flops_are_counted_as_stated():
    m = _dense()
    for steps in (1, 3):
        counted = measure_flops(m, (3, 24, 24), steps=steps, train=False)["flops_forward"]
        assert counted == analytic_flops(m.cfg, steps)
