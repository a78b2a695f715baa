"""The evaluators a LoopVAE study can name in its ``eval:`` section (see :mod:`recurvit.study.evaluators`).

=================  ===============================================================================
``interventions``  loop interventions on the trained recurrence (:mod:`recurvit.tasks.vae.interventions`):
                   every loop ``truncate``-d, the last trained loop's update scaled by each of
                   ``factors`` (side by side and scale by scale), and every loop's relative update
                   ||dh|| / ||h||. Columns claims read: ``trunc1_cost_db`` (PSNR lost with one loop
                   fewer at every scale), ``trunc1_oor_gain`` (out-of-range output share gained
                   then), ``skip_last_cost_db`` (PSNR lost when one scale's last update is skipped,
                   mean over sides and scales), ``last_update_rel`` (the size of those updates)
=================  ===============================================================================
"""
from __future__ import annotations

import statistics
from typing import Any, Dict

from ...study.evaluators import Evaluated, Evaluator
from .interventions import intervention_specs, run_interventions, update_sizes


class Interventions(Evaluator):
    name = "interventions"
    defaults = {"truncate": [1], "factors": [0.0, 0.5, 2.0]}
    columns = ("trunc1_cost_db", "trunc1_oor_gain", "skip_last_cost_db", "last_update_rel")

    def __call__(self, run: Evaluated, options: Dict[str, Any]) -> Dict[str, Any]:
        model = run.model
        truncate = sorted({1, *map(int, options["truncate"])})
        factors = sorted({0.0, *map(float, options["factors"])})
        specs = intervention_specs(model, truncate=truncate, extra=(), factors=factors)
        rows = run_interventions(model, run.test_loader, run.device, specs, amp=run.cfg.train.amp, progress=False)
        sizes = update_sizes(model, run.test_loader, run.device)
        trained = next(r for r in rows if r["kind"] == "trained")
        one_fewer = next(r for r in rows if r["kind"] == "truncate" and r["enc_loops"] == "-".join(
            str(max(v - 1, 0)) for v in model.cfg.loops))
        skipped = [r for r in rows if r["kind"] == "scale_update" and r["factor"] == 0.0]
        last = [sizes[(r["side"], r["scale"], r["loop"])] for r in skipped if (r["side"], r["scale"], r["loop"]) in sizes]
        for r in rows:  # each scaled update's own size, for the table
            r["update_rel"] = sizes.get((r["side"], r["scale"], r["loop"]))
        return {
            "interventions": rows,
            "update_sizes": [{"side": s, "scale": k, "loop": lp, "rel": v} for (s, k, lp), v in sorted(sizes.items())],
            "trunc1_cost_db": trained["psnr"] - one_fewer["psnr"],
            "trunc1_oor_gain": one_fewer["out_of_range"] - trained["out_of_range"],
            "skip_last_cost_db": statistics.fmean(trained["psnr"] - r["psnr"] for r in skipped),
            "last_update_rel": statistics.fmean(last) if last else None,
        }


EVALUATORS = {e.name: e for e in (Interventions(),)}
