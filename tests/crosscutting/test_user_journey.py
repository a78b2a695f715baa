"""A new user's first hour, outside the repository folder: train from a packaged config
by name, predict on non-square PNGs, export, fine-tune the export with timm's own call and validate it with
timm's validate.py pipeline at its defaults. Every command runs as the installed `recurvit` would, in a fresh
process whose working folder holds nothing of the repository."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def recurvit(home: Path, *args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "recurvit", *map(str, args)], cwd=home, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("user_home")
    assert REPO not in home.parents and not (home / "configs").exists()
    return home


@pytest.fixture(scope="module")
def run(home):
    """`recurvit train digits/bvit` from a folder with no configs/ in it: the packaged config, found by name."""
    recurvit(home, "train", "digits/bvit", "train.epochs=2", "train.progress=false", "--out", "run")
    return home / "run"


@pytest.fixture(scope="module")
def digits(home):
    """The first 60 test digits as square PNGs and the same digits padded to 8x12 and 12x8 with the background
    grey: timm's eval transform (resize the short side, centre-crop) brings the padded ones back to the square."""
    from PIL import Image

    from recurvit.config import DataConfig
    from recurvit.data import build_datasets

    _, test, _ = build_datasets(DataConfig(name="digits"), with_train=False)
    square, wide, tall = home / "square", home / "wide", home / "tall"
    for folder in (square, wide, tall):
        folder.mkdir()
    for i, (img, y) in enumerate(zip(test.images[:60], test.labels[:60].tolist())):
        a = img[0].numpy()
        Image.fromarray(a, mode="L").save(square / f"{i:03d}_{y}.png")
        Image.fromarray(np.pad(a, ((0, 0), (2, 2))), mode="L").save(wide / f"{i:03d}_{y}.png")
        Image.fromarray(np.pad(a, ((2, 2), (0, 0))), mode="L").save(tall / f"{i:03d}_{y}.png")
    return square, wide, tall


@pytest.fixture(scope="module")
def predicted(home, run, digits):
    """`recurvit predict RUN square wide tall --topk 1 --json`, one call: {folder name: [(file, class), ...]}."""
    out = json.loads(recurvit(home, "predict", run, *digits, "--topk", "1", "--json").stdout)
    by_folder = {}
    for r in out["predictions"]:
        image = Path(r["image"])
        by_folder.setdefault(image.parent.name, []).append((image.name, r["top"][0]["label"]))
    return by_folder


def test_trains_from_a_packaged_config_by_name_outside_the_repository(run):
    import yaml

    import recurvit

    packaged = recurvit.load_config("digits/bvit")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["model"]["embed_dim"] == packaged.model.embed_dim and cfg["train"]["lr"] == packaged.train.lr
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[-1])["test_acc"] > 0.3


def test_predicts_non_square_pngs_as_the_square_ones(predicted):
    want = predicted["square"]
    assert len(want) == 60
    assert predicted["wide"] == want
    assert predicted["tall"] == want
    right = sum(label == name.split("_")[1].removesuffix(".png") for name, label in want)
    assert right / 60 > 0.3  # the run learned something: the comparison above is not between constant answers


def test_timm_fine_tunes_the_export_with_a_new_head(home, run):
    """timm.create_model("local-dir:OUT", pretrained=True, num_classes=5), then a few optimizer steps on the
    digits 0-4: the loss falls, and everything but the new head starts from the run's weights."""
    recurvit(home, "export", run, "--format", "hf", "--out", "hf")
    code = f"""
import json, torch, timm, recurvit
from recurvit.config import DataConfig
from recurvit.data import build_datasets
train, _, _ = build_datasets(DataConfig(name="digits"))
keep = train.labels < 5
x = ((train.images[keep][:256].float() / 255) - 0.5) / 0.5
y = train.labels[keep][:256]
model = timm.create_model("local-dir:{home / 'hf'}", pretrained=True, num_classes=5)
ours = recurvit.load_model("{run}")
same = all(torch.equal(p, ours.state_dict()[k]) for k, p in model.state_dict().items() if not k.startswith("head"))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
losses = []
for _ in range(30):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
print(json.dumps({{"same": same, "first": losses[0], "last": losses[-1]}}))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=home, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["same"]
    assert got["last"] < 0.5 * got["first"]


def test_timm_validate_pipeline_at_its_defaults_gives_recurvits_predictions(home, run, digits, predicted):
    """validate.py with no flags: create_model(local-dir, in_chans=3), resolve_data_config(args, model=m),
    an RGB ImageFolder and timm's eval loader, on the non-square PNGs: the same classes recurvit predicts."""
    import timm
    from timm.data import create_loader, resolve_data_config
    from timm.data.dataset import ImageDataset

    wide = digits[1]
    if not (home / "hf").exists():
        recurvit(home, "export", run, "--format", "hf", "--out", "hf")
    want = [label for _, label in predicted["square"]]
    model = timm.create_model(f"local-dir:{home / 'hf'}", pretrained=True, in_chans=3).eval()
    no_flags = dict(input_size=None, in_chans=None, img_size=None, mean=None, std=None, crop_pct=None,
                    interpolation="", crop_mode=None)
    data = resolve_data_config(no_flags, model=model)
    dataset = ImageDataset(str(wide), input_img_mode="RGB")
    loader = create_loader(dataset, input_size=data["input_size"], batch_size=64, use_prefetcher=False,
                           interpolation=data["interpolation"], mean=data["mean"], std=data["std"], num_workers=0,
                           crop_pct=data["crop_pct"], crop_mode=data["crop_mode"])
    names = model.pretrained_cfg.get("label_names") or [str(i) for i in range(10)]
    with torch.no_grad():
        got = [names[i] for x, _ in loader for i in model(x).argmax(-1).tolist()]
    files = [Path(f).name for f, _ in dataset.reader.samples]
    assert files == sorted(files)
    assert got == want
