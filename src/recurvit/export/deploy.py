"""Run a step-program export (``recurvit export RUN --format onnx|torch-export --steps-program --out DIR``)
in onnxruntime or as torch.export programs, to a fixed depth or with an early exit that removes exited
images from the batch, so the saving is wall-clock.

    from recurvit.export.deploy import StepProgram, certified_threshold
    prog = StepProgram("exported/bvit-steps")               # the backend the manifest names
    logits = prog(x)                                         # the trained depth: model(x)
    logits, steps = prog.adaptive(x, threshold=0.9)          # forward_adaptive(model, x, "max_prob", 0.9)
    cert = certified_threshold(prog, calib_x, epsilon=0.005, delta=0.1)   # Learn-then-Test on calibration images
    logits, steps = prog.adaptive(x, threshold=cert["threshold"])         # None: no exit certified, full depth

``x`` is the model's input (preprocessed as ``manifest["preprocessing"]`` says), a float tensor (B, C, H, W).
The exit rule is ``forward_adaptive``'s (:mod:`recurvit.models.adaptive`, the same signal and comparison
functions): an image leaves after the first step k >= min_steps whose signal meets the threshold (max_prob:
max softmax >= threshold), else at max_steps; it gets the logits read out after step k.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ..models.adaptive import check_criterion, meets, signal
from .steps import FORMAT, MANIFEST, STEP, VERSION

State = Dict[str, torch.Tensor]


class _OnnxProgram:
    def __init__(self, path: Path, inputs: Sequence[str], threads: Optional[int]):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = opts.inter_op_num_threads = int(threads)
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = list(inputs)

    def __call__(self, *args: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        feed = {n: a.numpy() for n, a in zip(self.inputs, args)}
        return tuple(torch.from_numpy(o) for o in self.session.run(None, feed))


class _TorchProgram:
    def __init__(self, path: Path):
        import logging

        logging.disable(logging.WARNING)  # torch's deserializer warns about unused symbols of the step index
        try:
            self.module = torch.export.load(str(path)).module()
        finally:
            logging.disable(logging.NOTSET)

    def __call__(self, *args: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        out = self.module(*args)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class StepProgram:
    """The programs of a step-program export folder, loaded once (see the module docstring)."""

    def __init__(self, folder: Union[str, Path], threads: Optional[int] = None):
        from ..errors import UserError

        self.folder = Path(folder)
        try:
            m = json.loads((self.folder / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{self.folder} is not a step-program export ({MANIFEST}: "
                            f"{getattr(e, 'strerror', None) or e}); write one with recurvit export RUN "
                            "--steps-program") from None
        if m.get("format") != FORMAT or int(m.get("version", 0)) > VERSION:
            raise UserError(f"{self.folder / MANIFEST} is format {m.get('format')} version {m.get('version')}; "
                            f"this recurvit reads {FORMAT} up to version {VERSION}")
        self.manifest = m
        self.backend = m["backend"]

        def load(name: str, part: str):
            path = self.folder / name
            if self.backend == "onnx":
                return _OnnxProgram(path, m["inputs"][part], threads)
            return _TorchProgram(path)

        self._embed = load(m["programs"]["embed"], "embed")
        self._steps = [load(n, "step") for n in m["programs"]["step"]]
        self._readouts = [load(n, "readout") for n in m["programs"]["readout"]]

    # ----------------------------------------------------------------------------- one program each
    @property
    def default_steps(self) -> int:
        return int(self.manifest["default_steps"])

    @property
    def max_steps(self) -> Optional[int]:
        return self.manifest["max_steps"]

    def check_steps(self, steps: Optional[int]) -> int:
        k = self.default_steps if steps is None else int(steps)
        if k < 1:
            raise ValueError(f"steps must be >= 1, got {k}")
        if self.max_steps is not None and k > self.max_steps:
            raise ValueError(f"this {self.manifest['core']} program runs at most {self.max_steps} steps, got {k}")
        return k

    def embed(self, images: torch.Tensor) -> State:
        out = self._embed(torch.as_tensor(images, dtype=torch.float32).contiguous())
        return dict(zip(self.manifest["outputs"]["embed"], out))

    def step(self, state: State, k: int) -> State:
        """Apply step ``k`` (1-based) to every row of ``state``; returns the new state (constants kept)."""
        prog = self._steps[0] if len(self._steps) == 1 else self._steps[k - 1]
        t = torch.tensor(k - 1, dtype=torch.long)
        out = prog(*[t if n == STEP else state[n] for n in self.manifest["inputs"]["step"]])
        return {**state, **dict(zip(self.manifest["outputs"]["step"], out))}

    def readout(self, state: State, k: int) -> torch.Tensor:
        """The logits read out after step ``k`` (1-based): the head of k's deep-supervision stage."""
        of = self.manifest["readout_of_step"]
        head = of[k - 1] if k <= len(of) else of[-1]
        return self._readouts[head](*[state[n] for n in self.manifest["inputs"]["readout"]])[0]

    # ----------------------------------------------------------------------------- whole runs
    @torch.no_grad()
    def __call__(self, images: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        """Logits after ``steps`` steps (default: the trained depth): ``model(x, steps=steps)``."""
        K = self.check_steps(steps)
        state = self.embed(images)
        for k in range(1, K + 1):
            state = self.step(state, k)
        return self.readout(state, K)

    @torch.no_grad()
    def forward_steps(self, images: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        """Logits after every step 1..K, (K, B, classes), in one pass: ``model.forward_steps(x, K)``."""
        K = self.check_steps(steps)
        state, out = self.embed(images), []
        for k in range(1, K + 1):
            state = self.step(state, k)
            out.append(self.readout(state, k))
        return torch.stack(out)

    def plan(self, max_steps: Optional[int], min_steps: int, per_step_readouts: Optional[bool]) -> Tuple[int, int]:
        """(max_steps, min_steps) as ``recurvit.models.adaptive.plan_steps`` decides them."""
        K = self.default_steps if max_steps is None else int(max_steps)
        if K < 1:
            raise ValueError(f"max_steps must be >= 1, got {K}")
        if self.max_steps is not None:
            K = min(K, self.max_steps)
        if int(min_steps) < 1 or int(min_steps) > K:
            raise ValueError(f"min_steps must be in 1..max_steps={K}, got {min_steps}")
        trained = self.manifest["step_readouts_trained"] if per_step_readouts is None else per_step_readouts
        if not trained and min_steps < K:
            raise ValueError(f"this {self.manifest['core']} model has no readout trained after every block: an "
                             f"early exit would read an untrained head; set min_steps={K} or per_step_readouts=True "
                             "where deep supervision trained them")
        return K, int(min_steps)

    @torch.no_grad()
    def adaptive(self, images: torch.Tensor, threshold: Optional[float], criterion: str = "max_prob",
                 max_steps: Optional[int] = None, min_steps: int = 1,
                 per_step_readouts: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, classes), exit step (B,) long), as ``forward_adaptive(model, x, criterion, threshold,
        max_steps, min_steps, compact=True)``: an exited image leaves the batch, so later steps run on the
        images still going. ``threshold`` None: every image runs max_steps."""
        check_criterion(criterion)
        if criterion == "state" and self.manifest["state"] != ["z"]:
            raise ValueError(f"criterion=state reads the state after each step; this {self.manifest['core']} "
                             "program's readout reads a mixture: use max_prob, entropy or kl")
        K, m = self.plan(max_steps, min_steps, per_step_readouts)
        state = self.embed(images)
        B = len(state["z"])
        rows = torch.arange(B)  # the image of each row of `state`
        steps = torch.full((B,), K, dtype=torch.long)
        out: Optional[torch.Tensor] = None
        prev_logp = None
        for k in range(1, K + 1):
            prev_z = state["z"]
            state = self.step(state, k)
            logits = self.readout(state, k)
            if out is None:
                if logits.dim() != 2:
                    raise ValueError(f"an early exit needs per-image logits (B, classes); this program reads "
                                     f"out {tuple(logits.shape[1:])} per image")
                out = logits.new_empty(B, logits.shape[-1])
            logp = F.log_softmax(logits.float(), dim=-1)
            if k == K:
                stop = torch.ones(len(rows), dtype=torch.bool)
            elif k < m:
                stop = torch.zeros(len(rows), dtype=torch.bool)
            else:
                stop = meets(criterion, signal(criterion, logp, prev_logp, state["z"], prev_z), threshold)
            if stop.any():
                out[rows[stop]] = logits[stop]
                steps[rows[stop]] = k
            keep = (~stop).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            if keep.numel() < len(rows):  # the exited images leave the batch
                state = {n: v[keep] for n, v in state.items()}
                rows, logp = rows[keep], logp[keep]
            prev_logp = logp
        return out, steps

    @torch.no_grad()
    def trajectories(self, batches: Iterable, steps: Optional[int] = None) -> dict:
        """Predictions (K, N), labels (N,) where the batches carry them, and every criterion's signal (K, N)
        after steps 1..K, as :func:`recurvit.analysis.anytime.trajectories` gives them for a model.
        ``batches``: tensors of images, or (images, labels) pairs."""
        from ..models.adaptive import CRITERIA

        K = self.check_steps(steps)
        preds: List[torch.Tensor] = []
        labels: List[torch.Tensor] = []
        sigs: Dict[str, List[torch.Tensor]] = {c: [] for c in CRITERIA}
        for batch in batches:
            x, y = (batch[0], batch[1]) if isinstance(batch, (tuple, list)) else (batch, None)
            state = self.embed(x)
            prev_z, prev_logp = state["z"], None
            p, s = [], {c: [] for c in CRITERIA}
            for k in range(1, K + 1):
                state = self.step(state, k)
                logp = F.log_softmax(self.readout(state, k).float(), dim=-1)
                p.append(logp.argmax(dim=-1))
                for c in CRITERIA:
                    s[c].append(signal(c, logp, prev_logp, state["z"], prev_z))
                prev_z, prev_logp = state["z"], logp
            preds.append(torch.stack(p))
            for c in CRITERIA:
                sigs[c].append(torch.stack(s[c]))
            if y is not None:
                labels.append(torch.as_tensor(y))
        out = {"preds": torch.cat(preds, 1), "signals": {c: torch.cat(v, 1) for c, v in sigs.items()}}
        if labels:
            out["labels"] = torch.cat(labels)
        return out


def batches_of(images: torch.Tensor, batch_size: int = 256) -> List[torch.Tensor]:
    return [images[i:i + batch_size] for i in range(0, len(images), batch_size)]


def certified_threshold(program: StepProgram, calibration: Union[torch.Tensor, Iterable], epsilon: float,
                        delta: float, criterion: str = "max_prob", max_steps: Optional[int] = None,
                        min_steps: int = 1, per_step_readouts: Optional[bool] = None) -> dict:
    """The most aggressive exit threshold whose disagreement with the full-depth answer (max_steps) is
    certified at ``epsilon`` (a fraction) with confidence ``1 - delta`` on the calibration images, by
    Learn-then-Test (:func:`recurvit.analysis.certify.certify`), computed with the exported programs
    themselves. ``calibration``: a tensor of images or an iterable of batches (no labels are needed).
    ``threshold`` None (``certified`` False) when no exit is: run at full depth."""
    from ..analysis.certify import certify

    K, m = program.plan(max_steps, min_steps, per_step_readouts)
    batches = batches_of(calibration) if isinstance(calibration, torch.Tensor) else calibration
    traj = program.trajectories(batches, K)
    return certify(traj, criterion, epsilon, delta, K, m)
