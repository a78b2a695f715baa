"""The batch loop of the one training loop: every task's epoch is :func:`train_epoch` over its loader.

The loop owns, for every task alike: train mode, the progress bar, the autocast policy (``train.amp``;
the task's ``train_step`` enters it around its forward), the optimizer step with gradient clipping and
the per-iteration schedule, the sums of the figures (all-reduced across ranks under DDP, so every rank sees
the global figures of each step), the divergence check, timm's ``train.log_every`` lines and the guard of
the first batches. A task supplies one step, ``train_step(batch, amp) -> Step``: the loss to minimise and
the figures of the batch; ``epoch_metrics(totals, seconds)`` turns an epoch's sums into its metrics line
and ``progress(totals)`` the few figures the bar and the log lines show.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
from tqdm.auto import tqdm

from ..run import distributed as dist_io
from ..run.device import autocast
from ..run.progress import bar_options
from .checks import Diverged
from .optim import optimizer_step


@dataclass
class Step:
    """What one training step of a task gives the loop.

    ``means``: per-image means over the batch (``loss`` first: the value the divergence check reads), each a
    number or a tensor of any shape (one figure an element); summed weighted by ``n``. ``counts``: totals over
    the batch (correct answers, pixels), summed as they are. ``after``: run after the optimizer step; the
    means it returns join the step's (a discriminator's own step, which needs the generator's update first).
    """

    loss: torch.Tensor
    n: int
    means: Dict[str, Any]
    counts: Dict[str, Any] = field(default_factory=dict)
    after: Optional[Callable[[], Dict[str, float]]] = None


def _values(v) -> List[float]:
    return v.detach().reshape(-1).tolist() if torch.is_tensor(v) else list(v) if isinstance(v, (list, tuple)) else [v]


class Totals:
    """The running sums of an epoch: ``n`` images; :meth:`mean` and :meth:`total` of a figure."""

    def __init__(self):
        self.n = 0
        self.sums: Dict[str, List[float]] = {}
        self.seen: Dict[str, List[float]] = {}  # images behind each element of a mean (a readout some steps lack)

    def _add(self, key: str, values: List[float], weight, images: int) -> None:
        """Sum ``values`` (times ``weight`` unless None); ``images``: the step's images behind them."""
        sums, seen = self.sums.setdefault(key, []), self.seen.setdefault(key, [])
        for j, v in enumerate(values):
            if j == len(sums):
                sums.append(0.0 if weight is not None else 0)
                seen.append(0)
            sums[j] += v * weight if weight is not None else v
            seen[j] += images

    def add(self, step: Step, env: dist_io.DistEnv, device: torch.device) -> float:
        """The step's figures (under several processes their sums over the ranks, one collective); returns the
        step's mean loss over every rank's images, what the divergence check reads."""
        means = {k: _values(v) for k, v in step.means.items()}
        counts = {k: _values(v) for k, v in step.counts.items()}
        if not env.enabled:
            for k, vs in means.items():
                self._add(k, vs, step.n, step.n)
            for k, vs in counts.items():
                self._add(k, vs, None, step.n)
            self.n += step.n
            return means["loss"][0]
        flat = [x * step.n for vs in means.values() for x in vs] + [x for vs in counts.values() for x in vs]
        *flat, n = env.all_reduce_sum(flat + [step.n], device)
        n = int(round(n))
        loss = flat[0] / max(n, 1)
        for k, vs in [*means.items(), *counts.items()]:  # the means come back weighted: summed as they are
            self._add(k, flat[:len(vs)], None, n)
            flat = flat[len(vs):]
        self.n += n
        return loss

    def add_means(self, means: Dict[str, float], n: int) -> None:
        for k, v in means.items():
            self._add(k, _values(v), n, n)

    def mean(self, key: str, default: float = 0.0) -> float:
        """The epoch's mean of a scalar figure over every image (0 for a figure no step gave)."""
        return self.sums[key][0] / max(self.n, 1) if key in self.sums else default

    def means(self, key: str) -> List[float]:
        """Each element's mean over the images whose steps gave it."""
        return [s / max(k, 1) for s, k in zip(self.sums.get(key, []), self.seen.get(key, []))]

    def total(self, key: str) -> float:
        return self.sums[key][0] if key in self.sums else 0


def train_epoch(task, epoch: int, env: dist_io.DistEnv, log: Optional[Callable] = None) -> Dict[str, Any]:
    """One pass over ``task.train_loader``: the task's metrics of the epoch (``task.epoch_metrics``)."""
    model, tc, device = task.model, task.cfg.train, task.device
    model.train()
    guard = task.batch_guard(epoch)
    totals, t0 = Totals(), time.perf_counter()

    def amp():
        return autocast(device, tc.amp)

    loader = task.train_loader
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{tc.epochs}", leave=False, **bar_options(tc.progress and env.is_main))
    for i, batch in enumerate(bar, 1):
        step = task.train_step(batch, amp)
        loss = totals.add(step, env, device)  # every rank sees the same: a divergence stops all of them
        if not math.isfinite(loss):
            raise Diverged(loss, epoch + 1, tc)
        optimizer_step(model, task.opt, task.sched, step.loss, tc.grad_clip)
        if step.after is not None:
            totals.add_means(step.after(), step.n)
        if guard is not None and i <= 2:  # a new run's first batches: stop early if the whole run cannot fit
            guard(i, time.perf_counter() - t0)
        figures = task.progress(totals)
        secs = time.perf_counter() - t0
        bar.set_postfix(**figures, img_s=f"{totals.n / secs:.0f}")
        if tc.log_every and i % tc.log_every == 0 and env.is_main and log is not None:  # timm's cluster-log lines
            shown = "  ".join(f"{k} {v}" for k, v in figures.items())
            log(f"Train: {epoch + 1} [{i:>{len(str(len(loader)))}}/{len(loader)} ({100 * i / len(loader):.0f}%)]  "
                f"{shown}  lr {task.sched.get_last_lr()[0]:.3g}  {totals.n / secs:.0f} img/s")
    return task.epoch_metrics(totals, time.perf_counter() - t0)
