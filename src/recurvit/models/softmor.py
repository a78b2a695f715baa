"""Soft Mixture-of-Recursions (SoftMoR): the core of SR-ViT.

A recursion *unit* U is applied r = ``cfg.recursions`` times to its input x,

    h_1 = U(x),  h_i = U(h_{i-1})  (i = 2..r),

a router scores every token's state after each recursion step, a softmax over the steps gives
each token its own mixture weights, and the token-wise mixture is the unit's output:

    s_i(t) = w_u . LN(h_i(t)) + b_{u,i}
    p(t)   = softmax_i s_i(t)                     (over the steps i = 1..r, per token t)
    m(t)   = sum_i p_i(t) h_i(t)                  (what the next unit, or the readout, sees)

Sharing layouts (``cfg.layout``)
--------------------------------
- ``inplace``: every block l of the L-block model is a unit (block l recursed r times in place);
  the mixture of unit l is the input of block l + 1. L units, one router each.
- ``cycle``: the whole L-block stack is the unit, cycled r times; h_i is the output of the i-th
  pass through the stack and the mixture goes to the readout. One unit, one router.

Both layouts apply every block r times: ``nfe`` = L * r block applications at the full depth.

Router (the only parameters this core adds)
-------------------------------------------
Per unit u: a linear scorer w_u in R^D applied to the token state normalised by a
*parameter-free* LayerNorm (no affine: the norm of the residual stream grows with recursion,
and a raw-state scorer would mostly score that growth), plus a per-(unit, step) bias
b_{u,i}, a learned, token-independent prior over the steps. (A single bias per unit would cancel
in the softmax over steps; a common shift of b_u is still a free gauge.) Exact cost:

    inplace:  router_params = L * (D + r)
    cycle:    router_params =      D + r

stored as ``core.weight`` (units, D) and ``core.bias`` (units, r). Both start at ZERO, so an
untrained router mixes the steps uniformly (p_i = 1 / r). They are plain Parameters: the ViT
weight init (Linear / LayerNorm modules only) leaves them at zero.

With r = 1 the mixture has a single element with weight exactly 1 (softmax of one score), so the
model computes exactly the plain ViT of the same shape, whatever the router holds; the router
then gets (exactly) zero gradients.

What a step is (``states`` / ``forward_steps``)
-----------------------------------------------
- ``inplace``: a step is one UNIT (block l with its r recursions and its mixture). ``states``
  yields the mixture after each unit, so ``forward_steps`` is a layer-wise readout as for the
  ViT; nominal_steps = max_steps = L and ``model(x, steps=k)`` runs the first k units.
- ``cycle``: a step is one CYCLE (a full pass through the stack). ``states`` yields the mixture
  over the passes so far, m_c = sum_{i<=c} softmax_{i<=c}(s_i) h_i; the scores s_i do not depend
  on c, so ``model(x, steps=c)`` is the model recursed c times and equals step c of a longer run.
  nominal_steps = max_steps = r.

In both layouts ``forward_steps(x, K)[k-1] == model(x, steps=k)``.

``grad_last=k`` (truncated backprop): the block applications of all but the last k steps run
without a graph; router scores and mixtures always record one (they are cheap, and in the
``cycle`` layout the final mixture still weighs every pass).

``core.last_weights``: after a forward, a list with one detached float32 tensor (B, T, r) per
unit run (``cycle``: one entry with one column per cycle run), positive, summing to one over the
steps. Router scores and the softmax run in float32 (autocast off); the mixture is taken in the
states' dtype.

Config: ``cfg.steps`` must equal L for ``inplace``; for ``cycle`` the step count is r.
``step_cond`` / ``reinject`` are not
supported by this core.
"""
from __future__ import annotations

import numbers
from contextlib import nullcontext
from typing import Iterator, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cores import Core, _grad_ctx

LAYOUTS = ("inplace", "cycle")
MAX_RECURSIONS = 4  # the range studied by SoftMoR (r = 1..4)
_LN_EPS = 1e-6


def _no_autocast(t: torch.Tensor):
    """Autocast off on ``t``'s device (a no-op context on devices without autocast, e.g. meta)."""
    try:
        return torch.autocast(t.device.type, enabled=False)
    except RuntimeError:
        return nullcontext()


def check_recursions(r) -> int:
    if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 1 <= int(r) <= MAX_RECURSIONS:
        raise ValueError(f"recursions must be an integer in 1..{MAX_RECURSIONS}, got {r!r}")
    return int(r)


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}; got '{layout}'")
    return layout


def num_units(cfg) -> int:
    """Routed units: L blocks (inplace) or the one stack (cycle)."""
    return cfg.depth if check_layout(cfg.layout) == "inplace" else 1


def router_params(cfg) -> int:
    """Parameters the router adds to the plain ViT of the same shape: units * (D + r)."""
    return num_units(cfg) * (cfg.embed_dim + check_recursions(cfg.recursions))


class SoftMoRCore(Core):
    """Each unit recursed r times; a token-wise softmax over the steps mixes their outputs."""

    kind = "softmor"
    recurrent = True

    def __init__(self, cfg):
        self.layout = check_layout(cfg.layout)
        self.recursions = check_recursions(cfg.recursions)
        self.depth = int(cfg.depth)
        if self.layout == "inplace":
            if cfg.steps != cfg.depth:
                raise ValueError(f"a softmor inplace model has steps = depth (one step per block); "
                                 f"got steps={cfg.steps}, depth={cfg.depth}")
            nominal = self.depth
        else:
            if cfg.steps != self.recursions:
                raise ValueError(f"a softmor cycle model has steps = recursions (one step per cycle); "
                                 f"got steps={cfg.steps}, recursions={self.recursions}")
            nominal = self.recursions
        if getattr(cfg, "step_cond", "none") != "none" or getattr(cfg, "reinject", False):
            raise ValueError("the softmor core supports neither step_cond nor reinject")
        super().__init__(nominal)
        units = num_units(cfg)
        self.weight = nn.Parameter(torch.zeros(units, cfg.embed_dim))  # w_u
        self.bias = nn.Parameter(torch.zeros(units, self.recursions))  # b_{u,i}
        self.last_weights: List[torch.Tensor] = []

    @property
    def max_steps(self) -> int:
        return self.nominal_steps

    # ------------------------------------------------------------- router
    def score(self, u: int, i: int, h: torch.Tensor) -> torch.Tensor:
        """s_{u,i}(t) = w_u . LN(h(t)) + b_{u,i}: (B, T, D) -> (B, T), in float32."""
        with _no_autocast(h):  # the router runs in float32 under AMP too
            hn = F.layer_norm(h.float(), h.shape[-1:], eps=_LN_EPS)
            return hn @ self.weight[u].float() + self.bias[u, i].float()

    def mix(self, hs: List[torch.Tensor], scores: List[torch.Tensor]):
        """Token-wise softmax over the steps and the weighted sum of their states."""
        with _no_autocast(hs[0]):
            p = torch.softmax(torch.stack(scores, dim=-1), dim=-1)  # (B, T, n), float32
        if len(hs) == 1:
            m = hs[0] * p[..., 0:1].to(hs[0].dtype)  # p = 1 exactly: m = h_1 bit for bit
        else:
            m = (torch.stack(hs, dim=-2) * p.unsqueeze(-1).to(hs[0].dtype)).sum(dim=-2)
        return m, p

    # ------------------------------------------------------------- forward
    def states(self, blocks, z, steps, grad_last=None) -> Iterator[torch.Tensor]:
        self.nfe = 0
        self.last_weights = []
        if len(blocks) != self.depth:
            raise ValueError(f"softmor core built for {self.depth} blocks, got {len(blocks)}")
        if self.layout == "inplace":
            yield from self._inplace(blocks, z, steps, grad_last)
        else:
            yield from self._cycle(blocks, z, steps, grad_last)

    def _inplace(self, blocks, z, steps, grad_last):
        for l in range(steps):
            hs, scores = [], []
            for i in range(self.recursions):
                with _grad_ctx(l, steps, grad_last):
                    z = blocks[l](z)
                self.nfe += 1
                hs.append(z)
                scores.append(self.score(l, i, z))
            z, p = self.mix(hs, scores)
            self.last_weights.append(p.detach())
            yield z

    def _cycle(self, blocks, z, steps, grad_last):
        hs, scores = [], []
        for c in range(steps):
            with _grad_ctx(c, steps, grad_last):
                for block in blocks:
                    z = block(z)
                    self.nfe += 1
            hs.append(z)
            scores.append(self.score(0, c, z))
            m, p = self.mix(hs, scores)
            self.last_weights = [p.detach()]
            yield m

    def extra_repr(self) -> str:
        return f"layout={self.layout}, recursions={self.recursions}, units={self.weight.shape[0]}"
