"""LoopVAE's config (its own module so the core, the codec and the model import it without a cycle)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

OPERATORS = ("conv", "transformer")
LOOPVAE_CORES = ("shared", "unshared")  # sharing of the VAE core (not models.cores.CORES: depth cores)
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
        if self.core not in LOOPVAE_CORES:
            raise ValueError(f"core must be one of {', '.join(LOOPVAE_CORES)}, got '{self.core}'")
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
