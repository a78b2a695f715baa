"""LoRA / step-LoRA adapters and `recurvit finetune`: zero-init identity, gradients, merging, step selection."""
import copy
import json

import pytest
import torch

from tests.conftest import TINY
from recurvit import create_model, load
from recurvit.cli import main
from recurvit.errors import UserError
from recurvit.layers.lora import LoRALinear, add_lora, lora_layers, lora_parameters, merge_lora
from recurvit.models.adapters import unroll_step_lora
from recurvit.tasks.classify.finetune import prepare


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add contention on a shared machine
    yield
    torch.set_num_threads(n)


def _bvit(**kw):
    return create_model("bvit_tiny", **{**TINY, "steps": 3, **kw}).eval()


def _randomize(model, std=0.05):
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in lora_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) * std)


@pytest.mark.parametrize("method", ["lora", "step_lora"])
def test_zero_init_is_identity_and_only_adapters_get_gradients(method):
    m = _bvit()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        ref = m.forward_steps(x)
    for p in m.parameters():
        p.requires_grad_(False)
    add_lora(m.blocks, rank=2, num_adapters=3 if method == "step_lora" else 1)
    assert {type(m.blocks[0].attn.qkv), type(m.blocks[0].mlp.fc2)} == {LoRALinear}
    assert torch.equal(m.forward_steps(x), ref)  # B = 0: the pretrained function, bit for bit
    m.train()
    m(x).square().mean().backward()
    adapters = {id(p) for p in lora_parameters(m)}
    for name, p in m.named_parameters():
        if id(p) in adapters:
            assert p.requires_grad and p.grad is not None, name
        else:
            assert p.grad is None and not p.requires_grad, name
    assert all(layer.lora_B.grad.abs().sum() > 0 for layer in lora_layers(m))  # B learns first (A's grad is B^T...)


def test_prepare_trains_exactly_adapters_and_head():
    m = _bvit()
    prepare(m, "lora", rank=2)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"} | {f"blocks.0.{t}.lora_{ab}" for t in
                                                        ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2") for ab in "AB"}
    D, hid, r = TINY["embed_dim"], 4 * TINY["embed_dim"], 2
    adapter = r * ((D + 3 * D) + (D + D) + (D + hid) + (hid + D))
    assert sum(p.numel() for p in lora_parameters(m)) == adapter
    s = _bvit()
    prepare(s, "step_lora", rank=2)
    assert sum(p.numel() for p in lora_parameters(s)) == 3 * adapter  # one adapter per step
    h = _bvit()
    prepare(h, "head")
    assert {n for n, p in h.named_parameters() if p.requires_grad} == {"head.weight", "head.bias"}


@pytest.mark.parametrize("name,kw", [("bvit_tiny", dict(steps=3)), ("vit_tiny", dict(depth=2)),
                                     ("bvit_tiny", dict(steps=2, core="ode", method="rk4"))])
def test_merged_adapters_give_the_same_logits(name, kw):
    m = create_model(name, **TINY, **kw).eval()
    keys = set(m.state_dict())
    add_lora(m.blocks, rank=3)
    _randomize(m)
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        ref = m.forward_steps(x)
        merged = merge_lora(copy.deepcopy(m))
        got = merged.forward_steps(x)
    assert not lora_layers(merged) and set(merged.state_dict()) == keys  # plain model, original keys
    assert torch.allclose(got, ref, atol=1e-5)
    base = create_model(name, **TINY, **kw)
    base.load_state_dict(merged.state_dict())  # loadable as the plain architecture


def test_step_lora_uses_adapter_k_at_step_k_and_unrolls():
    m = _bvit()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        ref = m.forward_steps(x, steps=5)
    prepare(m, "step_lora", rank=2)
    m.eval()
    with torch.no_grad():
        for layer in lora_layers(m):
            layer.lora_B[1].normal_(0, 0.1)  # only the adapter of step 2
        got = m.forward_steps(x, steps=5)
    assert torch.equal(got[0], ref[0])  # step 1 untouched
    assert not torch.allclose(got[1], ref[1])  # step 2 adapted
    with torch.no_grad():
        for layer in lora_layers(m):
            layer.lora_B.zero_()
            layer.lora_B[2].normal_(0, 0.1)  # the last adapter: steps >= 3, reused past the horizon
        got = m.forward_steps(x, steps=5)
    assert torch.equal(got[:2], ref[:2]) and not torch.allclose(got[2:], ref[2:])
    with pytest.raises(ValueError, match="cannot hold"):
        merge_lora(copy.deepcopy(m))
    _randomize(m)
    stack = unroll_step_lora(m)
    assert stack.cfg.core == "stack" and stack.cfg.depth == 3
    with torch.no_grad():
        assert torch.allclose(stack.forward_steps(x), m.forward_steps(x), atol=1e-5)


def test_step_lora_on_ode_selects_by_interval():
    m = _bvit(core="ode", method="rk4")
    prepare(m, "step_lora", rank=1)
    seen = []
    layer = m.blocks[0].attn.qkv
    h = layer.register_forward_pre_hook(lambda mod, args: seen.append(mod.index(args[1])))
    with torch.no_grad():
        m(torch.randn(2, 3, 16, 16))
        m(torch.randn(2, 3, 16, 16))  # the counter restarts every forward pass
    h.remove()
    assert seen == 2 * [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]


@pytest.mark.parametrize("name,kw,needle", [("vit_tiny", dict(depth=2), "ONE shared block"),
                                            ("bvit_tiny", dict(steps=2, core="ode", method="dopri5"), "fixed-step")])
def test_step_lora_needs_a_shared_block_with_known_steps(name, kw, needle):
    with pytest.raises(UserError, match=needle):
        prepare(create_model(name, **TINY, **kw), "step_lora", rank=2)


# ------------------------------------------------------------------------------------------ CLI
TARGET = ["data.synthetic_chans=1", "data.synthetic_classes=5", "data.synthetic_train=64", "data.synthetic_test=32",
          "train.epochs=1", "train.batch_size=32", "train.progress=false"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "src"
    assert main(["train", "model.embed_dim=24", "model.steps=2", "train.epochs=1", "train.progress=false",
                 "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("method", ["head", "lora", "step_lora", "full", "scratch"])
def test_finetune_cli_runs_saves_and_reloads(source, tmp_path, capsys, method):
    out = tmp_path / method
    assert main(["finetune", str(source), "--data", "synthetic", "--method", method, "--rank", "2", *TARGET,
                 "--out", str(out), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    for name in ("config.yaml", "metrics.jsonl", "best.pt", "last.pt", "finetune.json"):
        assert (out / name).is_file(), name
    D, heads = 24, 24 * 5 + 5
    adapter = 2 * ((D + 3 * D) + 2 * D + 2 * (D + 4 * D))
    expect = {"head": heads, "lora": adapter + heads, "step_lora": 2 * adapter + heads}.get(method, res["total_params"])
    assert res["trainable_params"] == expect
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["trainable_params"] == expect
    loaded = load(out)
    model, cfg = loaded.model, loaded.config
    assert cfg.model.num_classes == 5 and cfg.data.name == "synthetic" and model.head.out_features == 5
    if method == "step_lora":  # compact form: load; the unrolled stack: any command
        assert main(["eval", str(out / "unrolled.pt"), "--json"]) == 0
    else:  # plain (lora: merged) weights: recurvit eval reads it as any run
        assert not lora_layers(model)
        assert main(["eval", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(res["best_pt_test_acc"])


@pytest.mark.slow
@pytest.mark.parametrize("extra,needle", [
    (["data.synthetic_chans=3"], "3-channel images but the pretrained model takes 1"),
    (["data.img_size=16"], "data.img_size=16 but the pretrained model takes 8x8"),
    (["model.steps=4"], "keeps the pretrained model"),
    (["--method", "step_lora", "--rank", "0"], "--rank must be >= 1"),
    (["train.lr=0"], "train.lr must be a positive number"),
])
def test_finetune_cli_errors(source, tmp_path, capsys, extra, needle):
    code = main(["finetune", str(source), "--data", "synthetic", *TARGET, *extra, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needle in err, err


# ------------------------------------------------------------------------------------- resume
def _epochs(run):
    timing = {"seconds", "img_per_s", "train_seconds", "train_cpu_seconds"}
    return [{k: v for k, v in json.loads(ln).items() if k not in timing}
            for ln in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "step_lora"])
def test_a_stopped_finetune_resumes_to_the_uninterrupted_metrics(source, tmp_path, method):
    from recurvit.tasks.classify.finetune import finetune, finetune_resume

    target = [t for t in TARGET if not t.startswith("train.epochs")] + ["train.epochs=3", "data.holdout=0.25"]
    quiet = dict(log=lambda *a: None)
    whole = finetune(source, "synthetic", method, 2, overrides=target, out=tmp_path / "whole", **quiet)
    finetune(source, "synthetic", method, 2, overrides=target, out=tmp_path / "part", stop_after=1, **quiet)
    assert len(_epochs(tmp_path / "part")) == 1 and "test_acc" not in json.loads((tmp_path / "part" / "finetune.json").read_text())
    resumed = finetune_resume(tmp_path / "part", **quiet)
    assert _epochs(tmp_path / "part") == _epochs(tmp_path / "whole")
    assert resumed["test_acc"] == whole["test_acc"] and resumed["best_pt_test_acc"] == whole["best_pt_test_acc"]
    a, b = (torch.load(tmp_path / r / "best.pt", weights_only=True)["model"] for r in ("whole", "part"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_killed_finetune_resumes_from_the_command_line(source, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    target = [t for t in TARGET if not t.startswith("train.epochs")] + ["train.epochs=40", "train.eval_every=40"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "recurvit", "finetune", str(source), "--data", "synthetic", "--method", "lora",
           "--rank", "2", *target]
    assert subprocess.run([*cmd, "--out", str(tmp_path / "whole")], env=env, capture_output=True).returncode == 0
    run = tmp_path / "killed"
    p = subprocess.Popen([*cmd, "--out", str(run)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not ((run / "metrics.jsonl").is_file() and len(_epochs(run)) >= 3):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)  # at a random moment of epoch 4 or later
    p.wait()
    done = len(_epochs(run))
    assert 3 <= done < 40, done
    r = subprocess.run([sys.executable, "-m", "recurvit", "finetune", "--resume", str(run)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _epochs(run) == _epochs(tmp_path / "whole")


def test_finetune_resume_errors_are_one_line(source, tmp_path, capsys):
    code = main(["finetune", "--resume", str(source)])  # a training run, not a fine-tune
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "finetune.json" in err, err
    code = main(["finetune", "--resume", str(source), "--data", "digits"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "drop RUN_DIR, --data and --out" in err, err
    code = main(["finetune", str(source)])
    assert code == 2 and "--data NAME" in capsys.readouterr().err



@pytest.mark.parametrize("core", [{}, {"core": "ode", "method": "rk4"}])
def test_step_lora_gradients_are_the_same_with_activation_checkpointing(core):
    """The core tells the block its step, so a block recomputed in backward uses its own step's adapter."""
    from recurvit.models.adapters import adapter_spec, attach_adapters
    from recurvit.models.speed import set_activation_checkpointing

    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        m = _bvit(**core)
        attach_adapters(m, adapter_spec(m, "step_lora", rank=2))
        _randomize(m)  # adapters that differ per step
        set_activation_checkpointing(m, checkpointing)
        m.train()
        m(torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-5, atol=1e-7, msg=n)


def test_step_lora_fine_tunes_with_activation_checkpointing(source, tmp_path, capsys):
    runs = {}
    for ac in ("false", "true"):
        out = tmp_path / f"ac-{ac}"
        assert main(["finetune", str(source), "--data", "synthetic", "--method", "step_lora", "--rank", "2", *TARGET,
                     f"train.activation_checkpointing={ac}", "--out", str(out), "--json"]) == 0
        runs[ac] = _epochs(out)
    assert [r["train_loss"] for r in runs["true"]] == pytest.approx([r["train_loss"] for r in runs["false"]], rel=1e-5)
