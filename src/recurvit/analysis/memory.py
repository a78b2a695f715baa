"""Training memory of a model: what autograd saves (any device) or the CUDA allocator's peak.

See :func:`peak_train_memory`. Shares the conventions of :mod:`recurvit.analysis.accounting`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from .passes import InputShape, backward_into_params, in_mode, model_device_dtype, probe_loss, run_forward


def saved_tensor_bytes(model: nn.Module, batch: int, input_shape: InputShape,
                       steps: Optional[int] = None) -> int:
    """Bytes of the tensors autograd saves for the backward pass of one training forward.

    Every tensor packed by autograd is recorded through ``torch.autograd.graph.saved_tensors_hooks``;
    tensors sharing a storage (views: q, k, v of one qkv output) are counted once with the full
    storage size; parameters, buffers and the input batch are excluded. This is the activation
    memory that a training step holds at the end of its forward pass, where it peaks; it leaves
    out short-lived temporaries and the parameter gradients. Under non-reentrant activation
    checkpointing only each region's saved input is seen, which is what it keeps. Works on any
    device.
    """
    device, dtype = model_device_dtype(model)
    x = torch.randn(batch, *input_shape, device=device, dtype=dtype)
    excluded = {_storage_key_ptr(t) for t in [*model.parameters(), *model.buffers(), x]}
    storages: Dict[Tuple[str, int], int] = {}
    keep: List[torch.Tensor] = []  # holds the saved tensors so their addresses are not reused

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key_ptr(t)
        if key is not None and key not in excluded and key not in storages:
            storages[key] = t.untyped_storage().nbytes()
            keep.append(t)
        return t

    with in_mode(model, True), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_forward(model, x, steps)
    del out
    return sum(storages.values())


def _storage_key_ptr(t: torch.Tensor) -> Optional[Tuple[str, int]]:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return (str(t.device), ptr) if ptr else None


def peak_train_memory(model: nn.Module, batch: int, input_shape: InputShape,
                      device: Union[str, torch.device] = "cpu", steps: Optional[int] = None) -> int:
    """Peak activation memory in bytes of one training step (forward + backward) at batch ``batch``.

    The model is moved to ``device`` (in place, as ``nn.Module.to`` does).

    - CUDA: ``torch.cuda.max_memory_allocated`` during the step minus the memory allocated before
      it (model and input batch): activations saved for backward, temporaries and workspaces,
      and the parameter gradients as they are produced.
    - Other devices: :func:`saved_tensor_bytes`, the bytes autograd holds for the backward pass
      at the end of the forward (activations only; no temporaries, no gradients).
    """
    device = torch.device(device)
    model.to(device)
    if device.type != "cuda":
        return saved_tensor_bytes(model, batch, input_shape, steps)
    _, dtype = model_device_dtype(model)
    x = torch.randn(batch, *input_shape, device=device, dtype=dtype)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with in_mode(model, True):
        backward_into_params(model, probe_loss(run_forward(model, x, steps)))
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


