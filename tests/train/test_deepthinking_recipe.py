"""DeepThinking's training recipe as library options (issue 55), each checked against what DeepThinking's
own code does (aks2203/deep-thinking: utils/tools.py get_optimizer, utils/warmup.py ExponentialWarmup,
utils/training.py train_progressive, utils/testing.py get_predicted): the shared block at lr / T, Adam with
coupled L2, an exponential warmup and a step schedule set once an epoch, the loss over open pixels only,
DeepThinking's solved figure choosing best.pt, and kept epochs for a budget curve."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from recurvit.config import load_config
from recurvit.errors import UserError
from recurvit.models import create_model
from recurvit.run.load import load
from recurvit.tasks.classify.task import ClassifyTask, train
from recurvit.tasks.dense.task import dense_counts, open_pixels, pixel_loss
from recurvit.train.optim import build_optimizer, build_scheduler, lr_factor

MAZES = ["data.name=mazes", "data.maze_train=64", "data.maze_val=32", "data.maze_test=16", "data.maze_test_sizes=[9]",
         "model.name=dt_net_recall", "model.width=8", "model.steps=4", "train.batch_size=32", "train.progress=false",
         "train.device=cpu"]
DT = ["train.optimizer=adam_l2", "train.weight_decay=2e-4", "train.lr_throttle=true", "train.warmup=exponential",
      "train.warmup_epochs=10", "train.lr_schedule=step", "train.lr_milestones=[100]", "train.grad_clip=0",
      "train.loss_mask=open", "train.solved=open", "train.depth.progressive=0.01"]
QUIET = dict(log=lambda *a: None)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one intra-op thread (conftest.one_thread)."""


def _lrs(opt):
    return [g["lr"] for g in opt.param_groups]


def test_lr_throttle_trains_the_shared_block_at_lr_over_T_and_nothing_else():
    cfg = load_config(None, MAZES + ["model.steps=30", "train.lr_throttle=true", "train.lr=1e-3"])
    model = create_model("dt_net_recall", width=8, steps=30)
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    by_param = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        # DeepThinking: "recur" parameters (recall conv + residual blocks) at lr / max_iters, the rest at lr
        assert by_param[id(p)] == pytest.approx(1e-3 / 30 if name.startswith("blocks.") else 1e-3), name
    assert sum(name.startswith("blocks.") for name, _ in model.named_parameters()) > 0
    plain = build_optimizer(model, load_config(None, MAZES).train, torch.device("cpu"))
    assert len(plain.param_groups) == 2 and set(_lrs(plain)) == {load_config(None, MAZES).train.lr}
    half = build_optimizer(model, load_config(None, MAZES + ["train.block_lr_scale=0.5"]).train, torch.device("cpu"))
    assert sorted(set(_lrs(half))) == [0.5 * cfg.train.lr, cfg.train.lr]


def test_adam_l2_adds_the_decay_to_the_gradient_and_adamw_does_not():
    torch.manual_seed(0)
    w0 = torch.randn(4, 3, 3, 3)
    grad = torch.randn_like(w0)
    lr, wd = 1e-2, 0.1

    def one_step(optimizer):
        model = torch.nn.Conv2d(3, 4, 3, bias=False)
        model.weight.data.copy_(w0)
        cfg = load_config(None, [f"train.optimizer={optimizer}", f"train.weight_decay={wd}", f"train.lr={lr}"]).train
        opt = build_optimizer(model, cfg, torch.device("cpu"))
        model.weight.grad = grad.clone()
        opt.step()
        return type(opt), model.weight.data

    kind, w = one_step("adam_l2")
    assert kind is torch.optim.Adam
    g = grad + wd * w0  # coupled L2: the decay enters Adam's moments; after one step m/sqrt(v) = sign(g)
    assert torch.allclose(w, w0 - lr * g / (g.abs() + 1e-8), atol=1e-6)
    kind, w = one_step("adamw")
    assert kind is torch.optim.AdamW
    assert torch.allclose(w, w0 * (1 - lr * wd) - lr * grad / (grad.abs() + 1e-8), atol=1e-6)


def test_exponential_warmup_is_deepthinkings_set_once_an_epoch():
    cfg = load_config(None, ["train.warmup=exponential", "train.warmup_epochs=10", "train.lr_schedule=step",
                             "train.lr_milestones=[100]"]).train
    per_epoch = 7
    for epoch in range(14):
        want = 1.0 if epoch + 1 >= 10 else 1.0 - math.exp(-(epoch + 1) / 10)  # warmup.py: 1 - exp(-(step+1)/period)
        assert [lr_factor(cfg, epoch * per_epoch + i, per_epoch) for i in range(per_epoch)] == [pytest.approx(want)] * per_epoch
    assert lr_factor(cfg, 0, per_epoch) == pytest.approx(0.0951626, abs=1e-6)
    assert lr_factor(cfg, 8 * per_epoch, per_epoch) == pytest.approx(0.5934303, abs=1e-6)


def test_step_schedule_decays_at_each_milestone_epoch_and_the_scheduler_follows():
    cfg = load_config(None, ["train.warmup_epochs=0", "train.lr_schedule=step", "train.lr_milestones=[2,4]",
                             "train.lr_factor=0.1", "train.lr=1.0", "train.epochs=6"]).train
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg, iters_per_epoch=3)
    seen = []
    for _ in range(18):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([1.0] * 6 + [0.1] * 6 + [0.01] * 6)


def test_the_masked_loss_reads_open_pixels_only():
    x = torch.zeros(2, 3, 4, 4)
    x[:, :, 1:3, 1:3] = 1.0  # open squares; the rest is wall (black)
    x[0, 1, 0, 0] = 1.0  # a green start pixel counts as open too
    mask = open_pixels(x)
    assert mask.sum() == 9 and mask[0, 0, 0] and not mask[1, 0, 0]
    torch.manual_seed(0)
    logits, y = torch.randn(2, 2, 4, 4), torch.randint(0, 2, (2, 4, 4))
    per = F.cross_entropy(logits, y, reduction="none")
    assert pixel_loss(logits, y, mask) == pytest.approx(float(per[mask].mean()))
    other = logits.clone()
    other[~mask.unsqueeze(1).expand_as(other)] = 50.0  # anything on the walls
    assert pixel_loss(other, y, mask) == pytest.approx(float(pixel_loss(logits, y, mask)))
    assert pixel_loss(logits, y) == pytest.approx(float(per.mean()))


def test_deepthinkings_solved_ignores_walls_and_the_strict_one_does_not():
    x = torch.zeros(1, 3, 3, 3)
    x[:, :, 1] = 1.0  # the middle row is open
    target = torch.zeros(1, 3, 3, dtype=torch.long)
    target[:, 1] = 1
    logits = F.one_hot(target, 2).permute(0, 3, 1, 2).float()
    logits[0, :, 0, 0] = torch.tensor([0.0, 5.0])  # "path" predicted on a wall
    c = dense_counts(logits, target, open_pixels(x))
    assert (c["solved"], c["solved_open"]) == (0, 1)
    logits[0, :, 1, 1] = torch.tensor([5.0, 0.0])  # an open path pixel wrong
    assert dense_counts(logits, target, open_pixels(x))["solved_open"] == 0


def test_a_run_on_the_recipe_trains_chooses_best_on_open_solved_and_keeps_epochs(tmp_path):
    cfg = load_config(None, MAZES + DT + ["train.epochs=2", "train.keep_every=1", "train.lr=3e-3"])
    out = tmp_path / "run"
    train(cfg, out, **QUIET)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx([3e-3 * (1 - math.exp(-k / 10)) for k in (2, 3)])
    assert all("val_solved_open" in r and "train_solved_open" in r for r in rows)
    assert "test_solved_open_9" in rows[-1]
    best = torch.load(out / "best.pt", weights_only=True)
    assert best["val_solved_open"] == max(r["val_solved_open"] for r in rows)
    kept = sorted(p.name for p in out.glob("epoch_*.pt"))
    assert kept == ["epoch_0001.pt", "epoch_0002.pt"]
    model = load(out / "epoch_0001.pt").model
    ref = torch.load(out / "epoch_0001.pt", weights_only=True)["model"]
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())
    last = torch.load(out / "last.pt", weights_only=True)
    groups = last["optimizer"]["param_groups"]
    assert sorted({g["lr_scale"] for g in groups if "lr_scale" in g}) == [pytest.approx(1 / 4)]  # lr / T, T = 4


def test_resume_continues_the_recipe_bit_identically_and_refuses_a_new_block_lr(tmp_path):
    cfg = load_config(None, MAZES + DT + ["train.epochs=2"])
    full, part = tmp_path / "full", tmp_path / "part"
    train(cfg, full, **QUIET)
    train(cfg, part, stop_after=1, **QUIET)
    train(load_config(part / "config.yaml"), part, resume=True, **QUIET)
    a, b = torch.load(full / "last.pt", weights_only=True), torch.load(part / "last.pt", weights_only=True)
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    with pytest.raises(UserError, match="train.lr_throttle"):
        train(load_config(part / "config.yaml", ["train.epochs=3", "train.lr_throttle=false"]), part, resume=True,
              **QUIET)


def test_the_recipe_options_are_checked_in_one_line():
    with pytest.raises(UserError, match="train.optimizer must be one of adamw, adam_l2"):
        load_config(None, ["train.optimizer=sgd"])
    with pytest.raises(UserError, match="train.block_lr_scale must be a finite number > 0"):
        ClassifyTask(load_config(None, ["train.block_lr_scale=0"])).check()
    with pytest.raises(UserError, match="train.lr_milestones"):
        ClassifyTask(load_config(None, ["train.lr_milestones=[-1]"])).check()
    with pytest.raises(UserError, match="train.loss_mask=open is the dense task's"):
        ClassifyTask(load_config(None, ["train.loss_mask=open"])).check()
    with pytest.raises(UserError, match="train.keep_every"):
        ClassifyTask(load_config(None, ["train.keep_every=-1"])).check()


def test_the_anchor_config_holds_deepthinkings_values():
    cfg = load_config("mazes/dt_recall_deepthinking")
    t, m, d = cfg.train, cfg.model, cfg.data
    assert (m.name, m.steps, d.maze_size, d.maze_train) == ("dt_net_recall", 30, 9, 40000)
    assert (t.epochs, t.batch_size, t.lr, t.optimizer, t.weight_decay) == (50, 50, 1e-3, "adam_l2", 2e-4)
    assert (t.lr_throttle, t.warmup, t.warmup_epochs, t.lr_schedule, list(t.lr_milestones), t.lr_factor) == \
        (True, "exponential", 10, "step", [100], 0.1)
    assert (t.grad_clip, t.loss_mask, t.solved, t.depth.progressive, t.amp) == (0, "open", "open", 0.01, "off")


# ------------------------------------------------------------------ the bounded recurrence (issue 55)
VIT = ["data.name=mazes", "data.maze_train=64", "data.maze_val=32", "data.maze_test=16", "data.maze_test_sizes=[9]",
       "model.name=bvit_tiny", "model.embed_dim=16", "model.num_heads=2", "model.patch_size=4", "model.dense=true",
       "model.dynamic_img_size=true", "model.class_token=false", "model.global_pool=avg", "model.pos_embed=none",
       "model.mlp_conv=true", "model.reinject=true", "model.steps=4", "train.batch_size=32", "train.progress=false",
       "train.device=cpu", "train.warmup_epochs=0"]


def _vit(**kw):
    torch.manual_seed(0)
    return create_model("bvit_tiny", img_size=24, in_chans=3, num_classes=2, embed_dim=16, num_heads=2, patch_size=4,
                        dense=True, class_token=False, global_pool="avg", pos_embed="none", mlp_conv=True,
                        reinject=True, steps=4, **kw)


def test_stepped_logits_from_the_embedding_are_forward_steps_and_a_random_start_is_not():
    from recurvit.train.losses import random_start, stepped_logits
    model = _vit().eval()
    x = torch.rand(2, 3, 24, 24)
    with torch.no_grad():
        ref = model.forward_steps(x, steps=4, at=[2, 4])
        assert torch.equal(stepped_logits(model, x, 4, [2, 4]), ref)
        noisy = stepped_logits(model, x, 4, [2, 4], start_gen=torch.Generator().manual_seed(1))
    assert noisy.shape == ref.shape and not torch.allclose(noisy, ref)
    z = torch.randn(3, 5, 7) * 4.0
    r = random_start(z, torch.Generator().manual_seed(0))
    assert r.shape == z.shape and float(r.pow(2).mean().sqrt()) == pytest.approx(float(z.pow(2).mean().sqrt()), rel=0.2)


def test_a_damped_euler_step_on_the_state_subtracted_field_is_a_fixed_point_iteration():
    """The bounded recurrence: euler with h < 1 on dz/dt = F(z) - z is z + h (F(z) - z) = (1 - h) z + h F(z),
    the Krasnoselskii-Mann iteration of F, which rests exactly where z = F(z)."""
    h = 0.5
    model = _vit(core="ode", field="state_subtracted", method="euler", t_end=4 * h).eval()
    x = torch.rand(2, 3, 24, 24)
    with torch.no_grad():
        states = list(model.iter_states(x, 4))
        z, x0 = model.embed(x), model.embed(x)
        block = model.blocks[0]
        for k in range(4):
            F_z = model.core.cond(block, z, k, x0, step=k + 1)  # the block's output: F(z) (with re-injection)
            z = (1 - h) * z + h * F_z
            assert torch.allclose(states[k], z, atol=1e-5), k


def test_random_start_trains_the_maze_vit_and_is_refused_where_the_input_would_be_lost(tmp_path):
    cfg = load_config(None, VIT + ["train.epochs=1", "train.depth.random_start=0.5", "train.depth.progressive=0.01",
                                   "model.core=ode", "model.method=euler", "model.t_end=2"])
    result = train(cfg, tmp_path / "run", **QUIET)
    assert 0 <= result["val_solved"] <= 1
    assert "random_start_rng" in torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    with pytest.raises(UserError, match="random_start starts the recurrence from noise.*reinject"):
        train(load_config(None, VIT + ["train.epochs=1", "train.depth.random_start=0.5", "model.reinject=false"]),
              tmp_path / "no", **QUIET)
    with pytest.raises(UserError, match=r"random_start \(a probability\) must be in \[0, 1\]"):
        train(load_config(None, VIT + ["train.depth.random_start=2"]), tmp_path / "bad", **QUIET)
