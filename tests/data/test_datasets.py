"""Data sets (recurvit.data.datasets, on the readers of data/sources.py; CPU, tiny files written by the tests).
The transforms and batch mixing are tested in test_transforms.py."""
from __future__ import annotations

import gzip
import hashlib
import pickle
import shutil
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets as tvd
from torchvision.transforms import v2

from recurvit.config import DataConfig
from recurvit.data import DATASETS, DatasetInfo, build_datasets
from recurvit.data import datasets as D
from recurvit.errors import UserError


def _transform_types(ds) -> list[type]:
    return [type(t) for t in ds.transform.transforms]


def _unnormalise(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    mean = torch.tensor(info.mean).view(-1, 1, 1)
    std = torch.tensor(info.std).view(-1, 1, 1)
    return ((x * std + mean) * 255).round().to(torch.uint8)


# ---------------------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits():
    return build_datasets(DataConfig(name="digits"))


def test_digits_shapes_and_classes(digits):
    train, test, info = digits
    assert info == DatasetInfo("digits", 8, 1, 10, info.mean, info.std)
    assert (len(train), len(test)) == (1437, 360)
    x, y = train[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and isinstance(y, int)
    assert train.images.dtype == torch.uint8 and int(train.images.max()) == 255
    assert set(train.labels.tolist()) == set(range(10)) == set(test.labels.tolist())
    # normalisation computed from the training set: the training images come out ~zero-mean, unit-std
    xs = torch.stack([test.transform(img) for img in train.images])
    assert abs(xs.mean().item()) < 1e-3 and abs(xs.std().item() - 1) < 1e-2


def test_digits_split_is_stratified_and_fixed(digits):
    train, test, _ = digits
    full = torch.cat([train.labels, test.labels])
    expected = torch.bincount(full, minlength=10).double() * 360 / len(full)
    got = torch.bincount(test.labels, minlength=10).double()
    assert torch.all((got - expected).abs() <= 1)
    torch.manual_seed(1234)  # the split does not depend on the run seed
    train2, test2, _ = build_datasets(DataConfig(name="digits"))
    assert torch.equal(test.images, test2.images) and torch.equal(test.labels, test2.labels)
    assert torch.equal(train.images, train2.images)


def test_digits_default_augmentation_has_no_hflip(digits):
    train, test, _ = digits
    types = _transform_types(train)
    assert v2.RandomHorizontalFlip not in types
    crop = next(t for t in train.transform.transforms if isinstance(t, v2.RandomCrop))
    assert crop.padding == [1, 1, 1, 1]
    assert v2.RandomCrop not in _transform_types(test)
    flipped, _, _ = build_datasets(DataConfig(name="digits", hflip=True, crop_padding=0))
    assert v2.RandomHorizontalFlip in _transform_types(flipped) and v2.RandomCrop not in _transform_types(flipped)


def test_digits_resized_and_randaugment_on_one_channel():
    train, test, info = build_datasets(DataConfig(name="digits", img_size=28, randaugment=True))
    assert info.img_size == 28
    crop = next(t for t in train.transform.transforms if isinstance(t, v2.RandomCrop))
    assert crop.padding == [4, 4, 4, 4]  # default padding 1 scaled by 28/8
    torch.manual_seed(0)
    for i in range(50):  # RandAugment picks different ops each time; all must accept 1-channel uint8
        assert train[i][0].shape == (1, 28, 28)
    assert test[0][0].shape == (1, 28, 28)


# ---------------------------------------------------------------------------------------- Fashion-MNIST


def _idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _write_fashion(root: Path, compress: bool = True, n_train: int = 12, n_test: int = 5):
    rng = np.random.default_rng(0)
    arrays = {
        "train-images-idx3-ubyte": (rng.integers(0, 256, (n_train, 28, 28)), 2051),
        "train-labels-idx1-ubyte": (rng.integers(0, 10, n_train), 2049),
        "t10k-images-idx3-ubyte": (rng.integers(0, 256, (n_test, 28, 28)), 2051),
        "t10k-labels-idx1-ubyte": (rng.integers(0, 10, n_test), 2049),
    }
    root.mkdir(parents=True, exist_ok=True)
    for name, (array, magic) in arrays.items():
        data = _idx_bytes(array, magic)
        if compress:
            (root / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (root / name).write_bytes(data)
    return {name: array for name, (array, _) in arrays.items()}


@pytest.mark.parametrize("compress", [True, False])
def test_fashion_mnist_idx_round_trip(tmp_path, compress):
    arrays = _write_fashion(tmp_path, compress)
    train, test, info = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path)))
    assert (info.img_size, info.in_chans, info.num_classes) == (28, 1, 10)
    assert (len(train), len(test)) == (12, 5)
    assert np.array_equal(train.images[:, 0].numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(train.labels.numpy(), arrays["train-labels-idx1-ubyte"])
    assert np.array_equal(test.images[:, 0].numpy(), arrays["t10k-images-idx3-ubyte"])
    assert np.array_equal(test.labels.numpy(), arrays["t10k-labels-idx1-ubyte"])
    x, y = test[3]  # no augmentation on the test set: the pixels come back after un-normalising
    assert torch.equal(_unnormalise(x, info)[0], torch.from_numpy(arrays["t10k-images-idx3-ubyte"][3]).to(torch.uint8))
    assert y == int(arrays["t10k-labels-idx1-ubyte"][3])
    assert v2.RandomHorizontalFlip in _transform_types(train)
    pixels = arrays["train-images-idx3-ubyte"] / 255.0
    assert info.mean[0] == pytest.approx(pixels.mean(), abs=1e-4)
    assert info.std[0] == pytest.approx(pixels.std(), abs=1e-4)


def test_fashion_mnist_truncated_file(tmp_path):
    _write_fashion(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte.gz"
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data[:-100]))  # valid gzip, too few pixels for the header's dims
    with pytest.raises(UserError, match="train-images-idx3-ubyte.gz"):
        build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path)))
    path.write_bytes(gzip.compress(data)[:-20])  # truncated gzip stream
    with pytest.raises(UserError, match="train-images-idx3-ubyte.gz"):
        build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path)))


def test_fashion_mnist_wrong_magic(tmp_path):
    _write_fashion(tmp_path)
    # a labels file where an images file belongs
    shutil.copy(tmp_path / "t10k-labels-idx1-ubyte.gz", tmp_path / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(UserError, match=r"t10k-images-idx3-ubyte.gz.*magic number 2049, expected 2051"):
        build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path)))


def test_fashion_mnist_missing_dir_names_files(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(UserError) as err:
        build_datasets(DataConfig(name="fashion_mnist", root=str(missing)))
    msg = str(err.value)
    assert "\n" not in msg and str(missing) in msg
    for name in D.FASHION_FILES.values():
        assert name in msg


# ---------------------------------------------------------------------------------------- CIFAR
#
# The tests go through torchvision's real CIFAR10/CIFAR100 code: `_check_integrity` (md5 of every
# file via torchvision.datasets.utils.check_integrity), pickle parsing and `_load_meta`. Only the md5
# table differs: a subclass whose train_list/test_list/meta checksums are those of the tiny files the
# test writes, swapped into `recurvit.data.datasets.CIFAR_CLASSES`. A corrupted file still fails.


class _Py2Pickler(pickle._Pickler):
    """Pickles str and bytes as Python 2 byte strings, like the official CIFAR files.

    Loaded with encoding="latin1" (as torchvision does) the keys come back as "data", with
    encoding="bytes" as b"data", exactly as for the real downloads.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_string(self, obj: str | bytes) -> None:
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = _save_py2_string
    dispatch[bytes] = _save_py2_string


def _dump_py2(obj, path: Path) -> None:
    with open(path, "wb") as f:
        _Py2Pickler(f, protocol=2).dump(obj)


def _cifar_batch(rng, n: int, fine: bool) -> tuple[dict, np.ndarray, list[int]]:
    images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 100 if fine else 10, n)]
    entry = {"data": images.reshape(n, 3072), "batch_label": "tiny batch", "filenames": [f"img{i}.png" for i in range(n)]}
    if fine:
        entry |= {"fine_labels": labels, "coarse_labels": [v // 5 for v in labels]}
    else:
        entry["labels"] = labels
    return entry, images, labels


def _write_cifar(stage: Path, name: str):
    """Official-format tiny CIFAR folder under `stage`; returns (md5-matching class, train/test arrays)."""
    base = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    folder = stage / base.base_folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    fine = name == "cifar100"
    parts: dict[str, list] = {"train": [], "test": []}
    for split, files in (("train", base.train_list), ("test", base.test_list)):
        for file_name, _ in files:
            entry, images, labels = _cifar_batch(rng, 2 if split == "train" and not fine else 3, fine)
            _dump_py2(entry, folder / file_name)
            parts[split].append((images, labels))
    if fine:
        meta = {"fine_label_names": [f"fine{i}" for i in range(100)], "coarse_label_names": [f"c{i}" for i in range(20)]}
    else:
        meta = {"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": 2, "num_vis": 3072}
    _dump_py2(meta, folder / base.meta["filename"])

    def md5(file_name: str) -> str:
        return hashlib.md5((folder / file_name).read_bytes()).hexdigest()

    tiny = type(
        f"Tiny{base.__name__}",
        (base,),
        {
            "train_list": [[f, md5(f)] for f, _ in base.train_list],
            "test_list": [[f, md5(f)] for f, _ in base.test_list],
            "meta": {**base.meta, "md5": md5(base.meta["filename"])},
        },
    )
    arrays = {
        split: (np.concatenate([p[0] for p in ps]), np.concatenate([p[1] for p in ps])) for split, ps in parts.items()
    }
    return tiny, arrays


def test_tiny_cifar_pickles_match_official_layout(tmp_path):
    _write_cifar(tmp_path, "cifar100")
    with open(tmp_path / "cifar-100-python" / "train", "rb") as f:
        entry = pickle.load(f, encoding="bytes")
    assert {b"data", b"fine_labels", b"coarse_labels", b"filenames", b"batch_label"} == set(entry)
    assert entry[b"data"].dtype == np.uint8 and entry[b"data"].shape == (3, 3072)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("layout", ["folder", "archive"])
def test_cifar_reads_official_format(tmp_path, monkeypatch, name, layout):
    tiny, arrays = _write_cifar(tmp_path / "stage", name)
    monkeypatch.setitem(D.CIFAR_CLASSES, name, tiny)
    root = tmp_path / "root"
    root.mkdir()
    if layout == "folder":
        shutil.copytree(tmp_path / "stage" / tiny.base_folder, root / tiny.base_folder)
    else:
        with tarfile.open(root / tiny.filename, "w:gz") as tar:
            tar.add(tmp_path / "stage" / tiny.base_folder, arcname=tiny.base_folder)
    train, test, info = build_datasets(DataConfig(name=name, root=str(root)))
    assert (root / tiny.base_folder).is_dir()
    classes = 10 if name == "cifar10" else 100
    assert info == DatasetInfo(name, 32, 3, classes, *D.CIFAR_STATS[name])
    for ds, (images, labels) in ((train, arrays["train"]), (test, arrays["test"])):
        assert torch.equal(ds.images, torch.from_numpy(images))
        assert ds.labels.tolist() == labels.tolist()
    x, y = test[1]
    assert torch.equal(_unnormalise(x, info), torch.from_numpy(arrays["test"][0][1]))
    assert y == int(arrays["test"][1][1])
    crop = next(t for t in train.transform.transforms if isinstance(t, v2.RandomCrop))
    assert crop.padding == [4, 4, 4, 4] and v2.RandomHorizontalFlip in _transform_types(train)


def test_cifar_corrupted_file_fails_md5(tmp_path, monkeypatch):
    tiny, _ = _write_cifar(tmp_path, "cifar10")
    monkeypatch.setitem(D.CIFAR_CLASSES, "cifar10", tiny)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    raw = bytearray(batch.read_bytes())
    raw[-10] ^= 0xFF
    batch.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="corrupted"):
        build_datasets(DataConfig(name="cifar10", root=str(tmp_path)))


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_missing_names_folder_and_archive(tmp_path, name):
    with pytest.raises(UserError) as err:
        build_datasets(DataConfig(name=name, root=str(tmp_path)))
    msg = str(err.value)
    base = D.CIFAR_CLASSES[name]
    assert base.base_folder in msg and base.filename in msg and str(tmp_path) in msg and "data.root" in msg


# ---------------------------------------------------------------------------------------- ImageFolder


def _write_image_folder(root: Path) -> None:
    rng = np.random.default_rng(2)
    for split, n in (("train", 3), ("val", 2)):
        for cls in ("cat", "dog"):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (10, 14, 3), dtype=np.uint8)).save(d / f"{i}.png")


def test_imagefolder(tmp_path):
    _write_image_folder(tmp_path)
    train, test, info = build_datasets(DataConfig(name="imagefolder", root=str(tmp_path), img_size=8))
    assert info == DatasetInfo("imagefolder", 8, 3, 2, *D.IMAGENET_STATS)
    assert (len(train), len(test)) == (6, 4)
    for ds in (train, test):
        x, y = ds[len(ds) - 1]
        assert x.shape == (3, 8, 8) and x.dtype == torch.float32 and y == 1
    assert v2.RandomResizedCrop in _transform_types(train) and v2.CenterCrop in _transform_types(test)


def test_imagefolder_missing_dirs(tmp_path):
    (tmp_path / "train" / "a").mkdir(parents=True)
    with pytest.raises(UserError, match="val"):
        build_datasets(DataConfig(name="imagefolder", root=str(tmp_path)))
    with pytest.raises(UserError, match="data.root"):
        build_datasets(DataConfig(name="imagefolder"))


# ---------------------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_and_learnable():
    cfg = DataConfig(name="synthetic", synthetic_train=200, synthetic_test=50, synthetic_size=16, synthetic_chans=2)
    torch.manual_seed(0)
    train, test, info = build_datasets(cfg)
    torch.manual_seed(99)
    train2, test2, _ = build_datasets(cfg)
    assert info.img_size == 16 and info.in_chans == 2 and info.num_classes == 10
    assert torch.equal(train.images, train2.images) and torch.equal(train.labels, train2.labels)
    assert torch.equal(test[7][0], test2[7][0])
    assert not torch.equal(train.images[:50], test.images)
    assert torch.equal(torch.bincount(train.labels), torch.full((10,), 20))
    # nearest class mean on raw pixels separates the classes
    means = torch.stack([train.images[train.labels == c].float().mean(0) for c in range(10)])
    dist = ((test.images.float()[:, None] - means[None]) ** 2).flatten(2).sum(-1)
    assert (dist.argmin(1) == test.labels).float().mean() > 0.9
    x, _ = next(iter(DataLoader(train, batch_size=32)))
    assert x.shape == (32, 2, 16, 16)


def test_bad_config_values():
    with pytest.raises(UserError, match="digits"):
        build_datasets(DataConfig(name="mnist"))
    with pytest.raises(UserError, match="synthetic_classes"):
        build_datasets(DataConfig(name="synthetic", synthetic_classes=0))
    with pytest.raises(UserError, match="crop_padding"):
        build_datasets(DataConfig(name="digits", crop_padding=-1))
    with pytest.raises(UserError, match="randaugment"):
        build_datasets(DataConfig(name="synthetic", synthetic_chans=2, randaugment=True))
    assert DATASETS == ("digits", "fashion_mnist", "cifar10", "cifar100", "imagefolder", "synthetic", "mazes")


def test_evaluation_builds_the_test_split_alone(tmp_path):
    """with_train=False: no train set (and for imagefolder the train folder is not even scanned)."""
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / split / c / "x.png")
    (tmp_path / "train" / "a" / "broken.png").write_text("not an image")  # would fail if train/ were read
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), img_size=8)
    train, test, info = build_datasets(cfg, with_train=False)
    assert train is None and len(test) == 2 and info.num_classes == 2
    full_train, full_test, _ = build_datasets(DataConfig(name="digits"))
    train, test, _ = build_datasets(DataConfig(name="digits"), with_train=False)
    assert train is None and torch.equal(test[0][0], full_test[0][0])  # same normalisation
