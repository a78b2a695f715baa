"""Runtime profile (`recurvit vae profile`): stored parameters against time per image and FLOPs,
per operator, for

- ``loopvae_<op>``: the LoopVAE (one shared core per encoder / decoder);
- ``unshared_<op>``: the reference with the same execution graph and independent blocks at every
  application (same FLOPs, ~``applications / depth`` times the stored block parameters);
- ``matched_<op>`` (``matched=True``): a conventional unshared VAE with the LoopVAE's stored
  parameter budget, i.e. as many block applications per side as the core has blocks
  (``depth=1``, ``depth`` loops spread over the scales): what the same stored weights cost
  without recurrence.

FLOPs are counted by :func:`recurvit.analysis.accounting.measure_flops` (torch's flop counter:
matmuls and convolutions, 2 per multiply-add, per image); times are the minimum over ``repeats``
timed batches after ``warmup`` untimed ones (the fastest: least disturbed by other jobs on a
shared machine), divided by the batch size: ``ms_forward`` is an
inference reconstruction (no grad, posterior mean), ``ms_train`` a training step (forward,
backward and an SGD update) per image.
"""
from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ... import tables
from ...analysis.accounting import count_params, measure_flops
from ...errors import UserError
from ...models import model_config
from ...run.device import pick_device
from ...run.outputs import output_dir
from .config import VAERunConfig, apply_overrides, config_from_dict, default_config_path, load_vae_config
from .evaluate import build_vae_model

COLUMNS = ["model", "operator", "core", "params_stored", "params_effective", "block_applications",
           "flops_forward", "flops_train", "ms_forward", "ms_train", "batch", "img_size", "embed_dim",
           "device", "threads"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _spread(total: int, scales: int) -> List[int]:
    """``total`` loops over ``scales`` scales, at least one each, extra ones on the coarsest scales."""
    total = max(total, scales)
    base = [total // scales] * scales
    for i in range(total - sum(base)):
        base[-1 - i] += 1
    return base


class _Case:
    """One model with its timed forward (inference) and training step."""

    def __init__(self, model: torch.nn.Module, batch: int, device: torch.device):
        self.model = model
        mc = model.cfg
        self.x = torch.randn(batch, mc.in_chans, mc.img_size, mc.img_size, device=device)
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-9)
        self.device = device

    def forward(self) -> None:
        self.model.eval()
        with torch.no_grad():
            self.model(self.x, sample=False)

    def step(self) -> None:
        self.model.train()
        loss = (self.model(self.x, sample=True) - self.x).abs().mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def time(self, fn) -> float:
        _sync(self.device)
        t = time.perf_counter()
        fn()
        _sync(self.device)
        return time.perf_counter() - t


def profile_models(cfg: VAERunConfig, operators: Sequence[str] = ("conv", "transformer"),
                   matched: bool = True, batch: int = 16, repeats: int = 5,
                   warmup: int = 2, device: str = "cpu") -> List[Dict[str, Any]]:
    """Rows loopvae / unshared (/ matched) per operator, every other model option as in ``cfg.model``.

    The models are timed round-robin (repeat r of every model, then repeat r + 1, ...), so a slow
    phase of a shared machine or a warm-up effect does not fall on one model only."""
    dev = pick_device(device)  # auto, cpu, cuda[:N]: the CLI's one device rule
    rows, cases = [], []
    for op in operators:
        variants = [("loopvae", {"core": "shared"}), ("unshared", {"core": "unshared"})]
        if matched:
            base = model_config(cfg.model.name, **{k: v for k, v in asdict(cfg.model).items()
                                                   if k != "name" and v is not None})
            variants.append(("matched", {"core": "unshared", "depth": 1, "decoder_loops": None,
                                         "loops": _spread(base.depth, base.num_scales)}))
        for label, change in variants:
            c = replace(cfg, model=replace(cfg.model, operator=op, **change))
            model = build_vae_model(c).to(dev)
            mc = model.cfg
            flops = measure_flops(model, (mc.in_chans, mc.img_size, mc.img_size), batch=1)
            counts = count_params(model, block_uses=flops["block_uses"])
            rows.append({"model": f"{label}_{op}", "operator": op, "core": mc.core,
                         "params_stored": counts["params_stored"], "params_effective": counts["params_effective"],
                         "block_applications": model.block_applications()["total"],
                         "flops_forward": flops["flops_forward"], "flops_train": flops["flops_train"],
                         "batch": batch, "img_size": mc.img_size, "embed_dim": mc.embed_dim, "device": str(dev),
                         "threads": torch.get_num_threads()})
            cases.append(_Case(model, batch, dev))
    for kind in ("forward", "step"):
        best = [float("inf")] * len(cases)
        for r in range(warmup + repeats):
            for i, case in enumerate(cases):
                t = case.time(getattr(case, kind))
                if r >= warmup:
                    best[i] = min(best[i], t)
        for row, t in zip(rows, best):
            row["ms_forward" if kind == "forward" else "ms_train"] = 1000 * t / batch
    return rows


def write_csv(rows: List[Dict[str, Any]], path: str | Path) -> Path:
    return tables.write_csv(rows, path, COLUMNS)


def profile_csv(out: Optional[str | Path], target: Optional[str | Path],
                note: Optional[Callable[[str, str], None]] = None) -> Path:
    """Where ``vae profile`` writes: OUT/vae_profile.csv; OUT defaults to the run directory profiled, else a
    new runs/vae_profile-<time> (an ``out`` ending in .csv, the old spelling, is that file; ``note(old, new)``
    is then told the spelling to use instead)."""
    if out is not None and Path(out).suffix == ".csv":
        if note is not None:
            note("--out FILE.csv", f"--out {Path(out).parent} (a folder; the file is vae_profile.csv)")
        return output_dir(Path(out).parent) / Path(out).name
    if out is None:
        out = Path(target) if target is not None and Path(target).is_dir() else \
            Path("runs") / f"vae_profile-{time.strftime('%Y%m%d-%H%M%S')}"
    return output_dir(Path(out)) / "vae_profile.csv"


def profile_config(target: Optional[str | Path], overrides: Sequence[str]) -> VAERunConfig:
    """The config profiled: a run directory's (from its checkpoint), a YAML file's or the embedded default's,
    with ``overrides``."""
    if target is not None and Path(target).is_dir():
        from ...run import checkpoint as ckpt_io

        ckpt = ckpt_io.load_checkpoint(ckpt_io.resolve_checkpoint(target))
        return apply_overrides(config_from_dict(ckpt["config"]), list(overrides))
    return load_vae_config(target or default_config_path(), list(overrides))


def profile_vae(target: Optional[str | Path] = None, overrides: Sequence[str] = (), operators: str = "conv,transformer",
                matched: bool = True, batch: int = 16, repeats: int = 5, device: str = "auto", threads: int = 0,
                out: Optional[str | Path] = None, note: Optional[Callable[[str, str], None]] = None) -> Dict[str, Any]:
    """:func:`profile_models` of a config or run directory (``target``, with ``overrides``) for the comma-separated
    ``operators``, on ``threads`` CPU threads (0: torch's default), written to :func:`profile_csv` ``(out,
    target)``. Returns ``{"csv", "rows"}`` as ``recurvit vae profile --json`` prints it."""
    from .data import build_vae_datasets
    from .task import resolve_vae_config

    cfg = profile_config(target, overrides)
    ops = [o.strip() for o in operators.split(",") if o.strip()]
    if not ops or any(o not in ("conv", "transformer") for o in ops):
        raise UserError(f"--operators takes conv and/or transformer, got '{operators}'")
    if batch < 1 or repeats < 1:
        raise UserError("--batch-size and --repeats must be >= 1")
    if threads > 0:
        torch.set_num_threads(threads)
    if cfg.model.img_size is None or cfg.model.in_chans is None:
        _, _, info = build_vae_datasets(cfg.data, cfg.train.seed)
        cfg = resolve_vae_config(cfg, info)
    rows = profile_models(cfg, ops, matched=matched, batch=batch, repeats=repeats, device=device)
    return {"csv": str(write_csv(rows, profile_csv(out, target, note))), "rows": rows}


__all__ = ["COLUMNS", "profile_models", "write_csv", "profile_csv", "profile_config", "profile_vae"]
