"""What a study asks of LoopVAE runs (:class:`VAEView`): each run's result row (train, then PSNR / SSIM, speed
and accounting) and the columns, cells, tables and plots of its report."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ...analysis.accounting import count_params, measure_flops
from ...run.device import pick_device
from ...run.progress import quiet
from ...run.rundir import RunDir
from ...study import plots
from ...study.evaluators import Evaluated, evaluate_run
from ...study.grouping import table
from ...study.plateau import plateau_column
from ...study.registry import Contrast, View
from ...study.stats import fmt_ci
from ...study.workers import run_config, train_in_processes
from .config import load_vae_config
from .data import build_vae_datasets
from .evaluate import evaluate_vae, load_vae_run, make_test_loader
from .evaluators import EVALUATORS
from .task import train_vae


class VAEView(View):
    """LoopVAE runs: train, then reconstruction quality (PSNR / SSIM), speed and accounting; PSNR against
    parameters and per-epoch PSNR plots."""

    name = "vae"
    EVALUATORS = EVALUATORS
    CSV_KEYS = ["model", "operator", "core", "seed", "epochs", "params_stored", "params_effective", "flops_forward",
                "block_applications", "psnr", "ssim", "out_of_range", "baseline_psnr", "ms_per_img", "train_seconds",
                "eval_seconds"]
    STAT_KEYS = ["psnr", "ssim", "ms_per_img", "train_seconds"]
    SHARED_KEYS = ["model", "operator", "core", "epochs", "params_stored", "params_effective", "flops_forward",
                   "block_applications"]
    CURVE_KEY = "test_psnr_curve"
    CONTRAST = Contrast(["psnr", "ssim"], 1.0, "dB / SSIM")

    def check_run(self, base: str, overrides: List[str]) -> None:
        """A grid point's config, read when the study file is (a bad value is one line before any run trains)."""
        load_vae_config(base, overrides)

    def run(self, base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
            threads: Optional[int] = None) -> Dict[str, Any]:
        """Train (or resume) the run, then its PSNR / SSIM, the evaluators of ``eval_spec``, its speed and cost."""
        import torch

        cfg = run_config(load_vae_config, out, base, overrides)
        cfg.train.progress = False
        if nproc > 1:
            metrics = train_in_processes(["vae", "train"], base, overrides, out, nproc, threads)
        else:
            metrics = train_vae(cfg, out, resume=out.is_dir(), log=quiet)
        t0 = time.perf_counter()
        model, cfg, _ = load_vae_run(out / "last.pt")  # best.pt is chosen on the test split: not for reporting
        device = pick_device(cfg.train.device)
        model.to(device)
        _, test_set, info = build_vae_datasets(cfg.data, cfg.train.seed)
        loader = make_test_loader(test_set, 64)
        ev = evaluate_vae(model, loader, device, cfg.train.amp)

        figures = evaluate_run(Evaluated(model, cfg, out, device, loader, info), eval_spec, EVALUATORS)
        x = next(iter(loader))[:16].to(device)
        with torch.no_grad():
            model.reconstruct(x, sample=False)  # warm-up
            times = []
            for _ in range(3):
                s = time.perf_counter()
                model.reconstruct(x, sample=False)
                times.append(time.perf_counter() - s)
        flops = measure_flops(model.cpu(), tuple(x.shape[1:]), train=False)
        counts = count_params(model, block_uses=flops["block_uses"])
        curve = [m.get("test_psnr") for m in RunDir(out, created=False, owner=False).read_metrics()]
        return {
            "model": cfg.model.name, "core": model.cfg.core, "operator": model.cfg.operator, "seed": cfg.train.seed,
            "epochs": cfg.train.epochs, "params_stored": counts["params_stored"],
            "params_effective": counts["params_effective"], "flops_forward": flops["flops_forward"],
            "block_applications": model.block_applications()["total"], "psnr": ev["psnr"], "ssim": ev["ssim"],
            "out_of_range": ev["out_of_range"], "baseline_psnr": metrics.get("baseline_psnr"),
            "ms_per_img": 1000 * min(times) / len(x), "train_seconds": metrics.get("train_seconds"),
            "eval_seconds": time.perf_counter() - t0, "test_psnr_curve": curve, **figures,
        }

    def tables(self, rows: List[Dict[str, Any]], cs: List[Dict[str, Any]], study, seeds: list) -> List[str]:
        """What the figures are, then reconstruction quality, speed and cost per cell."""
        intro = [f"{len(rows)} runs; seeds {seeds}; PSNR / SSIM / ms per image as mean ± half-width of the 95% "
                 "t-interval over seeds (ms/img: reconstruction of a batch of 16, best of 3).", ""]
        axes = study.cell_axes()
        head = axes + ["model", "core", "params (stored)", "MFLOPs/img", "block apps", "PSNR dB", "SSIM", "ms/img",
                       "Δ last 20% epochs (dB)", "train s"]
        body = [[str(c[a]) for a in axes] + [
            c["model"], c["core"], f"{c['params_stored']:,}", f"{c['flops_forward'] / 1e6:.1f}",
            str(c["block_applications"]), fmt_ci(c["psnr"], 1.0, 2), fmt_ci(c["ssim"], 1.0, 4),
            fmt_ci(c["ms_per_img"], 1.0, 2), plateau_column([None if v is None else v / 100 for v in c["curve"] or []]),
            f"{c['train_seconds']['mean']:.0f}"] for c in cs]
        return intro + table(head, body) + [""]

    def plots(self, cs, study, out_dir: Path) -> List[Tuple[str, str]]:
        """PSNR against stored parameters, and each cell's test PSNR per epoch."""
        return [plots.psnr_vs_params(cs, out_dir, study.name),
                plots.epochs(cs, out_dir, study.name, ylabel="test PSNR (dB)", percent=False)]
