"""Vision transformer with a pluggable depth core: embed -> core (states) -> norm -> pool -> head.

With ``core="stack"`` this is timm's ``VisionTransformer`` (same state_dict keys, same forward).
With ``core="recurrent"`` it is bViT: the same embedding and readout around ONE block applied
``steps`` times. ``forward_steps`` reads logits out after every step in a single pass.

``dense=True`` reads every patch token instead of a pooled one: logits per pixel, (B, classes, H, W),
each token's head giving its p x p pixels (a dense task such as the mazes of data/mazes.py).
``dynamic_img_size=True`` runs a model at any square input size (a multiple of the patch size): the
learned position embedding is resampled to the input's patch grid by timm's ``resample_abs_pos_embed``
(at the built size nothing is resampled: the model is the one it was). ``pos_embed="rope"`` has no absolute
embedding: every attention rotates q and k by the tokens' integer grid coordinates (layers/attention.py), so
the block sees the same relative geometry on a larger grid (no ``pos_embed`` parameter; not timm's layout);
``pos_embed="none"`` has no position scheme at all, for ``mlp_conv=True`` (SegFormer's Mix-FFN: a 3x3
depthwise convolution in every MLP, layers/mlp.py), whose zero-padded border is the only absolute position.

Every core also answers timm's model contract (``forward_intermediates``, ``reset_classifier``,
``group_matcher``, ... in timm_contract.py, where an intermediate is the state after a STEP), and
the bvit_* / srvit_* presets are timm models too (timm_presets.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import torch
import torch.nn as nn

from ..layers import Block, PatchEmbed
from ..model_fields import ViTFields
from .adaptive import forward_adaptive
from .cores import Core, core_class
from .registry import WIDTHS, register
from .stepping import Stepping
from .timm_contract import POOLS, TimmContract

POS_EMBEDS = ("learned", "rope", "none")  # ViTFields.pos_embed


@dataclass
class ViTConfig(ViTFields):
    """A ViT with a depth core: the architecture fields of :class:`recurvit.model_fields.ViTFields`
    and the core's options (a mapping, or its Options dataclass once resolved)."""

    options: Any = None

    def __post_init__(self):
        core_class(self.core).resolve(self)  # fills steps and options, or ValueError

    @classmethod
    def build(cls, base: Dict[str, Any], overrides: Dict[str, Any]) -> "ViTConfig":
        """A config from preset values and flat overrides: keys that are not fields of this class
        are the core's options (``create_model("bvit_tiny", core="ode", method="rk4")``)."""
        merged = core_class(overrides.get("core", base.get("core", "stack"))).normalize_overrides(base, overrides)
        own = {f.name for f in fields(cls)}
        opts = dict(_as_mapping(merged.pop("options", None)))
        opts.update({k: merged.pop(k) for k in list(merged) if k not in own})
        return cls(**merged, options=opts)

    @property
    def core_cls(self) -> Type[Core]:
        return core_class(self.core)

    @property
    def num_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2


def _as_mapping(options: Any) -> Dict[str, Any]:
    if options is None:
        return {}
    if is_dataclass(options):
        return asdict(options)
    return dict(options)


class VisionTransformer(Stepping, TimmContract, nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.global_pool not in POOLS:
            raise ValueError(f"global_pool must be token, avg or '' (none), got '{cfg.global_pool}'")
        if cfg.global_pool == "token" and not cfg.class_token:
            raise ValueError("global_pool=token needs class_token=true")
        for key in ("img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads", "steps"):
            if int(getattr(cfg, key)) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(cfg, key)}")
        if int(cfg.num_classes) < 0:
            raise ValueError(f"num_classes must be >= 0, got {cfg.num_classes}")
        D = cfg.embed_dim
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool  # pooling of forward_head (reset_classifier may change it)
        self.embed_dim = self.num_features = self.head_hidden_size = D  # timm's widths: tokens, pooled
        self.has_class_token = cfg.class_token
        self.grad_checkpointing = False
        self.num_prefix_tokens = 1 if cfg.class_token else 0
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if cfg.class_token else None
        if cfg.pos_embed not in POS_EMBEDS:
            raise ValueError(f"pos_embed must be one of {', '.join(POS_EMBEDS)}, got '{cfg.pos_embed}'")
        rope = cfg.pos_embed == "rope"
        self.pos_embed = (None if cfg.pos_embed != "learned" else
                          nn.Parameter(torch.randn(1, cfg.num_patches + self.num_prefix_tokens, D) * 0.02))
        # recurrence shares one drop-path rate; a stack ramps it linearly as timm does
        dpr = [cfg.drop_path * i / (cfg.depth - 1) for i in range(cfg.depth)] if cfg.depth > 1 else [cfg.drop_path]
        self.blocks = nn.ModuleList([
            Block(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, cfg.init_values, dpr[i], rope=rope,
                  num_prefix_tokens=self.num_prefix_tokens, mlp_conv=cfg.mlp_conv) for i in range(cfg.depth)
        ])
        self.core = cfg.core_cls(cfg)
        use_fc_norm = cfg.global_pool == "avg"
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(D, eps=1e-6)
        self.fc_norm = nn.LayerNorm(D, eps=1e-6) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.stage_heads = None
        self._build_heads(cfg.num_classes)
        self._init_weights()

    def _build_heads(self, num_classes: int) -> None:
        """``head`` (and ``stage_heads``: one more per deep-supervision stage) with ``num_classes``
        outputs on the model's device and dtype; nn.Identity and no stage heads for 0."""
        w = self.patch_embed.proj.weight
        dd = dict(device=w.device, dtype=w.dtype)

        outputs = num_classes * self.cfg.patch_size ** 2 if self.cfg.dense else num_classes  # dense: a patch's pixels

        def make() -> nn.Module:
            return nn.Linear(self.embed_dim, outputs, **dd) if num_classes > 0 else nn.Identity()

        self.head = make()
        n_extra = max(self.cfg.stage_heads - 1, 0) if num_classes > 0 else 0
        self.stage_heads = nn.ModuleList([make() for _ in range(n_extra)]) if n_extra else None

    # ------------------------------------------------------------------ init
    def _init_weights(self):
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {"pos_embed", "cls_token", "core.bias"}

    # --------------------------------------------------------------- forward
    def embed(self, x: torch.Tensor) -> torch.Tensor:
        grid = (x.shape[-2] // self.cfg.patch_size, x.shape[-1] // self.cfg.patch_size)
        if grid[0] != grid[1] and (self.cfg.pos_embed == "rope" or self.cfg.mlp_conv or self.cfg.dense):
            # they read the tokens as a square grid: a non-square one of a square count would be misread silently
            raise ValueError(f"a {'rope' if self.cfg.pos_embed == 'rope' else 'mlp_conv' if self.cfg.mlp_conv else 'dense'}"
                             f" model reads a square grid of patches; got {grid[0]} x {grid[1]} "
                             f"(input {x.shape[-2]} x {x.shape[-1]})")
        x = self.patch_embed(x)  # (B, N, D)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
        if self.pos_embed is None:  # rope: positions enter in every attention; none: only through the tokens
            return x
        return x + self.pos_embed_for(grid)

    def pos_embed_for(self, grid: Tuple[int, int]) -> torch.Tensor:
        """The position embedding for a patch grid (rows, cols): the learned one at the built grid,
        resampled to another (bicubic, as timm) when ``dynamic_img_size``."""
        built = self.patch_embed.grid_size
        if grid == (built, built) or not self.cfg.dynamic_img_size:
            return self.pos_embed  # another grid without dynamic_img_size: the shapes disagree (an error)
        from timm.layers import resample_abs_pos_embed

        return resample_abs_pos_embed(self.pos_embed, list(grid), [built, built],
                                      num_prefix_tokens=self.num_prefix_tokens)

    def stage_of(self, step: int) -> int:
        """Deep-supervision stage (0-based) whose head reads out after ``step`` (1-based)."""
        S = max(self.cfg.stage_heads, 1)
        return min(S - 1, max(0, math.ceil(step * S / self.nominal_steps) - 1))

    def pool(self, z: torch.Tensor, pool_type: Optional[str] = None) -> torch.Tensor:
        """Tokens (B, T, D) -> (B, D): [CLS] (token) or mean of the patch tokens (avg); "" keeps them."""
        pool_type = self.global_pool if pool_type is None else pool_type
        if pool_type == "avg":
            return z[:, self.num_prefix_tokens:].mean(dim=1)
        return z[:, 0] if pool_type == "token" else z

    def forward_head(self, z: torch.Tensor, pre_logits: bool = False, *, step: Optional[int] = None) -> torch.Tensor:
        """Normed tokens (B, T, D) -> logits (timm's signature); ``pre_logits``: the pooled feature
        (B, head_hidden_size) instead. ``step`` picks the stage head when there are several. ``dense``:
        every patch token is read, logits (B, num_classes, H, W) (``pre_logits``: the tokens (B, N, D))."""
        x = self.head_drop(self.fc_norm(z[:, self.num_prefix_tokens:] if self.cfg.dense else self.pool(z)))
        if pre_logits:
            return x
        head = self.head
        if self.stage_heads is not None and step is not None:
            s = self.stage_of(step)
            if s < len(self.stage_heads):
                head = self.stage_heads[s]
        return self.unpatchify(head(x)) if self.cfg.dense and self.num_classes > 0 else head(x)

    def unpatchify(self, y: torch.Tensor) -> torch.Tensor:
        """Per-token outputs (B, N, p*p*C) of a square grid -> per-pixel (B, C, H, W)."""
        B, N, _ = y.shape
        g, p = math.isqrt(N), self.cfg.patch_size
        if g * g != N:
            raise ValueError(f"a dense head reads a square grid of patch tokens, got {N} tokens")
        y = y.reshape(B, g, g, p, p, -1)  # (B, rows, cols, p, p, C)
        return y.permute(0, 5, 1, 3, 2, 4).reshape(B, -1, g * p, g * p)

    def forward(self, x: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        steps = self.core.check_steps(steps)
        return self.forward_head(self.forward_features(x, steps), step=steps)

    def forward_adaptive(self, x: torch.Tensor, criterion: str = "kl", threshold: Optional[float] = 1e-3,
                         max_steps: Optional[int] = None, min_steps: int = 1, compact: bool = True):
        """Each image stops when ``criterion`` (kl | entropy | max_prob | state) meets ``threshold``:
        returns (logits (B, classes), steps used (B,)); exited images leave the batch (``compact``).
        See :func:`recurvit.models.adaptive.forward_adaptive`."""
        return forward_adaptive(self, x, criterion=criterion, threshold=threshold, max_steps=max_steps,
                                min_steps=min_steps, compact=compact)

    def forward_steps(self, x: torch.Tensor, steps: Optional[int] = None, at: Optional[Sequence[int]] = None,
                      grad_last: Optional[int] = None) -> torch.Tensor:
        """Logits read out after every step (or after the 1-based steps in ``at``), in ONE pass.

        Returns (K, B, num_classes) with K = steps (or len(at)); ``[k-1]`` equals ``model(x, steps=k)``.
        ``at`` lists distinct steps >= 1 in increasing order.
        """
        if at is not None and (not at or min(at) < 1 or list(at) != sorted(set(at))):
            raise ValueError(f"at must list distinct steps >= 1 in increasing order, got {list(at)}")
        steps = self.core.check_steps(steps if at is None else max(at))
        want = set(range(1, steps + 1)) if at is None else set(at)
        out: List[torch.Tensor] = []
        for k, z in enumerate(self.iter_states(x, steps, grad_last), start=1):
            if k in want:
                out.append(self.forward_head(self.norm(z), step=k))
        return torch.stack(out)

    def extra_repr(self) -> str:
        return f"core={self.cfg.core}, steps={self.cfg.steps}"


# ----------------------------------------------------------------------------------- presets
for _size, (_dim, _heads) in WIDTHS.items():
    register(f"vit_{_size}", VisionTransformer, ViTConfig, embed_dim=_dim, num_heads=_heads, depth=12, core="stack")
    register(f"bvit_{_size}", VisionTransformer, ViTConfig, embed_dim=_dim, num_heads=_heads, depth=1, steps=12,
             core="recurrent")
for _size in ("tiny", "small"):
    _dim, _heads = WIDTHS[_size]
    register(f"srvit_{_size}", VisionTransformer, ViTConfig, embed_dim=_dim, num_heads=_heads, depth=12,
             core="softmor", recursions=2)
