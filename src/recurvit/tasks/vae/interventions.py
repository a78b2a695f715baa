"""Loop interventions on a trained LoopVAE (`recurvit vae intervene RUN`).

Each row evaluates the test set under one change of the recurrence:

- ``trained``: the trained loops (the reference row).
- ``truncate``: k loops fewer at every scale of the encoder and decoder (at least 0: a scale with
  0 loops skips the core) -- truncation / early exit.
- ``extra``: k loops more at every scale (extra loops reuse the scale's last loop conditioning,
  and, unshared, its last blocks).
- ``scale_update``: one loop's update scaled, ``h <- h + f (core(h) - h)`` at (side, scale, loop);
  f = 0 skips that loop, f = 1 is the trained model; by default the LAST trained loop of each
  scale (the one that completes the trained recurrence).

Columns: PSNR and SSIM (clamped outputs), ``out_of_range`` (fraction of output values outside
the valid range [-1, 1], before clamping), and ``delta_psnr`` against the trained row.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn as nn

from ... import tables
from ...errors import UserError
from ...run.outputs import output_dir, save_figure
from ...run.progress import show_progress
from .evaluate import VAERun, evaluate_vae

COLUMNS = ["kind", "side", "scale", "loop", "factor", "enc_loops", "dec_loops", "block_applications",
           "psnr", "ssim", "out_of_range", "delta_psnr"]


def _fmt(loops: Sequence[int]) -> str:
    return "-".join(str(v) for v in loops)


def intervention_specs(model: nn.Module, truncate: Sequence[int] = (1, 2), extra: Sequence[int] = (1, 2, 4),
                       factors: Sequence[float] = (0.0, 0.5, 0.9, 1.1, 2.0), loop: Optional[int] = None,
                       sides: Sequence[str] = ("encoder", "decoder")) -> List[Dict[str, Any]]:
    """The rows to evaluate. ``loop=None`` scales each scale's last trained loop, an int that loop
    (clamped to the scale's trained loops)."""
    enc, dec = list(model.cfg.loops), list(model.cfg.dec_loops)
    specs = [dict(kind="trained", side="both", scale="", loop="", factor="", enc=enc, dec=dec, update=None)]
    for k in truncate:
        specs.append(dict(kind="truncate", side="both", scale="", loop="", factor="",
                          enc=[max(v - k, 0) for v in enc], dec=[max(v - k, 0) for v in dec], update=None))
    for k in extra:
        specs.append(dict(kind="extra", side="both", scale="", loop="", factor="",
                          enc=[v + k for v in enc], dec=[v + k for v in dec], update=None))
    for side in sides:
        trained = enc if side == "encoder" else dec
        for s, n in enumerate(trained):
            lp = n - 1 if loop is None else min(max(int(loop), 0), n - 1)
            for f in factors:
                specs.append(dict(kind="scale_update", side=side, scale=s, loop=lp, factor=float(f),
                                  enc=enc, dec=dec, update={(side, s, lp): float(f)}))
    return specs


def run_interventions(model: nn.Module, loader: Iterable, device: torch.device, specs: List[Dict[str, Any]],
                      amp: str = "auto", progress: bool = True) -> List[Dict[str, Any]]:
    from tqdm.auto import tqdm

    rows = []
    for spec in tqdm(specs, desc="interventions", leave=False, disable=not show_progress(progress)):
        ev = evaluate_vae(model, loader, device, amp, enc_loops=spec["enc"], dec_loops=spec["dec"],
                          update_scale=spec["update"])
        apps = model.block_applications(enc_loops=spec["enc"], dec_loops=spec["dec"])["total"]
        rows.append({"kind": spec["kind"], "side": spec["side"], "scale": spec["scale"], "loop": spec["loop"],
                     "factor": spec["factor"], "enc_loops": _fmt(spec["enc"]), "dec_loops": _fmt(spec["dec"]),
                     "block_applications": apps, "psnr": ev["psnr"], "ssim": ev["ssim"],
                     "out_of_range": ev["out_of_range"]})
    ref = next((r["psnr"] for r in rows if r["kind"] == "trained"), None)
    for r in rows:
        r["delta_psnr"] = r["psnr"] - ref if ref is not None else float("nan")
    return rows


@torch.no_grad()
def update_sizes(model: nn.Module, loader: Iterable, device: torch.device) -> Dict[tuple, float]:
    """Mean relative update ||h_l - h_{l-1}|| / ||h_{l-1}|| of every trained loop over the test images,
    keyed by (side, scale, loop)."""
    model.eval()
    cores = {"encoder": model.encoder.core, "decoder": model.decoder.core}
    for core in cores.values():
        core.update_log = []
    try:
        for x in loader:
            model.reconstruct(x.to(device), sample=False)
        sums: Dict[tuple, List[torch.Tensor]] = {}
        for side, core in cores.items():
            for scale, loop, rel in core.update_log:
                sums.setdefault((side, scale, loop), []).append(rel)
    finally:
        for core in cores.values():
            core.update_log = None
    return {k: float(torch.cat(v).mean()) for k, v in sums.items()}


def write_csv(rows: List[Dict[str, Any]], path: str | Path) -> Path:
    return tables.write_csv(rows, path, COLUMNS)


def plot(rows: List[Dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Left: PSNR and out-of-range fraction against block applications (truncate / trained / extra).
    Right: PSNR change against the update factor, one line per (side, scale)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    ax1, ax2 = fig.subplots(1, 2)
    depth = sorted((r for r in rows if r["kind"] in ("trained", "truncate", "extra")),
                   key=lambda r: r["block_applications"])
    if depth:
        xs = [r["block_applications"] for r in depth]
        ax1.plot(xs, [r["psnr"] for r in depth], "o-", color="C0", label="PSNR")
        for r in depth:
            if r["kind"] == "trained":
                ax1.axvline(r["block_applications"], color="grey", ls=":", lw=1)
        ax1.set_xlabel("block applications (encoder + decoder)")
        ax1.set_ylabel("PSNR (dB)", color="C0")
        ax1b = ax1.twinx()
        ax1b.plot(xs, [100 * r["out_of_range"] for r in depth], "s--", color="C3", label="out of range")
        ax1b.set_ylabel("outputs outside [-1, 1] (%)", color="C3")
        ax1.set_title("fewer / extra loops (dotted: trained)")
    groups: Dict[tuple, list] = {}
    for r in rows:
        if r["kind"] == "scale_update":
            groups.setdefault((r["side"], r["scale"], r["loop"]), []).append(r)
    for (side, s, lp), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["factor"])
        ax2.plot([r["factor"] for r in rs], [r["delta_psnr"] for r in rs], "o-" if side == "encoder" else "s--",
                 label=f"{side} scale {s} loop {lp}")
    ax2.axhline(0, color="grey", lw=1)
    ax2.axvline(1, color="grey", ls=":", lw=1)
    ax2.set_xlabel("factor on one loop's update")
    ax2.set_ylabel("PSNR change (dB)")
    ax2.set_title("one loop's update scaled")
    if groups:
        ax2.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)

    save_figure(fig, path, dpi=120)
    return path


def check_cost(model: nn.Module, loader: Iterable, device: torch.device, specs: List[Dict[str, Any]],
               force: bool = False) -> None:
    """The interventions priced by their block applications before they run (``--extra 100000000``)."""
    from ...analysis.budget import check_applications_cost

    x = next(iter(loader)).to(device)  # a batch of images (the VAE's loaders carry no labels)
    total = sum(model.block_applications(enc_loops=s["enc"], dec_loops=s["dec"])["total"] for s in specs)
    check_applications_cost(lambda: model.eval().reconstruct(x, sample=False), model.block_applications()["total"],
                            total, len(loader), "these interventions (--truncate / --extra / --factors)", force=force)


def intervene_run(run: VAERun, truncate: Sequence[int] = (1, 2), extra: Sequence[int] = (1, 2, 4),
                  factors: Sequence[float] = (0.0, 0.5, 0.9, 1.1, 2.0), loop: Optional[int] = None,
                  sides: Sequence[str] = ("encoder", "decoder"), out: Optional[Path] = None, force: bool = False,
                  progress: bool = True) -> Dict[str, Any]:
    """The interventions on ``run`` (checked against its loops, priced first: ``force`` runs them anyway),
    written as intervene.csv and intervene.png into ``out`` (default: the run directory). Returns
    ``{"run", "csv", "plot", "rows"}`` as ``recurvit vae intervene --json`` prints it."""
    model, cfg = run.model, run.cfg
    most = max([*model.cfg.loops, *model.cfg.dec_loops])  # values that were clamped in silence
    if loop is not None and not 0 <= loop < most:
        raise UserError(f"--loop {loop}: this model's scales run loops 0..{most - 1}; choose one of them")
    if any(k > most for k in truncate):
        raise UserError(f"--truncate {max(truncate)} removes more loops than any scale runs ({most}); choose at most "
                        f"{most}")
    specs = intervention_specs(model, truncate, extra, factors, loop, sides)
    check_cost(model, run.loader, run.device, specs, force)
    rows = run_interventions(model, run.loader, run.device, specs, cfg.train.amp, progress=progress)
    folder = output_dir(out or run.folder)
    csv_path = write_csv(rows, folder / "intervene.csv")
    png_path = plot(rows, folder / "intervene.png", title=f"{cfg.model.name}: loop interventions on {cfg.data.name}")
    return {"run": str(run.source), "csv": str(csv_path), "plot": str(png_path), "rows": rows}


__all__ = ["COLUMNS", "intervention_specs", "run_interventions", "write_csv", "plot", "check_cost", "intervene_run"]
