"""Building blocks, one concept a file (timm style)."""
from .attention import Attention
from .block import Block
from .drop import DropPath
from .layer_scale import LayerScale
from .mlp import Mlp
from .patch_embed import PatchEmbed
from .step_cond import StepConditioning

__all__ = ["Attention", "Block", "DropPath", "LayerScale", "Mlp", "PatchEmbed", "StepConditioning"]
