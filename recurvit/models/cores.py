"""How depth is executed. A core turns embedded tokens into a sequence of states.

Every core holds only its OWN parameters (step conditioning, routers); the blocks live on the
model (``model.blocks``) and are passed in, so a bViT, its ODE twin and its SoftMoR twin share
state_dict keys. ``core.states(blocks, z, steps)`` yields the state after each step: one pass
of ``steps`` block applications gives every intermediate readout.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Iterator, Optional

import torch
import torch.nn as nn

from ..layers.step_cond import StepConditioning


class Core(nn.Module):
    """Base: ``nominal_steps`` is the trained depth, ``max_steps`` the most a core can run (None: any)."""

    kind = "base"
    recurrent = False

    def __init__(self, nominal_steps: int):
        super().__init__()
        self.nominal_steps = nominal_steps
        self.nfe = 0  # block evaluations in the last forward pass

    @property
    def max_steps(self) -> Optional[int]:
        return None

    def check_steps(self, steps: Optional[int]) -> int:
        steps = self.nominal_steps if steps is None else int(steps)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if self.max_steps is not None and steps > self.max_steps:
            raise ValueError(f"this {self.kind} model has {self.max_steps} blocks; steps must be <= {self.max_steps}, got {steps}")
        return steps

    def states(self, blocks: nn.ModuleList, z: torch.Tensor, steps: int,
               grad_last: Optional[int] = None) -> Iterator[torch.Tensor]:
        raise NotImplementedError


class Stack(Core):
    """L independent blocks; the state after block l is step l. Runs at most L steps."""

    kind = "stack"

    def __init__(self, depth: int):
        super().__init__(depth)

    @property
    def max_steps(self) -> int:
        return self.nominal_steps

    def states(self, blocks, z, steps, grad_last=None):
        self.nfe = 0
        for i in range(steps):
            with _grad_ctx(i, steps, grad_last):
                z = blocks[i](z)
            self.nfe += 1
            yield z


class Recurrent(Core):
    """One block applied T times: z_{t+1} = F_t(z_t) (see layers/step_cond.py for F_t)."""

    kind = "recurrent"
    recurrent = True

    def __init__(self, steps: int, dim: int, step_cond: str = "none", reinject: bool = False):
        super().__init__(steps)
        self.cond = StepConditioning(step_cond, steps, dim, reinject)

    def states(self, blocks, z, steps, grad_last=None):
        self.nfe = 0
        block, x0 = blocks[0], z
        for t in range(steps):
            with _grad_ctx(t, steps, grad_last):
                z = self.cond(block, z, t, x0)
            self.nfe += 1
            yield z


def _grad_ctx(t: int, steps: int, grad_last: Optional[int]):
    """Truncated backpropagation: only the last ``grad_last`` steps record a graph."""
    if grad_last is None or grad_last <= 0 or t >= steps - grad_last:
        return nullcontext()
    return torch.no_grad()


CORES = ("stack", "recurrent", "ode", "softmor")
