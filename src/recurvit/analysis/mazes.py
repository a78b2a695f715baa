"""Thinking longer on larger mazes: pixel accuracy and solved after every iteration 1..K at
every maze size, and two per-input rules for how long to iterate, all from ONE pass of K block
applications per batch (``model.iter_states``: no prefix is re-run), as :mod:`.horizon` does.

    sets = maze_test_sets(cfg.data)                               # {size: MazeDataset}
    sweeps = maze_sweep_sizes(model, sets, device, max_steps=10 * T)
    summarize_mazes(sweeps, trained=T)                            # solved at T, 2T, ... 10T, per size
    plot_solved(sweeps, T, "solved.png")                          # solved against iterations, a line a size
    sweep_run("runs/RUN", factor=10, n=300, out=Path("runs/RUN/mazes"))   # all of it for a trained run

The rules, each image on its own:

- ``max_conf``: read out at the iteration of maximal confidence, the mean over every pixel of the largest
  softmax probability (the first such iteration on a tie); walls and frame, which a network is soon sure
  of, count too (the rule the registered maze studies evaluate);
- ``max_conf_open``: DeepThinking's ``test_max_conf`` itself: the same, with each pixel's confidence
  weighted by the input's brightest channel (0 on walls and frame), so only the open pixels count;
- ``stable``: stop at the first iteration k >= ``min_steps`` whose predicted mask equals that of each of
  the ``patience`` iterations before it (never stable: read at K). An untrained or early network predicts
  the same empty mask for several steps: ``min_steps`` and ``patience`` are set before any test result
  (the study evaluator and ``recurvit horizon`` use T and :data:`PATIENCE` unless told otherwise), never
  chosen on a test set.

Both report the share solved and the iterations each image used (mean and max, per size).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data.mazes import maze_test_sets
from ..plot_style import percent
from ..run.load import load
from ..run.outputs import save_figure, write_text

FACTORS = (1, 2, 4, 8, 10, 16)  # solved at k x T for these k (when the sweep reaches them)
SWEEPS_MARK = b'{"trained_steps": '  # how sweeps.json begins
CONF_RULES = ("max_conf", "max_conf_open")  # the maximal-confidence readouts: over every pixel, over open ones
PATIENCE = 3  # the stable rule's default patience (the study evaluator's and recurvit horizon's); minimum: T


def stable_rule(trained: int, max_steps: int, min_steps: Optional[int] = None,
                patience: Optional[int] = None) -> Dict[str, int]:
    """The stable rule's options: from the trained depth T (at most K) with :data:`PATIENCE`, the study
    evaluator's defaults, unless given."""
    return {"min_steps": min_steps or min(trained, max_steps), "patience": patience or PATIENCE}


def _uint8_images(x: torch.Tensor) -> torch.Tensor:
    """Images as the loader gives them, in [0, 1], as uint8 0..255 on the CPU (for a picture)."""
    return (x.clamp(0, 1) * 255).round().to(torch.uint8).cpu()


@torch.no_grad()
def maze_sweep(model: nn.Module, loader: Iterable, device: torch.device, max_steps: int, min_steps: int = 1,
               patience: int = 1, keep: int = 0, example: bool = False) -> Dict[str, object]:
    """Per iteration 1..K: pixel accuracy, solved (share of images with every pixel right), solved_open
    (DeepThinking's: every pixel right but those on walls, its predictions there zeroed), and how the
    path is wrong: ``path_recall`` (share of the path's pixels predicted path) and ``path_precision`` (share
    of the pixels predicted path that are on it; None where none is) - a path eroded past the answer loses
    recall, one spilling into dead ends loses precision; and how the recurrent state moves: ``state_rms``
    (each image's root-mean-square state, averaged over images: a state that grows without bound drifts
    out of the range its head was trained on) and ``state_change`` (each image's RMS step z_k - z_{k-1}
    over the RMS of z_k; None at k = 1: how far the iteration is from a fixed point). Per rule
    (``max_conf``, ``max_conf_open``, ``stable``): solved and the iterations used. See the module docstring.
    ``keep`` > 0: also ``kept``, the first ``keep`` images of the first batch (uint8 (n, 3, H, W) in 0..255 as
    the loader gives them in [0, 1]), their targets and predicted masks at K (uint8 (n, H, W)), for a picture.
    ``example``: also ``example``, the first maze the stable rule solves (else the first maze): its image,
    target, the mask where the rule stopped (``stop``, at iteration ``step``; ``stopped`` False: never stable,
    read at K) and the mask at K (``last``)."""
    model.eval()
    K = int(max_steps)
    if K < 1 or min_steps < 1 or patience < 1:
        raise ValueError(f"max_steps, min_steps and patience must be >= 1, got {K}, {min_steps}, {patience}")
    correct = torch.zeros(K, dtype=torch.float64)
    solved_k = torch.zeros(K, dtype=torch.float64)
    solved_open_k = torch.zeros(K, dtype=torch.float64)  # DeepThinking's: every open pixel right (walls zeroed)
    hit, marked, path_px = torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.float64), 0
    state_rms, state_change = torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.float64)
    pixels = n = 0
    rules = {r: {"solved": 0, "steps": []} for r in (*CONF_RULES, "stable")}
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        B = len(y)
        open_px = x.float().amax(1).flatten(1)  # (B, H*W) DeepThinking's weights: 0 on walls, else the brightest
        walls = (open_px <= 0).view(y.shape)  # (B, H, W)
        best = {r: (torch.full((B,), -1.0, device=device), torch.zeros(B, dtype=torch.bool, device=device),
                    torch.zeros(B, dtype=torch.long, device=device)) for r in CONF_RULES}  # conf, solved, step
        stopped = torch.zeros(B, dtype=torch.bool, device=device)
        stop_step = torch.full((B,), K, dtype=torch.long, device=device)
        stop_solved = torch.zeros(B, dtype=torch.bool, device=device)
        stop_pred = None  # (with ``example``) each image's mask where the stable rule stopped it
        prev, unchanged = None, torch.zeros(B, dtype=torch.long, device=device)
        solved = prev_z = None
        for k, z in enumerate(model.iter_states(x, K), start=1):
            zf = z.float().flatten(1)  # (B, state size)
            rms = zf.pow(2).mean(1).sqrt()
            state_rms[k - 1] += rms.sum().item()
            if prev_z is not None:
                state_change[k - 1] += ((zf - prev_z).pow(2).mean(1).sqrt() / rms.clamp_min(1e-12)).sum().item()
            prev_z = zf
            logits = model.forward_head(model.norm(z), step=k).float()  # (B, C, H, W)
            pred = logits.argmax(1)
            right = pred == y
            solved = right.flatten(1).all(1)
            correct[k - 1] += right.sum().item()
            solved_k[k - 1] += solved.sum().item()
            solved_open_k[k - 1] += (right | walls).flatten(1).all(1).sum().item()
            hit[k - 1] += (right & (y == 1)).sum().item()
            marked[k - 1] += (pred == 1).sum().item()
            p = F.softmax(logits, dim=1).amax(1).flatten(1)  # (B, H*W)
            confs = {"max_conf": p.mean(1),
                     "max_conf_open": (p * open_px).sum(1) / open_px.sum(1).clamp_min(1e-12)}
            for r, conf in confs.items():
                b_conf, b_solved, b_step = best[r]
                better = conf > b_conf
                best[r] = (torch.where(better, conf, b_conf), torch.where(better, solved, b_solved),
                           torch.where(better, torch.full_like(b_step, k), b_step))
            if prev is not None:
                same = (pred == prev).flatten(1).all(1)
                unchanged = torch.where(same, unchanged + 1, torch.zeros_like(unchanged))
                stop = (unchanged >= patience) & ~stopped & (k >= min_steps)
                stop_step[stop] = k
                stop_solved[stop] = solved[stop]
                if example:
                    stop_pred = pred.clone() if stop_pred is None else torch.where(stop[:, None, None], pred,
                                                                                   stop_pred)
                stopped |= stop
            prev = pred
        if keep and "kept" not in rules:
            rules["kept"] = {"image": _uint8_images(x[:keep]),
                             "target": y[:keep].to(torch.uint8).cpu(), "pred": pred[:keep].to(torch.uint8).cpu()}
        stop_solved[~stopped] = solved[~stopped]  # never stable: the last iteration's readout
        if example and not rules.get("example", {}).get("solved", False):
            stop_pred = pred if stop_pred is None else torch.where(stopped[:, None, None], stop_pred, pred)
            hits = stop_solved.nonzero()
            if len(hits) or "example" not in rules:
                i = int(hits[0]) if len(hits) else 0
                rules["example"] = {"image": _uint8_images(x[i]),
                                    "target": y[i].to(torch.uint8).cpu(), "stop": stop_pred[i].to(torch.uint8).cpu(),
                                    "last": pred[i].to(torch.uint8).cpu(), "step": int(stop_step[i]),
                                    "stopped": bool(stopped[i]), "solved": bool(stop_solved[i]),
                                    "solved_last": bool(solved[i])}
        for r, (_, b_solved, b_step) in best.items():
            rules[r]["solved"] += int(b_solved.sum())
            rules[r]["steps"] += b_step.tolist()
        rules["stable"]["solved"] += int(stop_solved.sum())
        rules["stable"]["steps"] += stop_step.tolist()
        pixels += y.numel()
        path_px += int((y == 1).sum())
        n += B
    out: Dict[str, object] = {"step": list(range(1, K + 1)), "accuracy": (correct / max(pixels, 1)).tolist(),
                              "solved": (solved_k / max(n, 1)).tolist(), "n": n,
                              "solved_open": (solved_open_k / max(n, 1)).tolist(),
                              "path_recall": (hit / max(path_px, 1)).tolist(),
                              "path_precision": [h / m if m else None for h, m in zip(hit.tolist(), marked.tolist())],
                              "state_rms": (state_rms / max(n, 1)).tolist(),
                              "state_change": [None] + (state_change[1:] / max(n, 1)).tolist()}
    kept, picked = rules.pop("kept", None), rules.pop("example", None)
    for r, v in rules.items():
        steps = v["steps"]
        out[r] = {"solved": v["solved"] / max(n, 1), "steps_mean": sum(steps) / max(len(steps), 1),
                  "steps_max": max(steps, default=0), "steps": steps}
    out["stable"].update(min_steps=min_steps, patience=patience)
    if kept is not None:
        out["kept"] = kept
    if picked is not None:
        out["example"] = picked
    return out


def maze_sweep_sizes(model: nn.Module, sets: Mapping[int, object], device: torch.device, max_steps: int,
                     batch_size: int = 50, **rule_options) -> Dict[int, Dict[str, object]]:
    """:func:`maze_sweep` at every size of ``sets`` ({size: data set}, e.g. ``maze_test_sets(cfg.data)``)."""
    from torch.utils.data import DataLoader

    return {size: maze_sweep(model, DataLoader(data, batch_size=batch_size, shuffle=False), device, max_steps,
                             **rule_options) for size, data in sorted(sets.items())}


def sweep_run(run: Path, max_steps: Optional[int] = None, factor: int = 10, sizes: Optional[List[int]] = None,
              n: Optional[int] = None, batch_size: int = 50, device: str = "cpu", out: Optional[Path] = None,
              **rule_options) -> Dict[str, object]:
    """The sweep of a trained maze run (a run directory or checkpoint): every size of ``sizes`` (default: the
    run's ``data.maze_test_sizes``), ``n`` test mazes each (default: the run's ``data.maze_test``), up to
    ``max_steps`` (default ``factor`` x the trained depth). With ``out`` (a folder) writes sweeps.json and
    solved.png there (claimed before the sweep; both new or both as they were). The stable rule starts at T
    with patience :data:`PATIENCE` unless ``rule_options`` say otherwise. Returns {"trained_steps", "sweeps",
    "rows"}."""
    import json
    from dataclasses import replace

    from ..run.atomic import file_set
    from ..run.outputs import PNG, claim_files, output_dir

    if out is not None:
        out = output_dir(Path(out), "out")
        claim_files(out, {"sweeps.json": SWEEPS_MARK, "solved.png": PNG})

    loaded = load(run)
    model, cfg = loaded.model, loaded.config
    data = replace(cfg.data, maze_test_sizes=list(sizes or cfg.data.maze_test_sizes),
                   maze_test=int(n or cfg.data.maze_test))
    dev = torch.device(device)
    model = model.to(dev)
    T = model.nominal_steps
    K = max_steps or factor * T
    rule_options = {**stable_rule(T, K), **rule_options}
    sweeps = maze_sweep_sizes(model, maze_test_sets(data), dev, K, batch_size, **rule_options)
    result = {"trained_steps": T, "sweeps": sweeps, "rows": summarize_mazes(sweeps, T)}
    if out is not None:
        images = ("kept", "example")  # tensors of a picture (keep=, example=): returned, not written as JSON
        plain = {**result, "sweeps": {s: {k: v for k, v in sw.items() if k not in images} for s, sw in sweeps.items()}}
        with file_set(out, ["sweeps.json", "solved.png"]):  # both new or both as they were
            write_text(out / "sweeps.json", json.dumps(plain), SWEEPS_MARK, "sweeps.json")
            plot_solved(sweeps, T, out / "solved.png", title=f"{cfg.model.name}: solved against iterations")
    return result


def summarize_mazes(sweeps: Mapping[int, Dict[str, object]], trained: int) -> List[Dict[str, object]]:
    """One row a size: solved at k x T for k in FACTORS (None beyond the sweep), the best iteration's
    solved and that iteration (a description of the curve: the sweep reads a test split, so it chooses
    nothing), solved at 10T minus the best (overthinking: < 0), path recall and precision and the state's
    RMS and relative change at T and 10T, and each rule's solved and iterations."""
    rows = []
    for size, sw in sorted(sweeps.items()):
        solved = dict(zip(sw["step"], sw["solved"]))
        best_k = max(solved, key=lambda k: (solved[k], -k))
        row: Dict[str, object] = {"size": size, "n": sw["n"], "trained_steps": trained, "max_steps": max(solved)}
        for f in FACTORS:
            row[f"solved_{'' if f == 1 else f}T"] = solved.get(f * trained)
        row.update(solved_best=solved[best_k], best_step=best_k,
                   drop_10T=None if 10 * trained not in solved else solved[10 * trained] - solved[best_k])
        if "solved_open" in sw:  # DeepThinking's solved (walls zeroed) at k x T
            opened = dict(zip(sw["step"], sw["solved_open"]))
            row.update({f"solved_open_{'' if f == 1 else f}T": opened.get(f * trained) for f in FACTORS})
        for f in (1, 10):  # how the path is wrong at T and 10T (eroded: recall falls; spilled: precision)
            at = f * trained - 1  # and how far the state has grown and still moves
            for key in ("path_recall", "path_precision", "state_rms", "state_change"):
                row[f"{key}_{'' if f == 1 else f}T"] = sw[key][at] if key in sw and at < len(sw[key]) else None
        for r in (*CONF_RULES, "stable"):
            row.update({f"{r}_solved": sw[r]["solved"], f"{r}_steps_mean": sw[r]["steps_mean"],
                        f"{r}_steps_max": sw[r]["steps_max"]})
        rows.append(row)
    return rows


def plot_solved(sweeps: Mapping[int, Dict[str, object]], trained: int, path: Path, title: str = "",
                ax=None) -> None:
    """Solved against test-time iterations (log axis), one line a maze size, the training depth marked; where a
    sweep's DeepThinking's solved (``solved_open``, walls zeroed) differs from the strict one, it is dotted. With ``ax`` (a matplotlib Axes) draws there and writes nothing (side-by-side figures)."""
    from matplotlib.figure import Figure

    fig = None
    if ax is None:
        fig = Figure(figsize=(6, 3.6), dpi=120)
        ax = fig.add_subplot()
    dashed = False
    for size, sw in sorted(sweeps.items()):
        line, = ax.plot(sw["step"], sw["solved"], label=f"{size}x{size}")
        if sw.get("solved_open") is not None and list(sw["solved_open"]) != list(sw["solved"]):
            ax.plot(sw["step"], sw["solved_open"], color=line.get_color(), ls=":", lw=1)  # walls zeroed
            dashed = True
    if dashed:
        ax.plot([], [], color="grey", ls=":", lw=1, label="dotted: DeepThinking's solved (walls zeroed)")
    ax.axvline(trained, color="k", ls="--", lw=1, label=f"training depth T={trained}")
    ax.set_xscale("log")
    ax.set_xlabel("test-time iterations")
    ax.set_ylabel("mazes solved (%)")
    ax.set_ylim(0, 1.0)
    percent(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    if fig is not None:
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_figure(fig, path)


def draw_maze(panels: List[Tuple[str, object]], title: str, path: Path) -> None:
    """One maze side by side: ``panels`` of (title, image), an RGB image (H, W, 3) or a mask (H, W) drawn
    white on black (uint8 arrays or tensors), under ``title``; written to ``path``."""
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3 * len(panels), 3.3), dpi=110)
    for i, (name, im) in enumerate(panels):
        im = np.asarray(im)
        ax = fig.add_subplot(1, len(panels), i + 1)
        ax.imshow(im, cmap=None if im.ndim == 3 else "gray", vmin=0, vmax=255 if im.ndim == 3 else 1,
                  interpolation="nearest")
        ax.set_title(name, fontsize=8)
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def example_panels(ex: Mapping[str, object], max_steps: int) -> List[Tuple[str, object]]:
    """The panels of a sweep's ``example`` (see :func:`maze_sweep`): input, the mask where the stable rule
    stopped, the mask at K, target."""
    state = lambda ok: "solved" if ok else "not solved"  # noqa: E731
    return [("input", ex["image"].permute(1, 2, 0)),
            (f"stable rule: {'stopped at' if ex['stopped'] else 'never stable, read at'} {ex['step']} "
             f"({state(ex['solved'])})", ex["stop"]),
            (f"at {max_steps} iterations ({state(ex['solved_last'])})", ex["last"]),
            ("target path", ex["target"])]


__all__ = ["FACTORS", "PATIENCE", "draw_maze", "example_panels", "maze_sweep", "maze_sweep_sizes", "plot_solved", "stable_rule", "summarize_mazes", "sweep_run"]
