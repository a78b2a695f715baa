"""eval compares the data's class names with the run's (issue 57, item 5): a folder with another set or order
of classes, or another data set behind an export's config, is one line and exit 2, never a figure."""
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from recurvit.errors import UserError
from recurvit.run.preprocessing import check_classes


def _folder(root, classes, per_class=3):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in classes:
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    return root


def test_the_class_check_names_what_differs():
    info = lambda *names: SimpleNamespace(class_names=names)  # noqa: E731
    check_classes({"class_names": ["0", "1", "2"]}, info("0", "1", "2"), "run")
    check_classes({}, info("0", "1"), "run")  # a record without names says nothing
    with pytest.raises(UserError, match=r"trained on 3 \('0', '1', '2'\) classes and the data has 2 .*missing 1 \('1'\)"):
        check_classes({"class_names": ["0", "1", "2"]}, info("0", "2"), "run")
    with pytest.raises(UserError, match="the same names in another order"):
        check_classes({"class_names": ["a", "b"]}, info("b", "a"), "run")
    with pytest.raises(UserError, match=r"not the run's 1 \('T-shirt/top'\)"):
        check_classes({"class_names": ["0"]}, info("0", "T-shirt/top"), "run")


@pytest.mark.slow
def test_eval_of_a_folder_with_other_classes_is_one_line(tmp_path):
    def recurvit(*args):
        return subprocess.run([sys.executable, "-m", "recurvit", *map(str, args)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)

    three, two = _folder(tmp_path / "three", ["0", "1", "2"]), _folder(tmp_path / "two", ["0", "2"])
    r = recurvit("train", "data.name=imagefolder", f"data.root={three}", "model.embed_dim=24", "model.num_heads=2",
                 "model.steps=2", "train.epochs=1", "train.progress=false", "--out", "run")
    assert r.returncode == 0, r.stderr[-1000:]
    assert recurvit("eval", "run").returncode == 0
    r = recurvit("eval", "run", "--data-root", two)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "missing 1 ('1')" in r.stderr
