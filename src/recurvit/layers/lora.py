"""Low-rank adapters (LoRA) for nn.Linear, with one adapter per recursion step ("step-LoRA").

    y = W x + b + (alpha / r) * B_i A_i x          A_i: (r, in), B_i: (out, r), B_i = 0 at init

``LoRALinear`` IS an ``nn.Linear`` (a subclass): the frozen base weight keeps its key
(``attn.qkv.weight``), the adapters add ``lora_A`` (n, r, in) and ``lora_B`` (n, out, r). With
n = 1 (``lora``) the adapter is shared by every call of the layer; with n = T (``step_lora``) call
i of the shared block uses adapter ``selector.index`` -- a step-dependent computation for
n * r * (in + out) extra parameters per layer.

Which adapter a call uses is an argument: the core tells the shared block which step it runs
(``block(z, step=k)``, layers/block.py), the block passes the step to its attention and MLP, and they
to their layers (:func:`linear`); adapter ``index = min(step - 1, n - 1)``: past the trained steps the
last adapter is reused (as the step conditioning does), and a call without a step uses adapter 0. No
module holds the step between calls, so a recomputation under activation checkpointing, which repeats the
call with its arguments, uses the same adapter.

Merging: ``merge_lora(model)`` folds W + (alpha / r) B A into plain nn.Linear layers (same
state_dict keys as the original model) -- exact for n = 1. With n > 1 one shared weight cannot
hold T different updates; ``unroll_step_lora`` instead builds T merged copies of the block (a
stack ViT with T blocks: same logits, T x the block parameters; ``recurvit.tasks.finetune``).
"""
from __future__ import annotations

import math
from typing import Iterable, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

LORA_TARGETS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def linear(layer: nn.Linear, x: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
    """``layer(x)``, told the block's step where the layer has per-step adapters."""
    return layer(x, step) if isinstance(layer, LoRALinear) else layer(x)


class LoRALinear(nn.Linear):
    """nn.Linear + ``num_adapters`` low-rank adapters; B starts at zero so outputs start unchanged."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, rank: int = 4,
                 alpha: Optional[float] = None, num_adapters: int = 1, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        if num_adapters < 1:
            raise ValueError(f"num_adapters must be >= 1, got {num_adapters}")
        self.rank = int(rank)
        self.alpha = float(alpha if alpha is not None else rank)
        self.scaling = self.alpha / self.rank
        self.num_adapters = int(num_adapters)
        fk = dict(device=device, dtype=dtype)
        self.lora_A = nn.Parameter(torch.empty(num_adapters, rank, in_features, **fk))  # (n, r, in)
        self.lora_B = nn.Parameter(torch.zeros(num_adapters, out_features, rank, **fk))  # (n, out, r)
        self.reset_lora()

    def reset_lora(self) -> None:
        for i in range(self.num_adapters):  # A as nn.Linear's default init (kaiming uniform), B = 0
            nn.init.kaiming_uniform_(self.lora_A.data[i], a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    @classmethod
    def from_linear(cls, base: nn.Linear, rank: int, alpha: Optional[float] = None,
                    num_adapters: int = 1) -> "LoRALinear":
        m = cls(base.in_features, base.out_features, base.bias is not None, rank, alpha, num_adapters,
                device=base.weight.device, dtype=base.weight.dtype)
        with torch.no_grad():
            m.weight.copy_(base.weight)
            if base.bias is not None:
                m.bias.copy_(base.bias)
        m.weight.requires_grad_(base.weight.requires_grad)
        if base.bias is not None:
            m.bias.requires_grad_(base.bias.requires_grad)
        return m

    def delta(self, i: int) -> torch.Tensor:
        """The weight update of adapter i: (alpha / r) B_i A_i, shape (out, in)."""
        return self.scaling * (self.lora_B[i] @ self.lora_A[i])

    def index(self, step: Optional[int] = None) -> int:
        """The adapter a call at ``step`` (1-based; None: the first) uses."""
        return 0 if step is None else min(max(int(step) - 1, 0), self.num_adapters - 1)

    def forward(self, x: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
        i = self.index(step)
        y = F.linear(x, self.weight, self.bias)
        return y + self.scaling * F.linear(F.linear(x, self.lora_A[i]), self.lora_B[i])

    def merged(self, i: int = 0) -> nn.Linear:
        """A plain nn.Linear computing this layer with adapter i folded into the weight."""
        m = nn.Linear(self.in_features, self.out_features, self.bias is not None,
                      device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            m.weight.copy_(self.weight + self.delta(i).to(self.weight.dtype))
            if self.bias is not None:
                m.bias.copy_(self.bias)
        return m

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha:g}, adapters={self.num_adapters}"


# ------------------------------------------------------------------------------ model surgery
def _get(root: nn.Module, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def _set(root: nn.Module, dotted: str, module: nn.Module) -> None:
    parent, _, name = dotted.rpartition(".")
    setattr(_get(root, parent) if parent else root, name, module)


def add_lora(blocks: Iterable[nn.Module], rank: int, alpha: Optional[float] = None, num_adapters: int = 1,
             targets: Iterable[str] = LORA_TARGETS) -> List["LoRALinear"]:
    """Replace the target nn.Linear layers of every block by LoRALinear (in place); returns them."""
    added = []
    for block in blocks:
        for name in targets:
            base = _get(block, name)
            if isinstance(base, LoRALinear):
                raise ValueError(f"{name} already has LoRA adapters")
            if not isinstance(base, nn.Linear):
                raise ValueError(f"{name} is a {type(base).__name__}, not nn.Linear")
            added.append(LoRALinear.from_linear(base, rank, alpha, num_adapters))
            _set(block, name, added[-1])
    return added


def lora_layers(model: nn.Module) -> List[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def lora_parameters(model: nn.Module) -> List[nn.Parameter]:
    return [p for m in lora_layers(model) for p in (m.lora_A, m.lora_B)]


def merge_lora(model: nn.Module, index: Optional[int] = None) -> nn.Module:
    """Fold the adapter into every LoRALinear of ``model`` (in place): plain nn.Linear layers with
    the original state_dict keys. Step adapters (n > 1) cannot be folded into ONE shared weight:
    that raises unless ``index`` picks the adapter to fold (see ``unroll_step_lora``)."""
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            if index is None and m.num_adapters > 1:
                raise ValueError(f"{name} has {m.num_adapters} step adapters: one shared weight cannot hold "
                                 "them all; unroll into per-step copies (recurvit.models.adapters.unroll_step_lora)")
            _set(model, name, m.merged(0 if index is None else index))
    return model
