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

Files: this module holds the model and its registered presets (and re-exports the parts); the
config is ``loopvae_config.py``, the core and its conditioned blocks are in ``loopvae_core.py``, the encoder, decoder,
transitions and posterior in ``loopvae_codec.py``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .loopvae_codec import Decoder, DiagonalGaussian, Encoder, UpdateScale
from .loopvae_config import LATENTS, LOOPVAE_CORES, OPERATORS, SIDES, LoopSpec, LoopVAEConfig  # noqa: F401
from .loopvae_core import AdaGroupNorm, AdaLNBlock, ConvBlock, LoopCore, LoopScaleEmbedding
from .registry import register

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

# The LoopVAE abstract's model ("the 29M-parameter convolutional model", ImageNet-256): a four-block
# shared conv core, loops (2, 2, 3) over three scales = 4 x 7 = 28 block applications per encoder and
# per decoder (the defaults), patch 2 and two 2x downsamplings = an f8 latent (32 x 32 at 256 px, as
# the KL-f8 reference VAE). The abstract gives no width: embed_dim=384 is the multiple of 32 whose
# stored parameter count is nearest 29M (384: 31.42M, +8.3%; 352: 26.41M, -8.9%; 320: 21.84M; 448:
# 42.73M) and the only multiple of 64 within 10% of it (256: 14.00M, 512: 55.78M); the sweep is
# recomputed by scripts/accounting.py (results/accounting/). Latent channels are not given either:
# z_channels keeps the default 8 (4, as KL-f8, would lower the count by 0.13%).
# vae_unshared_imagenet is its unshared twin: the same graph with own blocks at every application.
PAPER_SHAPE = dict(img_size=256, embed_dim=384)
register("loopvae_conv_imagenet", builder=build_loopvae, config_cls=LoopVAEConfig, operator="conv", core="shared",
         **PAPER_SHAPE)
register("vae_unshared_imagenet", builder=build_loopvae, config_cls=LoopVAEConfig, operator="conv",
         core="unshared", **PAPER_SHAPE)

__all__ = ["LoopVAEConfig", "LoopVAE", "LoopCore", "ConvBlock", "AdaLNBlock", "AdaGroupNorm",
           "LoopScaleEmbedding", "DiagonalGaussian", "build_loopvae", "OPERATORS", "LOOPVAE_CORES", "LATENTS"]
