"""recurvit.predict takes what a user has at hand: a path, a folder, a list of paths, PIL images
or a tensor; and `recurvit predict ... | head` ends quietly (no traceback) with status 141 (SIGPIPE's)."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from recurvit.cli import main

TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("predict_inputs") / "run"
    assert main(["train", *TINY, "train.epochs=1", "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """24 test digits as grey PNGs, one folder a class, and their uint8 tensor."""
    from PIL import Image

    from recurvit.config import DataConfig
    from recurvit.data import build_datasets

    _, test, _ = build_datasets(DataConfig(name="digits"), with_train=False)
    root = tmp_path_factory.mktemp("digits_pngs")
    for i, (img, y) in enumerate(zip(test.images[:24], test.labels[:24].tolist())):
        (root / str(y)).mkdir(exist_ok=True)
        Image.fromarray(img[0].numpy(), mode="L").save(root / str(y) / f"{i:04d}.png")
    return root


def test_predict_takes_a_path_a_folder_a_list_pil_images_and_tensors(run, folder):
    from PIL import Image

    import recurvit

    model = recurvit.load_model(run)
    files = sorted(folder.rglob("*.png"))
    by_folder = recurvit.predict(model, str(folder), topk=1)  # a string: a folder, not its characters
    assert [p.source for p in by_folder] == [str(f) for f in files]
    top = [p.top[0] for p in by_folder]
    assert [p.top[0] for p in recurvit.predict(model, folder, topk=1)] == top  # a Path
    assert recurvit.predict(model, str(files[0]), topk=1)[0].top[0] == top[0]  # one file
    assert [p.top[0] for p in recurvit.predict(model, [str(f) for f in files], topk=1)] == top
    pil = [Image.open(f) for f in files]
    assert recurvit.predict(model, pil[0], topk=1)[0].top[0] == top[0]  # one PIL image
    assert [p.top[0] for p in recurvit.predict(model, pil, topk=1)] == top
    raw = torch.stack([torch.from_numpy(np.array(im))[None] for im in pil])  # (B, 1, 8, 8) uint8
    assert [p.top[0] for p in recurvit.predict(model, raw, topk=1)] == top
    assert recurvit.predict(model, raw[0], topk=1)[0].top[0] == top[0]  # (C, H, W)
    mean, std = model.pretrained_cfg["mean"][0], model.pretrained_cfg["std"][0]
    ready = (raw.float() / 255 - mean) / std  # a float tensor: the model's input as is
    for got, want in zip(recurvit.predict(model, ready, topk=1), top):
        assert got.top[0][0] == want[0] and got.top[0][1] == pytest.approx(want[1], abs=1e-5)


def test_a_broken_pipe_ends_quietly(run, folder):
    """`recurvit predict RUN FOLDER... --json | head -1`: the reader goes after one line (the output, about
    160 KB, is more than a pipe holds, so the writer is still writing)."""
    proc = subprocess.Popen([sys.executable, "-m", "recurvit", "predict", str(run), *[str(folder)] * 20, "--json",
                             "--topk", "10"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err
