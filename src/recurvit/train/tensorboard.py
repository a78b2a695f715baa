"""TensorBoard event files of a run (``train.tensorboard=true``): ``RUN/tb/events.out.tfevents.*``.

``metrics.jsonl`` stays the record of a run; the events are a copy of its numbers for TensorBoard
(``tensorboard --logdir runs/``). After every epoch each numeric entry of that epoch's metrics line
is written as a scalar at step = epoch (the x axis of every curve is the epoch, for classification,
fine-tuning and LoopVAE runs alike), under a tag named after the key:

- ``train_loss`` -> ``train/loss``, ``test_acc`` -> ``test/acc``, ``test_psnr`` -> ``test/psnr`` ...
  (``train_*`` / ``test_*`` / ``baseline_*`` keys: the prefix becomes the group);
- ``lr`` -> ``train/lr``, ``img_per_s`` -> ``train/img_per_s``, ``seconds`` -> ``time/epoch_seconds``,
  ``train_seconds`` -> ``time/train_seconds``;
- a list (deep supervision's ``train_stage_losses``) -> one scalar per element,
  ``train/stage_losses/1`` ... (1 = the earliest readout);
- ``epoch`` and ``step`` are not scalars (``step`` is the x axis).

A resumed run continues the same directory: the writer opens with ``purge_step`` = the first epoch
it writes, so events a killed run wrote for epochs after its last checkpoint are discarded by
TensorBoard's reader and every step appears once.

Only the process that owns the run directory writes (rank 0 under DDP). The tensorboard package is
optional (``pip install -e ".[tb]"``); without it ``train.tensorboard=true`` is one UserError, raised
before the run directory is created.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

from ..errors import UserError

TB_DIR = "tb"
_NAMED = {"lr": "train/lr", "img_per_s": "train/img_per_s", "seconds": "time/epoch_seconds",
          "train_seconds": "time/train_seconds", "train_cpu_seconds": "time/train_cpu_seconds"}
_GROUPS = ("train", "test", "baseline")
_SKIP = ("epoch", "step")


def require_tensorboard() -> None:
    """One clear line when ``train.tensorboard=true`` but the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401  (imports the tensorboard package)
    except ImportError:
        raise UserError('train.tensorboard=true needs the tensorboard package: pip install -e ".[tb]" '
                        "(or pip install tensorboard), or set train.tensorboard=false") from None


def tag(key: str) -> str:
    """The TensorBoard tag of a metrics key."""
    if key in _NAMED:
        return _NAMED[key]
    group, sep, rest = key.partition("_")
    return f"{group}/{rest}" if sep and group in _GROUPS else f"other/{key}"


def scalars(metrics: Dict[str, Any]) -> Dict[str, float]:
    """{tag: value} of one metrics line (what :meth:`EpochWriter.add_epoch` writes)."""
    out: Dict[str, float] = {}
    for key, value in metrics.items():
        if key in _SKIP:
            continue
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value, 1):
                if _is_number(v):
                    out[f"{tag(key)}/{i}"] = float(v)
        elif _is_number(value):
            out[tag(key)] = float(value)
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class EpochWriter:
    """Writes each epoch's metrics line to ``RUN/tb`` (a no-op when not ``enabled``).

    A context manager (closed with the run); the SummaryWriter opens at the first epoch written,
    with ``purge_step`` = that epoch, and is flushed after every epoch so a killed run loses nothing
    it had logged."""

    def __init__(self, run_dir: Path, enabled: bool):
        self.dir = Path(run_dir) / TB_DIR
        self.enabled = enabled
        self._writer = None
        if enabled:
            require_tensorboard()

    def add_epoch(self, metrics: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        step = int(metrics["epoch"])
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.dir), purge_step=step)
        for name, value in scalars(metrics).items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "EpochWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_scalars(run_dir: Path) -> Dict[str, List[Tuple[int, float]]]:
    """{tag: [(step, value), ...]} of a run's event files as TensorBoard shows them (purged steps dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / TB_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


__all__ = ["EpochWriter", "require_tensorboard", "read_scalars", "scalars", "tag", "TB_DIR"]
