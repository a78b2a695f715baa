"""The run configs (recurvit.config, recurvit.tasks.vae.config): choices declared on their fields and checked
for every schema when a config is loaded; one optimizer schema for every task; the model sections
derived from the model configs' own fields."""
import dataclasses
import re
from pathlib import Path

import pytest

from recurvit.config import OptimConfig, TrainConfig, load_config
from recurvit.errors import UserError
from recurvit.tasks.vae.config import VAETrainConfig, load_vae_config


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
    assert optim == {"epochs", "batch_size", "lr", "min_lr", "weight_decay", "warmup_epochs", "betas", "grad_clip",
                     "optimizer", "warmup", "lr_schedule", "lr_milestones", "lr_factor", "block_lr_scale", "lr_throttle"}
    for schema in (TrainConfig, VAETrainConfig):
        assert issubclass(schema, OptimConfig) and optim <= {f.name for f in dataclasses.fields(schema)}
    assert VAETrainConfig().lr != TrainConfig().lr  # each task keeps its own defaults


def test_the_run_configs_model_keys_are_the_model_configs_fields():
    """ModelConfig / VAEModelConfig are derived from the architecture fields the model configs take
    (recurvit.model_fields), not kept by hand: every model field is a run-config key defaulting to None
    ("the preset's value"), typed as the model field is, and a run config's model builds that model."""
    import dataclasses
    import typing

    from recurvit.config import ModelConfig, load_config
    from recurvit.models import ViTConfig, create_model
    from recurvit.models.loopvae import LoopVAEConfig
    from recurvit.tasks.vae.config import VAEModelConfig

    for run_cls, model_cls, extra in ((ModelConfig, ViTConfig, {"options"}), (VAEModelConfig, LoopVAEConfig, set())):
        run_fields = {f.name: f for f in dataclasses.fields(run_cls)}
        model_fields = {f.name: f for f in dataclasses.fields(model_cls)}
        assert set(run_fields) == {"name"} | set(model_fields)
        for name, f in model_fields.items():
            if name in extra:
                continue
            assert run_fields[name].default is None
            assert typing.get_type_hints(run_cls)[name] == typing.Optional[typing.get_type_hints(model_cls)[name]]
    with pytest.raises(UserError, match="model.embed_dim"):
        load_config(None, ["model.embed_dim=wide"])
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs/digits/bvit.yaml", ["model.mlp_ratio=2.5"])
    keys = {k: v for k, v in dataclasses.asdict(cfg.model).items() if k not in ("name", "options") and v is not None}
    assert create_model(cfg.model.name, **keys).cfg.mlp_ratio == 2.5


@pytest.mark.slow  # builds the digits data set for --print-config
def test_a_config_is_a_path_or_a_packaged_name_from_any_folder(tmp_path, monkeypatch, capsys):
    """Issue 41, item 3: `digits/bvit`, `digits/bvit.yaml` and the README's `configs/digits/bvit.yaml` name the
    packaged config from any folder; a file that exists is read as written; `recurvit configs` lists the names."""
    import json

    from recurvit.cli import main
    from recurvit.config_names import config_names, packaged_root
    from recurvit.study.spec import load_study

    monkeypatch.chdir(tmp_path)  # not the repository root: no configs/ here
    packaged = load_config(packaged_root() / "digits" / "bvit.yaml", ["train.epochs=2"])
    for arg in ("digits/bvit", "digits/bvit.yaml", "configs/digits/bvit.yaml", "./configs/digits/bvit.yaml"):
        assert load_config(arg, ["train.epochs=2"]) == packaged, arg
    import recurvit
    assert recurvit.load_config("digits/bvit") == load_config(packaged_root() / "digits" / "bvit.yaml")
    assert load_vae_config("vae/digits").model.name == "loopvae_conv"
    (tmp_path / "configs" / "digits").mkdir(parents=True)  # a user's own file of that path wins over the name
    (tmp_path / "configs" / "digits" / "bvit.yaml").write_text("model:\n  steps: 3\n")
    assert load_config("configs/digits/bvit.yaml").model.steps == 3
    for bad in ("digits/nope", "../digits/bvit", "digits"):
        with pytest.raises(UserError, match="recurvit configs"):
            load_config(bad)
    (tmp_path / "s.yaml").write_text("name: x\nbase: digits/crossroads/naive\ngrid: {model.steps: [2]}\n")
    assert load_study(tmp_path / "s.yaml").base == packaged_root() / "digits" / "crossroads" / "naive.yaml"

    assert main(["train", "digits/vit", "--print-config"]) == 0  # the CLI takes the name too
    assert "name: vit_tiny" in capsys.readouterr().out
    assert main(["configs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["configs"]
    assert [c["name"] for c in listed] == config_names() and len(listed) == len(list(packaged_root().rglob("*.yaml")))
    row = next(c for c in listed if c["name"] == "digits/bvit")
    assert row["command"] == "recurvit train" and "bViT" in row["summary"]
    assert main(["configs"]) == 0 and "digits/crossroads/ode_rk4" in capsys.readouterr().out


@pytest.mark.parametrize("override, words", [
    ("model.init_values=nan", "model.init_values must be a finite number >= 0, got nan"),
    ("model.init_values=inf", "model.init_values must be a finite number >= 0, got inf"),
    ("model.init_values=-0.1", "model.init_values must be a finite number >= 0, got -0.1"),
    ("model.drop_rate=nan", "model.drop_rate must be a number in [0, 1), got nan"),
    ("model.drop_path=1.0", "model.drop_path must be a number in [0, 1), got 1.0"),
    ("model.mlp_ratio=0", "model.mlp_ratio must be a finite number > 0, got 0.0"),
])
def test_a_model_number_outside_its_declared_range_is_refused_when_the_config_loads(override, words):
    with pytest.raises(UserError, match=re.escape(words)):
        load_config(None, [override])


def test_numbers_in_range_load_and_unset_passes():
    cfg = load_config(None, ["model.init_values=0.1", "model.drop_path=0.5", "model.drop_rate=0"])
    assert (cfg.model.init_values, cfg.model.drop_path, cfg.model.drop_rate) == (0.1, 0.5, 0.0)
    assert load_config(None, ["model.init_values=null"]).model.init_values is None


def test_the_vae_model_numbers_are_checked_by_the_same_declarations():
    with pytest.raises(UserError, match=re.escape("model.mod_init must be a finite number >= 0, got nan")):
        load_vae_config(None, ["model.mod_init=nan"])
    with pytest.raises(UserError, match="model.mlp_ratio must be a finite number > 0"):
        load_vae_config(None, ["model.mlp_ratio=-2"])
