"""Data set loading: digits, Fashion-MNIST (IDX), CIFAR-10/100 (torchvision), ImageFolder, synthetic, and
mazes (generated, data/mazes.py: a per-pixel target, for the dense task).

Small data sets are held in memory as uint8 (N, C, H, W) tensors inside `TensorImageDataset`, so a
per-item transform only does cheap tensor ops. Missing or malformed data raise a one-line `UserError`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch.utils.data import Dataset

from ..errors import UserError
from . import transforms as T
from .sources import (CIFAR_CLASSES, DIGITS_SPLIT_SEED, DIGITS_TEST_SIZE, FASHION_FILES,  # noqa: F401 (re-exported)
                      IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC, _find_idx, _to_nchw, load_cifar, load_digits_split,
                      load_fashion_mnist, make_synthetic, read_idx)
from . import mazes
from .calibration import holdout_indices
from .images import CheckedImageFolder, shown

if TYPE_CHECKING:
    from ..config import DataConfig

logger = logging.getLogger("recurvit.data")

DATASETS: tuple[str, ...] = ("digits", "fashion_mnist", "cifar10", "cifar100", "imagefolder", "synthetic", "mazes")

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"  # where Debian's dataset-fashion-mnist installs
CIFAR_ROOT = "data/cifar"
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
FOLDER_MAX_SIZE = 224  # imagefolder without data.img_size: the images' own size, larger ones resized to this (timm's)
FOLDER_SAMPLE = 64  # image headers read to find an image folder's own size
CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a data set; mean/std are the per-channel normalisation used."""

    name: str
    img_size: int
    in_chans: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    skipped_images: int = 0  # imagefolder, data.skip_bad_images=true: unreadable images left out
    notes: tuple[str, ...] = ()  # one-line remarks for the run's log (build_datasets logs them too)
    # label index -> name (digits "0".."9", Fashion-MNIST's, a folder's); not part of what makes two infos equal
    class_names: tuple[str, ...] = field(default=(), compare=False)


CLASS_NAMES = {
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
}  # others: the label index as its name (digits: "0".."9")


@dataclass(frozen=True)
class _Defaults:
    native_size: Optional[int]  # None: variable (ImageFolder)
    crop_padding: int
    hflip: bool


_DEFAULTS = {
    "digits": _Defaults(8, 1, False),  # digits are not mirror-symmetric
    "fashion_mnist": _Defaults(28, 2, True),
    "cifar10": _Defaults(32, 4, True),
    "cifar100": _Defaults(32, 4, True),
    "imagefolder": _Defaults(None, 0, True),  # RandomResizedCrop does the spatial augmentation
    "synthetic": _Defaults(None, 0, False),  # deterministic items unless asked otherwise
    "mazes": _Defaults(None, 0, False),  # generated per size (data/mazes.py); never cropped, flipped or resized
}


DENSE = ("mazes",)  # data sets whose target is a per-pixel class mask (H, W): the dense task's


def dense_target(name: str) -> bool:
    """Whether data set ``name`` gives a per-pixel target (trained by the dense task, not classification)."""
    return name in DENSE


def native_size(name: str) -> Optional[int]:
    """The side of a named data set's own images (None: variable, or not a named data set)."""
    d = _DEFAULTS.get(name)
    return d.native_size if d is not None else None


class TensorImageDataset(Dataset):
    """In-memory images: uint8 (N, C, H, W) tensor + int64 labels; items are (transform(image), int label)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: Optional[Callable] = None) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or len(images) != len(labels):
            raise ValueError(f"bad in-memory data: images {images.dtype} {tuple(images.shape)}, {len(labels)} labels")
        self.images = images
        self.labels = labels.to(torch.int64)
        self._targets = self.labels.tolist()  # python ints: cheaper per item than indexing a tensor
        self.transform = transform

    def __len__(self) -> int:
        return len(self._targets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        if self.transform is not None:
            image = self.transform(image)
        return image, self._targets[index]


# ---------------------------------------------------------------------------------------- readers


# ---------------------------------------------------------------------------------------- assembly


def _check_cfg(cfg: DataConfig) -> None:
    """Values torch or torchvision would reject later with a traceback: one line each, up front."""
    if cfg.name not in DATASETS:
        raise UserError(f"unknown data set data.name={cfg.name!r}; choose one of {', '.join(DATASETS)}")
    if cfg.num_workers < 0:
        raise UserError(f"data.num_workers must be >= 0 (0: load in the main process), got {cfg.num_workers}")
    if cfg.img_size is not None and cfg.img_size < 1:
        raise UserError(f"data.img_size must be a positive integer or null (got {cfg.img_size})")
    if cfg.crop_padding is not None and cfg.crop_padding < 0:
        raise UserError(f"data.crop_padding must be >= 0 (got {cfg.crop_padding})")
    T.check_mix_alphas(cfg)
    if cfg.name == "synthetic":
        sizes = {k: getattr(cfg, f"synthetic_{k}") for k in ("train", "test", "classes", "size", "chans")}
        bad = [f"data.synthetic_{k}={v}" for k, v in sizes.items() if v < 1]
        if bad:
            raise UserError(f"synthetic data set sizes must be >= 1: {', '.join(bad)}")


def _augment_options(cfg: DataConfig, size: int) -> tuple[int, bool]:
    """(crop padding, hflip) after defaults. A default padding is scaled with img_size/native size."""
    d = _DEFAULTS[cfg.name]
    if cfg.crop_padding is not None:
        padding = int(cfg.crop_padding)
    elif d.crop_padding > 0 and d.native_size and size != d.native_size:
        padding = max(1, int(d.crop_padding * size / d.native_size + 0.5))
    else:
        padding = d.crop_padding
    hflip = d.hflip if cfg.hflip is None else bool(cfg.hflip)
    return padding, hflip


def _in_memory(
    cfg: DataConfig,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    stats: Optional[tuple[tuple[float, ...], tuple[float, ...]]] = None,
) -> tuple[Dataset, Dataset, DatasetInfo]:
    """Wrap uint8 NCHW tensors with the configured transforms; stats None: computed from the train images.
    ``train`` None (an evaluation that needs the test split only, with ``stats`` given): no train set."""
    native, chans = int(test[0].shape[-1]), int(test[0].shape[1])
    if cfg.randaugment and chans not in (1, 3):
        raise UserError(f"data.randaugment needs 1- or 3-channel images; {cfg.name} has {chans} channels")
    size = int(cfg.img_size or native)
    mean, std = stats if stats is not None else T.channel_stats(train[0].numpy())
    padding, hflip = _augment_options(cfg, size)
    train_tf = T.tensor_train_transform(size, native, mean, std, padding, hflip, bool(cfg.randaugment))
    test_tf = T.tensor_test_transform(size, native, mean, std)
    info = DatasetInfo(cfg.name, size, chans, num_classes, tuple(mean), tuple(std),
                       class_names=CLASS_NAMES.get(cfg.name, tuple(str(i) for i in range(num_classes))))
    train_set = TensorImageDataset(*train, transform=train_tf) if train is not None else None
    return train_set, TensorImageDataset(*test, transform=test_tf), info


def _image_folder(cfg: DataConfig, with_train: bool = True) -> tuple[Dataset, Dataset, DatasetInfo]:
    if not cfg.root:
        raise UserError("data.name=imagefolder needs data.root=DIR with train/<class>/* and val/<class>/* images")
    root = Path(cfg.root).expanduser()
    dirs = {split: root / split for split in ("train", "val")}
    missing = [shown(d) for d in dirs.values() if not d.is_dir()]
    if missing:
        raise UserError(f"imagefolder: expected class folders in {' and '.join(missing)} (train/<class>/*.png|jpg)")
    mean, std = IMAGENET_STATS
    opts = dict(skip_bad=bool(cfg.skip_bad_images), follow_symlinks=bool(cfg.follow_symlinks),
                data_root=root)
    try:
        test = CheckedImageFolder(dirs["val"], **opts)
        # an evaluation reads val/ only (scanning an ImageNet-sized train/ costs minutes)
        train = CheckedImageFolder(dirs["train"], **opts) if with_train else None
    except (FileNotFoundError, OSError) as e:
        msg = str(e)
        for d in dirs.values():  # torchvision names the folder as it is: a newline in it would end the line
            msg = msg.replace(str(d), shown(d))
        raise UserError(f"imagefolder under {shown(root)}: {msg.splitlines()[0] if msg else type(e).__name__}") from None
    for split, ds in (("train", train), ("val", test)):
        if ds is not None and ds.skipped and len(ds) == 0:
            raise UserError(f"imagefolder: none of the {len(ds.skipped)} images in {shown(dirs[split])} can be read")
    size = int(cfg.img_size or folder_size([path for path, _ in test.samples]))
    padding, hflip = _augment_options(cfg, size)
    test.transform = T.folder_test_transform(size, mean, std)
    if train is not None:
        train.transform = T.folder_train_transform(size, mean, std, padding, hflip, bool(cfg.randaugment))
    if train is None:
        info = DatasetInfo(cfg.name, size, 3, len(test.classes), mean, std, len(test.skipped), (), tuple(test.classes))
        return None, test, info
    if train.classes != test.classes:
        raise UserError(
            f"imagefolder: {shown(dirs['train'])} has {len(train.classes)} classes but {shown(dirs['val'])} has"
            f" {len(test.classes)} (or different names); they must match"
        )
    skipped = train.skipped + test.skipped
    notes: tuple[str, ...] = ()
    if skipped:
        notes = (f"imagefolder: left out {len(skipped)} unreadable image(s) ({len(train.skipped)} train,"
                 f" {len(test.skipped)} val; data.skip_bad_images=true), first {shown(skipped[0])}",)
    info = DatasetInfo(cfg.name, size, 3, len(train.classes), mean, std, len(skipped), notes, tuple(train.classes))
    return train, test, info


def folder_size(paths: list, most: int = FOLDER_MAX_SIZE) -> int:
    """An image folder's own size: the commonest shorter side among up to FOLDER_SAMPLE images spread over
    ``paths`` (headers only), at most ``most`` (larger photos are resized to it, as timm's default)."""
    from collections import Counter

    from PIL import Image

    step = max(1, len(paths) // FOLDER_SAMPLE)
    sides = Counter()
    for path in paths[::step][:FOLDER_SAMPLE]:
        try:
            with Image.open(path) as im:
                sides[min(im.size)] += 1
        except OSError:  # an unreadable file is reported (or left out) when it is read
            continue
    return min(sides.most_common(1)[0][0], most) if sides else most


def build_datasets(
    cfg: DataConfig, log: Optional[Callable[[str], object]] = None, with_train: bool = True
) -> tuple[Dataset, Dataset, DatasetInfo]:
    """(train set with augmentation, test set without, info) for a DataConfig.

    ``with_train=False`` (evaluation): the train set is None and not built where the test split
    does not need it (CIFAR, imagefolder); digits and Fashion-MNIST still read their training
    images, whose mean / std normalise the test images.

    Items are (float32 CxHxW normalised tensor, int label). `info.notes` (e.g. how many unreadable
    images were left out) go to `log`, or without one to the "recurvit.data" logger as warnings
    (printed on stderr when logging is not configured).
    """
    train, test, info = _build(cfg, with_train)
    if not with_train:
        train = None
    elif cfg.holdout:  # train on the rest; the held-out part is data.calibration.holdout_split's
        from torch.utils.data import Subset

        train = Subset(train, holdout_indices(len(train), cfg.holdout)[0])
    for note in info.notes:
        (log or logger.warning)(note)
    return train, test, info


def _build(cfg: DataConfig, with_train: bool = True) -> tuple[Dataset, Dataset, DatasetInfo]:
    _check_cfg(cfg)
    name = cfg.name
    if name == "digits":
        xtr, ytr, xte, yte = load_digits_split()
        return _in_memory(cfg, (_to_nchw(xtr), torch.from_numpy(ytr)), (_to_nchw(xte), torch.from_numpy(yte)), 10)
    if name == "fashion_mnist":
        xtr, ytr, xte, yte = load_fashion_mnist(cfg.root or FASHION_MNIST_ROOT)
        return _in_memory(cfg, (_to_nchw(xtr), torch.from_numpy(ytr)), (_to_nchw(xte), torch.from_numpy(yte)), 10)
    if name in CIFAR_CLASSES:
        xtr, ytr, xte, yte = load_cifar(name, cfg.root or CIFAR_ROOT, with_train)
        classes = 10 if name == "cifar10" else 100
        train = (_to_nchw(xtr), torch.from_numpy(ytr)) if xtr is not None else None
        test = (_to_nchw(xte), torch.from_numpy(yte))
        return _in_memory(cfg, train, test, classes, CIFAR_STATS[name])
    if name == "imagefolder":
        return _image_folder(cfg, with_train)
    if name == "mazes":  # items: (float (3, H, W) in [0, 1], long path mask (H, W)); test: the validation split

        train, val = mazes.build_mazes(cfg, with_train)
        size = mazes.maze_pixels(cfg.maze_size)
        return train, val, DatasetInfo(name, size, 3, 2, *mazes.STATS, class_names=mazes.CLASS_NAMES)
    size, chans, classes = cfg.synthetic_size, cfg.synthetic_chans, cfg.synthetic_classes
    train = make_synthetic(cfg.synthetic_train, size, chans, classes, "train")
    test = make_synthetic(cfg.synthetic_test, size, chans, classes, "test")
    return _in_memory(cfg, train, test, classes)
