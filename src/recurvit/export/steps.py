"""A run as three programs a runtime can stop between steps: ``embed`` (images -> state), ``step`` (state ->
next state: ONE application of the core's step) and ``readout`` (state -> logits), each a ``torch.export``
program (``.pt2``) or an ONNX file, plus ``manifest.json`` saying how to chain them. ``recurvit.export.deploy``
runs them (onnxruntime or torch.export) with an early exit that removes exited images from the batch.

    recurvit export RUN --format onnx --steps-program --out DIR

What the state and the step are is the core's to say (``Core.step_program``, a ``StepPlan``; see each core's
``step_program``): one step program for every step (a recurrence: one block's weights; the step index an int64
input ``step`` where the core conditions on it) or one per step (a stack: block i is step i + 1), the carried
state (``z``, and for a running mixture its online softmax), and constants made once by the embed program and
fed to every step (a re-injected input). Each program has a dynamic batch dimension and every state tensor is
per image (dim 0), so a runtime keeps the rows of the images still running. A core without a step program (the
ODE core: its step is a torchdiffeq solver interval) is refused in one line, with its reason.

With per-stage heads (deep supervision) there is one readout program per head and the manifest maps each
step to its head (``readout_of_step``; steps past the list use the last one), as ``forward_head(step=k)``.

``fused=True`` (``--fused``) also writes fused programs, the step followed by the readout of its step, whose
outputs are the next state, the ``logits`` and the max-softmax ``confidence`` (float32, (B,)): a runtime that
decides an exit after every step makes ONE call a step instead of two (``manifest["fused"]``: one program per
pair of step program and readout head that a step uses).

The manifest carries fingerprints (``integrity``): the sha256 of every program file and of the run's weights
(:mod:`recurvit.export.manifest`), checked when the folder is loaded, so a program of another run is refused.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
import torch.nn as nn

from ..errors import UserError
from ..layers.lora import lora_layers
from ..models.adaptive import has_step_readouts
from ..models.cores.base import STEP_INPUT, NoStepProgram, StepPlan
from ..run.atomic import scratch_dir
from ..run.checkpoint import check_finite
from ..run.load import load_model
from .manifest import FORMAT, MANIFEST, SUFFIX, VERSION, seal, weights_fingerprint  # noqa: F401 (re-exported)
from .program import MAX_BATCH, TOOLS, _reason, compact_onnx, preprocessing

STEP = STEP_INPUT  # the name of the step-index input


class _Embed(nn.Module):
    def __init__(self, model, plan: StepPlan):
        super().__init__()
        self.model, self.plan = model, plan

    def forward(self, images):
        z = self.model.embed(images)  # (B, T, D)
        return (z, *self.plan.begin(z))


def _state(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


class _Step(nn.Module):
    """A step function of the plan, as a module (torch.export and the ONNX exporter trace modules): its
    inputs are positional, in the order of ``plan.inputs()``."""

    def __init__(self, model, plan: StepPlan, fn: Callable):
        super().__init__()
        self.model, self.names, self.fn = model, plan.inputs(), fn

    def forward(self, *inputs):
        return _state(self.fn(**dict(zip(self.names, inputs))))


class _Readout(nn.Module):
    def __init__(self, model, plan: StepPlan, step: int):
        super().__init__()
        self.model, self.plan, self.step = model, plan, step

    def forward(self, *state):
        return self.model.forward_head(self.model.norm(self.plan.tokens(*state)), step=self.step)


class _Fused(nn.Module):
    """A step followed by the readout of its step: (next state..., logits, max-softmax confidence)."""

    def __init__(self, model, plan: StepPlan, fn: Callable, step: int):
        super().__init__()
        self.advance, self.read = _Step(model, plan, fn), _Readout(model, plan, step)
        self.state = list(plan.state)

    def forward(self, *inputs):
        new = self.advance(*inputs)
        named = dict(zip(self.state, new))
        logits = self.read(*[named[n] for n in self.read.plan.readout_inputs])
        return (*new, logits, torch.softmax(logits.float(), dim=-1).amax(dim=-1))


def _plan(model) -> StepPlan:
    """The core's step program (``Core.step_program``); UserError, one line, for a core without one."""
    c = model.cfg
    try:
        return model.core.step_program(model.blocks)
    except (NoStepProgram, NotImplementedError) as e:
        raise UserError(f"the {c.core_cls.describe(c)} core has no step program: {e}") from None


def step_inputs(plan: StepPlan) -> List[str]:
    """The input names of a step program, in order: the carried state, the step index, the constants."""
    return plan.inputs()


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


def head_of_step(model, k: int) -> int:
    """The readout head (index into ``readout_steps``) that reads the state after step ``k`` (1-based)."""
    if model.stage_heads is None:
        return 0
    return model.stage_of(min(k, model.nominal_steps))


def fused_pairs(model, plan: StepPlan) -> List[Tuple[int, int]]:
    """The (step program, readout head) pairs the steps use, in order of first use: one fused program each."""
    span = len(plan.steps) if len(plan.steps) > 1 else model.nominal_steps
    pairs: List[Tuple[int, int]] = []
    for k in range(1, span + 1):
        pair = (k - 1 if len(plan.steps) > 1 else 0, head_of_step(model, k))
        if pair not in pairs:
            pairs.append(pair)
    return pairs


def manifest_of(model, plan: StepPlan, fmt: str, files: Dict[str, Any]) -> Dict[str, Any]:
    c = model.cfg
    outputs = {"embed": list(plan.state) + list(plan.constants), "step": list(plan.state), "readout": ["logits"]}
    if "fused" in files:
        outputs["fused"] = list(plan.state) + ["logits", "confidence"]
    return {
        "format": FORMAT, "version": VERSION, "backend": fmt, "core": c.core_cls.describe(c),
        "programs": files,
        "inputs": {"embed": ["images"], "step": step_inputs(plan), "readout": list(plan.readout_inputs),
                   **({"fused": step_inputs(plan)} if "fused" in files else {})},
        # what each output is (the step's outputs replace these names; ONNX calls them next_<name>)
        "outputs": outputs,
        "state": list(plan.state), "constants": list(plan.constants),
        "step_index": bool(plan.step_index),  # the step program takes the 0-based step as int64 "step"
        "default_steps": int(model.nominal_steps),
        "max_steps": model.core.limit,  # None: any number of steps (the recurrent core)
        "readout_of_step": [head_of_step(model, k) for k in range(1, model.nominal_steps + 1)],
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
        compact_onnx(program)
        program.save(str(path))
    else:
        torch.export.save(torch.export.export(module, args, dynamic_shapes=dyn), str(path))


def write_programs(model, out: Path, fmt: str, fused: bool = False) -> Dict[str, Any]:
    """Trace the embed, step and readout programs of ``model`` (eval mode, CPU), and with ``fused`` the fused
    step-and-readout programs, into the existing folder ``out`` and write its manifest, with the fingerprints
    :mod:`recurvit.export.manifest` checks on load; returns the manifest. UserError for a core without a step
    program or a model the tracer refuses."""
    if any(m.num_adapters > 1 for m in lora_layers(model)):
        raise UserError("a model with per-step LoRA adapters has no shared step program (the block's weights "
                        "differ per step); merge or unroll them first (recurvit.models.adapters.unroll_step_lora)")
    plan = _plan(model)
    c, sfx = model.cfg, SUFFIX[fmt]
    images = torch.zeros(2, c.in_chans, c.img_size, c.img_size)  # batch 2: a batch of 1 would be specialised
    with torch.no_grad():
        first = _Embed(model, plan)(images)
    # distinct example tensors: an input passed twice as the same tensor (the re-injected x0 IS the embedded z)
    # is traced as one input, and the program would then read z for x0
    named = {n: torch.randn_like(a) for n, a in zip(list(plan.state) + list(plan.constants), first)}
    t = torch.tensor(0, dtype=torch.long)
    step_args = tuple(t if n == STEP else named[n] for n in step_inputs(plan))
    files: Dict[str, Any] = {"embed": f"embed{sfx}", "step": [], "readout": []}
    n_steps = len(plan.steps)
    nexts = [f"next_{n}" for n in plan.state]
    jobs = [(_Embed(model, plan), (images,), ["images"], list(named), files["embed"])]
    for i, fn in enumerate(plan.steps):
        name = f"step{sfx}" if n_steps == 1 else f"step_{i:02d}{sfx}"
        files["step"].append(name)
        jobs.append((_Step(model, plan, fn), step_args, step_inputs(plan), nexts, name))
    read_args = tuple(named[n] for n in plan.readout_inputs)
    heads = readout_steps(model)
    for j, k in enumerate(heads):
        name = f"readout{sfx}" if model.stage_heads is None else f"readout_{j:02d}{sfx}"
        files["readout"].append(name)
        jobs.append((_Readout(model, plan, k), read_args, list(plan.readout_inputs), ["logits"], name))
    if fused:
        pairs = fused_pairs(model, plan)
        files["fused"] = []
        for i, j in pairs:
            name = f"fused{sfx}" if len(pairs) == 1 else f"fused_{i:02d}_{j:02d}{sfx}"
            files["fused"].append({"file": name, "step": i, "readout": j})
            jobs.append((_Fused(model, plan, plan.steps[i], heads[j]), step_args, step_inputs(plan),
                         nexts + ["logits", "confidence"], name))
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
    # the manifest with its fingerprints: the sha256 of every program file and of the run's weights
    return seal(out, manifest_of(model, plan, fmt, files), weights_fingerprint(model))


def export_steps(run, out, fmt: str = "onnx", fused: bool = False, **overrides) -> Path:
    """``recurvit export RUN --format onnx|torch-export --steps-program [--fused] --out OUT``: the folder OUT
    with the embed / step / readout programs (and with ``fused`` the fused step-and-readout programs) and
    ``manifest.json``. ``run``: a run directory, a checkpoint, an hf
    export (anything ``recurvit.load_model`` reads) or a model instance. The folder appears whole or not at
    all: written in a hidden scratch folder beside OUT (:func:`recurvit.run.atomic.scratch_dir`), then renamed;
    the scratch folder of an export killed there before is removed by the next one."""
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
        model = load_model(run, **overrides)
        check_finite(model, run)
    model = model.cpu().eval()
    _plan(model)  # refuse a core without a step program before any folder is made
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write in {out.parent} ({e.strerror}); choose another OUT") from None
    with scratch_dir(out.parent, out.name, "steps") as tmp:  # a killed export's scratch goes with the next one
        write_programs(model, tmp, fmt, fused)
        os.replace(tmp, out)
    return out
