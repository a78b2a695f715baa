"""Multi-head self-attention through F.scaled_dot_product_attention (timm key names)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lora import linear


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
        """x: (B, N, C) -> (B, N, C); ``step``: the block's step, for per-step adapters (layers/lora.py)."""
        B, N, C = x.shape
        qkv = linear(self.qkv, x, step).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, N, head_dim)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, N, heads * head_dim)
        return self.proj_drop(linear(self.proj, x, step))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Explicit softmax(q k^T / sqrt(d)) for analysis: (B, heads, N, N). Not used in forward."""
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, _ = qkv.unbind(0)
        return (q @ k.transpose(-2, -1) * self.head_dim ** -0.5).softmax(dim=-1)
