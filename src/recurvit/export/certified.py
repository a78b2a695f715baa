"""The certified exit where it is deployed, measured on one trained model: the model exported as fused step
programs (:func:`recurvit.export.steps.export_steps`, onnxruntime), the max-softmax exit threshold certified by
Learn-then-Test on calibration images the model never trained on (:func:`recurvit.export.deploy.certified_threshold`),
then, and only then, the test split read: the exit's disagreement with the full-depth answer (the certified
quantity), its accuracy loss, the steps it runs, and its wall-clock speed-up over the same programs run to full
depth; beside it the int8 step programs (:func:`recurvit.export.int8.quantize_steps`) at full depth.

    from recurvit.export.certified import deployed_exit
    res = deployed_exit(model, calib_x, lambda: (test_x, test_y), epsilon=0.005, delta=0.1)
    res["disagree_points"], res["speedup"], res["int8_drop_points"]

The speed-up is timed as ``benchmarks/`` time peers (:func:`recurvit.analysis.timing.interleaved_rounds`): each
round runs the first ``time_images`` test images through both contenders, the order rotated every round, and the
figure is the geometric mean of the per-round ratios with its 95% t-interval. Where no exit is certified the
model runs to full depth: nothing is timed, the speed-up is 1 and the disagreement 0.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..analysis.timing import interleaved_rounds
from ..study.stats import mean_ci
from .deploy import StepProgram, batches_of, certified_threshold
from .int8 import quantize_steps, weight_bytes
from .steps import export_steps


def _predict(prog: StepProgram, batches: List[torch.Tensor], threshold: Optional[float] = None,
             per_step_readouts: Optional[bool] = None):
    """(predictions, exit steps) of the whole list of batches: full depth when ``threshold`` is None."""
    preds, steps = [], []
    for x in batches:
        logits, k = prog.adaptive(x, threshold, per_step_readouts=per_step_readouts)
        preds.append(logits.argmax(-1))
        steps.append(k)
    return torch.cat(preds), torch.cat(steps)


def geometric_ratio(num: List[float], den: List[float]) -> Dict[str, float]:
    """The geometric mean of the per-round ratios num / den and its 95% t-interval (nan with one round)."""
    s = mean_ci([math.log(a / b) for a, b in zip(num, den)])
    lo, hi = (math.nan, math.nan) if math.isnan(s["ci"]) else (math.exp(s["mean"] - s["ci"]), math.exp(s["mean"] + s["ci"]))
    return {"mean": math.exp(s["mean"]), "lo": lo, "hi": hi, "rounds": len(num)}


@torch.no_grad()
def deployed_exit(model, calibration: torch.Tensor, test_split: Callable[[], Tuple[torch.Tensor, torch.Tensor]],
                  epsilon: float = 0.005, delta: float = 0.1, rounds: int = 10, time_images: int = 2048,
                  threads: Optional[int] = 1, batch_size: int = 256, int8: bool = True,
                  per_step_readouts: Optional[bool] = None) -> Dict[str, Any]:
    """Export, certify on ``calibration`` (images only: the loss is the disagreement with full depth), then
    measure on the test split, which ``test_split()`` gives (images, labels) and is called only after the
    threshold is fixed (see the module docstring). ``epsilon`` is a fraction (0.005: half a point).
    ``per_step_readouts``: as :meth:`recurvit.export.deploy.StepProgram.plan` (None: a stack needs a head
    after every block). Returns the certificate and the figures; every ``*_points`` figure is in points."""
    model = model.eval()
    T = model.nominal_steps
    with tempfile.TemporaryDirectory(prefix="recurvit-deploy-") as tmp:
        folder = export_steps(model, Path(tmp) / "steps", "onnx", fused=True)
        prog = StepProgram(folder, threads=threads)
        psr = per_step_readouts
        cert = certified_threshold(prog, batches_of(calibration, batch_size), epsilon, delta, per_step_readouts=psr)
        thr = cert["threshold"] if cert["certified"] else None
        test_x, test_y = test_split()  # the test split, from here on: the threshold above was fixed without it
        test = batches_of(test_x, batch_size)
        full, _ = _predict(prog, test, None, psr)
        ex, steps = _predict(prog, test, thr, psr)
        acc_full = float((full == test_y).double().mean())
        acc_exit = float((ex == test_y).double().mean())
        out: Dict[str, Any] = {
            "certified": bool(cert["certified"]), "threshold": thr, "epsilon": epsilon, "delta": delta,
            "calibration_images": len(calibration), "test_images": len(test_x), "trained_steps": T,
            "accuracy": acc_full, "exit_accuracy": acc_exit, "drop_points": 100 * (acc_full - acc_exit),
            "disagree_points": 100 * float((ex != full).double().mean()),
            "mean_steps": float(steps.double().mean()), "steps_pct_T": 100 * float(steps.double().mean()) / T,
            "speedup": 1.0, "speedup_lo": math.nan, "speedup_hi": math.nan, "timed_rounds": 0,
        }
        if thr is not None:
            timed = batches_of(test_x[:time_images], batch_size)
            secs = interleaved_rounds(
                {"full": lambda: [prog.adaptive(x, None, per_step_readouts=psr) for x in timed],
                 "exit": lambda: [prog.adaptive(x, thr, per_step_readouts=psr) for x in timed]},
                rounds, {"full": 1, "exit": 1}, torch.device("cpu"), warmup=1)
            r = geometric_ratio(secs["full"], secs["exit"])
            out.update(speedup=r["mean"], speedup_lo=r["lo"], speedup_hi=r["hi"], timed_rounds=rounds)
        if int8:
            q = quantize_steps(folder, Path(tmp) / "steps-int8")
            q_pred, _ = _predict(StepProgram(q, threads=threads), test, None, psr)
            out["int8_accuracy"] = float((q_pred == test_y).double().mean())
            out["int8_drop_points"] = 100 * (acc_full - out["int8_accuracy"])
            out["int8_weight_ratio"] = weight_bytes(folder)["total"] / weight_bytes(q)["total"]
    return out
