"""Step probing: forward hooks that attribute every block call of a model to a *step*, record
per-call attention statistics and pre-logit features, and apply one-step interventions.

The model code is never forked. ``StepProbe`` attaches the hooks and knows, at every block call,
which step it belongs to (it asks the core: ``core.step_of_call(n)``, ``core.current_time``):

- ``recurrent`` (bViT): step k is the k-th application of the shared block (1 call per step).
- ``stack`` (ViT): step k is block k (layer by layer).
- ``softmor``: step k is what the core yields as step k: unit k (block k recursed r times,
  ``inplace``) or cycle k (``cycle``); every block call inside it belongs to step k.
- ``ode``: a step is a grid interval (t_{k-1}, t_k], t_k = k h. The states read out after step k
  are the solver's grid states z(t_k). Block calls are the solver's stage evaluations: a fixed-step
  Runge-Kutta method makes exactly ``stages`` calls per interval (euler 1, midpoint 2, rk4 4), grouped
  by call order; multistep / adaptive methods are grouped by the time t of each evaluation
  (interval floor(t / h) + 1, clipped to the steps run). Per-step attention figures are then means
  over the calls of a step, and masking "at step k" masks every call in interval k.

Which step a call belongs to is the core's answer (``core.step_of_call(n)`` for the n-th block call
of the running forward; ``core.current_time`` gives an ODE evaluation's t): the probe knows no core.

Interventions (used by step-specific pruning; each active at ONE step only):
- ``head``: zero one attention head's output slice (B, N, heads*head_dim) before ``attn.proj``
  (forward pre-hook on ``attn.proj``): the head removed from that call of the block;
- ``mlp``: zero one contiguous slice of the MLP's hidden units before ``mlp.fc2``;
- ``skip``: the block's output is replaced by its input (forward hook): the block is the identity
  at that step (for the state-subtracted ODE: zero update over the interval; with step
  conditioning ``embed`` the added embedding is skipped with the block). For a plain recurrent
  bViT (no step conditioning) skipping step k leaves F^(T-1)(z_0) whatever k: every step shows the
  same drop, that of running T - 1 steps (a check, not a finding); the skip map tells steps apart
  for stacks, step-conditioned, ODE-with-time and SoftMoR models.
States before the intervened step are untouched (bit for bit), which the tests check.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn


@dataclass
class CallRecord:
    """One call of a block: the step it belongs to (1-based), which block, the ODE time if known."""

    call: int
    step: int
    block: int
    t: Optional[float] = None


@dataclass
class Intervention:
    kind: str  # head | mlp | skip
    step: int  # 1-based step at which it acts
    index: int = 0  # head or MLP slice
    slices: int = 1  # MLP: number of equal slices of the hidden units


class StepProbe:
    """Forward hooks on a ViT-style model (``model.blocks``, ``model.iter_states``) that attribute
    every block call to a step, optionally record per-call attention statistics and pre-logit
    features, and apply one-step interventions. Use as a context manager (hooks removed on exit)."""

    def __init__(self, model: nn.Module, attention: bool = False, features: bool = False):
        self.model = model
        self.core = model.core
        self.attention = attention
        self.features = features
        self.step = 0
        self.steps = 0
        self.calls: List[CallRecord] = []
        self.attn_records: List[dict] = []  # one per call: step, block, entropy (H,), distance (H,)
        self.pooled: List[torch.Tensor] = []  # pre-logit features, one per readout
        self.interventions: List[Intervention] = []
        self._handles: list = []
        cfg = model.cfg
        self.prefix = int(model.num_prefix_tokens)
        self.grid = cfg.img_size // cfg.patch_size
        self._dist: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ hooks
    def __enter__(self) -> "StepProbe":
        for i, block in enumerate(self.model.blocks):
            self._handles.append(block.register_forward_pre_hook(self._block_pre(i)))
            self._handles.append(block.register_forward_hook(self._block_post))
            self._handles.append(block.attn.register_forward_pre_hook(self._attn_pre(i)))
            self._handles.append(block.attn.proj.register_forward_pre_hook(self._proj_pre(block.attn)))
            self._handles.append(block.mlp.fc2.register_forward_pre_hook(self._fc2_pre))
        heads = [self.model.head] + list(self.model.stage_heads or [])
        for h in heads:
            self._handles.append(h.register_forward_pre_hook(self._head_pre))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _block_pre(self, i: int):
        def hook(mod, args):
            n = len(self.calls)
            self.step = self.core.step_of_call(n)  # the core knows which step a call belongs to
            self.calls.append(CallRecord(n, self.step, i, self.core.current_time))
        return hook

    def _active(self, kind: str) -> List[Intervention]:
        return [iv for iv in self.interventions if iv.kind == kind and iv.step == self.step]

    def _block_post(self, mod, args, out):
        if self._active("skip"):
            return args[0]
        return None

    def _attn_pre(self, i: int):
        def hook(attn, args):
            if not self.attention:
                return None
            with torch.no_grad():
                a = attn.attention_weights(args[0]).float()  # (B, H, N, N)
                ent = -(a * a.clamp_min(1e-12).log()).sum(-1).mean(dim=(0, 2))  # (H,)
                p = self.prefix
                ap = a[:, :, p:, p:]  # patch queries -> patch keys
                d = self._distances(a.device)
                dist = ((ap * d).sum(-1) / ap.sum(-1).clamp_min(1e-12)).mean(dim=(0, 2))  # (H,)
            self.attn_records.append({"call": len(self.calls) - 1, "step": self.step, "block": i,
                                      "entropy": ent.cpu(), "distance": dist.cpu(), "n": args[0].shape[0]})
            return None
        return hook

    def _distances(self, device) -> torch.Tensor:
        if self._dist is None or self._dist.device != device:
            g = self.grid
            r = torch.arange(g * g, device=device)
            pos = torch.stack([r // g, r % g], dim=-1).float()  # (P, 2) patch coordinates
            self._dist = torch.cdist(pos, pos)  # (P, P) in patches
        return self._dist

    def _proj_pre(self, attn):
        def hook(mod, args):
            ivs = self._active("head")
            if not ivs:
                return None
            x = args[0].clone()  # (B, N, heads * head_dim)
            for iv in ivs:
                x[..., iv.index * attn.head_dim:(iv.index + 1) * attn.head_dim] = 0
            return (x,) + tuple(args[1:])
        return hook

    def _fc2_pre(self, mod, args):
        ivs = self._active("mlp")
        if not ivs:
            return None
        x = args[0].clone()  # (B, N, hidden)
        for iv in ivs:
            lo, hi = slice_bounds(x.shape[-1], iv.slices, iv.index)
            x[..., lo:hi] = 0
        return (x,) + tuple(args[1:])

    def _head_pre(self, mod, args):
        if self.features:
            self.pooled.append(args[0].detach())
        return None

    # ---------------------------------------------------------------- driving
    @contextmanager
    def intervene(self, *interventions: Intervention) -> Iterator["StepProbe"]:
        old = self.interventions
        self.interventions = list(interventions)
        try:
            yield self
        finally:
            self.interventions = old

    def states(self, x: torch.Tensor, steps: Optional[int] = None) -> List[torch.Tensor]:
        """Run the core once on images x; returns [z_1, ..., z_K] (token states after each step)."""
        self.calls, self.attn_records, self.pooled = [], [], []
        self.steps = self.core.check_steps(steps)
        out: List[torch.Tensor] = []
        it = self.model.iter_states(x, self.steps)
        while True:
            self.step = len(out) + 1  # calls made while producing state k belong to step k
            try:
                z = next(it)
            except StopIteration:
                break
            out.append(z)
        self.step = 0
        return out

    def readouts(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits after every step, (K, B, classes), as ``forward_steps`` computes them."""
        m = self.model
        return torch.stack([m.forward_head(m.norm(z), step=k) for k, z in enumerate(states, start=1)])

    def forward_steps(self, x: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        return self.readouts(self.states(x, steps))


def slice_bounds(width: int, slices: int, index: int) -> Tuple[int, int]:
    """[lo, hi) of slice ``index`` when ``width`` units are cut into ``slices`` near-equal parts."""
    return (index * width) // slices, ((index + 1) * width) // slices


def calls_per_step(calls: Sequence[CallRecord]) -> Dict[int, int]:
    out: Dict[int, int] = {}
    for c in calls:
        out[c.step] = out.get(c.step, 0) + 1
    return out

