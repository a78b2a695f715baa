"""Evaluation beyond the training horizon: accuracy, loss and state change at every step 1..K.

One pass of K block applications per batch (``model.iter_states``) gives every readout. For ODE
models each yielded state is a solver grid point, so "step" k is time k*h.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional

import torch
import torch.nn as nn

from ..plot_style import percent, wrap
from ..run.outputs import save_figure
from ..run.progress import bar_options
from ..tables import write_csv as write_table
from ..train.losses import soft_cross_entropy


@torch.no_grad()
def horizon_sweep(model: nn.Module, loader: Iterable, device: torch.device, max_steps: int,
                  progress: bool = False) -> Dict[str, List[float]]:
    """Per-step test accuracy, loss and mean relative state change ||z_k - z_{k-1}|| / ||z_{k-1}||
    (``progress``: a bar over the batches, shown only on a terminal)."""
    from tqdm.auto import tqdm

    model.eval()
    K = max_steps
    n = 0
    loss = torch.zeros(K, dtype=torch.float64)
    correct = torch.zeros(K, dtype=torch.float64)
    change = torch.zeros(K, dtype=torch.float64)
    bar = tqdm(total=len(loader) * K, desc=f"sweeping {K} steps", unit="step", leave=False,
               **bar_options(progress))
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        prev = model.embed(x)
        for k, z in enumerate(model.iter_states(x, K)):
            bar.update()
            logits = model.forward_head(model.norm(z), step=k + 1)
            loss[k] += soft_cross_entropy(logits, y).item() * len(y)
            correct[k] += (logits.argmax(-1) == y).sum().item()
            num = (z - prev).flatten(1).norm(dim=1)
            den = prev.flatten(1).norm(dim=1).clamp_min(1e-12)
            change[k] += (num / den).sum().item()
            prev = z
        n += len(y)
    return {"step": list(range(1, K + 1)), "accuracy": (correct / n).tolist(), "loss": (loss / n).tolist(),
            "rel_change": (change / n).tolist()}


FACTORS = (1, 2, 4, 8, 16, 32, 64)  # acc@kT reported for these k (when the sweep reaches k x T)


def summarize(sweep: Dict[str, List[float]], trained: int) -> Dict[str, Optional[float]]:
    """Accuracy at k x T for k in FACTORS (None where the sweep stops earlier), the mean accuracy
    over steps T..4T (None unless the sweep reaches 4T). No "best step": the sweep reads the test split, and a
    step count picked as its argmax would be chosen on the test split."""
    acc = dict(zip(sweep["step"], sweep["accuracy"]))
    K = max(sweep["step"])
    # beyond-horizon figures exist only where the model runs past T (a stack or SoftMoR stops at T)
    window = [acc[k] for k in range(trained, 4 * trained + 1)] if K >= 4 * trained else []
    out: Dict[str, Optional[float]] = {"trained_steps": trained, "max_steps": K}
    for k in FACTORS:
        out[f"acc_{'' if k == 1 else k}T"] = acc.get(k * trained)
    out["acc_mean_T_4T"] = sum(window) / len(window) if window else None
    return out


def write_csv(sweep: Dict[str, List[float]], path: Path) -> None:
    keys = ["step", "accuracy", "loss", "rel_change"]
    write_table([dict(zip(keys, row)) for row in zip(*(sweep[k] for k in keys))], path, keys)


def plot(curves: Dict[str, Dict[str, List[float]]], trained: int, path: Path, title: str = "",
         chance: Optional[float] = None) -> None:
    """Accuracy against steps for one or more labelled sweeps, with the training horizon marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6), dpi=120)
    ax = fig.add_subplot()
    for label, sw in curves.items():
        ax.plot(sw["step"], sw["accuracy"], marker=".", ms=3, label=label)
    ax.axvline(trained, color="k", ls="--", lw=1, label=f"training horizon T={trained}")
    if chance is not None:
        ax.axhline(chance, color="grey", ls=":", lw=1, label=f"chance ({chance:.0%})")
    ax.set_xlabel("test-time steps")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 1.0)

    percent(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(wrap(title, 5.4, 9), fontsize=9)  # a long run name wraps instead of running off the edge
    fig.tight_layout()

    save_figure(fig, path)
