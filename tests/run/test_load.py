"""recurvit.run.load: ONE loader. ``recurvit.load_model`` and the commands that read a trained classifier
(predict, eval, export) accept a run directory, a checkpoint file, an hf-exported folder and a safetensors
export alike, and give the same model from each."""
import json

import pytest
import torch

import recurvit
from recurvit.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false"]
FORMS = ["run", "checkpoint", "hf", "safetensors"]


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    """One tiny digits run (1 epoch) and the four paths it can be read from."""
    root = tmp_path_factory.mktemp("load")
    run = root / "run"
    assert main(["train", *TINY, "train.epochs=1", "--out", str(run), "--json"]) == 0
    assert main(["export", str(run), "--format", "hf", "--out", str(root / "hf")]) == 0
    assert main(["export", str(run), "--format", "safetensors", "--out", str(root / "w.safetensors")]) == 0
    return {"run": run, "checkpoint": run / "last.pt", "hf": root / "hf", "safetensors": root / "w.safetensors"}


@pytest.fixture(scope="module")
def png(tmp_path_factory):
    from PIL import Image
    from sklearn.datasets import load_digits

    path = tmp_path_factory.mktemp("img") / "digit.png"
    Image.fromarray((load_digits().images[7] * 16).clip(0, 255).astype("uint8"), mode="L").save(path)
    return path


def _logits(model):
    with torch.no_grad():
        return model(torch.linspace(-2, 2, 3 * 64).reshape(3, 1, 8, 8))


@pytest.mark.parametrize("form", FORMS)
def test_load_model_reads_every_form_as_the_same_model(forms, form):
    reference = recurvit.load_model(forms["run"])
    model = recurvit.load_model(forms[form])
    assert not model.training and model.pretrained_cfg["label_names"] == [str(i) for i in range(10)]
    assert torch.equal(_logits(model), _logits(reference))
    loaded = recurvit.load(forms[form], steps=3)  # core options apply to every form
    assert loaded.model.nominal_steps == 3 and loaded.config.model.name == "bvit_tiny"
    assert loaded.data_record["name"] == "digits" and (loaded.checkpoint is None) == (form in ("hf", "safetensors"))


@pytest.mark.parametrize("form", FORMS)
def test_eval_reads_every_form(forms, form, capsys):
    assert main(["eval", str(forms["run"]), "--json"]) == 0
    reference = json.loads(capsys.readouterr().out)
    assert main(["eval", str(forms[form]), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["accuracy"], res["loss"], res["n"]) == (reference["accuracy"], reference["loss"], reference["n"])


@pytest.mark.parametrize("form", FORMS)
def test_predict_reads_every_form(forms, form, png, capsys):
    assert main(["predict", str(forms["run"]), str(png), "--json", "--topk", "3"]) == 0
    reference = json.loads(capsys.readouterr().out)["predictions"]
    assert main(["predict", str(forms[form]), str(png), "--json", "--topk", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["predictions"] == reference


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("fmt", ["hf", "safetensors"])
def test_export_reads_every_form(forms, form, fmt, tmp_path, capsys):
    out = tmp_path / ("again" if fmt == "hf" else "again.safetensors")
    assert main(["export", str(forms[form]), "--format", fmt, "--out", str(out)]) == 0
    assert torch.equal(_logits(recurvit.load_model(out)), _logits(recurvit.load_model(forms["run"])))


def test_a_damaged_export_is_one_line(forms, tmp_path, capsys):
    import shutil

    broken = tmp_path / "hf"
    shutil.copytree(forms["hf"], broken)
    (broken / "model.safetensors").write_bytes(b"\0" * 64)
    assert main(["predict", str(broken), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot read the exported folder" in err, err
