"""Training loop of `recurvit vae train`: same run directory, checkpoint and resume rules as
classification (config.yaml, metrics.jsonl with one line per epoch, atomic last.pt,
``--resume`` continues from last.pt with optimizer, scheduler, discriminator and RNG state).

There is no best.pt: a LoopVAE run has no validation split, and an epoch chosen on the test PSNR would
report a test-selected number; evaluation reads the last epoch.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ..errors import UserError
from ..train import checkpoint as ckpt_io
from ..train.checks import Diverged, how_to_go_on
from ..train.optim import build_optimizer, build_scheduler, follow_config, optimizer_step
from ..train.resume import check_resume, config_changes
from ..train.rundir import RunDir, open_run
from ..train.tensorboard import EpochWriter, require_tensorboard
from ..train.runtime import autocast, pick_device, seed_everything, show_progress
from .config import VAERunConfig, as_dict, config_from_dict, to_yaml
from .data import build_vae_datasets, mean_image
from .evaluate import TASK, build_vae_model, evaluate_vae, make_test_loader, mean_image_baseline
from .losses import PatchDiscriminator, d_hinge_loss, g_hinge_loss, kl_loss, recon_loss


def resolve_vae_config(cfg: VAERunConfig, info) -> VAERunConfig:
    """The model follows the data set (img_size, in_chans) unless set explicitly."""
    m = cfg.model
    m = replace(m, img_size=m.img_size if m.img_size is not None else info.img_size,
                in_chans=m.in_chans if m.in_chans is not None else info.in_chans)
    return replace(cfg, model=m)


def _check(cfg: VAERunConfig) -> None:
    t = cfg.train
    if t.epochs < 1 or t.batch_size < 1 or t.eval_every < 1:
        raise UserError("train.epochs, train.batch_size and train.eval_every must be >= 1")
    if t.recon not in ("l1", "l2"):
        raise UserError(f"train.recon must be l1 or l2, got '{t.recon}'")
    if t.kl_weight < 0 or t.perceptual_weight < 0 or t.adv.weight < 0:
        raise UserError("train.kl_weight, train.perceptual_weight and train.adv.weight must be >= 0")
    if t.adv.start_step >= 0 and t.adv.layers < 1:
        raise UserError("train.adv.layers must be >= 1")
    if t.tensorboard:
        require_tensorboard()


def train_vae(cfg: VAERunConfig, out: Path, resume: bool = False, log: Callable = print,
              stop_after: Optional[int] = None) -> Dict[str, float]:
    """Train ``cfg`` into run directory ``out`` (or continue it from last.pt); returns the last metrics.

    ``stop_after=k`` stops after epoch k as an interruption would (the run can be resumed).
    """
    _check(cfg)
    try:
        with open_run(Path(out), resume, log=log) as run, EpochWriter(run.path, cfg.train.tensorboard) as tb:
            return _train_vae(cfg, run, resume and run.has_checkpoint(), log, stop_after, tb)
    except Diverged as e:  # the directory is closed now (removed if it held nothing): advise what is true of it
        raise how_to_go_on(e, Path(out)) from None


def _train_vae(cfg: VAERunConfig, run: RunDir, resume: bool, log: Callable, stop_after: Optional[int],
               tb: Optional[EpochWriter] = None):
    out = run.path
    state = run.load_last() if resume else None
    if state is not None and state.get("task") != TASK:
        raise UserError(f"cannot resume {out}: it is not a VAE run (use `recurvit train --resume`)")
    if state is not None:
        log(check_resume(str(out), state["epoch"], config_changes(as_dict(config_from_dict(state["config"])),
                                                                   as_dict(cfg))))
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.train.seed)
    device = pick_device(cfg.train.device)
    tc = cfg.train

    train_set, test_set, info = build_vae_datasets(cfg.data, tc.seed)
    cfg = resolve_vae_config(cfg, info)
    model = build_vae_model(cfg).to(device)
    # workers must see each epoch's crops (set_epoch): persistent workers would keep epoch 0's
    kw = dict(num_workers=cfg.data.num_workers, pin_memory=device.type == "cuda",
              persistent_workers=cfg.data.num_workers > 0 and not hasattr(train_set, "set_epoch"))
    gen = torch.Generator().manual_seed(0)
    train_loader = DataLoader(train_set, batch_size=tc.batch_size, shuffle=True, generator=gen, **kw)
    test_loader = make_test_loader(test_set, max(256, tc.batch_size), cfg.data.num_workers)
    opt = build_optimizer(model, tc, device)
    sched = build_scheduler(opt, tc, len(train_loader))

    lpips = None
    if tc.perceptual_weight > 0:
        from .metrics import LPIPS

        lpips = LPIPS(tc.vgg_weights, tc.lpips_weights, flags=("train.vgg_weights=FILE", "train.lpips_weights=FILE")).to(device)
    disc = dopt = None
    if tc.adv.start_step >= 0:
        disc = PatchDiscriminator(info.in_chans, tc.adv.channels, tc.adv.layers).to(device)
        dopt = torch.optim.Adam(disc.parameters(), lr=tc.adv.lr, betas=tuple(tc.adv.betas))

    baseline = mean_image_baseline(mean_image(train_set), test_loader)
    start_epoch, elapsed, step = 0, 0.0, 0
    if state is not None:
        ckpt_io.load_state(model, state["model"], out / "last.pt")
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        follow_config(opt, sched, tc, len(train_loader))
        if disc is not None and "disc" in state:
            disc.load_state_dict(state["disc"])
            dopt.load_state_dict(state["disc_optimizer"])
        start_epoch = state["epoch"]
        elapsed, step = state.get("train_seconds", 0.0), state.get("step", 0)
        ckpt_io.set_rng_state(state.get("rng"))
        run.truncate_metrics(start_epoch)
    run.write_config(to_yaml(cfg))
    cfg_dict = as_dict(cfg)

    apps = model.block_applications()
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model {cfg.model.name} ({model.cfg.operator} operator, {model.cfg.core} core, {n_params:,} params, "
        f"{apps['encoder']}+{apps['decoder']} block applications) on {info.name} "
        f"({info.n_train} train / {info.n_test} test, {info.img_size}x{info.img_size}), device {device}; "
        f"mean-image baseline PSNR {baseline['psnr']:.2f} dB (test set's own mean: {baseline['oracle_psnr']:.2f} dB)")
    metrics: Dict[str, float] = (state or {}).get("metrics", {})
    for epoch in range(start_epoch, tc.epochs):
        if hasattr(train_set, "set_epoch"):
            train_set.set_epoch(epoch)
        gen.manual_seed(tc.seed * 100_003 + epoch)  # the shuffle depends on (seed, epoch) only
        m, step = _train_one_epoch(model, train_loader, opt, sched, device, cfg, epoch, step, lpips, disc, dopt)
        elapsed += m["seconds"]
        metrics = {"epoch": epoch + 1, "step": step, "lr": sched.get_last_lr()[0], **m}
        if epoch + 1 == tc.epochs or (epoch + 1) % tc.eval_every == 0:
            ev = evaluate_vae(model, test_loader, device, tc.amp)
            metrics.update(test_psnr=ev["psnr"], test_ssim=ev["ssim"], test_l1=ev["l1"], test_kl=ev["kl"],
                           test_out_of_range=ev["out_of_range"])
        metrics.update(baseline_psnr=baseline["psnr"], baseline_oracle_psnr=baseline["oracle_psnr"], train_seconds=elapsed)
        run.append_metrics(metrics)
        if tb is not None:
            tb.add_epoch(metrics)  # TensorBoard (train.tensorboard=true): a copy of the metrics line
        record = {"format": ckpt_io.FORMAT, "task": TASK, "config": cfg_dict, "model": model.state_dict(),
                  "epoch": epoch + 1}
        last = {**record, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "train_seconds": elapsed, "step": step, "rng": ckpt_io.rng_state(), "metrics": metrics}
        if disc is not None:
            last.update(disc=disc.state_dict(), disc_optimizer=dopt.state_dict())
        run.save("last.pt", last)
        if "test_psnr" in metrics:
            log(f"epoch {epoch + 1:>3}/{tc.epochs}  loss {m['train_loss']:.4f}  recon {m['train_recon']:.4f}  "
                f"kl {m['train_kl']:.1f}  test_psnr {metrics['test_psnr']:.2f} dB  test_ssim {metrics['test_ssim']:.4f}  "
                f"{m['img_per_s']:.0f} img/s  {m['seconds']:.1f}s")
        if stop_after is not None and epoch + 1 >= stop_after:
            break
    return metrics


def _train_one_epoch(model, loader, opt, sched, device, cfg: VAERunConfig, epoch: int, step: int,
                     lpips: Optional[nn.Module], disc: Optional[nn.Module], dopt) -> tuple:
    model.train()
    tc = cfg.train
    sums = {"loss": 0.0, "recon": 0.0, "kl": 0.0, "lpips": 0.0, "g_adv": 0.0, "d_loss": 0.0}
    n, t0 = 0, time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{tc.epochs}", leave=False, disable=not show_progress(tc.progress), dynamic_ncols=True)
    for x in bar:
        x = x.to(device, non_blocking=True)
        adv_on = disc is not None and step >= tc.adv.start_step
        with autocast(device, tc.amp):
            xr, posts = model.reconstruct(x, sample=True)
        xr = xr.float()
        rec = recon_loss(xr, x, tc.recon)
        kl = kl_loss(posts).float()
        loss = rec + tc.kl_weight * kl / x[0].numel()
        if lpips is not None:
            p = lpips(xr, x).mean()
            loss = loss + tc.perceptual_weight * p
            sums["lpips"] += p.item() * len(x)
        if adv_on:
            disc.requires_grad_(False)
            g = g_hinge_loss(disc(xr))
            disc.requires_grad_(True)
            loss = loss + tc.adv.weight * g
            sums["g_adv"] += g.item() * len(x)
        if not torch.isfinite(loss):
            raise Diverged(loss.item(), epoch + 1, tc)
        optimizer_step(model, opt, sched, loss, tc.grad_clip)
        if adv_on:
            d = d_hinge_loss(disc(x), disc(xr.detach()))
            dopt.zero_grad(set_to_none=True)
            d.backward()
            dopt.step()
            sums["d_loss"] += d.item() * len(x)
        step += 1
        b = len(x)
        n += b
        sums["loss"] += loss.item() * b
        sums["recon"] += rec.item() * b
        sums["kl"] += kl.item() * b
        bar.set_postfix(loss=f"{sums['loss'] / n:.4f}", img_s=f"{n / (time.perf_counter() - t0):.0f}")
    secs = time.perf_counter() - t0
    m = {f"train_{k}": v / max(n, 1) for k, v in sums.items()
         if k in ("loss", "recon", "kl") or (k == "lpips" and lpips is not None) or (k in ("g_adv", "d_loss") and disc is not None)}
    m.update(img_per_s=n / secs, seconds=secs)
    return m, step


__all__ = ["train_vae", "resolve_vae_config"]
