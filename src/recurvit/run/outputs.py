"""Files a command writes where the user says (``predict --csv``, ``horizon --out``, ``export OUT``,
a study's results): never over a file recurvit did not write, always through a temp name and a
rename (:func:`recurvit.run.atomic.atomic_write`), and an unwritable place is one line naming it.

- :func:`claim_file`: ``path`` may be written: it does not exist, or it is a file whose first bytes
  say recurvit wrote it (the CSV header it writes, a matplotlib PNG); a directory or anybody else's
  file (a checkpoint, a config, a photo) is refused in one line;
- :func:`output_dir`: a folder to write into, made if missing; a file there, or a place that cannot
  be written, is one line;
- :func:`write_text` / :func:`save_figure`: :func:`claim_file`, then an atomic write;
- :func:`staged_dir`: a new output folder written under a temporary name and renamed when complete,
  so that a kill leaves either the whole folder or none (an exported model).
"""
from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Callable, Iterator, Optional

from ..errors import UserError
from . import atomic

PNG = b"\x89PNG"
MATPLOTLIB = b"Matplotlib"  # the Software text chunk matplotlib writes into every PNG it saves


def _head(path: Path, n: int = 512) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def claim_file(path: Path, signature: Optional[bytes] = None, what: str = "output") -> Path:
    """``path`` if it may be written (see the module docstring); UserError otherwise. ``signature``:
    the first bytes of a file recurvit writes there (a PNG is recognised by matplotlib's mark)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; give a file name")
    if path.exists() or path.is_symlink():
        head = _head(path)
        ours = (head.startswith(PNG) and MATPLOTLIB in head) if signature == PNG else (
            signature is not None and head.startswith(signature))
        if not ours:
            raise UserError(f"{what} {path} exists and was not written by this command; choose another name "
                            "(recurvit never writes over a file it did not write)")
    return path


def claim_files(folder: Path, marks: dict) -> dict:
    """{name: folder / name}, each claimed (:func:`claim_file`; ``marks``: name -> how a file recurvit wrote
    there begins): called before long work, a file of the user's of that name is one line at once."""
    return {name: claim_file(Path(folder) / name, mark, name) for name, mark in marks.items()}


def output_dir(path: Path, what: str = "--out") -> Path:
    """``path`` made (with its parents) if missing; a file there or an unwritable place is one line."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path} is a file, not a directory; choose another {what}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        atomic.raise_if_no_space(e, path)
        raise UserError(f"cannot create {path}: {e.strerror or e}; choose a writable {what}") from None
    if not os.access(path, os.W_OK):
        raise UserError(f"cannot write in {path}: permission denied; choose a writable {what}")
    return path


def write_text(path: Path, text: str, signature: Optional[bytes] = None, what: str = "output") -> Path:
    """``text`` to ``path`` (claimed, then written atomically)."""
    data = text.encode()
    atomic.atomic_write(claim_file(path, signature, what), lambda f: f.write(data), needed=len(data))
    return path


def save_figure(fig, path: Path, **kwargs) -> Path:
    """A matplotlib figure as a PNG at ``path`` (claimed, then written atomically)."""
    atomic.atomic_write(claim_file(path, PNG, "plot"), lambda f: fig.savefig(f, format="png", **kwargs))
    return path


@contextlib.contextmanager
def staged_dir(out: Path, what: str = "OUT") -> Iterator[Path]:
    """A folder to fill, renamed to ``out`` when the block ends without an error (``out`` must not exist,
    or be an empty folder, and is not a link); on an error or a kill ``out`` is left as it was. The folder is
    built in :func:`recurvit.run.atomic.scratch_dir`, so what a kill -9 left there is removed by the next
    output of that name."""
    out = Path(out)
    if out.is_symlink():
        raise UserError(f"{out} exists; choose another {what}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists{' and is not empty' if out.is_dir() else ''}; choose another {what}")
    parent = output_dir(out.parent, what)
    with atomic.scratch_dir(parent, out.name, "staged", what) as tmp:
        try:
            yield tmp
            os.chmod(tmp, 0o777 & ~atomic.umask())  # mkdtemp makes 0700: follow the umask, as mkdir would
            try:
                os.rename(tmp, out)  # over an empty folder too (rename(2) replaces an empty directory)
            except OSError as e:
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise UserError(f"{out} was created by someone else meanwhile; choose another {what}") from None
                raise
            atomic.fsync_dir(parent)
        except BaseException as e:
            atomic.raise_if_no_space(e, out)
            raise


def write_by_name(path: Path, save: Callable[[str], None], what: str = "OUT") -> Path:
    """``save(name)`` for a library that writes only to a file name (an ONNX program): into a scratch
    folder beside ``path`` (:func:`recurvit.run.atomic.scratch_dir`), then renamed over it; ``path`` must not
    exist."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise UserError(f"{path} exists; choose another {what}")
    parent = output_dir(path.parent, what)
    with atomic.scratch_dir(parent, path.name, "byname", what) as tmp:
        try:
            save(str(tmp / path.name))
            os.replace(tmp / path.name, path)
            atomic.fsync_dir(parent)
        except BaseException as e:
            atomic.raise_if_no_space(e, path)
            raise
    return path
