"""DeepThinking's recurrent convolutional block (Schwarzschild et al. 2021, Bansal et al. 2022): the unit
its networks apply over and over, here applied by recurvit's depth cores like the transformer Block.

One application: with recall, a 3x3 convolution of [state, input] (the input image concatenated to the
state's channels, DeepThinking's ``torch.cat([thought, x], 1)``) down to ``width`` channels, then
``depth`` residual blocks of two 3x3 convolutions (ResNet's basic block, no normalisation, no bias).

The state is channels-last, (B, H, W, D): tokens on their pixel grid, so what a core does to a state
(step conditioning, re-injection, ODE fields) acts on the last dim as it does on (B, N, D) tokens. With
recall D = width + in_chans: the input travels in the last ``in_chans`` channels, read by every
application and passed on unchanged, so the plain recurrent core runs recall as DeepThinking does.
Every convolution is 3x3 with padding 1: any image size runs.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv3x3(in_chans: int, out_chans: int) -> nn.Conv2d:
    return nn.Conv2d(in_chans, out_chans, kernel_size=3, stride=1, padding=1, bias=False)


class BasicBlock(nn.Module):
    """relu(x + conv2(relu(conv1(x)))), ResNet's basic block as DeepThinking uses it (no norm)."""

    def __init__(self, width: int):
        super().__init__()
        self.conv1 = conv3x3(width, width)
        self.conv2 = conv3x3(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.conv2(F.relu(self.conv1(x))))


class ConvBlock(nn.Module):
    def __init__(self, width: int, recall_chans: int = 0, depth: int = 2):
        super().__init__()
        self.width = width
        self.recall_chans = recall_chans
        self.recall = conv3x3(width + recall_chans, width) if recall_chans else None
        self.layers = nn.Sequential(*[BasicBlock(width) for _ in range(depth)])

    @property
    def dim(self) -> int:
        """Channels of the state this block reads and writes."""
        return self.width + self.recall_chans

    def forward(self, z: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
        """(B, H, W, dim) -> (B, H, W, dim). ``step`` (told by the core) is not read: the block is the
        same at every step."""
        x = z.permute(0, 3, 1, 2)  # (B, dim, H, W), channels-last strides: no copy
        h = self.layers(self.recall(x) if self.recall is not None else x)  # (B, width, H, W)
        if self.recall is not None:
            h = torch.cat([h, x[:, self.width:]], dim=1)  # the input rides along unchanged
        return h.permute(0, 2, 3, 1)

    def extra_repr(self) -> str:
        return f"width={self.width}, recall_chans={self.recall_chans}"
