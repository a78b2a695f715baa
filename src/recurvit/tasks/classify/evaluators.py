"""The evaluators a classification study can name in its ``eval:`` section (see
:mod:`recurvit.study.evaluators`): each takes a trained run and returns the columns it adds to the
run's result row.

================  ===================================================================================
``horizon``       accuracy at every step up to ``max_steps_factor`` x T (acc@T, acc@2T, ...; runs by default)
``variants``      accuracy at T with core options changed (``{name: {option: value}}``); a variant whose
                  options the run's core does not take is recorded as not applicable (None), as the core
                  itself says (:meth:`recurvit.models.cores.base.Core.accepts`)
``per_step``      per-step analyses (readout accuracy, relative update, CKA of consecutive states, the
                  accuracy lost when the block is skipped at one step) and the figures claims read:
                  ``skip_drop_T``, ``skip_drop_mean``, ``rel_update_T``, ``rel_update_ratio``,
                  ``cka_last_pair``, ``readout_gain_T``
``continuation``  the fixed-point control: ``continue_drop_T``, the accuracy lost when the last step's update
                  is replaced by the previous update continued (an iteration settling along one direction
                  loses nothing)
``exit``          anytime exit calibrated off the test split, the criterion chosen there, measured on
                  it: ``exit_accuracy``, ``exit_drop_points``, ``exit_steps_pct_T``, ``exit_speedup``, ...
``deploy``        the certified exit where it is deployed (:mod:`recurvit.export.certified`): exported step
                  programs in onnxruntime, the exit certified on the held-out split, then the test split:
                  ``deploy_disagree_points``, ``deploy_speedup`` (wall-clock), ``deploy_int8_drop_points``, ...
================  ===================================================================================
"""
from __future__ import annotations

import math
from typing import Any, Dict

import torch

from ...analysis.exit import calibrated_exits
from ...analysis.horizon import horizon_sweep, summarize
from ...analysis.per_step import analyze_model, continuation, step_specificity
from ...errors import UserError
from ...export.certified import deployed_exit
from ...run.loaders import held_out_sets
from ...models.adaptive import CRITERIA
from ...models.cores import CORES
from ...study.evaluators import Evaluated, Evaluator
from .task import evaluate


class Horizon(Evaluator):
    name = "horizon"
    defaults = {"max_steps_factor": 4}
    minimum = {"max_steps_factor": 1}
    default = True  # every classification study sweeps the horizon (to T at least)

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        T = run.model.nominal_steps
        K = options["max_steps_factor"] * T
        if run.model.core.limit is not None:
            K = min(K, run.model.core.limit)
        sweep = horizon_sweep(run.model, run.test_loader, run.device, K)
        return {**{k: v for k, v in summarize(sweep, T).items() if k.startswith("acc_")},
                "horizon_accuracy": sweep["accuracy"]}


class Variants(Evaluator):
    name = "variants"
    free_form = True

    def check(self, options, where):
        opts = super().check(options, where)
        known = {n for core in CORES.values() for n in core.option_names()}
        for variant, given in opts.items():
            unknown = sorted(set(given) - known)
            if unknown:
                raise UserError(f"{where}: variant {variant} sets {', '.join(unknown)}, an option of no core "
                                f"(the cores' options: {', '.join(sorted(known))})")
        return opts

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        mc = run.model.cfg
        out: Dict[str, Any] = {}
        for variant, opts in options.items():
            if mc.core_cls.accepts(mc, **opts) is not None:
                out[variant] = None  # this run's core does not take these options: not applicable
                continue
            other = run.load(**opts).to(run.device)
            ev = evaluate(other, run.test_loader, run.device, amp="off")  # fp32, as the horizon sweep
            out[variant] = {"acc_T": ev["accuracy"], "nfe": other.nfe}
        return {"variants": out}


class PerStep(Evaluator):
    name = "per_step"
    defaults = {"images": 2000}
    minimum = {"images": 1}
    columns = ("skip_drop_T", "skip_drop_mean", "rel_update_T", "rel_update_ratio", "cka_last_pair", "readout_gain_T")

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        res = analyze_model(run.model, first_images(run, options["images"]), ("readout", "norms", "cka", "pruning"),
                            device=run.device)
        return per_step_figures(res)


class Continuation(Evaluator):
    """The fixed-point control of the per-step claims (:func:`recurvit.analysis.per_step.continuation`):
    ``continue_drop_T``, the accuracy lost when step T's update is replaced by the previous update
    continued (its projection onto that update's direction), on the first ``images`` test images."""

    name = "continuation"
    defaults = {"images": 2000}
    minimum = {"images": 1}
    columns = ("continue_drop_T",)

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        res = continuation(run.model, first_images(run, options["images"]), device=run.device)
        return {"continuation": res, "continue_drop_T": res["drop"]}


class StepPruning(Evaluator):
    """Step-specific pruning (:func:`recurvit.analysis.per_step.step_specificity`): ``prune_split_r``, the
    correlation between the even and the odd test images' step-specific part of the pruning map (one head
    or one of ``mlp_slices`` MLP hidden slices masked at one step), on the first ``images`` test images."""

    name = "step_pruning"
    defaults = {"images": 2000, "mlp_slices": 8}
    minimum = {"images": 4, "mlp_slices": 1}  # two halves of at least two images
    columns = ("prune_split_r",)

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        res = step_specificity(run.model, first_images(run, options["images"]), mlp_slices=options["mlp_slices"],
                               device=run.device)
        return {"step_pruning": res, "prune_split_r": res["split_half_r"]}


def first_images(run: Evaluated, images: int) -> list:
    """The first ``images`` test images of a run as (x, y) batches (the test loader does not shuffle)."""
    batches, n = [], 0
    for x, y in run.test_loader:
        take = min(len(y), images - n)
        batches.append((x[:take], y[:take]))
        n += take
        if n >= images:
            break
    return batches


def per_step_figures(res: Dict[str, Any]) -> Dict[str, Any]:
    """The per-step columns of a result row from :func:`recurvit.analysis.per_step.analyze_model`'s output."""
    T = res["meta"]["steps"]
    readout = res["readout"]["accuracy"]
    upd = res["norms"]["rel_update"][1:]  # step 1..T
    pooled = res["cka"]["pooled"]  # rows/cols: emb, 1..T
    skip = [r["drop"] for r in sorted(res["pruning"]["skip"], key=lambda r: r["step"])]
    return {
        "per_step": {"readout_accuracy": readout, "rel_update": upd, "skip_drop": skip,
                     "cka_consecutive": [pooled[k][k + 1] for k in range(T)], "images": res["meta"]["images"]},
        "skip_drop_T": skip[-1], "skip_drop_mean": sum(skip) / len(skip),
        "rel_update_T": upd[-1], "rel_update_ratio": upd[-1] / upd[0] if upd[0] else math.nan,
        "cka_last_pair": pooled[T - 1][T], "readout_gain_T": readout[-1] - readout[-2] if T > 1 else math.nan,
    }


class Exit(Evaluator):
    """Anytime exit (:func:`recurvit.analysis.exit.calibrated_exits`): each of ``criteria`` gets its
    threshold calibrated on the run's held-out split (else the calibration split of its training set);
    the run then exits with the criterion that needs the fewest mean steps there (calibration alone
    chooses), whose calibrated point is read once on the test split. Columns: that point's test
    accuracy, fixed-T accuracy, drop (points), mean steps (and as % of T), measured speedup, and the
    calibration's mean steps; ``exit`` holds every criterion's result and which was chosen. With
    ``certify: {epsilon: 0.5, delta: 0.1}`` (epsilon in points) each threshold is the certified one of
    :mod:`recurvit.analysis.certify` instead (Learn-then-Test on the same held-out images). The speed-up is
    the geometric mean of the per-batch time ratios on the test split with its 95% interval
    (``exit_speedup_lo``, ``_hi``), beside the machine's load before and during that timing, its cores and the
    threads timed (``exit_load_before``, ``exit_load_during``, ``exit_cores``, ``exit_threads``), what
    :mod:`recurvit.study.speed` decides from. Its record carries ``record`` (:attr:`record`): a run evaluated
    before these figures existed counts as not evaluated and is evaluated again."""

    name = "exit"
    defaults = {"criteria": ["kl"], "target_drop": 0.5, "step_budget": None, "max_steps": None, "min_steps": 1,
                "batch_size": 256, "certify": None}
    record = 2  # the version of the figures recorded (1, unmarked: without the interval and the load)
    columns = ("exit_accuracy", "exit_acc_T", "exit_drop_points", "exit_mean_steps", "exit_steps_pct_T",
               "exit_speedup", "exit_calibration_steps", "exit_speedup_lo", "exit_speedup_hi", "exit_load_before",
               "exit_load_during", "exit_cores", "exit_threads")

    def check(self, options, where):
        opts = super().check(options, where)
        crit = opts["criteria"]
        opts["criteria"] = crit = [crit] if isinstance(crit, str) else list(crit or [])
        bad = [c for c in crit if c not in CRITERIA]
        if not crit or bad:
            raise UserError(f"{where}: criteria must be a list of {', '.join(CRITERIA)}, got {options.get('criteria')!r}")
        cert = opts.pop("certify")  # recorded only when given: earlier runs' records stay what they were
        if cert is not None:
            opts["certify"] = cert
            ok = isinstance(cert, dict) and set(cert) == {"epsilon", "delta"} and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in cert.values())
            if not ok or not 0 < cert["epsilon"] < 100 or not 0 < cert["delta"] < 1:
                raise UserError(f"{where}: certify takes {{epsilon: POINTS in (0, 100), delta: in (0, 1)}}, got {cert!r}")
        opts["record"] = self.record
        return opts

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        o = dict(options)
        if o["step_budget"] is not None:
            o["target_drop"] = None
        cert = (o["certify"]["epsilon"] / 100, o["certify"]["delta"]) if o.get("certify") else None
        per = calibrated_exits(run.model, run.cfg, run.device, o["criteria"], o["max_steps"], o["min_steps"],
                               o["target_drop"], o["step_budget"], o["batch_size"], certify=cert)
        chosen = min(per, key=lambda c: per[c]["calibration"]["mean_steps"])  # ties: the first listed
        t = per[chosen]["test"]
        return {"exit": {"chosen": chosen, "per_criterion": per}, "exit_accuracy": t["accuracy"],
                "exit_acc_T": t["acc_T"], "exit_drop_points": t["drop_points"], "exit_mean_steps": t["mean_steps"],
                "exit_steps_pct_T": t["steps_pct_T"], "exit_speedup": t["speedup"],
                "exit_calibration_steps": per[chosen]["calibration"]["mean_steps"],
                **{f"exit_{k}": t.get(k) for k in ("speedup_lo", "speedup_hi", "load_before", "load_during", "cores",
                                                    "threads")}}


class Deploy(Evaluator):
    """The certified exit in the exported step programs (:func:`recurvit.export.certified.deployed_exit`):
    certified at ``epsilon`` points of disagreement with full depth, confidence ``1 - delta``, on the run's
    held-out split (``data.holdout``; a run without one is refused: its calibration images would be training
    images), then read once on the test split. ``rounds``: timing rounds over the first ``time_images`` test
    images; ``threads``: onnxruntime's intra-op threads. Beside the speed-up it records what
    :mod:`recurvit.study.speed` decides from: the machine's 1-minute load average before and during the timing,
    its cores and the threads timed (``deploy_load_before``, ``deploy_load_during``, ``deploy_cores``,
    ``deploy_threads``; empty where nothing was timed) and the FLOPs per image of the deployed programs
    (``deploy_flops_step``, ``_embed``, ``_readout``, ``_check``).

    Its record in a run's result.json carries ``record`` (:attr:`record`, not an option a study file sets): a
    run evaluated by an earlier version, without the load and FLOPs figures, counts as not evaluated and is
    evaluated again from its checkpoint."""

    name = "deploy"
    defaults = {"epsilon": 0.5, "delta": 0.1, "rounds": 10, "time_images": 2048, "threads": 1}
    minimum = {"rounds": 2, "time_images": 1, "threads": 1}
    record = 2  # the version of the figures recorded (1, unmarked: without the load and FLOPs figures)
    figures = ("certified", "threshold", "disagree_points", "drop_points", "steps_pct_T", "speedup", "speedup_lo",
               "speedup_hi", "int8_drop_points", "int8_weight_ratio", "load_before", "load_during", "cores",
               "threads", "flops_step", "flops_embed", "flops_readout", "flops_check")
    columns = tuple(f"deploy_{k}" for k in figures)

    def check(self, options, where):
        opts = super().check(options, where)
        e, d = opts["epsilon"], opts["delta"]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (e, d)) \
                or not 0 < e < 100 or not 0 < d < 1:
            raise UserError(f"{where}: deploy takes epsilon in (0, 100) points and delta in (0, 1), got {e!r}, {d!r}")
        opts["record"] = self.record
        return opts

    @classmethod
    def row(cls, res: Dict[str, Any]) -> Dict[str, Any]:
        """The result-row columns of :func:`recurvit.export.certified.deployed_exit`'s figures ``res`` (None
        where a figure is None or absent), with ``res`` itself under ``deploy``."""
        return {"deploy": res, **{f"deploy_{k}": (float(res[k]) if res.get(k) is not None else None)
                                  for k in cls.figures}}

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        o = options
        if not run.cfg.data.holdout:
            raise UserError(f"{run.out}: the deploy evaluator certifies on the run's held-out split; "
                            "train with data.holdout > 0")
        calib, _ = held_out_sets(run.cfg)
        calib_x = torch.stack([calib[i][0] for i in range(len(calib))])  # images only: no label is read

        def test_split():  # read once the threshold is fixed
            xs, ys = zip(*run.test_loader)
            return torch.cat(xs), torch.cat(ys)

        res = deployed_exit(run.model.cpu(), calib_x, test_split, o["epsilon"] / 100, o["delta"], o["rounds"],
                            o["time_images"], o["threads"])
        run.model.to(run.device)
        return self.row(res)


EVALUATORS = {e.name: e for e in (Horizon(), Variants(), PerStep(), Continuation(), StepPruning(), Exit(), Deploy())}
