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

from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, RandomSampler

from ...errors import UserError
from ...run import checkpoint as ckpt_io, distributed as dist_io
from ...train.fit import fit
from ...train.loop import Step
from ...train.optim import build_optimizer, build_scheduler
from ...train.tensorboard import require_tensorboard
from ..base import Task
from .config import VAERunConfig, as_dict, config_from_dict
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

    def train_step(self, batch, amp):
        """Reconstruction + KL (+ LPIPS, + the generator's hinge loss once the adversarial stage is on) of one
        batch; the discriminator's own step runs after the model's (``Step.after``)."""
        tc, disc = self.cfg.train, self.disc
        x = batch.to(self.device, non_blocking=True)
        adv_on = disc is not None and self.step >= tc.adv.start_step
        with amp():
            xr, kl = self.forward(x)
        xr = xr.float()
        rec = recon_loss(xr, x, tc.recon)
        kl = kl.float()
        loss = rec + tc.kl_weight * kl / x[0].numel()
        means = {"loss": loss.detach(), "recon": rec.detach(), "kl": kl.detach()}
        if self.lpips is not None:
            lp = self.lpips(xr, x).mean()
            means["lpips"] = lp.detach()
            loss = loss + tc.perceptual_weight * lp
            means["loss"] = loss.detach()
        if adv_on:
            disc.requires_grad_(False)
            g = g_hinge_loss(disc(xr))
            disc.requires_grad_(True)
            means["g_adv"] = g.detach()
            loss = loss + tc.adv.weight * g
            means["loss"] = loss.detach()
        self.step += 1

        def discriminator_step():
            d = d_hinge_loss(disc(x), disc(xr.detach()))
            self.dopt.zero_grad(set_to_none=True)
            d.backward()
            self.dopt.step()
            return {"d_loss": d.item()}

        return Step(loss, len(x), means, after=discriminator_step if adv_on else None)

    def progress(self, totals):
        return {"loss": f"{totals.mean('loss'):.4f}"}

    def epoch_metrics(self, totals, seconds):
        b = self.baseline
        shown = ["loss", "recon", "kl"] + ["lpips"] * (self.lpips is not None) + ["g_adv", "d_loss"] * (self.disc is not None)
        return {"step": self.step, "lr": self.sched.get_last_lr()[0], **{f"train_{k}": totals.mean(k) for k in shown},
                "img_per_s": totals.n / seconds, "seconds": seconds, "baseline_psnr": b["psnr"],
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


def train_vae_run(cfg: VAERunConfig, out: Optional[Path], resume: bool = False,
                  log: Callable = print) -> Tuple[Optional[Path], Dict[str, float]]:
    """:func:`train_vae`, returning (the run directory, the last metrics); the run directory is None on every
    rank of a process group but the one that writes it."""
    task = VAETask(cfg)
    metrics = fit(task, out, resume=resume, log=log)
    return (task.run_dir if dist_io.launched_main() else None), metrics
