"""Multi-head self-attention through F.scaled_dot_product_attention (timm key names).

``rope=True``: q and k of the patch tokens are rotated by a 2D rotary embedding of their integer grid
coordinates (timm's ``RotaryEmbeddingCat`` with ``in_pixels=False``, the layout EVA uses), so a score depends
on the two tokens' offset alone and a block trained on one grid attends the same way on a larger one. The
patch tokens form a square grid after ``num_prefix_tokens`` prefix tokens, which are not rotated.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lora import linear


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, rope: bool = False, num_prefix_tokens: int = 0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.num_prefix_tokens = num_prefix_tokens
        self.rope = None
        if rope:
            from timm.layers import RotaryEmbeddingCat

            if self.head_dim % 4:
                raise ValueError(f"rope needs a head dim divisible by 4 (two axes, sin and cos), got {self.head_dim}")
            self.rope = RotaryEmbeddingCat(self.head_dim, in_pixels=False)  # integer coordinates: no rescaling

    def _qk(self, qkv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (each (B, heads, N, head_dim)), q and k rotated where ``rope``."""
        q, k, v = qkv.unbind(0)
        if self.rope is None:
            return q, k, v
        from timm.layers import apply_rot_embed_cat

        p, n = self.num_prefix_tokens, q.shape[-2] - self.num_prefix_tokens
        g = math.isqrt(n)
        if g * g != n:
            raise ValueError(f"rope reads the patch tokens as a square grid; got {n} tokens")
        emb = self.rope.get_embed(shape=[g, g]).to(device=q.device, dtype=q.dtype)
        q = torch.cat([q[:, :, :p], apply_rot_embed_cat(q[:, :, p:], emb)], dim=2)
        k = torch.cat([k[:, :, :p], apply_rot_embed_cat(k[:, :, p:], emb)], dim=2)
        return q, k, v

    def forward(self, x: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
        """x: (B, N, C) -> (B, N, C); ``step``: the block's step, for per-step adapters (layers/lora.py)."""
        B, N, C = x.shape
        qkv = linear(self.qkv, x, step).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = self._qk(qkv)  # each (B, heads, N, head_dim)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        x = x.transpose(1, 2).reshape(B, N, C)  # (B, N, heads * head_dim)
        return self.proj_drop(linear(self.proj, x, step))

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Explicit softmax(q k^T / sqrt(d)) for analysis: (B, heads, N, N). Not used in forward."""
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, _ = self._qk(qkv)
        return (q @ k.transpose(-2, -1) * self.head_dim ** -0.5).softmax(dim=-1)
