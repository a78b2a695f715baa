"""Conformance suite over every entry of ``CORES``: what a core says about itself is what it does.

A new core passes by being added to the table (its default options are tested; VARIANTS adds
option sets worth checking for the cores here). For each core and option set:
- the states of one pass equal stepping by hand (``begin`` / ``advance``) where the core can step;
- ``block_uses`` (from the config alone) equals the block calls counted in a forward, and
  ``nfe`` their sum;
- the analytic FLOPs (``analysis.accounting.analytic_flops``) equal the counted FLOPs;
- ``step_of_call`` (the step a probe is told) and the ``step`` the core passes to the block
  (``block(z, step=k)``: what step conditioning and per-step adapters read) equal the step the
  call runs in;
- every core runs on inputs larger than it was built for, with the learned position embedding resampled
  (``dynamic_img_size``), with 2D rotary embeddings (``pos_embed="rope"``) and with no position scheme but
  a Mix-FFN (``pos_embed="none"``, ``mlp_conv=True``), and its step states there are those of one pass;
- every core answers ``step_program`` (the step a step-program export traces): a StepPlan whose steps,
  chained in eager PyTorch with the step index as a tensor, give the states of one pass, past the
  trained steps where the core runs that far; or NoStepProgram with its reason in one line.
"""
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import TINY
from recurvit import create_model
from recurvit.analysis.accounting import analytic_flops, measure_flops
from recurvit.models.cores import CORES
from recurvit.models.cores.base import STEP_INPUT, NoStepProgram

STEPS = 3
VARIANTS = {  # option sets beyond each core's defaults (a core missing here runs with its defaults)
    "recurrent": [{"step_cond": "embed", "reinject": True}, {"step_cond": "scale"}],
    "ode": [{"method": "rk4"}, {"method": "midpoint", "refine": 2, "reinject": True},
            {"method": "dopri5", "field": "black_box"}],
    "softmor": [{"recursions": 2, "router": "query"}, {"recursions": 2, "layout": "cycle", "mixture": "last"}],
}
CASES = [(name, opts) for name in CORES for opts in [{}] + VARIANTS.get(name, [])]
IDS = [name + "".join(f"-{k}={v}" for k, v in opts.items()) for name, opts in CASES]


def _model(name, opts):
    preset = "bvit_tiny" if CORES[name].shares_blocks else "vit_tiny"
    torch.manual_seed(0)
    try:  # one block applied STEPS times, or STEPS blocks ...
        return create_model(preset, core=name, **TINY, steps=STEPS, **opts).eval()
    except ValueError:  # ... for a core whose steps follow its depth (a stack, SoftMoR): the core says how
        cls = CORES[name]
        steps = cls.default_steps(SimpleNamespace(depth=STEPS, options=cls.parse_options(opts)))
        torch.manual_seed(0)
        return create_model(preset, core=name, **TINY, depth=STEPS, steps=steps, **opts).eval()


def _deepest(model):
    """The trained steps and one beyond, where the core can run that far."""
    T, limit = model.nominal_steps, model.core.limit
    return T + 1 if limit is None else min(T + 1, limit)


def _x():
    return torch.randn(2, TINY["in_chans"], TINY["img_size"], TINY["img_size"], generator=torch.Generator().manual_seed(1))


def _calls(model, record=None, told=None):
    """Per-block call counts of the next forwards (a list), and the hooks to remove; ``told``
    collects the ``step`` each call passes to the block."""
    counts = [0] * len(model.blocks)
    handles = []
    for i, b in enumerate(model.blocks):
        def hook(_m, _a, kwargs, i=i):
            if record is not None:
                record(sum(counts))
            if told is not None:
                told.append(kwargs.get("step"))
            counts[i] += 1
        handles.append(b.register_forward_pre_hook(hook, with_kwargs=True))
    return counts, handles


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_stepping_by_hand_gives_the_states_of_one_pass(name, opts):
    model = _model(name, opts)
    cls = model.cfg.core_cls
    if cls.cannot_step(model.cfg) is not None:
        with pytest.raises(ValueError):
            model.core.begin(model.blocks, model.embed(_x()))
        return
    with torch.no_grad():
        K = _deepest(model)
        states = list(model.iter_states(_x(), K))  # beyond the trained steps too
        s = model.core.begin(model.blocks, model.embed(_x()))
        by_hand = [model.core.advance(s).clone() for _ in range(K)]
    assert len(states) == K
    for k, (a, b) in enumerate(zip(states, by_hand), 1):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"step {k}")


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_block_uses_equal_the_counted_block_calls(name, opts):
    model = _model(name, opts)
    cls = model.cfg.core_cls
    for steps in (1, model.nominal_steps):
        counts, handles = _calls(model)
        with torch.no_grad():
            model(_x(), steps=steps)
        for h in handles:
            h.remove()
        assert model.core.nfe == sum(counts), steps
        uses = cls.block_uses(model.cfg, steps)
        if uses is not None:  # None: data-dependent (an adaptive solver)
            assert counts == uses, steps
        assert len(model.blocks) == cls.num_blocks(model.cfg)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_analytic_flops_equal_the_counted_flops(name, opts):
    model = _model(name, opts)
    if model.cfg.core_cls.block_uses(model.cfg) is None:
        with pytest.raises(ValueError):
            analytic_flops(model.cfg)  # its block applications depend on the solver's steps
        return
    shape = (TINY["in_chans"], TINY["img_size"], TINY["img_size"])
    for steps in (1, model.nominal_steps):
        counted = measure_flops(model, shape, steps=steps, train=False)
        assert counted["flops_forward"] == analytic_flops(model.cfg, steps), steps


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_step_of_call_is_the_step_the_call_runs_in(name, opts):
    model = _model(name, opts)
    cls, core = model.cfg.core_cls, model.core
    told, passed, truth, T = [], [], [], model.nominal_steps
    counts, handles = _calls(model, record=lambda n: told.append(core.step_of_call(n)), told=passed)
    with torch.no_grad():
        if cls.cannot_step(model.cfg) is None:  # truth: the advance the call is made in
            s = core.begin(model.blocks, model.embed(_x()))
            for k in range(1, T + 1):
                before = sum(counts)
                core.advance(s)
                truth += [k] * (sum(counts) - before)
        elif not cls.keeps_states:  # truth: the calls between the states a pass yields
            before = 0
            for k, _ in enumerate(model.iter_states(_x(), T), 1):
                truth += [k] * (sum(counts) - before)
                before = sum(counts)
        else:  # one solve yields every state at its end: the step is the grid interval of the call's time
            times = []
            h2 = model.blocks[0].register_forward_pre_hook(lambda *a: times.append(core.current_time))
            handles.append(h2)
            list(model.iter_states(_x(), T))
            h = core.step_size
            truth = [min(max(int(t / h + 1e-6) + 1, 1), T) for t in times]
    for hd in handles:
        hd.remove()
    assert told and len(told) == len(truth)
    assert passed == told  # the block is told the step a probe attributes the call to
    if cls.cannot_step(model.cfg) is None or not cls.keeps_states:
        assert told == truth
    else:  # an adaptive solve may evaluate at a grid time t_k, the end of step k or the start of step k + 1
        assert all(abs(a - b) <= 1 for a, b in zip(told, truth)) and told[0] == 1 and max(told) == T


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_the_step_program_chained_in_eager_gives_the_states_of_one_pass(name, opts):
    model = _model(name, opts)
    with torch.no_grad():  # the core's own weights start at zero / one: give them values that matter
        for n, p in model.named_parameters():
            if n.startswith("core."):
                p.normal_(0, 0.5)
    try:
        plan = model.core.step_program(model.blocks)
    except NoStepProgram as e:
        assert str(e) and "\n" not in str(e)
        return
    per_step = len(plan.steps) > 1
    if per_step:  # one program per step: as many as the core runs
        assert len(plan.steps) == model.core.limit
    assert plan.state[0] == "z" and set(plan.readout_inputs) <= set(plan.state)
    assert plan.inputs() == plan.state + ([STEP_INPUT] if plan.step_index else []) + plan.constants
    K = _deepest(model)
    with torch.no_grad():
        want = list(model.iter_states(_x(), K))
        z = model.embed(_x())
        extra = plan.begin(z)
        assert len(extra) == len(plan.state) - 1 + len(plan.constants)
        vals = dict(zip(plan.state + plan.constants, (z, *extra)))
        for k in range(1, K + 1):
            fn = plan.steps[k - 1] if per_step else plan.steps[0]
            kw = {n: vals[n] for n in plan.state + plan.constants}
            if plan.step_index:
                kw[STEP_INPUT] = torch.tensor(k - 1, dtype=torch.long)
            out = fn(**kw)
            out = out if isinstance(out, tuple) else (out,)
            assert len(out) == len(plan.state)
            vals.update(zip(plan.state, out))
            got = plan.tokens(*[vals[n] for n in plan.readout_inputs])
            torch.testing.assert_close(got, want[k - 1], rtol=1e-5, atol=1e-5, msg=f"step {k}")


POSITIONS = {"learned": {}, "rope": {"pos_embed": "rope"}, "mixffn": {"pos_embed": "none", "mlp_conv": True}}


@pytest.mark.parametrize("pos", list(POSITIONS))
@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_every_core_runs_on_a_larger_input(name, opts, pos):
    base = _model(name, opts)  # the steps its core runs at STEPS blocks
    preset = "bvit_tiny" if CORES[name].shares_blocks else "vit_tiny"
    kw = dict(core=name, **TINY, dynamic_img_size=True, **POSITIONS[pos], **opts)
    torch.manual_seed(0)
    try:
        model = create_model(preset, steps=STEPS, **kw).eval()
    except ValueError:
        model = create_model(preset, depth=STEPS, steps=base.nominal_steps, **kw).eval()
    big = torch.randn(2, TINY["in_chans"], 2 * TINY["img_size"], 2 * TINY["img_size"],
                      generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out, steps = model(big), model.forward_steps(big)
    assert out.shape == (2, TINY["num_classes"]) and torch.isfinite(out).all()
    torch.testing.assert_close(steps[-1], out)
