"""DeepThinking's recurrent convolutional network (models/dtnet.py, layers/conv_block.py) on recurvit's cores:
DeepThinking's parameter count and recall, any image size, and what the core conformance suite checks of
a core (one pass = stepping by hand, block calls = block_uses, the step each call is told), for the cores
a convolutional state runs on."""
import pytest
import torch
import torch.nn.functional as F

from recurvit import create_model
from recurvit.models.dtnet import DTNetConfig


def _x(size=24, batch=2, seed=1):
    return torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _small(name="dt_net_recall", **kw):
    torch.manual_seed(0)
    return create_model(name, **{"width": 8, "steps": 3, **kw}).eval()


def test_parameter_counts_are_deepthinkings():
    """dt_net_recall_2d at width 128 (config/problem/mazes.yaml): a 3x3 projection, a 3x3 recall conv over
    [state, input], 2 basic blocks (4 3x3 convs), a head 128 -> 32 -> 8 -> 2, no biases."""
    w, c = 128, 3
    head = 9 * (w * 32 + 32 * 8 + 8 * 2)
    recall = 9 * c * w + 9 * (w + c) * w + 4 * 9 * w * w + head
    assert sum(p.numel() for p in create_model("dt_net_recall").parameters()) == recall == 783_504
    assert sum(p.numel() for p in create_model("dt_net").parameters()) == recall - 9 * (w + c) * w == 632_592
    cfg = create_model("dt_net_recall").cfg
    assert (cfg.width, cfg.steps, cfg.core, cfg.embed_dim) == (128, 30, "recurrent", 131)


def test_recall_is_deepthinkings_loop():
    """DeepThinking's forward: thought = relu(proj(x)); each iteration thought = recur(cat([thought, x])),
    out = head(thought); here the same modules driven by the recurrent core, read out after every step."""
    m = _small(steps=4)
    x = _x()
    blk = m.blocks[0]
    with torch.no_grad():
        got = m.forward_steps(x)
        thought, ref = F.relu(m.projection(x)), []
        for _ in range(4):
            thought = blk.layers(blk.recall(torch.cat([thought, x], 1)))
            ref.append(m.head(thought))
    torch.testing.assert_close(got, torch.stack(ref), rtol=1e-5, atol=1e-6)
    plain = _small("dt_net", steps=4)
    with torch.no_grad():  # without recall the block never sees the input again
        thought = F.relu(plain.projection(x))
        for _ in range(4):
            thought = plain.blocks[0].layers(thought)
        torch.testing.assert_close(plain(x), plain.head(thought), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dt_net_recall", "dt_net"])
def test_a_model_built_at_one_size_runs_at_any_other(name):
    m = _small(name, img_size=24)
    with torch.no_grad():
        for h, w in ((24, 24), (40, 40), (72, 72), (24, 40)):
            out = m(torch.rand(1, 3, h, w))
            assert out.shape == (1, 2, h, w) and torch.isfinite(out).all()
        steps = m.forward_steps(_x(40), steps=5)  # beyond the trained steps, at a larger size
    assert steps.shape == (5, 2, 2, 40, 40)
    with torch.no_grad():
        torch.testing.assert_close(steps[4], m(_x(40), steps=5))


CASES = [("recurrent", {}), ("recurrent", {"step_cond": "embed", "reinject": True}),
         ("recurrent", {"step_cond": "scale"}), ("stack", {"depth": 3}), ("ode", {"method": "rk4"})]


@pytest.mark.parametrize("core,opts", CASES, ids=[c + "".join(f"-{k}={v}" for k, v in o.items()) for c, o in CASES])
def test_the_cores_run_the_conv_block_as_they_run_a_transformer_block(core, opts):
    """The conformance suite's checks (tests/models/cores/test_conformance.py) on the convolutional block."""
    m = _small(core=core, **opts)
    cls, x, T = m.cfg.core_cls, _x(), m.nominal_steps
    counts, told = [0] * len(m.blocks), []

    def count(i):
        def hook(_m, _a, kwargs):
            counts[i] += 1
            told.append(kwargs.get("step"))
        return hook

    hooks = [b.register_forward_pre_hook(count(i), with_kwargs=True) for i, b in enumerate(m.blocks)]
    with torch.no_grad():
        states = list(m.iter_states(x, T))
        assert counts == cls.block_uses(m.cfg, T) and m.nfe == sum(counts)
        assert len(m.blocks) == cls.num_blocks(m.cfg)
        if cls.cannot_step(m.cfg) is None:
            told.clear()
            s = m.core.begin(m.blocks, m.embed(x))
            by_hand = [m.core.advance(s).clone() for _ in range(T)]
            for k, (a, b) in enumerate(zip(states, by_hand), 1):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"step {k}")
            calls = cls.calls_per_step(m.cfg) or 1
            assert told == [k for k in range(1, T + 1) for _ in range(calls)]
    for h in hooks:
        h.remove()
    assert states[-1].shape == (2, 24, 24, m.cfg.embed_dim)
    if m.cfg.recall:  # the input rides along in the state, unchanged, whatever the core
        torch.testing.assert_close(states[-1][..., 8:], x.permute(0, 2, 3, 1))


def test_every_parameter_gets_a_gradient_and_truncation_cuts_the_prefix():
    m = _small(steps=4).train()
    x, y = _x(), torch.randint(0, 2, (2, 24, 24), generator=torch.Generator().manual_seed(2))
    F.cross_entropy(m(x), y).backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n
    m.zero_grad()
    seen = []
    h = m.blocks[0].register_forward_hook(lambda _m, _a, out: seen.append(out.requires_grad))
    F.cross_entropy(m.forward_head(m.forward_features(x, grad_last=1)), y).backward()
    h.remove()
    assert seen == [False, False, False, True]
    assert m.projection.weight.grad is None  # the graph starts after the last no-grad step


def test_bad_options_are_errors():
    with pytest.raises(ValueError, match="width must be >= 1"):
        DTNetConfig(width=0)
    with pytest.raises(ValueError, match="method does not apply to the recurrent core"):
        create_model("dt_net_recall", method="rk4")
