"""Speed and memory of the recurrence: regional torch.compile, activation checkpointing, bf16
autocast, fused AdamW, SDPA everywhere."""
import copy

import pytest
import torch
import torch.nn.functional as F

from recurvit import create_model, list_models, model_config
from recurvit.analysis.accounting import measure_flops
from recurvit.analysis.memory import saved_tensor_bytes
from recurvit.config import TrainConfig, load_config
from recurvit.models import speed as cores
from recurvit.models.speed import (activation_checkpointing, compile_available, compile_blocks,
                                   set_activation_checkpointing)
from recurvit.models.vit import ViTConfig
from recurvit.tasks.classify.task import train
from recurvit.run.device import autocast
from recurvit.train.optim import build_optimizer

from tests.conftest import TINY

@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Tiny models: one intra-op thread (conftest.one_thread)."""


VIT_FAMILY = [n for n in list_models() if isinstance(model_config(n), ViTConfig)]
dynamo = pytest.importorskip("torch._dynamo", reason="this PyTorch has no torch._dynamo (torch.compile)")
from torch._dynamo.testing import CompileCounter  # noqa: E402


# ---------------------------------------------------------------------------------- compile
@pytest.mark.slow
def test_compiled_block_is_not_recompiled_when_the_step_count_changes():
    """The block module is compiled, the loop over steps stays python: train at 3 steps, read
    out at 7, evaluate at 5 and 24 -- one graph for training, one for no-grad evaluation."""
    dynamo.reset()
    model = create_model("bvit_tiny", **TINY, steps=3)
    cnt = CompileCounter()  # dynamo's frame counter: a compile = a new frame
    compile_blocks(model, backend=cnt)
    x = torch.randn(4, 3, 16, 16)
    model.train()
    model(x, steps=3).sum().backward()
    model.forward_steps(x, steps=7).sum().backward()
    model(x, steps=12).sum().backward()
    assert cnt.frame_count == 1
    model.eval()
    with torch.no_grad():
        for steps in (5, 24, 3):
            model(x, steps=steps)
    assert cnt.frame_count == 2  # grad mode / dropout changed the block's graph once; the steps never did

    # for contrast: compiling the whole forward bakes the step count into the graph
    dynamo.reset()
    whole = torch.compile(create_model("bvit_tiny", **TINY, steps=1), backend=(cnt_whole := CompileCounter()))
    with torch.no_grad():
        whole(x, steps=1)
        whole(x, steps=2)
    assert cnt_whole.frame_count >= 2


def test_a_stack_shares_one_compiled_block_graph():
    dynamo.reset()
    model = create_model("vit_tiny", **TINY, depth=4)
    cnt = CompileCounter()
    compile_blocks(model, backend=cnt)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    assert cnt.frame_count == 1  # 4 block modules, one graph (parameters are graph inputs)
    assert not any("_orig_mod" in k for k in model.state_dict())  # keys unchanged


_NO_COMPILE = compile_available("cpu")


@pytest.mark.slow
@pytest.mark.skipif(_NO_COMPILE is not None, reason=f"torch.compile unavailable: {_NO_COMPILE}")
def test_inductor_compiled_block_matches_eager_across_step_counts():
    dynamo.reset()
    dynamo.utils.counters.clear()
    model = create_model("bvit_tiny", **TINY, steps=3).eval()
    ref = copy.deepcopy(model)
    compile_blocks(model)  # inductor: C++ kernels on CPU
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        for steps in (3, 7):
            torch.testing.assert_close(model(x, steps=steps), ref(x, steps=steps), rtol=1e-4, atol=1e-5)
    assert dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_train_with_compile_and_checkpointing_runs_and_matches_eager(tmp_path, monkeypatch):
    """train.compile / train.activation_checkpointing plumbing (dynamo with its eager backend
    here, so no C++ compiler is needed; inductor is exercised above)."""
    cnt = CompileCounter()
    from recurvit.tasks.classify import task as classify_task  # where training compiles the blocks

    monkeypatch.setattr(classify_task, "compile_blocks", lambda model: compile_blocks(model, backend=cnt))
    monkeypatch.setattr(classify_task, "compile_available", lambda *a, **k: None)
    common = ["model.name=bvit_tiny", "model.embed_dim=24", "model.num_heads=2", "model.steps=3",
              "data.name=synthetic", "data.synthetic_train=64", "data.synthetic_test=32", "data.synthetic_size=8",
              "model.patch_size=4", "train.batch_size=32", "train.epochs=1", "train.progress=false", "train.device=cpu"]
    dynamo.reset()
    fast = train(load_config(None, common + ["train.compile=true", "train.activation_checkpointing=true"]),
                 tmp_path / "fast", log=lambda *a: None)
    plain = train(load_config(None, common), tmp_path / "plain", log=lambda *a: None)
    assert 1 <= cnt.frame_count <= 3  # training graph, evaluation graph (+ one for a new batch size)
    for key in ("train_loss", "test_loss", "test_acc"):
        assert fast[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-5), key
    cfg = (tmp_path / "fast" / "config.yaml").read_text()
    assert "compile: true" in cfg and "activation_checkpointing: true" in cfg


# ------------------------------------------------------------------ activation checkpointing
@pytest.mark.parametrize("overrides", [
    dict(name="bvit_tiny", steps=12),
    dict(name="bvit_tiny", steps=12, step_cond="scale", reinject=True, drop_path=0.1),
    dict(name="vit_tiny", depth=12),
])
def test_activation_checkpointing_flattens_memory_and_keeps_gradients(overrides):
    overrides = dict(overrides)
    name = overrides.pop("name")
    model = create_model(name, **TINY, **overrides).train()
    ckpt = copy.deepcopy(model)
    set_activation_checkpointing(ckpt)
    assert activation_checkpointing(ckpt) and not activation_checkpointing(model)
    plain_bytes = saved_tensor_bytes(model, 8, (3, 16, 16))
    ckpt_bytes = saved_tensor_bytes(ckpt, 8, (3, 16, 16))
    assert ckpt_bytes < 0.2 * plain_bytes, (ckpt_bytes, plain_bytes)  # measured: 0.10-0.13

    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 7, (8,))
    for m in (model, ckpt):
        torch.manual_seed(1)  # the same drop-path masks (checkpoint replays them in the recomputation)
        F.cross_entropy(m(x), y).backward()
    for (name_, p), q in zip(model.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name_)
    assert ckpt.state_dict().keys() == model.state_dict().keys()
    with torch.no_grad():  # evaluation is untouched
        torch.testing.assert_close(ckpt.eval()(x), model.eval()(x))
    set_activation_checkpointing(ckpt, False)
    assert not activation_checkpointing(ckpt)


def test_saved_memory_grows_with_steps_far_slower_under_checkpointing():
    per_step = {}
    for on in (False, True):
        sizes = []
        for steps in (6, 12):
            model = create_model("bvit_tiny", **TINY, steps=steps)
            set_activation_checkpointing(model, on)
            sizes.append(saved_tensor_bytes(model, 8, (3, 16, 16)))
        per_step[on] = (sizes[1] - sizes[0]) / 6
    assert per_step[True] < 0.1 * per_step[False]  # one state per step instead of a block's activations


@pytest.mark.parametrize("name,extra", [("bvit_tiny", dict(core="ode", method="midpoint", steps=3)),
                                        ("srvit_tiny", dict(depth=2))])
def test_activation_checkpointing_serves_every_core(name, extra):
    model = create_model(name, **TINY, **extra)
    ckpt = set_activation_checkpointing(copy.deepcopy(model))
    x = torch.randn(2, 3, 16, 16)
    for m in (model, ckpt):
        m(x).square().mean().backward()
    for p, q in zip(model.parameters(), ckpt.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)
    assert saved_tensor_bytes(ckpt, 2, (3, 16, 16)) < 0.5 * saved_tensor_bytes(model, 2, (3, 16, 16))


# ---------------------------------------------------------------- bf16, fused AdamW, SDPA
def test_bf16_autocast_is_opt_in_on_cpu_and_default_on_cuda():
    model = create_model("bvit_tiny", **TINY)
    x = torch.randn(2, 3, 16, 16)
    cpu = torch.device("cpu")
    with autocast(cpu, "bf16"):
        assert model(x).dtype == torch.bfloat16
    with autocast(cpu, "auto"):
        assert model(x).dtype == torch.float32
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available" on a CPU machine
        ctx = autocast(torch.device("cuda"), "auto")
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16


def test_adamw_is_fused_on_cuda():
    model = create_model("bvit_tiny", **TINY)
    assert build_optimizer(model, TrainConfig(), torch.device("cuda")).defaults["fused"] is True
    assert not build_optimizer(model, TrainConfig(), torch.device("cpu")).defaults["fused"]


@pytest.mark.parametrize("name", VIT_FAMILY)
def test_attention_runs_through_sdpa_only(name, monkeypatch):
    """Every attention of every ViT-family model is F.scaled_dot_product_attention: the forward
    has no batched matmul (an explicit q k^T would be one), and SDPA runs once per block application."""
    from recurvit.layers import attention

    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    model = create_model(name, **TINY)
    flops = measure_flops(model, (3, 16, 16), train=False)
    assert not {"bmm", "baddbmm", "matmul"} & {op.split(".")[0] for op in flops["flops_forward_by_op"]}
    assert any("scaled_dot_product" in op for op in flops["flops_forward_by_op"])
    assert len(calls) == sum(flops["block_uses"])
