"""One vocabulary across commands (docs/cli.md): --steps, --out, --num-images, timm-style model
names; old spellings accepted with a one-line note; the interrupt message names the run; the ODE core's
ONNX refusal is one clean line."""
import json
from pathlib import Path

import pytest

from recurvit.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, dest, value", [
    (["horizon", "R", "--max-steps", "3"], "steps", 3),
    (["exit", "R", "--max-steps", "4"], "steps", 4),
    (["analyze", "R", "--images", "40"], "num_images", 40),
    (["vae", "eval", "R", "--images", "5"], "num_images", 5),
])
def test_old_spellings_still_work_with_a_one_line_note(argv, dest, value, capsys):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "deprecated" in err[0] and argv[-2] in err[0]
    new = build_parser().parse_args([a if a != argv[-2] else "--" + dest.replace("_", "-") for a in argv])
    assert getattr(new, dest) == value and not capsys.readouterr().err


def test_export_takes_out_and_its_old_positional_with_a_note(tmp_path, capsys):
    from recurvit.commands import out_of

    args = build_parser().parse_args(["export", "R", "--format", "onnx", "--out", "m.onnx"])
    assert out_of(args) == Path("m.onnx") and not capsys.readouterr().err
    for argv in (["export", "R", "m.onnx", "--format", "onnx"], ["export", "R", "--format", "onnx", "m.onnx"]):
        assert main([a.replace("R", str(tmp_path / "none")) for a in argv]) == 2  # no such run: after the note
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2 and "deprecated" in err[0] and "--out m.onnx" in err[0] and "not found" in err[1], err
    assert main(["export", "R", "--format", "onnx"]) == 2 and "--out" in capsys.readouterr().err


def test_flops_takes_a_name_timm_knows(capsys):
    assert main(["flops", "bvit_tiny_patch4_32", "--no-memory", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["steps"] == 12
    import recurvit

    m = recurvit.create_model("bvit_tiny_patch4_32")
    assert (m.cfg.img_size, m.cfg.patch_size, m.cfg.num_classes) == (32, 4, 100)


def test_vae_profile_writes_into_an_out_folder_never_the_current_one(tmp_path, monkeypatch):
    from recurvit.commands.vae import _profile_csv

    monkeypatch.chdir(tmp_path)
    assert _profile_csv(tmp_path / "prof", None) == tmp_path / "prof" / "vae_profile.csv"
    default = _profile_csv(None, None)
    assert default.parent.parent == Path("runs") and default.parent.name.startswith("vae_profile-")
    run = tmp_path / "run"
    run.mkdir()
    assert _profile_csv(None, str(run)) == run / "vae_profile.csv"


def test_the_interrupt_message_names_the_run(tmp_path, capsys, monkeypatch):
    import recurvit.commands.train as train_cmd
    from recurvit.run.rundir import RunDir

    out = tmp_path / "my run"

    def interrupted(args):
        RunDir.create(out)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_cmd, "run", interrupted)
    assert main(["train", "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"interrupted; continue with recurvit train --resume '{out}'", err


@pytest.mark.slow
def test_the_ode_cores_onnx_refusal_is_one_clean_whole_line(tmp_path, capsys):
    pytest.importorskip("onnxscript")
    run = tmp_path / "run"
    assert main(["train", "model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256",
                 "train.progress=false", "model.core=ode", "model.method=rk4", "train.epochs=1", "--out", str(run),
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["export", str(run), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "\x1b[" not in err and "Next steps" not in err, err
    assert "data-dependent" in err and err.endswith("time grid)")


def test_the_vocabulary_is_written_down_once():
    text = (ROOT / "docs" / "cli.md").read_text()
    for option in ("--steps", "--out", "--num-images", "--max-steps", "bvit_tiny_patch4_32", "141"):
        assert option in text
