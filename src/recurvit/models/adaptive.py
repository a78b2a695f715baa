"""Anytime inference: each image stops after the step at which its prediction has settled.

    logits, steps = forward_adaptive(model, x, criterion="kl", threshold=1e-3, max_steps=12)

``logits`` (B, classes) is each image's readout after the step at which it exited, ``steps`` (B,)
that step. The readout after step k is ``model.forward_head(model.norm(z_k), step=k)`` (the stage
head of step k when there are several), so an image that exits at step k gets exactly the logits of
``model(x, steps=k)`` (tests/analysis/test_anytime.py checks it for every criterion, with compaction).

Criteria (the signal s_k after step k; an image exits at the first step k >= min_steps that meets
the threshold, and at max_steps if none does):

===========  ============================================  =====================================
criterion    signal after step k                           exits when
===========  ============================================  =====================================
max_prob     max_c p_k(c)                                  s_k >= threshold
entropy      -sum_c p_k(c) log p_k(c) (nats)               s_k <= threshold
kl           KL(p_k || p_{k-1}) (nats; Huginn's rule)      s_k <= threshold (from step 2: p_0 is
                                                           not defined)
state        ||z_k - z_{k-1}|| / ||z_{k-1}|| (z_0: the     s_k <= threshold (a fixed-point test)
             embedded tokens; norms over all tokens)
===========  ============================================  =====================================

``threshold=None`` never exits early (every image runs max_steps).

Compaction (``compact=True``): an image that exits leaves the batch (``state.select``), so every
later step runs on the images still going and the saving is wall-clock, not only a count. Without
it the batch runs until its last image exits (the exits are recorded, nothing is saved before).
This needs a core that advances one step at a time (``core.begin`` / ``core.advance``, see
cores/base.py): the recurrent core, a fixed-step one-step ODE core (one grid interval per step),
and a stack (one block per step; at most its depth).

A stack exits early only where a readout was trained after every block (a head per block, as in
a deep-supervised ViT with per-stage heads): reading an untrained head after block k < L is not
an early exit but a wrong answer, so :func:`plan_steps` refuses it (ValueError) unless
``min_steps`` is the depth (every block runs) or the caller says the readouts were trained
(``per_step_readouts=True``, e.g. deep supervision at every block with one shared head).
Recurrent and ODE cores read out with their head after any step (max_steps may exceed the
training depth T: hard images then run past the training horizon).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

CRITERIA = ("kl", "entropy", "max_prob", "state")
RISING = ("max_prob",)  # exit when the signal is >= threshold; the others exit when it is <=


def check_criterion(criterion: str) -> str:
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}; got '{criterion}'")
    return criterion


def signal(criterion: str, logp: torch.Tensor, prev_logp: Optional[torch.Tensor], z: torch.Tensor,
           prev_z: torch.Tensor) -> torch.Tensor:
    """The criterion's signal (B,) in float32 after a step: ``logp`` are float32 log-probabilities
    (B, C) after it (``prev_logp`` before it; None at step 1), ``z`` / ``prev_z`` the states."""
    if criterion == "max_prob":
        return logp.max(dim=-1).values.exp()
    if criterion == "entropy":
        return -(logp.exp() * logp).sum(dim=-1)
    if criterion == "kl":
        if prev_logp is None:
            return torch.full(logp.shape[:1], float("inf"), device=logp.device)
        return (logp.exp() * (logp - prev_logp)).sum(dim=-1)
    if criterion == "state":
        num = (z.float() - prev_z.float()).flatten(1).norm(dim=1)
        return num / prev_z.float().flatten(1).norm(dim=1).clamp_min(1e-12)
    raise ValueError(check_criterion(criterion))


def meets(criterion: str, sig: torch.Tensor, threshold: Optional[float]) -> torch.Tensor:
    """Where the signal meets the threshold (NaN never does; threshold None: nowhere)."""
    if threshold is None:
        return torch.zeros_like(sig, dtype=torch.bool)
    return sig >= threshold if criterion in RISING else sig <= threshold


def exit_steps(sig: torch.Tensor, criterion: str, threshold: Optional[float], min_steps: int = 1) -> torch.Tensor:
    """The exit step (1-based) of each image from its signals after steps 1..K, (K, N) -> (N,):
    the first k >= min_steps that meets the threshold, else K. The rule of forward_adaptive."""
    ok = meets(criterion, sig, threshold)
    ok[: max(0, min(min_steps, len(sig)) - 1)] = False
    ok[-1] = True
    return ok.to(torch.uint8).argmax(dim=0) + 1


def has_step_readouts(model: nn.Module) -> bool:
    """Whether the model has a readout after every step: any core that shares its block (one head
    after any step), or a stack with a head per block."""
    if model.cfg.core_cls.shares_blocks:
        return True
    return int(model.cfg.stage_heads or 0) >= model.nominal_steps


def plan_steps(model: nn.Module, max_steps: Optional[int] = None, min_steps: int = 1,
               per_step_readouts: Optional[bool] = None) -> Tuple[int, int]:
    """(max_steps, min_steps) to run: max_steps defaults to T and is capped at a stack's depth.
    ValueError for what cannot run (see the module docstring)."""
    core = model.core
    K = model.nominal_steps if max_steps is None else int(max_steps)
    if K < 1:
        raise ValueError(f"max_steps must be >= 1, got {K}")
    if int(min_steps) < 1 or int(min_steps) > K:
        raise ValueError(f"min_steps must be in 1..max_steps={K}, got {min_steps}")
    reason = type(core).cannot_step(model.cfg)
    if reason is not None:
        raise ValueError(f"anytime exit needs a core that runs one step at a time: {reason}")
    if core.limit is not None:
        K = min(K, core.limit)
    m = min(int(min_steps), K)
    trained = has_step_readouts(model) if per_step_readouts is None else per_step_readouts
    if not trained and m < K:
        raise ValueError(f"this {model.cfg.core} has no readout trained after every block (stage_heads="
                         f"{model.cfg.stage_heads or 0}, depth={model.nominal_steps}): an early exit would read an "
                         f"untrained head; train it with train.supervision.stages={model.nominal_steps} and "
                         f"per_stage_heads=true, or set min_steps={K} to run every block")
    return K, m


@torch.no_grad()
def forward_adaptive(model: nn.Module, x: torch.Tensor, criterion: str = "kl", threshold: Optional[float] = 1e-3,
                     max_steps: Optional[int] = None, min_steps: int = 1, compact: bool = True,
                     per_step_readouts: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, classes), steps (B,) long): each image read out after the step it exited at."""
    check_criterion(criterion)
    K, m = plan_steps(model, max_steps, min_steps, per_step_readouts)
    core = model.core
    state = core.begin(model.blocks, model.embed(x))
    z = state.z  # what the readout reads; the state criterion compares it with the step before
    B = x.shape[0]
    rows = torch.arange(B, device=x.device)  # the image of each row of `state`
    live = torch.ones(B, dtype=torch.bool, device=x.device)  # without compaction: not exited yet
    steps = torch.full((B,), K, dtype=torch.long, device=x.device)
    out: Optional[torch.Tensor] = None
    prev_logp = None
    for k in range(1, K + 1):
        prev_z = z
        z = core.advance(state)
        logits = model.forward_head(model.norm(z), step=k)
        if out is None:
            out = logits.new_empty(B, logits.shape[-1])
        logp = F.log_softmax(logits.float(), dim=-1)
        if k == K:
            stop = torch.ones(len(rows), dtype=torch.bool, device=x.device)
        elif k < m:
            stop = torch.zeros(len(rows), dtype=torch.bool, device=x.device)
        else:
            stop = meets(criterion, signal(criterion, logp, prev_logp, z, prev_z), threshold)
        done = stop if compact else stop & live
        if done.any():
            out[rows[done]] = logits[done]
            steps[rows[done]] = k
        if compact:
            keep = (~stop).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            if keep.numel() < len(rows):
                state, rows, logp, z = state.select(keep), rows[keep], logp[keep], z[keep]
        else:
            live &= ~stop
            if not live.any():
                break
        prev_logp = logp
    return out, steps


@torch.no_grad()
def step_signals(model: nn.Module, x: torch.Tensor, steps: int) -> Tuple[torch.Tensor, dict]:
    """One full pass of ``steps`` steps: predictions (K, B) and every criterion's signal (K, B)
    after each step (float32). What exit analysis sweeps thresholds over without rerunning."""
    preds, sigs = [], {c: [] for c in CRITERIA}
    prev_z, prev_logp = model.embed(x), None
    for k, z in enumerate(model.iter_states(x, steps), start=1):
        logp = F.log_softmax(model.forward_head(model.norm(z), step=k).float(), dim=-1)
        preds.append(logp.argmax(dim=-1))
        for c in CRITERIA:
            sigs[c].append(signal(c, logp, prev_logp, z, prev_z))
        prev_z, prev_logp = z, logp
    return torch.stack(preds), {c: torch.stack(v) for c, v in sigs.items()}
