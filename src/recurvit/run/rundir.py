"""A run directory and its one owner in code: ``RunDir``.

Classification training, fine-tuning and LoopVAE training all keep their runs through this class:

- **create** (``RunDir.create``): a new directory, never over an existing non-empty one (except one
  left by a start killed before its first epoch ended: ``never_trained``); an unwritable place or a
  path that is a file is one clear error.
- **lock**: the one lock (:mod:`recurvit.run.lock`, an exclusive ``flock``) on ``RUN/.lock``, taken
  before anything is read or written and held for the life of the run. The OS releases it on any exit, kill -9 included, so a
  crashed run never blocks its ``--resume``; a second process on the same directory (a second
  ``train --out``, a ``--resume`` of a running run, a study worker) ends with one line and touches
  nothing. The lock file keeps the owner's pid for that message.
- **resume** (``RunDir.resume``): the same directory, locked; leftover temp files of an interrupted
  checkpoint write (``.last.pt.XXXX.tmp``) are removed; the training loops then truncate
  ``metrics.jsonl`` to the epoch of ``last.pt`` (``truncate_metrics``: a crash may fall between the
  metrics append and the checkpoint write). A directory without a checkpoint (killed before its
  first epoch ended) starts from the beginning (``open_run``).
- **write**: ``config.yaml`` (what the run actually uses, a resume's overrides included) is written
  atomically before the first epoch starts, so a run killed at any moment resumes as itself; metrics are appended one JSON
  line per epoch, ``last.pt`` / ``best.pt`` are saved atomically, a truncated metrics file is
  rewritten atomically. Every atomic write fsyncs the file and, after the rename, the directory (a
  checkpoint survives a power loss); a full disk is one line naming the file (``DiskFull``) and
  leaves the file it would have replaced as it was.
- **clean up**: a run that fails before writing anything leaves no directory behind (only a
  directory this process created is ever removed, and only when it holds nothing but the lock).

Under several processes (DDP) only rank 0 owns the directory: other ranks get an instance with
``owner=False`` whose writes do nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ..errors import UserError
from . import checkpoint as ckpt_io, lock
from .atomic import raise_if_no_space, save_atomic, write_atomic

LOCK = ".lock"
LEFTOVERS = (LOCK, "metrics.jsonl", "tb", "error.txt")  # what a run killed before its first epoch ended may leave
CONFIG, METRICS, LAST, BEST = "config.yaml", "metrics.jsonl", "last.pt", "best.pt"


class RunDir:
    """Owner of one run directory for the life of a run (a context manager)."""

    current: Optional[Path] = None  # the run directory this process last opened as owner (the interrupt message)

    def __init__(self, path: Path, created: bool, owner: bool = True):
        self.path = Path(path)
        if owner:
            RunDir.current = self.path
        self.created = created  # this process made the directory (it may remove it on failure)
        self.owner = owner
        self._lock_fd: Optional[int] = None
        self._wrote_metrics = False

    # ------------------------------------------------------------------------- opening
    @classmethod
    def create(cls, path: Path, owner: bool = True) -> "RunDir":
        """A new run directory at ``path`` (an existing empty directory is taken), locked."""
        path = Path(path)
        if not owner:
            return cls(path, created=False, owner=False)
        if path.exists() and not path.is_dir():
            raise UserError(f"--out {path} is a file, not a directory; choose another --out")
        if path.is_dir() and not never_trained(path) and any(p.name != LOCK for p in path.iterdir()):  # before the lock
            raise UserError(f"run directory {path} already exists and is not empty; choose another --out "
                            f"or pass --resume {path}")
        created = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir()
            created = True
        except FileExistsError:
            pass
        except OSError as e:
            raise UserError(f"cannot create run directory {path}: {e.strerror or e}; choose a writable --out") from None
        run = cls(path, created)
        run._lock()
        if never_trained(path):  # a start killed before its first epoch ended: its leftovers go, the run starts again
            for leftover in run._contents():
                shutil.rmtree(leftover) if leftover.is_dir() and not leftover.is_symlink() else leftover.unlink()
        if run._contents():
            run.release()
            raise UserError(f"run directory {path} already exists and is not empty; choose another --out "
                            f"or pass --resume {path}")
        return run

    @classmethod
    def resume(cls, path: Path, owner: bool = True) -> "RunDir":
        """An existing run directory, locked, with interrupted writes cleaned up."""
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"cannot resume: {path} is not a run directory")
        if (path / METRICS).exists() and not (path / METRICS).is_file():
            raise UserError(f"cannot resume {path}: its {METRICS} is not a file; put back the run's metrics file "
                            "(or remove what is there: the run goes on from its last.pt)")
        run = cls(path, created=False, owner=owner)
        if owner:
            run._lock()
            for tmp in path.glob(".*.tmp"):  # a checkpoint / metrics write interrupted by a kill
                tmp.unlink(missing_ok=True)
        return run

    def _lock(self) -> None:
        try:
            self._lock_fd = lock.acquire(self.path / LOCK)
        except lock.Busy as e:
            raise UserError(f"run directory {self.path} is in use by another process (pid {e.pid}); "
                            "wait for it to finish or choose another --out") from None
        except OSError as e:  # (a full disk is DiskFull, one line already)
            raise UserError(f"cannot write in run directory {self.path}: {e.strerror or e}") from None

    def release(self) -> None:
        """Give up the lock (the directory and its files stay)."""
        if self._lock_fd is not None:
            lock.release(self._lock_fd)
            self._lock_fd = None

    def _contents(self) -> List[Path]:
        return [p for p in self.path.iterdir() if p.name != LOCK]

    def __enter__(self) -> "RunDir":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        """Release the lock; a directory this process created and never wrote into goes too."""
        # nothing a user could want: no file, or only the config this session wrote before its first epoch
        empty = (self.owner and self.path.is_dir() and not self._wrote_metrics
                 and all(p.name == CONFIG for p in self._contents()))
        self.release()
        if failed and self.created and empty:
            shutil.rmtree(self.path, ignore_errors=True)

    # ------------------------------------------------------------------------ contents
    def has_checkpoint(self) -> bool:
        return (self.path / LAST).is_file()

    def load_last(self, map_location: Any = "cpu") -> Dict[str, Any]:
        return ckpt_io.load_checkpoint(self.path / LAST, map_location)

    def write_config(self, text: str) -> None:
        """config.yaml, written atomically at once: a run killed at any moment after this can be resumed
        with its own config (a bare ``--resume`` never falls back to the default config). A run that
        fails with an error before its first epoch ends leaves nothing behind (see :meth:`close`)."""
        if self.owner:
            write_atomic(self.path / CONFIG, text)

    def append_metrics(self, metrics: Dict[str, Any]) -> None:
        if self.owner:
            self._wrote_metrics = True
            line = json.dumps(metrics) + "\n"
            try:
                with open(self.path / METRICS, "a") as f:
                    f.write(line)
            except OSError as e:  # a full disk: one line (the lines already there are kept)
                raise_if_no_space(e, self.path / METRICS, len(line.encode()))
                raise

    def _parsed_metrics(self) -> List[tuple]:
        """(line number, the line's metrics or None when it is not a JSON object) for every non-empty line."""
        p = self.path / METRICS
        if not p.is_file():
            return []
        out = []
        for i, ln in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if not ln.strip():
                continue
            try:
                m = json.loads(ln)
            except ValueError:
                m = None
            out.append((i, m if isinstance(m, dict) else None))
        return out

    def read_metrics(self) -> List[Dict[str, Any]]:
        rows = self._parsed_metrics()
        bad = next((i for i, m in rows if m is None), None)
        if bad is not None:
            raise UserError(f"{self.path / METRICS}, line {bad}: not a metrics line (a JSON object); "
                            "repair or delete that line")
        return [m for _, m in rows]

    def truncate_metrics(self, epochs: int) -> None:
        """Keep the metric lines of epochs <= ``epochs`` (rewritten atomically). Lines past the checkpoint
        are dropped whatever they hold (a line torn by a kill among them); an unreadable line among the
        epochs kept is an error naming it."""
        if not (self.owner and (self.path / METRICS).is_file()):
            return
        rows = self._parsed_metrics()
        last_kept = max((i for i, m in rows if m is not None and m.get("epoch", 0) <= epochs), default=0)
        bad = next((i for i, m in rows if m is None and i < last_kept), None)
        if bad is not None:
            raise UserError(f"{self.path / METRICS}, line {bad}: not a metrics line (a JSON object), among the "
                            f"{epochs} epochs the checkpoint keeps; repair or delete that line, then resume")
        keep = [m for i, m in rows if m is not None and m.get("epoch", 0) <= epochs]
        write_atomic(self.path / METRICS, "".join(json.dumps(m) + "\n" for m in keep))

    def save(self, name: str, obj: Dict[str, Any]) -> None:
        if self.owner:
            save_atomic(obj, self.path / name)


def never_trained(path: Path) -> bool:
    """Whether ``path`` is a run directory left by a start killed before its first epoch ended (while it
    wrote config.yaml or a task's recipe, e.g. finetune.json): a lock file, and besides it only what such a
    start writes; no checkpoint, no metric line. Starting there again loses nothing."""
    path = Path(path)
    if not (path / LOCK).is_file():  # the mark that recurvit made it a run directory
        return False
    for p in path.iterdir():
        started = (p.name in (LOCK, CONFIG, "tb", "error.txt") or (p.name.startswith(".") and p.name.endswith(".tmp"))
                   or (p.suffix == ".json" and p.name != "result.json" and p.is_file()) or (p.name == METRICS and p.stat().st_size == 0))
        if not started:
            return False
    return True


def check_available(path: Path, resume: bool) -> None:
    """The checks of ``create`` / ``resume`` that need no lock (a launcher's, before its workers)."""
    path = Path(path)
    if resume:
        if not path.is_dir():
            raise UserError(f"cannot resume: {path} is not a run directory")
    elif path.exists() and (not path.is_dir() or (not never_trained(path) and any(p.name != LOCK for p in path.iterdir()))):
        what = "is a file" if not path.is_dir() else "already exists and is not empty"
        raise UserError(f"run directory {path} {what}; choose another --out" + (f" or pass --resume {path}"
                                                                                   if path.is_dir() else ""))


def open_run(out: Path, resume: bool, owner: bool = True, log: Callable[[str], None] = print) -> RunDir:
    """``RunDir.resume`` or ``RunDir.create``; a resume of a directory without a checkpoint
    (a run killed before its first one) restarts it from the beginning, saying so."""
    if not resume:
        return RunDir.create(out, owner)
    run = RunDir.resume(out, owner)
    if owner and not run.has_checkpoint():
        log(f"{out} has no checkpoint yet (stopped before its first epoch ended): starting it from the beginning")
        run.truncate_metrics(0)
    return run


def default_run_dir(cfg, root: str = "runs") -> Path:
    """``runs/<data>-<model>-<time>``, with ``-1``, ``-2``, ... when that name is taken."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{cfg.data.name}-{cfg.model.name}-{stamp}"
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out
