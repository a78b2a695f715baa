"""The report of the per-step analyses (:func:`recurvit.analysis.per_step.analyze_model`): headline
summary, CSVs and PNGs. Plots use matplotlib's object API (``Figure``): the caller's backend is
untouched.
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import List, Sequence

import torch
from matplotlib.figure import Figure

from ..plot_style import axes_width, percent, wrap
from ..run.outputs import output_dir, save_figure, write_text


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
        if "split_half_r" in p:  # step-specific pruning, reproduced between even and odd images?
            out["split_half_r"] = None if math.isnan(p["split_half_r"]) else round(p["split_half_r"], 4)
        if "continuation" in p:  # the fixed-point control (analysis.per_step.continuation)
            out["continue_drop"] = round(p["continuation"]["drop"], 4)
    return out


# --------------------------------------------------------------------------------- writing
def _write_csv(path, header: Sequence[str], rows: Sequence[Sequence]) -> None:
    """Written atomically, and only over a CSV that starts as these do (never through a link planted there,
    never over a file of the user's that bears the name)."""
    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(header)
    for row in rows:
        w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])
    write_text(path, f.getvalue(), f"{header[0]},".encode(), "table")


def write_outputs(res: dict, out_dir, title: str = "") -> List[str]:
    """CSVs and PNGs for every analysis present in ``res``; returns the written paths."""
    out = output_dir(Path(out_dir))
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
    written = []
    K = res["meta"]["steps"]
    unit = "step" if res["meta"]["shares_blocks"] else "layer"

    def save(fig, name):
        if title:
            fig.suptitle(wrap(title, fig.get_figwidth() - 0.5, 9), fontsize=9)
        fig.tight_layout()
        save_figure(fig, out / name)
        written.append(str(out / name))

    if "readout" in res or "norms" in res:
        fig = Figure(figsize=(11, 3.2), dpi=110)
        axes = fig.subplots(1, 3)
        if "readout" in res:
            axes[0].plot(res["readout"]["step"], res["readout"]["accuracy"], marker="o")
            axes[0].set_ylim(0, 1)
            axes[0].set_ylabel("test accuracy (%)")
            percent(axes[0])
            axes[0].set_title("accuracy read out after each step", fontsize=9)
        if "norms" in res:
            axes[1].plot(res["norms"]["step"], res["norms"]["state_norm"], marker="o")
            axes[1].set_title("mean token norm ||z_k|| (0: embedding)", fontsize=9)
            axes[2].plot(res["norms"]["step"][1:], res["norms"]["rel_update"][1:], marker="o")
            axes[2].set_title("relative update ||z_k - z_{k-1}|| / ||z_{k-1}||", fontsize=8)
        for ax in axes:
            ax.set_xlabel(unit)
            ax.grid(alpha=0.3)
        save(fig, "steps.png")
    if "attention" in res:
        H = res["meta"]["heads"]
        fig = Figure(figsize=(9, 3.2), dpi=110)
        axes = fig.subplots(1, 2)
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
        fig = Figure(figsize=(9, 4), dpi=110, constrained_layout=True)
        axes = fig.subplots(1, 2)
        # the scale starts at the lowest value shown (to a tenth), so that states of similar CKA differ in colour
        low = math.floor(10 * min(min(min(row) for row in res["cka"][k]) for k in ("tokens", "pooled"))) / 10
        low = min(max(low, 0.0), 0.9)
        for ax, key in zip(axes, ("tokens", "pooled")):
            im = ax.imshow(res["cka"][key], vmin=low, vmax=1, cmap="viridis")
            ax.set_xticks(range(len(labels)), labels, fontsize=7)
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
            ax.set_title(f"linear CKA between {unit}s ({key})", fontsize=9)
            if len(labels) <= 16:
                for i in range(len(labels)):
                    for j in range(len(labels)):
                        ax.text(j, i, f"{res['cka'][key][i][j]:.2f}", ha="center", va="center", fontsize=5,
                                color="w" if res["cka"][key][i][j] < 0.6 else "k")
        fig.colorbar(im, ax=axes, shrink=0.8, label=f"linear CKA (1: the same representation; scale from {low:.1f})")
        if title:
            fig.suptitle(wrap(title, 8.5, 9), fontsize=9)
        save_figure(fig, out / "cka.png")
        written.append(str(out / "cka.png"))
    if "pruning" in res:
        p = res["pruning"]
        H, S = res["meta"]["heads"], res["meta"]["mlp_slices"]
        fig = Figure(figsize=(13, 3.8), dpi=110, constrained_layout=True)
        axes = fig.subplots(1, 3)
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
            ax.set_title(wrap(f"{name} masked at one {unit}", axes_width(ax), 8), fontsize=8)
            fig.colorbar(im, ax=ax, label="accuracy drop (points; red: lost, blue: gained)")
        _skip_panel(axes[2], p["skip"], K, unit, p["base_acc"])
        if title:
            fig.suptitle(wrap(title, 12.5, 9), fontsize=9)
        save_figure(fig, out / "pruning.png")
        written.append(str(out / "pruning.png"))
    return written


def _skip_panel(ax, rows, K: int, unit: str, base_acc: float) -> None:
    """Accuracy drop when one whole step is skipped: a bar a step, each labelled with its value, so that
    drops of zero (a converged recurrence: T - 1 steps reach the same answer) read as 0, not as nothing."""
    drops = [100 * r["drop"] for r in rows]
    bars = ax.bar([r["step"] for r in rows], drops, color=["tab:red" if d > 0 else "tab:blue" for d in drops])
    ax.bar_label(bars, [f"{d:+.1f}" if abs(d) >= 0.05 else "0.0" for d in drops], fontsize=6, padding=1)
    ax.axhline(0.0, color="k", lw=0.8)
    lim = max([abs(d) for d in drops] + [1.0]) * 1.25  # at least +-1 point: zero bars sit mid-panel, labelled
    ax.set_ylim(-lim if min(drops, default=0) < 0 else -0.1 * lim, lim)
    ax.set_xticks(range(1, K + 1))
    ax.set_xlabel(unit)
    ax.set_ylabel("accuracy drop (points)")
    if drops and max(drops) - min(drops) < 0.05:
        what = "no change" if abs(drops[0]) < 0.05 else "the same drop"
        ax.text(0.5, 0.92, f"{what} whichever {unit} is skipped", transform=ax.transAxes, ha="center",
                va="top", fontsize=7, color="0.3")
    ax.set_title(wrap(f"whole {unit} skipped (accuracy with all: {100 * base_acc:.1f}%)", axes_width(ax), 8),
                 fontsize=8)
    ax.grid(alpha=0.3, axis="y")
