"""An export timm can fine-tune and validate: ``recurvit export --format hf`` writes what timm's
own ``save_for_hf`` writes, under the model's real shape name; timm's standard calls (``local-dir:`` with a
new head, ``in_chans=3``, ``resolve_data_config``) and the pipelines of timm's validate.py / onnx_validate.py
give recurvit's own accuracy without extra flags; ``recurvit.load_model`` reads an exported folder (with
overrides) and a .safetensors file."""
import json
import subprocess
import sys

import pytest
import torch

from recurvit.cli import main

TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false"]
# validate.py's arguments at their defaults (no flags): what its resolve_data_config(vars(args), model=m) reads
NO_FLAGS = dict(input_size=None, in_chans=None, img_size=None, mean=None, std=None, crop_pct=None,
                interpolation="", crop_mode=None)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("export_timm") / "run"
    assert main(["train", *TINY, "train.epochs=1", "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def hf(run):
    out = run.parent / "hf"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def accuracy(run):
    from recurvit.commands import open_trained

    import argparse

    model, _, device, loader, _ = open_trained(argparse.Namespace(run=run, device="cpu", data_root=None))
    with torch.no_grad():
        right = sum(int((model(x).argmax(-1) == y).sum()) for x, y in loader)
    return right / len(loader.dataset)


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    """The digits test split as grey PNGs, one folder a class (timm's ImageFolder reads it)."""
    from PIL import Image

    from recurvit.config import DataConfig
    from recurvit.data import build_datasets

    _, test, _ = build_datasets(DataConfig(name="digits"), with_train=False)
    root = tmp_path_factory.mktemp("pngs")
    for i, (img, y) in enumerate(zip(test.images, test.labels.tolist())):
        (root / str(y)).mkdir(exist_ok=True)
        Image.fromarray(img[0].numpy(), mode="L").save(root / str(y) / f"{i:04d}.png")
    return root


def test_the_hf_export_is_what_timm_save_for_hf_writes_named_by_its_real_shape(hf):
    config = json.loads((hf / "config.json").read_text())
    assert config["architecture"] == "bvit_tiny_patch4_8"  # 8 px digits in 4 px patches, not ..._patch16_224
    pre = config["pretrained_cfg"]
    assert pre["classifier"] == "head" and pre["first_conv"] == "patch_embed.proj"
    assert pre["input_size"] == [1, 8, 8] and pre["interpolation"] == "bilinear" and pre["crop_pct"] == 1.0
    assert config["model_args"]["patch_size"] == 4 and config["num_features"] == 24
    # a fresh process: timm's local-dir loader finds the shape name once recurvit is imported
    code = (f"import recurvit, timm; m = timm.create_model('local-dir:{hf}', pretrained=True); "
            "print(m.cfg.img_size, m.cfg.patch_size, m.num_classes)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.split() == ["8", "4", "10"], res.stderr[-800:]


def test_timm_fine_tunes_the_export_with_a_new_head(hf, run):
    import timm

    import recurvit

    ours = recurvit.load_model(run)
    five = timm.create_model(f"local-dir:{hf}", pretrained=True, num_classes=5)
    assert five(torch.randn(2, 1, 8, 8)).shape == (2, 5)
    torch.testing.assert_close(five.patch_embed.proj.weight, ours.patch_embed.proj.weight, rtol=0, atol=0)
    cfg = timm.data.resolve_data_config(model=five)
    assert cfg["input_size"] == (1, 8, 8) and tuple(cfg["mean"]) == tuple(ours.pretrained_cfg["mean"])


def test_timm_validate_pipeline_without_flags_gives_recurvits_accuracy(hf, pngs, run, accuracy):
    """validate.py: create_model(local-dir, pretrained=True, in_chans=3) (its default), resolve_data_config
    (vars(args), model=m), create_dataset (RGB for 3 channels), create_loader with the prefetcher. The grey
    model's patch embedding is a convolution, so timm adapts it to 3 channels: grey PNGs read as RGB give the
    run's logits. (Every model recurvit exports has that stem; dt_net and LoopVAE have no hf export.)"""
    import timm
    from timm.data import create_dataset, create_loader, resolve_data_config

    import recurvit

    model = timm.create_model(f"local-dir:{hf}", pretrained=True, in_chans=3).eval()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x.expand(-1, 3, -1, -1)), recurvit.load_model(run)(x), rtol=0, atol=1e-5)
    data = resolve_data_config(NO_FLAGS, model=model)
    assert data["input_size"] == (3, 8, 8)
    mode = "RGB" if data["input_size"][0] == 3 else "L"
    dataset = create_dataset(root=str(pngs), name="", split="validation", input_img_mode=mode)
    loader = create_loader(dataset, input_size=data["input_size"], batch_size=256, use_prefetcher=True,
                           interpolation=data["interpolation"], mean=data["mean"], std=data["std"], num_workers=0,
                           crop_pct=data["crop_pct"], crop_mode=data["crop_mode"], device=torch.device("cpu"))
    with torch.no_grad():
        right = sum(int((model(x).argmax(-1) == y).sum()) for x, y in loader)
    assert right / len(dataset) == pytest.approx(accuracy, abs=1e-9)


def test_onnx_validate_pipeline_with_the_exports_own_preprocessing_gives_recurvits_accuracy(run, pngs, accuracy,
                                                                                              tmp_path):
    """onnx_validate.py: resolve_data_config(args) with no model, so the preprocessing must come with the file:
    the export stores it in the ONNX metadata, recurvit reads it back (the --interpolation etc. one would
    otherwise type), and timm's loader + onnxruntime then give the run's accuracy."""
    ort = pytest.importorskip("onnxruntime")
    from timm.data import create_dataset, create_loader, resolve_data_config

    from recurvit.export.program import read_preprocessing

    path = tmp_path / "m.onnx"
    assert main(["export", str(run), "--format", "onnx", "--out", str(path)]) == 0
    pre = read_preprocessing(path)
    assert pre["interpolation"] == "bilinear" and pre["input_size"] == (1, 8, 8) and len(pre["label_names"]) == 10
    data = resolve_data_config(pre)
    session = ort.InferenceSession(str(path))
    dataset = create_dataset("", str(pngs), input_img_mode="RGB" if data["input_size"][0] == 3 else "L")
    loader = create_loader(dataset, input_size=data["input_size"], batch_size=256, use_prefetcher=False,
                           interpolation=data["interpolation"], mean=data["mean"], std=data["std"], num_workers=0,
                           crop_pct=data["crop_pct"])
    right = 0
    for x, y in loader:
        (logits,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        right += int((torch.from_numpy(logits).argmax(-1) == y).sum())
    assert right / len(dataset) == pytest.approx(accuracy, abs=1e-9)


def test_load_model_reads_an_exported_folder_with_overrides_and_a_safetensors_file(run, hf, tmp_path):
    import recurvit

    ours = recurvit.load_model(run)
    x = torch.randn(3, 1, 8, 8)
    ode = recurvit.load_model(hf, core="ode")
    assert ode.cfg.core == "ode" and ode.pretrained_cfg["label_names"] == [str(i) for i in range(10)]
    torch.testing.assert_close(ode.state_dict()["patch_embed.proj.weight"], ours.state_dict()["patch_embed.proj.weight"])
    assert recurvit.load_model(hf, steps=5).cfg.steps == 5
    path = tmp_path / "w.safetensors"
    assert main(["export", str(run), "--format", "safetensors", "--out", str(path)]) == 0
    with torch.no_grad():
        for loaded in (recurvit.load_model(path), recurvit.load_model(hf / "model.safetensors")):
            torch.testing.assert_close(loaded(x), ours(x), rtol=0, atol=0)
    assert recurvit.load_model(path, core="ode").cfg.core == "ode"
