"""ODE core (recurvit/models/ode.py): the shared block as a vector field under torchdiffeq."""
import dataclasses
import math

import numpy as np
import pytest
import torch
from torchdiffeq import odeint

from recurvit.errors import UserError
from recurvit.models import ViTConfig, create_model
from recurvit.models.cores.ode import (FIXED_METHODS, METHODS, BlockField, ODECore, fixed_grid, integrate,
                                 solver_stages)

KW = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, num_heads=2, steps=4)


def _bvit(seed=0, **over):
    torch.manual_seed(seed)
    m = create_model("bvit_tiny", **{**KW, **over}).eval()
    cond = m.core.cond  # give the learned step conditioning non-trivial values
    with torch.no_grad():
        if cond.kind == "embed":
            cond.step_embed.normal_(0, 0.5)
        elif cond.kind == "scale":
            cond.step_scale.uniform_(0.5, 1.5)
    return m


def _ode(src=None, **over):
    m = create_model("bvit_tiny", core="ode", **{**KW, **over}).eval()
    if src is not None:
        m.load_state_dict(src.state_dict(), strict=True)
    return m


def _x(seed=1, b=2):
    return torch.randn(b, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------- 1. Euler = recurrence
@pytest.mark.slow
@pytest.mark.parametrize("step_cond,reinject", [("none", False), ("embed", True), ("scale", False)])
def test_euler_state_subtracted_is_the_bvit_recurrence(step_cond, reinject):
    b = _bvit(step_cond=step_cond, reinject=reinject)
    o = _ode(b, method="euler", field="state_subtracted", step_cond=step_cond, reinject=reinject)
    x = _x()
    with torch.no_grad():
        # 6 > 4 nominal steps: also past the learned conditioning range (last entry reused)
        torch.testing.assert_close(o.forward_steps(x, 6), b.forward_steps(x, 6), atol=1e-6, rtol=0)
        torch.testing.assert_close(o(x), b(x), atol=1e-6, rtol=0)
        for zo, zb in zip(o.iter_states(x), b.iter_states(x)):
            torch.testing.assert_close(zo, zb, atol=1e-6, rtol=0)


def test_black_box_field_is_not_the_recurrence():
    b = _bvit()
    o = _ode(b, method="euler", field="black_box")
    x = _x()
    with torch.no_grad():
        assert (o(x) - b(x)).abs().max() > 1e-2
        # its Euler step is z + h F(z): the residual counted twice
        z0 = o.embed(x)
        z1 = next(iter(o.iter_states(x, 1)))
        torch.testing.assert_close(z1, z0 + o.blocks[0](z0), atol=1e-6, rtol=0)
        zb = next(iter(b.iter_states(x, 1)))
        assert (z1 - zb).abs().max() > 0.1  # 2z + f(z) vs z + f(z)


# ------------------------------------------------------ 2. convergence order of integrate()
_A = torch.tensor([[-0.5, 2.0], [-2.0, -0.5]], dtype=torch.float64)
_Z0 = torch.tensor([[1.0, -0.5], [0.3, 2.0]], dtype=torch.float64)  # two states (columns)
_T = 1.0


def _linear(t, z):  # dz/dt = A z
    return _A @ z


def _linear_exact():
    return torch.linalg.matrix_exp(_A * _T) @ _Z0


def _nonauto(t, z):  # dz/dt = cos(t) z  ->  z(t) = z0 exp(sin t): checks the stage times
    return torch.cos(t) * z


def _nonauto_exact():
    return _Z0 * math.exp(math.sin(_T))


ORDERS = {"euler": 1, "midpoint": 2, "heun2": 2, "heun3": 3, "rk4": 4}
HS = [1 / 16, 1 / 32, 1 / 64, 1 / 128]


def measured_order(method, field, exact):
    t = torch.tensor([0.0, _T], dtype=torch.float64)
    errs = [(integrate(field, _Z0, t, method, step_size=h)[-1] - exact).abs().max().item() for h in HS]
    return float(np.polyfit(np.log(HS), np.log(errs), 1)[0])


@pytest.mark.parametrize("method", list(ORDERS))
@pytest.mark.parametrize("case", ["linear", "nonautonomous"])
def test_measured_convergence_order(method, case):
    field, exact = (_linear, _linear_exact()) if case == "linear" else (_nonauto, _nonauto_exact())
    slope = measured_order(method, field, exact)
    assert abs(slope - ORDERS[method]) < 0.3, f"{method}/{case}: slope {slope:.3f}"


def test_fixed_grid_is_torchdiffeq_step_size_grid():
    t = torch.arange(7, dtype=torch.float32) * 0.5
    ours = fixed_grid(0.5)(None, None, t)
    theirs = torch.arange(7, dtype=torch.float32) * 0.5
    assert torch.equal(ours, theirs)
    # float rounding of span / h adds no sliver step (torchdiffeq's ceil would: 0.3 / 0.1 > 3)
    t = torch.tensor([0.0, 0.3], dtype=torch.float64)
    assert len(fixed_grid(0.1)(None, None, t)) == 4
    # a span that is not a whole number of steps ends with a partial step; reversed spans work
    assert fixed_grid(0.4)(None, None, torch.tensor([0.0, 1.0])).tolist() == pytest.approx([0, 0.4, 0.8, 1.0])
    assert fixed_grid(0.5)(None, None, torch.tensor([1.0, 0.0])).tolist() == [1.0, 0.5, 0.0]


# ---------------------------------------------------------------------------- 3. NFE
@pytest.mark.slow
@pytest.mark.parametrize("method", ["euler", "midpoint", "heun2", "heun3", "rk4"])
def test_nfe_is_steps_times_stages(method):
    o = _ode(method=method)
    x = _x(b=1)
    stages = solver_stages(method)
    with torch.no_grad():
        o(x)
        assert o.nfe == 4 * stages  # no extra evaluation at t0
        o(x, steps=7)  # reset per pass; beyond nominal: same step size, more steps
        assert o.nfe == 7 * stages
        o.forward_steps(x, 5)
        assert o.nfe == 5 * stages  # one integration pass for all readouts


def test_solver_stages_and_multistep_nfe():
    assert [solver_stages(m) for m in ("euler", "midpoint", "heun2", "heun3", "rk4")] == [1, 2, 2, 3, 4]
    assert solver_stages("dopri5") is None and solver_stages("explicit_adams") is None
    assert set(FIXED_METHODS) >= set(ORDERS) | {"explicit_adams", "implicit_adams"}
    # explicit Adams: two rk4 warm-up steps (4 evaluations each), then one per step
    o = _ode(method="explicit_adams")
    with torch.no_grad():
        for steps, nfe in [(1, 4), (2, 8), (3, 9), (6, 12)]:
            o(_x(b=1), steps=steps)
            assert o.nfe == nfe


# ------------------------------------------------------- 4. equals a direct odeint call
@pytest.mark.parametrize("method", ["midpoint", "rk4", "explicit_adams"])
def test_core_equals_direct_odeint(method):
    # h = t_end / steps = 0.5 and step-embedding conditioning: checks the grid and k = floor(t / h)
    b = _bvit(step_cond="embed", reinject=True)
    o = _ode(b, method=method, t_end=2.0, step_cond="embed", reinject=True)
    x = _x()
    with torch.no_grad():
        z0 = o.embed(x)
        ours = torch.stack(list(o.core.states(o.blocks, z0, 6)))
        field = o.core.make_field(o.blocks, z0)
        t = torch.arange(7, dtype=torch.float32) * 0.5
        direct = odeint(field, z0, t, method=method, options=dict(step_size=0.5))
    torch.testing.assert_close(ours, direct[1:], atol=0, rtol=0)


def test_core_equals_direct_odeint_adaptive():
    b = _bvit()
    o = _ode(b, method="dopri5", rtol=1e-4, atol=1e-5)
    x = _x()
    with torch.no_grad():
        z0 = o.embed(x)
        ours = torch.stack(list(o.core.states(o.blocks, z0, 4)))
        direct = odeint(BlockField(o.blocks[0], o.core.cond), z0, torch.arange(5.0), method="dopri5",
                        rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours, direct[1:], atol=0, rtol=0)


# ------------------------------------------------------------ 5. state_dict round trip
def test_state_dict_round_trip_both_directions():
    b = _bvit(step_cond="embed", reinject=True)
    o = _ode(method="rk4", step_cond="embed", reinject=True)
    assert set(o.state_dict()) == set(b.state_dict())
    assert any(k.startswith("core.cond.") for k in o.state_dict())
    assert not any(k.startswith("core.") and ".cond." not in k for k in o.state_dict())
    o.load_state_dict(b.state_dict(), strict=True)  # bViT -> ODE
    b2 = _bvit(seed=5, step_cond="embed", reinject=True)
    b2.load_state_dict(o.state_dict(), strict=True)  # ODE -> bViT
    for k, v in b.state_dict().items():
        assert torch.equal(b2.state_dict()[k], v), k
    with torch.no_grad():
        torch.testing.assert_close(b2(_x()), b(_x()), atol=0, rtol=0)


def test_time_cond_params_live_under_core_and_start_as_the_plain_field():
    b = _bvit()
    o = _ode(b, method="rk4")
    ot = _ode(method="rk4", time_cond=True)
    extra = set(ot.state_dict()) - set(o.state_dict())
    assert extra == {"core.time_embed.weight", "core.time_embed.bias"}
    missing, unexpected = ot.load_state_dict(b.state_dict(), strict=False)
    assert set(missing) == extra and not unexpected
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(ot.forward_steps(x), o.forward_steps(x), atol=0, rtol=0)
        ot.core.time_embed.weight.normal_(0, 0.5)
        assert (ot(x) - o(x)).abs().max() > 1e-3  # the field now depends on t
    ot.train()
    ot(x).sum().backward()
    assert ot.core.time_embed.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------------- 6. adjoint
def test_adjoint_matches_direct_backprop():
    b = _bvit(step_cond="embed", reinject=True, steps=3)
    over = dict(method="rk4", steps=3, t_end=1.5, step_cond="embed", reinject=True)
    direct = _ode(b, **over)
    adj = _ode(b, adjoint=True, **over)
    x = _x()
    outs, grads = [], []
    for m in (direct, adj):
        y = m(x)
        y.pow(2).sum().backward()
        outs.append(y.detach())
        grads.append({k: p.grad.clone() for k, p in m.named_parameters()})
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0)  # same forward solve
    assert adj.core.nfe == 3 * 4 and adj.core.nfe_adjoint > 0
    for k, g in grads[0].items():
        ga = grads[1][k]
        assert torch.isfinite(ga).all(), k
        if k.startswith("blocks.0.") or k.startswith("core.") or k.startswith("patch_embed."):
            assert ga.abs().sum() > 0, f"no gradient through the solver to {k}"
        rel = (ga - g).norm() / g.norm().clamp_min(1e-12)
        assert rel < 5e-3, f"{k}: adjoint vs direct relative error {rel:.2e}"


# ---------------------------------------------------------------- 7. beyond nominal
@pytest.mark.slow
@pytest.mark.parametrize("method", ["euler", "rk4", "explicit_adams"])
def test_beyond_nominal_and_forward_steps_consistency(method):
    o = _ode(_bvit(step_cond="scale"), method=method, step_cond="scale", t_end=2.0)
    x = _x()
    K = 3 * o.nominal_steps
    with torch.no_grad():
        all_steps = o.forward_steps(x, K)
        assert all_steps.shape == (K, 2, 10) and torch.isfinite(all_steps).all()
        for k in (1, 2, 5, K):
            torch.testing.assert_close(all_steps[k - 1], o(x, steps=k), atol=1e-6, rtol=0)
        sub = o.forward_steps(x, at=[2, K])
        torch.testing.assert_close(sub, all_steps[[1, K - 1]], atol=1e-6, rtol=0)


def test_grad_last_truncates_backprop_but_not_the_forward():
    o = _ode(_bvit(), method="rk4")
    x = _x()
    full = o.forward_steps(x)
    trunc = o.forward_steps(x, grad_last=1)
    torch.testing.assert_close(trunc, full, atol=1e-6, rtol=0)
    assert o.nfe == 4 * 4
    trunc[-1].sum().backward()
    assert o.blocks[0].mlp.fc1.weight.grad.abs().sum() > 0
    assert o.patch_embed.proj.weight.grad is None  # cut before the last step


# ------------------------------------------------------------------------ 8. adaptive
def test_dopri5_runs_and_reports_nfe():
    b = _bvit()
    loose = _ode(b, method="dopri5", rtol=1e-2, atol=1e-3)
    tight = _ode(b, method="dopri5", rtol=1e-6, atol=1e-7)
    x = _x()
    with torch.no_grad():
        yl, yt = loose.forward_steps(x), tight.forward_steps(x)
    assert yl.shape == (4, 2, 10)
    for m in (loose, tight):
        acc, rej = m.core.solver_steps
        assert m.nfe > 0 and acc >= 1
        assert m.nfe == 2 + 6 * (acc + rej)  # f(t0) + initial-step probe, then 6 per attempt (FSAL)
    assert tight.nfe > loose.nfe
    # a tight adaptive solve approximates the exact flow: rk4 at h = 1/8 agrees with it
    fine = _ode(b, method="rk4", t_end=4.0, steps=32)
    with torch.no_grad():
        yf = fine.forward_steps(x, at=[8, 16, 24, 32])
    torch.testing.assert_close(yt, yf, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------- config errors
def test_unknown_method_and_field_raise():
    b = _bvit()
    with pytest.raises(ValueError, match="dopri5") as e:
        ODECore(ViTConfig.build(dataclasses.asdict(b.cfg), dict(core="ode", options=None, method="rk5")))
    assert "euler" in str(e.value) and "rk4" in str(e.value)
    with pytest.raises(UserError, match="explicit_adams"):
        create_model("bvit_tiny", core="ode", method="rk45", **KW)
    with pytest.raises(UserError, match="state_subtracted"):
        create_model("bvit_tiny", core="ode", field="residual", **KW)
    with pytest.raises(UserError, match="t_end"):
        create_model("bvit_tiny", core="ode", t_end=0.0, **KW)
    assert "scipy_solver" not in METHODS


def test_registry_example_builds():
    m = create_model("bvit_tiny", core="ode", field="state_subtracted", method="rk4", steps=6, t_end=6.0)
    assert isinstance(m.core, ODECore) and m.core.name == "ode" and m.core.shares_blocks
    assert m.nominal_steps == 6 and m.core.step_size == 1.0 and len(m.blocks) == 1


# ------------------------------------------------------------------ refinement at evaluation
@pytest.mark.slow
@pytest.mark.parametrize("method", ["euler", "midpoint", "rk4"])
def test_refinement_converges_to_the_fine_solution(method):
    """The same trained field solved with h/n over the same span approaches the exact flow as n
    grows, at the method's order: refine=n is numerical refinement, not another model."""
    b = _bvit()
    x = _x(3)
    fine = _ode(b, method="rk4", refine=64)
    with torch.no_grad():
        ref = fine.forward_steps(x)
        errs = []
        for n in (1, 2, 4):
            m = _ode(b, method=method, refine=n)
            errs.append((m.forward_steps(x) - ref).abs().max().item())
            assert m.nfe == m.cfg.steps * solver_stages(method) * n
    assert errs[0] > errs[1] > errs[2]
    order = math.log2(errs[1] / errs[2])
    assert order > {"euler": 0.7, "midpoint": 1.5, "rk4": 3.0}[method], errs


def test_refine_keeps_the_grid_and_rejects_adaptive_methods():
    b = _bvit()
    m = _ode(b, method="euler", refine=4)
    assert m.core.step_size == 1.0 and m.core.refine == 4  # same output grid t_k = k h
    with pytest.raises(UserError, match="refine applies to fixed-step"):
        create_model("bvit_tiny", core="ode", method="dopri5", refine=2, **KW)
    with pytest.raises(UserError, match="refine does not apply"):
        create_model("bvit_tiny", refine=2, **KW)  # a recurrent core has no solver to refine
