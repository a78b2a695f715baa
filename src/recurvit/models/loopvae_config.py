"""LoopVAE's config (its own module so the core, the codec and the model import it without a cycle)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Union

from ..model_fields import LoopVAEFields

OPERATORS = ("conv", "transformer")
LOOPVAE_CORES = ("shared", "unshared")  # sharing of the VAE core (not models.cores.CORES: depth cores)
LATENTS = ("single", "multi")
SIDES = ("encoder", "decoder")

LoopSpec = Union[None, int, Sequence[int]]


@dataclass
class LoopVAEConfig(LoopVAEFields):
    """LoopVAE's architecture (the fields of :class:`recurvit.model_fields.LoopVAEFields`), checked,
    with its derived sizes."""

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
