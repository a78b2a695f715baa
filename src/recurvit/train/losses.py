"""Training objectives over recursion steps: stage-wise deep supervision, depth schedules and
Bansal et al.'s progressive loss.

The model never computes its loss: it returns logits at the requested readout steps
(``model.forward_steps(x, steps=k, at=readouts)``) and these functions weigh them.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import SCHEDULES, WEIGHTINGS, DepthConfig  # the choices, declared on the config fields
from ..models.cores.base import grad_ctx



def readout_steps(steps: int, stages: int) -> List[int]:
    """Equally spaced 1-based readout steps ending at ``steps``: 12 steps, 4 stages -> [3, 6, 9, 12]."""
    stages = max(1, min(stages, steps))
    return sorted({max(1, round(steps * (i + 1) / stages)) for i in range(stages)})


def stage_weights(kind: str, n: int) -> torch.Tensor:
    """Loss weight of each readout, summing to one: uniform, linear ramp (1..n), or last only."""
    if kind == "uniform":
        w = torch.ones(n)
    elif kind == "linear":
        w = torch.arange(1, n + 1, dtype=torch.float32)
    elif kind == "last":
        w = torch.zeros(n)
        w[-1] = 1.0
    else:
        raise ValueError(f"train.supervision.weights must be one of {', '.join(WEIGHTINGS)}, got '{kind}'")
    return w / w.sum()


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross entropy for class indices or soft targets (MixUp / CutMix)."""
    if target.ndim == 2:
        if label_smoothing:
            target = target * (1 - label_smoothing) + label_smoothing / target.shape[1]
        return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()
    return F.cross_entropy(logits.float(), target, label_smoothing=label_smoothing)


def supervised_loss(logits_at: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
                    label_smoothing: float = 0.0) -> torch.Tensor:
    """sum_s w_s * CE(logits_s, target) over readouts; logits_at is (S, B, C)."""
    losses = torch.stack([soft_cross_entropy(lg, target, label_smoothing) for lg in logits_at])
    return (weights.to(losses.device) * losses).sum()


class DepthSampler:
    """Steps to run for each training batch around the nominal depth T.

    - fixed: always T.
    - uniform: k ~ U{min_steps, ..., max_steps} (max_steps default 2T).
    - poisson_lognormal: k = 1 + Poisson(lambda), log(lambda) ~ N(log(T - 1) - sigma^2 / 2, sigma),
      so E[k] = T with heavy tails (Huginn's recipe, Geiping et al. 2025), at most max_steps (default 4T).

    ``cap`` bounds k for cores that cannot run deeper than they are (a stack of L blocks).
    """

    def __init__(self, cfg: DepthConfig, nominal: int, generator: Optional[torch.Generator] = None,
                 cap: Optional[int] = None):
        if cfg.schedule not in SCHEDULES:
            raise ValueError(f"train.depth.schedule must be one of {', '.join(SCHEDULES)}, got '{cfg.schedule}'")
        self.cfg, self.nominal, self.gen = cfg, nominal, generator
        self.cap = cap  # the most steps the core can run (stack / softmor: its nominal depth)
        if cfg.schedule != "fixed" and cap is not None and cfg.max_steps is not None and cfg.max_steps > cap:
            raise ValueError(f"train.depth.max_steps={cfg.max_steps} but this model runs at most {cap} steps (a stack "
                             f"of {cap} blocks cannot go deeper): give max_steps <= {cap}")
        self.hi = min(cfg.max_steps or 2 * nominal, cap or 10**9)
        if cfg.schedule == "uniform" and not 1 <= cfg.min_steps <= self.hi:
            raise ValueError(f"train.depth needs 1 <= min_steps <= max_steps, got {cfg.min_steps}..{self.hi}")
        # the most steps a batch can be trained at (memory planning; the bound of every draw)
        self.deepest = (nominal if cfg.schedule == "fixed" else self.hi if cfg.schedule == "uniform"
                        else min(cfg.max_steps or 4 * nominal, cap or 10**9))

    def __call__(self) -> int:
        c = self.cfg
        if c.schedule == "fixed":
            return self.nominal
        if c.schedule == "uniform":
            return int(torch.randint(c.min_steps, self.hi + 1, (1,), generator=self.gen))
        mu = math.log(max(self.nominal - 1, 1e-3)) - c.sigma ** 2 / 2
        lam = torch.exp(mu + c.sigma * torch.randn(1, generator=self.gen))
        k = 1 + int(torch.poisson(lam, generator=self.gen))
        return min(k, self.deepest)


# ------------------------------------------------------------------ Bansal et al.'s progressive loss
def progressive_draw(steps: int, generator: Optional[torch.Generator] = None) -> Tuple[int, int]:
    """(n, k) for a depth of ``steps`` = K: n ~ U{0..K-1} steps run without gradient, then k ~ U{1..K-n}
    steps with it (Bansal et al. 2022, DeepThinking's ``get_output_for_prog_loss``)."""
    n = int(torch.randint(0, steps, (1,), generator=generator))
    k = int(torch.randint(1, steps - n + 1, (1,), generator=generator))
    return n, k


def random_start(z: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Gaussian noise shaped like the embedded input ``z``, scaled to its RMS (no gradient): a random first
    state for path-independent training (Anil et al. 2022)."""
    noise = torch.randn(z.shape, generator=generator, dtype=torch.float32).to(z.device, z.dtype)
    return noise * z.detach().float().pow(2).mean().sqrt().to(z.dtype)


def _begin(model: nn.Module, x: torch.Tensor, start_gen: Optional[torch.Generator]):
    """The core's step state for ``x``: from its embedding, or (``start_gen`` given) from a random state, the
    embedding still re-injected at every step."""
    z = model.embed(x)
    state = model.core.begin(model.blocks, z)
    if start_gen is not None:
        state.z = random_start(z, start_gen)
    return state


def stepped_logits(model: nn.Module, x: torch.Tensor, steps: int, at: List[int], grad_last: Optional[int] = None,
                   start_gen: Optional[torch.Generator] = None) -> torch.Tensor:
    """``model.forward_steps(x, steps, at, grad_last)`` through the core's per-step API, from a random first
    state when ``start_gen`` is given: (len(at), B, ...)."""
    core = model.core
    core.check_steps(steps)
    state = _begin(model, x, start_gen)
    out = []
    for t in range(steps):
        z = core.advance(state, lambda t=t: grad_ctx(t, steps, grad_last))
        if t + 1 in at:
            out.append(model.forward_head(model.norm(z), step=t + 1))
    return torch.stack(out)


def progressive_logits(model: nn.Module, x: torch.Tensor, n: int, k: int,
                       start_gen: Optional[torch.Generator] = None) -> torch.Tensor:
    """The readout after n + k steps whose first n ran without gradient, the state detached after them:
    the gradient reaches the last k block applications and the readout only, never the steps before nor
    the embedding through the state. (A re-injected input, ``reinject``, is read by the k steps as it
    is: the embedding gets the gradient of that path, as DeepThinking's recall reads the image.)

    Drives the model through its core's per-step API (``core.begin`` / ``core.advance``), so the step
    count (and any step conditioning) continues from n; a core that cannot step is a ValueError."""
    core = model.core
    core.check_steps(n + k)
    state = _begin(model, x, start_gen)  # from a random first state with ``start_gen`` (random_start)
    for _ in range(n):  # the block applications without a graph (a core's router, SoftMoR's, keeps its own)
        core.advance(state, torch.no_grad)
    state.z = state.z.detach()
    z = state.z
    for _ in range(k):
        z = core.advance(state)
    return model.forward_head(model.norm(z), step=n + k)


def progressive_mix(full: Optional[torch.Tensor], progressive: Optional[torch.Tensor], alpha: float) -> torch.Tensor:
    """(1 - alpha) * full + alpha * progressive; a term of weight 0 may be None (not computed)."""
    if alpha <= 0:
        return full
    if alpha >= 1:
        return progressive
    return (1 - alpha) * full + alpha * progressive
