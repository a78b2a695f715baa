"""Two-layer GELU MLP (timm key names fc1 / fc2); ``conv=True``: SegFormer's Mix-FFN (Xie et al. 2021), a 3x3
depthwise convolution over the patch grid between fc1 and the activation, so every token mixes with its
neighbours and a zero-padded border tells the grid's edge (position information that holds on any grid). The
patch tokens form a square grid after ``num_prefix_tokens`` prefix tokens, which the convolution skips."""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lora import linear


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float = 0.0, conv: bool = False, num_prefix_tokens: int = 0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden) if conv else None
        self.num_prefix_tokens = num_prefix_tokens
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def mix(self, h: torch.Tensor) -> torch.Tensor:
        """The depthwise convolution over the patch tokens' square grid: (B, N, M) -> (B, N, M)."""
        p = self.num_prefix_tokens
        B, N, M = h.shape
        g = math.isqrt(N - p)
        if g * g != N - p:
            raise ValueError(f"mlp_conv reads the patch tokens as a square grid; got {N - p} tokens")
        # functional, not the module's call: a recurrent core calls one block many times, and int8 PT2E
        # quantization (export/int8.py) cannot partition a conv module called more than once
        grid = F.conv2d(h[:, p:].transpose(1, 2).reshape(B, M, g, g), self.dwconv.weight, self.dwconv.bias,
                        padding=1, groups=M).flatten(2).transpose(1, 2)
        return torch.cat([h[:, :p], grid], dim=1) if p else grid

    def forward(self, x, step: Optional[int] = None):
        """``step``: the block's step, for per-step adapters (layers/lora.py)."""
        h = linear(self.fc1, x, step)
        if self.dwconv is not None:
            h = self.mix(h)
        return self.drop2(linear(self.fc2, self.drop1(self.act(h)), step))
