"""VAE objective: reconstruction (L1 or L2) + a small-weight KL, optional LPIPS, optional
adversarial second stage with a patch discriminator (hinge loss).

    loss = recon(x_hat, x) + kl_weight * KL / (C H W) [+ perceptual_weight * LPIPS] [+ adv.weight * g_adv]

KL is in nats summed over the latent elements of an image (mean over the batch); dividing it by
the number of pixel values makes ``kl_weight`` comparable with the per-value mean of ``recon``
(Stable Diffusion's VAE uses 1e-6 with the same normalisation).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import UserError

from .config import RECON  # declared on train.recon


def recon_loss(x_hat: torch.Tensor, x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "l1":
        return (x_hat - x).abs().mean()
    if kind == "l2":
        return (x_hat - x).pow(2).mean()
    raise UserError(f"train.recon must be one of {', '.join(RECON)}, got '{kind}'")


def kl_loss(posteriors: Sequence) -> torch.Tensor:
    """Nats per image, summed over every latent scale: a scalar (mean over the batch)."""
    return sum(q.kl() for q in posteriors).mean()


class PatchDiscriminator(nn.Module):
    """PatchGAN (pix2pix): stride-2 4x4 convs, GroupNorm, LeakyReLU; one logit per patch."""

    def __init__(self, in_chans: int, channels: int = 32, layers: int = 2):
        super().__init__()
        mods = [nn.Conv2d(in_chans, channels, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
        c = channels
        for _ in range(1, layers):
            mods += [nn.Conv2d(c, 2 * c, 4, stride=2, padding=1), nn.GroupNorm(min(8, 2 * c), 2 * c), nn.LeakyReLU(0.2)]
            c *= 2
        mods += [nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(min(8, c), c), nn.LeakyReLU(0.2),
                 nn.Conv2d(c, 1, 3, padding=1)]
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, 1, H / 2^layers, W / 2^layers)
        return self.net(x)


def d_hinge_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    return 0.5 * (F.relu(1.0 - real_logits).mean() + F.relu(1.0 + fake_logits).mean())


def g_hinge_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    return -fake_logits.mean()


__all__ = ["RECON", "recon_loss", "kl_loss", "PatchDiscriminator", "d_hinge_loss", "g_hinge_loss"]
