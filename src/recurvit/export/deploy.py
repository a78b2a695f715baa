"""Run a step-program export (``recurvit export RUN --format onnx|torch-export --steps-program --out DIR``)
in onnxruntime or as torch.export programs, to a fixed depth or with an early exit that removes exited
images from the batch, so the saving is wall-clock.

    from recurvit.export.deploy import StepProgram, certified_threshold
    prog = StepProgram("exported/bvit-steps")               # the backend the manifest names
    logits = prog(x)                                         # the trained depth: model(x)
    logits, steps = prog.adaptive(x, threshold=0.9)          # forward_adaptive(model, x, "max_prob", 0.9)
    cert = certified_threshold(prog, calib_x, epsilon=0.005, delta=0.1)   # Learn-then-Test on calibration images
    logits, steps = prog.adaptive(x, threshold=cert["threshold"])         # None: no exit certified, full depth

A folder is loaded only as the set one export wrote, with nothing in it executed: the manifest's structure and
file names (each inside the folder) and every file's sha256 are checked first (:mod:`recurvit.export.manifest`),
and a .pt2 archive is read only as ``torch.export.save`` writes a program (:mod:`recurvit.export.archive`).

An export written with ``--fused`` also holds fused step-and-readout programs: ``adaptive`` then makes ONE call
a step (the step, its readout and the max softmax) instead of a step call and a readout call.

``x`` is the model's input (preprocessed as ``manifest["preprocessing"]`` says), a float tensor (B, C, H, W);
the whole-run methods return torch tensors. The exit rule is ``forward_adaptive``'s
(:mod:`recurvit.models.adaptive`): an image leaves after the first step k >= min_steps whose signal meets the
threshold (max_prob: max softmax >= threshold), else at max_steps, with the logits read out after step k.

Between programs the state stays in the backend's own arrays (numpy for onnxruntime, tensors for torch.export)
and the exit signals are computed in numpy, with the formulas of ``recurvit.models.adaptive.signal`` in
float32: at batch 1 a handful of small torch calls per step cost more than the step itself (measured: the
same exit loop over torch tensors took 1.1 ms against 0.47 ms in numpy, for a 0.06 ms step).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import torch

from ..analysis.certify import certify
from ..errors import UserError
from ..models.adaptive import CRITERIA, RISING, check_criterion
from .backends import OnnxProgram, TorchProgram, take, to_numpy
from .manifest import read_manifest, read_programs
from .steps import STEP

State = Dict[str, Any]  # name -> numpy array (onnx) or tensor (torch-export), dim 0 the batch


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float32, copy=False)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def signal(criterion: str, logp: np.ndarray, prev_logp: Optional[np.ndarray], z, prev_z) -> np.ndarray:
    """``recurvit.models.adaptive.signal`` in numpy (float32): the criterion's signal (B,) after a step."""
    if criterion == "max_prob":
        return np.exp(logp.max(axis=-1))
    if criterion == "entropy":
        return -(np.exp(logp) * logp).sum(axis=-1)
    if criterion == "kl":
        if prev_logp is None:
            return np.full(logp.shape[:1], np.inf, dtype=np.float32)
        return (np.exp(logp) * (logp - prev_logp)).sum(axis=-1)
    if criterion == "state":
        a = to_numpy(z).astype(np.float32).reshape(len(z), -1)
        b = to_numpy(prev_z).astype(np.float32).reshape(len(z), -1)
        return np.linalg.norm(a - b, axis=1) / np.maximum(np.linalg.norm(b, axis=1), 1e-12)
    raise ValueError(check_criterion(criterion))


def meets(criterion: str, sig: np.ndarray, threshold: Optional[float]) -> np.ndarray:
    """Where the signal meets the threshold (NaN never does; None: nowhere), as forward_adaptive decides."""
    if threshold is None:
        return np.zeros(sig.shape, dtype=bool)
    return sig >= np.float32(threshold) if criterion in RISING else sig <= np.float32(threshold)


class StepProgram:
    """The programs of a step-program export folder, loaded once (see the module docstring)."""

    def __init__(self, folder: Union[str, Path], threads: Optional[int] = None):
        self.folder = Path(folder)
        # the manifest's structure and names checked, then every file read and checked against its fingerprint,
        # before any program is deserialized (recurvit.export.manifest; a .pt2 by recurvit.export.archive)
        m = self.manifest = read_manifest(self.folder)
        self.backend = m["backend"]
        data = read_programs(self.folder, m)

        def load(name: str, part: str):
            where = str(self.folder / name)
            if self.backend == "onnx":
                return OnnxProgram(data.pop(name), where, m["inputs"][part], threads)
            return TorchProgram(data.pop(name), where)

        self._embed = load(m["programs"]["embed"], "embed")
        self._steps = [load(n, "step") for n in m["programs"]["step"]]
        self._readouts = [load(n, "readout") for n in m["programs"]["readout"]]
        # (step program, readout head) -> the fused program of the two (export_steps(..., fused=True))
        self._fused = {(f["step"], f["readout"]): load(f["file"], "fused") for f in m["programs"].get("fused", [])}
        self._native = self._embed.native
        self._calls: Dict[Tuple[int, bool], Tuple[Any, Any]] = {}  # (step, fused) -> (program, step index)
        self._step_in, self._step_out = list(m["inputs"]["step"]), list(m["outputs"]["step"])
        self._read_in, of = list(m["inputs"]["readout"]), list(m["readout_of_step"])
        self._head = lambda k: of[k - 1] if k <= len(of) else of[-1]  # noqa: E731

    # ----------------------------------------------------------------------------- one program each
    @property
    def weights(self) -> str:
        """The fingerprint of the weights of the run these programs came from
        (:func:`recurvit.export.manifest.weights_fingerprint`)."""
        return self.manifest["integrity"]["weights"]

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

    def embed(self, images) -> State:
        """The state after the embedding: {name: array} (numpy for onnx, tensors for torch-export)."""
        return dict(zip(self.manifest["outputs"]["embed"], self._embed(self._native(images))))

    def _call(self, k: int, fused: bool) -> Tuple[Any, Any]:
        """(the program of step ``k``, or its fused program; its step-index input), made once."""
        key = (k, fused)
        hit = self._calls.get(key)
        if hit is None:
            i = 0 if len(self._steps) == 1 else k - 1
            prog = self._fused[(i, self._head(k))] if fused else self._steps[i]
            hit = self._calls[key] = (prog, prog.index(k - 1))
        return hit

    def _run(self, state: State, k: int, fused: bool) -> tuple:
        """Step ``k`` on ``state`` IN PLACE; returns the program's outputs."""
        prog, t = self._call(k, fused)
        out = prog(*[t if n == STEP else state[n] for n in self._step_in])
        state.update(zip(self._step_out, out))
        return out

    def step(self, state: State, k: int) -> State:
        """Apply step ``k`` (1-based) to every row of ``state``; returns the new state (constants kept)."""
        new = dict(state)
        self._run(new, k, False)
        return new

    def readout(self, state: State, k: int):
        """The logits (an array of the backend) read out after step ``k`` (1-based): the head of k's
        deep-supervision stage."""
        return self._readouts[self._head(k)](*[state[n] for n in self._read_in])[0]

    @property
    def fused(self) -> bool:
        """Whether the export holds fused step-and-readout programs (``export_steps(..., fused=True)``)."""
        return bool(self._fused)

    def step_read(self, state: State, k: int) -> Tuple[State, Any, Any]:
        """Step ``k`` (1-based) and the readout after it in ONE call of a fused program: (the new state, the
        logits, the max-softmax confidence (B,)), arrays of the backend. ValueError without fused programs."""
        if not self._fused:
            raise ValueError(f"{self.folder} has no fused programs; export with --fused")
        new = dict(state)
        out = self._run(new, k, True)
        return new, out[-2], out[-1]

    # ----------------------------------------------------------------------------- whole runs
    @torch.no_grad()
    def __call__(self, images: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        """Logits after ``steps`` steps (default: the trained depth): ``model(x, steps=steps)``."""
        K = self.check_steps(steps)
        state = self.embed(images)
        for k in range(1, K + 1):
            state = self.step(state, k)
        return torch.as_tensor(self.readout(state, K))

    @torch.no_grad()
    def forward_steps(self, images: torch.Tensor, steps: Optional[int] = None) -> torch.Tensor:
        """Logits after every step 1..K, (K, B, classes), in one pass: ``model.forward_steps(x, K)``."""
        K = self.check_steps(steps)
        state, out = self.embed(images), []
        for k in range(1, K + 1):
            state = self.step(state, k)
            out.append(torch.as_tensor(self.readout(state, k)))
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
                 per_step_readouts: Optional[bool] = None,
                 fused: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(logits (B, classes), exit step (B,) long), as ``forward_adaptive(model, x, criterion, threshold,
        max_steps, min_steps, compact=True)``: an exited image leaves the batch, so later steps run on the
        images still going. ``threshold`` None: every image runs max_steps. ``fused`` (default: where the
        export has them) runs each step and its readout as ONE fused program, and max_prob reads the
        program's own confidence output."""
        check_criterion(criterion)
        fused = self.fused if fused is None else bool(fused)
        if fused and not self.fused:
            raise ValueError(f"{self.folder} has no fused programs; export with --fused")
        if criterion == "state" and self.manifest["state"] != ["z"]:
            raise ValueError(f"criterion=state reads the state after each step; this {self.manifest['core']} "
                             "program's readout reads a mixture: use max_prob, entropy or kl")
        K, m = self.plan(max_steps, min_steps, per_step_readouts)
        state = self.embed(images)
        B = len(state["z"])
        if B == 1 and fused and criterion == "max_prob":
            return self._one_image(state, threshold, K, m)
        rows = np.arange(B)  # the image of each row of `state`
        steps = np.full(B, K, dtype=np.int64)
        out: Optional[np.ndarray] = None
        prev_logp = None
        for k in range(1, K + 1):
            prev_z = state["z"]
            if fused:
                got = self._run(state, k, True)  # `state` is this call's own: updated in place
                logits, conf = to_numpy(got[-2]), to_numpy(got[-1])
            else:
                self._run(state, k, False)
                logits, conf = to_numpy(self.readout(state, k)), None
            if out is None:
                if logits.ndim != 2:
                    raise ValueError(f"an early exit needs per-image logits (B, classes); this program reads "
                                     f"out {tuple(logits.shape[1:])} per image")
                out = np.empty((B, logits.shape[-1]), dtype=logits.dtype)
            if k == K:
                out[rows] = logits
                steps[rows] = k
                break
            if criterion == "max_prob" and conf is not None:  # the fused program's own max softmax
                logp, sig = None, conf
            else:
                logp = _log_softmax(logits) if criterion != "state" else None
                sig = None
            if k < m:
                prev_logp = logp
                continue
            if sig is None:
                sig = signal(criterion, logp, prev_logp, state["z"], prev_z)
            stop = meets(criterion, sig, threshold)
            if stop.any():
                out[rows[stop]] = logits[stop]
                steps[rows[stop]] = k
                keep = np.flatnonzero(~stop)
                if keep.size == 0:
                    break
                state = {n: take(v, keep) for n, v in state.items()}  # the exited images leave the batch
                rows = rows[keep]
                logp = None if logp is None else logp[keep]
            prev_logp = logp
        return torch.from_numpy(out), torch.from_numpy(steps)

    def _one_image(self, state: State, threshold: Optional[float], K: int, m: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``adaptive`` for ONE image on the fused programs with max_prob: the same decision (the float32
        confidence against the float32 threshold, NaN never meets it) without the bookkeeping of rows, which
        at batch 1 costs as much as a step of a small model."""
        thr = None if threshold is None else float(np.float32(threshold))
        for k in range(1, K + 1):
            got = self._run(state, k, True)
            if k == K or (k >= m and thr is not None and float(to_numpy(got[-1])[0]) >= thr):
                return torch.from_numpy(np.array(to_numpy(got[-2]))), torch.tensor([k], dtype=torch.int64)
        raise AssertionError("unreachable: step K returns")

    @torch.no_grad()
    def trajectories(self, batches: Iterable, steps: Optional[int] = None) -> dict:
        """Predictions (K, N), labels (N,) where the batches carry them, and every criterion's signal (K, N)
        after steps 1..K, as :func:`recurvit.analysis.anytime.trajectories` gives them for a model (the
        signals computed as :meth:`adaptive` computes them). ``batches``: tensors of images, or (images,
        labels) pairs."""
        K = self.check_steps(steps)
        preds: List[np.ndarray] = []
        labels: List[torch.Tensor] = []
        sigs: Dict[str, List[np.ndarray]] = {c: [] for c in CRITERIA}
        for batch in batches:
            x, y = (batch[0], batch[1]) if isinstance(batch, (tuple, list)) else (batch, None)
            state = self.embed(x)
            prev_z, prev_logp = state["z"], None
            p, s = [], {c: [] for c in CRITERIA}
            for k in range(1, K + 1):
                state = self.step(state, k)
                logp = _log_softmax(to_numpy(self.readout(state, k)))
                p.append(logp.argmax(axis=-1))
                for c in CRITERIA:
                    s[c].append(signal(c, logp, prev_logp, state["z"], prev_z))
                prev_z, prev_logp = state["z"], logp
            preds.append(np.stack(p))
            for c in CRITERIA:
                sigs[c].append(np.stack(s[c]))
            if y is not None:
                labels.append(torch.as_tensor(y))
        out = {"preds": torch.from_numpy(np.concatenate(preds, 1)),
               "signals": {c: torch.from_numpy(np.concatenate(v, 1).astype(np.float32)) for c, v in sigs.items()}}
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
    K, m = program.plan(max_steps, min_steps, per_step_readouts)
    batches = batches_of(calibration) if isinstance(calibration, torch.Tensor) else calibration
    traj = program.trajectories(batches, K)
    return certify(traj, criterion, epsilon, delta, K, m)
