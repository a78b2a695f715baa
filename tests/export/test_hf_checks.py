"""An hf / safetensors export is checked when it is loaded (issue 57, items 7 and 12): a NaN or zero
statistic, class names that are short or not strings, a channel count the model does not take, weights that
are not floating point, or model_args that are not a mapping: one line naming the field, never a prediction of
NaN or weights cast in silence."""
import json

import pytest
import torch
from tests.conftest import fails_in_one_line
from safetensors.torch import load_file, save_file

import recurvit
from recurvit.errors import UserError
from recurvit.export.hf import export_hf
from recurvit.run.load import Loaded, load


@pytest.fixture
def export(tmp_path):
    model = recurvit.create_model("bvit_tiny", img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=24,
                                  num_heads=2, steps=2)
    cfg = recurvit.load_config(None, ["model.img_size=8", "model.patch_size=4", "model.in_chans=1", "model.num_classes=3",
                                      "model.embed_dim=24", "model.num_heads=2", "model.steps=2"])
    data = {"name": "imagefolder", "img_size": 8, "in_chans": 1, "mean": [0.5], "std": [0.25],
            "class_names": ["a", "b", "c"], "pipeline": "folder", "crop_pct": 0.875, "root": None}
    from recurvit.run.preprocessing import pretrained_cfg
    model.pretrained_cfg = pretrained_cfg(data, 3)
    folder = export_hf(Loaded(model.eval(), cfg, tmp_path / "run"), tmp_path / "hf")
    assert load(folder).model is not None
    return folder


def _edit(folder, **data):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["recurvit"]["data"].update(data)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("field, value, says", [
    ("mean", [float("nan")], "has mean [nan], not 1 finite number"),
    ("std", [0.0], "has std [0.0], not > 0"),
    ("class_names", ["a", "b"], "not 3 names"),
    ("class_names", [0, 1, 2], "not 3 names"),
    ("in_chans", 3, "says in_chans 3, and the model takes 1"),
    ("img_size", -8, "has img_size -8"),
    ("name", "nosuchdata", "names the data set 'nosuchdata', not one of recurvit's"),
])
def test_a_lying_record_is_one_line(export, field, value, says):
    _edit(export, **{field: value})
    with pytest.raises(UserError, match="its preprocessing record") as e:
        load(export)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_weights_that_are_not_floating_point_are_refused_not_cast(export):
    state = load_file(str(export / "model.safetensors"))
    name = next(k for k in state if k.endswith("weight"))
    state[name] = state[name].to(torch.int64)
    save_file(state, str(export / "model.safetensors"))
    with pytest.raises(UserError, match=f"its weights hold torch.int64 tensors \\({name}"):
        load(export)


def test_model_args_that_are_not_a_mapping_are_one_line(export):
    cfg = json.loads((export / "config.json").read_text())
    cfg["model_args"] = "bvit"
    (export / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="its model_args is a str, not a mapping"):
        load(export)


def _png(path):
    from PIL import Image

    Image.new("L", (8, 8), 3).save(path)
    return path


@pytest.mark.parametrize("command", ["predict", "eval"])
def test_an_unknown_data_set_in_the_record_is_one_line_in_predict_and_eval(export, tmp_path, capsys, command):
    _edit(export, name="nosuchdata")
    argv = [command, export, *([_png(tmp_path / "x.png")] if command == "predict" else [])]
    fails_in_one_line(capsys, argv, "names the data set 'nosuchdata'")


def test_a_record_of_another_image_size_is_one_line_in_predict(export, tmp_path, capsys):
    _edit(export, img_size=16)  # the model takes 8 px: images read at 16 px were a shape error
    fails_in_one_line(capsys, ["predict", export, _png(tmp_path / "x.png")], "record says img_size 16",
                      "the model takes 8x8 px images")


@pytest.mark.parametrize("key, value", [("in_chans", 3), ("img_size", [16, 16])])
def test_model_args_of_another_shape_are_one_line(export, key, value):
    cfg = json.loads((export / "config.json").read_text())
    cfg["model_args"][key] = value
    (export / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="does not match its model") as e:
        load(export)
    assert "\n" not in str(e.value)


def test_the_description_says_the_steps_the_run_was_trained_at(export):
    cfg = json.loads((export / "config.json").read_text())
    assert "(2 trained)" in cfg["pretrained_cfg"]["description"]  # the preset's own words said 12


@pytest.mark.parametrize("target", ["empty", "file", "nothing"])
def test_an_out_that_is_a_symbolic_link_is_refused_as_every_format_refuses_it(export, tmp_path, capsys, target):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("mine\n")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / target)
    for fmt in ("hf", "safetensors"):
        fails_in_one_line(capsys, ["export", export, "--format", fmt, "--out", link], f"{link} exists; choose another OUT")
    assert link.is_symlink() and (target != "empty" or not any((tmp_path / "empty").iterdir()))
    assert target != "file" or (tmp_path / "file").read_text() == "mine\n"
