"""What a run reads: its data config (:func:`run_data`), the model config completed by the data set
(:func:`resolve_model_config`), and the train / validation / test loaders, sharded under torchrun
(:mod:`.distributed`); an epoch's shuffle depends on its seed only (:func:`set_epoch`)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Tuple

import torch
from torch.utils.data import DataLoader, RandomSampler

from ..config import RunConfig
from ..data import build_datasets
from ..data.calibration import calibration_split, holdout_split
from ..data.datasets import dense_target
from ..errors import UserError
from . import distributed as dist_io
from .progress import quiet


def run_data(cfg: RunConfig):
    """The data config a run reads: ONE img_size governs model and data, so ``model.img_size`` alone also
    sizes the images (``data.img_size``, when set, wins; both set and different is an error later). Data
    read at its own size (mazes: a model runs larger ones) is left as it is."""
    if dense_target(cfg.data.name):
        return cfg.data
    if cfg.data.img_size is None and getattr(cfg.model, "img_size", None) is not None:
        return replace(cfg.data, img_size=int(cfg.model.img_size))
    return cfg.data


def held_out_sets(cfg: RunConfig, fallback: bool = False):
    """(the run's held-out images, its test images), datasets read with the test transform as the run read its
    data: the held-out part of the training split (``data.holdout``), which the run never trained on. A run
    without one gives None, or with ``fallback`` the seeded calibration split of its training split (images
    it trained on: for uses that need no guarantee)."""
    train_set, test_set, _ = build_datasets(replace(run_data(cfg), holdout=0.0))  # the whole training split
    if cfg.data.holdout:
        return holdout_split(train_set, test_set, cfg.data.holdout), test_set
    return (calibration_split(train_set, test_set) if fallback else None), test_set


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


def build_loaders(cfg: RunConfig, epoch_seed: int = 0, env: dist_io.DistEnv = dist_io.SINGLE,
                  log: Optional[Callable[[str], object]] = None) -> Tuple[DataLoader, DataLoader, object]:
    """Train / test loaders. With several processes (``env``) each rank loads its shard of every
    global batch (``train.batch_size / world_size`` images) and of the test set."""
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

    full = train_loader.dataset.dataset  # build_datasets wraps the training split in a Subset
    val_set = holdout_split(full, test_loader.dataset, cfg.data.holdout)
    kw = dict(batch_size=test_loader.batch_size, shuffle=False, num_workers=cfg.data.num_workers,
              pin_memory=torch.cuda.is_available())
    sampler = dist_io.Shard(len(val_set), env.rank, env.world_size) if env.enabled else None
    return DataLoader(val_set, sampler=sampler, **kw)


def build_test_loader(cfg: RunConfig) -> Tuple[DataLoader, object]:
    """(test loader, data info) for the evaluation commands."""
    _, test_set, info = build_datasets(run_data(cfg), with_train=False)
    loader = DataLoader(test_set, batch_size=max(256, cfg.train.batch_size), shuffle=False,
                        num_workers=cfg.data.num_workers, pin_memory=torch.cuda.is_available())
    return loader, info


def set_epoch(loader: DataLoader, seed: int) -> None:
    """The shuffle of an epoch depends on ``seed`` only (and is the same with any number of processes)."""
    loader.generator.manual_seed(seed)
