"""Unpacking a data set's tar archive without letting any member land outside the target folder.

Every member is checked before anything is written: a name that is absolute or climbs out with
``..``, a path that goes through a link in the archive, a symlink or hard link whose target lies
outside, a device file or FIFO. The checks are ours plus Python's ``tarfile.data_filter`` where it
exists (3.8.17+, 3.9.17+, 3.10.12+, 3.11.4+, 3.12+), and extraction runs with ``filter="data"`` too.
Extraction goes into a fresh folder inside the target whose top-level entries are then moved into
place, so an archive that fails halfway (truncated, disk full) leaves nothing behind.
"""
from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Optional

from ..errors import UserError

_DATA_FILTER = getattr(tarfile, "data_filter", None)


def _walk(path: str, links: set[str]) -> Optional[str]:
    """Follow the relative posix `path` component by component inside the archive's tree: why it
    leaves the tree (a ``..`` above the top) or passes through a link member of the archive, or None."""
    stack: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if stack and "/".join(stack) in links:
            return f"goes through the link {'/'.join(stack)!r} in the archive"
        if part == "..":
            if not stack:
                return "points outside the target folder"
            stack.pop()
        else:
            stack.append(part)
    return None


def _is_absolute(path: str) -> bool:
    return path.startswith(("/", "\\")) or os.path.isabs(path) or (len(path) > 1 and path[1] == ":")


def member_problem(member: tarfile.TarInfo, links: set[str], dest: str) -> Optional[str]:
    """Why extracting `member` into `dest` would be unsafe, or None.

    `links`: the normalised names of every symlink / hard link member of the archive.
    """
    name = member.name
    if not name or "\x00" in name:
        return "has an empty or invalid name"
    if _is_absolute(name):
        return "has an absolute path"
    problem = _walk(name, links)
    if problem:
        return problem
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return "is a device file, FIFO or other special file"
    if member.issym() or member.islnk():
        target = member.linkname
        if not target:
            return "is a link with an empty target"
        if _is_absolute(target):
            return f"is a link to the absolute path {target!r}"
        # a symlink's target is relative to its own folder, a hard link's to the archive's root
        base = posixpath.dirname(name) if member.issym() else ""
        if _walk(posixpath.join(base, target), links):
            return f"is a link to {target!r}, outside the target folder or through another link"
    real_dest = os.path.realpath(dest)
    real = os.path.realpath(os.path.join(real_dest, posixpath.normpath(name)))
    if os.path.commonpath([real_dest, real]) != real_dest:
        return "points outside the target folder"
    if _DATA_FILTER is not None:
        try:
            _DATA_FILTER(member, dest)
        except tarfile.FilterError as e:
            return f"is refused by tarfile's data filter ({e})"
    return None


def safe_extract_tar(archive: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Check every member of tar archive `archive`, then unpack it into folder `dest`.

    One unsafe member: UserError naming the archive and the member, and nothing is written. Top-level
    entries that already exist in `dest` are left as they are. Returns the top-level names unpacked.
    """
    archive, dest = Path(archive), Path(dest)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()  # reads the whole archive: a truncated one fails here
            links = {posixpath.normpath(m.name) for m in members if m.issym() or m.islnk()}
            for m in members:
                problem = member_problem(m, links, str(dest))
                if problem:
                    raise UserError(
                        f"refusing to unpack {archive}: member {m.name!r} {problem}; nothing was extracted"
                        " (replace the archive with the official download)"
                    )
            dest.mkdir(parents=True, exist_ok=True)
            stage = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest))
            try:
                if _DATA_FILTER is not None:
                    tar.extractall(stage, filter="data")
                else:  # every member was checked above
                    tar.extractall(stage)
                moved = []
                for entry in sorted(os.listdir(stage)):
                    if not os.path.lexists(dest / entry):
                        os.replace(stage / entry, dest / entry)
                        moved.append(entry)
                return moved
            finally:
                shutil.rmtree(stage, ignore_errors=True)
    except (OSError, EOFError, tarfile.TarError, zlib.error) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"cannot unpack {archive} into {dest}: {reason} (truncated or not a tar archive?)") from None


__all__ = ["member_problem", "safe_extract_tar"]
