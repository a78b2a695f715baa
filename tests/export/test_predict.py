"""recurvit predict / recurvit.predict: a run predicts your own images with its own preprocessing, kept in
its checkpoint (no training data needed); timm reads the same preprocessing from ``pretrained_cfg``."""
import json

import pytest
import torch

from recurvit.cli import main

TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("predict") / "run"
    assert main(["train", *TINY, "train.epochs=3", "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    """The digits test split written as 8-bit grey PNGs, one folder a class."""
    from PIL import Image

    from recurvit.config import DataConfig
    from recurvit.data import build_datasets

    _, test, _ = build_datasets(DataConfig(name="digits"), with_train=False)
    root = tmp_path_factory.mktemp("pngs")
    for i, (img, y) in enumerate(zip(test.images, test.labels.tolist())):
        (root / str(y)).mkdir(exist_ok=True)
        Image.fromarray(img[0].numpy(), mode="L").save(root / str(y) / f"{i:04d}.png")
    return root


@pytest.mark.slow
def test_predict_on_pngs_of_the_test_split_equals_eval(run, pngs, capsys):
    assert main(["eval", str(run), "--json"]) == 0
    accuracy = json.loads(capsys.readouterr().out)["accuracy"]
    assert main(["predict", str(run), str(pngs), "--topk", "3", "--json"]) == 0
    preds = json.loads(capsys.readouterr().out)["predictions"]
    assert len(preds) == 360 and all(len(p["top"]) == 3 for p in preds)
    right = [p["top"][0]["label"] == p["image"].split("/")[-2] for p in preds]  # folder = the true label
    assert sum(right) / len(right) == pytest.approx(accuracy)


def test_a_checkpoint_carries_its_preprocessing_and_timm_reads_it(run):
    import timm.data

    import recurvit

    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["data"]["img_size"] == 8 and ckpt["data"]["in_chans"] == 1
    assert ckpt["data"]["class_names"] == [str(i) for i in range(10)]
    model = recurvit.load_model(run)
    cfg = timm.data.resolve_data_config(model=model)
    assert cfg["input_size"] == (1, 8, 8) and cfg["mean"] == tuple(ckpt["data"]["mean"])  # not 3x224 ImageNet


def test_python_predict_and_unreadable_files(run, pngs, tmp_path, capsys):
    from PIL import Image

    import recurvit

    model = recurvit.load_model(run)
    img = Image.open(next((pngs / "3").iterdir()))
    (pred,) = recurvit.predict(model, [img], topk=2)
    assert len(pred.top) == 2 and abs(sum(p for _, p in pred.top)) <= 1 + 1e-6
    (tmp_path / "broken.png").write_bytes(b"not an image")
    img.save(tmp_path / "ok.png")
    assert main(["predict", str(run), str(tmp_path), "--csv", str(tmp_path / "p.csv")]) == 0
    err = capsys.readouterr().err
    assert "skipped" in err and "broken.png" in err and "1 of 2 files skipped" in err
    assert (tmp_path / "p.csv").read_text().splitlines()[0] == "image,rank,label,prob"
    (tmp_path / "ok.png").unlink()
    (tmp_path / "p.csv").unlink()
    capsys.readouterr()
    assert main(["predict", str(run), str(tmp_path)]) == 2  # nothing readable: one line, exit 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none of the 1 files" in err and "broken.png" in err, err


@pytest.mark.slow
@pytest.mark.parametrize("model", [[], ["model.name=vit_tiny", "model.depth=2"],
                                   ["model.name=srvit_tiny", "model.depth=2", "model.recursions=2"],
                                   ["model.core=ode", "model.method=rk4", "model.t_end=2.0"]],
                         ids=["bvit", "vit", "srvit", "ode"])
def test_export_hf_loads_in_timm_and_recurvit_with_the_same_logits(tmp_path, model, capsys):
    import timm

    import recurvit

    run = tmp_path / "run"
    assert main(["train", *TINY, *model, "train.epochs=1", "--out", str(run), "--json"]) == 0
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    x = torch.randn(3, 1, 8, 8)
    ours = recurvit.load_model(run)
    theirs = timm.create_model(f"local-dir:{tmp_path / 'hf'}", pretrained=True).eval()
    again = recurvit.load_model(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), ours(x), rtol=0, atol=1e-6)
        torch.testing.assert_close(again(x), ours(x), rtol=0, atol=0)
    assert timm.data.resolve_data_config(model=theirs)["input_size"] == (1, 8, 8)
    assert again.pretrained_cfg["label_names"] == [str(i) for i in range(10)]
    capsys.readouterr()
    assert main(["export", str(run), "--format", "hf", "--out", str(tmp_path / "hf")]) == 2  # never over an export
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    from_run = json.loads(capsys.readouterr().out)
    assert main(["eval", str(tmp_path / "hf"), "--json"]) == 0  # the exported folder evaluates as its run
    assert json.loads(capsys.readouterr().out)["accuracy"] == from_run["accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("model", [[], ["model.name=vit_tiny", "model.depth=2"],
                                   ["model.name=srvit_tiny", "model.depth=2", "model.recursions=2"]],
                         ids=["bvit", "vit", "srvit"])
def test_torch_export_has_a_dynamic_batch_and_the_runs_logits(tmp_path, model):
    import recurvit

    run = tmp_path / "run"
    assert main(["train", *TINY, *model, "train.epochs=1", "--out", str(run), "--json"]) == 0
    assert main(["export", str(run), "--format", "torch-export", "--out", str(tmp_path / "m.pt2")]) == 0
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    for n in (1, 7):
        x = torch.randn(n, 1, 8, 8)
        with torch.no_grad():
            torch.testing.assert_close(program(x), recurvit.load_model(run)(x), rtol=0, atol=1e-6)


@pytest.mark.slow
def test_the_ode_core_says_in_one_line_why_it_cannot_be_torch_exported(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "model.core=ode", "model.method=rk4", "model.t_end=2.0", "train.epochs=1",
                 "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["export", str(run), "--format", "torch-export", "--out", str(tmp_path / "m.pt2")]) == 2
    err = capsys.readouterr().err
    assert "cannot be exported with torch.export" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.pt2").exists()


@pytest.mark.slow
@pytest.mark.parametrize("model", [[], ["model.name=vit_tiny", "model.depth=2"],
                                   ["model.name=srvit_tiny", "model.depth=2", "model.recursions=2"]],
                         ids=["bvit", "vit", "srvit"])
def test_onnx_export_runs_in_onnxruntime_with_the_runs_logits(tmp_path, model):
    ort = pytest.importorskip("onnxruntime")
    import recurvit

    run = tmp_path / "run"
    assert main(["train", *TINY, *model, "train.epochs=1", "--out", str(run), "--json"]) == 0
    assert main(["export", str(run), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 0
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    for n in (1, 6):
        x = torch.randn(n, 1, 8, 8)
        (y,) = session.run(["logits"], {"images": x.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(y), recurvit.load_model(run)(x), rtol=0, atol=1e-5)


def test_fused_without_a_step_program_export_is_one_line(run, tmp_path, capsys):
    """--fused joins a step-program export's step and readout; on a whole-model export it would be ignored."""
    capsys.readouterr()
    assert main(["export", str(run), "--format", "onnx", "--fused", "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fused" in err[0] and "--steps-program" in err[0]
    assert not (tmp_path / "m.onnx").exists()
