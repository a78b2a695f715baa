"""Where images come from: the on-disk formats (digits from scikit-learn, Fashion-MNIST IDX files,
CIFAR through torchvision with safe archives) and a synthetic generator, as uint8 arrays.
datasets.py wraps them with transforms."""
from __future__ import annotations

import gzip
import os
import pickle
import zlib
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torchvision import datasets as tvd

from ..errors import UserError
from .archives import safe_extract_tar

# torchvision classes used to read CIFAR; a registry so tests can swap in a subclass whose md5 table
# matches their tiny files while keeping torchvision's integrity check and parsing code.
CIFAR_CLASSES: dict[str, type[tvd.CIFAR10]] = {"cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100}

DIGITS_TEST_SIZE = 360
DIGITS_SPLIT_SEED = 0
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dims
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dim
FASHION_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _to_nchw(images: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W) or (N, H, W, C) numpy -> contiguous uint8 (N, C, H, W) tensor."""
    if images.ndim == 3:
        images = images[:, None]
    else:
        images = images.transpose(0, 3, 1, 2)
    return torch.from_numpy(np.ascontiguousarray(images))


def load_digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn digits as uint8 (N, 8, 8) in 0..255, with a fixed stratified split (360 test images)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=DIGITS_TEST_SIZE, stratify=labels, random_state=DIGITS_SPLIT_SEED
    )
    return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]


def read_idx(path: str | os.PathLike, magic: int) -> np.ndarray:
    """Read an unsigned-byte IDX file (gzip-compressed if the name ends in .gz) and check its header."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"cannot read IDX file {path}: {e} (truncated or not gzip?)") from None
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if found is not None and found != magic:
        raise UserError(f"{path} is not the expected IDX file: magic number {found}, expected {magic}")
    if len(raw) < header:
        raise UserError(f"IDX file {path} is truncated: {len(raw)} bytes, shorter than its {header}-byte header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise UserError(
            f"IDX file {path} has {len(raw) - header} data bytes but its header {dims} needs {expected}"
            " (truncated or wrong file)"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find_idx(root: Path, base: str) -> Optional[Path]:
    for candidate in (root / f"{base}.gz", root / base):
        if candidate.is_file():
            return candidate
    return None


def load_fashion_mnist(root: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four original Fashion-MNIST IDX files (.gz or uncompressed) in `root` -> uint8 images, int64 labels."""
    root = Path(root).expanduser()
    paths = {key: _find_idx(root, base) for key, base in FASHION_FILES.items()}
    missing = [FASHION_FILES[k] + "[.gz]" for k, p in paths.items() if p is None]
    if missing:
        raise UserError(
            f"Fashion-MNIST not found: expected {', '.join(missing)} in {root}"
            " (set data.root=DIR; on Debian: apt install dataset-fashion-mnist)"
        )
    out: list[np.ndarray] = []
    for split in ("train", "test"):
        img_path, lbl_path = paths[f"{split}_images"], paths[f"{split}_labels"]
        images = read_idx(img_path, IDX_IMAGES_MAGIC)
        labels = read_idx(lbl_path, IDX_LABELS_MAGIC).astype(np.int64)
        if len(images) != len(labels):
            raise UserError(f"{img_path} holds {len(images)} images but {lbl_path} holds {len(labels)} labels")
        if images.shape[1] != images.shape[2]:
            raise UserError(f"{img_path}: images are {images.shape[1]}x{images.shape[2]}, expected square images")
        if labels.size and labels.max() > 9:
            raise UserError(f"{lbl_path}: label {labels.max()} out of range 0..9")
        out += [images, labels]
    if out[0].shape[1:] != out[2].shape[1:]:
        raise UserError(f"Fashion-MNIST train images are {out[0].shape[1:]} but test images are {out[2].shape[1:]}")
    return out[0], out[1], out[2], out[3]


def load_cifar(name: str, root: str | os.PathLike, with_train: bool = True) -> tuple:
    """CIFAR-10/100 through torchvision (download=False, md5-checked) -> uint8 (N, 32, 32, 3), int64 labels.

    `root` holds the extracted folder or the official .tar.gz, which is then extracted into `root`
    once every member is checked to stay inside it (see `archives.safe_extract_tar`).
    """
    cls = CIFAR_CLASSES[name]
    root = Path(root).expanduser()
    folder, archive = root / cls.base_folder, root / cls.filename
    if not folder.is_dir():
        if not archive.is_file():
            raise UserError(
                f"{name} not found: expected folder {cls.base_folder}/ or archive {cls.filename} under {root}"
                " (set data.root=DIR)"
            )
        safe_extract_tar(archive, root)
    files = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    try:
        train = cls(root, train=True, download=False) if with_train else None
        test = cls(root, train=False, download=False)
    except (RuntimeError, pickle.UnpicklingError, EOFError, KeyError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"{name} in {folder} is incomplete or corrupted ({reason}); expected the official files"
            f" {', '.join(files)}"
        ) from None
    return (
        np.asarray(train.data, dtype=np.uint8) if train is not None else None,
        np.asarray(train.targets, dtype=np.int64) if train is not None else None,
        np.asarray(test.data, dtype=np.uint8),
        np.asarray(test.targets, dtype=np.int64),
    )


def make_synthetic(
    n: int, size: int, chans: int, classes: int, split: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic learnable images: class brightness level + class low-frequency pattern + noise.

    Class prototypes come from a fixed seed shared by both splits; `split` ("train"/"test") seeds the
    labels and noise. Independent of the run seed.
    """
    protos_gen = torch.Generator().manual_seed(0)
    pattern = torch.rand(classes, chans, 4, 4, generator=protos_gen) * 2 - 1  # in [-1, 1]
    pattern = torch.nn.functional.interpolate(pattern, size=(size, size), mode="bilinear", align_corners=False)
    level = torch.linspace(48, 208, classes) if classes > 1 else torch.full((1,), 128.0)
    protos = level.view(-1, 1, 1, 1) + 48 * pattern
    gen = torch.Generator().manual_seed({"train": 1, "test": 2}[split])
    labels = (torch.arange(n) % classes)[torch.randperm(n, generator=gen)]
    noise = torch.randint(-32, 33, (n, chans, size, size), generator=gen, dtype=torch.int16).float()
    images = (protos[labels] + noise).round().clamp_(0, 255).to(torch.uint8)
    return images, labels
