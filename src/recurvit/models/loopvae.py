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

Conditioning: each core owns learned scale and loop embeddings, c(s, l) = scale_embed[s] +
loop_embed[l], that modulate every block's normalisations (adaptive GroupNorm / LayerNorm); loops
beyond the trained count reuse the scale's LAST trained loop entry, so a model runs for any number
of loops (the choice is documented in :mod:`recurvit.models.loopvae_core`).

``core="unshared"`` is the reference: the SAME execution graph (same conditioning, same
transitions) but an independent set of ``depth`` blocks for every (scale, loop) application;
extra loops beyond the trained count reuse the scale's last set.

Interventions (recurrence studies) are arguments of :meth:`LoopVAE.forward`: run fewer or more
loops per scale (``loops`` / ``enc_loops`` / ``dec_loops``) and scale ONE loop's update,
``h <- h + factor * (core_l(h) - h)`` (``update_scale={("decoder", s, l): factor}``).

Files: this module holds the config, the model and its registered presets (and re-exports the
parts); the core and its conditioned blocks are in ``loopvae_core.py``, the encoder, decoder,
transitions and posterior in ``loopvae_codec.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .loopvae_codec import Decoder, DiagonalGaussian, Encoder, UpdateScale
from .loopvae_core import AdaGroupNorm, AdaLNBlock, ConvBlock, LoopCore, LoopScaleEmbedding
from .registry import register

OPERATORS = ("conv", "transformer")
CORES = ("shared", "unshared")
LATENTS = ("single", "multi")
SIDES = ("encoder", "decoder")

LoopSpec = Union[None, int, Sequence[int]]


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
