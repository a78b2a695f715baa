"""A plain bViT as a STANDARD timm ViT, which timm loads with no recurvit installed.

    recurvit export RUN --format timm --out OUT [--rgb]
    timm.create_model("local-dir:OUT", pretrained=True)   # timm's own VisionTransformer: the run's logits

A bViT without step conditioning and without re-injection computes z_{t+1} = F(z_t) with ONE block F, T
times: that is exactly timm's ``VisionTransformer`` with ``depth=T`` whose every block is F. The export
writes that ViT: the shared block's weights copied into every ``blocks.i`` (i = 0..T-1), the embedding,
norms and head as they are, by timm's own ``save_for_hf`` (config.json with the architecture and
``model_args``, model.safetensors). The architecture is a timm entry point of the nearest width,
``vit_{tiny,small,base}_patch16_224``; ``model_args`` hold the real shape (``embed_dim``, ``depth`` = T,
``num_heads``, ``patch_size``, ``img_size``, ``in_chans``, ``num_classes``, ``class_token``,
``global_pool``, ``mlp_ratio``, ``qkv_bias``, ``init_values``, ``dynamic_img_size``, dropout rates), which
override the entry point's; ``pretrained_cfg`` holds the run's preprocessing, so timm's data pipeline
(``resolve_data_config(model=m)``, train.py, validate.py, inference.py) feeds it as the run was fed. A stack
ViT (``core="stack"``) IS timm's ViT already: it is written as it is, each block its own. Stage heads of deep
supervision are left out: at the trained depth the model reads out with ``head`` alone.

Before anything is written the timm model is built from those arguments and weights and its logits are
checked against the run's on a random batch: what is written is the run's function, not a guess at it.

Refused, in one line naming why (a UserError: the command exits 2): a core whose step is not one application
of a block (step conditioning, input re-injection, an ODE solver, a SoftMoR mixture), per-step adapters
(step-LoRA: export its unrolled.pt, a stack), a dense (per-pixel) head, rotary or no position embedding
(``pos_embed`` other than ``learned``), the Mix-FFN (``mlp_conv``), and a model that is not a vision
transformer (DeepThinking's conv net, LoopVAE).

``rgb=True``: the export takes 3-channel input: a grey model's patch convolution is adapted by timm's own
``adapt_input_conv`` (1 -> 3: the weights repeated and scaled by 1/3) and its mean / std repeated, so a grey
image read as RGB (R = G = B), as timm's scripts read images at their defaults (``in_chans=3``), gives the
run's logits. Without it timm's scripts need ``--in-chans 1`` for a grey run (timm adapts the convolution on
load but keeps the checkpoint's one-channel input size, so its loader would feed one channel).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn

from ..errors import UserError
from ..models.registry import WIDTHS
from ..run.checkpoint import check_finite
from ..run.load import load_model
from ..run.outputs import staged_dir
from .program import DATA_KEYS, preprocessing, rgb_channels

CHECK_ATOL = 1e-4  # the built timm model must give the run's logits within this (float32, the same op order)


def why_not_timm(model: nn.Module) -> Optional[str]:
    """Why ``model`` is not a ViT timm's ``VisionTransformer`` can hold (None: it is one)."""
    c = getattr(model, "cfg", None)
    if getattr(model, "patch_embed", None) is None or not hasattr(c, "core_cls"):
        return f"a {type(model).__name__} is not a vision transformer"
    spec = getattr(model, "adapter_spec", None)
    if spec:
        return ("per-step adapters (step-LoRA) make the steps different blocks: export its unrolled.pt, a stack"
                if int(spec.get("num_adapters", 1)) > 1 else "it carries LoRA adapters: export its best.pt (merged)")
    if c.dense:
        return "its dense head reads every patch token (per-pixel logits); timm's ViT reads one pooled token"
    if c.pos_embed != "learned":
        return f"pos_embed={c.pos_embed} is not timm's learned absolute position embedding"
    if c.mlp_conv:
        return "its Mix-FFN (mlp_conv) has a depthwise convolution timm's ViT block does not"
    if _block_of_step(c) is None:
        return (f"its {c.core_cls.describe(c)} core is not one block applied per step (step conditioning, "
                "re-injection, an ODE solver or a SoftMoR mixture has no place in timm's ViT)")
    return None


def _block_of_step(c) -> Optional[List[int]]:
    """The block each step applies, when step k is exactly ``blocks[j](z)``: the core's own answer
    (``unrollable``: a plain recurrence, ONE block every step), or a core that stores as many blocks as it
    applies (a stack: step k is block k). None: a step is something else."""
    core, T = c.core_cls, int(c.steps)
    if core.unrollable(c) and core.num_blocks(c) == 1:
        return [0] * T
    if not core.shares_blocks and core.num_blocks(c) == T:
        return list(range(T))
    return None


def architecture(c) -> str:
    """timm's ViT entry point of the nearest width; ``model_args`` give the real shape."""
    size = min(WIDTHS, key=lambda s: abs(WIDTHS[s][0] - c.embed_dim))
    return f"vit_{size}_patch16_224"


def timm_args(c, in_chans: int) -> Dict[str, Any]:
    """The model as timm ``VisionTransformer`` keyword arguments (depth: the unrolled steps)."""
    args = dict(img_size=c.img_size, patch_size=c.patch_size, in_chans=in_chans, num_classes=c.num_classes,
                embed_dim=c.embed_dim, depth=int(c.steps), num_heads=c.num_heads, mlp_ratio=c.mlp_ratio,
                qkv_bias=c.qkv_bias, class_token=c.class_token, global_pool=c.global_pool,
                init_values=c.init_values, drop_rate=c.drop_rate, drop_path_rate=c.drop_path,
                dynamic_img_size=c.dynamic_img_size or None)
    return {k: v for k, v in args.items() if v is not None}


def unrolled_state(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The model's weights under timm's ViT keys: step k's block as ``blocks.{k}`` (a copy of the shared one
    for every step of a recurrence), no stage heads."""
    steps = _block_of_step(model.cfg)
    own = model.state_dict()
    state = {k: v for k, v in own.items() if not k.startswith(("blocks.", "stage_heads."))}
    for i, j in enumerate(steps):
        prefix = f"blocks.{j}."
        state.update({f"blocks.{i}.{k[len(prefix):]}": v.clone() for k, v in own.items() if k.startswith(prefix)})
    return state


def _adapt_to_rgb(state: Dict[str, torch.Tensor], pre: Dict[str, Any], chans: int) -> None:
    """A grey model as a 3-channel one, in place: timm's ``adapt_input_conv`` on the patch convolution, the
    mean / std repeated."""
    from timm.models import adapt_input_conv

    if chans == 3:
        return
    key = "patch_embed.proj.weight"
    state[key] = adapt_input_conv(3, state[key], base_chans=chans)
    for k in ("mean", "std"):
        if k in pre and len(pre[k]) == 1:
            pre[k] = tuple(pre[k]) * 3
    pre["input_size"] = (3, *tuple(pre["input_size"])[1:])


def timm_vit(model: nn.Module, rgb: bool = False):
    """The run's model as timm's own ``VisionTransformer`` (``timm.create_model`` of :func:`architecture`
    with :func:`timm_args`), its weights and ``pretrained_cfg``; checked to give the model's logits.
    Returns (timm model, its arguments)."""
    import timm

    reason = why_not_timm(model)
    if reason is not None:
        raise UserError(f"--format timm writes a plain timm ViT and this model is not one: {reason} "
                        "(--format hf exports it for timm with recurvit installed)")
    c = model.cfg
    chans = rgb_channels(model) if rgb else c.in_chans
    args = timm_args(c, chans)
    state = unrolled_state(model)
    pre = {k: v for k, v in preprocessing(model).items() if k in DATA_KEYS}
    pre.setdefault("input_size", (c.in_chans, c.img_size, c.img_size))
    if rgb:
        _adapt_to_rgb(state, pre, c.in_chans)
    vit = timm.create_model(architecture(c), pretrained=False, **args)
    try:
        vit.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise UserError(f"timm's ViT does not hold this model's weights: {str(e).splitlines()[1].strip()}") from None
    vit.pretrained_cfg = {"architecture": architecture(c), **pre, "num_classes": c.num_classes,
                          "fixed_input_size": not c.dynamic_img_size,
                          "first_conv": "patch_embed.proj", "classifier": "head"}
    _check_logits(model, vit.eval(), chans)
    return vit, args


def _check_logits(model: nn.Module, vit: nn.Module, chans: int) -> None:
    """The timm model gives the run's logits on a random batch (a 3-channel copy of a grey batch for rgb)."""
    c = model.cfg
    x = torch.randn(2, c.in_chans, c.img_size, c.img_size, generator=torch.Generator().manual_seed(0))
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            ours, theirs = model(x), vit(x.expand(-1, chans, -1, -1) if chans != c.in_chans else x)
    finally:
        model.train(was)
    diff = (ours - theirs).abs().max().item()
    if not diff <= CHECK_ATOL:
        raise UserError(f"timm's ViT built from this model does not give its logits (max difference {diff:.2e}); "
                        "export it with --format hf")


def export_timm(run, out: Path, rgb: bool = False) -> Path:
    """``out``: a new folder with config.json and model.safetensors of a standard timm ViT (see the module
    docstring), written by ``timm.models.save_for_hf`` under a temporary name and renamed when complete.
    ``run``: anything ``recurvit.load_model`` reads, or a model instance (with its ``pretrained_cfg``)."""
    from timm.models import save_for_hf

    out = Path(out)
    model = run if isinstance(run, nn.Module) else load_model(run)
    check_finite(model, "the model" if isinstance(run, nn.Module) else run)
    model = model.cpu()
    vit, args = timm_vit(model, rgb)
    c = model.cfg
    cfg = getattr(model, "pretrained_cfg", None) or {}
    extra = {"label_names": list(cfg.get("label_names") or []),
             "recurvit_export": {"core": c.core_cls.describe(c), "steps": int(c.steps), "blocks_stored": c.core_cls.num_blocks(c),
                                 "rgb": bool(rgb), "data": cfg.get("recurvit_data")}}
    with staged_dir(out) as tmp:
        save_for_hf(vit, tmp, model_config=json.loads(json.dumps(extra, default=str)), model_args=args,
                    safe_serialization=True)
    return out
