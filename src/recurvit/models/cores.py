"""How depth is executed. A core turns embedded tokens into a sequence of states.

Every core holds only its OWN parameters (step conditioning, routers); the blocks live on the
model (``model.blocks``) and are passed in, so a bViT, its ODE twin and its SoftMoR twin share
state_dict keys. ``core.states(blocks, z, steps)`` yields the state after each step: one pass
of ``steps`` block applications gives every intermediate readout.

Because every core drives ``model.blocks`` and only calls them, two speed/memory tools act on
the blocks and so serve every core (stack, recurrent, ODE, SoftMoR) alike:

- :func:`set_activation_checkpointing`: each block application keeps only its input for the
  backward pass and is recomputed there (``torch.utils.checkpoint``, non-reentrant), so training
  memory grows by one state per step instead of all of a block's activations.
- :func:`compile_blocks`: ``torch.compile`` of each block MODULE (regional compilation), not of
  the forward with its python loop over steps. The shared block of a recurrent core is compiled
  once and reused at every step, the L blocks of a stack share one compiled graph (same code,
  parameters as graph inputs), and the step count is never seen by the compiler: training at T
  and evaluating at 2T runs the same graph without recompiling (tests/test_speed_features.py).
  Recompiles happen only for what changes the block's own graph: train vs eval mode (dropout)
  and grad vs no-grad, and once when a batch dimension first changes (then marked dynamic).
"""
from __future__ import annotations

from contextlib import nullcontext
import shutil
import types
from typing import Any, Iterator, Optional

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ..layers.step_cond import StepConditioning


class Core(nn.Module):
    """Base: ``nominal_steps`` is the trained depth, ``max_steps`` the most a core can run (None: any)."""

    kind = "base"
    recurrent = False

    def __init__(self, nominal_steps: int):
        super().__init__()
        self.nominal_steps = nominal_steps
        self.nfe = 0  # block evaluations in the last forward pass

    @property
    def max_steps(self) -> Optional[int]:
        return None

    def check_steps(self, steps: Optional[int]) -> int:
        steps = self.nominal_steps if steps is None else int(steps)
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if self.max_steps is not None and steps > self.max_steps:
            raise ValueError(f"this {self.kind} model has {self.max_steps} blocks; steps must be <= {self.max_steps}, got {steps}")
        return steps

    def states(self, blocks: nn.ModuleList, z: torch.Tensor, steps: int,
               grad_last: Optional[int] = None) -> Iterator[torch.Tensor]:
        raise NotImplementedError


class Stack(Core):
    """L independent blocks; the state after block l is step l. Runs at most L steps."""

    kind = "stack"

    def __init__(self, depth: int):
        super().__init__(depth)

    @property
    def max_steps(self) -> int:
        return self.nominal_steps

    def states(self, blocks, z, steps, grad_last=None):
        self.nfe = 0
        for i in range(steps):
            with _grad_ctx(i, steps, grad_last):
                z = blocks[i](z)
            self.nfe += 1
            yield z


class Recurrent(Core):
    """One block applied T times: z_{t+1} = F_t(z_t) (see layers/step_cond.py for F_t)."""

    kind = "recurrent"
    recurrent = True

    def __init__(self, steps: int, dim: int, step_cond: str = "none", reinject: bool = False):
        super().__init__(steps)
        self.cond = StepConditioning(step_cond, steps, dim, reinject)

    def states(self, blocks, z, steps, grad_last=None):
        self.nfe = 0
        block, x0 = blocks[0], z
        for t in range(steps):
            with _grad_ctx(t, steps, grad_last):
                z = self.cond(block, z, t, x0)
            self.nfe += 1
            yield z


def _grad_ctx(t: int, steps: int, grad_last: Optional[int]):
    """Truncated backpropagation: only the last ``grad_last`` steps record a graph."""
    if grad_last is None or grad_last <= 0 or t >= steps - grad_last:
        return nullcontext()
    return torch.no_grad()


CORES = ("stack", "recurrent", "ode", "softmor")


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
