"""Adapters on a model: LoRA (one adapter per layer) and step-LoRA (one per step of a shared block).

The layers themselves are :mod:`recurvit.layers.lora`; this module decides where they go on a
model, rebuilds them from the ``adapter`` entry a checkpoint stores (``adapter_spec`` /
``attach_adapters``), merges single adapters back into plain weights (``plain_state``) and unrolls
per-step adapters of a plain recurrence into the equivalent stack (``unroll_step_lora``).
"""
from __future__ import annotations

import copy
from dataclasses import asdict
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from ..layers.lora import LORA_TARGETS, LoRALinear, add_lora, lora_layers, merge_lora
from .vit import ViTConfig, VisionTransformer


def adapter_spec(model: nn.Module, method: str, rank: int, alpha: Optional[float] = None,
                 targets=LORA_TARGETS) -> Dict[str, Any]:
    """What ``attach_adapters`` needs to rebuild a model's adapters (stored in checkpoints)."""
    alpha = float(rank if alpha is None else alpha)
    spec = {"method": method, "rank": int(rank), "alpha": alpha, "targets": list(targets),
            "num_adapters": 1, "calls_per_step": 1}
    if method == "step_lora":
        spec["num_adapters"] = int(model.nominal_steps)
        spec["calls_per_step"] = step_lora_calls_per_step(model)
    return spec


def step_lora_calls_per_step(model: nn.Module) -> int:
    """Shared-block calls per step, or a ValueError when per-step adapters are not defined."""
    cfg = model.cfg
    n = cfg.core_cls.calls_per_step(cfg)
    if n is None:
        raise ValueError(f"step_lora needs ONE shared block called a fixed number of times per step (a recurrent "
                        f"core, or an ODE core with a fixed-step method); this model is {cfg.core_cls.describe(cfg)}: "
                        "use --method lora, which adapts every block")
    return n


def attach_adapters(model: nn.Module, spec: Dict[str, Any]) -> List[LoRALinear]:
    """Add LoRA adapters to ``model`` as described by ``spec`` (in place), zero-initialised B; with per-step
    adapters (num_adapters > 1) to the shared block only, whose calls are told their step by the core."""
    n = int(spec.get("num_adapters", 1))
    blocks = [model.blocks[0]] if n > 1 else list(model.blocks)
    added = add_lora(blocks, int(spec["rank"]), spec.get("alpha"), n, spec.get("targets", LORA_TARGETS))
    model.adapter_spec = dict(spec)
    return added


def unroll_step_lora(model: nn.Module) -> Optional[nn.Module]:
    """A step_lora bViT as the equivalent stack ViT: block k = shared block with adapter k merged.

    Only where the core is unrollable (a plain recurrence: no step conditioning, no re-injection):
    there z_{k+1} = F_k(z_k) is exactly a stack of T different blocks. Returns None otherwise;
    the stack's config is ``stack.cfg`` (core "stack", depth = steps = T)."""
    if not model.cfg.core_cls.unrollable(model.cfg):
        return None
    T = model.nominal_steps
    cfg = ViTConfig.build(asdict(model.cfg), dict(core="stack", depth=T, steps=T, options=None))
    stack = VisionTransformer(cfg)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.")}
    for k in range(T):
        block = copy.deepcopy(model.blocks[0])
        merge_lora(block, index=k)
        state.update({f"blocks.{k}.{name}": v for name, v in block.state_dict().items()})
    stack.load_state_dict(state, strict=True)
    return stack.eval()


def plain_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """state_dict with single adapters merged (lora), else the model's own (no-op for full/head)."""
    layers = lora_layers(model)
    if not layers or any(m.num_adapters > 1 for m in layers):
        return model.state_dict()
    merged = merge_lora(copy.deepcopy(model))
    return merged.state_dict()
