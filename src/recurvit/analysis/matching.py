"""Matched partners: which stacked ViT a recurrent model is compared with, and back.

The Training Crossroads question, "does recurrence beat independent depth at matched FLOPs or at
matched parameter memory?", needs, for each model, a partner of the other kind under one budget:

- ``by="flops"`` (same compute per image). A recurrent model whose D-wide block runs T times does
  the matmuls of a D-wide stack of T blocks, so its partner is the ViT of the same width with
  ``depth = T`` (T = block applications per forward, e.g. NFE for an ODE core). From a stack of
  depth L, the partner is the bViT of the same width with ``steps = L``. FLOPs agree exactly for
  the stack and recurrent cores (step conditioning adds no matmul).
- ``by="params"`` (same stored parameter memory, within ``tol``, 10% by default). From a recurrent
  model: a stacked ViT, searched over width (``embed_dim`` a multiple of 64 with 64-dim heads) and
  depth >= 1; the trivial partner of the same width and depth 1 (the shared block applied once)
  is excluded. With ``prefer="depth"`` (default) the partner keeps the sequential depth: a stack
  of T narrower blocks, so that the pair differs only in sharing one wide block versus T
  independent narrow ones; if no such stack fits, or with ``prefer="closest"``, the stack of any
  depth whose stored parameters are closest. From a stack of depth L: the bViT (one block) of
  another width whose stored parameters are closest, with ``steps = L``; its FLOPs are then
  whatever they are and are reported with the ratio. Widths with 64-dim heads are tried first;
  only if none fits, multiples of 16 with the head count giving heads closest to 64 wide.
  The ten closest alternatives within ``tol`` (of the grid searched last) are listed too.

Each partner is returned as a preset name plus config overrides, so
``create_model(r["partner"]["name"], **r["partner"]["overrides"])`` builds it. Parameters are
counted on the ``meta`` device (nothing is allocated); FLOPs are the closed form of
:func:`~recurvit.analysis.accounting.analytic_flops` where the core knows its block applications
from its config, else a counted forward pass. Which core a model is matched with is the core's
own ``partner`` (a stack pairs with a recurrence, every other core with a stack).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..errors import UserError
from ..models.registry import create_model, list_models, model_config
from ..models.vit import ViTConfig
from .accounting import analytic_flops, count_params, measure_flops

HEAD_DIM = 64  # head width of every preset (192/3, 384/6, 768/12); partners keep it
# config keys a partner inherits from the model it is matched to (data, readout, regularisation, and the
# block's position scheme and MLP: a partner differs in sharing and width, not in what its block is)
SHARED_KEYS = ("img_size", "patch_size", "in_chans", "num_classes", "mlp_ratio", "qkv_bias", "class_token",
               "global_pool", "init_values", "drop_rate", "drop_path", "dense", "dynamic_img_size", "pos_embed",
               "mlp_conv")
_MAX_WIDTH = 16384  # search bound on embed_dim
_MAX_CANDIDATES = 10  # alternatives listed with a params match

Overrides = Tuple[Tuple[str, Any], ...]  # hashable, sorted (key, value) pairs


def _freeze(overrides: Dict[str, Any]) -> Overrides:
    return tuple(sorted((k, v) for k, v in overrides.items() if v is not None))


# ------------------------------------------------------------------------- costs of one config
def _build(name: str, overrides: Overrides) -> nn.Module:
    """The model on the ``meta`` device where its constructor allows it, else on the CPU."""
    try:
        with torch.device("meta"):
            return create_model(name, **dict(overrides))
    except (RuntimeError, NotImplementedError):
        return create_model(name, **dict(overrides))


@lru_cache(maxsize=4096)
def _params_stored(name: str, overrides: Overrides) -> int:
    cfg = model_config(name, **dict(overrides))
    if not cfg.core_cls.shares_blocks and cfg.depth > 1:
        # a stack is linear in depth: embedding + readout + depth * block. Counting it from the
        # one-block model keeps wide and deep candidates free (no depth-L build).
        one, block = _stack_unit(name, overrides)
        return one + (cfg.depth - 1) * block
    return count_params(_build(name, overrides))["params_stored"]


@lru_cache(maxsize=4096)
def _stack_unit(name: str, overrides: Overrides) -> Tuple[int, int]:
    """(stored params of the depth-1 stack, stored params of one block) for these overrides."""
    ov = {k: v for k, v in overrides if k not in ("depth", "steps")}
    model = _build(name, _freeze({**ov, "depth": 1}))
    return count_params(model)["params_stored"], count_params(model.blocks[0])["params_stored"]


@lru_cache(maxsize=1024)
def _forward_cost(name: str, overrides: Overrides) -> Tuple[int, int]:
    """(forward FLOPs per image, block applications per forward) at the trained steps."""
    cfg = model_config(name, **dict(overrides))
    applications = cfg.core_cls.block_applications(cfg)
    if applications is not None:
        return analytic_flops(cfg), applications
    model = _build(name, overrides)
    flops = measure_flops(model, (cfg.in_chans, cfg.img_size, cfg.img_size), train=False)
    uses = flops["block_uses"]
    applications = sum(uses) if uses is not None else (flops["nfe"] or cfg.steps)
    return flops["flops_forward"], applications


def describe(name: str, **overrides: Any) -> Dict[str, Any]:
    """Preset ``name`` with ``overrides``: its shape, stored params and forward FLOPs per image."""
    ov = _freeze(overrides)
    cfg = model_config(name, **dict(ov))
    if not hasattr(cfg, "core_cls"):  # a LoopVAE: its loops are not a core with a matched partner
        raise UserError(f"{name} is not a vision transformer with a core (a LoopVAE?); match compares a recurrent "
                        "ViT with its stack partner: give a ViT preset (recurvit flops --list)")
    flops, applications = _forward_cost(name, ov)
    return {
        "name": name,
        "overrides": dict(ov),
        "core": cfg.core,
        "embed_dim": cfg.embed_dim,
        "num_heads": cfg.num_heads,
        "depth": cfg.depth,
        "steps": cfg.steps,
        "block_applications": applications,
        "params_stored": _params_stored(name, ov),
        "flops_forward": flops,
    }


# ------------------------------------------------------------------------------------ partners
def _partner_preset(core: str, embed_dim: int) -> str:
    """The registered preset of ``core`` to start a partner from: same width if one exists, then
    the shortest name (the family's plain preset: vit_* before srvit_*), then the closest width. Only
    ViT presets partner a ViT (the convolutional dt_net presets run the recurrent core too)."""
    names = [n for n in list_models() if isinstance(model_config(n), ViTConfig) and model_config(n).core == core]
    if not names:
        raise UserError(f"no registered preset has core '{core}'")
    cfg_dim = {n: model_config(n).embed_dim for n in names}
    return min(names, key=lambda n: (cfg_dim[n] != embed_dim, len(n.split("_")[0]), abs(cfg_dim[n] - embed_dim), n))


def _partner_overrides(cfg: ViTConfig, partner: str, embed_dim: int, num_heads: int,
                       depth_or_steps: Dict[str, int]) -> Dict[str, Any]:
    """Overrides that turn preset ``partner`` into the partner: shared keys copied from ``cfg``
    where they differ from the preset, then the width and the depth / steps."""
    base = model_config(partner)
    out = {k: getattr(cfg, k) for k in SHARED_KEYS if getattr(cfg, k) != getattr(base, k)}
    if (embed_dim, num_heads) != (base.embed_dim, base.num_heads):
        out.update(embed_dim=embed_dim, num_heads=num_heads)
    out.update(depth_or_steps)
    return out


def _heads(embed_dim: int) -> int:
    """Head count for a width: 64-dim heads, else the divisor of the width closest to them."""
    if embed_dim % HEAD_DIM == 0:
        return embed_dim // HEAD_DIM
    divisors = [h for h in range(1, embed_dim + 1) if embed_dim % h == 0]
    return min(divisors, key=lambda h: (abs(embed_dim / h - HEAD_DIM), h))


def _widths(step: int) -> Iterator[int]:
    return iter(range(step, _MAX_WIDTH + 1, step))


def _stack_candidates(cfg: ViTConfig, partner: str, target: int, tol: float, step: int) -> List[Dict[str, Any]]:
    """Stacks (width, depth) whose stored params lie within ``tol`` of ``target``."""
    lo, hi = (1 - tol) * target, (1 + tol) * target
    out = []
    for D in _widths(step):
        H = _heads(D)
        ov = _freeze(_partner_overrides(cfg, partner, D, H, {"depth": 1}))
        one, block = _stack_unit(partner, ov)
        if one > hi:
            break
        for L in range(1, int((hi - one) // block) + 2):
            p = one + (L - 1) * block
            if lo <= p <= hi and not (D == cfg.embed_dim and L == 1):
                out.append({"embed_dim": D, "num_heads": H, "depth": L, "params_stored": p})
    return out


def _recurrent_candidates(cfg: ViTConfig, partner: str, steps: int, target: int, tol: float,
                          step: int) -> List[Dict[str, Any]]:
    """One-block recurrent models (other widths than ``cfg``'s) within ``tol`` of ``target``."""
    lo, hi = (1 - tol) * target, (1 + tol) * target
    out = []
    for D in _widths(step):
        H = _heads(D)
        p = _params_stored(partner, _freeze(_partner_overrides(cfg, partner, D, H, {"steps": steps})))
        if p > hi:
            break
        if lo <= p and D != cfg.embed_dim:
            out.append({"embed_dim": D, "num_heads": H, "steps": steps, "params_stored": p})
    return out


def _pick(cands: List[Dict[str, Any]], target: int, depth_key: str, depth: Optional[int]) -> Optional[Dict[str, Any]]:
    """Closest in stored params among those of depth ``depth`` (any depth if None); ties go deeper."""
    pool = [c for c in cands if depth is None or c[depth_key] == depth]
    if not pool:
        return None
    return min(pool, key=lambda c: (abs(c["params_stored"] - target), -c[depth_key]))


def _result(by: str, model: Dict[str, Any], partner_name: str, partner_ov: Dict[str, Any], tol: float,
            candidates: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    partner = describe(partner_name, **partner_ov)
    params_ratio = partner["params_stored"] / model["params_stored"]
    out = {
        "by": by,
        "model": model,
        "partner": partner,
        "params_ratio": params_ratio,
        "flops_ratio": partner["flops_forward"] / model["flops_forward"],
        "within_tol": abs(params_ratio - 1) <= tol if by == "params" else None,
    }
    if candidates is not None:
        ranked = sorted(candidates, key=lambda c: abs(c["params_stored"] - model["params_stored"]))
        out["candidates"] = ranked[:_MAX_CANDIDATES]
    return out


def match(name: str, by: str = "flops", tol: float = 0.10, prefer: str = "depth", **overrides: Any) -> Dict[str, Any]:
    """The matched partner of preset ``name`` (with config ``overrides``) under one budget.

    ``by``: ``"flops"`` (same forward FLOPs per image), ``"params"`` (stored params within
    ``tol``) or ``"both"`` (``{"flops": ..., "params": ...}``). A stack is matched to a recurrent
    model and any other core (recurrent, ode, softmor) to a stack; see the module docstring for
    the rules; ``prefer`` ("depth" or "closest") picks among params candidates. Returns ``model``
    and ``partner`` (each: name, overrides, core, embed_dim, num_heads, depth, steps,
    block_applications, params_stored, flops_forward), ``params_ratio`` and ``flops_ratio``
    (partner / model), ``within_tol`` (params matching) and, for params matching, up to ten
    ``candidates`` within ``tol``, closest first.
    """
    if by == "both":
        return {b: match(name, by=b, tol=tol, prefer=prefer, **overrides) for b in ("flops", "params")}
    if by not in ("flops", "params"):
        raise UserError(f"by must be flops, params or both; got '{by}'")
    if prefer not in ("depth", "closest"):
        raise UserError(f"prefer must be depth or closest; got '{prefer}'")
    model = describe(name, **overrides)
    cfg = model_config(name, **model["overrides"])
    applications = model["block_applications"]
    partner_core = cfg.core_cls.partner
    to_stack = not model_config(_partner_preset(partner_core, cfg.embed_dim)).core_cls.shares_blocks
    partner = _partner_preset(partner_core, cfg.embed_dim)
    depth_key = "depth" if to_stack else "steps"

    if by == "flops":
        ov = _partner_overrides(cfg, partner, cfg.embed_dim, cfg.num_heads, {depth_key: applications})
        return _result(by, model, partner, ov, tol)

    target = model["params_stored"]
    grids: Dict[int, List[Dict[str, Any]]] = {}

    def candidates(step: int) -> List[Dict[str, Any]]:
        if step not in grids:
            grids[step] = (_stack_candidates(cfg, partner, target, tol, step) if to_stack else
                           _recurrent_candidates(cfg, partner, applications, target, tol, step))
        return grids[step]

    # same sequential depth first (64-dim heads, then the finer grid), then any depth
    depths = ([applications] if prefer == "depth" else []) + [None]
    best, cands = None, []
    for depth, step in ((d, s) for d in depths for s in (HEAD_DIM, 16)):
        cands = candidates(step)
        best = _pick(cands, target, depth_key, depth)
        if best is not None:
            break
    if best is None:
        raise UserError(f"no {'stack' if to_stack else 'recurrent'} partner of '{name}' has stored params "
                        f"within {tol:.0%} of {target}; raise tol")
    ov = _partner_overrides(cfg, partner, best["embed_dim"], best["num_heads"], {depth_key: best[depth_key]})
    return _result(by, model, partner, ov, tol, cands)
