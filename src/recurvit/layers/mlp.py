"""Two-layer GELU MLP (timm key names fc1 / fc2)."""
from typing import Optional

import torch.nn as nn

from .lora import linear


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x, step: Optional[int] = None):
        """``step``: the block's step, for per-step adapters (layers/lora.py)."""
        return self.drop2(linear(self.fc2, self.drop1(self.act(linear(self.fc1, x, step))), step))
