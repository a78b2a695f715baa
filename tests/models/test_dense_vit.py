"""The ViT's dense head (per-pixel logits from every patch token) and inputs larger than training
(dynamic_img_size: the learned position embedding resampled to the input's grid, as timm does)."""
import pytest
import timm
import torch
import torch.nn.functional as F

from tests.conftest import TINY
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


def test_rope_scores_depend_on_the_tokens_offset_alone_on_any_grid():
    """pos_embed=rope: the same two tokens placed at the same offset give the same attention logit q.k on a
    4x4 grid and anywhere on a 7x7 one (what lets a block trained on small mazes attend alike on large ones);
    a learned absolute embedding has no such identity (it is added to the tokens)."""
    from recurvit.layers.attention import Attention

    torch.manual_seed(0)
    att = Attention(16, num_heads=2, rope=True).eval()
    small, big = torch.randn(1, 16, 16), torch.randn(1, 49, 16)
    a, b = (0, 1), (2, 3)  # two tokens of the 4x4 grid (row, col), offset (2, 2)
    for shift in ((0, 0), (3, 2), (1, 3)):
        for (r, c) in (a, b):
            big[0, (r + shift[0]) * 7 + c + shift[1]] = small[0, r * 4 + c]

        def logit(x, g, u, v):
            q, k, _ = att._qk(att.qkv(x).reshape(1, g * g, 3, 2, 8).permute(2, 0, 3, 1, 4))
            return (q[0, :, u] * k[0, :, v]).sum(-1)

        i, j = a[0] * 4 + a[1], b[0] * 4 + b[1]
        I, J = (a[0] + shift[0]) * 7 + a[1] + shift[1], (b[0] + shift[0]) * 7 + b[1] + shift[1]
        torch.testing.assert_close(logit(small, 4, i, j), logit(big, 7, I, J))
    moved = big.clone()  # the same two tokens one column further apart: another offset, another logit
    J2 = J + 1
    moved[0, J2] = big[0, J]
    assert not torch.allclose(logit(big, 7, I, J), logit(moved, 7, I, J2))
    with pytest.raises(ValueError, match="square grid"):
        att(torch.randn(1, 15, 16))


def test_the_mix_ffn_convolves_the_patch_grid_and_leaves_prefix_tokens_alone():
    from recurvit.layers.mlp import Mlp

    torch.manual_seed(0)
    mlp = Mlp(8, 12, conv=True, num_prefix_tokens=1).eval()
    x = torch.randn(2, 1 + 5 * 5, 8)
    h = mlp.fc1(x)
    grid = F.conv2d(h[:, 1:].reshape(2, 5, 5, 12).permute(0, 3, 1, 2), mlp.dwconv.weight, mlp.dwconv.bias,
                    padding=1, groups=12)  # by hand: the tokens in row-major order on a 5 x 5 grid
    want = mlp.fc2(F.gelu(torch.cat([h[:, :1], grid.flatten(2).transpose(1, 2)], dim=1)))
    torch.testing.assert_close(mlp(x), want)
    far = x.clone()
    far[:, 1 + 4 * 5 + 4] += 1.0  # the bottom-right token moves: its neighbour changes, a token 2 away does not
    out, moved = mlp(x), mlp(far)
    assert not torch.allclose(out[:, 1 + 3 * 5 + 3], moved[:, 1 + 3 * 5 + 3])
    torch.testing.assert_close(out[:, 1 + 2 * 5 + 2], moved[:, 1 + 2 * 5 + 2])
    torch.testing.assert_close(out[:, 0], moved[:, 0])  # the class token: fc1, fc2 of itself only
    with pytest.raises(ValueError, match="square grid"):
        mlp(torch.randn(1, 1 + 15, 8))


@pytest.mark.parametrize("kw", [dict(mlp_conv=True, pos_embed="none"), dict(pos_embed="rope"), dict()],
                         ids=["mix-ffn", "rope", "dense"])
def test_a_non_square_grid_is_refused_where_tokens_are_read_as_a_square(kw):
    m = _dense(dynamic_img_size=True, **kw)  # 16 x 64 px: 8 x 32 patches, 256 tokens, a square count
    with pytest.raises(ValueError, match="reads a square grid of patches; got 8 x 32"):
        m(torch.rand(1, 3, 16, 64))
    flat = create_model("bvit_tiny", **{**MAZE, "steps": 2, "dynamic_img_size": True}).eval()
    assert flat(torch.rand(1, 3, 16, 64)).shape == (1, 2)  # a classifier with a learned embedding: any grid


def _runs_and_learns_larger(m, weight):
    """``m`` (built at 24 px) steps on a 72 px maze as one pass does, and a 40 px batch's loss reaches ``weight()``."""
    with torch.no_grad():
        out = m.forward_steps(_x(72), steps=4)
        assert out.shape == (4, 2, 2, 72, 72) and torch.isfinite(out).all()
        torch.testing.assert_close(out[2], m(_x(72)))
    m.train()
    F.cross_entropy(m(_x(40)), torch.randint(0, 2, (2, 40, 40))).backward()
    assert weight().grad.abs().sum() > 0


def test_a_mix_ffn_model_without_position_scheme_runs_and_learns_at_a_larger_size():
    m, learned = _dense(pos_embed="none", mlp_conv=True), _dense()
    assert m.pos_embed is None and m.blocks[0].mlp.dwconv.weight.shape == (4 * 48, 1, 3, 3)
    extra = sum(p.numel() for p in m.parameters()) - sum(p.numel() for p in learned.parameters())
    assert extra == 4 * 48 * 10 - (1 + 144) * 48  # the depthwise kernels and biases in; the embedding (class token, 12 x 12) out
    _runs_and_learns_larger(m, lambda: m.blocks[0].mlp.dwconv.weight)


def test_a_rope_model_has_no_absolute_embedding_and_runs_and_learns_at_a_larger_size():
    m = _dense(pos_embed="rope")  # no dynamic_img_size needed: nothing is stored per position
    learned = _dense()
    assert m.pos_embed is None and "pos_embed" not in m.state_dict()
    assert set(learned.state_dict()) - set(m.state_dict()) == {"pos_embed"}
    _runs_and_learns_larger(m, lambda: m.blocks[0].attn.qkv.weight)
    with pytest.raises(ValueError, match="pos_embed must be one of learned, rope, none"):
        _dense(pos_embed="sincos")
    with pytest.raises(ValueError, match="divisible by 4"):
        _dense(pos_embed="rope", embed_dim=36, num_heads=6)  # a head dim of 6
