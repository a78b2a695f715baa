"""Accounting (params, FLOPs, training memory) and matched partners (recurvit.analysis)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from recurvit.analysis.accounting import account, analytic_flops, count_params, measure_flops
from recurvit.analysis.memory import peak_train_memory
from recurvit.analysis.matching import match
from recurvit.errors import UserError
from recurvit.models import ViTConfig, create_model
from tests.conftest import load_script

CIFAR = dict(img_size=32, patch_size=4, num_classes=100)
SIZES = ("tiny", "small", "base")


def _shape(model: nn.Module) -> tuple:
    return (model.cfg.in_chans, model.cfg.img_size, model.cfg.img_size)


# ------------------------------------------------------------------------------------- FLOPs
@pytest.mark.parametrize("name, overrides, steps, device", [
    ("vit_tiny", CIFAR, None, "cpu"),
    ("vit_tiny", CIFAR, 5, "cpu"),  # a stack run at fewer steps than its depth
    ("bvit_tiny", CIFAR, 1, "cpu"),
    ("bvit_tiny", CIFAR, 4, "cpu"),
    ("bvit_tiny", CIFAR, None, "cpu"),
    ("bvit_tiny", CIFAR, 20, "cpu"),  # beyond the trained horizon
    ("bvit_tiny", {}, 2, "cpu"),
    ("bvit_tiny", {**CIFAR, "mlp_conv": True, "pos_embed": "none"}, 3, "cpu"),  # a Mix-FFN's depthwise conv
    ("vit_tiny", {}, None, "meta"),  # 224/16: shapes only, no arithmetic
    ("bvit_tiny", {}, 12, "meta"),
    ("bvit_small", CIFAR, 3, "meta"),
])
def test_analytic_flops_equal_the_counter(name, overrides, steps, device):
    model = create_model(name, **overrides).to(device)
    counted = measure_flops(model, _shape(model), steps=steps, train=False)
    assert counted["flops_forward"] == analytic_flops(model.cfg, steps)
    assert counted["nfe"] == (steps or model.cfg.steps)
    assert counted["flops_forward_by_op"].keys() >= {"convolution", "addmm"}
    assert len(counted["flops_forward_by_op"]) == 3  # conv, linears and attention: nothing uncounted


def test_train_flops_are_about_three_forwards_and_per_image():
    model = create_model("bvit_tiny", steps=2, **CIFAR)
    one = measure_flops(model, _shape(model))
    two = measure_flops(model, _shape(model), batch=2)
    assert one == two  # per image
    assert 2.9 < one["flops_train"] / one["flops_forward"] < 3.2
    assert all(p.grad is None for p in model.parameters())  # measuring leaves no gradients behind


def test_recurrence_and_stack_cost_the_same_flops_at_the_same_width():
    vit, bvit = create_model("vit_tiny", **CIFAR), create_model("bvit_tiny", **CIFAR)
    assert analytic_flops(vit.cfg) == analytic_flops(bvit.cfg)
    with pytest.raises(ValueError):
        analytic_flops(ViTConfig(core="ode"))  # block applications of an ODE core depend on its solver


# ------------------------------------------------------------------------------------ params
@pytest.mark.parametrize("size", SIZES[:2])
def test_stack_params_are_recurrent_params_plus_eleven_blocks(size):
    vit, bvit = create_model(f"vit_{size}", **CIFAR), create_model(f"bvit_{size}", **CIFAR)
    block = count_params(bvit.blocks[0])["params_stored"]
    v, b = count_params(vit), count_params(bvit)
    assert v["params_stored"] == b["params_stored"] + 11 * block
    assert b["params_effective"] == v["params_stored"] == v["params_effective"]  # unrolled bViT = ViT
    assert b["params"] == b["params_stored"] and v["params"] == v["params_stored"]


def test_tied_weights_are_stored_once():
    m = nn.Module()
    w = torch.zeros(4, 4)
    m.a, m.b = nn.Parameter(w), nn.Parameter(w)  # two Parameters, one storage
    counts = count_params(m)
    assert (counts["params"], counts["params_stored"], counts["param_bytes"]) == (32, 16, 64)


def test_param_bytes_halve_in_bf16():
    model = create_model("bvit_tiny", **CIFAR)
    fp32 = count_params(model)
    bf16 = count_params(model.to(torch.bfloat16))
    assert fp32["param_bytes"] == 4 * fp32["params_stored"]
    assert bf16["param_bytes"] * 2 == fp32["param_bytes"]
    assert bf16["param_bytes_by_dtype"] == {"bfloat16": bf16["param_bytes"]}
    assert bf16["params_stored"] == fp32["params_stored"]


# ------------------------------------------------------------------------------------ memory
def test_training_memory_grows_linearly_with_steps_without_checkpointing():
    model = create_model("bvit_tiny", **CIFAR)
    mem = {s: peak_train_memory(model, 4, (3, 32, 32), "cpu", steps=s) for s in (2, 4, 8)}
    assert mem[8] > 3 * mem[2] > 0
    assert mem[8] - mem[2] == 3 * (mem[4] - mem[2])  # every step saves the same activations
    stack = create_model("vit_tiny", depth=8, **CIFAR)  # shared weights save no activation memory
    assert peak_train_memory(stack, 4, (3, 32, 32), "cpu") == mem[8]


def test_account_reports_every_figure():
    r = account("bvit_tiny", batch=2, steps=3, **CIFAR)
    for key in ("model", "params", "params_stored", "param_bytes", "flops_forward", "flops_train", "nfe",
                "peak_train_bytes", "steps", "img_size", "patch_size", "embed_dim", "depth"):
        assert r[key] is not None, key
    assert (r["model"], r["steps"], r["nfe"], r["depth"], r["img_size"]) == ("bvit_tiny", 3, 3, 1, 32)
    assert r["flops_forward"] == r["flops_analytic"]
    assert r["params_effective"] == r["params_stored"] + 2 * count_params(
        create_model("bvit_tiny", **CIFAR).blocks[0])["params_stored"]


# ---------------------------------------------------------------------------------- matching
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("overrides", [{}, CIFAR], ids=["224", "cifar"])
def test_recurrent_models_have_both_partners(size, overrides):
    r = match(f"bvit_{size}", by="both", **overrides)
    flops, params = r["flops"], r["params"]
    assert flops["partner"]["name"] == f"vit_{size}"
    assert flops["partner"]["core"] == "stack" and flops["partner"]["depth"] == 12
    assert abs(flops["flops_ratio"] - 1) <= 0.01
    assert params["partner"]["core"] == "stack" and params["within_tol"]
    assert abs(params["params_ratio"] - 1) <= 0.10
    assert params["partner"]["embed_dim"] % params["partner"]["num_heads"] == 0
    assert params["flops_ratio"] < 1  # the narrow stack is cheaper: recurrence buys compute, not memory


def test_params_partner_is_what_create_model_builds():
    r = match("bvit_tiny", by="params", **CIFAR)
    partner = create_model(r["partner"]["name"], **r["partner"]["overrides"])
    assert count_params(partner)["params_stored"] == r["partner"]["params_stored"]
    assert measure_flops(partner, (3, 32, 32), train=False)["flops_forward"] == r["partner"]["flops_forward"]


@pytest.mark.parametrize("block", [{"mlp_conv": True, "pos_embed": "none"}, {"pos_embed": "rope"}],
                         ids=["mix-ffn", "rope"])
def test_a_partner_has_the_same_kind_of_block(block):
    for by in ("flops", "params"):
        r = match("bvit_tiny", by=by, **CIFAR, **block)
        assert r["partner"]["overrides"].items() >= block.items(), by
        partner = create_model(r["partner"]["name"], **r["partner"]["overrides"])
        assert count_params(partner)["params_stored"] == r["partner"]["params_stored"]
    assert match("bvit_tiny", by="flops", **CIFAR, **block)["flops_ratio"] == 1.0  # the same block, T times


def test_reverse_partners_from_a_stack():
    r = match("vit_tiny", by="both", **CIFAR)
    flops, params = r["flops"], r["params"]
    assert (flops["partner"]["name"], flops["partner"]["core"], flops["partner"]["steps"]) == ("bvit_tiny", "recurrent", 12)
    assert flops["flops_ratio"] == 1.0
    assert params["partner"]["core"] == "recurrent" and params["partner"]["depth"] == 1
    assert params["partner"]["embed_dim"] > 192 and params["partner"]["steps"] == 12
    assert abs(params["params_ratio"] - 1) <= 0.10


def test_match_options():
    closest = match("bvit_small", by="params", prefer="closest")
    assert abs(closest["params_ratio"] - 1) <= abs(match("bvit_small", by="params")["params_ratio"] - 1)
    with pytest.raises(UserError):
        match("bvit_tiny", by="memory")


# ------------------------------------------------------------------ paper-size counts (scripts/accounting.py)
@pytest.mark.slow
def test_paper_size_loopvae_has_a_four_block_core_and_28_applications_per_side():
    with torch.device("meta"):  # shapes only: the 256 px model is counted without weights or arithmetic
        model = create_model("loopvae_conv_imagenet")
    assert model.cfg.img_size == 256 and model.cfg.operator == "conv" and model.cfg.core == "shared"
    n_enc, n_dec = len(model.encoder.core.blocks), len(model.decoder.core.blocks)
    assert n_enc == n_dec == 4
    uses = measure_flops(model, (3, 256, 256), train=False)["block_uses"]  # counted calls of each core block
    assert len(uses) == n_enc + n_dec
    assert (sum(uses[:n_enc]), sum(uses[n_enc:])) == (28, 28)
    assert abs(count_params(model)["params_stored"] / 29e6 - 1) <= 0.10  # "the 29M-parameter convolutional model"


@pytest.mark.slow
def test_accounting_script_check_passes_on_the_committed_files():
    script = load_script("scripts/accounting.py")
    assert script.main(["--check"]) == 0


def test_vit_parameters_grow_linearly_with_depth_and_bvit_parameters_do_not():
    """Crossroads: a ViT's parameter count grows linearly with depth when each block is independently
    parameterised; a bViT's does not grow with its steps (exact counts, not a fit)."""
    from recurvit import create_model

    def count(name, **kw):
        return sum(p.numel() for p in create_model(name, img_size=32, patch_size=4, num_classes=100, **kw).parameters())

    vit = [count("vit_tiny", depth=d) for d in range(1, 7)]
    step = vit[1] - vit[0]
    assert step > 0 and all(b - a == step for a, b in zip(vit, vit[1:]))  # the same increment every block
    assert len({count("bvit_tiny", steps=s) for s in (1, 6, 12, 48)}) == 1  # one block at any depth
