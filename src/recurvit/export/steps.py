"""A run as three programs a runtime can stop between steps: ``embed`` (images -> state), ``step`` (state ->
next state: ONE application of the core's step) and ``readout`` (state -> logits), each a ``torch.export``
program (``.pt2``) or an ONNX file, plus ``manifest.json`` saying how to chain them. ``recurvit.export.deploy``
runs them (onnxruntime or torch.export) with an early exit that removes exited images from the batch.

    recurvit export RUN --format onnx --steps-program --out DIR

What the state and the step are, per core (each program has a dynamic batch dimension; every state tensor
is per image, dim 0, so a runtime keeps the rows of the images still running):

===============================  ====================================================================
core                             programs
===============================  ====================================================================
recurrent                        ONE step program for every step (one block's weights): ``z -> z``; with
                                 step conditioning (embed / scale) it takes the 0-based step index
                                 ``step`` (int64, a scalar; past the trained steps the last learned entry
                                 is used, as in eager); with re-injection also ``x0`` (the embedded
                                 input, an embed output the runtime feeds to every step unchanged)
stack                            one step program per block (``step_00`` ... ``step_{L-1}``): block i is
                                 step i + 1; at most L steps
softmor, layout=inplace          one step program per unit (block l recursed r times and its token-wise
                                 mixture): the mixture is the next unit's input, so the state is ``z``
softmor, layout=cycle            ONE step program = one pass through the stack. With ``mixture=soft``
                                 the readout reads the running mixture over all passes so far, so the
                                 state also carries the online softmax of the router's scores: ``mx``
                                 (running max score, (B, T)), ``den`` (sum of exp(s_i - mx)), ``num``
                                 (sum of exp(s_i - mx) h_i, (B, T, D)), and the step takes ``step`` (the
                                 router's per-pass prior b_i); the readout computes ``num / den`` (eager
                                 softmax-then-sum, equal to fp tolerance); a query router's projected
                                 input ``q`` is an embed output fed to every step
ode                              refused: its step is a torchdiffeq solver interval (see ``_refusal``)
===============================  ====================================================================

With per-stage heads (deep supervision) there is one readout program per head and the manifest maps each
step to its head (``readout_of_step``; steps past the list use the last one), as ``forward_head(step=k)``.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .program import MAX_BATCH, TOOLS, _reason, preprocessing

FORMAT = "recurvit.step-program"
VERSION = 1
MANIFEST = "manifest.json"
SUFFIX = {"onnx": ".onnx", "torch-export": ".pt2"}
STEP = "step"  # the name of the step-index input


class _Embed(nn.Module):
    def __init__(self, model, extra: Callable[[torch.Tensor], Tuple[torch.Tensor, ...]]):
        super().__init__()
        self.model, self.extra = model, extra

    def forward(self, images):
        z = self.model.embed(images)  # (B, T, D)
        return (z, *self.extra(z))


class _Step(nn.Module):
    """``fn(*inputs)`` -> the carried state, as a module (torch.export and the ONNX exporter trace modules)."""

    def __init__(self, model, fn: Callable):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, *inputs):
        out = self.fn(*inputs)
        return out if isinstance(out, tuple) else (out,)


class _Readout(nn.Module):
    def __init__(self, model, step: int, mixture: bool):
        super().__init__()
        self.model, self.step, self.mixture = model, step, mixture

    def forward(self, *state):
        z = state[0] / state[1].unsqueeze(-1).to(state[0].dtype) if self.mixture else state[0]  # num / den
        return self.model.forward_head(self.model.norm(z), step=self.step)


# ------------------------------------------------------------------------------------------- the plans
# What a step is for each core that has one. The cores' own step (``Core._advance``) takes the step as a
# Python int, which tracing would bake into the program; where the step index is an input, the step is
# written here once more with a tensor index (tests/test_steps_export.py holds it equal to eager at every step).

def _conditioned(cond, block, z, t, x0):
    """``StepConditioning.output`` with a tensor step index ``t`` (0-based, clamped to the learned entries)."""
    if cond.kind == "none" and not cond.reinject:
        return block(z)
    zin = z + x0 if cond.reinject else z
    i = None if t is None else t.clamp(0, cond.num_steps - 1)
    if cond.kind == "embed":
        zin = zin + cond.step_embed[i]
    u = block(zin) - zin
    if cond.kind == "scale":
        u = cond.step_scale[i] * u
    return z + u


def _plan(model) -> Dict[str, Any]:
    """{state, constants, step_index, steps (a list of step functions), readout_inputs, mixture} for the
    model's core; UserError for a core without a step program."""
    from ..models.cores import Recurrent, SoftMoRCore, Stack
    from ..models.cores.base import StepState

    core, blocks = model.core, model.blocks
    plan = dict(state=["z"], constants=[], step_index=False, readout_inputs=["z"], mixture=False,
                extra=lambda z: ())
    if isinstance(core, Stack):
        def block_step(i):
            return lambda z: core._advance(StepState(blocks, z, k=i))  # the core's own step, block i
        plan["steps"] = [block_step(i) for i in range(len(blocks))]
    elif isinstance(core, Recurrent):
        cond = core.cond
        plan["step_index"] = cond.kind != "none"
        plan["constants"] = ["x0"] if cond.reinject else []
        plan["extra"] = (lambda z: (z,)) if cond.reinject else (lambda z: ())
        if cond.kind == "none" and not cond.reinject:
            plan["steps"] = [lambda z: core._advance(StepState(blocks, z))]  # the core's own step
        elif cond.kind == "none":
            plan["steps"] = [lambda z, x0: _conditioned(cond, blocks[0], z, None, x0)]
        elif cond.reinject:
            plan["steps"] = [lambda z, t, x0: _conditioned(cond, blocks[0], z, t, x0)]
        else:
            plan["steps"] = [lambda z, t: _conditioned(cond, blocks[0], z, t, None)]
    elif isinstance(core, SoftMoRCore) and core.layout == "inplace":
        def unit(l):
            def run(z):
                q = core.unit_query(l, z)
                hs, scores = [], []
                for i in range(core.recursions):
                    z = blocks[l](z, step=l + 1)
                    if core.mixture == "soft":
                        hs.append(z)
                        scores.append(core.score(l, i, z, q))
                return core.mix(hs, scores)[0] if core.mixture == "soft" else z
            return run
        plan["steps"] = [unit(l) for l in range(len(blocks))]
    elif isinstance(core, SoftMoRCore):  # cycle: one pass through the stack per step
        def cycle(z):
            for block in blocks:
                z = block(z)
            return z
        if core.mixture == "last":
            plan["steps"] = [cycle]
        else:
            query = core.query is not None
            plan.update(state=["z", "mx", "den", "num"], constants=["q"] if query else [], step_index=True,
                        readout_inputs=["num", "den"], mixture=True)

            def begin(z):  # the empty mixture: max score -inf, sums 0 (float32 as the router's scores)
                B, T = z.shape[:2]
                mx = torch.full((B, T), float("-inf"), dtype=torch.float32, device=z.device)
                den = torch.zeros((B, T), dtype=torch.float32, device=z.device)
                return (mx, den, torch.zeros_like(z)) + ((core.unit_query(0, z),) if query else ())

            def mixed(z, mx, den, num, t, q=None):
                h = cycle(z)
                s = core.score(0, t, h, q)  # (B, T) float32, the router's prior of pass t
                new = torch.maximum(mx, s)
                old, w = torch.exp(mx - new), torch.exp(s - new)  # exp(-inf) = 0 on the first pass
                num = num * old.unsqueeze(-1).to(num.dtype) + w.unsqueeze(-1).to(h.dtype) * h
                return h, new, den * old + w, num

            plan["extra"] = begin
            plan["steps"] = [mixed]
    else:
        raise _refusal(model)
    return plan


def _refusal(model, fmt: Optional[str] = None):
    from ..errors import UserError

    c = model.cfg
    return UserError(f"the {c.core_cls.describe(c)} core has no step program: its step is an interval of a "
                     "torchdiffeq solve, whose checks on the time grid are data-dependent and cannot be traced "
                     "(the recurrent, stack and softmor cores have one)" if c.core == "ode" else
                     f"the {c.core_cls.describe(c)} core has no step program (the recurrent, stack and softmor "
                     "cores have one)")


def step_inputs(plan: Dict[str, Any]) -> List[str]:
    """The input names of a step program, in order: the carried state, the step index, the constants."""
    return list(plan["state"]) + ([STEP] if plan["step_index"] else []) + list(plan["constants"])


def readout_steps(model) -> List[int]:
    """A representative step (1-based) of each readout head: [T] with one head, else the first step of each
    deep-supervision stage (``forward_head(step=k)`` picks the head of k's stage)."""
    T = model.nominal_steps
    if model.stage_heads is None:
        return [T]
    first: Dict[int, int] = {}
    for k in range(1, T + 1):
        first.setdefault(model.stage_of(k), k)
    return [first[s] for s in sorted(first)]


def manifest_of(model, plan: Dict[str, Any], fmt: str, files: Dict[str, Any]) -> Dict[str, Any]:
    from ..models.adaptive import has_step_readouts

    c = model.cfg
    return {
        "format": FORMAT, "version": VERSION, "backend": fmt, "core": c.core_cls.describe(c),
        "programs": files,
        "inputs": {"embed": ["images"], "step": step_inputs(plan), "readout": list(plan["readout_inputs"])},
        # what each output is (the step's outputs replace these names; ONNX calls them next_<name>)
        "outputs": {"embed": list(plan["state"]) + list(plan["constants"]), "step": list(plan["state"]),
                    "readout": ["logits"]},
        "state": list(plan["state"]), "constants": list(plan["constants"]),
        "step_index": bool(plan["step_index"]),  # the step program takes the 0-based step as int64 "step"
        "default_steps": int(model.nominal_steps),
        "max_steps": model.core.limit,  # None: any number of steps (the recurrent core)
        "readout_of_step": [model.stage_of(k) if model.stage_heads is not None else 0
                            for k in range(1, model.nominal_steps + 1)],
        "step_readouts_trained": bool(has_step_readouts(model)),
        "input_shape": [c.in_chans, c.img_size, c.img_size],
        "preprocessing": preprocessing(model),
    }


# ------------------------------------------------------------------------------------------- tracing
def _trace(module: nn.Module, args: Tuple[torch.Tensor, ...], names: Sequence[str], outputs: Sequence[str],
           fmt: str, path: Path) -> None:
    """Export ``module(*args)`` to ``path``: dim 0 of every non-scalar input is the (shared) batch dimension."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    dyn = tuple({0: batch} if a.dim() > 0 else None for a in args)
    if not isinstance(module, _Embed):
        dyn = (dyn,)  # forward(*inputs): one (tuple) argument
    if fmt == "onnx":
        program = torch.onnx.export(module, args, None, dynamo=True, dynamic_shapes=dyn,
                                    input_names=list(names), output_names=list(outputs))
        program.save(str(path))
    else:
        torch.export.save(torch.export.export(module, args, dynamic_shapes=dyn), str(path))


def write_programs(model, out: Path, fmt: str) -> Dict[str, Any]:
    """Trace the embed, step and readout programs of ``model`` (eval mode, CPU) into the existing folder
    ``out`` and write its manifest; returns the manifest. UserError for a core without a step program or a
    model the tracer refuses."""
    from ..errors import UserError

    if any(b.__dict__.get("step_selector") is not None for b in model.blocks):
        raise UserError("a model with per-step LoRA adapters has no shared step program (the block's weights "
                        "differ per step); merge or unroll them first (recurvit.models.adapters.unroll_step_lora)")
    plan = _plan(model)
    c, sfx = model.cfg, SUFFIX[fmt]
    images = torch.zeros(2, c.in_chans, c.img_size, c.img_size)  # batch 2: a batch of 1 would be specialised
    with torch.no_grad():
        first = _Embed(model, plan["extra"])(images)
    # distinct example tensors: an input passed twice as the same tensor (the re-injected x0 IS the embedded z)
    # is traced as one input, and the program would then read z for x0
    named = {n: torch.randn_like(a) for n, a in zip(list(plan["state"]) + list(plan["constants"]), first)}
    t = torch.tensor(0, dtype=torch.long)
    step_args = tuple(t if n == STEP else named[n] for n in step_inputs(plan))
    files: Dict[str, Any] = {"embed": f"embed{sfx}", "step": [], "readout": []}
    n_steps = len(plan["steps"])
    jobs = [(_Embed(model, plan["extra"]), (images,), ["images"], list(named), files["embed"])]
    for i, fn in enumerate(plan["steps"]):
        name = f"step{sfx}" if n_steps == 1 else f"step_{i:02d}{sfx}"
        files["step"].append(name)
        jobs.append((_Step(model, fn), step_args, step_inputs(plan), [f"next_{n}" for n in plan["state"]], name))
    read_args = tuple(named[n] for n in plan["readout_inputs"])
    for j, k in enumerate(readout_steps(model)):
        name = f"readout{sfx}" if model.stage_heads is None else f"readout_{j:02d}{sfx}"
        files["readout"].append(name)
        jobs.append((_Readout(model, k, plan["mixture"]), read_args, list(plan["readout_inputs"]), ["logits"], name))
    logging.disable(logging.CRITICAL)  # torch's tracing warnings would print dozens of lines
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()), torch.no_grad(), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. the ONNX exporter's note that inputs share the batch axis
            for module, args, names, outs, name in jobs:
                _trace(module.eval(), args, names, outs, fmt, out / name)
    except Exception as e:  # noqa: BLE001  (the tracers fail in many ways; each is one line here)
        raise UserError(f"the {c.core_cls.describe(c)} core's step program cannot be exported with {TOOLS[fmt]}: "
                        f"{_reason(e)[:160]}") from None
    finally:
        logging.disable(logging.NOTSET)
    manifest = manifest_of(model, plan, fmt, files)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def export_steps(run, out, fmt: str = "onnx", **overrides) -> Path:
    """``recurvit export RUN --format onnx|torch-export --steps-program --out OUT``: the folder OUT with the
    embed / step / readout programs and ``manifest.json``. ``run``: a run directory, a checkpoint, an hf
    export (anything ``recurvit.load_model`` reads) or a model instance. The folder appears whole or not at
    all (written beside OUT, then renamed)."""
    from ..errors import UserError

    out = Path(out)
    if fmt not in SUFFIX:
        raise UserError(f"--steps-program writes onnx or torch-export programs, not {fmt}: add --format onnx")
    if out.exists():
        raise UserError(f"{out} exists; choose another OUT")
    if fmt == "onnx":
        try:
            import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
        except ImportError:
            raise UserError("--format onnx needs the onnx extra: pip install -e '.[onnx]'") from None
    if isinstance(run, nn.Module):
        model = run
    else:
        import recurvit

        from ..run.checkpoint import check_finite

        model = recurvit.load_model(run, **overrides)
        check_finite(model, run)
    model = model.cpu().eval()
    _plan(model)  # refuse a core without a step program before any folder is made
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    except OSError as e:
        raise UserError(f"cannot write in {out.parent} ({e.strerror}); choose another OUT") from None
    try:
        write_programs(model, tmp, fmt)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
