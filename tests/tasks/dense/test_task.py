"""The dense task (tasks/dense/task.py) through the one loop on tiny mazes: it learns, resumes bit-identically,
trains a ViT with a dense head, is picked from the data, and runs data-parallel; Bansal et al.'s
progressive loss sends its gradient to the steps it should and nowhere else."""
import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from tests.conftest import gloo_group
from recurvit.config import load_config
from recurvit.errors import UserError
from recurvit.models import create_model
from recurvit.tasks import TASKS
from recurvit.tasks.classify.task import ClassifyTask, train
from recurvit.tasks.dense.task import DenseTask, dense_counts
from recurvit.train.losses import progressive_draw, progressive_logits, progressive_mix

MAZES = ["data.name=mazes", "data.maze_train=96", "data.maze_val=32", "data.maze_test=16", "data.maze_test_sizes=[9,13]",
         "model.steps=4", "train.batch_size=32", "train.lr=3e-3", "train.warmup_epochs=0", "train.progress=false",
         "train.device=cpu"]
TINY = MAZES + ["model.name=dt_net_recall", "model.width=8"]
VIT = MAZES + ["model.name=bvit_tiny", "model.embed_dim=24", "model.num_heads=2", "model.patch_size=4",
               "model.dense=true", "model.dynamic_img_size=true", "model.class_token=false", "model.global_pool=avg",
               "model.core=recurrent"]
QUIET = dict(log=lambda *a: None)


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one intra-op thread (conftest.one_thread)."""


def _rows(run):
    return [{k: v for k, v in json.loads(ln).items() if k not in ("train_cpu_seconds", "train_seconds", "seconds",
                                                                 "img_per_s")}
            for ln in (run / "metrics.jsonl").read_text().splitlines()]


def test_dense_counts_pixels_and_solved_images():
    target = torch.zeros(2, 3, 3, dtype=torch.long)
    target[:, 1] = 1
    logits = F.one_hot(target, 2).permute(0, 3, 1, 2).float()  # (B, C, H, W): every pixel right
    logits[1, :, 0, 0] = torch.tensor([0.0, 5.0])  # one pixel of image 1 wrong
    assert dense_counts(logits, target) == {"correct": 17, "pixels": 18, "solved": 1, "n": 2}


def test_the_task_is_chosen_from_the_data_and_refuses_the_other(tmp_path):
    assert TASKS["dense"] is DenseTask
    with pytest.raises(UserError, match="per-pixel target"):
        ClassifyTask(load_config(None, TINY)).check()
    with pytest.raises(UserError, match="per-pixel target"):
        DenseTask(load_config(None, ["data.name=digits"])).check()
    with pytest.raises(UserError, match="progressive"):
        ClassifyTask(load_config(None, ["train.depth.progressive=0.5"])).check()
    with pytest.raises(UserError, match=r"alpha\) must be in \[0, 1\]"):
        DenseTask(load_config(None, TINY + ["train.depth.progressive=1.5"])).check()
    with pytest.raises(UserError, match="model.dense=true"):  # a ViT that reads out one class an image
        train(load_config(None, VIT + ["model.dense=false"]), tmp_path / "run", **QUIET)
    # a test size the patches do not tile (11x11: 28 px) was found only at the last epoch's test, with a
    # traceback; it is one line before the first step, and the run directory is not made
    with pytest.raises(UserError, match=r"patch_size=8 does not divide every maze's side: 11x11 \(28 px\)"):
        train(load_config(None, VIT + ["model.patch_size=8", "data.maze_test_sizes=[9,11]"]), tmp_path / "r8", **QUIET)
    assert not (tmp_path / "r8").exists()


@pytest.mark.slow
def test_a_conv_anchor_learns_and_resumes_bit_identically(tmp_path):
    """Random depth, truncation and the progressive loss draw from the RNG: resuming restores every stream."""
    cfg = TINY + ["train.epochs=3", "train.depth.progressive=0.5", "train.depth.schedule=uniform",
                  "train.depth.min_steps=2", "train.depth.max_steps=5", "train.depth.truncate=3"]
    whole = train(load_config(None, cfg), tmp_path / "whole", **QUIET)
    train(load_config(None, cfg), tmp_path / "part", stop_after=1, **QUIET)
    resumed = train(load_config(tmp_path / "part" / "config.yaml"), tmp_path / "part", resume=True, **QUIET)
    rows = _rows(tmp_path / "whole")
    assert rows == _rows(tmp_path / "part")  # every figure of every epoch, exactly
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]  # it learns
    assert {"val_solved", "test_solved", "test_solved_9", "test_solved_13", "test_acc_13"} <= set(whole)
    assert resumed["test_solved_13"] == whole["test_solved_13"]
    a = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "part" / "last.pt", weights_only=True)
    assert a["task"] == "dense"
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert (tmp_path / "whole" / "best.pt").is_file()  # chosen on the validation split


@pytest.mark.slow
def test_a_dense_vit_trains_and_runs_on_larger_mazes(tmp_path):
    m = train(load_config(None, VIT + ["train.epochs=2", "model.options.reinject=true",
                                              "train.depth.progressive=0.5"]), tmp_path / "run", **QUIET)
    rows = _rows(tmp_path / "run")
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert 0 <= m["test_acc_13"] <= 1 and 0 <= m["test_solved_13"] <= 1


# ------------------------------------------------------------------------------ the progressive loss
def _recorder(model):
    """Records, for every block application, whether it ran with gradient recording on."""
    calls = []
    model.blocks[0].register_forward_hook(lambda mod, inp, out: calls.append(out.requires_grad))
    return calls


@pytest.mark.parametrize("name,kw", [("dt_net_recall", dict(width=8, steps=6)),
                                     ("bvit_tiny", dict(embed_dim=24, num_heads=2, patch_size=4, img_size=24,
                                                        num_classes=2, dense=True, core="recurrent", steps=6,
                                                        reinject=True, step_cond="embed"))])
def test_the_progressive_gradient_reaches_only_the_last_k_steps(name, kw):
    torch.manual_seed(0)
    model = create_model(name, **kw)
    x, y = torch.rand(3, 3, 24, 24), torch.randint(0, 2, (3, 24, 24))
    n, k = 2, 3
    calls = _recorder(model)
    loss = F.cross_entropy(progressive_logits(model, x, n, k), y)
    assert calls == [False] * n + [True] * k  # n steps without a graph, then k with one
    loss.backward()
    if name == "dt_net_recall":  # the state is detached after n steps: the projection gets nothing
        assert model.projection.weight.grad is None
    assert all(p.grad is not None for p in model.blocks.parameters())
    # the same gradient as k steps run by hand from the detached state after n (step count continuing)
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    state = model.core.begin(model.blocks, model.embed(x))
    with torch.no_grad():
        for _ in range(n):
            model.core.advance(state)
    z_n = state.z.detach()
    state.z = z_n.clone().requires_grad_(True)
    start = state.z
    for _ in range(k):
        z = model.core.advance(state)
    F.cross_entropy(model.forward_head(model.norm(z), step=n + k), y).backward()
    for p_name, g in grads.items():
        torch.testing.assert_close(dict(model.named_parameters())[p_name].grad, g)
    assert start.grad is not None  # (what the detach cuts: the progressive loss never reaches it)
    # and the logits are those of the full forward at n + k steps
    with torch.no_grad():
        torch.testing.assert_close(progressive_logits(model, x, n, k), model(x, steps=n + k))


def test_progressive_draws_and_mix():
    g = torch.Generator().manual_seed(0)
    draws = [progressive_draw(5, g) for _ in range(400)]
    assert {n for n, _ in draws} == set(range(5))  # n in 0..K-1
    assert all(1 <= k <= 5 - n for n, k in draws)  # k in 1..K-n
    a, b = torch.tensor(2.0), torch.tensor(4.0)
    assert progressive_mix(a, b, 0.25).item() == pytest.approx(2.5)
    assert progressive_mix(a, None, 0.0) is a and progressive_mix(None, b, 1.0) is b


# ---------------------------------------------------------------------------------------- DDP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, overrides, out):
    with gloo_group(rank, world, port):
        train(load_config(None, overrides), out, stop_after=1, **QUIET)
        train(load_config(out + "/config.yaml"), out, resume=True, **QUIET)


@pytest.mark.slow
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
def test_two_gloo_processes_follow_the_one_process_run(tmp_path):
    cfg = TINY + ["train.epochs=2", "train.depth.progressive=0.5", "train.seed=1"]
    train(load_config(None, cfg), tmp_path / "single", **QUIET)
    mp.spawn(_worker, args=(2, _free_port(), cfg, str(tmp_path / "ddp")), nprocs=2, join=True)
    one, two = _rows(tmp_path / "single"), _rows(tmp_path / "ddp")
    assert [r["epoch"] for r in two] == [1, 2]
    for a, b in zip(one, two):
        for key in ("train_loss", "val_loss", "val_acc"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["epoch"], key)


# ------------------------------------------------------------------------------------ the configs
def test_every_maze_config_builds_its_model_and_the_vit_matches_the_anchor():
    from pathlib import Path

    from recurvit.run.loaders import resolve_model_config
    from recurvit.run import checkpoint as ckpt_io

    root = Path(__file__).resolve().parents[3] / "src/recurvit/configs/mazes"
    params = {}
    for path in sorted(root.glob("*.yaml")):
        cfg = load_config(path)
        DenseTask(cfg).check()
        info = type("Info", (), dict(img_size=24, in_chans=3, num_classes=2))
        model = ckpt_io.build_model_from_config(resolve_model_config(cfg, info))
        assert model(torch.rand(1, 3, 32, 32)).shape == (1, 2, 32, 32)  # a larger maze runs
        params[path.stem] = sum(p.numel() for p in model.parameters())
    regimes = {name.split("_", 1)[1] for name in params  # the regimes with both a conv and a ViT config
               if {f"dt_{name.split('_', 1)[1]}", f"vit_{name.split('_', 1)[1]}"} <= set(params)}
    assert {"naive", "recall", "recall_prog", "random_depth", "deep_supervision"} <= regimes
    assert params["vit_rope_recall_prog"] == params["vit_recall_prog"] - 144 * 32  # the position ablation: no embedding
    assert params["vit_mixffn_recall_prog"] == params["vit_rope_recall_prog"] + 128 * 10  # + 3x3 depthwise kernels, biases
    for regime in regimes - {"naive"}:  # recall regimes: equal parameters within 10%
        assert abs(params[f"vit_{regime}"] / params[f"dt_{regime}"] - 1) < 0.1, regime


def test_the_progressive_loss_on_softmor_keeps_the_routers_graph_for_every_pass():
    """SoftMoR's cycle layout steps too: the first n passes run their blocks without a graph, but the router
    scores of those passes still enter the mixture the readout reads, so the router's per-pass prior gets a
    gradient for every pass (as under truncated backprop), while the blocks get it from the last k only."""
    torch.manual_seed(0)
    model = create_model("srvit_tiny", img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=24,
                         num_heads=2, depth=2, recursions=4, layout="cycle")
    with torch.no_grad():
        model.core.bias.add_(0.1 * torch.randn_like(model.core.bias))
    x = torch.rand(3, 3, 16, 16)
    progressive_logits(model, x, 2, 2).sum().backward()
    assert (model.core.bias.grad[0] != 0).all()  # a prior for each of the 4 passes
    with torch.no_grad():
        torch.testing.assert_close(progressive_logits(model, x, 2, 2), model(x, steps=4))
