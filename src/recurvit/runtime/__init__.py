"""Where and how code runs, for training, evaluation, analysis and studies alike: device, autocast,
seeds, data loaders, progress bars and lines, run directory names; data parallelism is
:mod:`recurvit.runtime.distributed`. It imports nothing of train/, analysis/, tasks/ or study/."""
from __future__ import annotations

import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Tuple

import torch
from torch.utils.data import DataLoader, RandomSampler

from ..config import AMP_MODES, RunConfig
from ..errors import UserError
from . import distributed as dist_io


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device={name} but CUDA is not available; use train.device=cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise UserError(f"train.device='{name}' is not a device; use auto, cpu, cuda or cuda:N") from None


def autocast(device: torch.device, amp: str):
    """bf16 autocast: on by default on CUDA (amp=auto), opt-in on CPU (amp=bf16)."""
    if amp not in AMP_MODES:  # (a config loaded from a file was checked already; this is the Python API)
        raise UserError(f"train.amp must be one of {', '.join(AMP_MODES)}, got '{amp}'")
    on = amp == "bf16" or (amp == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if on else nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def run_data(cfg: RunConfig):
    """The data config a run reads: ONE img_size governs model and data, so ``model.img_size`` alone also
    sizes the images (``data.img_size``, when set, wins; both set and different is an error later). Data
    read at its own size (mazes: a model runs larger ones) is left as it is."""
    from ..data.datasets import dense_target

    if dense_target(cfg.data.name):
        return cfg.data
    if cfg.data.img_size is None and getattr(cfg.model, "img_size", None) is not None:
        return replace(cfg.data, img_size=int(cfg.model.img_size))
    return cfg.data


def resolve_model_config(cfg: RunConfig, info) -> RunConfig:
    """The model follows the data set (img_size, in_chans, num_classes) unless set explicitly; a value set
    explicitly that cannot read the data (fewer classes than its labels, other channels, another size
    without model.dynamic_img_size) is one line here, not a traceback at the first batch."""
    m, name = cfg.model, cfg.data.name
    if m.num_classes is not None and info.num_classes is not None and m.num_classes < info.num_classes:
        raise UserError(f"model.num_classes={m.num_classes} but {name} has {info.num_classes} classes; drop "
                        "model.num_classes (it follows the data set)")
    if m.in_chans is not None and m.in_chans != info.in_chans:
        raise UserError(f"model.in_chans={m.in_chans} but {name} has {info.in_chans}-channel images; drop "
                        "model.in_chans (it follows the data set)")
    if m.img_size is not None and m.img_size != info.img_size and not getattr(m, "dynamic_img_size", False):
        raise UserError(f"model.img_size={m.img_size} but {name} gives {info.img_size}x{info.img_size} images; set "
                        f"data.img_size={m.img_size} to resize them, or drop model.img_size")
    m = replace(m,
                img_size=m.img_size if m.img_size is not None else info.img_size,
                in_chans=m.in_chans if m.in_chans is not None else info.in_chans,
                num_classes=m.num_classes if m.num_classes is not None else info.num_classes)
    if cfg.train.supervision.per_stage_heads and m.stage_heads is None:
        m = replace(m, stage_heads=cfg.train.supervision.stages)
    return replace(cfg, model=m)


def quiet(*args, **kwargs) -> None:
    """A log that says nothing (ranks other than 0, study workers, --json)."""
    return None


def show_progress(wanted: bool = True) -> bool:
    """Progress bars only where someone watches: asked for, stderr a terminal, TQDM_DISABLE unset."""
    if not wanted or _tqdm_disabled():
        return False
    return sys.stderr.isatty()


def _tqdm_disabled() -> bool:
    return os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false")


PIPE_INTERVAL = 60.0  # seconds between progress lines when stderr is not a terminal


class _Lines:
    """A file for tqdm that turns its carriage-return redraws into whole lines (a log, a pipe), at most
    one every PIPE_INTERVAL seconds and the first PIPE_INTERVAL seconds after the bar starts."""

    def __init__(self):
        self.last = time.monotonic()

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        now = time.monotonic()
        if s and now - self.last >= PIPE_INTERVAL:
            self.last = now
            sys.stderr.write(s + "\n")

    def flush(self) -> None:
        sys.stderr.flush()


def bar_options(wanted: bool = True) -> dict:
    """tqdm's options for a progress bar: a bar on a terminal (:func:`show_progress`); where stderr
    is a pipe or a log, one line every PIPE_INTERVAL seconds, the first after PIPE_INTERVAL (so short
    work prints nothing and long work is never silent); none when not wanted or TQDM_DISABLE is set."""
    if show_progress(wanted):
        return {"disable": False}
    if not wanted or _tqdm_disabled():
        return {"disable": True}
    return {"disable": False, "file": _Lines(), "mininterval": min(1.0, PIPE_INTERVAL), "ncols": 100, "ascii": True}


def build_loaders(cfg: RunConfig, epoch_seed: int = 0, env: dist_io.DistEnv = dist_io.SINGLE,
                  log: Optional[Callable[[str], object]] = None) -> Tuple[DataLoader, DataLoader, object]:
    """Train / test loaders. With several processes (``env``) each rank loads its shard of every
    global batch (``train.batch_size / world_size`` images) and of the test set."""
    from ..data import build_datasets

    data = run_data(cfg)
    train_set, test_set, info = env.main_first(lambda: build_datasets(data, log=log if env.is_main else quiet))  # rank 0 downloads first
    kw = dict(num_workers=cfg.data.num_workers, pin_memory=torch.cuda.is_available(),
              persistent_workers=cfg.data.num_workers > 0)
    if not env.enabled:
        train_loader = DataLoader(train_set, batch_size=cfg.train.batch_size, shuffle=True, drop_last=False,
                                  generator=torch.Generator().manual_seed(epoch_seed), **kw)
        test_loader = DataLoader(test_set, batch_size=max(256, cfg.train.batch_size), shuffle=False, **kw)
        return train_loader, test_loader, info
    batch = dist_io.per_rank_batch(cfg.train.batch_size, env.world_size)
    gen = torch.Generator().manual_seed(epoch_seed)  # the single process's: same permutation, same worker seeds
    batches = dist_io.ShardedBatches(RandomSampler(train_set, generator=gen), cfg.train.batch_size,
                                     env.rank, env.world_size)
    train_loader = DataLoader(train_set, batch_sampler=batches, generator=gen, **kw)
    test_loader = DataLoader(test_set, batch_size=max(256, batch), shuffle=False,
                             sampler=dist_io.Shard(len(test_set), env.rank, env.world_size), **kw)
    return train_loader, test_loader, info


def build_val_loader(cfg: RunConfig, train_loader: DataLoader, test_loader: DataLoader,
                     env: dist_io.DistEnv = dist_io.SINGLE) -> Optional[DataLoader]:
    """The validation loader of a run trained with ``data.holdout=f``: the held-out part of the
    training split, read with the test transform (None without a holdout). ``best.pt`` is chosen
    on it, never on the test split."""
    if not cfg.data.holdout:
        return None
    from ..data.calibration import holdout_split

    full = train_loader.dataset.dataset  # build_datasets wraps the training split in a Subset
    val_set = holdout_split(full, test_loader.dataset, cfg.data.holdout)
    kw = dict(batch_size=test_loader.batch_size, shuffle=False, num_workers=cfg.data.num_workers,
              pin_memory=torch.cuda.is_available())
    sampler = dist_io.Shard(len(val_set), env.rank, env.world_size) if env.enabled else None
    return DataLoader(val_set, sampler=sampler, **kw)


def build_test_loader(cfg: RunConfig) -> Tuple[DataLoader, object]:
    """(test loader, data info) for the evaluation commands."""
    from ..data import build_datasets

    _, test_set, info = build_datasets(run_data(cfg), with_train=False)
    loader = DataLoader(test_set, batch_size=max(256, cfg.train.batch_size), shuffle=False,
                        num_workers=cfg.data.num_workers, pin_memory=torch.cuda.is_available())
    return loader, info


def set_epoch(loader: DataLoader, seed: int) -> None:
    """The shuffle of an epoch depends on ``seed`` only (and is the same with any number of processes)."""
    loader.generator.manual_seed(seed)


def default_run_dir(cfg: RunConfig, root: str = "runs") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{cfg.data.name}-{cfg.model.name}-{stamp}"
    out, i = base, 1
    while out.exists():
        out, i = Path(f"{base}-{i}"), i + 1
    return out


