"""Image files for `data.name=imagefolder`: an unreadable file is one line naming it, or is left out.

Default (data.skip_bad_images=false): nothing is checked up front (an ImageNet-sized folder would
take minutes); the loader turns PIL's errors for a corrupt, truncated or non-image file into an
`UnreadableImageError` naming the file and the option. The error keeps its one line when it is
raised inside a DataLoader worker (see `UnreadableImageError`).

data.skip_bad_images=true: every image is opened and verified once (`Image.verify()`: the header, and
for PNG the chunk checksums; cheap, threads) when the data set is built, and those that fail are left
out and listed in `CheckedImageFolder.skipped`. `verify()` does not decode pixels, so a JPEG truncated
inside its image data passes it; such a file still ends the run with its path when it is read.

Symbolic links (`check_links`, one walk of the folder's directory entries before torchvision's own,
which follows every link): a link that points outside the data folder (data.root) is refused with its
name unless data.follow_symlinks=true; a link loop (a link to itself, or to a folder above it, which
torchvision would walk round until the path is too long) is an error naming the link, whatever the
option. A path is written as it is in messages, or with repr() when it holds a newline or another
character that is not printable (so the message stays one line).
"""
from __future__ import annotations

import errno
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, Optional

from PIL import Image, UnidentifiedImageError
from torchvision import datasets as tvd
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from ..errors import UserError

# what PIL raises for a file it cannot read: not an image (UnidentifiedImageError is an OSError),
# truncated (OSError), broken PNG chunks (SyntaxError), bad headers (ValueError, struct.error, EOFError)
PIL_ERRORS: tuple[type[BaseException], ...] = (
    OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, Image.DecompressionBombError,
)
SKIP_OPTION = "data.skip_bad_images=true"
FOLLOW_OPTION = "data.follow_symlinks=true"


def shown(path: str | os.PathLike) -> str:
    """``path`` for a one-line message: as it is, or repr() of it when it holds a newline (or another
    character that is not printable)."""
    text = os.fspath(path)
    return text if text.isprintable() else repr(text)


class UnreadableImageError(UserError):
    """An image file PIL cannot read; the message is one line naming the file.

    Raised in a DataLoader worker, torch re-raises it in the main process as
    ``UnreadableImageError("Caught UnreadableImageError in DataLoader worker process 0.\\nOriginal
    Traceback ...\\nrecurvit.data.images.UnreadableImageError: <message>\\n")``; the constructor
    keeps only ``<message>``, so the command line still prints one line.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(_original_message(str(message)))


def _original_message(message: str) -> str:
    if "\n" not in message.strip():
        return message
    name = UnreadableImageError.__name__
    for line in reversed(message.splitlines()):
        head, sep, rest = line.partition(": ")
        if sep and head.rsplit(".", 1)[-1] == name:
            return rest.strip()
    return message.strip().splitlines()[0]


def _reason(e: BaseException) -> str:
    if isinstance(e, UnidentifiedImageError):
        return "not an image file PIL can read"
    if isinstance(e, FileNotFoundError):
        return "file not found"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def non_finite(im: Image.Image) -> Optional[str]:
    """Why a float image cannot be used (NaN or inf values: converting it to 8 bits would hide them), or None."""
    if im.mode not in ("F", "I"):
        return None
    import numpy as np

    arr = np.asarray(im, dtype=np.float64)
    bad = int((~np.isfinite(arr)).sum())
    return f"a float image with {bad:,} NaN or inf values of {arr.size:,}" if bad else None


SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")  # PIL's modes of 16-bit single-channel images


def to_8bit(im: Image.Image) -> Image.Image:
    """``im`` with 8 bits a channel, its values SCALED to 0..255 (PIL's convert("L") / ("RGB") clips a 16-bit
    image's 0..65535 at 255 instead): 16-bit images by 255 / 65535; 32-bit integer images (PIL opens some
    16-bit files so) likewise when their values fit 16 bits; float images in [0, 1] by 255 (in [0, 255]: as
    they are). Other modes are
    returned as they are. A range it cannot read as an image's is a UserError naming the mode."""
    if im.mode not in SIXTEEN_BIT + ("I", "F"):
        return im
    import numpy as np

    arr = np.asarray(im, dtype=np.float64)
    lo, hi = (float(arr.min()), float(arr.max())) if arr.size else (0.0, 0.0)
    if im.mode == "F":
        if lo < 0 or hi > 255:
            raise UserError(f"a float image (PIL mode F) with values in [{lo:g}, {hi:g}]; recurvit reads float "
                            "images in [0, 1] or [0, 255]: save it with 8 or 16 bits a channel")
        scale = 255.0 if hi <= 1 else 1.0
    elif im.mode == "I" and (lo < 0 or hi > 65535):
        raise UserError(f"a 32-bit integer image (PIL mode I) with values in [{lo:g}, {hi:g}]; recurvit reads "
                        "8- and 16-bit images: save it with 8 or 16 bits a channel")
    else:
        scale = 255.0 / 65535.0 if im.mode in SIXTEEN_BIT or hi > 255 else 1.0
    return Image.fromarray(np.clip(np.rint(arr * scale), 0, 255).astype(np.uint8), mode="L")


def load_image(path: str, checked: bool = False) -> Image.Image:
    """The RGB image in `path`, or UnreadableImageError naming it. `checked`: the file passed
    `find_unreadable` when the data set was built (data.skip_bad_images=true)."""
    try:
        with open(path, "rb") as f:
            im = Image.open(f)
            im.load()
            why = non_finite(im)
            if not why:
                return to_8bit(im).convert("RGB")  # a 16-bit image scaled, not clipped
    except PIL_ERRORS as e:
        if checked:
            hint = ("it passed the header check at start-up but its image data is corrupt or truncated;"
                    " delete or replace it")
        else:
            hint = f"delete or replace it, or set {SKIP_OPTION} to leave unreadable images out"
        raise UnreadableImageError(f"cannot read image {shown(path)} ({_reason(e)}); {hint}") from None
    raise UnreadableImageError(f"cannot use image {shown(path)} ({why}); delete or replace it")


def image_problem(path: str) -> Optional[str]:
    """Why PIL cannot open and verify `path`, or None."""
    try:
        with Image.open(path) as im:
            im.verify()
    except PIL_ERRORS as e:
        return _reason(e)
    return None


def find_unreadable(paths: list[str], threads: Optional[int] = None) -> list[str]:
    """The paths PIL cannot open and verify, in the order given (I/O bound: a few threads)."""
    threads = threads or min(8, (os.cpu_count() or 1) * 2)
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        problems = list(pool.map(image_problem, paths, chunksize=64))
    return [p for p, problem in zip(paths, problems) if problem is not None]


def _inside(path: str, folder: str) -> bool:
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # different drives
        return False


def _link_target(link: str) -> Optional[str]:
    """The real path a symlink leads to; None when it leads nowhere (a dangling link: the loader names
    it when it is read); UserError for a loop."""
    try:
        return os.path.realpath(link, strict=True)
    except FileNotFoundError:
        return None
    except (OSError, RuntimeError) as e:  # ELOOP (3.13 raises OSError, earlier versions RuntimeError too)
        if isinstance(e, OSError) and e.errno not in (errno.ELOOP, None):
            return None
        raise UserError(f"imagefolder: {shown(link)} is a symlink loop (its links lead round in a circle); "
                        "remove it or point it at an image or a folder") from None


def check_links(top: str | os.PathLike, data_root: str | os.PathLike, follow: bool = False) -> None:
    """UserError for a symlink under ``top`` that points outside ``data_root`` (unless ``follow``) or
    that makes a loop. Walks what torchvision's ImageFolder reads: ``top``'s class folders, the folders
    under them (links followed) and the image files in them; ``top`` itself is checked too."""
    root_real = os.path.realpath(data_root)
    if os.path.islink(top):
        real = _link_target(os.fspath(top))
        if real is not None and not follow and not _inside(real, root_real):
            raise _outside(os.fspath(top), real, data_root)
    stack = [(os.fspath(top), (os.path.realpath(top),), True)]
    while stack:
        folder, ancestors, is_top = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # torchvision's walk leaves out what it cannot list, and so do we
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows a link
            except OSError:  # a link loop (ELOOP): _link_target names it below
                is_dir = False
            if not is_dir and (is_top or not has_file_allowed_extension(entry.name, IMG_EXTENSIONS)):
                continue  # a file torchvision does not read
            if entry.is_symlink():
                real = _link_target(entry.path)  # UserError for a loop
                if real is None:
                    continue
                if not follow and not _inside(real, root_real):
                    raise _outside(entry.path, real, data_root)
            elif is_dir:
                real = os.path.join(ancestors[-1], entry.name)  # a real folder's entry that is no link
            else:
                continue
            if is_dir:
                if real in ancestors or _inside(ancestors[-1], real):  # a folder above this one, walked again
                    raise UserError(f"imagefolder: {shown(entry.path)} is a symlink loop (it points to "
                                    f"{shown(real)}, a folder above it); remove it")
                stack.append((entry.path, ancestors + (real,), False))


def _outside(link: str, real: str, data_root: str | os.PathLike) -> UserError:
    return UserError(f"imagefolder: {shown(link)} is a symlink to {shown(real)}, outside the data folder "
                     f"{shown(data_root)}; move the file into it, or set {FOLLOW_OPTION} to read it")


class CheckedImageFolder(tvd.ImageFolder):
    """torchvision's ImageFolder with `load_image` as its loader, and its symlinks checked first
    (`check_links`: inside ``data_root``, default ``root``, unless ``follow_symlinks``; no loops).

    skip_bad=True: every image is verified here and the unreadable ones are left out of `samples`,
    `imgs` and `targets`; their paths are in `skipped` (always a list, empty when nothing was left out).
    """

    def __init__(self, root: str | os.PathLike, transform: Optional[Callable] = None, skip_bad: bool = False,
                 follow_symlinks: bool = False, data_root: Optional[str | os.PathLike] = None):
        if os.path.isdir(root):  # a missing folder: torchvision's own error
            check_links(root, root if data_root is None else data_root, follow_symlinks)
        super().__init__(root, transform=transform, loader=partial(load_image, checked=skip_bad))
        self.skipped: list[str] = []
        if skip_bad:
            bad = set(find_unreadable([path for path, _ in self.samples]))
            if bad:
                self.skipped = [path for path, _ in self.samples if path in bad]
                self.samples = [s for s in self.samples if s[0] not in bad]
                self.imgs = self.samples
                self.targets = [target for _, target in self.samples]


__all__ = ["CheckedImageFolder", "UnreadableImageError", "check_links", "find_unreadable", "image_problem", "load_image",
           "shown"]
