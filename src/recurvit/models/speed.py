"""Speed and memory tools that act on ``model.blocks`` and so serve every core alike.

Every core drives ``model.blocks`` and only calls them, so these serve stack, recurrent, ODE
and SoftMoR cores without knowing which one runs:

- :func:`set_activation_checkpointing`: each block application keeps only its input for the
  backward pass and is recomputed there (``torch.utils.checkpoint``, non-reentrant), so training
  memory grows by one state per step instead of all of a block's activations.
- :func:`compile_blocks`: ``torch.compile`` of each block MODULE (regional compilation), not of
  the forward with its python loop over steps. The shared block of a recurrent core is compiled
  once and reused at every step, the L blocks of a stack share one compiled graph (same code,
  parameters as graph inputs), and the step count is never seen by the compiler: training at T
  and evaluating at 2T runs the same graph without recompiling (tests/models/test_speed.py).
  Recompiles happen only for what changes the block's own graph: train vs eval mode (dropout)
  and grad vs no-grad, and once when a batch dimension first changes (then marked dynamic).
"""
from __future__ import annotations

import shutil
import types
from typing import Any, Optional

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


# ------------------------------------------------------------------ activation checkpointing
def _blocks(model: nn.Module, what: str) -> nn.Module:
    """``model.blocks``: our ModuleList, or a timm-style nn.Sequential of blocks."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise TypeError(f"{type(model).__name__} has no `blocks` (ModuleList or Sequential) to {what}")
    return blocks


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A block's forward that keeps only its inputs for backward and recomputes the rest there.
    Without autograd (evaluation, truncated steps under no_grad) it is the plain forward."""
    forward = type(self).forward
    if not torch.is_grad_enabled():
        return forward(self, *args, **kwargs)
    # non-reentrant: works with DDP, torch.compile, autocast and any number of uses of one block;
    # the RNG state is restored for the recomputation, so dropout / drop-path masks repeat exactly
    return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)


def set_activation_checkpointing(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Recompute every block application of ``model.blocks`` in the backward pass (or stop doing so).

    Memory of a training step then holds one block input per step (the states, which the
    recurrence keeps anyway) plus the activations of ONE block during its recomputation, instead
    of every block's activations for every step; the price is a second forward of each block in
    backward (about +1/3 of a training step). Gradients are unchanged. The model's state_dict,
    its outputs and evaluation are unaffected. Returns ``model``.
    """
    blocks = _blocks(model, "checkpoint")
    for block in blocks:
        if enabled:
            block.forward = types.MethodType(_checkpointed_forward, block)
        elif "forward" in block.__dict__:
            del block.forward
    return model


def activation_checkpointing(model: nn.Module) -> bool:
    """Whether :func:`set_activation_checkpointing` is on for ``model``."""
    blocks = getattr(model, "blocks", None) or []
    return any(getattr(b.__dict__.get("forward"), "__func__", None) is _checkpointed_forward for b in blocks)


# ------------------------------------------------------------------------------ compilation
def compile_available(device: torch.device | str = "cpu", backend: str = "inductor") -> Optional[str]:
    """None if ``torch.compile(backend=backend)`` can run on ``device``, else the reason it cannot."""
    if not hasattr(torch, "compile"):
        return "this PyTorch has no torch.compile"
    if backend != "inductor" or torch.device(device).type != "cpu":
        return None
    from torch._inductor import config as inductor_config

    cxx = getattr(getattr(inductor_config, "cpp", None), "cxx", (None, "g++"))
    names = [c for c in (cxx if isinstance(cxx, (tuple, list)) else (cxx,)) if c]
    if not any(shutil.which(c) for c in names + ["g++", "c++", "clang++"]):
        return "torch.compile (inductor) needs a C++ compiler on CPU and none was found (install g++)"
    return None


def compile_blocks(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """``torch.compile`` each of ``model.blocks`` in place (``nn.Module.compile``); returns ``model``.

    The python loop over steps stays eager, so the compiled graph is independent of the number of
    steps: the shared block of a recurrent model is compiled once and reused at every step and at
    any horizon. State_dict keys are unchanged (no ``_orig_mod.`` prefix). ``compile_kwargs``
    go to ``torch.compile`` (e.g. ``backend``, ``mode``).
    """
    blocks = _blocks(model, "compile")
    for block in blocks:
        block.compile(**compile_kwargs)
    return model
