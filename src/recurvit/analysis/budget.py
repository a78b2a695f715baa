"""Will it fit? Memory and time estimates made BEFORE long work starts.

A run whose estimate is far beyond the machine is refused with the estimate in one line (and the
setting that makes it), instead of allocating for minutes until the OS kills the process:

- :func:`check_train_memory`: parameters + gradients + AdamW moments (counted on the ``meta``
  device, before anything is allocated), then the activations a training step keeps, measured on
  the built model with one image at one and two steps and extrapolated to the batch and the
  deepest step count the run trains at.
- :func:`check_eval_cost`: seconds of an evaluation at ``steps`` (one batch timed at one and two
  steps, extrapolated) and the memory of the states it keeps.

``force=True`` skips the refusal (the estimate is still returned).
"""
from __future__ import annotations

import os
import time
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn

from ..errors import UserError
from .memory import saved_tensor_bytes

GiB = 1024 ** 3
MAX_EVAL_SECONDS = 24 * 3600  # an evaluation estimated to take longer than this is refused without --force
FIT = 0.9  # fraction of the free memory a run may plan to use
MAX_TRAIN_SECONDS = 6 * 3600  # a training whose first batches predict longer than this stops (train --force: goes on)


def free_memory(device: torch.device) -> int:
    """Bytes free for a new allocation: CUDA's free memory, else the OS's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def check_param_memory(build_meta: Callable[[], nn.Module], device: torch.device, what: str,
                       force: bool = False) -> int:
    """Bytes of parameters, gradients and two AdamW moments (4 x 4 bytes per parameter, fp32),
    counted on a ``meta`` build; UserError naming ``what`` (the sizes) when they cannot fit."""
    with torch.device("meta"):
        n = sum(p.numel() for p in build_meta().parameters())
    need = 16 * n
    free = free_memory(device)
    if need > FIT * free and not force:
        raise UserError(f"{what} has {n:,} parameters: training needs about {_gib(need)} for them, their gradients "
                        f"and AdamW's moments, but {_gib(free)} are free on {device}; make the model smaller")
    return need


def activation_bytes(model: nn.Module, input_shape: Tuple[int, int, int], steps: int, batch: int) -> int:
    """Bytes autograd keeps for one training step of ``batch`` images at ``steps`` steps,
    extrapolated from one image at one and two steps (linear in both)."""
    one = saved_tensor_bytes(model, 1, input_shape, steps=1)
    limit = model.core.limit
    if steps <= 1 or (limit is not None and limit < 2):
        return batch * one
    per_step = max(saved_tensor_bytes(model, 1, input_shape, steps=2) - one, 0)
    return batch * (one + (steps - 1) * per_step)


def check_train_memory(model: nn.Module, input_shape: Tuple[int, int, int], steps: int, batch: int,
                       device: torch.device, settings: str, force: bool = False) -> Dict[str, int]:
    """Parameters + optimizer state + activations of one training step; UserError when the sum is
    far beyond the free memory (``settings`` names what makes it, for the message)."""
    params = 16 * sum(p.numel() for p in model.parameters())
    acts = activation_bytes(model, input_shape, steps, batch)
    free = free_memory(device)
    if params + acts > FIT * free and not force:
        raise UserError(f"training needs about {_gib(params + acts)} ({_gib(acts)} of activations for {settings}; "
                        f"{_gib(params)} of parameters and optimizer state) but {_gib(free)} are free on {device}; "
                        "lower model.steps or train.batch_size, or set train.activation_checkpointing=true")
    return {"params": params, "activations": acts, "free": free}


def check_train_time(seconds_per_batch: float, batches_left: int, settings: str, force: bool = False) -> float:
    """Seconds the rest of a training takes at the pace of its first batches; UserError (the run stops) when
    that is beyond MAX_TRAIN_SECONDS, naming what makes a batch cost (``settings``)."""
    seconds = seconds_per_batch * batches_left
    if seconds > MAX_TRAIN_SECONDS and not force:
        raise UserError(f"stopped: the first batches took {seconds_per_batch:,.1f} s each, so the {batches_left:,} "
                        f"batches left would take about {seconds / 3600:,.1f} h here ({settings}); make a batch "
                        "cheaper (data.img_size, a larger model.patch_size, train.batch_size) or start with --force")
    return seconds


def first_batches_guard(per_epoch: int, batches: int, settings: str) -> Callable[[int, float], None]:
    """``after_batch(i, seconds so far)`` for a training's first epoch: the pace of its second batch (the
    first one also warms up; the first when an epoch has one) times the ``batches`` left, checked by
    :func:`check_train_time`."""
    first: Dict[str, float] = {}

    def after(i: int, seconds: float) -> None:
        if i == 1:
            first["s"] = seconds
        if i == min(2, per_epoch):
            check_train_time(seconds - first["s"] if i == 2 else seconds, batches - i, settings)
    return after


@torch.no_grad()
def check_eval_cost(model: nn.Module, x: torch.Tensor, steps: int, batches: int, keeps_states: bool = False,
                    force: bool = False, setting: str = "--steps") -> Dict[str, float]:
    """Seconds of evaluating ``batches`` batches like ``x`` at ``steps`` steps, from one batch timed
    at one and two steps; memory of the states kept when ``keeps_states`` (an ODE solve keeps every
    grid state; a per-step sweep keeps per-step figures only). UserError when far beyond the machine
    (``setting``: what the user set to get ``steps``, for the message)."""
    model.eval()

    def timed(k: int) -> float:
        t0 = time.perf_counter()
        model(x, steps=k)
        return time.perf_counter() - t0

    limit = model.core.limit
    t1 = timed(1)
    t2 = timed(2) if limit is None or limit >= 2 else t1
    per_step = max(t2 - t1, t1 / 4)  # the overhead split is noisy: never below a quarter of a step
    seconds = batches * (t1 + (steps - 1) * per_step)
    z = model.embed(x)
    states = (z.numel() * z.element_size() * steps) if keeps_states else 0
    free = free_memory(x.device)
    if not force:
        if seconds > MAX_EVAL_SECONDS:
            raise UserError(f"{setting} {steps:,} would take about {seconds / 3600:,.0f} h here ({batches} batches; "
                            f"about {per_step * 1e3:.2f} ms per step and batch); choose fewer steps, or --force")
        if states > FIT * free:
            raise UserError(f"{setting} {steps:,} keeps about {_gib(states)} of states per batch but {_gib(free)} are "
                            "free; choose fewer steps, or --force")
    return {"seconds": seconds, "state_bytes": states}


@torch.no_grad()
def check_applications_cost(run: Callable[[], object], applications: int, total_applications: int, batches: int,
                            setting: str, force: bool = False) -> float:
    """:func:`check_eval_cost` for a model whose cost is its block applications (a LoopVAE): ``run()``
    (one batch at ``applications`` applications) is timed, and ``batches`` batches of
    ``total_applications`` in all are priced from it; UserError naming ``setting`` when far beyond."""
    t0 = time.perf_counter()
    run()
    per_app = (time.perf_counter() - t0) / max(applications, 1)
    seconds = batches * total_applications * per_app
    if seconds > MAX_EVAL_SECONDS and not force:
        raise UserError(f"{setting} would take about {seconds / 3600:,.0f} h here ({batches} batches, "
                        f"{total_applications:,} block applications each); choose fewer, or --force")
    return seconds


def check_loader_cost(model: nn.Module, loader, device: torch.device, steps: int, batches: int,
                      force: bool = False) -> Dict[str, float]:
    """:func:`check_eval_cost` of ``batches`` batches of ``loader`` (one of them timed) at ``steps`` steps."""
    return check_eval_cost(model, next(iter(loader))[0].to(device), steps, batches,
                           keeps_states=model.core.keeps_states, force=force)


def check_images_cost(model: nn.Module, images: int, batch_size: int, steps: int, force: bool = False,
                      side: Optional[int] = None) -> Dict[str, float]:
    """:func:`check_eval_cost` for ``images`` images of the model's own input size, or of ``side`` pixels (a
    dense model's largest input: mazes of any size), no loader at hand."""
    c, device = model.cfg, next(model.parameters()).device
    side = side or c.img_size
    x = torch.zeros(max(1, min(images, batch_size)), c.in_chans, side, side, device=device)
    return check_eval_cost(model, x, steps, -(-images // batch_size), keeps_states=model.core.keeps_states,
                           force=force)


def check_account_cost(model: nn.Module, device: torch.device, batch: int, steps: Optional[int] = None,
                       memory: bool = True, force: bool = False) -> None:
    """The accounting of ``model`` priced first (``force`` skips the refusal): a forward and a backward pass at
    the steps it runs (``steps=1000000000000`` would run for days), and, with ``memory``, the training memory
    of a batch of ``batch`` images."""
    c = model.cfg
    shape = (c.in_chans, c.img_size, c.img_size)
    k = steps or model.nominal_steps
    check_eval_cost(model, torch.zeros(1, *shape, device=device), k, 3, force=force,
                    setting="--steps" if steps else "steps")
    if memory:
        check_train_memory(model, shape, k, batch, device, f"--batch-size {batch:,} at {k:,} steps", force=force)
