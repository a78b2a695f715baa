"""What a study asks of fine-tuning runs: fine-tune each run of another study (``from:``) with the
recipe of this study's grid, then evaluate it as a classification run (the same evaluators, columns,
tables and plots as :mod:`recurvit.tasks.classify.study`, plus the method and its trainable parameters).

::

    name: fashion-transfer
    task: finetune
    from: {study: fashion_plateau.yaml, only: {regime: [naive, vit_matched_flops]}}
    overrides: {finetune.data: digits, data.img_size: 28, train.epochs: 10}
    grid:
      method: {full: {finetune.method: full}, lora: {finetune.method: lora, finetune.rank: 4}}

``finetune.*`` keys are the recipe (``method``, ``data``, ``rank``, ``alpha``; ``recurvit finetune``'s
options); every other key is a ``data.`` / ``train.`` override of the fine-tune. A run's source is
its source study's run directory, which must hold a trained last.pt.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from ...errors import UserError
from ...run.progress import quiet
from ...study.grouping import table
from .finetune import finetune, finetune_resume
from .study import ClassifyView, evaluate_trained

RECIPE = {"finetune.method": "method", "finetune.data": "data", "finetune.rank": "rank", "finetune.alpha": "alpha"}


def recipe_of(overrides: List[str]) -> tuple:
    """(recipe, the remaining data./train. overrides) of a fine-tuning run's override list."""
    recipe: Dict[str, Any] = {"method": "lora", "data": None, "rank": 4, "alpha": None}
    rest = []
    for ov in overrides:
        key, _, value = ov.partition("=")
        if key in RECIPE:
            recipe[RECIPE[key]] = yaml.safe_load(value)
        elif key.startswith("finetune."):
            raise UserError(f"unknown fine-tuning key {key} (the recipe keys: {', '.join(RECIPE)})")
        else:
            rest.append(ov)
    if recipe["data"] is None:
        raise UserError("a fine-tuning study names its target data set: finetune.data (e.g. digits)")
    return recipe, rest


class FinetuneView(ClassifyView):
    """Fine-tuning runs: a classification run's row, tables and plots, plus the method and what it trains."""

    name = "finetune"
    CSV_KEYS = ["method", "trainable_params", *ClassifyView.CSV_KEYS]
    SHARED_KEYS = [*ClassifyView.SHARED_KEYS, "trainable_params"]

    def check_run(self, base: str, overrides: List[str]) -> None:
        """Nothing before the runs: a run's source is another study's run directory, made by then."""
        return None

    def run(self, base: str, overrides: List[str], out: Path, eval_spec: Dict[str, Any], nproc: int = 1,
            threads: Optional[int] = None) -> Dict[str, Any]:
        """Fine-tune the source run ``base`` (resuming an interrupted fine-tune), then evaluate it."""
        recipe, rest = recipe_of(overrides)
        if nproc > 1:
            raise UserError("a fine-tuning study trains each run in one process")
        if not (Path(base) / "last.pt").is_file():
            raise UserError(f"source run {base} has no last.pt: run the study it comes from first (from:)")
        if (out / "finetune.json").is_file() and (out / "last.pt").is_file():
            summary = finetune_resume(out, log=quiet)
        else:
            summary = finetune(base, recipe["data"], recipe["method"], int(recipe["rank"]), recipe["alpha"],
                               rest + ["train.progress=false"], out, log=quiet)
        row = evaluate_trained(out, eval_spec, summary)
        return {**row, "method": recipe["method"], "trainable_params": summary.get("trainable_params"),
                "source": str(base)}

    def tables(self, rows: List[Dict[str, Any]], cs: List[Dict[str, Any]], study, seeds: list) -> List[str]:
        """The classification tables, then what each recipe trains (its trainable parameters, head included)."""
        axes = study.cell_axes()
        body = [[str(c[a]) for a in axes] + [f"{c['trainable_params']:,}",
                                             f"{100 * c['trainable_params'] / c['params_stored']:.1f}%"]
                for c in cs if c.get("trainable_params")]
        extra = (["Trainable parameters of each fine-tune (the head included; stored = the model with its "
                  "adapters):", ""] + table(axes + ["trainable params", "of stored"], body) + [""]) if body else []
        return super().tables(rows, cs, study, seeds) + extra
