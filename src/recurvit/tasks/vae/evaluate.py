"""Evaluation of a VAE run: PSNR / SSIM (always), LPIPS / rFID (with local weight files), the
mean-image baseline, and a grid of originals and reconstructions."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, Iterable, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from ...errors import UserError
from ...models import create_model, model_config
from ...models.loopvae import LoopVAE, LoopVAEConfig
from ...plot_style import wrap
from ...run import checkpoint as ckpt_io
from ...run.device import autocast, pick_device
from ...run.load import load
from ...run.outputs import save_figure
from .config import VAERunConfig, config_from_dict
from .data import build_vae_datasets, mean_image
from .metrics import frechet_distance, out_of_range, psnr, ssim, to_unit

TASK = "vae"  # checkpoint["task"] of runs written by `recurvit vae train`


def build_vae_model(cfg: VAERunConfig) -> nn.Module:
    """The LoopVAE preset ``cfg.model.name`` with the config's non-None fields as overrides."""
    name = cfg.model.name
    opts = {k: v for k, v in asdict(cfg.model).items() if k != "name" and v is not None}
    base = model_config(name)  # UserError for unknown names
    if not isinstance(base, LoopVAEConfig):
        raise UserError(f"model.name={name} is not a VAE preset; choose loopvae_conv, loopvae_transformer, "
                        f"vae_unshared or vae_unshared_transformer")
    model = create_model(name, **opts)
    assert isinstance(model, LoopVAE)
    return model


def read_vae(ckpt: Dict[str, Any], source: Path, **overrides) -> Tuple[nn.Module, VAERunConfig]:
    """The reader of LoopVAE checkpoints (the task's ``reader``, through which :func:`recurvit.run.load.load`
    opens them): the config's model with the checkpoint's weights."""
    if overrides:
        raise UserError(f"{', '.join(overrides)}: core options do not apply to a LoopVAE run ({source})")
    cfg = config_from_dict(ckpt["config"])
    model = build_vae_model(cfg)
    ckpt_io.load_state(model, ckpt["model"], source)
    return model.eval(), cfg


def load_vae_run(path: str | Path, map_location: Any = "cpu") -> Tuple[nn.Module, VAERunConfig, dict]:
    """(model in eval mode with its weights, config, checkpoint) from a VAE run directory or checkpoint."""
    loaded = load(path, map_location)
    if loaded.task != TASK:
        raise UserError(f"{loaded.source} is not a VAE checkpoint (written by `recurvit train`?); use "
                        f"`recurvit eval` for it")
    return loaded.model, loaded.config, loaded.checkpoint


def make_test_loader(dataset: Dataset, batch_size: int = 256, num_workers: int = 0) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)


@torch.no_grad()
def evaluate_vae(model: nn.Module, loader: Iterable, device: torch.device, amp: str = "auto",
                 lpips: Optional[nn.Module] = None, inception: Optional[nn.Module] = None,
                 env=None, **run: Any) -> Dict[str, float]:
    """Mean per-image PSNR (dB) and SSIM of the reconstructions (posterior mean), the L1 error in
    [-1, 1] units, KL (nats per image), the fraction of output values outside [-1, 1] (before
    clamping; PSNR / SSIM use the clamped image), and LPIPS / rFID when their networks are given.
    ``run`` goes to ``model.reconstruct`` (loops, enc_loops, dec_loops, update_scale). In a process
    group (``env``, a DistEnv) each rank reads its shard and the sums are all-reduced (rFID excepted)."""
    model.eval()
    tot = {"psnr": 0.0, "ssim": 0.0, "l1": 0.0, "kl": 0.0, "out_of_range": 0.0, "lpips": 0.0}
    feats_real, feats_fake = [], []
    n = 0
    for x in loader:
        x = x.to(device, non_blocking=True)
        with autocast(device, amp):
            xr, posts = model.reconstruct(x, sample=False, **run)
        xr = xr.float()
        a, b = to_unit(x), to_unit(xr).clamp(0.0, 1.0)
        tot["psnr"] += psnr(b, a).sum().item()
        tot["ssim"] += ssim(b, a).sum().item()
        tot["l1"] += (xr - x).abs().flatten(1).mean(1).sum().item()
        tot["kl"] += sum(q.kl() for q in posts).float().sum().item()
        tot["out_of_range"] += out_of_range(xr).sum().item()
        if lpips is not None:
            tot["lpips"] += lpips(b * 2 - 1, x).sum().item()
        if inception is not None:
            feats_real.append(inception(a).double().cpu())
            feats_fake.append(inception(b).double().cpu())
        n += len(x)
    if env is not None and env.enabled:
        *values, n = env.all_reduce_sum([*tot.values(), n], device)
        tot, n = dict(zip(tot, values)), int(round(n))
    if n == 0:
        raise UserError("the test set is empty")
    out = {k: v / n for k, v in tot.items() if k != "lpips" or lpips is not None}
    if inception is not None:
        if n < 2:
            raise UserError("rFID needs at least 2 test images")
        out["rfid"] = frechet_distance(torch.cat(feats_real).numpy(), torch.cat(feats_fake).numpy())
    out["n"] = n
    return out


@torch.no_grad()
def mean_image_baseline(mean: torch.Tensor, loader: Iterable) -> Dict[str, float]:
    """PSNR / SSIM of predicting one constant image for every test image: ``psnr`` / ``ssim`` for
    ``mean`` (the training set's mean image: the baseline), ``oracle_psnr`` for the test set's own
    mean image (the best any constant image can do on this test set)."""
    xs = torch.cat([x.float().cpu() for x in loader])
    a = to_unit(xs)

    def score(img):
        b = to_unit(img).clamp(0, 1)[None].expand_as(a)
        return psnr(b, a).mean().item(), ssim(b, a).mean().item()

    p, s = score(mean)
    po, _ = score(xs.mean(0))
    return {"psnr": p, "ssim": s, "oracle_psnr": po}


@torch.no_grad()
def save_grid(model: nn.Module, dataset: Dataset, path: str | Path, device: torch.device, n: int = 16,
              amp: str = "auto", **run: Any) -> Path:
    """PNG: ``n`` test images evenly spaced over the test set (top row, "original") over their
    reconstructions (bottom row, labelled with the loops they ran), drawn with matplotlib."""
    from matplotlib.figure import Figure
    from torchvision.utils import make_grid

    n = min(n, len(dataset))
    idx = torch.linspace(0, len(dataset) - 1, n).round().long().tolist()
    x = torch.stack([dataset[i] for i in idx]).to(device)
    model.eval()
    with autocast(device, amp):
        xr = model(x, sample=False, **run)
    imgs = torch.cat([to_unit(x), to_unit(xr.float()).clamp(0, 1)]).cpu()
    if imgs.shape[-1] < 64:  # blow small images up (nearest) so the grid is legible
        imgs = F.interpolate(imgs, scale_factor=max(1, 64 // imgs.shape[-1]), mode="nearest")
    pad, h = 2, imgs.shape[-2]
    grid = make_grid(imgs, nrow=n, padding=pad, pad_value=1.0).permute(1, 2, 0).numpy()  # (H, W, C)
    width = min(16.0, max(6.0, 0.75 * n))
    fig = Figure(figsize=(width, width * grid.shape[0] / grid.shape[1] + 0.9), dpi=110)
    ax = fig.add_subplot()
    ax.imshow(grid, cmap="gray" if grid.shape[-1] == 1 else None, interpolation="nearest")
    loops = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in run.items() if v is not None)
    ax.set_yticks([pad + h / 2, 2 * pad + 1.5 * h], ["original", "reconstruction" + (f"\n({loops})" if loops else "")],
                  fontsize=8)
    ax.set_xticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(wrap(f"{n} test images (top) and their reconstructions (bottom)", width - 1.5, 9), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, Path(path))


class VAERun(NamedTuple):
    """A trained VAE run opened for evaluation: its model on ``device``, config, data sets and test loader."""

    source: Path
    model: nn.Module
    cfg: VAERunConfig
    train_set: Dataset
    test_set: Dataset
    loader: DataLoader
    device: torch.device

    @property
    def folder(self) -> Path:
        """The run directory (the checkpoint's folder when a checkpoint file was given)."""
        return self.source if self.source.is_dir() else self.source.parent


def open_vae_run(path: str | Path, data_root: Optional[str] = None, num_images: Optional[int] = None,
                 device: str = "auto") -> VAERun:
    """The VAE run at ``path`` on ``device`` with its data: ``data_root`` overrides data.root (data moved since
    training), ``num_images`` keeps at most that many test images."""
    model, cfg, _ = load_vae_run(path)
    if data_root:
        cfg.data.root = data_root
    if num_images is not None:
        cfg.data.max_test = num_images
    dev = pick_device(device)
    model.to(dev)
    train_set, test_set, _ = build_vae_datasets(cfg.data, cfg.train.seed)
    return VAERun(Path(path), model, cfg, train_set, test_set, make_test_loader(test_set, 256), dev)


def evaluate_run(run: VAERun, loops=None, enc_loops=None, dec_loops=None, lpips: bool = False,
                 lpips_weights: Optional[str] = None, vgg_weights: Optional[str] = None, rfid: bool = False,
                 inception_weights: Optional[str] = None, grid: Optional[Path] = None) -> Dict[str, Any]:
    """PSNR / SSIM / L1 / KL / out-of-range of ``run`` at the given loops (None: trained), LPIPS when asked or
    given weight files, rFID likewise, against the mean-image baselines; writes the reconstruction grid
    (default RUN/recon_grid.png). Returns the result as ``recurvit vae eval --json`` prints it."""
    model, cfg, device = run.model, run.cfg, run.device
    try:
        enc, dec = model.resolve_loops(loops=loops, enc_loops=enc_loops, dec_loops=dec_loops)
    except ValueError as e:
        raise UserError(str(e)) from None
    lpips_net = inception = None
    if lpips or lpips_weights or vgg_weights:
        from .metrics import LPIPS

        lpips_net = LPIPS(vgg_weights, lpips_weights).to(device)
    if rfid or inception_weights:
        from .metrics import InceptionFeatures

        inception = InceptionFeatures(inception_weights).to(device)
    res = evaluate_vae(model, run.loader, device, cfg.train.amp, lpips=lpips_net, inception=inception,
                       enc_loops=enc, dec_loops=dec)
    base = mean_image_baseline(mean_image(run.train_set), run.loader)
    grid_path = grid or run.folder / "recon_grid.png"
    save_grid(model, run.test_set, grid_path, device, amp=cfg.train.amp, enc_loops=enc, dec_loops=dec)
    return {"run": str(run.source), "model": cfg.model.name, "operator": model.cfg.operator, "core": model.cfg.core,
            "enc_loops": enc, "dec_loops": dec, "trained_loops": model.cfg.loops,
            "block_applications": model.block_applications(enc_loops=enc, dec_loops=dec)["total"],
            **{k: res[k] for k in ("psnr", "ssim", "l1", "kl", "out_of_range", "n")},
            **({"lpips": res["lpips"]} if "lpips" in res else {}), **({"rfid": res["rfid"]} if "rfid" in res else {}),
            "baseline_mean_image_psnr": base["psnr"], "baseline_mean_image_ssim": base["ssim"],
            "baseline_test_mean_image_psnr": base["oracle_psnr"], "grid": str(grid_path)}


__all__ = ["TASK", "build_vae_model", "read_vae", "load_vae_run", "evaluate_vae", "mean_image_baseline", "save_grid",
           "make_test_loader", "VAERun", "open_vae_run", "evaluate_run"]
