"""Images for the VAE, as float tensors (C, H, W) in [-1, 1] (no labels).

- ``photos`` (the embedded default): crops of the two photographs that ship with scikit-learn
  (``sklearn.datasets.load_sample_images()``: china.jpg and flower.jpg, 427 x 640). Each photograph
  is resized by ``photo_scale``; the right-most ``test_fraction`` of its columns is held out: test
  images are a fixed grid of crops (stride ``test_stride``) inside it, training images are random
  crops from the rest, drawn afresh every epoch from a generator seeded by (seed, epoch), so a
  resumed run sees the same crops as an uninterrupted one.
- every data set of the foundation (digits for the tiniest runs, fashion_mnist, cifar10/100 and
  imagefolder from local files, synthetic) through :func:`recurvit.data.build_datasets`, with
  the padding crop switched off and the per-channel normalisation undone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from ...config import DataConfig
from ...data import build_datasets
from ...errors import UserError
from .config import VAEDataConfig

VAE_DATASETS = ("photos", "digits", "fashion_mnist", "cifar10", "cifar100", "imagefolder", "synthetic")
PHOTO_CROP = 32  # default crop size of the photos data set


@dataclass(frozen=True)
class VAEDataInfo:
    name: str
    img_size: int
    in_chans: int
    n_train: int
    n_test: int


def load_photos(scale: float = 1.0) -> List[torch.Tensor]:
    """scikit-learn's sample photographs as float (3, H, W) tensors in [-1, 1], resized by ``scale``."""
    from sklearn.datasets import load_sample_images
    from torchvision.transforms.v2 import functional as TF

    out = []
    for img in load_sample_images().images:  # uint8 (427, 640, 3)
        t = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).contiguous()  # (3, H, W)
        if scale != 1.0:
            size = [max(1, round(t.shape[1] * scale)), max(1, round(t.shape[2] * scale))]
            t = TF.resize(t, size, antialias=True)
        out.append(t.float().div(127.5).sub(1.0))
    return out


class PhotoCrops(Dataset):
    """``n`` random size x size crops with optional flips, from columns [0, x_end) of each photo."""

    def __init__(self, photos: List[torch.Tensor], size: int, n: int, x_ends: List[int], hflip: bool, seed: int):
        self.photos, self.size, self.n, self.x_ends, self.hflip, self.seed = photos, size, n, x_ends, hflip, seed
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Draw this epoch's crops: a function of (seed, epoch) only."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        k = torch.randint(len(self.photos), (self.n,), generator=g)
        u = torch.rand(self.n, 3, generator=g, dtype=torch.float64)
        self._items = []
        for i in range(self.n):
            p = int(k[i])
            h = self.photos[p].shape[1]
            y = int(u[i, 0] * (h - self.size + 1))
            x = int(u[i, 1] * (self.x_ends[p] - self.size + 1))
            self._items.append((p, y, x, bool(self.hflip and u[i, 2] < 0.5)))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        p, y, x, flip = self._items[i]
        crop = self.photos[p][:, y:y + self.size, x:x + self.size]
        return crop.flip(-1) if flip else crop.clone()


class PhotoGrid(Dataset):
    """A fixed grid of crops with stride ``stride`` inside columns [x_start, W) of each photo."""

    def __init__(self, photos: List[torch.Tensor], size: int, x_starts: List[int], stride: int):
        self.photos, self.size = photos, size
        self._items: List[Tuple[int, int, int]] = []
        for p, img in enumerate(photos):
            h, w = img.shape[1:]
            for y in range(0, h - size + 1, stride):
                for x in range(x_starts[p], w - size + 1, stride):
                    self._items.append((p, y, x))

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> torch.Tensor:
        p, y, x = self._items[i]
        return self.photos[p][:, y:y + self.size, x:x + self.size].clone()


class _Signed(Dataset):
    """A foundation data set's normalised images mapped back to [-1, 1]; labels dropped."""

    def __init__(self, ds: Dataset, mean, std):
        self.ds = ds
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> torch.Tensor:
        x = self.ds[i][0]
        return (x * self.std + self.mean).mul(2.0).sub(1.0)


def _photos(cfg: VAEDataConfig, seed: int) -> Tuple[Dataset, Dataset, VAEDataInfo]:
    size = int(cfg.img_size or PHOTO_CROP)
    if not 0.0 < cfg.test_fraction < 1.0:
        raise UserError(f"data.test_fraction must be in (0, 1), got {cfg.test_fraction}")
    if cfg.photo_scale <= 0 or cfg.train_crops < 1 or cfg.test_stride < 1:
        raise UserError("data.photo_scale, data.train_crops and data.test_stride must be positive")
    photos = load_photos(cfg.photo_scale)
    splits = [int(round(p.shape[2] * (1.0 - cfg.test_fraction))) for p in photos]
    for p, xs in zip(photos, splits):
        h, w = p.shape[1:]
        if size > min(h, xs, w - xs):
            raise UserError(f"data.img_size={size} does not fit the photographs at data.photo_scale={cfg.photo_scale} "
                            f"({w}x{h}, {xs} training / {w - xs} test columns); lower img_size or raise photo_scale")
    hflip = True if cfg.hflip is None else bool(cfg.hflip)
    train = PhotoCrops(photos, size, cfg.train_crops, splits, hflip, seed)
    test = PhotoGrid(photos, size, splits, cfg.test_stride)
    return train, test, VAEDataInfo("photos", size, 3, len(train), len(test))


def _foundation(cfg: VAEDataConfig) -> Tuple[Dataset, Dataset, VAEDataInfo]:
    dc = DataConfig(name=cfg.name, root=cfg.root, img_size=cfg.img_size, num_workers=cfg.num_workers,
                    crop_padding=0, hflip=cfg.hflip)
    train, test, info = build_datasets(dc)
    return (_Signed(train, info.mean, info.std), _Signed(test, info.mean, info.std),
            VAEDataInfo(cfg.name, info.img_size, info.in_chans, len(train), len(test)))


def build_vae_datasets(cfg: VAEDataConfig, seed: int = 0) -> Tuple[Dataset, Dataset, VAEDataInfo]:
    """(train set, test set, info); items are float (C, H, W) images in [-1, 1]."""
    if cfg.name not in VAE_DATASETS:
        raise UserError(f"unknown data set data.name={cfg.name!r}; choose one of {', '.join(VAE_DATASETS)}")
    train, test, info = _photos(cfg, seed) if cfg.name == "photos" else _foundation(cfg)
    if cfg.max_test is not None and cfg.max_test < len(test):
        if cfg.max_test < 1:
            raise UserError(f"data.max_test must be >= 1 or null, got {cfg.max_test}")
        test = Subset(test, range(cfg.max_test))
        info = VAEDataInfo(info.name, info.img_size, info.in_chans, info.n_train, len(test))
    return train, test, info


@torch.no_grad()
def mean_image(dataset: Dataset, limit: Optional[int] = 4096) -> torch.Tensor:
    """The per-pixel mean of (at most ``limit``) training images: the best constant predictor under L2."""
    n = len(dataset) if limit is None else min(len(dataset), limit)
    total = None
    for i in range(n):
        x = dataset[i].double()
        total = x if total is None else total + x
    return (total / n).float()


__all__ = ["VAE_DATASETS", "VAEDataInfo", "PhotoCrops", "PhotoGrid", "load_photos", "build_vae_datasets", "mean_image"]
