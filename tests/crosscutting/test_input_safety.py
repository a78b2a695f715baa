"""Input that makes no sense is one line and exit 2, not a meaningless result or a traceback: config
numbers, weights that hold NaN, pickles with code in them, a full disk while saving, symlinks and odd
file names in an image folder; and a checkpoint survives a power loss (the directory is fsynced)."""
from __future__ import annotations

import errno
import io
import json
import os
import shutil

import pytest
from tests.conftest import fails_in_one_line
import torch
from PIL import Image

from recurvit.cli import main
from recurvit.config import DataConfig
from recurvit.data import build_datasets
from recurvit.errors import UserError
from recurvit.run import checkpoint as ckpt_io
from recurvit.run.rundir import RunDir
from recurvit.run.atomic import write_atomic

TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false"]


_fails = fails_in_one_line


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A finished 1-epoch tiny digits run; tests copy it."""
    run = tmp_path_factory.mktemp("input_safety") / "r"
    assert main(["train", *TINY, "train.epochs=1", "--out", str(run)]) == 0
    return run


def _copy(run, tmp_path):
    dst = tmp_path / "r"
    shutil.copytree(run, dst)
    return dst


# -------------------------------------------------------------------------- 1. config numbers
@pytest.mark.parametrize("override,key", [
    ("model.num_classes=1", "model.num_classes"),
    ("model.num_classes=0", "model.num_classes"),  # was: a headless model trained and reported an accuracy
    ("train.betas=[0.9,1.0]", "train.betas"),
    ("train.betas=[1.5,0.999]", "train.betas"),
    ("train.betas=[-0.1,0.999]", "train.betas"),
    ("train.betas=[0.9,nan]", "train.betas"),
    ("model.drop_path=1.0", "model.drop_path"),
    ("model.drop_path=-0.1", "model.drop_path"),
    ("model.drop_rate=1.5", "model.drop_rate"),
    ("train.grad_clip=nan", "train.grad_clip"),
    ("train.weight_decay=nan", "train.weight_decay"),  # was: a divergence blaming train.lr
    ("train.weight_decay=-1", "train.weight_decay"),
    ("train.min_lr=nan", "train.min_lr"),
    ("train.warmup_epochs=nan", "train.warmup_epochs"),
    ("train.label_smoothing=nan", "train.label_smoothing"),
])
def test_nonsense_numbers_are_refused_before_training(tmp_path, capsys, override, key):
    capsys.readouterr()
    code = main(["train", *TINY, "train.epochs=1", override, "--out", str(tmp_path / "r")])
    out = capsys.readouterr()
    err = out.err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert key in err and "diverged" not in err, err
    assert out.out == ""  # refused before the data set, the model or the first step
    assert not (tmp_path / "r").exists()


def test_sensible_edge_values_still_train(tmp_path):
    assert main(["train", *TINY, "train.epochs=1", "model.num_classes=10", "train.betas=[0.0,0.0]",
                 "model.drop_path=0.0", "train.grad_clip=0", "train.weight_decay=0", "--out", str(tmp_path / "r")]) == 0


# --------------------------------------------------------------------------- 2. NaN weights
def test_eval_refuses_weights_with_nan(one_epoch, tmp_path, capsys):
    state = torch.load(one_epoch / "last.pt", weights_only=True)
    name = next(k for k, v in state["model"].items() if v.is_floating_point() and v.numel() > 1)
    state["model"][name].view(-1)[0] = float("nan")
    bad = tmp_path / "nan.pt"
    torch.save(state, bad)
    err = _fails(capsys, ["eval", bad], f"{bad}'s weights contain NaN/inf: {name} (1 of ")
    assert "accuracy" not in err
    assert main(["eval", str(one_epoch), "--json"]) == 0  # finite weights evaluate as before


# ------------------------------------------------------------------------ 3. divergence advice
def test_divergence_in_the_first_epoch_does_not_advise_resume(tmp_path, capsys):
    run = tmp_path / "r"
    err = _fails(capsys, ["train", *TINY, "train.epochs=1", "train.lr=1e30", "train.grad_clip=0", "--out", run],
                 "diverged", "set train.grad_clip", "start the run again", f"{run} was removed")
    assert not run.exists()  # the directory really is gone ...
    assert "--resume" not in err  # ... so there is nothing to resume


def test_divergence_after_a_checkpoint_advises_resume_of_that_run(one_epoch, tmp_path, capsys):
    run = _copy(one_epoch, tmp_path)
    _fails(capsys, ["train", "--resume", run, "train.epochs=2", "train.lr=1e30", "train.grad_clip=0"],
           "diverged", f"--resume {run} with the new value")
    assert ckpt_io.load_checkpoint(run / "last.pt")["epoch"] == 1  # what --resume would continue from


# ------------------------------------------------------------------ 4. pickles with code objects
class Custom:
    def __init__(self):
        self.value = 1


def test_a_pickle_with_code_objects_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"format": ckpt_io.FORMAT, "model": {}, "config": {}, "x": Custom()}, path)
    with pytest.raises(UserError) as e:
        ckpt_io.load_checkpoint(path)
    assert str(e.value) == (f"{path} is not a recurvit checkpoint: it contains code objects "
                            "(refusing to load it with weights_only)")
    err = _fails(capsys, ["eval", path], "contains code objects")
    assert "Weights only load failed" not in err


# ------------------------------------------------------------------------ 5. directory fsync
def _record_fsyncs(monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_atomic_writes_fsync_the_directory_after_the_rename(tmp_path, monkeypatch):
    synced = _record_fsyncs(monkeypatch)
    folder = tmp_path / "run"
    folder.mkdir()
    d = os.stat(folder)
    with RunDir.create(folder) as run:
        run.save("last.pt", {"format": ckpt_io.FORMAT, "model": {"w": torch.ones(3)}, "config": {}})
    f = os.stat(folder / "last.pt")
    assert synced[-2:] == [(f.st_dev, f.st_ino), (d.st_dev, d.st_ino)]  # the file, then the directory it is in
    synced.clear()
    write_atomic(folder / "config.yaml", "a: 1\n")
    f = os.stat(folder / "config.yaml")
    assert synced == [(f.st_dev, f.st_ino), (d.st_dev, d.st_ino)]
    assert ckpt_io.load_checkpoint(folder / "last.pt")["model"]["w"].sum() == 3


def test_a_directory_that_cannot_be_synced_is_not_an_error(tmp_path, monkeypatch):
    real = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}") or _is_dir_fd(fd):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "x.txt", "ok\n")
    assert (tmp_path / "x.txt").read_text() == "ok\n"


def _is_dir_fd(fd):
    import stat

    return stat.S_ISDIR(os.fstat(fd).st_mode)


# ------------------------------------------------------------------------------ 6. disk full
class _FullFile(io.RawIOBase):
    """Takes ``room`` bytes, then raises ENOSPC as a full disk does."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def writable(self):
        return True

    def write(self, b):
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(b)
        return self.f.write(b)

    def flush(self):
        self.f.flush()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["inside_torch_writer", "from_save"])
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_last_checkpoint(one_epoch, tmp_path, capsys,
                                                                              monkeypatch, how):
    run = _copy(one_epoch, tmp_path)
    before = (run / "last.pt").read_bytes()
    real_save = torch.save

    def full_save(obj, f, *args, **kwargs):
        if how == "from_save":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, _FullFile(f, 4096), *args, **kwargs)  # torch's zip writer wraps the OSError

    monkeypatch.setattr(torch, "save", full_save)
    err = _fails(capsys, ["train", "--resume", run, "train.epochs=2"],
                 f"cannot write {run / 'last.pt'}: no space left on device", "it needs about", "bytes",
                 "the previous last.pt is left as it was", f"--resume {run}")
    assert "enforce fail" not in err and "inline_container" not in err
    assert (run / "last.pt").read_bytes() == before  # the previous good checkpoint is intact
    assert ckpt_io.load_checkpoint(run / "last.pt")["epoch"] == 1
    assert not list(run.glob(".*.tmp"))  # no half-written temp file left
    monkeypatch.setattr(torch, "save", real_save)
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "train.epochs=2"]) == 0  # the advice holds: it goes on
    assert [json.loads(ln)["epoch"] for ln in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_a_full_disk_while_appending_metrics_is_one_line(tmp_path, monkeypatch):
    import builtins

    folder = tmp_path / "run"
    real_open = builtins.open

    def full_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    with RunDir.create(folder) as run:
        monkeypatch.setattr(builtins, "open", full_open)
        with pytest.raises(UserError, match="metrics.jsonl: no space left on device"):
            run.append_metrics({"epoch": 1})


# ------------------------------------------------------------------------- 7. image folders
def _png(path, value=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (value, value, value)).save(path)


def _folder(root):
    for split in ("train", "val"):
        for i, cls in enumerate(("cat", "dog")):
            for k in range(2):
                _png(root / split / cls / f"{k}.png", 40 * i + k)
    return root


def _build(root, **kw):
    return build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=8, **kw))


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_a_symlink_outside_the_data_folder_is_refused_unless_followed(tmp_path, capsys):
    root = _folder(tmp_path / "data")
    _png(tmp_path / "elsewhere" / "x.png", 200)
    link = root / "train" / "cat" / "x.png"
    link.symlink_to(tmp_path / "elsewhere" / "x.png")
    with pytest.raises(UserError) as e:
        _build(root)
    msg = _one_line(e)
    assert str(link) in msg and "outside the data folder" in msg and "data.follow_symlinks=true" in msg, msg
    train, _, _ = _build(root, follow_symlinks=True)  # the explicit option reads it
    assert str(link) in [p for p, _ in train.samples] and len(train) == 5
    _fails(capsys, ["train", *TINY, "data.name=imagefolder", f"data.root={root}", "data.img_size=8",
                    "--out", tmp_path / "r"], str(link), "data.follow_symlinks=true")
    assert not (tmp_path / "r").exists()


def test_a_symlinked_class_folder_outside_the_data_folder_is_refused(tmp_path):
    root = _folder(tmp_path / "data")
    _png(tmp_path / "elsewhere" / "bird" / "0.png")
    _png(tmp_path / "elsewhere" / "bird" / "1.png")
    (root / "val" / "bird").symlink_to(tmp_path / "elsewhere" / "bird")
    with pytest.raises(UserError, match="val/bird is a symlink to .*outside the data folder"):
        _build(root)


def test_a_symlink_inside_the_data_folder_is_fine(tmp_path):
    root = _folder(tmp_path / "data")
    (root / "train" / "cat" / "copy.png").symlink_to(root / "val" / "cat" / "0.png")
    (root / "train" / "dog" / "more").symlink_to(root / "val" / "dog")  # a folder inside: followed
    train, _, _ = _build(root)
    assert len(train) == 4 + 1 + 2
    train[0]


@pytest.mark.parametrize("follow", [False, True])
@pytest.mark.parametrize("kind", ["file_to_itself", "folder_to_parent", "two_links_round"])
def test_a_symlink_loop_is_an_error_naming_it(tmp_path, kind, follow):
    root = _folder(tmp_path / "data")
    cat = root / "train" / "cat"
    if kind == "file_to_itself":
        link = cat / "self.png"
        link.symlink_to(link)
    elif kind == "folder_to_parent":
        link = cat / "again"
        link.symlink_to(root / "train")
    else:
        link = cat / "a.png"
        link.symlink_to(cat / "b.png")
        (cat / "b.png").symlink_to(link)
    with pytest.raises(UserError) as e:
        _build(root, follow_symlinks=follow)
    msg = _one_line(e)
    assert "symlink loop" in msg and str(cat) in msg, msg


def test_a_file_name_with_a_newline_is_quoted_in_errors(tmp_path):
    root = _folder(tmp_path / "data")
    bad = root / "train" / "dog" / "bad\nname.png"
    bad.write_bytes(b"not an image\n")
    train, _, _ = _build(root)
    index = [p for p, _ in train.samples].index(str(bad))
    with pytest.raises(UserError) as e:
        train[index]
    msg = _one_line(e)
    assert repr(str(bad)) in msg and "data.skip_bad_images=true" in msg, msg
    out = tmp_path / "elsewhere" / "x.png"
    _png(out)
    link = root / "val" / "cat" / "odd\nlink.png"
    link.symlink_to(out)
    with pytest.raises(UserError) as e:
        _build(root)
    assert repr(str(link)) in _one_line(e)


def test_checkpoints_and_config_follow_the_umask(tmp_path):
    import os
    import stat

    from recurvit.config import load_config
    from recurvit.tasks.classify.task import train

    old = os.umask(0o022)
    try:
        cfg = load_config("configs/digits/bvit.yaml", ["model.embed_dim=24", "model.num_heads=2", "model.steps=2",
                                                       "train.epochs=1", "train.progress=false"])
        train(cfg, tmp_path / "run", log=lambda *a: None)
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "run").iterdir() if p.name != ".lock"}
    assert modes == {"config.yaml": 0o644, "last.pt": 0o644, "metrics.jsonl": 0o644}, modes


@pytest.mark.slow
def test_a_warmup_longer_than_training_says_so_in_one_line(tmp_path):
    from recurvit.config import load_config
    from recurvit.tasks.classify.task import train

    lines = []
    cfg = load_config("configs/digits/bvit.yaml", ["model.embed_dim=24", "model.num_heads=2", "model.steps=2",
                                                   "train.epochs=2", "train.warmup_epochs=2", "train.progress=false"])
    train(cfg, tmp_path / "run", log=lines.append)
    notes = [ln for ln in lines if "never reaches train.lr" in ln]
    assert len(notes) == 1 and "train.warmup_epochs=2 >= train.epochs=2" in notes[0]


def test_an_image_folder_with_one_class_is_refused_by_a_classifier_not_by_a_vae(tmp_path, capsys):
    """One class trains a classifier to 'accuracy 1.0'; a tokenizer reads such a folder as any other
    (the refusal used to say 'a classifier needs at least 2 classes' to a VAE too)."""
    from PIL import Image

    from recurvit.config import DataConfig
    from recurvit.data import build_datasets

    for split in ("train", "val"):
        (tmp_path / split / "only").mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / split / "only" / f"{i}.png")
    train, _, info = build_datasets(DataConfig(name="imagefolder", root=str(tmp_path)))
    assert info.num_classes == 1 and len(train) == 2
    fails_in_one_line(capsys, ["train", *TINY, "train.epochs=1", "data.name=imagefolder", f"data.root={tmp_path}",
                               "model.in_chans=3", "--out", tmp_path / "r"], "a classifier needs at least 2")


def test_a_float_image_of_nan_is_refused_in_one_line(tmp_path, capsys):
    import numpy as np

    root = _folder(tmp_path / "data")
    nan = root / "train" / "cat" / "nan.tif"
    Image.fromarray(np.full((8, 8), np.nan, dtype=np.float32), mode="F").save(nan)
    _fails(capsys, ["train", *TINY, "data.name=imagefolder", f"data.root={root}", "data.img_size=8",
                    "train.epochs=1", "--out", tmp_path / "r"], "nan.tif", "NaN or inf")
    ok = tmp_path / "ok.tif"
    Image.fromarray(np.full((8, 8), 3.0, dtype=np.float32), mode="F").save(ok)
    from recurvit.data.images import load_image

    assert load_image(str(ok)).size == (8, 8)  # a finite float image still reads


# ------------------------------- links planted in a run folder, tags in overrides (a payload probe)
def _plant(link, target):
    link.parent.mkdir(parents=True, exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(target)


@pytest.mark.parametrize("case", ["train --resume", "train --out", "study, a link to no file yet"])
def test_a_lock_file_that_is_a_link_is_refused_and_nothing_is_written_through_it(one_epoch, tmp_path, capsys, case):
    """A run folder from elsewhere whose .lock points at a file of the user's: taking the lock wrote the pid
    over that file (a link to no file yet: created it)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    if case == "train --resume":
        run = _copy(one_epoch, tmp_path)
        _plant(run / ".lock", victim)
        argv = ["train", "--resume", run, "train.epochs=2"]
    elif case == "train --out":  # an empty folder with only the link: it looks like a start killed early
        run = tmp_path / "new"
        _plant(run / ".lock", victim)
        argv = ["train", *TINY, "train.epochs=1", "--out", run]
    else:
        victim.unlink()
        study = tmp_path / "s.yaml"
        study.write_text(f"name: s\nbase: {root / 'configs/digits/bvit.yaml'}\n"
                         "overrides: {model.embed_dim: 24, model.num_heads: 2, model.steps: 2, train.epochs: 1}\n"
                         "grid: {train.seed: [0]}\n")
        run = tmp_path / "study"
        _plant(run / ".study.lock", victim)
        argv = ["study", study, "--out", run]
    _fails(capsys, argv, "is a symbolic link", str(victim), "remove the link")
    assert (victim.read_text() == "precious\n") if victim.exists() else case.startswith("study")


@pytest.mark.parametrize("name,argv,link", [
    ("analysis/summary.json", ["analyze", "RUN", "--what", "readout", "--num-images", "32"], True),
    ("analysis/steps.csv", ["analyze", "RUN", "--what", "readout", "--num-images", "32"], True),
    ("analysis/steps.csv", ["analyze", "RUN", "--what", "readout", "--num-images", "32"], False),
    ("exit.json", ["exit", "RUN", "--time-batches", "1"], True),
])
def test_an_output_is_never_written_through_a_link_or_over_a_file_it_did_not_write(one_epoch, tmp_path, capsys,
                                                                                   name, argv, link):
    """analyze's CSVs and summary.json and exit's exit.json were written with open(path, "w"): through a
    link planted in the run folder (over the file it points at), and over a file of the user's."""
    run = _copy(one_epoch, tmp_path)
    victim = tmp_path / "victim.txt" if link else run / name
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("precious\n")
    if link:
        _plant(run / name, victim)
    _fails(capsys, [run if a == "RUN" else a for a in argv], str(run / name), "was not written by this command")
    assert victim.read_text() == "precious\n"


def test_outputs_of_analyze_and_exit_are_rewritten_by_the_same_command(one_epoch, tmp_path):
    run = _copy(one_epoch, tmp_path)
    for _ in range(2):  # the second time over its own files
        assert main(["analyze", str(run), "--what", "readout", "--num-images", "32"]) == 0
        assert main(["exit", str(run), "--time-batches", "1"]) == 0
    assert json.loads((run / "analysis" / "summary.json").read_text())["run"] == str(run)
    assert json.loads((run / "exit.json").read_text())["run"] == str(run)


def test_the_mixture_table_is_never_written_through_a_link(tmp_path):
    from recurvit.analysis.mixture import write_mean_csv

    victim, path = tmp_path / "victim.csv", tmp_path / "run" / "mixture_mean.csv"
    victim.write_text("precious\n")
    _plant(path, victim)
    with pytest.raises(UserError, match="was not written by this command"):
        write_mean_csv(torch.ones(2, 3), path)
    assert victim.read_text() == "precious\n"
    path.unlink()
    for _ in range(2):
        write_mean_csv(torch.ones(2, 3), path)
    assert path.read_text().splitlines()[0] == "unit,step_1,step_2,step_3" and not path.is_symlink()


@pytest.mark.parametrize("argv", [
    ["train", *TINY, "train.epochs=TAG", "--out", "OUT"],
    ["train", "--resume", "RUN", "train.epochs=TAG"],
    ["finetune", "RUN", "--data", "digits", "train.epochs=TAG", "--out", "OUT"],
    ["vae", "train", "data.img_size=16", "train.epochs=TAG", "--out", "OUT"],
])
def test_a_python_tag_in_an_override_is_one_line_and_constructs_nothing(one_epoch, tmp_path, capsys, argv):
    """OmegaConf reads an override's value as YAML with a safe loader: nothing runs, but the refusal was a
    ConstructorError traceback (exit 1)."""
    marker = tmp_path / "executed"
    tag = f"!!python/object/apply:os.system ['touch {marker}']"
    run = _copy(one_epoch, tmp_path)
    subst = {"RUN": str(run), "OUT": str(tmp_path / "out")}
    _fails(capsys, [subst.get(a, a.replace("TAG", tag)) for a in argv], "bad config (overrides)",
           "could not determine a constructor for the tag")
    assert not marker.exists()


@pytest.mark.parametrize("cmd", [["eval"], ["export", "--format", "hf", "--out", "OUT"]])
def test_an_unreadable_config_yaml_is_one_line_not_a_silent_switch_to_last_pt(one_epoch, tmp_path, capsys, cmd):
    """A run's config.yaml says whether best.pt was chosen on a validation split; unreadable (here a !!python
    tag), the commands read last.pt instead and said nothing: other figures than the run's own."""
    run = _copy(one_epoch, tmp_path)
    shutil.copy(run / "last.pt", run / "best.pt")
    marker = tmp_path / "executed"
    (run / "config.yaml").write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
    argv = [cmd[0], str(run), *[str(tmp_path / "out") if a == "OUT" else a for a in cmd[1:]]]
    _fails(capsys, argv, "config.yaml is unreadable")
    assert not marker.exists() and not (tmp_path / "out").exists()
