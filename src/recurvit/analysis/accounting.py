"""What a model costs: parameters, FLOPs and training memory.

Conventions (shared by every function here):

- **Parameters.** ``params`` is ``sum(p.numel() for p in model.parameters())`` (PyTorch already
  drops a Parameter object that is registered twice). ``params_stored`` additionally deduplicates
  distinct Parameter objects that are views of the same storage (tied weights), so it is the
  number of values the model really keeps in memory. ``params_effective`` counts each block once
  per application: the size of the equivalent unshared network (a 12-step bViT has the
  ``params_effective`` of the 12-block ViT of the same width). ``param_bytes`` is the stored size
  in bytes, with the split per dtype in ``param_bytes_by_dtype``.
- **FLOPs.** Those of ``torch.utils.flop_counter.FlopCounterMode``: 2 FLOPs per multiply-add,
  only matmuls, convolutions and attention (SDPA = its two matmuls, q k^T and P v) are counted;
  norms, activations, softmax, biases and residual adds are not. Figures are per image. On CPU
  ``F.scaled_dot_product_attention`` runs a kernel the stock counter does not know
  (``_scaled_dot_product_flash_attention_for_cpu``); it is counted here with the same formula the
  counter uses for the CUDA kernels, so CPU and CUDA counts agree.
- **Training FLOPs** are forward + backward of a cross-entropy loss, gradients taken with respect
  to every trainable parameter (not the input image, as in training).
- **Training memory.** See :func:`~recurvit.analysis.memory.peak_train_memory`: on CUDA the measured peak of the caching
  allocator, on CPU the bytes of the tensors autograd saves for the backward pass.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from ..models.registry import create_model
from ..models.vit import ViTConfig
from .memory import peak_train_memory
from .passes import InputShape, backward_into_params, in_mode, model_device_dtype, probe_loss, run_forward


_aten = torch.ops.aten


# ----------------------------------------------------------------------------------- parameters
def _storage_key(t: torch.Tensor) -> Tuple[Any, ...]:
    """Identity of the values a tensor holds: equal keys mean the same memory (tied weights)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        ptr = 0
    if ptr == 0:  # meta / storage-less tensors: only the object itself identifies them
        return ("id", id(t))
    return (str(t.device), ptr, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _unique_params(module: nn.Module) -> List[torch.Tensor]:
    seen, out = set(), []
    for p in module.parameters():
        key = _storage_key(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _blocks(model: nn.Module) -> Optional[nn.ModuleList]:
    blocks = getattr(model, "blocks", None)
    return blocks if isinstance(blocks, nn.ModuleList) and len(blocks) > 0 else None


def _default_block_uses(model: nn.Module) -> Optional[List[int]]:
    """Applications of each block at the trained depth, where the core knows them from its config."""
    cfg = getattr(model, "cfg", None)
    if getattr(cfg, "core", None) is None or _blocks(model) is None or not hasattr(cfg, "core_cls"):
        return None
    return cfg.core_cls.block_uses(cfg)  # None: data-dependent (adaptive ODE): measure_flops counts them


def count_params(model: nn.Module, block_uses: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Parameter counts and bytes of ``model``.

    Returns ``params`` (``sum(p.numel() for p in model.parameters())``), ``params_stored``
    (values really stored: Parameters sharing storage counted once), ``params_effective``
    (parameters outside ``model.blocks`` + each block's parameters times its number of
    applications: the size of the equivalent unshared network), ``params_blocks`` (stored
    parameters inside ``model.blocks``), ``param_bytes`` (stored bytes) and
    ``param_bytes_by_dtype`` ({"float32": bytes, ...}).

    ``block_uses[i]`` is how often ``model.blocks[i]`` runs in one forward pass. By default it is
    asked of the model's core (``core_cls.block_uses(cfg)``); where it depends on the data
    (adaptive ODE solvers) pass the ``block_uses`` returned by :func:`measure_flops`, otherwise
    ``params_effective`` is None.
    """
    unique = _unique_params(model)
    params_stored = sum(p.numel() for p in unique)
    by_dtype: Counter = Counter()
    for p in unique:
        by_dtype[str(p.dtype).replace("torch.", "")] += p.numel() * p.element_size()

    blocks = _blocks(model)
    uses = list(block_uses) if block_uses is not None else _default_block_uses(model)
    params_blocks = sum(p.numel() for p in _unique_params(blocks)) if blocks is not None else 0
    params_effective: Optional[int] = None
    if blocks is None:
        params_effective = params_stored
    elif uses is not None:
        if len(uses) != len(blocks):
            raise ValueError(f"block_uses has {len(uses)} entries for {len(blocks)} blocks")
        per_block = [sum(p.numel() for p in _unique_params(b)) for b in blocks]
        params_effective = params_stored - params_blocks + sum(n * u for n, u in zip(per_block, uses))
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "params_stored": params_stored,
        "params_effective": params_effective,
        "params_blocks": params_blocks,
        "param_bytes": sum(by_dtype.values()),
        "param_bytes_by_dtype": dict(by_dtype),
    }


# ---------------------------------------------------------------------------------------- FLOPs
def _sdpa_forward_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """softmax(q k^T) v as two batched matmuls: (Tq x d)(d x Tk) and (Tq x Tk)(Tk x dv), per head."""
    b, h, tq, dq = query_shape
    tk, dv = key_shape[-2], value_shape[-1]
    return 2 * b * h * tq * tk * (dq + dv)


def _sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                         **kwargs) -> int:
    """Backward of SDPA as five matmuls: recomputed scores q k^T, dP = dO v^T, dV = P^T dO,
    dQ = dS k and dK = dS^T q (torch's convention for its fused kernels)."""
    b, h, tq, dq = query_shape
    tk, dv = key_shape[-2], value_shape[-1]
    return 2 * b * h * tq * tk * (3 * dq + 2 * dv)


def _extra_flop_formulas() -> Dict[Any, Any]:
    """SDPA kernels the stock counter does not know (CPU flash, out-of-tree backends)."""
    pairs = [
        ("_scaled_dot_product_flash_attention_for_cpu", _sdpa_forward_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_backward_flops),
        ("_scaled_dot_product_fused_attention_overrideable", _sdpa_forward_flops),
        ("_scaled_dot_product_fused_attention_overrideable_backward", _sdpa_backward_flops),
    ]
    return {getattr(_aten, name): fn for name, fn in pairs if hasattr(_aten, name)}


def flop_counter() -> FlopCounterMode:
    """A silent ``FlopCounterMode`` that also counts the CPU attention kernel."""
    return FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas())


@contextmanager
def _count_calls(modules: Optional[nn.ModuleList]) -> Iterator[List[int]]:
    """Counts the calls of each module in ``modules`` while the context is open."""
    counts = [0] * (len(modules) if modules is not None else 0)
    handles = []
    for i, m in enumerate(modules or []):
        def hook(_m, _inp, i=i):
            counts[i] += 1
        handles.append(m.register_forward_pre_hook(hook))
    try:
        yield counts
    finally:
        for h in handles:
            h.remove()


def _per_image(total: int, batch: int) -> int:
    return total // batch if total % batch == 0 else round(total / batch)


def measure_flops(model: nn.Module, input_shape: InputShape, steps: Optional[int] = None,
                  batch: int = 1, train: bool = True) -> Dict[str, Any]:
    """Counted FLOPs per image of one forward pass and one training step (forward + backward).

    Runs ``model`` on a random batch of shape ``(batch, *input_shape)`` on the model's device and
    dtype (a model on the ``meta`` device works too: only shapes are needed). ``steps`` is passed
    to the forward as ``model(x, steps=steps)`` when given. Returns ``flops_forward``,
    ``flops_train`` (None if nothing is trainable or ``train=False``), ``flops_forward_by_op``
    ({op: FLOPs}),
    ``nfe`` (``model.core.nfe`` after the forward, or None) and ``block_uses`` (calls of each of
    ``model.blocks`` in the forward, or None). The model's train/eval mode is left as it was.
    """
    device, dtype = model_device_dtype(model)
    x = torch.randn(batch, *input_shape, device=device, dtype=dtype)
    blocks = _blocks(model)

    with in_mode(model, False), torch.no_grad(), _count_calls(blocks) as calls, flop_counter() as fwd:
        run_forward(model, x, steps)
    core = getattr(model, "core", None)
    nfe = getattr(core, "nfe", None)

    flops_train: Optional[int] = None
    if train and any(p.requires_grad for p in model.parameters()):
        with in_mode(model, True), flop_counter() as train:
            backward_into_params(model, probe_loss(run_forward(model, x, steps)))
        flops_train = _per_image(train.get_total_flops(), batch)

    by_op = {str(op).replace("aten.", ""): _per_image(n, batch)
             for op, n in fwd.get_flop_counts().get("Global", {}).items()}
    return {
        "flops_forward": _per_image(fwd.get_total_flops(), batch),
        "flops_train": flops_train,
        "flops_forward_by_op": by_op,
        "nfe": int(nfe) if nfe is not None else None,
        "block_uses": list(calls) if blocks is not None else None,
    }


def block_applications(cfg: ViTConfig, steps: Optional[int] = None) -> int:
    """Block evaluations in one forward pass, as the core reports them from its config."""
    n = cfg.core_cls.block_applications(cfg, steps)
    if n is None:
        raise ValueError(f"the block applications of this {cfg.core_cls.describe(cfg)} core depend on the data; "
                         "pass applications= (e.g. measure_flops(...)['nfe'])")
    return n


def analytic_flops(cfg: ViTConfig, steps: Optional[int] = None, applications: Optional[int] = None) -> int:
    """Closed-form forward FLOPs per image of our ViT, in the convention of torch's flop counter.

    With D = embed_dim, N patches, T = N (+1 with a class token), M = int(mlp_ratio * D):
    patch embedding 2 N D C p^2; per block application qkv 2 T D 3D, attention scores and
    weighted sum 2 * 2 T^2 D (summed over heads), output projection 2 T D^2, MLP 2 * 2 T D M (with
    ``mlp_conv``, its 3x3 depthwise convolution 2 N M 9 more);
    the head 2 D classes (on the pooled token only; a dense head: 2 D classes p^2 on each of the N
    patch tokens). ``applications`` is the number of block evaluations (default: what the core
    reports for ``steps``). Step conditioning and re-injection add no matmul; the core's own matmuls
    (a router's) are added as the core counts them (``core_cls.own_flops``); an ODE time embedding
    runs once per batch, not per image.
    """
    n_apps = block_applications(cfg, steps) if applications is None else int(applications)
    D, T, N = cfg.embed_dim, cfg.num_patches + (1 if cfg.class_token else 0), cfg.num_patches
    M = int(D * cfg.mlp_ratio)
    patch = 2 * N * D * cfg.in_chans * cfg.patch_size ** 2
    qkv = 2 * T * D * 3 * D
    attention = 2 * 2 * T * T * D
    proj = 2 * T * D * D
    mlp = 2 * 2 * T * D * M + (2 * N * M * 9 if cfg.mlp_conv else 0)
    head = 2 * D * cfg.num_classes * (N * cfg.patch_size ** 2 if cfg.dense else 1)  # dense: every token, p*p pixels
    return patch + n_apps * (qkv + attention + proj + mlp) + head + (cfg.core_cls.own_flops(cfg, steps) or 0)


# -------------------------------------------------------------------------------------- summary
def account(model_name_or_model: Union[str, nn.Module], batch: int = 8, device: Union[str, torch.device] = "cpu",
            memory: bool = True, run_steps: Optional[int] = None, input_shape: Optional[InputShape] = None,
            **overrides: Any) -> Dict[str, Any]:
    """Params, FLOPs and training memory of a preset (with config ``overrides``) or a built model.

    ``create_model(name, **overrides)`` builds a preset (``steps=`` there sets the trained depth);
    ``run_steps`` runs the forward at another step count. ``batch`` is used for the memory
    measurement only (FLOPs are per image and exact at batch 1); ``memory=False`` skips it.
    ``input_shape`` (C, H, W) defaults to the model config's. A built model is moved to ``device``
    in place. Returns a flat dict (see keys below); ``peak_train_method`` says which measurement of
    :func:`peak_train_memory` was used.
    """
    if isinstance(model_name_or_model, str):
        model = create_model(model_name_or_model, **overrides).to(device)
        name = model_name_or_model
    else:
        if overrides:
            raise ValueError(f"overrides {sorted(overrides)} apply to a preset name, not to a built model")
        model = model_name_or_model.to(device)
        name = getattr(model, "preset_name", type(model).__name__)
    cfg: Optional[ViTConfig] = getattr(model, "cfg", None)
    if input_shape is None:
        if cfg is None:
            raise ValueError("input_shape=(C, H, W) is needed for a model without a ViTConfig .cfg")
        input_shape = (cfg.in_chans, cfg.img_size, cfg.img_size)

    flops = measure_flops(model, input_shape, steps=run_steps)
    counts = count_params(model, block_uses=flops["block_uses"])
    steps = run_steps if run_steps is not None else (cfg.steps if cfg is not None else None)
    analytic: Optional[int] = None
    if cfg is not None and hasattr(cfg, "core_cls") and cfg.core_cls.block_applications(cfg, steps) is not None:
        analytic = analytic_flops(cfg, steps)
    peak = peak_train_memory(model, batch, input_shape, device, steps=run_steps) if memory else None
    return {
        "model": name,
        "core": cfg.core if cfg is not None else None,
        "runs_as": cfg.core_cls.describe(cfg) if hasattr(cfg, "core_cls") else None,
        **{k: counts[k] for k in ("params", "params_stored", "params_effective", "param_bytes")},
        # the core's own parts (step conditioning, routers, time embedding): parameters and matmul FLOPs
        "params_core": sum(p.numel() for p in model.core.parameters()) if hasattr(model, "core") else None,
        "flops_core": cfg.core_cls.own_flops(cfg, steps) if hasattr(cfg, "core_cls") else None,
        "flops_forward": flops["flops_forward"],
        "flops_train": flops["flops_train"],
        "flops_analytic": analytic,
        "nfe": flops["nfe"],
        "peak_train_bytes": peak,
        "peak_train_method": None if peak is None else
        ("cuda_max_allocated" if torch.device(device).type == "cuda" else "saved_tensors"),
        "batch": batch,
        "steps": steps,
        "img_size": input_shape[-1],
        "patch_size": cfg.patch_size if cfg is not None else None,
        "embed_dim": cfg.embed_dim if cfg is not None else None,
        "num_heads": cfg.num_heads if cfg is not None else None,
        "depth": cfg.depth if cfg is not None else None,
    }


def account_preset(name: str, overrides: Dict[str, Any], device: torch.device, batch: int = 8, memory: bool = True,
                   steps: Optional[int] = None, force: bool = False) -> Dict[str, Any]:
    """:func:`account` of preset ``name`` with ``overrides`` on ``device``, priced first
    (:func:`~recurvit.analysis.budget.check_account_cost`; ``force`` measures anyway); a value the model
    refuses is a UserError."""
    from ..errors import UserError
    from .budget import check_account_cost

    try:
        model = create_model(name, **overrides).to(device)
        check_account_cost(model, device, batch, steps, memory, force)
        return account(model, batch=batch, device=device, memory=memory, run_steps=steps)
    except ValueError as e:
        raise UserError(str(e)) from None
