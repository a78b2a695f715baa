"""Data a user points us at must not hurt: archives that try to write outside the data root, images
that cannot be read, config values that torch would turn into a traceback. Real files on disk, the
real loaders, and the real command line in a subprocess (one stderr line, exit code 2)."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tests.data.test_datasets import _write_cifar
from torch.utils.data import DataLoader

from recurvit.config import DataConfig
from recurvit.data import build_datasets
from recurvit.data import datasets as D
from recurvit.data.archives import member_problem
from recurvit.errors import UserError

FAST = ["model.embed_dim=24", "model.steps=2", "train.epochs=1", "train.progress=false", "train.device=cpu"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`recurvit ARGS` in a subprocess (the installed entry point next to this python, else -m)."""
    exe = Path(sys.executable).parent / "recurvit"
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "recurvit"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return subprocess.run(cmd + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stdout, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# ---------------------------------------------------------------------------------------- archives

OUTSIDE_FILE = "x.txt"  # every malicious member aims at <tmp>/x.txt, the folder above data.root


def _add_file(tar: tarfile.TarFile, name: str, data: bytes = b"pwned\n") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    tar.addfile(info)


def _add_special(tar: tarfile.TarFile, name: str, kind: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = kind, 1, 3
    tar.addfile(info)


# case -> (function adding the bad members, the member the error must name; {out}: the root's parent).
# Every bad member comes after a good one: nothing may be written before every member is checked.
B = "cifar-10-batches-py"
MALICIOUS = {
    "dotdot": (lambda t, out: _add_file(t, "../x.txt"), "../x.txt"),
    "nested_dotdot": (lambda t, out: _add_file(t, f"{B}/../../x.txt"), f"{B}/../../x.txt"),
    "absolute": (lambda t, out: _add_file(t, f"{out}/x.txt"), "{out}/x.txt"),
    "symlink_out": (lambda t, out: _add_link(t, f"{B}/evil", "../../"), f"{B}/evil"),
    "symlink_absolute": (lambda t, out: _add_link(t, f"{B}/evil", str(out)), f"{B}/evil"),
    # `up` points at the data root (inside); `up/../x.txt` looks inside but lands in the root's parent
    "through_link": (
        lambda t, out: (_add_link(t, f"{B}/up", ".."), _add_file(t, f"{B}/up/../x.txt")), f"{B}/up/../x.txt"
    ),
    "hardlink_out": (lambda t, out: _add_link(t, f"{B}/h", "../x.txt", tarfile.LNKTYPE), f"{B}/h"),
    "char_device": (lambda t, out: _add_special(t, f"{B}/null", tarfile.CHRTYPE), f"{B}/null"),
    "block_device": (lambda t, out: _add_special(t, f"{B}/disk", tarfile.BLKTYPE), f"{B}/disk"),
    "fifo": (lambda t, out: _add_special(t, f"{B}/pipe", tarfile.FIFOTYPE), f"{B}/pipe"),
}


def _malicious_root(tmp_path: Path, case: str) -> tuple[Path, Path, str]:
    """<tmp>/outside/root/cifar-10-python.tar.gz with a good member, then the bad ones of `case`."""
    outside = tmp_path / "outside"
    root = outside / "root"
    root.mkdir(parents=True)
    add_bad, bad_name = MALICIOUS[case]
    bad_name = bad_name.replace("{out}", str(outside))
    archive = root / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        _add_file(tar, f"{B}/readme.txt", b"a good member first\n")
        add_bad(tar, outside)
    return outside, archive, bad_name


def _only_archive_left(outside: Path, archive: Path) -> None:
    """Nothing written: the parent holds only root/, the root only the archive (no folder, no staging)."""
    assert sorted(p.name for p in outside.iterdir()) == ["root"]
    assert sorted(p.name for p in archive.parent.iterdir()) == [archive.name]


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archive_is_refused_before_anything_is_written(tmp_path, case):
    outside, archive, bad_name = _malicious_root(tmp_path, case)
    with pytest.raises(UserError) as err:
        build_datasets(DataConfig(name="cifar10", root=str(archive.parent)))
    msg = str(err.value)
    assert "\n" not in msg and str(archive) in msg and bad_name in msg and "nothing was extracted" in msg, msg
    _only_archive_left(outside, archive)


@pytest.mark.slow
def test_malicious_archive_cli_one_line_nothing_written(tmp_path):
    outside, archive, _ = _malicious_root(tmp_path, "dotdot")
    out = tmp_path / "run"
    r = _cli("train", "data.name=cifar10", f"data.root={archive.parent}", "train.epochs=1", "--out", str(out),
             cwd=tmp_path)
    _one_line_error(r, str(archive), "'../x.txt'")
    _only_archive_left(outside, archive)
    assert not (tmp_path / OUTSIDE_FILE).exists() and not out.exists()


def test_truncated_archive_leaves_no_partial_folder(tmp_path, monkeypatch):
    tiny, _ = _write_cifar(tmp_path / "stage", "cifar10")
    monkeypatch.setitem(D.CIFAR_CLASSES, "cifar10", tiny)
    root = tmp_path / "root"
    root.mkdir()
    archive = root / tiny.filename
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "stage" / tiny.base_folder, arcname=tiny.base_folder)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    with pytest.raises(UserError, match=r"cannot unpack .*cifar-10-python.tar.gz") as err:
        build_datasets(DataConfig(name="cifar10", root=str(root)))
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in root.iterdir()) == [tiny.filename]


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_good_archive_with_inside_link_still_loads(tmp_path, monkeypatch, name):
    tiny, arrays = _write_cifar(tmp_path / "stage", name)
    monkeypatch.setitem(D.CIFAR_CLASSES, name, tiny)
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(root / tiny.filename, "w:gz") as tar:
        tar.add(tmp_path / "stage" / tiny.base_folder, arcname=tiny.base_folder)
        _add_link(tar, f"{tiny.base_folder}/meta-link", tiny.meta["filename"])  # a link that stays inside
    train, test, info = build_datasets(DataConfig(name=name, root=str(root)))
    assert len(train) == len(arrays["train"][1]) and len(test) == len(arrays["test"][1])
    assert sorted(p.name for p in root.iterdir()) == sorted([tiny.base_folder, tiny.filename])  # no staging left
    assert (root / tiny.base_folder / "meta-link").is_symlink()


def test_member_problem_allows_ordinary_members(tmp_path):
    file, folder = tarfile.TarInfo("a/b.bin"), tarfile.TarInfo("./a")
    folder.type = tarfile.DIRTYPE
    inside = tarfile.TarInfo("a/l")
    inside.type, inside.linkname = tarfile.SYMTYPE, "../a/b.bin"
    for m in (file, folder, inside):
        assert member_problem(m, {"a/l"}, str(tmp_path)) is None


# ---------------------------------------------------------------------------------------- imagefolder


def _png_bytes(seed: int, size: tuple[int, int] = (10, 14)) -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _bad_bytes(kind: str) -> bytes:
    good = _png_bytes(99)
    if kind == "text":  # a text file named .png
        return b"this is not an image\n"
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "corrupt":  # bytes flipped inside the pixel data: the IDAT checksum no longer matches
        raw = bytearray(good)
        raw[good.index(b"IDAT") + 20] ^= 0xFF
        return bytes(raw)
    raise ValueError(kind)


def _folder_with_bad(root: Path, bad: dict[str, str]) -> dict[str, Path]:
    """train/{cat,dog}/0..2.png and val/{cat,dog}/0..1.png, plus `bad` {relative path: kind}."""
    seed = 0
    for split, n in (("train", 3), ("val", 2)):
        for cls in ("cat", "dog"):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                seed += 1
                (root / split / cls / f"{i}.png").write_bytes(_png_bytes(seed))
    paths = {}
    for rel, kind in bad.items():
        (root / rel).write_bytes(_bad_bytes(kind))
        paths[kind] = root / rel
    return paths


@pytest.mark.parametrize("kind", ["text", "truncated", "corrupt"])
def test_unreadable_image_is_one_line_naming_the_file(tmp_path, kind):
    path = _folder_with_bad(tmp_path, {"train/dog/bad.png": kind})[kind]
    train, _, _ = build_datasets(DataConfig(name="imagefolder", root=str(tmp_path), img_size=8))
    index = [p for p, _ in train.samples].index(str(path))
    train[index - 1]  # the good ones still load
    with pytest.raises(UserError) as err:
        train[index]
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "data.skip_bad_images=true" in msg, msg


def test_unreadable_image_in_a_dataloader_worker_stays_one_line(tmp_path):
    path = _folder_with_bad(tmp_path, {"val/cat/bad.png": "text"})["text"]
    _, test, _ = build_datasets(DataConfig(name="imagefolder", root=str(tmp_path), img_size=8))
    loader = DataLoader(test, batch_size=2, num_workers=2)
    with pytest.raises(UserError) as err:
        list(loader)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"cannot read image {path} "), msg


@pytest.mark.slow
@pytest.mark.parametrize("kind,workers", [("corrupt", 0), ("text", 0), ("truncated", 2)])
def test_unreadable_image_cli_exit_2_one_line(tmp_path, kind, workers):
    path = _folder_with_bad(tmp_path / "data", {"train/cat/bad.png": kind})[kind]
    r = _cli("train", "data.name=imagefolder", f"data.root={tmp_path / 'data'}", "data.img_size=8",
             f"data.num_workers={workers}", *FAST, "--out", str(tmp_path / "run"), cwd=tmp_path)
    _one_line_error(r, f"cannot read image {path}", "data.skip_bad_images=true")


def test_skip_bad_images_leaves_them_out_and_reports_the_count(tmp_path):
    bad = {"train/cat/a.png": "text", "train/dog/b.png": "truncated", "val/dog/c.png": "corrupt"}
    paths = _folder_with_bad(tmp_path, bad)
    notes: list[str] = []
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), img_size=8, skip_bad_images=True)
    train, test, info = build_datasets(cfg, log=notes.append)
    assert sorted(train.skipped) == sorted(str(paths[k]) for k in ("text", "truncated"))
    assert test.skipped == [str(paths["corrupt"])]
    assert (len(train), len(test)) == (6, 4) and len(train.targets) == len(train.imgs) == 6
    assert info.skipped_images == 3 and info.num_classes == 2
    assert len(notes) == 1 and "left out 3 unreadable image(s)" in notes[0] and list(info.notes) == notes
    for ds in (train, test):
        for i in range(len(ds)):
            assert ds[i][0].shape == (3, 8, 8)
    # without the option nothing is checked up front: same files, lazy error when read
    _, _, plain = build_datasets(DataConfig(name="imagefolder", root=str(tmp_path), img_size=8))
    assert plain.skipped_images == 0 and plain.notes == ()


def test_skip_bad_images_with_nothing_readable_left(tmp_path):
    _folder_with_bad(tmp_path, {})
    for p in (tmp_path / "val").rglob("*.png"):
        p.write_bytes(b"text")
    with pytest.raises(UserError, match=r"none of the 4 images in .*val can be read"):
        build_datasets(DataConfig(name="imagefolder", root=str(tmp_path), img_size=8, skip_bad_images=True))


@pytest.mark.slow
def test_skip_bad_images_cli_trains_and_prints_the_count(tmp_path):
    _folder_with_bad(tmp_path / "data", {"train/cat/a.png": "text", "train/dog/b.png": "corrupt"})
    r = _cli("train", "data.name=imagefolder", f"data.root={tmp_path / 'data'}", "data.img_size=8",
             "data.skip_bad_images=true", "data.num_workers=2", *FAST, "--out", str(tmp_path / "run"),
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "left out 2 unreadable image(s)" in r.stdout + r.stderr
    assert (tmp_path / "run" / "last.pt").is_file()


# ---------------------------------------------------------------------------------------- config values


@pytest.mark.parametrize("key,value", [
    ("num_workers", -1),
    ("img_size", 0),
    ("crop_padding", -2),
    ("mixup_alpha", -0.5),
    ("cutmix_alpha", float("nan")),
    ("synthetic_size", 0),
    ("synthetic_train", 0),
])
def test_bad_data_values_are_one_line_when_datasets_are_built(key, value):
    with pytest.raises(UserError) as err:
        build_datasets(DataConfig(name="synthetic", **{key: value}))
    msg = str(err.value)
    assert "\n" not in msg and f"data.{key}" in msg, msg


@pytest.mark.slow
def test_negative_num_workers_cli_exit_2_one_line(tmp_path):
    out = tmp_path / "run"
    r = _cli("train", "data.num_workers=-1", *FAST, "--out", str(out), cwd=tmp_path)
    _one_line_error(r, "data.num_workers must be >= 0")
    assert not out.exists() and not (tmp_path / "runs").exists()
