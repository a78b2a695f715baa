"""timm's model contract on recurvit's VisionTransformer, for every depth core.

timm code (its optimizer factory, feature wrappers, training and fine-tuning scripts) calls these
on any model; they mean here what they mean on timm's ``VisionTransformer``, with one change of
unit: timm counts BLOCKS, we count STEPS. A step is what the core yields (``iter_states``): for a
stack the output of block l (so a stack is exactly timm's ViT), for a recurrent core the state after
the k-th application of the ONE shared block, for an ODE core the state at grid time t_k = k h,
for SoftMoR the mixture after a unit (``inplace``) or a cycle (``cycle``).

- ``forward_intermediates(x, indices, ...)``: the states after the chosen steps (``indices`` as in
  timm: an int n takes the last n steps, a list the given 0-based steps, negative from the end);
  ``steps=K`` (keyword) runs K steps, beyond the trained depth too, and indexes into those K.
- ``feature_info``: one entry per step (``num_chs`` = D, ``reduction`` = patch size, ``step``).
  Its ``module`` is ``blocks.{l}`` for a stack; for a core that shares blocks no single module
  call produces a step's state (one block makes them all), so it reads ``core``: feature
  extraction by forward hooks cannot work there, which is why the timm presets use timm's
  ``getter`` feature class (FeatureGetterNet over ``forward_intermediates``), as timm's ViT does.
- ``prune_intermediate_layers(indices)``: the model then runs only up to the last step asked for;
  blocks no remaining step applies (a stack's or a SoftMoR ``inplace`` model's later blocks) are
  replaced by ``nn.Identity`` so their parameters go, and the step limit becomes the kept steps.
- ``group_matcher``: timm's ViT grouping (stem; ``blocks.{l}`` one group each, ``norm`` with the
  last; head and fc_norm on top). Layer-wise lr decay (``create_optimizer_v2(model, "adamw",
  layer_decay=0.75)``) thus gives a stack timm's L + 2 layers. A recurrent or ODE model stores ONE
  block and applies it at every depth, so its weights have no single depth to decay by: the decay
  sees three layers, stem (d^2), the shared block (d) and head (1), as for a one-block ViT. The
  core's own parameters (step conditioning, time embedding, SoftMoR routers) serve every step and
  go with the last block group.
- ``reset_classifier(n, global_pool=None)``: new heads with n outputs, stage heads included;
  n = 0 removes them (``nn.Identity``; pooled features of ``head_hidden_size`` come out), and
  ``global_pool=""`` turns pooling off (tokens come out). ``set_grad_checkpointing`` is
  ``speed.set_activation_checkpointing`` (outputs and gradients unchanged).

Nothing here imports timm: the contract holds whether or not timm is installed.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .speed import set_activation_checkpointing

POOLS = ("", "token", "avg")  # global_pool: "" = none (tokens), token = [CLS], avg = mean of patch tokens
OUTPUT_FMTS = ("NCHW", "NLC")
_MATCH_PREV_GROUP = (99999,)  # timm's group_matcher suffix: "same group as the one before"


def take_indices(num: int, indices: Optional[Union[int, Sequence[int]]] = None) -> Tuple[List[int], int]:
    """timm's ``feature_take_indices``: (0-based indices to take, the largest) of ``num`` features.
    None: all; an int n: the last n; a sequence: those (negative ones count from the end)."""
    if indices is None:
        indices = num
    if isinstance(indices, int):
        if not 0 < indices <= num:
            raise ValueError(f"last-n ({indices}) is out of range (1 to {num})")
        take = list(range(num - indices, num))
    else:
        take = []
        for i in indices:
            idx = num + i if i < 0 else i
            if not 0 <= idx < num:
                raise ValueError(f"feature index {idx} is out of range (0 to {num - 1})")
            take.append(idx)
        if not take:
            raise ValueError("indices is empty")
    return take, max(take)


class TimmContract:
    """Mixed into ``VisionTransformer`` (vit.py), which provides embed / iter_states / norm / heads."""

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """New head (and stage heads) with ``num_classes`` outputs; 0 removes them. ``global_pool``:
        "token", "avg" or "" (no pooling); the norm placement chosen at construction stays."""
        if global_pool is not None:
            if global_pool not in POOLS:
                raise ValueError(f"global_pool must be one of {POOLS}, got {global_pool!r}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs the class token")
            self.global_pool = global_pool
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        self.num_classes = num_classes
        self.cfg = dataclasses.replace(self.cfg, num_classes=num_classes)  # cfg keeps describing the model
        self._build_heads(num_classes)
        for head in [self.head, *(self.stage_heads or [])]:
            if isinstance(head, nn.Linear):  # the model's init (vit.py)
                nn.init.trunc_normal_(head.weight, std=0.02)
                nn.init.zeros_(head.bias)
            head.train(self.training)

    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """Parameter groups for timm's layer-wise lr decay (see the module docstring)."""
        return dict(
            stem=r"^cls_token|^pos_embed|^patch_embed",
            blocks=[(r"^blocks\.(\d+)", None), (r"^core\.", _MATCH_PREV_GROUP), (r"^norm", _MATCH_PREV_GROUP)],
        )

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        set_activation_checkpointing(self, enable)
        self.grad_checkpointing = enable

    @property
    def feature_info(self) -> List[Dict[str, Any]]:
        """One entry per step of the (current) nominal depth."""
        shared = self.cfg.core_cls.shares_blocks
        return [dict(module="core" if shared else f"blocks.{i}", num_chs=self.embed_dim,
                     reduction=self.cfg.patch_size, step=i + 1) for i in range(self.nominal_steps)]

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: Optional[Union[int, Sequence[int]]] = None,
            return_prefix_tokens: bool = False,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = "NCHW",
            intermediates_only: bool = False,
            output_dict: bool = False,
            *,
            steps: Optional[int] = None,
    ):
        """The token states after the chosen steps, as timm's ViT returns its blocks' outputs:
        (final normed tokens, [intermediates]), or the list alone with ``intermediates_only``.
        NCHW: (B, D, H/p, W/p) patch grids; NLC: (B, N, D) patch tokens (prefix tokens apart,
        returned as (grid, prefix) pairs with ``return_prefix_tokens``). ``norm``: the final norm
        on each. ``stop_early``: stop stepping after the last index (the final output is then the
        normed state there). ``steps``: run K steps (default: the trained depth)."""
        if output_fmt not in OUTPUT_FMTS:
            raise ValueError(f"output_fmt must be one of {OUTPUT_FMTS}, got {output_fmt!r}")
        steps = self.core.check_steps(steps)
        take, last = take_indices(steps, indices)
        want = set(take)
        B, _, H, W = x.shape
        intermediates: List[torch.Tensor] = []
        states = self.iter_states(x, steps)
        z = None
        for i, z in enumerate(states):
            if i in want:
                intermediates.append(self.norm(z) if norm else z)
            if stop_early and i >= last:
                break
        states.close()

        n = self.num_prefix_tokens
        prefix = [y[:, :n] for y in intermediates] if n else None
        intermediates = [y[:, n:] for y in intermediates]
        if output_fmt == "NCHW":
            p = self.cfg.patch_size
            intermediates = [y.reshape(B, H // p, W // p, -1).permute(0, 3, 1, 2).contiguous() for y in intermediates]
        if output_dict:
            out: Dict[str, Any] = {"image_intermediates": intermediates}
            if prefix is not None and return_prefix_tokens:
                out["image_intermediates_prefix"] = prefix
            if not intermediates_only:
                out["image_features"] = self.norm(z)
            return out
        if return_prefix_tokens and prefix is not None:
            intermediates = list(zip(intermediates, prefix))
        if intermediates_only:
            return intermediates
        return self.norm(z), intermediates

    def prune_intermediate_layers(self, indices: Union[int, Sequence[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Keep what the steps up to the last of ``indices`` need; returns the absolute indices."""
        take, last = take_indices(self.nominal_steps, indices)
        keep = last + 1
        self.core.nominal_steps = keep
        uses = self.cfg.core_cls.block_uses(self.cfg, keep)
        if uses is not None and any(u == 0 for u in uses):
            for i, u in enumerate(uses):
                if u == 0:
                    self.blocks[i] = nn.Identity()
            self.core.limit = keep  # the dropped blocks cannot run
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take
