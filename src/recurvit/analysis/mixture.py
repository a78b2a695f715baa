"""SoftMoR mixture weights: which recursion step each token reads from.

``mixture_weights`` runs a trained SoftMoR model over test images and returns the router's
token-wise softmax weights (``core.mixture_weights()``); ``plot_mixture`` draws them over the patch grid
(matplotlib's object API, ``Figure``: the caller's backend is untouched).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import torch
import torch.nn as nn

from ..errors import UserError
from ..plot_style import wrap
from ..run.outputs import output_dir, save_figure, write_text


@torch.no_grad()
def mixture_weights(model: nn.Module, loader: Iterable, device: torch.device, images: int = 4) -> Dict[str, torch.Tensor]:
    """``examples``: (images, units, N_patches, r) weights for the first images;
    ``mean``: (units, r) mean weight per unit and step over the whole loader (tokens averaged)."""
    def weights():
        w = model.core.mixture_weights()
        if w is None:
            raise ValueError(f"mixture weights exist for cores that mix steps (SoftMoR with mixture=soft); this run "
                             f"is {model.cfg.core_cls.describe(model.cfg)}")
        return w

    model.eval()
    prefix = model.num_prefix_tokens
    total, n, examples = None, 0, []
    for x, _ in loader:
        model(x.to(device))
        w = torch.stack(weights(), dim=1).cpu()  # (B, units, T, r)
        s = w.mean(dim=2).sum(dim=0)  # (units, r), summed over the batch
        total = s if total is None else total + s
        n += w.shape[0]
        if sum(e.shape[0] for e in examples) < images:
            examples.append(w[:, :, prefix:])
    ex = torch.cat(examples)[:images]
    return {"examples": ex, "mean": total / n}


def write_mean_csv(mean: torch.Tensor, path: Path) -> None:
    """Written atomically, and only over a CSV that starts as this one does (never through a link)."""
    import io

    f = io.StringIO(newline="")
    w = csv.writer(f)
    w.writerow(["unit"] + [f"step_{i + 1}" for i in range(mean.shape[1])])
    for u, row in enumerate(mean.tolist()):
        w.writerow([u + 1] + [f"{v:.4f}" for v in row])
    write_text(path, f.getvalue(), b"unit,", "table")


def plot_mixture(examples: torch.Tensor, images: torch.Tensor, mean: torch.Tensor, path: Path, title: str = "") -> None:
    """Rows: test images; columns: the image, then one panel per recursion step showing that step's
    weight (averaged over units) on the patch grid; last row: mean weight per unit and step."""
    from matplotlib.figure import Figure

    B, U, N, r = examples.shape
    g = int(round(N ** 0.5))
    # a diverging scale centred on the uniform weight 1/r: weights near it (SoftMoR's often are) still differ
    uniform = 1.0 / r
    lim = max(float((examples.mean(dim=1) - uniform).abs().max()), float((mean - uniform).abs().max()), 1e-3)
    scale = dict(vmin=uniform - lim, vmax=uniform + lim, cmap="RdBu_r")
    per_step = examples.mean(dim=1).reshape(B, g, g, r)  # averaged over units
    fig = Figure(figsize=(1.6 * (r + 1), 1.6 * (B + 1)), dpi=110)
    axes = fig.subplots(B + 1, r + 1, squeeze=False)
    for b in range(B):
        img = images[b]
        axes[b, 0].imshow(img.permute(1, 2, 0).squeeze(-1).numpy(), cmap="gray")
        for i in range(r):
            im = axes[b, i + 1].imshow(per_step[b, :, :, i].numpy(), **scale)
            if b == 0:
                axes[b, i + 1].set_title(f"step {i + 1}", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 0].set_title("image", fontsize=8)
    ax = axes[B, 0]
    ax.set_visible(False)
    big = fig.add_subplot(B + 1, 1, B + 1)
    big.imshow(mean.T.numpy(), aspect="auto", **scale)
    big.set_xlabel("unit (block)", fontsize=8)
    big.set_ylabel("step", fontsize=8)
    big.set_yticks(range(r), [str(i + 1) for i in range(r)], fontsize=7)
    big.set_xticks(range(U), [str(u + 1) for u in range(U)], fontsize=7)
    big.set_title("mean mixture weight over the test set", fontsize=8)
    for ax in axes[B, 1:]:
        ax.set_visible(False)

    label = f"mixture weight (white: uniform 1/{r} = {uniform:.2f}; red above, blue below)"
    fig.colorbar(im, ax=axes[:B, 1:].ravel().tolist(), shrink=0.6, label=wrap(label, 0.6 * 1.6 * B, 10))
    if title:
        fig.suptitle(wrap(title, 1.6 * (r + 1) - 0.3, 9), fontsize=9)

    save_figure(fig, path)


def mixture_run(path: Path, examples: int = 4, out: Optional[Path] = None, device: str = "auto",
                data_root: Optional[str] = None, force: bool = False) -> Dict[str, Any]:
    """The mixture weights of the SoftMoR run at ``path`` over its test split, priced first (``force``: run
    anyway): mixture.png (the first ``examples`` test images) and mixture_mean.csv written into ``out``
    (default: the run directory). Returns the result as ``recurvit mixture --json`` prints it."""
    from .budget import check_loader_cost
    from .trained import open_classifier

    path = Path(path)
    model, cfg, dev, test_loader, info = open_classifier(path, device, data_root)
    try:
        check_loader_cost(model, test_loader, dev, model.nominal_steps, len(test_loader), force=force)
        res = mixture_weights(model, test_loader, dev, images=examples)
    except ValueError as e:
        raise UserError(str(e)) from None
    out = output_dir(out or (path if path.is_dir() else path.parent))
    n = res["examples"].shape[0]
    imgs = next(iter(test_loader))[0][:n]
    mean_t = res["mean"]
    std = torch.tensor(info.std).view(-1, 1, 1)
    mu = torch.tensor(info.mean).view(-1, 1, 1)
    runs_as = model.cfg.core_cls.describe(model.cfg)
    plot_mixture(res["examples"], (imgs * std + mu).clamp(0, 1), mean_t, out / "mixture.png",
                 title=f"{cfg.model.name}: {runs_as}")
    write_mean_csv(mean_t, out / "mixture_mean.csv")
    return {"run": str(path), "runs_as": runs_as, "mean_weight_per_step": mean_t.mean(dim=0).tolist(),
            "mean_weight_per_unit_step": mean_t.tolist(), "png": str(out / "mixture.png"),
            "csv": str(out / "mixture_mean.csv")}
