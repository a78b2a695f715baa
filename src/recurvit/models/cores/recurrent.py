"""``Recurrent``: one block applied T times, z_{t+1} = F_t(z_t) (bViT).

F_t is the block with optional step conditioning and input re-injection (layers/step_cond.py);
without either it is exactly z_{t+1} = F(z_t).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ...layers.step_cond import STEP_CONDITIONING, StepConditioning
from .base import Core, StepPlan, check_choice


@dataclass
class RecurrentOptions:
    step_cond: str = "none"  # none | embed | scale (layers/step_cond.py)
    reinject: bool = False  # add the embedded input to the block's input at every step


class Recurrent(Core):
    name = "recurrent"
    Options = RecurrentOptions
    shares_blocks = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.cond = StepConditioning(self.opts.step_cond, cfg.steps, cfg.embed_dim, self.opts.reinject)

    @classmethod
    def check_options(cls, opts) -> None:
        check_choice("step_cond", opts.step_cond, STEP_CONDITIONING)

    @classmethod
    def block_uses(cls, cfg, steps: Optional[int] = None) -> List[int]:
        return [cfg.steps if steps is None else int(steps)]

    @classmethod
    def calls_per_step(cls, cfg) -> int:
        return 1

    @classmethod
    def unrollable(cls, cfg) -> bool:
        return cfg.options.step_cond == "none" and not cfg.options.reinject

    @classmethod
    def describe(cls, cfg) -> str:
        o = cfg.options
        return " ".join([cls.name] + ([f"step_cond={o.step_cond}"] if o.step_cond != "none" else [])
                        + (["reinject"] if o.reinject else []))

    @classmethod
    def cannot_step(cls, cfg) -> Optional[str]:
        return None

    def begin(self, blocks, z):
        state = super().begin(blocks, z)
        if self.cond.reinject:
            state.rows["x0"] = z  # re-injected at every step: leaves the batch with its image
        return state

    def _advance(self, state):
        self.nfe += 1
        return self.cond(state.blocks[0], state.z, state.k, state.rows.get("x0"), step=state.k + 1)

    def step_program(self, blocks) -> StepPlan:
        """ONE step program for every step (one block's weights), ``z -> z``: the same ``StepConditioning``
        call as ``_advance``, with the 0-based step index a tensor input where the step is conditioned (embed /
        scale: past the trained steps the last learned entry, as in eager), and with re-injection the embedded
        input ``x0``, a constant."""
        cond, block = self.cond, blocks[0]

        def advance(z, step=None, x0=None):
            return cond(block, z, step, x0)

        return StepPlan(steps=[advance], step_index=cond.kind != "none",
                        constants=["x0"] if cond.reinject else [],
                        begin=(lambda z: (z,)) if cond.reinject else (lambda z: ()))
