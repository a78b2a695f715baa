"""Atomic writes: a file is replaced whole or not at all (temp file in the same folder, fsync, rename,
fsync of the folder), so a crash or a power loss never leaves half a checkpoint, config or table; a full
disk or an unwritable place is one line naming the file (``DiskFull`` / ``raise_if_unwritable``).

Everything recurvit writes goes through here: checkpoints (:func:`save_atomic`), run files
(:func:`write_atomic`), and the files a command writes where the user says (:mod:`recurvit.run.outputs`)."""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Callable, Optional

import torch

from ..errors import UserError

NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))  # a full disk, a full quota


def fsync_dir(path: str | Path) -> None:
    """fsync a directory, so a rename into it survives a power loss (a no-op where the platform
    cannot open or sync a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _behind(e: BaseException, wanted: Callable[[BaseException], bool]) -> Optional[BaseException]:
    """The first exception in ``e``'s chain (itself, then what it wraps) that is ``wanted``, or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if wanted(e):
            return e
        e = e.__cause__ or e.__context__
    return None


def _no_space(e: BaseException) -> Optional[OSError]:
    """The full-disk OSError behind ``e`` (torch's zip writer wraps it in a RuntimeError), or None."""
    return _behind(e, lambda x: isinstance(x, OSError) and x.errno in NO_SPACE)


class DiskFull(UserError):
    """A write that found the disk (or quota) full: one line naming the path and the sizes known.
    ``then(how)`` is the same line with the caller's way to go on (e.g. ``--resume RUN``)."""

    def __init__(self, path: str | Path, e: OSError, needed: Optional[int] = None):
        path = Path(path)
        sizes = [f"it needs about {_size(needed)}"] if needed else []
        try:
            sizes.append(f"{_size(shutil.disk_usage(path.parent).free)} free")
        except OSError:
            pass
        kept = f"; the previous {path.name} is left as it was" if path.is_file() else ""
        what = "no space left on device" if e.errno == errno.ENOSPC else "disk quota exceeded"
        known = f" ({', '.join(sizes)})" if sizes else ""
        self.path, self.what = path, f"cannot write {path}: {what}{known}{kept}"
        super().__init__(f"{self.what}; free some space and try again")

    def then(self, how: str) -> UserError:
        return UserError(f"{self.what}; free some space, then {how}")


def raise_if_no_space(e: BaseException, path: str | Path, needed: Optional[int] = None) -> None:
    """DiskFull if ``e`` (or what it wraps) is a full disk or quota; otherwise nothing."""
    full = _no_space(e)
    if full is not None:
        raise DiskFull(path, full, needed) from None


UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG)


def raise_if_unwritable(e: BaseException, path: str | Path) -> None:
    """One line (UserError) if ``e`` says ``path`` cannot be written where it is (read-only, missing parent
    folder, a directory in the way); otherwise nothing."""
    if isinstance(e, OSError) and e.errno in UNWRITABLE:
        raise UserError(f"cannot write {path}: {e.strerror or e}; choose a writable location") from None


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 10**6 else f"{n / 10**6:,.1f} MB ({n:,} bytes)"


def follow_umask(path) -> None:
    """``path`` (a file, or a folder and everything in it) with the permissions a plain open() or mkdir would
    have given under the process's umask: what mkstemp / mkdtemp made (0600 / 0700) and a library renamed into
    place keeps its private mode otherwise (exported weights 0600, step-program folders 0700 under umask 022)."""
    path = Path(path)
    mask = umask()
    for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
        if p.is_symlink():
            continue
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], needed: Optional[int] = None) -> None:
    """``write(f)`` into a temp file in the same directory, fsync, rename over ``path``, fsync the
    directory: a crash (or a power loss) never leaves half a file (a leftover ``.NAME.XXXX.tmp`` is
    removed by the next RunDir.resume). A full disk is one line naming ``path`` (and ``needed``, the
    bytes it takes, where the caller knows them); the file it would have replaced is left as it was. A
    place that cannot be written (read-only, no such folder, a directory at ``path``) is one line too."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise_if_no_space(e, path, needed)
        raise_if_unwritable(e, path)
        raise
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600: follow the umask, as a plain open() would
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if _behind(e, lambda x: isinstance(x, KeyboardInterrupt)) is not None:  # Ctrl-C inside torch's zip
            raise KeyboardInterrupt from None  # writer comes out as "enforce fail ... unexpected pos": say interrupted
        raise_if_no_space(e, path, needed)
        if isinstance(e, IsADirectoryError):  # the rename found a directory at ``path``
            raise_if_unwritable(e, path)
        raise
    fsync_dir(path.parent)


def _tensor_bytes(obj: Any, seen: Optional[set] = None) -> int:
    """Bytes of the tensors in ``obj`` (nested dicts / lists / tuples), each storage counted once."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        try:
            storage = obj.untyped_storage()
            key = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return obj.numel() * obj.element_size()
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def save_atomic(obj: Any, path: str | Path) -> None:
    """torch.save, atomically (see :func:`atomic_write`)."""
    atomic_write(path, lambda f: torch.save(obj, f), needed=_tensor_bytes(obj) or None)


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same directory and a rename (then the
    directory is fsynced: see :func:`atomic_write`)."""
    data = text.encode()
    atomic_write(path, lambda f: f.write(data), needed=len(data))
