"""Building blocks, one concept a file (timm style)."""
from .attention import Attention
from .block import Block
from .conv_block import ConvBlock
from .drop import DropPath
from .layer_scale import LayerScale
from .mlp import Mlp
from .patch_embed import PatchEmbed
from .step_cond import StepConditioning

__all__ = ["Attention", "Block", "ConvBlock", "DropPath", "LayerScale", "Mlp", "PatchEmbed", "StepConditioning"]
