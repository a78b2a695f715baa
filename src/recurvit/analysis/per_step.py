"""A trained model inside out, step by step: readouts, norms, attention, CKA, step-specific pruning.

``analyze_model`` collects every analysis from the model's own outputs and the forward hooks of
:class:`recurvit.analysis.probe.StepProbe` (which attributes block calls to steps and applies the
one-step interventions of the pruning maps); the headline summary, CSVs and plots are in
:mod:`recurvit.analysis.per_step_report`.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..run.progress import show_progress
from .cka import CKAAccumulator
from .probe import Intervention, StepProbe, calls_per_step

ANALYSES = ("readout", "norms", "attention", "cka", "pruning")


@torch.no_grad()
def analyze_model(model: nn.Module, batches: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                  what: Sequence[str] = ANALYSES, steps: Optional[int] = None,
                  mlp_slices: Optional[int] = None, device: Optional[torch.device] = None,
                  progress: bool = False) -> dict:
    """Run the analyses in ``what`` on the (already batched) images; returns plain lists/dicts.

    Keys: ``readout`` {step, accuracy, loss}, ``norms`` {step, state_norm, rel_update},
    ``attention`` rows {step, head, entropy, distance, calls}, ``cka`` {labels, tokens, pooled},
    ``pruning`` {heads, mlp, skip, base_acc, split_half_r (see :func:`step_specificity`)}, and ``meta``.
    """
    unknown = sorted(set(what) - set(ANALYSES))
    if unknown:
        raise ValueError(f"unknown analyses {unknown}; choose from {', '.join(ANALYSES)}")
    what = [w for w in ANALYSES if w in set(what)]
    model.eval()
    device = device or next(model.parameters()).device
    K = model.core.check_steps(steps)
    H = model.blocks[0].attn.num_heads
    S = mlp_slices or H
    hidden = model.blocks[0].mlp.fc1.out_features
    if S > hidden:
        raise ValueError(f"cannot cut {hidden} MLP hidden units into {S} slices")
    res: dict = {"meta": {"core": model.cfg.core, "runs_as": model.cfg.core_cls.describe(model.cfg),
                         "shares_blocks": model.cfg.core_cls.shares_blocks, "steps": K, "nominal_steps": model.nominal_steps,
                          "heads": H, "mlp_slices": S, "mlp_hidden": hidden, "tokens": None,
                          "images": sum(len(y) for _, y in batches), "calls_per_step": None}}
    n = 0
    correct = torch.zeros(K, dtype=torch.float64)
    loss = torch.zeros(K, dtype=torch.float64)
    norm_sum = torch.zeros(K + 1, dtype=torch.float64)
    upd_sum = torch.zeros(K, dtype=torch.float64)
    ent = torch.zeros(K, H, dtype=torch.float64)
    dist = torch.zeros(K, H, dtype=torch.float64)
    att_calls = torch.zeros(K, dtype=torch.float64)
    att_weight = torch.zeros(K, dtype=torch.float64)
    cka_tok, cka_pool = CKAAccumulator(), CKAAccumulator()
    base_halves = torch.zeros(2, dtype=torch.float64)  # right answers at step K on the even / odd images
    with StepProbe(model, attention="attention" in what, features="cka" in what) as probe:
        # the base pass (also gives pruning its unmasked accuracy)
        for x, y in _progress(batches, progress, "base pass"):
            x, y = x.to(device), y.to(device)
            z0 = model.embed(x)
            zs = probe.states(x, K)
            logits = probe.readouts(zs)
            res["meta"]["calls_per_step"] = calls_per_step(probe.calls)
            res["meta"]["tokens"] = int(z0.shape[1])
            for k in range(K):
                correct[k] += (logits[k].argmax(-1) == y).sum().item()
                loss[k] += F.cross_entropy(logits[k].float(), y, reduction="sum").item()
            base_halves += _per_half(logits[-1].argmax(-1) == y, n)
            prev = z0
            norm_sum[0] += z0.float().norm(dim=-1).mean(-1).sum().item()
            for k, z in enumerate(zs):
                norm_sum[k + 1] += z.float().norm(dim=-1).mean(-1).sum().item()  # mean token L2 norm
                num = (z - prev).float().flatten(1).norm(dim=1)
                den = prev.float().flatten(1).norm(dim=1).clamp_min(1e-12)
                upd_sum[k] += (num / den).sum().item()
                prev = z
            for rec in probe.attn_records:
                k = rec["step"] - 1
                ent[k] += rec["entropy"].double() * rec["n"]
                dist[k] += rec["distance"].double() * rec["n"]
                att_weight[k] += rec["n"]
                att_calls[k] += 1
            if "cka" in what:
                D = z0.shape[-1]
                cka_tok.update([z0.reshape(-1, D)] + [z.reshape(-1, D) for z in zs])
                pooled = list(probe.pooled[:K])  # the K pre-logit features seen by probe.readouts
                model.forward_head(model.norm(z0))  # step 0: the embedding read out the same way
                cka_pool.update([probe.pooled[K]] + pooled)
            n += len(y)
        steps_col = list(range(1, K + 1))
        if "readout" in what:
            res["readout"] = {"step": steps_col, "accuracy": (correct / n).tolist(), "loss": (loss / n).tolist()}
        if "norms" in what:
            res["norms"] = {"step": list(range(0, K + 1)), "state_norm": (norm_sum / n).tolist(),
                            "rel_update": [float("nan")] + (upd_sum / n).tolist()}
        if "attention" in what:
            rows = []
            for k in range(K):
                for h in range(H):
                    w = att_weight[k].item()
                    rows.append({"step": k + 1, "head": h,
                                 "entropy": ent[k, h].item() / w if w else float("nan"),
                                 "distance": dist[k, h].item() / w if w else float("nan"),
                                 "calls": int(att_calls[k].item() / max(len(batches), 1))})
            res["attention"] = rows
            tokens = res["meta"]["tokens"] or 1
            res["meta"]["max_entropy"] = math.log(tokens)  # uniform attention over all tokens
            res["meta"]["uniform_distance"] = probe._distances(torch.device("cpu")).mean().item()
        if "cka" in what:
            res["cka"] = {"labels": ["emb"] + [str(k) for k in steps_col],
                          "tokens": cka_tok.matrix().tolist(), "pooled": cka_pool.matrix().tolist()}
        if "pruning" in what:
            base = base_halves.sum().item() / n
            res["pruning"] = {"base_acc": base, "heads": [], "mlp": [], "skip": []}
            jobs = [("heads", Intervention("head", k, h)) for k in steps_col for h in range(H)]
            jobs += [("mlp", Intervention("mlp", k, j, S)) for k in steps_col for j in range(S)]
            jobs += [("skip", Intervention("skip", k)) for k in steps_col]
            probe.attention = probe.features = False
            halves = torch.tensor([(n + 1) // 2, n // 2], dtype=torch.float64)
            split = torch.zeros(2, K, H + S, dtype=torch.float64)  # heads' and MLP slices' drops, per half
            for key, iv in _progress(jobs, progress, "pruning"):
                i0, right_halves = 0, torch.zeros(2, dtype=torch.float64)
                with probe.intervene(iv):
                    for x, y in batches:
                        x, y = x.to(device), y.to(device)
                        zs = probe.states(x, K)
                        ok = model.forward_head(model.norm(zs[-1]), step=K).argmax(-1) == y
                        right_halves += _per_half(ok, i0)
                        i0 += len(y)
                acc = right_halves.sum().item() / n  # counts: exact in float64
                row = {"step": iv.step, "accuracy": acc, "drop": base - acc}
                if key == "heads":
                    row["head"] = iv.index
                elif key == "mlp":
                    row["slice"] = iv.index
                if key != "skip":
                    split[:, iv.step - 1, iv.index + (H if key == "mlp" else 0)] = (base_halves - right_halves) / halves
                res["pruning"][key].append(row)
            res["pruning"]["split_half_r"] = split_half_r(split) if n >= 4 else math.nan
    return res


def _per_half(ok: torch.Tensor, i0: int) -> torch.Tensor:
    """(right answers on the even, on the odd images) of a batch whose first image is image ``i0``."""
    odd = (torch.arange(i0, i0 + len(ok), device=ok.device) % 2).bool()
    return torch.stack([ok[~odd].sum(), ok[odd].sum()]).double().cpu()


def _progress(items, on: bool, desc: str):
    if not show_progress(on):  # a bar only on a terminal (and never with --json)
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False, dynamic_ncols=True)


# ------------------------------------------------------------------ the fixed-point control
def continued(z_before: torch.Tensor, z_prev: torch.Tensor, z_last: torch.Tensor) -> torch.Tensor:
    """``z_last`` with its update (``z_last - z_prev``) replaced, token by token, by that update's
    least-squares projection onto the previous update (``z_prev - z_before``): the state an iteration
    that only continues along its previous direction (at the last update's own extent along it) reaches."""
    d, p = (z_last - z_prev).float(), (z_prev - z_before).float()
    alpha = (d * p).sum(-1, keepdim=True) / (p * p).sum(-1, keepdim=True).clamp_min(1e-12)
    return (z_prev.float() + alpha * p).to(z_last.dtype)


@torch.no_grad()
def continuation(model: nn.Module, batches: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                 steps: Optional[int] = None, device: Optional[torch.device] = None) -> dict:
    """Accuracy at ``steps`` (default: the trained depth T), and with the last step's update replaced by the
    previous update continued (:func:`continued`): {"acc_T", "acc_continued", "drop", "images"}. An
    iteration that settles towards a fixed point along one direction loses nothing when its last step is
    continued this way; a block whose last step does new work (a new direction) does."""
    model.eval()
    device = device or next(model.parameters()).device
    K = model.core.check_steps(steps)
    if K < 2:
        raise ValueError(f"the continuation control needs at least 2 steps, the model runs {K}")
    right = right_cont = n = 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        z0 = model.embed(x)  # the state before step 1, embedded once (iter_states would embed it again)
        zs = [z0, *model.core.states(model.blocks, z0, K)]
        real, cont = (model.forward_head(model.norm(z), step=K) for z in (zs[-1], continued(zs[-3], zs[-2], zs[-1])))
        right += (real.argmax(-1) == y).sum().item()
        right_cont += (cont.argmax(-1) == y).sum().item()
        n += len(y)
    acc, acc_c = right / n, right_cont / n
    return {"acc_T": acc, "acc_continued": acc_c, "drop": acc - acc_c, "images": n}


# ------------------------------------------------------------------ step-specific pruning, split in half
def step_specific_part(drops: torch.Tensor) -> torch.Tensor:
    """The part of a (steps, units) pruning map that says WHICH unit matters at which step: each step's row
    standardised across units (how much the step matters overall, in offset and scale, removed), then the
    mean row over steps subtracted (how much each unit matters at every step removed). Exactly zero for
    ``drops[t, u] = a[t] * b[u] + c[t]`` with every ``a[t] > 0``: the same units, in the same proportions, at
    every step."""
    d = drops.double()
    z = (d - d.mean(1, keepdim=True)) / d.std(1, keepdim=True).clamp_min(1e-12)
    return z - z.mean(0, keepdim=True)


def split_half_r(drops: torch.Tensor) -> float:
    """The correlation of the two halves' :func:`step_specific_part` of a (2, steps, units) pruning map
    (nan where a half's part is zero: no mask changed an answer in a way that differs by step)."""
    a, b = (step_specific_part(d).flatten() for d in drops)
    return torch.corrcoef(torch.stack([a, b]))[0, 1].item() if a.norm() > 0 and b.norm() > 0 else math.nan


def step_specificity(model: nn.Module, batches: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                     mlp_slices: int = 8, steps: Optional[int] = None, device: Optional[torch.device] = None) -> dict:
    """Step-specific pruning that can fail: the accuracy lost when one unit (an attention head, or one of
    ``mlp_slices`` equal slices of the MLP's hidden units) is masked at one step only, on the even and on
    the odd images separately; ``split_half_r`` is the correlation of the two halves'
    :func:`step_specific_part`. About zero when the units matter in the same proportions at every step and
    what differs is image noise; positive when which unit matters at which step is reproduced on new images.
    Returns {"split_half_r", "drops" (steps x units, all images), "units", "steps", "images"}."""
    n = sum(len(y) for _, y in batches)
    if n < 4:
        raise ValueError(f"the split-half pruning map needs at least 4 images, got {n}")
    res = analyze_model(model, batches, ("pruning",), steps=steps, mlp_slices=mlp_slices, device=device)
    p, K, H = res["pruning"], res["meta"]["steps"], res["meta"]["heads"]
    drops = [[0.0] * (H + mlp_slices) for _ in range(K)]
    for r in p["heads"]:
        drops[r["step"] - 1][r["head"]] = r["drop"]
    for r in p["mlp"]:
        drops[r["step"] - 1][H + r["slice"]] = r["drop"]
    return {"split_half_r": p["split_half_r"], "drops": drops,
            "units": [f"head{h}" for h in range(H)] + [f"mlp{j}" for j in range(mlp_slices)], "steps": K, "images": n}
