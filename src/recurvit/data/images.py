"""Image files for `data.name=imagefolder`: an unreadable file is one line naming it, or is left out.

Default (data.skip_bad_images=false): nothing is checked up front (an ImageNet-sized folder would
take minutes); the loader turns PIL's errors for a corrupt, truncated or non-image file into an
`UnreadableImageError` naming the file and the option. The error keeps its one line when it is
raised inside a DataLoader worker (see `UnreadableImageError`).

data.skip_bad_images=true: every image is opened and verified once (`Image.verify()`: the header, and
for PNG the chunk checksums; cheap, threads) when the data set is built, and those that fail are left
out and listed in `CheckedImageFolder.skipped`. `verify()` does not decode pixels, so a JPEG truncated
inside its image data passes it; such a file still ends the run with its path when it is read.
"""
from __future__ import annotations

import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, Optional

from PIL import Image, UnidentifiedImageError
from torchvision import datasets as tvd

from ..errors import UserError

# what PIL raises for a file it cannot read: not an image (UnidentifiedImageError is an OSError),
# truncated (OSError), broken PNG chunks (SyntaxError), bad headers (ValueError, struct.error, EOFError)
PIL_ERRORS: tuple[type[BaseException], ...] = (
    OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error, Image.DecompressionBombError,
)
SKIP_OPTION = "data.skip_bad_images=true"


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


def load_image(path: str, checked: bool = False) -> Image.Image:
    """The RGB image in `path`, or UnreadableImageError naming it. `checked`: the file passed
    `find_unreadable` when the data set was built (data.skip_bad_images=true)."""
    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except PIL_ERRORS as e:
        if checked:
            hint = ("it passed the header check at start-up but its image data is corrupt or truncated;"
                    " delete or replace it")
        else:
            hint = f"delete or replace it, or set {SKIP_OPTION} to leave unreadable images out"
        raise UnreadableImageError(f"cannot read image {path} ({_reason(e)}); {hint}") from None


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


class CheckedImageFolder(tvd.ImageFolder):
    """torchvision's ImageFolder with `load_image` as its loader.

    skip_bad=True: every image is verified here and the unreadable ones are left out of `samples`,
    `imgs` and `targets`; their paths are in `skipped` (always a list, empty when nothing was left out).
    """

    def __init__(self, root: str | os.PathLike, transform: Optional[Callable] = None, skip_bad: bool = False):
        super().__init__(root, transform=transform, loader=partial(load_image, checked=skip_bad))
        self.skipped: list[str] = []
        if skip_bad:
            bad = set(find_unreadable([path for path, _ in self.samples]))
            if bad:
                self.skipped = [path for path, _ in self.samples if path in bad]
                self.samples = [s for s in self.samples if s[0] not in bad]
                self.imgs = self.samples
                self.targets = [target for _, target in self.samples]


__all__ = ["CheckedImageFolder", "UnreadableImageError", "find_unreadable", "image_problem", "load_image"]
