"""Pre-norm transformer block: the unit that ViT stacks and bViT repeats."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .attention import Attention
from .drop import DropPath
from .layer_scale import LayerScale
from .mlp import Mlp


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 init_values: Optional[float] = None, drop_path: float = 0.0, proj_drop: float = 0.0,
                 attn_drop: float = 0.0, rope: bool = False, num_prefix_tokens: int = 0, mlp_conv: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop,
                              rope=rope, num_prefix_tokens=num_prefix_tokens)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop, conv=mlp_conv, num_prefix_tokens=num_prefix_tokens)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
        """``step``: the 1-based step of the core this application belongs to, told by the core (so a
        recomputation under activation checkpointing is told the same step); passed on to the attention and
        the MLP, whose per-step adapters pick theirs by it (layers/lora.py)."""
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), step)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x), step)))
        return x
