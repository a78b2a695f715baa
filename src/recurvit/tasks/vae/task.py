"""LoopVAE training: the task ``recurvit vae train`` trains, through the one loop (train/fit.py).

Same run directory, checkpoint and resume rules as classification (config.yaml, metrics.jsonl
with one line per epoch, atomic last.pt, ``--resume`` continues from last.pt with optimizer,
scheduler, discriminator and RNG state). There is no best.pt: a LoopVAE run has no validation
split, and an epoch chosen on the test PSNR would report a test-selected number; evaluation reads
the last epoch.

Under torchrun the run is data-parallel as classification is (``train.batch_size`` is the global
batch, every rank takes its shard of the single process's batches, the test figures are global
sums). The posterior samples of a step are drawn on each rank (as dropout is), so a run matches
one process exactly with ``train.sample=false`` and in distribution otherwise; the adversarial
stage trains in one process only.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, Optional

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler
from tqdm.auto import tqdm

from ...errors import UserError
from ...run import checkpoint as ckpt_io, distributed as dist_io
from ...run.device import autocast
from ...run.progress import bar_options
from ...train.checks import Diverged
from ...train.fit import fit
from ...train.optim import build_optimizer, build_scheduler, optimizer_step
from ...train.tensorboard import require_tensorboard
from ..base import Task
from .config import VAERunConfig, as_dict, config_from_dict, to_yaml
from .data import build_vae_datasets, mean_image
from .evaluate import TASK, build_vae_model, evaluate_vae, make_test_loader, mean_image_baseline, read_vae
from .losses import PatchDiscriminator, d_hinge_loss, g_hinge_loss, kl_loss, recon_loss
from .metrics import LPIPS


def resolve_vae_config(cfg: VAERunConfig, info) -> VAERunConfig:
    """The model follows the data set (img_size, in_chans) unless set explicitly."""
    m = cfg.model
    m = replace(m, img_size=m.img_size if m.img_size is not None else info.img_size,
                in_chans=m.in_chans if m.in_chans is not None else info.in_chans)
    return replace(cfg, model=m)


class Reconstruct(nn.Module):
    """``forward(x)`` = (reconstruction, KL loss): what DDP wraps, so the gradient all-reduce is prepared."""

    def __init__(self, model: nn.Module, sample: bool = True):
        super().__init__()
        self.model, self.sample = model, sample

    def forward(self, x):
        xr, posts = self.model.reconstruct(x, sample=self.sample)
        with torch.autocast(x.device.type, enabled=False):  # the KL in the posteriors' own precision
            return xr, kl_loss(posts)


class VAETask(Task):
    """Images -> reconstructions: L1/L2 + KL (+ LPIPS, + a patch discriminator's hinge loss)."""

    name = TASK
    reader = ckpt_io.Reader(read_vae, use="recurvit vae eval")  # not a classifier: eval / predict / export refuse it

    def config_dict(self):
        return as_dict(self.cfg)

    def config_yaml(self):
        return to_yaml(self.cfg)

    def checkpoint_config(self, state):
        return as_dict(config_from_dict(state["config"]))

    def check(self):
        t = self.cfg.train
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
        if t.adv.start_step >= 0 and dist_io.launched_world_size() > 1:
            raise UserError("the adversarial stage (train.adv.start_step >= 0) trains in one process; "
                            "run it without torchrun")

    def setup(self, env, device, log, force=False):
        tc = self.cfg.train
        if tc.threads > 0:
            torch.set_num_threads(tc.threads)
        self.device = device
        self.train_set, test_set, self.info = env.main_first(lambda: build_vae_datasets(self.cfg.data, tc.seed))
        self.cfg = cfg = resolve_vae_config(self.cfg, self.info)
        self.model = build_vae_model(cfg).to(device)
        # workers must see each epoch's crops (set_epoch): persistent workers would keep epoch 0's
        kw = dict(num_workers=cfg.data.num_workers, pin_memory=device.type == "cuda",
                  persistent_workers=cfg.data.num_workers > 0 and not hasattr(self.train_set, "set_epoch"))
        self.gen = torch.Generator().manual_seed(0)
        if env.enabled:  # every rank: its positions of the single process's batches (distributed.py)
            batches = dist_io.ShardedBatches(RandomSampler(self.train_set, generator=self.gen), tc.batch_size,
                                             env.rank, env.world_size)
            self.train_loader = DataLoader(self.train_set, batch_sampler=batches, generator=self.gen, **kw)
            shard = dist_io.Shard(len(test_set), env.rank, env.world_size)
            self.test_loader = DataLoader(test_set, batch_size=max(256, tc.batch_size), sampler=shard,
                                          num_workers=cfg.data.num_workers)
        else:
            self.train_loader = DataLoader(self.train_set, batch_size=tc.batch_size, shuffle=True, generator=self.gen,
                                           **kw)
            self.test_loader = make_test_loader(test_set, max(256, tc.batch_size), cfg.data.num_workers)
        self.steps_per_epoch = len(self.train_loader)
        self.opt = build_optimizer(self.model, tc, device)
        self.sched = build_scheduler(self.opt, tc, self.steps_per_epoch)
        self.lpips = None
        if tc.perceptual_weight > 0:
            self.lpips = LPIPS(tc.vgg_weights, tc.lpips_weights,
                               flags=("train.vgg_weights=FILE", "train.lpips_weights=FILE")).to(device)
        self.disc = self.dopt = None
        if tc.adv.start_step >= 0:
            self.disc = PatchDiscriminator(self.info.in_chans, tc.adv.channels, tc.adv.layers).to(device)
            self.dopt = torch.optim.Adam(self.disc.parameters(), lr=tc.adv.lr, betas=tuple(tc.adv.betas))
        whole = self.test_loader if not env.enabled else make_test_loader(test_set, max(256, tc.batch_size))
        self.baseline = mean_image_baseline(mean_image(self.train_set), whole)
        self.step = 0

    def restore(self, state, env):
        if self.disc is not None and "disc" in state:
            self.disc.load_state_dict(state["disc"])
            self.dopt.load_state_dict(state["disc_optimizer"])
        self.step = state.get("step", 0)

    def extra_state(self, env):
        extra = {"step": self.step}
        if self.disc is not None:
            extra.update(disc=self.disc.state_dict(), disc_optimizer=self.dopt.state_dict())
        return extra

    def prepare_training(self, env, device, log, force=False):
        wrapped = Reconstruct(self.model, self.cfg.train.sample)
        self.forward = dist_io.wrap_ddp(wrapped, device) if env.enabled else wrapped

    def header(self, env, device):
        cfg, info, model, b = self.cfg, self.info, self.model, self.baseline
        apps = model.block_applications()
        n_params = sum(p.numel() for p in model.parameters())
        where = f"device {device}" if not env.enabled else f"{env.world_size} processes ({device.type}, DDP)"
        return (f"model {cfg.model.name} ({model.cfg.operator} operator, {model.cfg.core} core, {n_params:,} params, "
                f"{apps['encoder']}+{apps['decoder']} block applications) on {info.name} "
                f"({info.n_train} train / {info.n_test} test, {info.img_size}x{info.img_size}), {where}; "
                f"mean-image baseline PSNR {b['psnr']:.2f} dB (test set's own mean: {b['oracle_psnr']:.2f} dB)")

    def start_epoch(self, epoch):
        if hasattr(self.train_set, "set_epoch"):
            self.train_set.set_epoch(epoch)
        self.gen.manual_seed(self.cfg.train.seed * 100_003 + epoch)  # the shuffle depends on (seed, epoch) only

    def train_epoch(self, epoch, env):
        m, self.step = _train_one_epoch(self.forward, self.model, self.train_loader, self.opt, self.sched, self.device,
                                        self.cfg, epoch, self.step, self.lpips, self.disc, self.dopt, env)
        b = self.baseline
        return {"step": self.step, "lr": self.sched.get_last_lr()[0], **m, "baseline_psnr": b["psnr"],
                "baseline_oracle_psnr": b["oracle_psnr"]}

    def evaluate(self, env):
        ev = evaluate_vae(self.model, self.test_loader, self.device, self.cfg.train.amp, env=env)
        return dict(test_psnr=ev["psnr"], test_ssim=ev["ssim"], test_l1=ev["l1"], test_kl=ev["kl"],
                    test_out_of_range=ev["out_of_range"])

    def epoch_line(self, metrics):
        if "test_psnr" not in metrics:
            return None
        return (f"epoch {metrics['epoch']:>3}/{self.cfg.train.epochs}  loss {metrics['train_loss']:.4f}  "
                f"recon {metrics['train_recon']:.4f}  kl {metrics['train_kl']:.1f}  test_psnr "
                f"{metrics['test_psnr']:.2f} dB  test_ssim {metrics['test_ssim']:.4f}  "
                f"{metrics['img_per_s']:.0f} img/s  {metrics['seconds']:.1f}s")


def train_vae(cfg: VAERunConfig, out: Path, resume: bool = False, log: Callable = print,
              stop_after: Optional[int] = None) -> Dict[str, float]:
    """Train ``cfg`` into run directory ``out`` (or continue it from last.pt); returns the last metrics.

    ``stop_after=k`` stops after epoch k as an interruption would (the run can be resumed)."""
    return fit(VAETask(cfg), out, resume=resume, log=log, stop_after=stop_after)


def _train_one_epoch(forward, model, loader, opt, sched, device, cfg: VAERunConfig, epoch: int, step: int,
                     lpips: Optional[nn.Module], disc: Optional[nn.Module], dopt,
                     env: dist_io.DistEnv = dist_io.SINGLE) -> tuple:
    """One pass over ``loader``; ``forward`` gives (reconstruction, KL) (the DDP module under
    several processes). Returns (the epoch's figures, the global step count)."""
    model.train()
    tc = cfg.train
    sums = {"loss": 0.0, "recon": 0.0, "kl": 0.0, "lpips": 0.0, "g_adv": 0.0, "d_loss": 0.0}
    n, t0 = 0, time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{tc.epochs}", leave=False, **bar_options(tc.progress and env.is_main))
    for x in bar:
        x = x.to(device, non_blocking=True)
        adv_on = disc is not None and step >= tc.adv.start_step
        with autocast(device, tc.amp):
            xr, kl = forward(x)
        xr = xr.float()
        rec = recon_loss(xr, x, tc.recon)
        kl = kl.float()
        loss = rec + tc.kl_weight * kl / x[0].numel()
        terms = {}
        if lpips is not None:
            terms["lpips"] = lpips(xr, x).mean()
            loss = loss + tc.perceptual_weight * terms["lpips"]
        if adv_on:
            disc.requires_grad_(False)
            terms["g_adv"] = g_hinge_loss(disc(xr))
            disc.requires_grad_(True)
            loss = loss + tc.adv.weight * terms["g_adv"]
        b = len(x)
        figures = {"loss": loss.detach(), "recon": rec.detach(), "kl": kl.detach(), **{k: v.detach() for k, v in terms.items()}}
        if env.enabled:  # global figures of this step; every rank sees the same (divergence stops all)
            *values, b = env.all_reduce_sum([v * b for v in figures.values()] + [b], device)
            b = int(round(b))
            figures = {k: v / max(b, 1) for k, v in zip(figures, values)}
        else:
            figures = {k: v.item() for k, v in figures.items()}
        if not torch.isfinite(torch.tensor(figures["loss"])):
            raise Diverged(figures["loss"], epoch + 1, tc)
        optimizer_step(model, opt, sched, loss, tc.grad_clip)
        if adv_on:
            d = d_hinge_loss(disc(x), disc(xr.detach()))
            dopt.zero_grad(set_to_none=True)
            d.backward()
            dopt.step()
            figures["d_loss"] = d.item()
        step += 1
        n += b
        for k, v in figures.items():
            sums[k] += v * b
        bar.set_postfix(loss=f"{sums['loss'] / n:.4f}", img_s=f"{n / (time.perf_counter() - t0):.0f}")
    secs = time.perf_counter() - t0
    m = {f"train_{k}": v / max(n, 1) for k, v in sums.items()
         if k in ("loss", "recon", "kl") or (k == "lpips" and lpips is not None) or (k in ("g_adv", "d_loss") and disc is not None)}
    m.update(img_per_s=n / secs, seconds=secs)
    return m, step
