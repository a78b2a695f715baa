"""The models shipped inside the package (src/recurvit/pretrained/): every file listed in its index and every
entry's file there, each loadable by name and held to the figure scripts/ship_model.py measured on it, on mazes
its run never saw; ``recurvit predict NAME maze.png`` from a fresh process outside the repository."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recurvit.pretrained import INDEX, list_pretrained, shipped

NAMES = list_pretrained()


def _fresh_mazes(entry, n):
    """``n`` mazes at the training size from a seed the run never used, none of them a training or validation
    maze of the run."""
    from recurvit.data.mazes import MazeDataset, make_mazes, seen_keys

    size, seed = entry.train_size, entry.data["maze_seed"]
    seen = seen_keys(entry.data["maze_train"], entry.data["maze_val"], size, seed)
    return MazeDataset(*make_mazes(n, size, seed + 1, "test", exclude=seen), size)


def test_at_least_one_solver_is_shipped_and_the_index_and_the_folder_agree():
    assert NAMES, "no model is shipped (issue 55: trained maze solvers a user can run without training)"
    listed = {e.file.name for e in shipped().values()}
    on_disk = {p.name for p in INDEX.parent.glob("*.safetensors")}
    assert listed == on_disk, f"listed but missing: {listed - on_disk}; shipped but not listed: {on_disk - listed}"
    for e in shipped().values():
        assert e.task == "mazes" and e.steps >= 1 and {"maze_seed", "maze_train", "maze_val"} <= set(e.data)
        assert f"solved_open_{e.train_size}" in e.measured and f"solved_{e.train_size}" in e.measured, e.name
        assert e.file.stat().st_size < 2_000_000, f"{e.name}: shipped weights are small ({e.file.stat().st_size} B)"


def test_the_shipped_models_table_is_what_the_index_gives():
    script = INDEX.parents[3] / "scripts" / "ship_model.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_reading_the_index_imports_no_torch():
    code = ("import sys, recurvit, recurvit.pretrained as p; p.shipped(); names = recurvit.list_pretrained(); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(len(names))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and int(r.stdout) == len(NAMES), r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_each_shipped_solver_solves_fresh_mazes_at_its_training_size(name):
    from torch.utils.data import DataLoader

    import recurvit
    from recurvit.tasks.dense.task import evaluate_dense

    entry = shipped()[name]
    model = recurvit.load_model(name)
    ev = evaluate_dense(model, DataLoader(_fresh_mazes(entry, 200), batch_size=50), next(model.parameters()).device,
                        amp="off")
    size = entry.train_size
    assert ev["n"] == 200
    assert ev["solved_open"] >= entry.floor(f"solved_open_{size}"), (name, ev, entry.measured)
    assert ev["solved"] >= entry.floor(f"solved_{size}"), (name, ev, entry.measured)


@pytest.mark.slow
def test_predict_by_name_from_a_fresh_process_outside_the_repository_draws_the_true_path(tmp_path):
    from PIL import Image

    name = NAMES[0]
    fresh = _fresh_mazes(shipped()[name], 20)
    import recurvit
    import torch

    model = recurvit.load_model(name)
    with torch.no_grad():
        pred = model(fresh.images.float() / 255).argmax(1)
    solved = [i for i in range(len(fresh)) if torch.equal(pred[i], fresh.targets[i].long())]
    assert solved, f"{name} solves none of 20 fresh mazes"
    i = solved[0]
    Image.fromarray(fresh.images[i].numpy().transpose(1, 2, 0).copy()).save(tmp_path / "maze.png")
    r = subprocess.run([sys.executable, "-m", "recurvit", "predict", name, "maze.png", "--json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["predictions"][0]
    assert out["path_pixels"] == int(fresh.targets[i].sum())
    drawn = np.asarray(Image.open(tmp_path / "maze.path.png").convert("L")) > 127  # white: the path
    assert np.array_equal(drawn, fresh.targets[i].numpy().astype(bool))


@pytest.mark.slow
def test_a_name_that_is_no_run_and_no_shipped_model_is_one_line_listing_the_shipped(tmp_path):
    r = subprocess.run([sys.executable, "-m", "recurvit", "predict", "no_such_solver", "maze.png"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no_such_solver" in r.stderr and all(n in r.stderr for n in NAMES)


@pytest.mark.slow
def test_a_path_that_exists_wins_over_a_shipped_name(tmp_path):
    name = NAMES[0]
    (tmp_path / name).mkdir()  # an empty folder of that name: read as the run it names, not the shipped model
    r = subprocess.run([sys.executable, "-m", "recurvit", "predict", name, "maze.png"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no checkpoint in" in r.stderr, r.stderr
