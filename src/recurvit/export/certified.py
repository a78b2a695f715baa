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
round runs the first ``time_images`` test images through both contenders (the exit, and the same programs at full
depth as a deployment without an exit runs them: embed, T steps, one readout), the order rotated every round, and the
figure is the geometric mean of the per-round ratios with its 95% t-interval. Where no exit is certified the
model runs to full depth: nothing is timed, the speed-up is 1 and the disagreement 0.

Beside the speed-up, what :mod:`recurvit.study.speed` needs to decide from it: the machine's load around the
timing (:class:`recurvit.analysis.timing.LoadWatch`): ``load_before``, the 1-minute load average just before
the timing rounds (after the warm-up calls); ``load_during``, the highest reading taken after every round and at
the end; ``cores``, the cores this process may run on; ``threads``, the threads the programs were timed with (all
four None where nothing is timed); and the FLOPs per image of the deployed programs (:func:`program_flops`),
from which it bounds the speed-up the skipped steps allow.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..analysis.accounting import flop_counter
from ..analysis.timing import LoadWatch, geometric_ratio, interleaved_rounds
from .deploy import StepProgram, batches_of, certified_threshold
from .int8 import quantize_steps, weight_bytes
from .steps import STEP, _Embed, _plan, _Readout, _Step, export_steps, head_of_step, readout_steps


def _predict(prog: StepProgram, batches: List[torch.Tensor], threshold: Optional[float] = None,
             per_step_readouts: Optional[bool] = None):
    """(predictions, exit steps) of the whole list of batches: full depth when ``threshold`` is None."""
    preds, steps = [], []
    for x in batches:
        logits, k = prog.adaptive(x, threshold, per_step_readouts=per_step_readouts)
        preds.append(logits.argmax(-1))
        steps.append(k)
    return torch.cat(preds), torch.cat(steps)


@torch.no_grad()
def program_flops(model, exits: bool = True) -> Dict[str, float]:
    """FLOPs per image of the programs :func:`recurvit.export.steps.export_steps` traces from ``model`` (CPU,
    eval mode), counted on those same modules as :mod:`recurvit.analysis.accounting` counts (torch's flop
    counter: matmuls, convolutions and attention, 2 FLOPs a multiply-add; norms and softmax count 0), on one
    image carried through steps 1..T: ``flops_embed`` the embed program; ``flops_step`` a step program (the
    mean over steps 1..T: a stack has one per step); ``flops_readout`` the readout after step T;
    ``flops_check`` what the exit adds to every step it runs, the readout after that step and its max softmax
    (as a fused program computes them; the mean over steps 1..T), 0 with ``exits`` False (full depth, no step
    checked). A full-depth run is then ``embed + T step + readout``."""
    plan, c, T = _plan(model), model.cfg, model.nominal_steps
    heads = readout_steps(model)

    def count(module, *args):
        with flop_counter() as fc:
            out = module(*args)
        return out, fc.get_total_flops()

    first, embed = count(_Embed(model, plan), torch.zeros(1, c.in_chans, c.img_size, c.img_size))
    state = dict(zip(list(plan.state) + list(plan.constants), first))
    steps, reads = [], []
    for k in range(1, T + 1):
        fn = plan.steps[0 if len(plan.steps) == 1 else k - 1]
        args = [torch.tensor(k - 1, dtype=torch.long) if n == STEP else state[n] for n in plan.inputs()]
        new, flops = count(_Step(model, plan, fn), *args)
        state.update(zip(plan.state, new))
        steps.append(flops)
        _, flops = count(_Readout(model, plan, heads[head_of_step(model, k)]), *[state[n] for n in plan.readout_inputs])
        reads.append(flops)
    return {"flops_step": sum(steps) / T, "flops_embed": float(embed), "flops_readout": float(reads[-1]),
            "flops_check": sum(reads) / T if exits else 0.0}


@torch.no_grad()
def deployed_exit(model, calibration: torch.Tensor, test_split: Callable[[], Tuple[torch.Tensor, torch.Tensor]],
                  epsilon: float = 0.005, delta: float = 0.1, rounds: int = 10, time_images: int = 2048,
                  threads: Optional[int] = 1, batch_size: int = 256, int8: bool = True,
                  per_step_readouts: Optional[bool] = None) -> Dict[str, Any]:
    """Export, certify on ``calibration`` (images only: the loss is the disagreement with full depth), then
    measure on the test split, which ``test_split()`` gives (images, labels) and is called only after the
    threshold is fixed (see the module docstring). ``epsilon`` is a fraction (0.005: half a point).
    ``per_step_readouts``: as :meth:`recurvit.export.deploy.StepProgram.plan` (None: a stack needs a head
    after every block). Returns the certificate and the figures; every ``*_points`` figure is in points; the load
    figures and :func:`program_flops`'s as the module docstring says (``threads`` None, onnxruntime's default:
    recorded as the cores)."""
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
            "load_before": None, "load_during": None, "cores": None, "threads": None,  # None: nothing timed
            **program_flops(model, exits=thr is not None),
        }
        if thr is not None:
            n = min(time_images, len(test_x))
            timed = batches_of(test_x[:n], batch_size)
            contenders = {"full": lambda: [prog(x) for x in timed],  # plain full depth: embed, T steps, one readout
                          "exit": lambda: [prog.adaptive(x, thr, per_step_readouts=psr) for x in timed]}
            for run in contenders.values():  # the warm-up calls, before the load is first read
                run()
            with LoadWatch() as load:
                secs = interleaved_rounds(contenders, rounds, {"full": 1, "exit": 1}, torch.device("cpu"),
                                          log=load.sample, warmup=0)
            r = geometric_ratio(secs["full"], secs["exit"])
            out.update(speedup=r["mean"], speedup_lo=r["lo"], speedup_hi=r["hi"], timed_rounds=rounds,
                       load_before=load.before, load_during=load.during, cores=load.cores,
                       threads=threads or load.cores, timed_images=n,
                       timed_steps_pct_T=100 * float(steps[:n].double().mean()) / T)
        if int8:
            q = quantize_steps(folder, Path(tmp) / "steps-int8")
            q_pred, _ = _predict(StepProgram(q, threads=threads), test, None, psr)
            out["int8_accuracy"] = float((q_pred == test_y).double().mean())
            out["int8_drop_points"] = 100 * (acc_full - out["int8_accuracy"])
            out["int8_weight_ratio"] = weight_bytes(folder)["total"] / weight_bytes(q)["total"]
    return out
