"""Per-step analyses: step attribution of block calls, linear CKA, one-step interventions, the CLI."""
import json
import math

import pytest
import torch

from recurvit import create_model
from recurvit.analysis.cka import CKAAccumulator, linear_cka
from recurvit.analysis.per_step import analyze_model, continuation, continued, step_specific_part, step_specificity
from recurvit.analysis.probe import Intervention, StepProbe, calls_per_step
from recurvit.cli import main
from tests.conftest import TINY

@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: threads only add contention on a shared machine
    yield
    torch.set_num_threads(n)


MODELS = {
    "recurrent": ("bvit_tiny", dict(steps=4)),
    "stack": ("vit_tiny", dict(depth=3)),
    "ode_euler": ("bvit_tiny", dict(core="ode", method="euler", steps=3)),
    "ode_rk4": ("bvit_tiny", dict(core="ode", method="rk4", steps=3)),
    "softmor": ("srvit_tiny", dict(depth=2, recursions=2)),
    "softmor_cycle": ("srvit_tiny", dict(depth=2, recursions=3, layout="cycle", steps=3)),
}
CALLS = {"recurrent": 1, "stack": 1, "ode_euler": 1, "ode_rk4": 4, "softmor": 2, "softmor_cycle": 2}


def _model(key, **kw):
    name, opts = MODELS[key]
    return create_model(name, **TINY, **{**opts, **kw}).eval()


def _x(n=6):
    return torch.randn(n, 3, 16, 16)


# ------------------------------------------------------------------------------ step attribution
@pytest.mark.parametrize("key", list(MODELS))
def test_hooks_collect_one_record_per_step(key):
    m = _model(key)
    K = m.nominal_steps
    with torch.no_grad(), StepProbe(m, attention=True) as probe:
        zs = probe.states(_x(), K)
    assert len(zs) == K
    c = CALLS[key]
    assert [r.step for r in probe.calls] == [k for k in range(1, K + 1) for _ in range(c)]
    assert calls_per_step(probe.calls) == {k: c for k in range(1, K + 1)}
    assert [r["step"] for r in probe.attn_records] == [r.step for r in probe.calls]  # one attention record per call
    if key == "stack":
        assert [r.block for r in probe.calls] == list(range(K))  # layer by layer
    if key in ("recurrent", "ode_euler"):
        assert len(probe.calls) == K and {r.block for r in probe.calls} == {0}  # the shared block once per step
    assert not m.blocks[0]._forward_pre_hooks  # hooks removed on exit


def test_adaptive_ode_calls_grouped_by_time():
    m = create_model("bvit_tiny", **TINY, core="ode", method="dopri5", steps=3).eval()
    with torch.no_grad(), StepProbe(m) as probe:
        probe.states(_x(), 3)
    assert len(probe.calls) == m.nfe
    for r in probe.calls:  # each evaluation sits in (or at the left end of) its step's interval
        assert r.step == min(3, math.floor(r.t + 1e-4) + 1)
    assert [r.step for r in probe.calls] == sorted(r.step for r in probe.calls)


# ------------------------------------------------------------------------------------------ CKA
def test_cka_self_orthogonal_and_scale_invariance():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 16, generator=g, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=torch.float64))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-10)
    assert linear_cka(x, 7.5 * x @ q + 3.0) == pytest.approx(1.0, abs=1e-10)  # scale and translation
    y = torch.randn(200, 16, generator=g, dtype=torch.float64)
    assert 0.0 <= linear_cka(x, y) < 0.3
    assert linear_cka(x, y @ q) == pytest.approx(linear_cka(x, y), abs=1e-10)
    small = torch.randn(10, 40, generator=g, dtype=torch.float64)  # n < features: Gram form
    q40, _ = torch.linalg.qr(torch.randn(40, 40, generator=g, dtype=torch.float64))
    assert linear_cka(small, small @ q40) == pytest.approx(1.0, abs=1e-10)


def test_cka_accumulator_matches_full_computation():
    g = torch.Generator().manual_seed(1)
    reps = [torch.randn(90, 8, generator=g, dtype=torch.float64) for _ in range(3)]
    reps[2] = reps[0] @ torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))[0] + 0.1 * reps[1]
    acc = CKAAccumulator()
    for i in range(0, 90, 25):  # uneven batches
        acc.update([r[i:i + 25] for r in reps])
    m = acc.matrix()
    for i in range(3):
        assert m[i, i].item() == pytest.approx(1.0, abs=1e-12)
        for j in range(3):
            assert m[i, j].item() == pytest.approx(linear_cka(reps[i], reps[j]), abs=1e-10)
    assert torch.allclose(m, m.T)


# ------------------------------------------------------------------------------- interventions
@pytest.mark.parametrize("key", ["recurrent", "stack", "ode_rk4", "softmor"])
def test_masking_nothing_changes_nothing(key):
    m = _model(key)
    x = _x()
    with torch.no_grad():
        ref = m.forward_steps(x)
        with StepProbe(m, attention=True, features=True) as probe:
            assert torch.equal(probe.forward_steps(x), ref)
            with probe.intervene(Intervention("head", step=m.nominal_steps + 5, index=0)):  # a step never run
                assert torch.equal(probe.forward_steps(x), ref)
        assert torch.equal(m.forward_steps(x), ref)  # and nothing left behind


@pytest.mark.parametrize("key", ["recurrent", "stack", "ode_rk4", "softmor_cycle"])
@pytest.mark.parametrize("kind", ["head", "mlp", "skip"])
def test_masking_at_one_step_changes_only_what_follows(key, kind):
    m = _model(key)
    x = _x()
    K, k = m.nominal_steps, 2
    with torch.no_grad():
        ref = m.forward_steps(x)
        with StepProbe(m) as probe, probe.intervene(Intervention(kind, step=k, index=1, slices=3)):
            zs = probe.states(x, K)
            got = probe.readouts(zs)
    assert torch.equal(got[:k - 1], ref[:k - 1])  # readouts before the masked step: bit for bit
    assert not torch.allclose(got[k - 1], ref[k - 1])  # the masked step changes
    assert not torch.allclose(got[-1], ref[-1])  # and so does what follows it
    if kind == "skip" and key == "recurrent":
        assert torch.equal(zs[k - 1], zs[k - 2])  # the block is the identity at step k


def test_head_mask_hook_equals_masking_the_head_by_hand():
    m = _model("recurrent")
    attn = m.blocks[0].attn
    x = torch.randn(2, 17, TINY["embed_dim"])
    with torch.no_grad():  # softmax(q k^T / sqrt(d)) v per head, head 1 zeroed, then the output projection
        B, N, C = x.shape
        v = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)[2]
        heads = attn.attention_weights(x) @ v  # (B, heads, N, head_dim)
        heads[:, 1] = 0
        ref = attn.proj(heads.transpose(1, 2).reshape(B, N, C))
        with StepProbe(m) as probe, probe.intervene(Intervention("head", step=0, index=1)):
            probe.step = 0
            got = attn(x)
    assert torch.allclose(got, ref, atol=1e-6)


def test_analyze_model_outputs_shapes():
    m = _model("recurrent")
    x, y = _x(12), torch.randint(0, TINY["num_classes"], (12,))
    res = analyze_model(m, [(x[:7], y[:7]), (x[7:], y[7:])], mlp_slices=4)
    K, H = 4, TINY["num_heads"]
    assert len(res["readout"]["accuracy"]) == K and len(res["norms"]["state_norm"]) == K + 1
    assert len(res["attention"]) == K * H and all(r["calls"] == 1 for r in res["attention"])
    assert all(0 <= r["entropy"] <= math.log(17) + 1e-6 and r["distance"] >= 0 for r in res["attention"])
    cka = torch.tensor(res["cka"]["tokens"])
    assert cka.shape == (K + 1, K + 1) and torch.allclose(cka.diagonal(), torch.ones(K + 1, dtype=cka.dtype))
    p = res["pruning"]
    assert len(p["heads"]) == K * H and len(p["mlp"]) == K * 4 and len(p["skip"]) == K
    with torch.no_grad():
        acc = (m(x).argmax(-1) == y).float().mean().item()
    assert p["base_acc"] == pytest.approx(acc) and res["readout"]["accuracy"][-1] == pytest.approx(acc)
    with pytest.raises(ValueError, match="unknown analyses"):
        analyze_model(m, [(x, y)], what=["readout", "bogus"])


# ------------------------------------------------------------------------ the fixed-point control
def test_continuing_the_previous_update_keeps_its_direction_and_drops_a_new_one():
    torch.manual_seed(0)
    z_before, z_prev = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    p = z_prev - z_before
    new = torch.randn(2, 5, 8)
    new = new - (new * p).sum(-1, keepdim=True) / (p * p).sum(-1, keepdim=True) * p  # orthogonal to p, per token
    c = torch.randn(2, 5, 1)
    # an update along the previous one is kept exactly; a new direction is dropped, whatever its size
    assert torch.allclose(continued(z_before, z_prev, z_prev + c * p), z_prev + c * p, atol=1e-5)
    assert torch.allclose(continued(z_before, z_prev, z_prev + 3 * new), z_prev, atol=1e-5)
    assert torch.allclose(continued(z_before, z_prev, z_prev + c * p + new), z_prev + c * p, atol=1e-5)


@pytest.mark.parametrize("key", ["recurrent", "stack", "ode_euler"])
def test_the_continuation_control_reads_the_model_at_its_trained_depth(key):
    torch.manual_seed(0)
    model = _model(key)
    batches = [(_x(6), torch.randint(0, 10, (6,))) for _ in range(2)]
    res = continuation(model, batches)
    with torch.no_grad():
        acc = sum((model(x).argmax(-1) == y).sum().item() for x, y in batches) / 12
    assert res["images"] == 12 and res["acc_T"] == acc  # the real path is the model's own output
    assert res["drop"] == pytest.approx(res["acc_T"] - res["acc_continued"])
    with pytest.raises(ValueError, match="at least 2 steps"):
        continuation(_model("recurrent", steps=1), batches)


def test_the_continued_path_reads_the_continued_state(monkeypatch):
    """With the last update dropped entirely (the continued state = the state before it), the control's
    second accuracy is the model's at T - 1 steps."""
    import recurvit.analysis.per_step as per_step

    torch.manual_seed(0)
    model = _model("recurrent")
    with torch.no_grad():
        for p in model.blocks.parameters():  # a block whose steps change the answers (not at init's scale)
            p.mul_(8)
        # labels: the model's own answers at T - 1 = 3 steps
        batches = [(x, model(x, steps=3).argmax(-1)) for x in (_x(32), _x(32))]
    monkeypatch.setattr(per_step, "continued", lambda z_before, z_prev, z_last: z_prev)
    res = continuation(model, batches)
    assert res["acc_continued"] == 1.0 and res["acc_T"] < 1.0  # T's own answers differ on some images


# ------------------------------------------------------------------ step-specific pruning, split in half
def test_the_step_specific_part_is_zero_for_the_same_units_in_the_same_proportions_at_every_step():
    torch.manual_seed(0)
    a, b, c = (torch.rand(5, 1) + 0.1).double(), torch.randn(1, 7).double(), torch.randn(5, 1).double()
    assert step_specific_part(a * b + c).abs().max() < 1e-9  # each step a rescaled, shifted copy of one profile
    swapped = a * b + c
    swapped[2] = swapped[2].flip(0)  # step 3 needs the units in another order
    part = step_specific_part(swapped)
    assert part.abs().max() > 0.5 and part.sum(0).abs().max() < 1e-9  # centred over steps, unit by unit


def test_split_half_pruning_maps_agree_with_the_full_pruning_map_and_identical_halves_correlate_fully():
    """Every image twice in a row: the even and the odd images are the same images, so the two halves'
    maps are equal (r = 1); the combined map is analyze_model's pruning map of the same units."""
    torch.manual_seed(0)
    m = _model("recurrent")
    with torch.no_grad():
        for p in m.blocks.parameters():
            p.mul_(4)  # a block whose steps and units change the answers
        x = _x(24)
        y = m(x, steps=2).argmax(-1)  # labels the full model gets partly right
    x2, y2 = x.repeat_interleave(2, 0), y.repeat_interleave(2, 0)
    res = step_specificity(m, [(x2[:20], y2[:20]), (x2[20:], y2[20:])], mlp_slices=4)
    assert res["images"] == 48 and res["units"] == ["head0", "head1", "head2", "mlp0", "mlp1", "mlp2", "mlp3"]
    assert res["split_half_r"] == pytest.approx(1.0)
    full = analyze_model(m, [(x, y)], what=["pruning"], mlp_slices=4)["pruning"]
    by_hand = [[next(r["drop"] for r in full["heads"] if (r["step"], r["head"]) == (t, h)) for h in range(3)]
               + [next(r["drop"] for r in full["mlp"] if (r["step"], r["slice"]) == (t, j)) for j in range(4)]
               for t in range(1, 5)]
    assert torch.allclose(torch.tensor(res["drops"], dtype=torch.float64), torch.tensor(by_hand, dtype=torch.float64), atol=1e-12)
    assert torch.tensor(res["drops"]).abs().max() > 0  # the masks change answers: the test can tell
    with pytest.raises(ValueError, match="at least 4 images"):
        step_specificity(m, [(x[:3], y[:3])])


# ------------------------------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("analyze") / "run"
    assert main(["train", "model.embed_dim=24", "model.steps=3", "train.epochs=1", "train.progress=false",
                 "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_analyze_cli_writes_every_output(tiny_run, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "an"
    assert main(["analyze", str(tiny_run), "--num-images", "40", "--out", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    names = {"steps.csv", "steps.png", "attention.csv", "attention.png", "cka_tokens.csv", "cka_pooled.csv",
             "cka.png", "pruning_heads.csv", "pruning_mlp.csv", "pruning_skip.csv", "pruning.png", "summary.json"}
    assert names <= {p.name for p in out.iterdir()}
    assert s["images"] == 40 and s["steps"] == 3 and s["calls_per_step"] == {"1": 1, "2": 1, "3": 1}
    assert -1 <= s["continue_drop"] <= 1  # the fixed-point control is part of the pruning analyses
    assert "split_half_r" in s and (s["split_half_r"] is None or -1 <= s["split_half_r"] <= 1)  # step_pruning's figure
    assert (out / "attention.csv").read_text().splitlines()[0] == "step,head,entropy,distance,calls"
    assert len((out / "pruning_heads.csv").read_text().splitlines()) == 1 + 3 * 3
    assert (out / "pruning.png").stat().st_size > 1000


@pytest.mark.parametrize("argv,needle", [
    (["--what", "readout,bogus"], "--what takes"),
    (["--num-images", "0"], "--num-images must be"),
    (["--steps", "0"], "steps must be >= 1"),
])
def test_analyze_cli_errors(tiny_run, capsys, argv, needle):
    code = main(["analyze", str(tiny_run), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and needle in err, err
