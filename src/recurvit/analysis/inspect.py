"""A trained model inside out, step by step: readouts, norms, attention, CKA, step-specific pruning.

Everything is collected from the model's own outputs and forward hooks; the model code is never
forked. ``StepProbe`` attaches the hooks and knows, at every block call, which *step* it belongs to:

- ``recurrent`` (bViT): step k is the k-th application of the shared block (1 call per step).
- ``stack`` (ViT): step k is block k (layer by layer).
- ``softmor``: step k is what the core yields as step k: unit k (block k recursed r times,
  ``inplace``) or cycle k (``cycle``); every block call inside it belongs to step k.
- ``ode``: a step is a grid interval (t_{k-1}, t_k], t_k = k h. The states read out after step k
  are the solver's grid states z(t_k). Block calls are the solver's stage evaluations: a fixed-step
  Runge-Kutta method makes exactly ``stages`` calls per interval (euler 1, midpoint 2, rk4 4), grouped
  by call order; multistep / adaptive methods are grouped by the time t of each evaluation
  (interval floor(t / h) + 1, clipped to the steps run; t is read by a forward pre-hook on the
  core's vector-field module). Per-step attention figures are then means over the calls of a step,
  and masking "at step k" masks every call in interval k.

For the discrete cores the step is set while driving the core's state generator
(``model.iter_states``): the calls made while producing state k belong to step k.

Interventions (used by step-specific pruning; each active at ONE step only):
- ``head``: zero one attention head's output slice (B, N, heads*head_dim) before ``attn.proj``
  (forward pre-hook on ``attn.proj``) -- the same as ``Attention(head_mask=...)`` at that call;
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

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cka import CKAAccumulator

ANALYSES = ("readout", "norms", "attention", "cka", "pruning")


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


# ------------------------------------------------------------------------------- the analyses
@torch.no_grad()
def analyze_model(model: nn.Module, batches: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                  what: Sequence[str] = ANALYSES, steps: Optional[int] = None,
                  mlp_slices: Optional[int] = None, device: Optional[torch.device] = None,
                  progress: bool = False) -> dict:
    """Run the analyses in ``what`` on the (already batched) images; returns plain lists/dicts.

    Keys: ``readout`` {step, accuracy, loss}, ``norms`` {step, state_norm, rel_update},
    ``attention`` rows {step, head, entropy, distance, calls}, ``cka`` {labels, tokens, pooled},
    ``pruning`` {heads, mlp, skip, base_acc}, and ``meta``.
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
    base_final_correct = 0
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
            base_final_correct += (logits[-1].argmax(-1) == y).sum().item()
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
            base = base_final_correct / n
            res["pruning"] = {"base_acc": base, "heads": [], "mlp": [], "skip": []}
            jobs = [("heads", Intervention("head", k, h)) for k in steps_col for h in range(H)]
            jobs += [("mlp", Intervention("mlp", k, j, S)) for k in steps_col for j in range(S)]
            jobs += [("skip", Intervention("skip", k)) for k in steps_col]
            probe.attention = probe.features = False
            for key, iv in _progress(jobs, progress, "pruning"):
                right = 0
                with probe.intervene(iv):
                    for x, y in batches:
                        x, y = x.to(device), y.to(device)
                        zs = probe.states(x, K)
                        logits = model.forward_head(model.norm(zs[-1]), step=K)
                        right += (logits.argmax(-1) == y).sum().item()
                acc = right / n
                row = {"step": iv.step, "accuracy": acc, "drop": base - acc}
                if key == "heads":
                    row["head"] = iv.index
                elif key == "mlp":
                    row["slice"] = iv.index
                res["pruning"][key].append(row)
    return res


def _progress(items, on: bool, desc: str):
    if not on:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False, dynamic_ncols=True)


# ------------------------------------------------------------------------------- summary
def summarize(res: dict) -> dict:
    """Headline figures: per-step CKA structure, attention distance range, pruning hot spots."""
    out: dict = {"core": res["meta"]["core"], "steps": res["meta"]["steps"]}
    K = res["meta"]["steps"]
    if "readout" in res:
        acc = res["readout"]["accuracy"]
        out["acc_final"] = acc[-1]
        out["acc_per_step"] = [round(a, 4) for a in acc]
    if "norms" in res:
        out["rel_update"] = [round(v, 4) for v in res["norms"]["rel_update"][1:]]
        out["state_norm"] = [round(v, 3) for v in res["norms"]["state_norm"]]
    if "cka" in res:
        for key in ("tokens", "pooled"):
            m = torch.tensor(res["cka"][key])[1:, 1:]  # steps only (drop the embedding row)
            off = m[~torch.eye(K, dtype=torch.bool)] if K > 1 else torch.tensor([float("nan")])
            adj = torch.tensor([m[i, i + 1].item() for i in range(K - 1)]) if K > 1 else torch.tensor([float("nan")])
            out[f"cka_{key}"] = {"mean_offdiag": off.mean().item(), "min": off.min().item(),
                                 "adjacent_mean": adj.mean().item(),
                                 "first_last": m[0, -1].item(), "adjacent": [round(v, 3) for v in adj.tolist()]}
    if "attention" in res:
        rows = res["attention"]
        per_step = {}
        for r in rows:
            per_step.setdefault(r["step"], []).append(r)
        out["attn_distance_per_step"] = [round(sum(r["distance"] for r in per_step[k]) / len(per_step[k]), 3)
                                         for k in sorted(per_step)]
        out["attn_entropy_per_step"] = [round(sum(r["entropy"] for r in per_step[k]) / len(per_step[k]), 3)
                                        for k in sorted(per_step)]
        out["attn_entropy_uniform"] = res["meta"].get("max_entropy")
        out["attn_distance_uniform"] = res["meta"].get("uniform_distance")
        out["attn_distance_by_head"] = [[round(r["distance"], 3) for r in per_step[k]] for k in sorted(per_step)]
    if "pruning" in res:
        p = res["pruning"]
        out["base_acc"] = p["base_acc"]
        for key, idx in (("heads", "head"), ("mlp", "slice")):
            rows = p[key]
            top = max(rows, key=lambda r: r["drop"])
            by_step = {}
            for r in rows:
                by_step.setdefault(r["step"], []).append(r["drop"])
            out[f"{key}_top"] = {"step": top["step"], idx: top[idx], "drop": top["drop"]}
            out[f"{key}_mean_drop_per_step"] = [round(sum(v) / len(v), 4) for _, v in sorted(by_step.items())]
            # the same unit (head / slice) matters differently at different steps: spread of its drop over steps
            units = sorted({r[idx] for r in rows})
            out[f"{key}_drop_range_per_unit"] = [round(max(r["drop"] for r in rows if r[idx] == u)
                                                       - min(r["drop"] for r in rows if r[idx] == u), 4) for u in units]
        out["skip_drop"] = [round(r["drop"], 4) for r in p["skip"]]
    return out


# --------------------------------------------------------------------------------- writing
def _write_csv(path, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for row in rows:
            w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])


def write_outputs(res: dict, out_dir, title: str = "") -> List[str]:
    """CSVs and PNGs for every analysis present in ``res``; returns the written paths."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: List[str] = []

    def csv_(name, header, rows):
        _write_csv(out / name, header, rows)
        written.append(str(out / name))

    if "readout" in res or "norms" in res:
        K = res["meta"]["steps"]
        header, cols = ["step"], [list(range(0, K + 1))]
        if "readout" in res:
            header += ["accuracy", "loss"]
            cols += [[float("nan")] + res["readout"]["accuracy"], [float("nan")] + res["readout"]["loss"]]
        if "norms" in res:
            header += ["state_norm", "rel_update"]
            cols += [res["norms"]["state_norm"], res["norms"]["rel_update"]]
        csv_("steps.csv", header, list(zip(*cols)))
    if "attention" in res:
        csv_("attention.csv", ["step", "head", "entropy", "distance", "calls"],
             [[r["step"], r["head"], r["entropy"], r["distance"], r["calls"]] for r in res["attention"]])
    if "cka" in res:
        labels = res["cka"]["labels"]
        for key in ("tokens", "pooled"):
            csv_(f"cka_{key}.csv", ["step"] + labels, [[lab] + row for lab, row in zip(labels, res["cka"][key])])
    if "pruning" in res:
        p = res["pruning"]
        csv_("pruning_heads.csv", ["step", "head", "accuracy", "drop"],
             [[r["step"], r["head"], r["accuracy"], r["drop"]] for r in p["heads"]])
        csv_("pruning_mlp.csv", ["step", "slice", "accuracy", "drop"],
             [[r["step"], r["slice"], r["accuracy"], r["drop"]] for r in p["mlp"]])
        csv_("pruning_skip.csv", ["step", "accuracy", "drop"],
             [[r["step"], r["accuracy"], r["drop"]] for r in p["skip"]])
    written += plot_all(res, out, title)
    return written


def plot_all(res: dict, out, title: str = "") -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    K = res["meta"]["steps"]
    unit = "step" if res["meta"]["shares_blocks"] else "layer"

    def save(fig, name):
        if title:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out / name)
        plt.close(fig)
        written.append(str(out / name))

    if "readout" in res or "norms" in res:
        fig, axes = plt.subplots(1, 3, figsize=(11, 3.2), dpi=110)
        if "readout" in res:
            axes[0].plot(res["readout"]["step"], res["readout"]["accuracy"], marker="o")
            axes[0].set_ylim(0, 1)
            axes[0].set_title("readout accuracy", fontsize=9)
        if "norms" in res:
            axes[1].plot(res["norms"]["step"], res["norms"]["state_norm"], marker="o")
            axes[1].set_title("mean token norm ||z_k|| (0 = embedding)", fontsize=9)
            axes[2].plot(res["norms"]["step"][1:], res["norms"]["rel_update"][1:], marker="o")
            axes[2].set_title("relative update ||z_k - z_{k-1}|| / ||z_{k-1}||", fontsize=9)
        for ax in axes:
            ax.set_xlabel(unit)
            ax.grid(alpha=0.3)
        save(fig, "steps.png")
    if "attention" in res:
        H = res["meta"]["heads"]
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), dpi=110)
        for h in range(H):
            rows = [r for r in res["attention"] if r["head"] == h]
            axes[0].plot([r["step"] for r in rows], [r["entropy"] for r in rows], marker="o", label=f"head {h}")
            axes[1].plot([r["step"] for r in rows], [r["distance"] for r in rows], marker="o", label=f"head {h}")
        axes[0].axhline(res["meta"].get("max_entropy", float("nan")), color="k", ls=":", lw=1, label="uniform")
        axes[1].axhline(res["meta"].get("uniform_distance", float("nan")), color="k", ls=":", lw=1, label="uniform")
        axes[0].set_title("attention entropy (nats)", fontsize=9)
        axes[1].set_title("mean attention distance (patches)", fontsize=9)
        for ax in axes:
            ax.set_xlabel(unit)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6)
        save(fig, "attention.png")
    if "cka" in res:
        labels = res["cka"]["labels"]
        fig, axes = plt.subplots(1, 2, figsize=(9, 4), dpi=110, constrained_layout=True)
        for ax, key in zip(axes, ("tokens", "pooled")):
            im = ax.imshow(res["cka"][key], vmin=0, vmax=1, cmap="viridis")
            ax.set_xticks(range(len(labels)), labels, fontsize=7)
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
            ax.set_title(f"linear CKA between {unit}s ({key})", fontsize=9)
            if len(labels) <= 16:
                for i in range(len(labels)):
                    for j in range(len(labels)):
                        ax.text(j, i, f"{res['cka'][key][i][j]:.2f}", ha="center", va="center", fontsize=5,
                                color="w" if res["cka"][key][i][j] < 0.6 else "k")
        fig.colorbar(im, ax=axes, shrink=0.8)
        if title:
            fig.suptitle(title, fontsize=9)
        fig.savefig(out / "cka.png")
        plt.close(fig)
        written.append(str(out / "cka.png"))
    if "pruning" in res:
        p = res["pruning"]
        H, S = res["meta"]["heads"], res["meta"]["mlp_slices"]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=110, constrained_layout=True)
        # one symmetric colour scale for both maps: red = accuracy lost, blue = gained, in points
        lim = max([abs(r["drop"]) for r in p["heads"] + p["mlp"]] + [1e-3]) * 100
        for ax, key, idx, width, name in ((axes[0], "heads", "head", H, "attention head"),
                                          (axes[1], "mlp", "slice", S, "MLP hidden slice")):
            m = torch.zeros(width, K)
            for r in p[key]:
                m[r[idx], r["step"] - 1] = 100 * r["drop"]
            im = ax.imshow(m.numpy(), aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim, origin="lower")
            if K * width <= 120:
                for i in range(width):
                    for j in range(K):
                        ax.text(j, i, f"{m[i, j]:.1f}", ha="center", va="center", fontsize=6)
            ax.set_xticks(range(K), [str(k) for k in range(1, K + 1)], fontsize=7)
            ax.set_yticks(range(width), [str(i) for i in range(width)], fontsize=7)
            ax.set_xlabel(unit)
            ax.set_ylabel(name)
            ax.set_title(f"accuracy drop (points), {name} masked at one {unit}", fontsize=8)
            fig.colorbar(im, ax=ax)
        axes[2].bar([r["step"] for r in p["skip"]], [100 * r["drop"] for r in p["skip"]])
        axes[2].set_xticks(range(1, K + 1))
        axes[2].set_xlabel(unit)
        axes[2].set_title(f"accuracy drop (points), whole {unit} skipped (base acc {p['base_acc']:.3f})", fontsize=8)
        axes[2].grid(alpha=0.3)
        if title:
            fig.suptitle(title, fontsize=9)
        fig.savefig(out / "pruning.png")
        plt.close(fig)
        written.append(str(out / "pruning.png"))
    return written
