"""The run configs (recurvit.config, recurvit.vae.config): choices declared on their fields and checked
for every schema when a config is loaded; one optimizer schema for every task."""
import dataclasses

import pytest

from recurvit.config import OptimConfig, TrainConfig, load_config
from recurvit.errors import UserError
from recurvit.vae.config import VAETrainConfig, load_vae_config


@pytest.mark.parametrize("override, words", [
    ("train.amp=fp16", "train.amp must be one of auto, bf16, off, got 'fp16'"),
    ("train.supervision.weights=cubic", "train.supervision.weights must be one of uniform, linear, last"),
    ("train.depth.schedule=random", "train.depth.schedule must be one of fixed, uniform, poisson_lognormal"),
])
def test_a_value_outside_a_fields_choices_is_one_error_naming_the_key(override, words):
    with pytest.raises(UserError, match=words):
        load_config(None, [override])
    assert load_config(None, [override.split("=")[0] + "=" + {"train.amp": "bf16", "train.supervision.weights":
                                                              "uniform", "train.depth.schedule": "uniform"}[
        override.split("=")[0]]])  # a declared choice loads


def test_the_vae_schema_is_checked_by_the_same_declarations():
    with pytest.raises(UserError, match="train.recon must be one of l1, l2, got 'l3'"):
        load_vae_config(None, ["train.recon=l3"])
    with pytest.raises(UserError, match="train.amp must be one of"):
        load_vae_config(None, ["train.amp=half"])


def test_one_optimizer_schema_serves_every_task():
    optim = {f.name for f in dataclasses.fields(OptimConfig)}
    assert optim == {"epochs", "batch_size", "lr", "min_lr", "weight_decay", "warmup_epochs", "betas", "grad_clip"}
    for schema in (TrainConfig, VAETrainConfig):
        assert issubclass(schema, OptimConfig) and optim <= {f.name for f in dataclasses.fields(schema)}
    assert VAETrainConfig().lr != TrainConfig().lr  # each task keeps its own defaults
