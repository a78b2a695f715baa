"""Reconstruction metrics. Images are float (B, C, H, W) in [0, 1] unless said otherwise.

- PSNR per image, ``10 log10(data_range^2 / mse)`` in float64, averaged over images by the callers.
  The mse is clamped at 1e-12, so identical images give 10 log10(data_range^2 / 1e-12) (120 dB for
  data_range 1) rather than inf, and means over images stay finite; otherwise the figure of
  ``skimage.metrics.peak_signal_noise_ratio`` (tests/tasks/vae/test_metrics.py: within 1e-4 dB).
- SSIM (Wang et al. 2004) with an 11 x 11 Gaussian window (sigma 1.5), K1 = 0.01, K2 = 0.03,
  population statistics, averaged over the positions where the window fits ('valid') and over
  channels: the figures of ``skimage.metrics.structural_similarity(gaussian_weights=True,
  sigma=1.5, use_sample_covariance=False, data_range=1, channel_axis=0)`` (tested within 1e-4).
  Images smaller than 11 pixels use the largest odd window that fits, with sigma scaled by
  window / 11 (skimage's figure with ``sigma=1.5 * window / 11``). SSIM of identical images is 1.
- LPIPS (v0.1, VGG16 by default, or AlexNet): :class:`LPIPS`. Which code runs: the ``lpips``
  package's own ``lpips.LPIPS`` when that package is installed (``pip install 'recurvit[lpips]'``,
  it is also in the ``dev`` extra), else the hand-written copy here (same layers, scaling, unit
  normalisation and spatial mean; ``impl=`` forces one, ``LPIPS.impl`` says which ran). Both agree
  within 1e-6 on the same weights (bit-identical on CPU; tests/tasks/vae/test_metrics.py). Either way nothing is downloaded: the
  backbone comes from a local torchvision ImageNet file the user gives (``vgg16-397923af.pth``),
  the linear layers from the user's file or, when none is given, the file in the lpips wheel
  (``lpips/weights/v0.1/vgg.pth``); without the package that file must be given. Inputs in
  [-1, 1], as in the lpips package. Images need at least 16 x 16 pixels (VGG16) or 31 x 31 (AlexNet).
- rFID only from a weight file the user provides: :class:`InceptionFeatures` needs torchvision's
  Inception-v3 ImageNet weights (rFID here uses torchvision's Inception, so figures are close to
  but not identical with the TF-Inception FID of papers; with fewer test images than the 2048
  feature dimensions the covariances are singular and rFID is only a rough figure).

Which are a library's and which are written here, and why: LPIPS is the ``lpips`` package's own where it is
installed. SSIM and PSNR stay here, batched in torch on the model's device and held to scikit-image's figures by
a test; torchmetrics' SSIM (1.x) differs from scikit-image's (the figure the committed LoopVAE reports hold):
by up to 0.013 at 16 px and 0.0015 at 32 px on noisy image pairs, where this one agrees to 1e-7. The Fréchet
distance stays here because torchmetrics' and torch-fidelity's FID fetch their Inception weights from the
network when first used, which this project's machines cannot do; here the user names a local weights file.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import UserError

VGG_FILE = "vgg16-397923af.pth"
ALEX_FILE = "alexnet-owt-7be5be79.pth"
INCEPTION_FILE = "inception_v3_google-0cc3c7bd.pth"


def to_unit(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] model space -> [0, 1] image space (not clamped)."""
    return (x + 1.0) * 0.5


def psnr(x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Per-image PSNR in dB: (B,); identical images give the cap 10 log10(data_range^2 / 1e-12)."""
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


_NETS = {  # net -> (torchvision file, ReLU indices in .features that LPIPS reads, their channels, min image side)
    "vgg": (VGG_FILE, (3, 8, 15, 22, 29), (64, 128, 256, 512, 512), 16),  # relu1_2 .. relu5_3
    "alex": (ALEX_FILE, (1, 4, 7, 9, 11), (64, 192, 384, 256, 256), 31),  # relu1 .. relu5
}
_NET_NAMES = {"vgg": "VGG16", "alex": "AlexNet"}


def lpips_package_available() -> bool:
    """Whether the ``lpips`` package (``pip install recurvit[lpips]``) can be imported."""
    try:
        import lpips  # noqa: F401
    except ImportError:
        return False
    return True


def lpips_package_weights(net: str = "vgg") -> Optional[Path]:
    """The linear-layer file that ships in the lpips wheel (``lpips/weights/v0.1/{net}.pth``), or None."""
    if not lpips_package_available():
        return None
    import lpips

    p = Path(lpips.__file__).parent / "weights" / "v0.1" / f"{net}.pth"
    return p if p.is_file() else None


def _torchvision_features(net: str) -> nn.Sequential:
    """torchvision's VGG16 / AlexNet ``.features`` up to the last ReLU LPIPS reads (random init)."""
    if net == "vgg":
        from torchvision.models.vgg import cfgs, make_layers  # .features alone: no 100M-weight classifier

        return make_layers(cfgs["D"])[: _NETS[net][1][-1] + 1]
    from torchvision.models import alexnet

    return alexnet(weights=None).features[: _NETS[net][1][-1] + 1]


class LPIPS(nn.Module):
    """LPIPS v0.1 (Zhang et al. 2018) with the VGG16 (default) or AlexNet backbone: inputs in
    [-1, 1] (the lpips package's convention; ``lpips(x, y, normalize=True)`` there takes [0, 1]),
    (B, 3 or 1, H, W), grayscale repeated to RGB; output (B,). A fixed metric: no parameter needs a
    gradient and it stays in eval mode (the package's dropout never runs), inputs get gradients.

    ``backbone_weights``: torchvision's ImageNet file, ``vgg16-397923af.pth`` /
    ``alexnet-owt-7be5be79.pth`` (only ``features.*`` is used), always a local file, required.
    ``lpips_weights``: the linear layers, the lpips package's ``weights/v0.1/{vgg,alex}.pth``
    (``lin0..lin4.model.1.weight``); when None, the file in the installed lpips wheel; required
    when the package is not installed. ``impl``: ``"auto"`` (default) runs the lpips package's
    ``lpips.LPIPS`` (built with ``pnet_rand=True``, backbone then loaded from the local file) when
    it is installed and the hand-written network here otherwise; ``"lpips"`` / ``"recurvit"``
    force one. ``self.impl`` says which runs; both give the same figures (tests/tasks/vae/test_metrics.py).
    ``flags`` name the options that give the two files, for error messages.
    """

    def __init__(self, backbone_weights: Optional[str], lpips_weights: Optional[str] = None,
                 flags: tuple = ("--vgg-weights", "--lpips-weights"), net: str = "vgg", impl: str = "auto"):
        super().__init__()
        if net not in _NETS:
            raise UserError(f"LPIPS: net={net!r}; choose vgg or alex")
        if impl not in ("auto", "lpips", "recurvit"):
            raise UserError(f"LPIPS: impl={impl!r}; choose auto, lpips or recurvit")
        have_pkg = lpips_package_available()
        if impl == "lpips" and not have_pkg:
            raise UserError("LPIPS: impl=lpips needs the lpips package (pip install 'recurvit[lpips]')")
        self.impl = "lpips" if impl == "lpips" or (impl == "auto" and have_pkg) else "recurvit"
        self.net = net
        file, self.layers, channels, self.min_side = _NETS[net]
        name = _NET_NAMES[net]

        bb_path = _need_file(backbone_weights, "LPIPS", f"torchvision {name} ImageNet weights, {file}", flags[0])
        if lpips_weights is None and lpips_package_weights(net) is not None:
            lin_path = lpips_package_weights(net)
        else:
            lin_path = _need_file(lpips_weights, "LPIPS",
                                  f"LPIPS linear layers, weights/v0.1/{net}.pth of the lpips package, "
                                  f"or install it: pip install 'recurvit[lpips]'", flags[1])
        bb_state = {k[len("features."):]: v for k, v in _load_state(bb_path, "LPIPS").items()
                    if k.startswith("features.")}
        lin_state = _load_state(lin_path, "LPIPS")
        lin_keys = {f"{i}.weight": f"lin{i}.model.1.weight" for i in range(len(channels))}
        lin_state = {k: lin_state[v] for k, v in lin_keys.items() if v in lin_state}
        lin_expected = f"the lpips v0.1 {name} file (lin0..lin4.model.1.weight)"

        if self.impl == "lpips":
            import warnings

            import lpips

            with warnings.catch_warnings():  # torchvision's note on lpips' `pretrained=False`
                warnings.simplefilter("ignore", UserWarning)
                model = lpips.LPIPS(net=net, version="0.1", lpips=True, pretrained=False, pnet_rand=True,
                                    verbose=False)
            # the slices hold torchvision's .features modules under their own indices: a view with
            # torchvision's key names ("0.weight" ...) loads the local backbone file into them
            view = nn.Sequential(OrderedDict((k, m) for s in model.net.children() for k, m in s.named_children()))
            _load_into(view, bb_state, bb_path, "LPIPS", f"torchvision's {name} ({file})")
            lins = nn.ModuleList(lin.model[-1] for lin in model.lins)
            _load_into(lins, lin_state, lin_path, "LPIPS", lin_expected)
            self.model = model.eval().requires_grad_(False)
        else:
            features = _torchvision_features(net)
            _load_into(features, bb_state, bb_path, "LPIPS", f"torchvision's {name} ({file})")
            self.features = features.eval().requires_grad_(False)
            self.lins = nn.ModuleList(nn.Conv2d(c, 1, 1, bias=False) for c in channels)
            _load_into(self.lins, lin_state, lin_path, "LPIPS", lin_expected)
            self.lins.requires_grad_(False)
            self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1))
            self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1))

    def train(self, mode: bool = True) -> "LPIPS":
        return super().train(False)  # a fixed metric: no dropout, ever

    def _feats(self, x: torch.Tensor):
        h = (x - self.shift) / self.scale
        out = []
        for i, layer in enumerate(self.features):
            h = layer(h)
            if i in self.layers:
                out.append(h / (h.pow(2).sum(1, keepdim=True).sqrt() + 1e-10))
        return out

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if min(x.shape[-2:]) < self.min_side:
            raise UserError(f"LPIPS with the {_NET_NAMES[self.net]} backbone needs images of at least "
                            f"{self.min_side} x {self.min_side} pixels (got {x.shape[-2]} x {x.shape[-1]})")
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if y.shape[1] == 1:
            y = y.expand(-1, 3, -1, -1)
        if self.impl == "lpips":
            return self.model(x, y).flatten()
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


__all__ = ["psnr", "ssim", "out_of_range", "to_unit", "LPIPS", "lpips_package_available", "lpips_package_weights",
           "InceptionFeatures", "frechet_distance"]
