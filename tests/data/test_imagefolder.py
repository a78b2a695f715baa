"""Image folders that just work: the default size comes from the images, ONE img_size
setting (model.img_size or data.img_size) sizes model and data, a run whose first batches predict hours
stops, and predict reads an image of any shape as timm's eval transform does (the crop stored with the run)."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from recurvit.cli import main
from recurvit.config import DataConfig
from recurvit.data import build_datasets

TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.epochs=1", "train.progress=false"]


def _folder(root, size=(8, 8), per_class=4):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
                    root / split / c / f"{i}.png")
    return root


def test_an_image_folder_is_read_at_its_own_size(tmp_path):
    """8x8 PNGs train at 8 px (they were upscaled to 224: 3,136 tokens an image at patch 4); photos larger
    than 224 px are read at 224, and data.img_size still says otherwise."""
    small = _folder(tmp_path / "small")
    _, test, info = build_datasets(DataConfig(name="imagefolder", root=str(small)), with_train=False)
    assert info.img_size == 8 and test[0][0].shape == (3, 8, 8)
    big = _folder(tmp_path / "big", size=(300, 260), per_class=1)
    assert build_datasets(DataConfig(name="imagefolder", root=str(big)), with_train=False)[2].img_size == 224
    assert build_datasets(DataConfig(name="imagefolder", root=str(small), img_size=16))[2].img_size == 16


@pytest.mark.slow
def test_model_img_size_alone_sizes_the_images(tmp_path, capsys):
    """model.img_size=16 alone trains at 16 px (it ended in a raw shape traceback); both given and
    different is one line."""
    root = _folder(tmp_path / "f")
    run = tmp_path / "run"
    assert main(["train", "data.name=imagefolder", f"data.root={root}", "model.img_size=16", "model.patch_size=4",
                 *TINY, "--out", str(run), "--json"]) == 0
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["data"]["img_size"] == 16 and ckpt["data"]["crop_pct"] == 0.875  # the crop stored with the run
    capsys.readouterr()
    assert main(["train", "model.img_size=16", "data.img_size=24", *TINY, "--out", str(tmp_path / "r2")]) == 2
    assert "model.img_size=16" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_whose_first_batches_predict_hours_stops(tmp_path, capsys, monkeypatch):
    from recurvit.analysis import budget

    monkeypatch.setattr(budget, "MAX_TRAIN_SECONDS", 1e-9)  # any pace is "hours" now
    args = ["train", "data.name=synthetic", "data.synthetic_size=8", "model.patch_size=4", "train.batch_size=32",
            *TINY]
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stopped: the first batches took" in err and "--force" in err, err
    assert main([*args, "--out", str(tmp_path / "forced"), "--force"]) == 0


@pytest.mark.slow
def test_predict_resizes_and_centre_crops_an_image_of_another_shape(tmp_path, capsys):
    """A 16x8 PNG for an 8 px digits run: its centre 8x8 is read (crop_pct 1.0, as timm's eval transform),
    where predict said "crop it square first"."""
    import recurvit

    run = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(run), "--json"]) == 0
    model = recurvit.load_model(run)
    assert model.pretrained_cfg["crop_pct"] == 1.0
    rng = np.random.default_rng(1)
    wide = rng.integers(0, 17, (8, 16), dtype=np.uint8)
    centre = Image.fromarray(wide[:, 4:12].copy())
    (a,), (b,) = recurvit.predict(model, [Image.fromarray(wide)]), recurvit.predict(model, [centre])
    assert a.top == b.top
    tall = Image.fromarray(rng.integers(0, 17, (32, 16), dtype=np.uint8))  # shorter side 16 -> 8, then the centre
    (c,) = recurvit.predict(model, [tall])
    (d,) = recurvit.predict(model, [tall.resize((8, 16), Image.BILINEAR).crop((0, 4, 8, 12))])  # PIL's way, by hand
    assert c.top[0][0] == d.top[0][0] and c.top[0][1] == pytest.approx(d.top[0][1], abs=0.05)
    assert json.dumps(c.as_dict())
