"""Per-channel learned scale on a residual branch (CaiT); key `gamma` as in timm."""
import torch
import torch.nn as nn


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_values: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x * self.gamma
