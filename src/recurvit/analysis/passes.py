"""One pass of a model on a random batch, without side effects: shared by the FLOP counts
(accounting.py) and the memory measurements (memory.py)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

InputShape = Tuple[int, int, int]  # (C, H, W) of one image


def model_device_dtype(model: nn.Module) -> Tuple[torch.device, torch.dtype]:
    for p in model.parameters():
        if p.is_floating_point():
            return p.device, p.dtype
    return torch.device("cpu"), torch.float32


def run_forward(model: nn.Module, x: torch.Tensor, steps: Optional[int]) -> torch.Tensor:
    return model(x) if steps is None else model(x, steps=steps)


def probe_loss(out: torch.Tensor) -> torch.Tensor:
    """Cross entropy for logits (B, classes); a mean square for any other output."""
    if out.dim() == 2:
        return F.cross_entropy(out.float(), torch.zeros(out.shape[0], dtype=torch.long, device=out.device))
    return out.float().square().mean()


def backward_into_params(model: nn.Module, loss: torch.Tensor) -> None:
    """Backward into every trainable parameter without touching ``.grad`` (no side effects)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if params and loss.requires_grad:
        torch.autograd.grad(loss, params, allow_unused=True)


@contextmanager
def in_mode(model: nn.Module, training: bool) -> Iterator[None]:
    was = model.training
    model.train(training)
    try:
        yield
    finally:
        model.train(was)
