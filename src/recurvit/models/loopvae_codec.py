"""The LoopVAE's encoder and decoder around their loop cores (:mod:`recurvit.models.loopvae_core`):
stem, resolution-changing transitions (own parameters at every scale), latent heads, the diagonal
Gaussian posterior, and the output head. The execution graph is described in
:mod:`recurvit.models.loopvae`.
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .loopvae_core import LoopCore

from .loopvae_config import LoopVAEConfig

UpdateScale = Mapping[Tuple[str, int, int], float]


# ------------------------------------------------------------------------------ transitions
def _sincos_2d(dim: int, h: int, w: int, device, dtype) -> torch.Tensor:
    """Fixed 2-D sine-cosine position code, (1, dim, h, w) (MAE style; dim divisible by 4 or padded)."""
    q = dim // 4
    if q == 0:
        return torch.zeros(1, dim, h, w, device=device, dtype=dtype)
    omega = 1.0 / (10000 ** (torch.arange(q, device=device, dtype=torch.float32) / max(q, 1)))
    ys, xs = torch.meshgrid(torch.arange(h, device=device, dtype=torch.float32),
                            torch.arange(w, device=device, dtype=torch.float32), indexing="ij")
    parts = []
    for grid in (ys, xs):
        arg = grid[None] * omega[:, None, None]  # (q, h, w)
        parts += [arg.sin(), arg.cos()]
    pe = torch.cat(parts, 0)
    if pe.shape[0] < dim:
        pe = torch.cat([pe, pe.new_zeros(dim - pe.shape[0], h, w)], 0)
    return pe[None].to(dtype)


def _down(cfg: LoopVAEConfig) -> nn.Module:
    C = cfg.embed_dim
    if cfg.operator == "conv":
        return nn.Conv2d(C, C, 3, stride=2, padding=1)
    return nn.Sequential(nn.GroupNorm(1, C, eps=1e-6), nn.Conv2d(C, C, 2, stride=2))  # patch merging


def _up(cfg: LoopVAEConfig) -> nn.Module:
    C = cfg.embed_dim
    if cfg.operator == "conv":
        return nn.Sequential(nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(C, C, 3, padding=1))
    return nn.Sequential(nn.GroupNorm(1, C, eps=1e-6), nn.Conv2d(C, 4 * C, 1), nn.PixelShuffle(2))  # patch expanding


def _head(cfg: LoopVAEConfig, out: int) -> nn.Module:
    return nn.Sequential(nn.GroupNorm(cfg.groups, cfg.embed_dim, eps=1e-6), nn.SiLU(),
                         nn.Conv2d(cfg.embed_dim, out, 3, padding=1))


class DiagonalGaussian:
    """q(z | x) = N(mean, diag(exp(logvar))) over (B, z, h, w)."""

    def __init__(self, moments: torch.Tensor):
        self.mean, logvar = moments.chunk(2, dim=1)
        self.logvar = logvar.clamp(-30.0, 20.0)

    @property
    def std(self) -> torch.Tensor:
        return torch.exp(0.5 * self.logvar)

    def sample(self) -> torch.Tensor:
        return self.mean + self.std * torch.randn_like(self.mean)

    def mode(self) -> torch.Tensor:
        return self.mean

    def kl(self) -> torch.Tensor:
        """KL(q || N(0, I)) per item, summed over latent elements: (B,)."""
        return 0.5 * (self.mean.pow(2) + self.logvar.exp() - 1.0 - self.logvar).flatten(1).sum(1)


# ------------------------------------------------------------------------------ encoder / decoder
class Encoder(nn.Module):
    def __init__(self, cfg: LoopVAEConfig):
        super().__init__()
        self.cfg = cfg
        C, p, S = cfg.embed_dim, cfg.patch_size, cfg.num_scales
        self.stem = nn.Conv2d(cfg.in_chans, C, p, stride=p) if p > 1 else nn.Conv2d(cfg.in_chans, C, 3, padding=1)
        self.core = LoopCore(cfg, cfg.loops)
        self.down = nn.ModuleList(_down(cfg) for _ in range(S - 1))
        n_heads = S if cfg.latent == "multi" else 1
        self.heads = nn.ModuleList(_head(cfg, 2 * cfg.z_channels) for _ in range(n_heads))

    def forward(self, x: torch.Tensor, loops: Optional[Sequence[int]] = None,
                update_scale: Optional[UpdateScale] = None) -> List[DiagonalGaussian]:
        """Posteriors, finest scale first (single latent: a list of one, the coarsest)."""
        S = self.cfg.num_scales
        h = self.stem(x)  # (B, C, H/p, W/p)
        if self.cfg.operator == "transformer":
            h = h + _sincos_2d(h.shape[1], h.shape[2], h.shape[3], h.device, h.dtype)
        posts = []
        for s in range(S):
            h = self.core(h, s, None if loops is None else loops[s], _per_scale(update_scale, "encoder", s))
            if self.cfg.latent == "multi":
                posts.append(DiagonalGaussian(self.heads[s](h)))
            if s < S - 1:
                h = self.down[s](h)  # (B, C, H/2, W/2)
        if self.cfg.latent == "single":
            posts.append(DiagonalGaussian(self.heads[0](h)))
        return posts


class Decoder(nn.Module):
    def __init__(self, cfg: LoopVAEConfig):
        super().__init__()
        self.cfg = cfg
        C, p, S = cfg.embed_dim, cfg.patch_size, cfg.num_scales
        n_in = S if cfg.latent == "multi" else 1
        self.from_latent = nn.ModuleList(nn.Conv2d(cfg.z_channels, C, 3, padding=1) for _ in range(n_in))
        self.core = LoopCore(cfg, cfg.dec_loops)
        self.up = nn.ModuleList(_up(cfg) for _ in range(S - 1))  # up[s]: scale s+1 -> scale s
        self.out = nn.Sequential(nn.GroupNorm(cfg.groups, C, eps=1e-6), nn.SiLU(),
                                 nn.Conv2d(C, cfg.in_chans * p * p, 3, padding=1))
        self.shuffle = nn.PixelShuffle(p) if p > 1 else nn.Identity()

    def forward(self, zs: Sequence[torch.Tensor], loops: Optional[Sequence[int]] = None,
                update_scale: Optional[UpdateScale] = None) -> torch.Tensor:
        """zs: latents finest scale first (single: [z_coarsest]) -> image (B, in_chans, H, W)."""
        S = self.cfg.num_scales
        h = self.from_latent[-1](zs[-1])  # (B, C, h, w) at the coarsest scale
        if self.cfg.operator == "transformer":
            h = h + _sincos_2d(h.shape[1], h.shape[2], h.shape[3], h.device, h.dtype)
        for s in reversed(range(S)):
            if self.cfg.latent == "multi" and s < S - 1:
                h = h + self.from_latent[s](zs[s])
            h = self.core(h, s, None if loops is None else loops[s], _per_scale(update_scale, "decoder", s))
            if s > 0:
                h = self.up[s - 1](h)  # (B, C, 2H, 2W)
        return self.shuffle(self.out(h))


def _per_scale(update_scale: Optional[UpdateScale], side: str, scale: int) -> Optional[Dict[int, float]]:
    if not update_scale:
        return None
    return {loop: float(f) for (sd, s, loop), f in update_scale.items() if sd == side and s == scale} or None
