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

Routers (the only parameters this core adds; ``router=``)
---------------------------------------------------------
Scores are taken on token states normalised by a *parameter-free* LayerNorm (no affine: the norm
of the residual stream grows with recursion, and a raw-state scorer would mostly score that
growth), written LN below; b_{u,i} is a learned, token-independent prior over the steps (a single
bias per unit would cancel in the softmax; a common shift of b_u is still a free gauge).

- ``linear`` (default): s_i(t) = w_u . LN(h_i(t)) + b_{u,i}, a linear scorer per unit.
  Parameters per unit: D + r. Stored as ``core.weight`` (units, D), ``core.bias`` (units, r).
- ``query``: s_i(t) = (W_u LN(x(t))) . LN(h_i(t)) / sqrt(D) + b_{u,i}: a D x D query projection
  of the unit's INPUT x, scored against each normalised step output, so what a token reads
  depends on where it came from (the size of the paper's router, about D^2 per unit: SR-ViT-S,
  r = 4, 224 px adds 1.77M). Parameters per unit: D^2 + r. Stored as ``core.query`` (units, D, D),
  ``core.bias`` (units, r).

Exact cost (units U = L for ``inplace``, 1 for ``cycle``): ``router_params`` = U (D + r) or U (D^2 + r);
``router_flops``: query 2 T D^2 per unit run (the scores, as norms and softmax, are not counted).
Every router parameter starts at ZERO (the ViT init leaves plain Parameters alone), so an untrained
router mixes the steps uniformly. With r = 1 the mixture is one element of weight exactly 1: the model
is exactly the plain ViT of the same shape, and the router gets exactly zero gradients.

Plain recursion (``mixture="last"``)
------------------------------------
The same recursion with the unit's LAST step output passed on, no router and no mixture: the
baseline the SoftMoR abstract argues against ("simply increasing recursion depth does not reliably
improve performance"). With r = 1 it is also exactly the ViT.

What a step is (``begin`` / ``advance``; ``states`` and ``forward_steps`` derive from them)
-------------------------------------------------------------------------------------------
- ``inplace``: a step is one UNIT (block l, its r recursions, its mixture): a layer-wise readout as for
  the ViT; nominal_steps = core.limit = L, ``model(x, steps=k)`` runs the first k units.
- ``cycle``: a step is one CYCLE (a full pass through the stack); the readout reads the mixture over the
  passes so far, m_c = sum_{i<=c} softmax_{i<=c}(s_i) h_i (the state carries the passes' outputs and
  scores). The scores do not depend on c, so ``model(x, steps=c)`` equals step c of a longer run;
  nominal_steps = core.limit = r. In both layouts ``forward_steps(x, K)[k-1] == model(x, steps=k)``, and
  an anytime exit (``forward_adaptive``) stops an image after any step.

``grad_last=k`` (truncated backprop): the block applications of all but the last k steps run without a
graph; router scores and mixtures always record one (cheap; in ``cycle`` the final mixture weighs every pass).

``core.last_weights``: after a forward, a list with one detached float32 tensor (B, T, r) per unit run
(``cycle``: one entry with one column per cycle run), positive, summing to one over the steps. Router
scores and the softmax run in float32 (autocast off); the mixture is taken in the states' dtype.

Options (``SoftMoROptions``): recursions, layout, router, mixture. ``cfg.steps`` is L for
``inplace`` and r for ``cycle``.
"""
from __future__ import annotations

import math
import numbers
from contextlib import nullcontext
from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Core, StepPlan, check_choice

LAYOUTS = ("inplace", "cycle")
ROUTERS = ("linear", "query")
MIXTURES = ("soft", "last")
MAX_RECURSIONS = 4  # the range studied by SoftMoR (r = 1..4)
_LN_EPS = 1e-6


@dataclass
class SoftMoROptions:
    recursions: int = 1  # r: times each unit is recursed
    layout: str = "inplace"  # inplace: each block recursed r times; cycle: the whole stack cycled r times
    router: str = "linear"  # linear: w . LN(h_i); query: (W LN(x)) . LN(h_i) / sqrt(D)
    mixture: str = "soft"  # soft: token-wise softmax over the steps; last: plain recursion (no router)


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


def num_units(cfg) -> int:
    """Routed units: L blocks (inplace) or the one stack (cycle)."""
    return cfg.depth if cfg.options.layout == "inplace" else 1


def router_params(cfg) -> int:
    """Parameters the router adds to the plain ViT of the same shape (0 for plain recursion)."""
    o = cfg.options
    if o.mixture == "last":
        return 0
    per_unit = cfg.embed_dim ** 2 if o.router == "query" else cfg.embed_dim
    return num_units(cfg) * (per_unit + o.recursions)


def router_flops(cfg, steps: Optional[int] = None, tokens: Optional[int] = None) -> int:
    """Matmul FLOPs per image of the router in a forward of ``steps`` steps, in the convention of
    torch's flop counter (matrix products only): the query router's projection, 2 T D^2 per unit
    run. The scores themselves are one dot product per token and step (2 T D per scored step, as
    cheap as a LayerNorm), which the counter does not count, like norms and softmax."""
    o = cfg.options
    if o.mixture == "last" or o.router != "query":
        return 0
    k = cfg.steps if steps is None else int(steps)
    T = tokens if tokens is not None else cfg.num_patches + (1 if cfg.class_token else 0)
    units_run = k if o.layout == "inplace" else 1
    return units_run * 2 * T * cfg.embed_dim ** 2


class SoftMoRCore(Core):
    """Each unit recursed r times; a token-wise softmax over the steps mixes their outputs."""

    name = "softmor"
    Options = SoftMoROptions
    shares_blocks = True  # every block is applied r times
    DEFAULT_STEPS = 1

    def __init__(self, cfg):
        super().__init__(cfg)
        o = self.opts
        self.layout, self.recursions, self.depth = o.layout, o.recursions, int(cfg.depth)
        self.router, self.mixture = o.router, o.mixture
        units = num_units(cfg)
        self.weight = self.query = self.bias = None
        if self.mixture == "soft":
            if self.router == "linear":
                self.weight = nn.Parameter(torch.zeros(units, cfg.embed_dim))  # w_u
            else:
                self.query = nn.Parameter(torch.zeros(units, cfg.embed_dim, cfg.embed_dim))  # W_u
            self.bias = nn.Parameter(torch.zeros(units, self.recursions))  # b_{u,i}
        self.last_weights: List[torch.Tensor] = []

    # ------------------------------------------------------------- config side
    @classmethod
    def check_options(cls, o) -> None:
        check_recursions(o.recursions)
        check_choice("layout", o.layout, LAYOUTS)
        check_choice("router", o.router, ROUTERS)
        check_choice("mixture", o.mixture, MIXTURES)
        if o.mixture == "last" and o.router != "linear":
            raise ValueError("router does not apply with mixture=last (plain recursion has no router)")

    @classmethod
    def default_steps(cls, cfg) -> int:
        return int(cfg.depth) if cfg.options.layout == "inplace" else int(cfg.options.recursions)

    @classmethod
    def resolve(cls, cfg) -> None:
        super().resolve(cfg)
        want = cls.default_steps(cfg)
        if cfg.steps != want:
            what = "depth (one step per block)" if cfg.options.layout == "inplace" else "recursions (one step per cycle)"
            raise ValueError(f"a softmor {cfg.options.layout} model has steps = {what}; got steps={cfg.steps}, "
                             f"depth={cfg.depth}, recursions={cfg.options.recursions}")

    @classmethod
    def num_blocks(cls, cfg) -> int:
        return int(cfg.depth)

    @classmethod
    def block_uses(cls, cfg, steps: Optional[int] = None) -> List[int]:
        k = cfg.steps if steps is None else int(steps)
        o = cfg.options
        if o.layout == "inplace":  # the first k blocks, each recursed r times
            return [o.recursions if i < k else 0 for i in range(cfg.depth)]
        return [k] * cfg.depth  # cycle: the whole stack once per cycle

    @classmethod
    def step_limit(cls, cfg) -> int:
        return cls.default_steps(cfg)

    @classmethod
    def own_flops(cls, cfg, steps: Optional[int] = None) -> int:
        return router_flops(cfg, steps)

    @classmethod
    def describe(cls, cfg) -> str:
        o = cfg.options
        how = "last" if o.mixture == "last" else f"soft/{o.router}"
        return f"{cls.name} r={o.recursions} {o.layout} {how}"

    def mixture_weights(self) -> Optional[List[torch.Tensor]]:
        return self.last_weights if self.mixture == "soft" else None

    def step_of_call(self, call: int) -> int:
        return call // self.recursions + 1 if self.layout == "inplace" else call // self.depth + 1

    # ------------------------------------------------------------- router
    def score(self, u: int, i: int, h: torch.Tensor, q: Optional[torch.Tensor] = None) -> torch.Tensor:
        """s_{u,i}(t) for the state h (B, T, D) -> (B, T), in float32 (``q``: the query router's
        projected unit input, (B, T, D); ``i`` an int, or a 0-dim tensor in a step program)."""
        with _no_autocast(h):  # the router runs in float32 under AMP too
            hn = F.layer_norm(h.float(), h.shape[-1:], eps=_LN_EPS)
            s = (hn * q).sum(-1) if q is not None else hn @ self.weight[u].float()
            return s + self.bias[u, i].float()

    def unit_query(self, u: int, x: torch.Tensor) -> Optional[torch.Tensor]:
        """W_u LN(x) / sqrt(D) for the query router (None for the linear one)."""
        if self.query is None:
            return None
        with _no_autocast(x):
            xn = F.layer_norm(x.float(), x.shape[-1:], eps=_LN_EPS)
            return xn @ self.query[u].float().t() / math.sqrt(x.shape[-1])  # (B, T, D)

    def mix(self, hs: List[torch.Tensor], scores: List[torch.Tensor]):
        """Token-wise softmax over the steps and the weighted sum of their states."""
        with _no_autocast(hs[0]):
            p = torch.softmax(torch.stack(scores, dim=-1), dim=-1)  # (B, T, n), float32
        if len(hs) == 1:
            m = hs[0] * p[..., 0:1].to(hs[0].dtype)  # p = 1 exactly: m = h_1 bit for bit
        else:
            m = (torch.stack(hs, dim=-2) * p.unsqueeze(-1).to(hs[0].dtype)).sum(dim=-2)
        return m, p

    # ------------------------------------------------------------- forward: one step at a time
    # (``states``, the readout after every step, is the base class's: begin, then advance step by step)
    @classmethod
    def cannot_step(cls, cfg) -> Optional[str]:
        return None

    def begin(self, blocks, z):
        """``inplace``: the state is the tokens. ``cycle`` with the soft mixture: the tokens after the last
        pass, every pass's output and router score so far (``hs``, ``scores``, per image), and the query
        router's projected input ``q``; what the readout reads is their mixture (:meth:`read`)."""
        if len(blocks) != self.depth:
            raise ValueError(f"softmor core built for {self.depth} blocks, got {len(blocks)}")
        state = super().begin(blocks, z)
        self.last_weights = []
        if self.layout == "cycle" and self.mixture == "soft":
            state.rows.update(hs=[], scores=[])
            if self.query is not None:
                state.rows["q"] = self.unit_query(0, z)
        return state

    def _advance_in(self, state, grad):
        """Unit ``k`` (``inplace``) or pass ``k`` (``cycle``): the block applications in ``grad()``, the router
        and the mixture always with a graph (they are cheap, and the final mixture weighs every pass)."""
        k = state.k
        if self.layout == "inplace":
            z, p = self.unit(state.blocks, k, state.z, grad)
            if p is not None:
                self.last_weights.append(p.detach())
            return z
        with grad():
            z = self.cycle_pass(state.blocks, state.z, step=k + 1)
        if self.mixture == "soft":
            hs, scores = state.rows["hs"], state.rows["scores"]
            hs.append(z)
            scores.append(self.score(0, k, z, state.rows.get("q")))
            m, p = self.mix(hs, scores)
            self.last_weights = [p.detach()]
            state.cache["read"] = m
        return z

    def read(self, state):
        if "read" not in state.cache and state.rows.get("hs"):  # a selected state drops its cache: mix again
            state.cache["read"] = self.mix(state.rows["hs"], state.rows["scores"])[0]
        return state.cache.get("read", state.z)

    def unit(self, blocks, l: int, z: torch.Tensor, ctx=nullcontext):
        """Unit l of the ``inplace`` layout on z: block l recursed r times, then the token-wise mixture
        (mixture ``soft``). Returns (its output, the mixture weights (B, T, r) or None)."""
        q = self.unit_query(l, z)
        hs, scores = [], []
        for i in range(self.recursions):
            with ctx():
                z = blocks[l](z, step=l + 1)
            self.nfe += 1
            if self.mixture == "soft":
                hs.append(z)
                scores.append(self.score(l, i, z, q))
        return self.mix(hs, scores) if self.mixture == "soft" else (z, None)

    def cycle_pass(self, blocks, z: torch.Tensor, step: Optional[int] = None) -> torch.Tensor:
        """One pass through the stack (a step of the ``cycle`` layout); ``step``: the 1-based step the
        blocks are told."""
        for block in blocks:
            z = block(z, step=step)
            self.nfe += 1
        return z

    # ------------------------------------------------------------- step program
    def step_program(self, blocks) -> StepPlan:
        """``inplace``: one step program per unit, ``z -> z`` (the unit's mixture is the next unit's input).
        ``cycle``: ONE step program, one pass through the stack. With ``mixture=soft`` the readout reads the
        running mixture over all passes so far, so the state also carries the online softmax of the router's
        scores: ``mx`` (running max score, (B, T) float32), ``den`` (sum of exp(s_i - mx)) and ``num`` (sum of
        exp(s_i - mx) h_i, (B, T, D)); the step takes the step index (the router's per-pass prior b_i), the
        readout reads ``num / den`` (the eager softmax-then-sum to float tolerance), and a query router's
        projected input ``q`` is a constant."""
        if self.layout == "inplace":
            def unit(l):
                return lambda z: self.unit(blocks, l, z)[0]
            return StepPlan(steps=[unit(l) for l in range(len(blocks))])
        if self.mixture == "last":
            return StepPlan(steps=[lambda z: self.cycle_pass(blocks, z)])
        query = self.query is not None

        def begin(z):  # the empty mixture: max score -inf, sums 0 (float32, as the router's scores)
            B, T = z.shape[:2]
            mx = torch.full((B, T), float("-inf"), dtype=torch.float32, device=z.device)
            den = torch.zeros((B, T), dtype=torch.float32, device=z.device)
            return (mx, den, torch.zeros_like(z)) + ((self.unit_query(0, z),) if query else ())

        def mixed(z, mx, den, num, step, q=None):
            h = self.cycle_pass(blocks, z)
            s = self.score(0, step, h, q)  # (B, T) float32, with the router's prior of pass `step`
            new = torch.maximum(mx, s)
            old, w = torch.exp(mx - new), torch.exp(s - new)  # exp(-inf) = 0 on the first pass
            num = num * old.unsqueeze(-1).to(num.dtype) + w.unsqueeze(-1).to(h.dtype) * h
            return h, new, den * old + w, num

        return StepPlan(steps=[mixed], state=["z", "mx", "den", "num"], constants=["q"] if query else [],
                        step_index=True, begin=begin, readout_inputs=["num", "den"],
                        read=lambda num, den: num / den.unsqueeze(-1).to(num.dtype))

    def extra_repr(self) -> str:
        return (f"layout={self.layout}, recursions={self.recursions}, router={self.router}, "
                f"mixture={self.mixture}")
