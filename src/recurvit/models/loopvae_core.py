"""The LoopVAE core: ``depth`` blocks applied ``loops[s]`` times at every scale s, conditioned on
(scale, loop); the model around it is :mod:`recurvit.models.loopvae`.

Conditioning (document of the choice): each core owns two learned tables, ``scale_embed``
(S x E) and ``loop_embed`` (max(loops) x E); the application at (scale s, loop l) gets
``c = scale_embed[s] + loop_embed[l]``. Every block maps c through its own linear layer to a
per-channel scale and shift of each of its normalisations (``norm(x) * (1 + gamma) + beta``):
adaptive GroupNorm (FiLM on GroupNorm without its own affine) in the convolutional residual
block, adaptive LayerNorm (DiT style, on both pre-norms) in the transformer block. The
modulation layers are initialised small but non-zero, so the conditioning already separates
(scale, loop) at initialisation. Loops beyond the trained count reuse the scale's LAST trained
loop entry (``l -> min(l, loops[s] - 1)``), so a model runs for any number of loops.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import Block

from .loopvae_config import LoopVAEConfig


# ------------------------------------------------------------------------------ conditioning
class LoopScaleEmbedding(nn.Module):
    """c(s, l) = scale_embed[s] + loop_embed[l]: the vector every core block is modulated by."""

    def __init__(self, num_scales: int, num_loops: int, dim: int):
        super().__init__()
        self.scale_embed = nn.Parameter(torch.randn(num_scales, dim))
        self.loop_embed = nn.Parameter(torch.randn(num_loops, dim))

    def forward(self, scale: int, loop: int) -> torch.Tensor:
        return self.scale_embed[scale] + self.loop_embed[loop]  # (E,)


class AdaGroupNorm(nn.Module):
    """GroupNorm without its own affine, then a per-channel scale and shift computed from c."""

    def __init__(self, groups: int, dim: int, cond_dim: int, init: float):
        super().__init__()
        self.norm = nn.GroupNorm(groups, dim, eps=1e-6, affine=False)
        self.mod = nn.Linear(cond_dim, 2 * dim)
        _init_mod(self.mod, init)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.mod(c).chunk(2, dim=-1)  # each (C,)
        return self.norm(x) * (1 + gamma.view(1, -1, 1, 1)) + beta.view(1, -1, 1, 1)


def _init_mod(lin: nn.Linear, std: float) -> None:
    if std > 0:
        nn.init.normal_(lin.weight, std=std)
    else:
        nn.init.zeros_(lin.weight)
    nn.init.zeros_(lin.bias)


class ConvBlock(nn.Module):
    """Residual conv block: x + conv(SiLU(AdaGN(conv(SiLU(AdaGN(x, c)))), c)))."""

    def __init__(self, dim: int, groups: int, cond_dim: int, mod_init: float):
        super().__init__()
        self.norm1 = AdaGroupNorm(groups, dim, cond_dim, mod_init)
        self.conv1 = nn.Conv2d(dim, dim, 3, padding=1)
        self.norm2 = AdaGroupNorm(groups, dim, cond_dim, mod_init)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1)
        with torch.no_grad():  # small residual branches: 28 applications start close to identity
            self.conv2.weight.mul_(0.1)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # x: (B, C, H, W)
        h = self.conv1(F.silu(self.norm1(x, c)))
        h = self.conv2(F.silu(self.norm2(h, c)))
        return x + h


class AdaLNBlock(Block):
    """The library's pre-norm transformer block with adaptive LayerNorm on both norms."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, cond_dim: int, mod_init: float):
        super().__init__(dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=True)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.ada = nn.Linear(cond_dim, 4 * dim)  # -> scale1, shift1, scale2, shift2
        _init_mod(self.ada, mod_init)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # x: (B, N, C)
        g1, b1, g2, b2 = self.ada(c).chunk(4, dim=-1)
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x) * (1 + g1) + b1)))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x) * (1 + g2) + b2)))
        return x


# ------------------------------------------------------------------------------------- core
class LoopCore(nn.Module):
    """``depth`` blocks applied ``loops[s]`` times at scale s, conditioned on (s, loop).

    shared: one set of blocks for every application. unshared: one set per (scale, loop) of the
    trained graph, in execution order (``blocks[depth * k: depth * (k + 1)]`` is application set k).
    """

    def __init__(self, cfg: LoopVAEConfig, loops: Sequence[int]):
        super().__init__()
        self.operator = cfg.operator
        self.depth = cfg.depth
        self.loops = list(loops)
        cond_dim = cfg.cond_dim or cfg.embed_dim
        self.cond = LoopScaleEmbedding(len(self.loops), max(self.loops), cond_dim)
        sets = 1 if cfg.core == "shared" else sum(self.loops)
        self.shared = cfg.core == "shared"
        self.blocks = nn.ModuleList(self._block(cfg, cond_dim) for _ in range(sets * cfg.depth))
        self._offsets = [sum(self.loops[:s]) for s in range(len(self.loops))]
        self.update_log: Optional[list] = None  # a list: forward appends (scale, loop, ||dh|| / ||h|| per image)

    @staticmethod
    def _block(cfg: LoopVAEConfig, cond_dim: int) -> nn.Module:
        if cfg.operator == "conv":
            return ConvBlock(cfg.embed_dim, cfg.groups, cond_dim, cfg.mod_init)
        return AdaLNBlock(cfg.embed_dim, cfg.num_heads, cfg.mlp_ratio, cond_dim, cfg.mod_init)

    def trained_loop(self, scale: int, loop: int) -> int:
        """The loop index whose conditioning (and, unshared, blocks) run at ``loop``: extra loops reuse the last."""
        return min(loop, self.loops[scale] - 1)

    def block_set(self, scale: int, loop: int) -> Sequence[nn.Module]:
        if self.shared:
            return self.blocks
        k = self._offsets[scale] + self.trained_loop(scale, loop)
        return self.blocks[k * self.depth:(k + 1) * self.depth]

    def step(self, h: torch.Tensor, scale: int, loop: int) -> torch.Tensor:
        """One loop (``depth`` block applications) on h in the core's layout."""
        c = self.cond(scale, self.trained_loop(scale, loop)).to(h.dtype)
        for blk in self.block_set(scale, loop):
            h = blk(h, c)
        return h

    def forward(self, h: torch.Tensor, scale: int, loops: Optional[int] = None,
                update_scale: Optional[Mapping[int, float]] = None) -> torch.Tensor:
        """Run ``loops`` (default: trained) loops at ``scale`` on h (B, C, H, W).

        ``update_scale[l] = f`` replaces loop l's step by ``h + f * (step(h) - h)``.
        """
        n = self.loops[scale] if loops is None else int(loops)
        if n <= 0:
            return h
        B, C, H, W = h.shape
        if self.operator == "transformer":
            h = h.flatten(2).transpose(1, 2)  # (B, H*W, C)
        for loop in range(n):
            out = self.step(h, scale, loop)
            f = update_scale.get(loop) if update_scale else None
            new = out if f is None else h + f * (out - h)
            if self.update_log is not None:  # per image ||dh|| / ||h|| of this loop (vae.interventions.update_sizes)
                rel = (new - h).flatten(1).norm(dim=1) / h.flatten(1).norm(dim=1).clamp_min(1e-12)
                self.update_log.append((scale, loop, rel.detach().float().cpu()))
            h = new
        if self.operator == "transformer":
            h = h.transpose(1, 2).reshape(B, C, H, W)
        return h

    def applications(self, loops: Optional[Sequence[int]] = None) -> int:
        return self.depth * sum(self.loops if loops is None else loops)
