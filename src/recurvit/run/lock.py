"""The one lock of recurvit: a folder that one process writes as a whole (a run directory, a study folder)
is held through an exclusive ``fcntl.flock`` on a lock file in it, taken without waiting.

The OS releases the lock on any exit, kill -9 included, so a crashed writer never blocks the next one;
the lock file keeps its holder's pid, for the one line a second process prints (:class:`Busy`)."""
from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from ..errors import UserError
from .atomic import raise_if_no_space


class Busy(Exception):
    """The lock is held by another process; ``pid``: the holder's, as its lock file says ("?" if unknown)."""

    def __init__(self, path: Path, pid: str):
        super().__init__(f"{path} is held by process {pid}")
        self.path, self.pid = path, pid


def acquire(path: str | Path) -> int:
    """Take the lock of ``path`` (the file is created if missing) and write this process's pid into it;
    returns the open file descriptor, which holds the lock until :func:`release`. Raises :class:`Busy`
    when another process holds it, UserError when the lock file is a symbolic link (never followed),
    ``DiskFull`` when the pid cannot be written on a full disk, and the OSError of a place where the file
    cannot be made (the caller names the folder)."""
    path = Path(path)
    try:  # never through a link: a run folder from elsewhere whose .lock points at ~/notes.txt would have
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # the pid written over that file
    except OSError as e:
        if e.errno == errno.ELOOP and path.is_symlink():
            raise UserError(f"{path} is a symbolic link (to {os.readlink(path)}), not a lock file: recurvit writes "
                            "its pid into its lock, and would have written it there; remove the link, then run "
                            "again") from None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise Busy(path, pid) from None
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as e:  # a 100%-full disk: one line, before anything else is written
        os.close(fd)
        raise_if_no_space(e, path)
        raise
    return fd


def release(fd: int) -> None:
    """Give up a lock taken by :func:`acquire` (the lock file stays)."""
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
