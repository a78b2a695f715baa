"""LoopVAE: a hierarchical VAE whose encoder and decoder each reuse ONE small core of blocks within
and across scales; the resolution-changing transitions keep their own parameters.

Execution graph (S = len(loops) scales, finest first; p = patch_size; C = embed_dim everywhere,
because one core serves every scale)::

    encoder: stem (p x p patchify, or 3x3 conv for p=1)                      # (B, C, H/p, W/p)
             for s in 0..S-1:  h = core(h, scale=s) applied loops[s] times     # same resolution
                               [multi latent: moments_s = head_s(h)]
                               h = down_s(h)            (not after the last scale) # (B, C, H/2, W/2)
             moments = head(h)                                               # (B, 2 z, H/p/2^(S-1), ...)
    latent:  diagonal Gaussian per latent scale (single: the coarsest only; multi: one per scale)
    decoder: h = from_latent(z_{S-1})
             for s in S-1..0:  [multi latent: h = h + from_latent_s(z_s), s < S-1]
                               h = core'(h, scale=s) applied decoder_loops[s] times
                               h = up_s(h)              (not after scale 0)
             out: norm -> SiLU -> conv to in_chans * p^2 -> pixel shuffle   # (B, in_chans, H, W)

With the defaults (a 4-block core, loops 2, 2, 3 over three scales) the encoder and the decoder
each run 4 x 7 = 28 block applications, as in the LoopVAE abstract.

Conditioning (document of the choice): each core owns two learned tables, ``scale_embed``
(S x E) and ``loop_embed`` (max(loops) x E); the application at (scale s, loop l) gets
``c = scale_embed[s] + loop_embed[l]``. Every block maps c through its own linear layer to a
per-channel scale and shift of each of its normalisations (``norm(x) * (1 + gamma) + beta``):
adaptive GroupNorm (FiLM on GroupNorm without its own affine) in the convolutional residual
block, adaptive LayerNorm (DiT style, on both pre-norms) in the transformer block. The
modulation layers are initialised small but non-zero, so the conditioning already separates
(scale, loop) at initialisation. Loops beyond the trained count reuse the scale's LAST trained
loop entry (``l -> min(l, loops[s] - 1)``), so a model runs for any number of loops.

``core="unshared"`` is the reference: the SAME execution graph (same conditioning, same
transitions) but an independent set of ``depth`` blocks for every (scale, loop) application;
extra loops beyond the trained count reuse the scale's last set.

Interventions (recurrence studies) are arguments of :meth:`LoopVAE.forward`: run fewer or more
loops per scale (``loops`` / ``enc_loops`` / ``dec_loops``) and scale ONE loop's update,
``h <- h + factor * (core_l(h) - h)`` (``update_scale={("decoder", s, l): factor}``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers import Block
from .registry import register

OPERATORS = ("conv", "transformer")
CORES = ("shared", "unshared")
LATENTS = ("single", "multi")
SIDES = ("encoder", "decoder")

LoopSpec = Union[None, int, Sequence[int]]
UpdateScale = Mapping[Tuple[str, int, int], float]


@dataclass
class LoopVAEConfig:
    img_size: int = 32  # input resolution (square)
    in_chans: int = 3
    operator: str = "conv"  # conv (residual conv blocks, adaptive GroupNorm) | transformer (adaptive LayerNorm)
    core: str = "shared"  # shared (LoopVAE) | unshared (reference: own blocks at every application)
    embed_dim: int = 64  # width of every scale: one core serves them all
    depth: int = 4  # blocks in the core (one loop = depth block applications)
    loops: List[int] = field(default_factory=lambda: [2, 2, 3])  # encoder loops per scale, finest first
    decoder_loops: Optional[List[int]] = None  # None: the encoder's loops (mirror)
    patch_size: int = 2  # stem patchify: scale 0 runs at img_size / patch_size
    z_channels: int = 8  # latent channels
    latent: str = "single"  # single (coarsest scale) | multi (one latent per scale)
    num_heads: int = 4  # transformer operator
    mlp_ratio: float = 2.0  # transformer operator: MLP hidden = mlp_ratio * embed_dim
    groups: int = 8  # GroupNorm groups (conv operator, transitions and heads)
    cond_dim: Optional[int] = None  # width of the (scale, loop) embeddings; None: embed_dim
    mod_init: float = 0.02  # std of the modulation layers' weights (0: conditioning starts inert)

    def __post_init__(self):
        self.loops = [int(v) for v in self.loops]
        if self.decoder_loops is not None:
            self.decoder_loops = [int(v) for v in self.decoder_loops]
        if self.operator not in OPERATORS:
            raise ValueError(f"operator must be one of {', '.join(OPERATORS)}, got '{self.operator}'")
        if self.core not in CORES:
            raise ValueError(f"core must be one of {', '.join(CORES)}, got '{self.core}'")
        if self.latent not in LATENTS:
            raise ValueError(f"latent must be one of {', '.join(LATENTS)}, got '{self.latent}'")
        if not self.loops or min(self.loops) < 1:
            raise ValueError(f"loops must list >= 1 loop for every scale, got {self.loops}")
        if len(self.dec_loops) != len(self.loops) or min(self.dec_loops) < 1:
            raise ValueError(f"decoder_loops must list >= 1 loop for each of the {len(self.loops)} scales, "
                             f"got {self.decoder_loops}")
        if self.depth < 1 or self.embed_dim < 1 or self.z_channels < 1 or self.patch_size < 1:
            raise ValueError("depth, embed_dim, z_channels and patch_size must be >= 1")
        factor = self.patch_size * 2 ** (self.num_scales - 1)
        if self.img_size % factor:
            raise ValueError(f"img_size {self.img_size} must be divisible by patch_size * 2^(scales-1) = {factor}")
        if self.embed_dim % self.groups:
            raise ValueError(f"embed_dim {self.embed_dim} must be divisible by groups {self.groups}")
        if self.operator == "transformer" and self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} must be divisible by num_heads {self.num_heads}")

    @property
    def dec_loops(self) -> List[int]:
        return list(self.decoder_loops) if self.decoder_loops is not None else list(self.loops)

    @property
    def num_scales(self) -> int:
        return len(self.loops)

    @property
    def latent_size(self) -> int:
        """Side of the coarsest latent grid."""
        return self.img_size // (self.patch_size * 2 ** (self.num_scales - 1))

    @property
    def steps(self) -> int:
        """Block applications of the encoder at the trained loops (the ViT meaning of ``steps``)."""
        return self.depth * sum(self.loops)


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
            h = out if f is None else h + f * (out - h)
        if self.operator == "transformer":
            h = h.transpose(1, 2).reshape(B, C, H, W)
        return h

    def applications(self, loops: Optional[Sequence[int]] = None) -> int:
        return self.depth * sum(self.loops if loops is None else loops)


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


# ------------------------------------------------------------------------------------ model
class LoopVAE(nn.Module):
    """Encoder -> diagonal Gaussian latent(s) -> decoder. ``model(x)`` is the reconstruction
    (posterior mean in eval mode, a sample in train mode); the train loop computes the losses
    from :meth:`reconstruct`, which also returns the posteriors."""

    def __init__(self, cfg: LoopVAEConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    # ---- loops
    def _resolve(self, loops: LoopSpec, side_loops: LoopSpec, trained: Sequence[int]) -> List[int]:
        spec = side_loops if side_loops is not None else loops
        if spec is None:
            return list(trained)
        if isinstance(spec, int):
            spec = [spec] * len(trained)
        spec = [int(v) for v in spec]
        if len(spec) != len(trained) or min(spec) < 0:
            raise ValueError(f"loops must be one count >= 0 per scale ({len(trained)} scales), got {spec}")
        return spec

    def resolve_loops(self, loops: LoopSpec = None, enc_loops: LoopSpec = None,
                      dec_loops: LoopSpec = None) -> Tuple[List[int], List[int]]:
        """(encoder loops, decoder loops) per scale: an int means the same count at every scale."""
        return (self._resolve(loops, enc_loops, self.cfg.loops), self._resolve(loops, dec_loops, self.cfg.dec_loops))

    def block_applications(self, loops: LoopSpec = None, enc_loops: LoopSpec = None,
                           dec_loops: LoopSpec = None) -> Dict[str, int]:
        """Block applications of one forward pass: {"encoder", "decoder", "total"} (28, 28, 56 by default)."""
        e, d = self.resolve_loops(loops, enc_loops, dec_loops)
        enc, dec = self.encoder.core.applications(e), self.decoder.core.applications(d)
        return {"encoder": enc, "decoder": dec, "total": enc + dec}

    @property
    def blocks(self) -> nn.ModuleList:
        """Every core block, encoder first (an unregistered view: accounting counts their calls)."""
        return nn.ModuleList([*self.encoder.core.blocks, *self.decoder.core.blocks])

    def no_weight_decay(self):
        return {n for n, _ in self.named_parameters() if n.endswith(("scale_embed", "loop_embed"))}

    # ---- passes
    def encode(self, x: torch.Tensor, loops: LoopSpec = None, enc_loops: LoopSpec = None,
               update_scale: Optional[UpdateScale] = None) -> List[DiagonalGaussian]:
        e, _ = self.resolve_loops(loops, enc_loops, None)
        return self.encoder(x, e, update_scale)

    def decode(self, zs: Sequence[torch.Tensor], loops: LoopSpec = None, dec_loops: LoopSpec = None,
               update_scale: Optional[UpdateScale] = None) -> torch.Tensor:
        _, d = self.resolve_loops(loops, None, dec_loops)
        return self.decoder(zs, d, update_scale)

    def reconstruct(self, x: torch.Tensor, sample: Optional[bool] = None, loops: LoopSpec = None,
                    enc_loops: LoopSpec = None, dec_loops: LoopSpec = None,
                    update_scale: Optional[UpdateScale] = None) -> Tuple[torch.Tensor, List[DiagonalGaussian]]:
        """(reconstruction, posteriors). ``sample`` defaults to ``self.training``."""
        posts = self.encode(x, loops, enc_loops, update_scale)
        sample = self.training if sample is None else sample
        zs = [q.sample() if sample else q.mode() for q in posts]
        return self.decode(zs, loops, dec_loops, update_scale), posts

    def forward(self, x: torch.Tensor, loops: LoopSpec = None, enc_loops: LoopSpec = None,
                dec_loops: LoopSpec = None, update_scale: Optional[UpdateScale] = None,
                sample: Optional[bool] = None) -> torch.Tensor:
        return self.reconstruct(x, sample, loops, enc_loops, dec_loops, update_scale)[0]


def build_loopvae(cfg: LoopVAEConfig) -> LoopVAE:
    return LoopVAE(cfg)


# Presets: the defaults give 28 block applications per encoder and per decoder.
register("loopvae_conv", builder=build_loopvae, config_cls=LoopVAEConfig, operator="conv", core="shared")
register("loopvae_transformer", builder=build_loopvae, config_cls=LoopVAEConfig, operator="transformer",
         core="shared")
register("vae_unshared", builder=build_loopvae, config_cls=LoopVAEConfig, operator="conv", core="unshared")
register("vae_unshared_transformer", builder=build_loopvae, config_cls=LoopVAEConfig, operator="transformer",
         core="unshared")

__all__ = ["LoopVAEConfig", "LoopVAE", "LoopCore", "ConvBlock", "AdaLNBlock", "AdaGroupNorm",
           "LoopScaleEmbedding", "DiagonalGaussian", "build_loopvae", "OPERATORS", "CORES", "LATENTS"]
