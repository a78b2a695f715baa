"""DeepThinking's recurrent convolutional network (Schwarzschild et al. 2021; Bansal et al. 2022, the
convolutional anchor of the maze studies) on recurvit's depth cores:

    embed (3x3 projection + relu [, the input]) -> core (one shared ConvBlock, T steps) -> head (3x3 convs)

Logits are per pixel, (B, num_classes, H, W), the layout ``F.cross_entropy`` takes with (B, H, W) targets.
Fully convolutional: a model built at one image size runs at any other. The core is any entry of
``cores.CORES`` that runs on a state of any shape: ``recurrent`` (DeepThinking: ``steps`` applications of
one block, its options step_cond / reinject included), ``stack`` (``depth`` distinct blocks:
DeepThinking's feed-forward control), ``ode``. With ``recall`` (dt_net_recall, DeepThinking's
dt_net_recall_2d) the block reads the input image at every step (layers/conv_block.py); dt_net is the
same network without it.

At DeepThinking's maze width (128) dt_net_recall has 783,504 parameters, dt_net 632,592.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Type

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layers.conv_block import ConvBlock, conv3x3
from .cores import Core, core_class
from .stepping import Stepping
from .registry import register


@dataclass
class DTNetConfig:
    img_size: int = 24  # nominal input side (24: a 9x9 maze); any size runs
    in_chans: int = 3  # image channels
    num_classes: int = 2  # classes per pixel (mazes: off path / on path)
    width: int = 128  # channels of the state (DeepThinking's mazes: 128)
    recall: bool = True  # the block reads the input image at every step
    block_depth: int = 2  # residual blocks (two 3x3 convolutions each) in one application
    head_widths: Tuple[int, ...] = (32, 8)  # hidden 3x3 convolutions of the head, each followed by relu
    core: str = "recurrent"  # how depth runs: a name in models.cores.CORES
    steps: Optional[int] = None  # iterations at the trained depth (None: the core's default)
    depth: int = 1  # blocks stored (1 for a core with ONE shared block; L for a stack)
    options: Any = field(default=None)  # the core's own options

    def __post_init__(self):
        self.head_widths = tuple(int(w) for w in self.head_widths)
        for key in ("img_size", "in_chans", "num_classes", "width", "block_depth", "depth"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        core_class(self.core).resolve(self)  # fills steps and options, or ValueError

    @classmethod
    def build(cls, base: dict, overrides: dict) -> "DTNetConfig":
        """Preset values + flat overrides; keys that are not fields are the core's options."""
        merged = core_class(overrides.get("core", base.get("core", "recurrent"))).normalize_overrides(base, overrides)
        own = {f for f in cls.__dataclass_fields__}
        opts = dict(merged.pop("options", None) or {})
        opts.update({k: merged.pop(k) for k in list(merged) if k not in own})
        return cls(**merged, options=opts)

    @property
    def embed_dim(self) -> int:
        """Channels of the state the core steps: the width, plus the input's with recall."""
        return self.width + (self.in_chans if self.recall else 0)

    @property
    def core_cls(self) -> Type[Core]:
        return core_class(self.core)


class DTNet(Stepping, nn.Module):
    def __init__(self, cfg: DTNetConfig):
        super().__init__()
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.projection = conv3x3(cfg.in_chans, cfg.width)
        recall = cfg.in_chans if cfg.recall else 0
        self.blocks = nn.ModuleList([ConvBlock(cfg.width, recall, cfg.block_depth)
                                     for _ in range(cfg.core_cls.num_blocks(cfg))])
        self.core = cfg.core_cls(cfg)
        self.norm = nn.Identity()  # the readout reads the state as it is (the shared readout API: head(norm(z)))
        layers: List[nn.Module] = []
        chans = cfg.width
        for w in cfg.head_widths:
            layers += [conv3x3(chans, w), nn.ReLU()]
            chans = w
        layers.append(conv3x3(chans, cfg.num_classes))
        self.head = nn.Sequential(*layers)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Image (B, C, H, W) -> the state at step 0, channels-last (B, H, W, embed_dim)."""
        h = F.relu(self.projection(x))
        if self.cfg.recall:
            h = torch.cat([h, x], dim=1)  # DeepThinking's recall input, carried in the state
        return h.permute(0, 2, 3, 1)

    def forward_head(self, z: torch.Tensor, *, step: Optional[int] = None) -> torch.Tensor:
        """State (B, H, W, embed_dim) -> per-pixel logits (B, num_classes, H, W); the input channels a
        recall state carries are not read."""
        return self.head(z[..., : self.cfg.width].permute(0, 3, 1, 2))

    def forward(self, x: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        steps = self.core.check_steps(steps)
        return self.forward_head(self.forward_features(x, steps), step=steps)

    def forward_steps(self, x: torch.Tensor, steps: Optional[int] = None, at: Optional[Sequence[int]] = None,
                      grad_last: Optional[int] = None) -> torch.Tensor:
        """Logits after every step (or the 1-based steps in ``at``) in ONE pass: (K, B, classes, H, W)."""
        if at is not None and (not at or min(at) < 1 or list(at) != sorted(set(at))):
            raise ValueError(f"at must list distinct steps >= 1 in increasing order, got {list(at)}")
        steps = self.core.check_steps(steps if at is None else max(at))
        want = set(range(1, steps + 1)) if at is None else set(at)
        out = [self.forward_head(self.norm(z), step=k)
               for k, z in enumerate(self.iter_states(x, steps, grad_last), start=1) if k in want]
        return torch.stack(out)

    def extra_repr(self) -> str:
        return f"core={self.cfg.core}, steps={self.cfg.steps}, recall={self.cfg.recall}"


# DeepThinking's mazes configuration: width 128, 30 iterations (config/problem/mazes.yaml, dt_net_recall_2d)
register("dt_net_recall", DTNet, DTNetConfig, width=128, recall=True, steps=30, core="recurrent")
register("dt_net", DTNet, DTNetConfig, width=128, recall=False, steps=30, core="recurrent")

__all__ = ["DTNet", "DTNetConfig"]
