"""One application of a shared block at step t: step conditioning and input re-injection.

The step is written in update form. With u = F(z') - z', where z' is the block's input,

    z_{t+1} = z_t + s_t * u            (s_t = 1 unless ``scale``)

and z' = z_t (+ x_0 when ``reinject``) (+ e_t when ``embed``). With neither option this is
exactly z_{t+1} = F(z_t) and is computed as such (bit-identical to the plain recurrence).

Options (config key ``model.step_cond``):
- ``none``: the block sees no step index; any number of steps runs unchanged.
- ``embed``: a learned vector e_t is added to every token of the block's input at step t.
  Initialised to zero (an untrained conditioning is the plain recurrence).
- ``scale``: a learned per-step, per-channel scale s_t on the block's update.
  Initialised to one (the plain recurrence).

Beyond the trained range (t >= ``num_steps`` learned entries) both learned options reuse the
LAST learned entry, so a model always runs for more steps than it was trained with.
The step index t may also be a 0-dim integer tensor (``index``): an exported step program
takes it as an input, and runs this same code.

``reinject`` adds the embedded input x_0 to the block's input at every step (input injection);
because the step is in update form, x_0 does not accumulate in the state.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
import torch.nn as nn

STEP_CONDITIONING = ("none", "embed", "scale")
Step = Union[int, torch.Tensor]  # the 0-based step: an int, or a 0-dim integer tensor (see ``index``)


class StepConditioning(nn.Module):
    def __init__(self, kind: str, num_steps: int, dim: int, reinject: bool = False):
        super().__init__()
        if kind not in STEP_CONDITIONING:
            raise ValueError(f"step_cond must be one of {', '.join(STEP_CONDITIONING)}, got '{kind}'")
        self.kind = kind
        self.num_steps = num_steps
        self.reinject = reinject
        if kind == "embed":
            self.step_embed = nn.Parameter(torch.zeros(num_steps, dim))
        elif kind == "scale":
            self.step_scale = nn.Parameter(torch.ones(num_steps, dim))

    def index(self, t: Step) -> Step:
        """The learned entry of the 0-based step ``t``, clamped to the learned entries. ``t`` is an int (the
        cores), or a 0-dim integer tensor: the step input of an exported step program (export/steps.py), which
        a tracer keeps as an input where an int would be baked into the program."""
        if isinstance(t, torch.Tensor):
            return t.clamp(0, self.num_steps - 1)
        return min(max(int(t), 0), self.num_steps - 1)

    def block_input(self, z: torch.Tensor, t: Step, x0: Optional[torch.Tensor]) -> torch.Tensor:
        if self.reinject:
            z = z + x0
        if self.kind == "embed":
            z = z + self.step_embed[self.index(t)]
        return z

    def update(self, block: Callable, z: torch.Tensor, t: Step, x0: Optional[torch.Tensor] = None,
               step: Optional[int] = None) -> torch.Tensor:
        """u(z, t) = s_t * (F(z') - z'): the vector field of the state-subtracted ODE (``step``: the
        1-based step the block is told, see layers/block.py)."""
        zin = self.block_input(z, t, x0)
        u = block(zin, step=step) - zin
        return self.step_scale[self.index(t)] * u if self.kind == "scale" else u

    def output(self, block: Callable, z: torch.Tensor, t: Step, x0: Optional[torch.Tensor] = None,
               step: Optional[int] = None) -> torch.Tensor:
        """F applied with conditioning, F_t(z) = z + u(z, t); the black-box ODE field."""
        if self.kind == "none" and not self.reinject:
            return block(z, step=step)
        return z + self.update(block, z, t, x0, step)

    forward = output  # one discrete recurrence step: z_{t+1} = F_t(z_t)

    def extra_repr(self) -> str:
        return f"kind={self.kind}, num_steps={self.num_steps}, reinject={self.reinject}"
