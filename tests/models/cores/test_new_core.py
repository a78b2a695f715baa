"""A new core is one Core subclass plus one entry in CORES: the one below (a damped recurrence,
z <- z + (F(z) - z) / 2, defined here only) passes the conformance suite of test_conformance.py by being
added to the table, and trains, sweeps the horizon and exports like the shipped cores. It must answer
``step_program`` (a step program for deployment, or the reason it has none): a core that does not
fails the suite."""
from dataclasses import dataclass
from typing import List, Optional

import pytest
import torch

from tests.conftest import TINY
from tests.models.cores import test_conformance as conformance
from recurvit import create_model
from recurvit.models.cores import CORES
from recurvit.models.cores.base import Core, StepPlan, StepState


@dataclass
class DampedOptions:
    rate: float = 0.5  # the share of the block's update taken each step


class Damped(Core):
    """What a new core defines: its name and Options, whether it shares blocks, how many times each
    block runs (block_uses), its ONE step (_advance) and its step program (step_program); states, the
    per-step API, accounting and the study runner come from the base class and the tables."""

    name = "damped"
    Options = DampedOptions
    shares_blocks = True

    @classmethod
    def check_options(cls, opts) -> None:
        if not 0 < opts.rate <= 1:
            raise ValueError(f"rate must be in (0, 1], got {opts.rate}")

    @classmethod
    def block_uses(cls, cfg, steps: Optional[int] = None) -> List[int]:
        return [cfg.steps if steps is None else int(steps)]

    @classmethod
    def calls_per_step(cls, cfg) -> int:
        return 1

    @classmethod
    def cannot_step(cls, cfg) -> Optional[str]:
        return None

    def _advance(self, state):
        self.nfe += 1
        z = state.z
        return z + self.opts.rate * (state.blocks[0](z, step=state.k + 1) - z)

    def step_program(self, blocks):
        """Its step does not read the step index: ONE step program, ``z -> z``, is its own step."""
        return StepPlan(steps=[lambda z: self._advance(StepState(blocks, z))])


@pytest.fixture
def damped(monkeypatch):
    monkeypatch.setitem(CORES, "damped", Damped)
    return "damped"


@pytest.mark.parametrize("check", [conformance.test_stepping_by_hand_gives_the_states_of_one_pass,
                                   conformance.test_block_uses_equal_the_counted_block_calls,
                                   conformance.test_analytic_flops_equal_the_counted_flops,
                                   conformance.test_step_of_call_is_the_step_the_call_runs_in,
                                   conformance.test_the_step_program_chained_in_eager_gives_the_states_of_one_pass])
def test_the_new_core_passes_the_conformance_suite(damped, check):
    check(damped, {})
    check(damped, {"rate": 0.25})


def test_a_core_that_does_not_answer_step_program_fails_the_conformance_suite(monkeypatch):
    class Silent(Damped):
        name = "silent"
        step_program = Core.step_program  # a new core that forgot the hook

    monkeypatch.setitem(CORES, "silent", Silent)
    with pytest.raises(NotImplementedError, match="step_program"):
        conformance.test_the_step_program_chained_in_eager_gives_the_states_of_one_pass("silent", {})


def test_the_new_core_is_a_model_option_with_its_own_checked_options(damped):
    m = create_model("bvit_tiny", core="damped", rate=1.0, steps=3, **TINY).eval()
    plain = create_model("bvit_tiny", steps=3, **TINY).eval()
    plain.load_state_dict(m.state_dict())  # same keys: a core holds no block
    x = conformance._x()
    with torch.no_grad():  # rate 1 is the plain recurrence
        assert torch.allclose(m(x), plain(x), atol=1e-6)
    with pytest.raises(ValueError, match="rate must be in"):
        create_model("bvit_tiny", core="damped", rate=2.0, **TINY)
    with pytest.raises(ValueError, match="method does not apply to the damped core"):
        create_model("bvit_tiny", core="damped", method="rk4", **TINY)


@pytest.mark.slow
def test_the_new_core_trains_and_sweeps_beyond_its_horizon(damped, tmp_path):
    from recurvit.analysis.horizon import horizon_sweep
    from recurvit.config import load_config
    from recurvit.run.loaders import build_test_loader
    from recurvit.tasks import train
    import recurvit

    cfg = load_config(None, ["model.core=damped", "model.rate=0.5", "model.steps=2", "model.embed_dim=16",
                             "model.num_heads=2", "model.patch_size=4", "train.epochs=5", "train.batch_size=64", "train.lr=3e-3",
                             "train.warmup_epochs=0.5", "train.progress=false"])
    metrics = train(cfg, tmp_path / "run", log=lambda *a: None)
    assert metrics["test_acc"] > 0.25  # digits, 5 epochs of a width-16 model (chance 0.1): it learns
    loaded = recurvit.load(tmp_path / "run")
    model, cfg = loaded.model, loaded.config
    assert model.cfg.core == "damped" and model.core.opts.rate == 0.5
    sweep = horizon_sweep(model, build_test_loader(cfg)[0], torch.device("cpu"), 4)
    assert len(sweep["accuracy"]) == 4
