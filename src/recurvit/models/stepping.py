"""What every model around a depth core shares: its trained depth, and its states step by step from ONE pass
of the core over the embedded input (the ViT family in vit.py, DeepThinking's conv net in dtnet.py).

A model using it defines ``embed`` (input -> the core's first state), ``blocks``, ``core`` and ``norm``."""
from __future__ import annotations

from typing import Iterator, Optional

import torch


class Stepping:
    @property
    def nominal_steps(self) -> int:
        return self.core.nominal_steps

    @property
    def nfe(self) -> int:
        """Block applications of the last forward (the core counts them)."""
        return self.core.nfe

    def iter_states(self, x: torch.Tensor, steps: Optional[int] = None,
                    grad_last: Optional[int] = None) -> Iterator[torch.Tensor]:
        """Yields the state after each of ``steps`` block applications (the trained depth by default);
        ``grad_last``: only the last that many steps record a graph (truncated backpropagation)."""
        steps = self.core.check_steps(steps)
        return self.core.states(self.blocks, self.embed(x), steps, grad_last=grad_last)

    def forward_features(self, x: torch.Tensor, steps: Optional[int] = None,
                         grad_last: Optional[int] = None) -> torch.Tensor:
        """The normed state after ``steps`` steps."""
        z = None
        for z in self.iter_states(x, steps, grad_last):
            pass
        return self.norm(z)
