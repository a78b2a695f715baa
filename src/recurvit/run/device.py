"""Where a run computes: the device of ``train.device`` / ``--device``, bf16 autocast, and the seeds."""
from __future__ import annotations

import random
from contextlib import nullcontext

import torch

from ..config import AMP_MODES
from ..errors import UserError


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
