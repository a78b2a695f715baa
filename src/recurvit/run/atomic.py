"""Atomic writes: a file is replaced whole or not at all (temp file in the same folder, fsync, rename,
fsync of the folder), so a crash or a power loss never leaves half a checkpoint, config or table; a full
disk or an unwritable place is one line naming the file (``DiskFull`` / ``raise_if_unwritable``).

Everything recurvit writes goes through here: checkpoints (:func:`save_atomic`), run files
(:func:`write_atomic`), and the files a command writes where the user says (:mod:`recurvit.run.outputs`).
The files of one command's output (a table, its plot, its summary) are replaced as a set inside
:func:`file_set`, and a folder-sized output is built in a :func:`scratch_dir` that the next such command
removes when a kill -9 left it behind."""
from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterator, List, Optional, Sequence, Tuple

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
    place that cannot be written (read-only, no such folder, a directory at ``path``) is one line too.
    Inside :func:`file_set` the rename waits for the set's end."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise_if_no_space(e, path, needed)
        raise_if_unwritable(e, path)
        raise
    pending = _SET.get()
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes 0600: follow the umask, as a plain open() would
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if pending is not None:  # inside file_set: renamed with the rest of the set when it ends
            pending.append((tmp, path))
            return
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


# ------------------------------------------------------------------------------ outputs written as a set
_SET: contextvars.ContextVar[Optional[List[Tuple[str, Path]]]] = contextvars.ContextVar("file_set", default=None)


class SetDiskFull(DiskFull):
    """A full disk while a :func:`file_set` was written: one line naming the whole set, none of it replaced."""

    def __init__(self, folder: Path, names: Sequence[str], e: OSError):
        what = "no space left on device" if e.errno == errno.ENOSPC else "disk quota exceeded"
        try:
            free = f" ({_size(shutil.disk_usage(folder).free)} free)"
        except OSError:
            free = ""
        listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
        self.path = Path(folder)
        self.what = (f"cannot write {listed} in {folder}: {what}{free}; none of them was replaced (the previous "
                     "ones, if any, are left as they were)")
        UserError.__init__(self, f"{self.what}; free some space and try again")


@contextlib.contextmanager
def file_set(folder: str | Path, names: Sequence[str]) -> Iterator[None]:
    """The files written in the block (through :func:`atomic_write`: write_text, save_figure, tables) replace
    the old ones as a set, all or none: each goes to its own temp file (written and fsynced), and only when
    the block ends without an error are they renamed into place, one after the other (a rename takes no
    space). On an error every temp file is removed and no file is replaced; a full disk is one line naming
    the set (``names`` in ``folder``: the files the command writes). A set inside a set joins the outer one."""
    if _SET.get() is not None:
        yield
        return
    pending: List[Tuple[str, Path]] = []
    token = _SET.set(pending)
    try:
        yield
    except BaseException as e:
        _SET.reset(token)
        for tmp, _ in pending:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        full = _no_space(e)
        if full is not None:
            raise SetDiskFull(Path(folder), list(names), full) from None
        if isinstance(e, DiskFull):  # a full disk found before a write began (no OSError kept behind it)
            raise SetDiskFull(Path(folder), list(names), OSError(errno.ENOSPC, "no space")) from None
        raise
    _SET.reset(token)
    for i, (tmp, path) in enumerate(pending):
        try:
            os.replace(tmp, path)
        except BaseException:  # (a directory put there meanwhile): no temp file is left behind
            for left, _ in pending[i:]:
                with contextlib.suppress(OSError):
                    os.unlink(left)
            raise
    for parent in {path.parent for _, path in pending}:
        fsync_dir(parent)


# ------------------------------------------------------------------------ scratch folders of an output
_STARTED = time.time()  # about when this process began (the module is imported at a command's start)


@contextlib.contextmanager
def scratch_dir(parent: str | Path, name: str, kind: str, what: str = "OUT") -> Iterator[Path]:
    """A new hidden folder ``.NAME.KIND-XXXXXXXX.part`` in ``parent`` to build the output ``name`` in (the
    block renames it into place, or moves what it needs out of it), held through an flock on it while the
    block runs and removed after it. Folders of that name that a kill -9 left are removed first: those no
    process holds and older than this process (one being written by another export is held, one made
    since this process began is left alone). One line for a place where the folder cannot be made."""
    parent = Path(parent)
    prefix = f".{name}.{kind}-"
    remove_stale(parent, prefix)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, suffix=".part", dir=parent))
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise_if_no_space(e, parent / name)
        raise UserError(f"cannot write in {parent} ({e.strerror or e}); choose another {what}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the OS on any exit, kill -9 included
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # (gone already when the block renamed it into place)
        os.close(fd)


def remove_stale(parent: Path, prefix: str) -> List[Path]:
    """Remove the folders ``PREFIX<8 characters>.part`` in ``parent`` (what :func:`scratch_dir` makes) that no
    process holds and that are older than this process; returns them."""
    pattern = re.compile(re.escape(prefix) + r"[a-z0-9_]{8}\.part")
    try:
        entries = [p for p in Path(parent).iterdir() if pattern.fullmatch(p.name)]
    except OSError:
        return []
    removed = []
    for p in entries:
        try:
            if p.is_symlink() or not p.is_dir() or p.stat().st_mtime >= _STARTED:
                continue
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: an export is writing it now
            os.close(fd)
            continue
        try:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        finally:
            os.close(fd)
    return removed
