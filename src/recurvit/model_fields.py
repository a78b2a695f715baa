"""The architecture fields of the model configs, declared once.

``ViTFields`` and ``LoopVAEFields`` list what a model is (width, depth, patch size, ...) with their
defaults. The model configs in ``recurvit.models`` (``ViTConfig``, ``LoopVAEConfig``) extend them with
checks and derived sizes; the run configs (``recurvit.config.ModelConfig``,
``recurvit.tasks.vae.config.VAEModelConfig``) are derived from them by :func:`preset_schema`: a registry
preset's name and every field again, left None to take the preset's value. A field added here is a
field of the model and a key of the run config at once, so neither is a hand-kept mirror of the other.

A float field whose values are bounded declares its range once (:func:`bounded`); every config is checked
against it when it is loaded (``recurvit.config.check_choices``), before anything trains.

This module imports neither torch nor the model package, so that loading a run config stays light.
"""
import math
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Range:
    """The values a number field takes: finite, above ``low`` (or equal to it, with ``low_closed``) and below
    ``high`` (None: no upper bound)."""

    low: float
    low_closed: bool = True
    high: Optional[float] = None

    def holds(self, value: Any) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        return above and (self.high is None or value < self.high)

    def __str__(self) -> str:
        if self.high is not None:
            return f"a number in {'[' if self.low_closed else '('}{self.low:g}, {self.high:g})"
        return f"a finite number {'>=' if self.low_closed else '>'} {self.low:g}"


def bounded(default: Any, low: float, low_closed: bool = True, high: Optional[float] = None) -> Any:
    """A number field with its :class:`Range` (None, where it is the default, means "not set" and passes)."""
    return field(default=default, metadata={"range": Range(low, low_closed, high)})


POSITIVE = dict(low=0.0, low_closed=False)  # > 0
RATE = dict(low=0.0, high=1.0)  # a probability of dropping: [0, 1)


@dataclass
class ViTFields:
    img_size: int = 224  # input resolution (square); a run's None follows the data set
    patch_size: int = 16  # patch side; must divide img_size
    in_chans: int = 3  # image channels; a run's None follows the data set
    num_classes: int = 1000  # classifier outputs (0: no head, pooled features come out); a run's None follows the data
    embed_dim: int = 192  # width D
    depth: int = 12  # blocks stored (1 for a core with ONE shared block)
    num_heads: int = 3  # attention heads; D must be divisible by it
    mlp_ratio: float = bounded(4.0, **POSITIVE)  # MLP hidden = mlp_ratio * D
    qkv_bias: bool = True  # bias on the fused qkv projection
    class_token: bool = True  # prepend a learned [CLS] token
    global_pool: str = "token"  # token: read [CLS]; avg: mean of patch tokens (timm: fc_norm instead of norm); "": none
    init_values: Optional[float] = bounded(None, 0.0)  # LayerScale init (None: no LayerScale; a scale, not < 0)
    drop_rate: float = bounded(0.0, **RATE)  # dropout on the pooled feature before the head
    drop_path: float = bounded(0.0, **RATE)  # stochastic depth (linear over depth in a stack, constant in a loop)
    core: str = "stack"  # how depth runs: a name in models.cores.CORES (stack | recurrent | ode | softmor)
    steps: Optional[int] = None  # block-application steps at the trained depth (None: the core's default)
    stage_heads: int = 0  # >1: one head per deep-supervision stage (the last one is `head`)
    dense: bool = False  # per-pixel logits (B, classes, H, W): each patch token predicts its p x p pixels
    dynamic_img_size: bool = False  # any square input (a multiple of patch_size): the position embedding is
    # resampled to the input's patch grid as timm's dynamic_img_size does (bicubic, timm's resample_abs_pos_embed)
    pos_embed: str = "learned"  # learned: an absolute embedding added to the patch tokens (timm's); rope: no
    # absolute embedding, a 2D rotary embedding of the integer patch coordinates on q and k in every attention
    # (timm's RotaryEmbeddingCat, as EVA): attention scores depend on relative offsets only, the same on any grid;
    # none: no position information but what the tokens carry (with mlp_conv: the convolution's zero padding)
    mlp_conv: bool = False  # SegFormer's Mix-FFN: a 3x3 depthwise convolution over the patch grid between the
    # MLP's fc1 and its activation (local mixing, the same on any grid; not timm's layout)


@dataclass
class LoopVAEFields:
    img_size: int = 32  # input resolution (square); a run's None follows the data set
    in_chans: int = 3  # a run's None follows the data set
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
    mlp_ratio: float = bounded(2.0, **POSITIVE)  # transformer operator: MLP hidden = mlp_ratio * embed_dim
    groups: int = 8  # GroupNorm groups (conv operator, transitions and heads)
    cond_dim: Optional[int] = None  # width of the (scale, loop) embeddings; None: embed_dim
    mod_init: float = bounded(0.02, 0.0)  # std of the modulation layers' weights (0: conditioning starts inert)


def preset_schema(name: str, arch: type, default_preset: str, doc: str, module: str,
                  extra: Sequence[Tuple[str, Any, Any]] = ()) -> type:
    """A run config's model section: ``name`` (the preset, ``default_preset`` unless set) and every
    field of ``arch`` as Optional with default None ("the preset's value"), then ``extra`` fields
    (``(name, type, dataclasses.field(...))``). A dataclass, so OmegaConf types and checks it;
    ``module`` is the module that exposes it (where it is pickled from and documented). A field's declared
    range (:func:`bounded`) goes with it."""
    own = [(f.name, Optional[f.type], field(default=None, metadata=f.metadata)) for f in fields(arch)]
    cls = make_dataclass(name, [("name", str, field(default=default_preset)), *own, *extra])
    cls.__doc__ = doc
    cls.__module__ = module
    return cls


def options_field() -> Tuple[str, Any, Any]:
    """The ``options`` field of ModelConfig: the core's own options (its Options, as a mapping)."""
    return ("options", Dict[str, Any], field(default_factory=dict))


__all__ = ["ViTFields", "LoopVAEFields", "Range", "bounded", "preset_schema", "options_field"]
