"""The per-step analysis of a trained run (``recurvit analyze``): a fixed random subset of its test split, the
analyses asked for (:func:`~recurvit.analysis.per_step.analyze_model`, priced first), the fixed-point control
with pruning, their CSVs and plots (:mod:`~recurvit.analysis.per_step_report`) and summary.json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence

import torch

from ..errors import UserError
from ..run.outputs import write_text
from .budget import check_eval_cost
from .per_step import analyze_model, continuation
from .per_step_report import summarize, write_outputs
from .trained import open_classifier


class PerStepRun(NamedTuple):
    """What :func:`analyze_run` made: the title of its figures, its summary and the files it wrote."""

    label: str
    summary: dict
    files: List[str]


def _batches(test_set, num_images: int, batch_size: int):
    """(image, label) batches of a fixed random subset (seed 0) of ``num_images`` test images, in test order."""
    n = min(num_images, len(test_set))
    idx = torch.randperm(len(test_set), generator=torch.Generator().manual_seed(0))[:n].sort().values
    items = [test_set[int(i)] for i in idx]
    xs = torch.stack([x for x, _ in items])
    ys = torch.tensor([y for _, y in items])
    return [(xs[i:i + batch_size], ys[i:i + batch_size]) for i in range(0, n, batch_size)], n


def analyze_run(path: Path, what: Sequence[str], num_images: int = 512, steps: Optional[int] = None,
                mlp_slices: Optional[int] = None, batch_size: int = 256, out: Optional[Path] = None,
                device: str = "auto", data_root: Optional[str] = None, force: bool = False,
                progress: bool = True) -> PerStepRun:
    """The analyses ``what`` of the run at ``path`` at ``steps`` (default: trained), MLP hidden units cut into
    ``mlp_slices`` (default: heads), on ``num_images`` test images; their files and summary.json written into
    ``out`` (default RUN_DIR/analysis). ``force`` runs work estimated far beyond this machine."""
    path = Path(path)
    model, cfg, dev, test_loader, _ = open_classifier(path, device, data_root)
    if steps is not None:
        try:
            model.core.check_steps(steps)
        except ValueError as e:
            raise UserError(f"--steps: {e}") from None
    hidden = model.blocks[0].mlp.fc1.out_features
    if mlp_slices is not None and not 1 <= mlp_slices <= hidden:
        raise UserError(f"--mlp-slices must be in 1..{hidden}, got {mlp_slices}")
    batches, n = _batches(test_loader.dataset, num_images, batch_size)
    K = model.core.check_steps(steps)
    # one pass of K steps, plus (pruning) one per step and masked unit (heads, MLP slices, the whole block)
    # and one for the fixed-point control
    heads = model.blocks[0].attn.num_heads
    passes = 1 + (K * (heads + (mlp_slices or heads) + 1) + 1 if "pruning" in what else 0)
    check_eval_cost(model, batches[0][0].to(dev), K, len(batches) * passes, keeps_states=True, force=force)
    res = analyze_model(model, batches, what, steps=steps, mlp_slices=mlp_slices, device=dev, progress=progress)
    if "pruning" in what and K >= 2:  # the fixed-point control: the last update continued from the previous one
        res["pruning"]["continuation"] = continuation(model, batches, steps=K, device=dev)
    out = out or ((path if path.is_dir() else path.parent) / "analysis")
    label = (f"{cfg.model.name} ({model.cfg.core_cls.describe(model.cfg)}, {res['meta']['steps']} steps) on "
             f"{cfg.data.name}, {n} test images")
    files = write_outputs(res, out, title=label)
    summary = {"run": str(path), "model": cfg.model.name, **summarize(res), "images": n,
               "calls_per_step": res["meta"]["calls_per_step"], "out": str(out)}
    # atomically, and only over a summary.json of analyze's (never through a link planted in the run folder)
    write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n", b'{\n  "run": ', "summary")
    files.append(str(out / "summary.json"))
    return PerStepRun(label, summary, files)


def summary_lines(summary: dict) -> List[str]:
    """The summary in words, a line per figure it holds (what ``recurvit analyze`` prints under the title)."""
    lines = []
    if "acc_per_step" in summary:
        lines.append(f"  readout accuracy per step: {' '.join(f'{a:.3f}' for a in summary['acc_per_step'])}")
    if "rel_update" in summary:
        lines.append(f"  relative update per step:  {' '.join(f'{a:.3f}' for a in summary['rel_update'])}")
    if "attn_distance_per_step" in summary:
        lines.append(f"  attention distance (patches, mean over heads): "
                     f"{' '.join(f'{a:.2f}' for a in summary['attn_distance_per_step'])}")
    if "cka_tokens" in summary:
        c = summary["cka_tokens"]
        lines.append(f"  CKA between steps (tokens): mean off-diagonal {c['mean_offdiag']:.3f}, min {c['min']:.3f}, "
                     f"adjacent {c['adjacent_mean']:.3f}, first vs last {c['first_last']:.3f}")
    if "heads_top" in summary:
        t, m = summary["heads_top"], summary["mlp_top"]
        lines.append(f"  pruning: base acc {summary['base_acc']:.3f}; worst head mask: step {t['step']} head "
                     f"{t['head']} (-{t['drop']:.3f}); worst MLP slice: step {m['step']} slice {m['slice']} "
                     f"(-{m['drop']:.3f}); skip drops {' '.join(f'{d:.3f}' for d in summary['skip_drop'])}")
    if summary.get("split_half_r") is not None:
        lines.append(f"  step-specific pruning map, split-half correlation (even vs odd images; ~0: the same units "
                     f"in the same proportions at every step): {summary['split_half_r']:+.3f}")
    if "continue_drop" in summary:
        lines.append(f"  last step continued from the previous one (fixed-point control): "
                     f"-{summary['continue_drop']:.3f}")
    return lines


__all__ = ["PerStepRun", "analyze_run", "summary_lines"]
