"""Reconstruction metrics. Images are float (B, C, H, W) in [0, 1] unless said otherwise.

- PSNR per image, ``10 log10(1 / mse)``, averaged over images.
- SSIM (Wang et al. 2004) with an 11 x 11 Gaussian window (sigma 1.5), K1 = 0.01, K2 = 0.03,
  population statistics, averaged over the positions where the window fits ('valid') and over
  channels: the figures of ``skimage.metrics.structural_similarity(gaussian_weights=True,
  sigma=1.5, use_sample_covariance=False, data_range=1)``. Images smaller than 11 pixels use the
  largest odd window that fits, with sigma scaled by window / 11.
- LPIPS (v0.1, VGG16) and rFID only from weight files the user provides (nothing is downloaded):
  :class:`LPIPS` needs torchvision's VGG16 ImageNet weights and the lpips package's linear layers;
  :class:`InceptionFeatures` needs torchvision's Inception-v3 ImageNet weights (rFID here uses
  torchvision's Inception, so figures are close to but not identical with the TF-Inception FID
  of papers; with fewer test images than the 2048 feature dimensions the covariances are
  singular and rFID is only a rough figure).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UserError

VGG_FILE = "vgg16-397923af.pth"
LPIPS_FILE = "vgg.pth (weights/v0.1/vgg.pth of the lpips package)"
INCEPTION_FILE = "inception_v3_google-0cc3c7bd.pth"


def to_unit(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] model space -> [0, 1] image space (not clamped)."""
    return (x + 1.0) * 0.5


def psnr(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Per-image PSNR in dB: (B,)."""
    mse = (x.double() - y.double()).pow(2).flatten(1).mean(1)
    return (10.0 * torch.log10(data_range ** 2 / mse.clamp_min(1e-12))).float()


def _gaussian_window(size: int, sigma: float, device, dtype) -> torch.Tensor:
    r = torch.arange(size, device=device, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(r ** 2) / (2 * sigma ** 2))
    g = g / g.sum()
    return torch.outer(g, g).to(dtype)  # (size, size)


def ssim(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0, win: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Per-image SSIM: (B,). x, y: (B, C, H, W)."""
    B, C, H, W = x.shape
    w = min(win, H, W)
    if w % 2 == 0:
        w -= 1
    s = sigma * w / win
    x, y = x.double(), y.double()
    k = _gaussian_window(w, s, x.device, x.dtype).expand(C, 1, w, w)

    def filt(t):
        return F.conv2d(t, k, groups=C)  # 'valid': positions where the window fits

    mx, my = filt(x), filt(y)
    sxx = filt(x * x) - mx * mx
    syy = filt(y * y) - my * my
    sxy = filt(x * y) - mx * my
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    smap = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return smap.flatten(1).mean(1).float()


def out_of_range(x: torch.Tensor, lo: float = -1.0, hi: float = 1.0) -> torch.Tensor:
    """Per-image fraction of output values outside [lo, hi]: (B,)."""
    return ((x < lo) | (x > hi)).flatten(1).float().mean(1)


# ------------------------------------------------------------------------------ weight files
def _need_file(path: Optional[str], what: str, expected: str, flag: str) -> Path:
    if not path:
        raise UserError(f"{what} needs pretrained weights as a local file (nothing is downloaded): "
                        f"give {flag} FILE ({expected})")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{what}: weight file {p} not found (expected {expected}; pass it with {flag})")
    return p


def _load_state(path: Path, what: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt / not a torch file
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"{what}: cannot read weight file {path} ({first})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UserError(f"{what}: {path} does not hold a state dict")
    return state


def _load_into(module: nn.Module, state: dict, path: Path, what: str, expected: str) -> None:
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    wrong = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or wrong:
        detail = f"{len(missing)} missing tensors (e.g. {missing[0]})" if missing else \
            f"{len(wrong)} tensors of the wrong shape (e.g. {wrong[0]})"
        raise UserError(f"{what}: {path} is not {expected}: {detail}")
    module.load_state_dict({k: state[k] for k in own}, strict=True)


class LPIPS(nn.Module):
    """LPIPS v0.1 with the VGG16 backbone (Zhang et al. 2018): inputs in [-1, 1], output (B,).

    ``vgg_weights``: torchvision's ``vgg16-397923af.pth`` (only ``features.*`` is used);
    ``lpips_weights``: the lpips package's ``weights/v0.1/vgg.pth`` (``lin0..lin4.model.1.weight``).
    ``flags`` name the options that give the two files, for error messages.
    """

    LAYERS = (3, 8, 15, 22, 29)  # relu1_2, relu2_2, relu3_3, relu4_3, relu5_3
    CHANNELS = (64, 128, 256, 512, 512)

    def __init__(self, vgg_weights: Optional[str], lpips_weights: Optional[str],
                 flags: tuple = ("--vgg-weights", "--lpips-weights")):
        super().__init__()
        from torchvision.models import vgg16

        vgg_path = _need_file(vgg_weights, "LPIPS", f"torchvision VGG16 ImageNet weights, {VGG_FILE}", flags[0])
        lin_path = _need_file(lpips_weights, "LPIPS", f"LPIPS linear layers, {LPIPS_FILE}", flags[1])
        features = vgg16(weights=None).features[: self.LAYERS[-1] + 1]
        vgg_state = {k[len("features."):]: v for k, v in _load_state(vgg_path, "LPIPS").items()
                     if k.startswith("features.")}
        _load_into(features, vgg_state, vgg_path, "LPIPS", f"torchvision's VGG16 ({VGG_FILE})")
        self.features = features.eval().requires_grad_(False)
        lin_state = _load_state(lin_path, "LPIPS")
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in self.CHANNELS)
        try:
            for i, lin in enumerate(self.lins):
                lin.weight.data.copy_(lin_state[f"lin{i}.model.1.weight"])
        except (KeyError, RuntimeError):
            raise UserError(f"LPIPS: {lin_path} is not the lpips v0.1 VGG file (expected keys lin0..lin4.model.1.weight)") from None
        self.lins.requires_grad_(False)
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1))

    def _feats(self, x: torch.Tensor):
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        h = (x - self.shift) / self.scale
        out = []
        for i, layer in enumerate(self.features):
            h = layer(h)
            if i in self.LAYERS:
                out.append(h / (h.pow(2).sum(1, keepdim=True).sqrt() + 1e-10))
        return out

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        fx, fy = self._feats(x), self._feats(y)
        return sum(lin((a - b).pow(2)).mean((1, 2, 3)) for lin, a, b in zip(self.lins, fx, fy))


class InceptionFeatures(nn.Module):
    """2048-d pool features of torchvision's Inception-v3, from a local weight file; inputs in [0, 1]."""

    def __init__(self, weights: Optional[str]):
        super().__init__()
        from torchvision.models import inception_v3

        path = _need_file(weights, "rFID", f"torchvision Inception-v3 ImageNet weights, {INCEPTION_FILE}",
                          "--inception-weights")
        net = inception_v3(weights=None, aux_logits=True, init_weights=False, transform_input=False)
        _load_into(net, _load_state(path, "rFID"), path, "rFID", f"torchvision's Inception-v3 ({INCEPTION_FILE})")
        net.fc = nn.Identity()
        self.net = net.eval().requires_grad_(False)
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = F.interpolate(x.clamp(0, 1), size=(299, 299), mode="bilinear", align_corners=False)
        return self.net((x - self.mean) / self.std)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """FID between two feature sets (N, D): |mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2))."""
    import warnings

    from scipy import linalg

    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    with warnings.catch_warnings():  # singular covariances (fewer images than dimensions) are expected
        warnings.simplefilter("ignore")
        covmean = linalg.sqrtm(s1.dot(s2))
        if not np.isfinite(covmean).all():
            eps = np.eye(s1.shape[0]) * 1e-6
            covmean = linalg.sqrtm((s1 + eps).dot(s2 + eps))
    covmean = covmean.real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


__all__ = ["psnr", "ssim", "out_of_range", "to_unit", "LPIPS", "InceptionFeatures", "frechet_distance"]
