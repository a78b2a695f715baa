"""A command's output files are written as a set, all new or all as they were (horizon: horizon.csv, horizon.png
and a maze run's horizon.json and picture; exit: exit.csv, exit.png, exit.json), and a full disk in the middle is
one line naming the set; a step-program export killed half way leaves a scratch folder that the next export
removes (run.atomic.file_set, run.atomic.scratch_dir)."""
from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

import pytest
from tests.conftest import fails_in_one_line

from recurvit.cli import main
from recurvit.errors import UserError
from recurvit.run import atomic
from recurvit.run.outputs import write_text

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false",
        "train.warmup_epochs=0", "train.epochs=1"]
MAZE = ["mazes/dt_recall_prog", "data.maze_train=32", "data.maze_val=8", "data.maze_test=4", "data.maze_test_sizes=[9]",
        "model.width=8", "model.steps=2", "train.epochs=1", "train.batch_size=16", "train.progress=false",
        "train.device=cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("output_sets") / "run"
    assert main(["train", *TINY, "--out", str(run)]) == 0
    return run


def _full_at(monkeypatch, n: int) -> list:
    """The n-th atomic write from now (what the writers of every output go through) finds the disk full as it
    writes its temp file; returns the names written, in order."""
    real, calls = atomic.atomic_write, []

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    def write(path, fn, needed=None):
        calls.append(Path(path).name)
        return real(path, full if len(calls) == n else fn, needed)
    monkeypatch.setattr(atomic, "atomic_write", write)
    return calls


def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_set_is_renamed_only_when_every_file_is_written(tmp_path, monkeypatch):
    for name in ("a.csv", "b.csv"):
        write_text(tmp_path / name, "old\n", b"old")
    _full_at(monkeypatch, 2)
    with pytest.raises(UserError) as e:
        with atomic.file_set(tmp_path, ["a.csv", "b.csv"]):
            write_text(tmp_path / "a.csv", "new\n", b"old")
            write_text(tmp_path / "b.csv", "new\n", b"old")
    assert str(e.value).startswith(f"cannot write a.csv and b.csv in {tmp_path}: no space left on device")
    assert "none of them was replaced" in str(e.value) and "\n" not in str(e.value)
    assert _files(tmp_path) == {"a.csv": b"old\n", "b.csv": b"old\n"}  # no temp file left either
    monkeypatch.undo()
    with atomic.file_set(tmp_path, ["a.csv", "b.csv"]):
        write_text(tmp_path / "a.csv", "new\n", b"old")
        assert (tmp_path / "a.csv").read_text() == "old\n"  # not yet: the set is renamed when it ends
        write_text(tmp_path / "b.csv", "new\n", b"old")
    assert _files(tmp_path) == {"a.csv": b"new\n", "b.csv": b"new\n"}


@pytest.mark.parametrize("command, names", [
    (["horizon", "--steps", "2"], ["horizon.csv", "horizon.png"]),
    (["exit", "--time-batches", "1"], ["exit.csv", "exit.png", "exit.json"]),
])
def test_a_full_disk_half_way_keeps_the_old_set_and_names_it(trained, tmp_path, capsys, monkeypatch, command, names):
    out = tmp_path / "out"
    argv = [command[0], trained, *command[1:], "--out", out]
    assert main([str(a) for a in argv]) == 0
    before = _files(out)
    assert sorted(before) == sorted(names)
    _full_at(monkeypatch, 2)
    line = fails_in_one_line(capsys, [*argv[:-2], "--steps", "3", "--out", out] if command[0] == "horizon" else argv,
                             *names, "none of them was replaced")
    assert "no space left on device" in line
    assert _files(out) == before  # every file of the first run, as it was, and no temp file


def test_a_maze_horizon_writes_its_four_files_as_a_set(tmp_path, capsys, monkeypatch):
    run, out = tmp_path / "maze", tmp_path / "out"
    assert main(["train", *MAZE, "--out", str(run)]) == 0
    argv = ["horizon", run, "--steps", "3", "--mazes", "2", "--out", out]
    assert main([str(a) for a in argv]) == 0
    before = _files(out)
    calls = _full_at(monkeypatch, 3)
    fails_in_one_line(capsys, [*argv[:3], "4", *argv[4:]], "horizon.csv", "horizon.png", "horizon.json",
                      "horizon_maze.png")
    assert calls[:2] == ["horizon.csv", "horizon.png"] and _files(out) == before


# ------------------------------------------------------------------------------------ scratch folders
def _aged(folder: Path) -> Path:
    """``folder`` as a killed process left it: made before this process began."""
    folder.mkdir()
    (folder / "embed.pt2").write_bytes(b"half a program")
    past = time.time() - 3600
    os.utime(folder, (past, past))
    return folder


def test_a_stale_scratch_folder_goes_and_a_held_or_new_one_stays(tmp_path):
    stale = _aged(tmp_path / ".out.steps-abcd1234.part")
    held = _aged(tmp_path / ".out.steps-held0000.part")
    young = tmp_path / ".out.steps-young000.part"
    young.mkdir()  # made after this process began: another export's, perhaps not yet held
    other = _aged(tmp_path / ".out.steps-x.part")  # not a name scratch_dir makes
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # an export still writing it
    try:
        with atomic.scratch_dir(tmp_path, "out", "steps") as tmp:
            assert tmp.is_dir() and tmp.name.startswith(".out.steps-") and tmp.name.endswith(".part")
    finally:
        os.close(fd)
    assert not stale.exists() and not tmp.exists()
    assert held.is_dir() and young.is_dir() and other.is_dir()


def test_a_step_program_export_removes_the_scratch_a_killed_one_left(trained, tmp_path, capsys):
    from recurvit.export.deploy import StepProgram

    stale = _aged(tmp_path / ".steps.steps-k1ll3d00.part")  # what a kill -9 of the export leaves
    out = tmp_path / "steps"
    capsys.readouterr()
    assert main(["export", str(trained), "--format", "torch-export", "--steps-program", "--out", str(out)]) == 0
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps"]
    prog = StepProgram(out)
    assert prog.default_steps == 2


@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_an_export_removes_the_scratch_a_killed_one_left_and_refuses_a_link(trained, tmp_path, capsys, fmt):
    """hf and timm folders (run.outputs.staged_dir) and ONNX files (write_by_name) are built in scratch folders
    too, so what a kill -9 left there goes with the next export of that name; a link as OUT is refused from
    Python as from the command line."""
    from recurvit.export.hf import export_hf
    from recurvit.run.load import load

    name = "model" if fmt == "hf" else "model.onnx"
    kind = "staged" if fmt == "hf" else "byname"
    stale = _aged(tmp_path / f".{name}.{kind}-k1ll3d00.part")
    out = tmp_path / name
    capsys.readouterr()
    assert main(["export", str(trained), "--format", fmt, "--out", str(out)]) == 0
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]
    if fmt == "hf":
        (tmp_path / "empty").mkdir()
        (tmp_path / "link").symlink_to(tmp_path / "empty")
        with pytest.raises(UserError, match="exists; choose another"):
            export_hf(load(trained), tmp_path / "link")


def test_a_study_on_a_full_disk_names_the_runs_that_failed(tmp_path, monkeypatch):
    """Runs that failed on a full disk, then the report that could not be written: the line names the runs (and
    says their error.txt holds why), not only the plot that failed last."""
    from recurvit.study import session

    def full(*a, **k):
        raise atomic.DiskFull(tmp_path / "acc_vs_params.png", OSError(errno.ENOSPC, "No space left on device"))
    monkeypatch.setattr(session, "write_report", full)

    class Study:
        results, name = tmp_path, "tiny"
    rows = [{"run_id": "a__seed=0", "error": "cannot write last.pt: no space left on device"},
            {"run_id": "a__seed=1", "acc_T": 0.5}, {"run_id": "b__seed=0", "error": "no space"}]
    with pytest.raises(UserError) as e:
        session._report(Study, tmp_path, rows, False, False, tmp_path / "s.yaml", "recurvit study s.yaml")
    line = str(e.value)
    assert "\n" not in line and "2 of 3 runs failed (a__seed=0, b__seed=0" in line and "acc_vs_params.png" in line
    with pytest.raises(atomic.DiskFull):  # no run failed: the disk-full line as it was
        session._report(Study, tmp_path, rows[1:2], False, False, tmp_path / "s.yaml", "recurvit study s.yaml")
