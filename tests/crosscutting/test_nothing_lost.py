"""Issue 39, "nothing lost, nothing silent": no command writes over a file it did not write or leaves half
an output behind, a resume never contradicts its checkpoint, and a bad input (NaN weights, a study name
that leaves the working folder, a value that would run for days, an unwritable place) is one line and
exit 2. Each case is (command, expected exit, expected words on the one line)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.conftest import fails_in_one_line
import torch

from recurvit.cli import main
from recurvit.run import checkpoint as ckpt_io

TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256", "train.progress=false",
        "train.warmup_epochs=0"]
VAE = ["configs/vae/digits.yaml", "model.embed_dim=8", "train.batch_size=256", "train.epochs=1",
       "train.progress=false"]
ROOT = Path(__file__).resolve().parents[2]


def _cli(capsys, argv) -> tuple:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr()


_fails = fails_in_one_line


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 1-epoch tiny digits run; tests copy it before they change it."""
    run = tmp_path_factory.mktemp("nothing_lost") / "r"
    assert main(["train", *TINY, "train.epochs=1", "--out", str(run)]) == 0
    return run


def _copy(run, tmp_path, name="r"):
    dst = tmp_path / name
    shutil.copytree(run, dst)
    return dst


def _nan_run(trained, tmp_path):
    run = _copy(trained, tmp_path, "nan")
    for name in ("last.pt", "best.pt"):
        if (run / name).is_file():
            ck = torch.load(run / name, weights_only=True)
            key = next(iter(ck["model"]))
            ck["model"][key] = torch.full_like(ck["model"][key], float("nan"))
            torch.save(ck, run / name)
    return run


def _png(path):
    from PIL import Image

    Image.new("L", (8, 8), 3).save(path)
    return path


# ------------------------------------------------------------------------- 1. predict --csv
def test_predict_csv_never_writes_over_a_file_it_did_not_write(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    img = _png(tmp_path / "x.png")
    before = (run / "last.pt").read_bytes()
    _fails(capsys, ["predict", run, img, "--csv", run / "last.pt"], "was not written by this command")
    assert (run / "last.pt").read_bytes() == before  # the checkpoint is still there
    _fails(capsys, ["predict", run, img, "--csv", tmp_path], "is a directory")
    csv = tmp_path / "p.csv"
    for _ in range(2):  # its own file may be written again
        code, out = _cli(capsys, ["predict", run, img, "--csv", csv])
        assert code == 0, out.err
    assert csv.read_text().splitlines()[0] == "image,rank,label,prob"
    assert not list(tmp_path.glob(".*.tmp"))


def test_horizon_never_writes_over_a_file_it_did_not_write(trained, tmp_path, capsys, monkeypatch):
    import recurvit.analysis.horizon as horizon

    run = _copy(trained, tmp_path)
    (run / "horizon.csv").write_text("my notes\n")
    swept, real = [], horizon.horizon_sweep
    monkeypatch.setattr(horizon, "horizon_sweep", lambda *a, **k: swept.append(1) or real(*a, **k))
    _fails(capsys, ["horizon", run, "--steps", "2"], "horizon.csv exists and was not written by this command")
    assert (run / "horizon.csv").read_text() == "my notes\n" and not swept  # refused before the sweep
    (run / "horizon.csv").unlink()
    for _ in range(2):  # its own files are written again
        code, out = _cli(capsys, ["horizon", run, "--steps", "2"])
        assert code == 0, out.err


@pytest.mark.parametrize("flag", [["--sizes", "9"], ["--mazes", "10"], ["--patience", "2"], ["--min-steps", "2"]])
def test_a_maze_sweeps_option_on_a_classification_run_is_one_line(trained, flag, capsys):
    _fails(capsys, ["horizon", trained, "--steps", "2", *flag], f"{flag[0]} is for a maze run's sweep")


# -------------------------------------------------------------- 2. a start killed while writing
@pytest.mark.parametrize("left", [["config.yaml"], ["config.yaml", ".finetune.json.abcd.tmp"],
                                  [".config.yaml.abcd.tmp"], ["config.yaml", "finetune.json"]])
def test_a_finetune_killed_while_it_started_can_be_started_again(trained, tmp_path, capsys, left):
    ft = tmp_path / "ft"
    ft.mkdir()
    (ft / ".lock").write_text("12345\n")
    for name in left:
        (ft / name).write_text("half" if name.endswith(".tmp") else "{}")
    if "finetune.json" not in left:
        _fails(capsys, ["finetune", "--resume", ft], "stopped before its first epoch ended",
               "start it again with its original command and --out")
    code, out = _cli(capsys, ["finetune", trained, "--data", "digits", "--method", "head", "train.epochs=1",
                              "train.batch_size=256", "--out", ft])
    assert code == 0, out.err
    assert (ft / "last.pt").is_file() and not list(ft.glob(".*.tmp"))


def test_a_train_killed_while_writing_its_config_starts_again_with_out(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    (run / ".lock").write_text("")
    (run / ".config.yaml.abcd.tmp").write_text("half")
    code, out = _cli(capsys, ["train", *TINY, "train.epochs=1", "--out", run])
    assert code == 0, out.err


def test_a_directory_with_a_checkpoint_is_never_taken_over(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    _fails(capsys, ["train", *TINY, "--out", run], "already exists and is not empty")
    mine = tmp_path / "mine"  # a folder of the user's own (no lock file): never emptied
    mine.mkdir()
    (mine / "config.yaml").write_text("x: 1\n")
    _fails(capsys, ["train", *TINY, "--out", mine], "already exists and is not empty")
    assert (mine / "config.yaml").read_text() == "x: 1\n"


# ------------------------------------------------------------- 3. an export killed half way
def test_an_export_killed_half_way_leaves_no_folder_and_runs_again(trained, tmp_path, capsys, monkeypatch):
    import safetensors.torch

    out = tmp_path / "exported"
    real = safetensors.torch.save_file  # timm's save_for_hf writes the weights with it, then config.json
    calls = []

    def killed_on_the_weights(tensors, filename, *a, **kw):
        calls.append(filename)
        raise KeyboardInterrupt  # a kill (or Ctrl-C) while the weights are written

    monkeypatch.setattr(safetensors.torch, "save_file", killed_on_the_weights)
    code, _ = _cli(capsys, ["export", trained, "--format", "hf", "--out", out])
    assert code == 130 and calls and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".exported")]
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    code, res = _cli(capsys, ["export", trained, "--format", "hf", "--out", out])
    assert code == 0, res.err
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


# -------------------------------------------------------------- 4. a resume below its checkpoint
def test_resume_with_fewer_epochs_than_the_checkpoint_is_refused(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)  # made a finished 2-epoch run (its checkpoint and config say so)
    ck = torch.load(run / "last.pt", weights_only=True)
    ck["epoch"], ck["config"]["train"]["epochs"] = 2, 2
    torch.save(ck, run / "last.pt")
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("epochs: 1\n", "epochs: 2\n"))
    before = (run / "config.yaml").read_text()
    _fails(capsys, ["train", "--resume", run, "train.epochs=1"], "is at epoch 2 already", "train.epochs >= 2")
    assert (run / "config.yaml").read_text() == before


# ------------------------------------------------------- 5-8. one line and exit 2, every command
def _cases(trained, tmp_path):
    nan = _nan_run(trained, tmp_path)
    img = _png(tmp_path / "x.png")
    (tmp_path / "afile").write_text("x")
    escape = tmp_path / "escape.yaml"
    escape.write_text(f"name: ../../elsewhere/x\nbase: {ROOT / 'configs/digits/bvit.yaml'}\ngrid: {{train.seed: [0]}}\n")
    listed = tmp_path / "listed.yaml"
    listed.write_text(f"name: [1, 2]\nbase: {ROOT / 'configs/digits/bvit.yaml'}\ngrid: {{train.seed: [0]}}\n")
    return [
        # 5. NaN weights
        (["predict", nan, img], "weights contain NaN"),
        (["export", nan, "--format", "hf", "--out", tmp_path / "e1"], "weights contain NaN"),
        (["export", nan, "--format", "safetensors", "--out", tmp_path / "e2.safetensors"], "weights contain NaN"),
        # 6. a study name is one word
        (["study", escape, "--report-only"], "name must be one word"),
        (["study", listed, "--report-only"], "name must be one word"),
        # 7. priced before it runs
        (["predict", trained, img, "--steps", "1000000000"], "--steps 1,000,000,000 would take"),
        (["flops", "bvit_tiny", "img_size=8", "patch_size=4", "steps=1000000000000", "--no-memory"], "would take"),
        (["flops", "bvit_tiny", "img_size=8", "patch_size=4", "--batch-size", "1000000000"], "training needs about"),
        (["finetune", trained, "--data", "digits", "--rank", "100000"], "--rank 100000 is more than"),
        (["finetune", trained, "--data", "digits", "--alpha", "0"], "--alpha must be"),
        (["finetune", trained, "--data", "digits", "--alpha", "-1"], "--alpha must be"),
        # 8. unwritable places
        (["predict", trained, img, "--csv", "/sys/p.csv"], "cannot write /sys/p.csv"),
        (["export", trained, "--format", "hf", "--out", "/sys/e"], "/sys"),
        (["export", trained, "--format", "safetensors", "--out", "/sys/e.safetensors"], "/sys"),
        (["export", trained, "--format", "torch-export", "--out", "/sys/e.pt2"], "/sys"),
        (["horizon", trained, "--steps", "2", "--out", "/sys/h"], "/sys/h"),
        (["horizon", trained, "--steps", "2", "--out", tmp_path / "afile"], "is a file"),
    ]


CASE_IDS = ["predict-nan", "export-hf-nan", "export-safetensors-nan", "study-name-escapes", "study-name-list",
            "predict-steps-1e9", "flops-steps-1e12", "flops-batch-1e9", "finetune-rank-1e5", "finetune-alpha-0",
            "finetune-alpha-neg", "predict-csv-readonly", "export-hf-readonly", "export-safetensors-readonly",
            "export-torch-readonly", "horizon-out-readonly", "horizon-out-file"]


@pytest.mark.parametrize("i", range(len(CASE_IDS)), ids=CASE_IDS)
def test_bad_inputs_are_one_line_and_exit_2(trained, tmp_path, capsys, i):
    cases = _cases(trained, tmp_path)
    assert len(cases) == len(CASE_IDS)
    argv, needle = cases[i]
    _fails(capsys, argv, needle)
    assert not (tmp_path.parent / "elsewhere").exists() and not (tmp_path / "elsewhere").exists()


def test_an_export_into_a_missing_folder_makes_it(trained, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "w.safetensors"
    code, res = _cli(capsys, ["export", trained, "--format", "safetensors", "--out", out])
    assert code == 0, res.err
    assert out.is_file()


def test_vae_intervene_is_priced_before_it_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "vae"
    assert main(["vae", "train", *VAE, "--out", str(run)]) == 0
    _fails(capsys, ["vae", "intervene", run, "--extra", "100000000", "--truncate", "", "--factors", ""],
           "would take about")
    _fails(capsys, ["vae", "intervene", run, "--loop", "-5"], "--loop -5")  # item 11: were clamped in silence
    _fails(capsys, ["vae", "intervene", run, "--truncate", "50"], "--truncate 50 removes more loops")


# ------------------------------------------------------------- 10. Ctrl-C while a checkpoint is written
def test_ctrl_c_during_a_checkpoint_write_says_interrupted_and_keeps_the_last_one(trained, tmp_path, capsys,
                                                                                   monkeypatch):
    import io

    run = _copy(trained, tmp_path)
    before = (run / "last.pt").read_bytes()
    real_save = torch.save

    class Interrupted(io.RawIOBase):  # Ctrl-C arrives while torch's zip writer is writing
        def __init__(self, f):
            self.f, self.n = f, 0

        def writable(self):
            return True

        def write(self, b):
            self.n += len(b)
            if self.n > 4096:
                raise KeyboardInterrupt
            return self.f.write(b)

    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real_save(obj, Interrupted(f), *a, **k))
    code, out = _cli(capsys, ["train", "--resume", run, "train.epochs=2"])
    err = out.err.strip()
    assert code == 130 and err.splitlines() == [f"interrupted; continue with recurvit train --resume {run}"], err
    assert (run / "last.pt").read_bytes() == before and not list(run.glob(".*.tmp"))


# --------------------------------------------------- 9, 11. values refused before anything trains
@pytest.mark.parametrize("override,needle", [
    ("model.mlp_ratio=-1", "model.mlp_ratio must be"), ("model.mlp_ratio=inf", "model.mlp_ratio must be"),
    ("model.mlp_ratio=0", "model.mlp_ratio must be"),
    ("model.stage_heads=-2", "model.stage_heads must be"), ("train.seed=99999999999999999999", "train.seed must be"),
    ("train.supervision.stages=100", "train.supervision.stages=100 is more than model.steps=2"),
    ("train.log_every=-1", "train.log_every must be"), ("train.depth.sigma=-1", "train.depth.sigma must be"),
    ("train.depth.truncate=-1", "train.depth.truncate must be"),
    ("data.synthetic_classes=1", "data.synthetic_classes must be"),
    ("model.class_token=2", "model.class_token is true or false, got '2'"),
])
def test_nonsense_values_are_refused_before_training(tmp_path, capsys, override, needle):
    extra = ["data.name=synthetic"] if override.startswith("data.synthetic") else []
    _fails(capsys, ["train", *TINY, "train.epochs=1", *extra, override, "--out", tmp_path / "r"], needle)
    assert not (tmp_path / "r").exists()


# ------------------------------------------------- 9, 12. tracebacks and misleading lines, one each
def test_more_bad_inputs_are_one_line(trained, tmp_path, capsys, monkeypatch):
    from PIL import Image

    img = _png(tmp_path / "x.png")
    bomb = tmp_path / "bomb.png"
    Image.new("L", (64, 64)).save(bomb)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 64 x 64 is then past twice the limit: a bomb
    (tmp_path / "garbage.pt").write_bytes(bytes(range(256)) * 16)
    (tmp_path / "text.pt").write_text("hello\n")
    exported = tmp_path / "exp"
    assert main(["export", str(trained), "--format", "hf", "--out", str(exported)]) == 0
    (exported / "model.safetensors").write_bytes(b"\0" * 64)
    moved = _copy(trained, tmp_path, "moved")
    (moved / "metrics.jsonl").unlink()
    (moved / "metrics.jsonl").mkdir()
    cases = [
        (["train", *TINY, "train.epochs=1", "model.num_classes=5"], "model.num_classes=5 but digits has 10"),
        (["train", *TINY, "train.epochs=1", "model.in_chans=3"], "model.in_chans=3 but digits has 1-channel"),
        (["train", *TINY, "train.epochs=1", "model.img_size=16", "data.img_size=8"], "set data.img_size=16"),
        (["train", *TINY, "train.epochs=1", "data.holdout=0.9999"], "holds out all"),
        (["eval", trained, "steps=!!python/object/apply:os.system"], "not plain YAML"),
        (["match", "loopvae_conv", "--by", "params"], "not a vision transformer with a core"),
        (["eval", exported], "cannot read the exported folder"),
        (["eval", tmp_path / "garbage.pt"], "not a file written by torch.save"),
        (["eval", tmp_path / "text.pt"], "not a file written by torch.save"),
        (["predict", trained, bomb], "decompression bomb"),
        (["train", "--resume", moved], "metrics.jsonl is not a file"),
    ]
    for argv, needle in cases:
        _fails(capsys, [*argv, *(["--out", tmp_path / "r"] if argv[0] == "train" and "--resume" not in argv else [])],
               needle)
    assert img.is_file()


# ------------------------------------------------------------ 11. a study file's nonsense, at once
@pytest.mark.parametrize("grid,needle", [
    ("grid: {}\n", "grid has no axis"),
    ("grid:\n  regime:\n    a: {train.epochs: 1}\n    a: {train.epochs: 2}\n", "'a' is given twice"),
])
def test_a_study_grid_that_is_empty_or_names_a_variant_twice_is_refused(tmp_path, capsys, grid, needle):
    study = tmp_path / "s.yaml"
    study.write_text(f"name: s\nbase: {ROOT / 'configs/digits/bvit.yaml'}\n{grid}")
    _fails(capsys, ["study", study, "--out", tmp_path / "out"], needle)
    assert not (tmp_path / "out" / "runs").exists()


@pytest.mark.parametrize("where", ["runs: {f}\n", "results: {f}\n", "runs: /sys/r\n", "results: /sys/r\n"])
def test_a_study_whose_runs_or_results_cannot_be_written_is_refused_before_it_runs(tmp_path, capsys, where):
    (tmp_path / "afile").write_text("x")
    study = tmp_path / "s.yaml"
    study.write_text(f"name: s\nbase: {ROOT / 'configs/digits/bvit.yaml'}\ngrid: {{train.seed: [0]}}\n"
                     + where.format(f=tmp_path / "afile"))
    err = _fails(capsys, ["study", study])
    assert ("is a file" in err or "/sys" in err), err


@pytest.mark.parametrize("table, needle", [
    ('garbage,"unterminated\n', "no rows in"),
    ("a,b\n1,2\n", "a row lacks run_id"),
    ("run_id,train.seed,acc_T\ntrain.seed=0,0,0.5\n", "lacks what the report needs"),
])
def test_report_only_from_a_broken_results_table_is_one_line(tmp_path, capsys, monkeypatch, table, needle):
    """--report-only on a machine without the run directories rebuilds the report from results.csv; a
    damaged or foreign table is one line and exit 2, not a KeyError."""
    (tmp_path / "s.yaml").write_text("name: rot\nbase: digits.yaml\ngrid:\n  train.seed: [0]\nresults: res\n")
    (tmp_path / "digits.yaml").write_text("model: {name: bvit_tiny}\ndata: {name: digits}\n")
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.csv").write_text(table)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["study", str(tmp_path / "s.yaml"), "--report-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_random_depth_deeper_than_a_stack_is_refused(tmp_path, capsys):
    """A stack of L blocks cannot run deeper than L: a uniform depth schedule asked to reach beyond it was
    capped in silence; it is one line (within L, random depth on a stack is layer-drop from the top)."""
    vit = ["model.name=vit_tiny", "model.depth=2", "train.depth.schedule=uniform", "train.epochs=1"]
    _fails(capsys, ["train", *TINY, *vit, "train.depth.max_steps=12", "--out", tmp_path / "r"],
           "train.depth.max_steps=12 but this model runs at most 2 steps")


@pytest.mark.parametrize("grid, needle", [
    ("  train.seed: [abc]\n", "train.seed: Value 'abc'"),
    ("  regime:\n    a: {model.embed_dim: wide}\n", "model.embed_dim"),
    ("  regime:\n    a: {base: vae/digits}\n", "is a LoopVAE tokenizer, not a classifier"),
])
def test_a_study_with_a_bad_value_is_refused_when_it_is_read(tmp_path, capsys, grid, needle):
    """A grid value its config cannot take was found only when that run started (after the others had
    trained); the study file is now refused in one line before anything runs."""
    (tmp_path / "s.yaml").write_text(f"name: bad\nbase: digits/bvit\ngrid:\n{grid}results: res\n")
    fails_in_one_line(capsys, ["study", tmp_path / "s.yaml", "--out", tmp_path / "runs"], needle, "run ")
    assert not (tmp_path / "runs").exists()


def test_a_killed_torchrun_is_one_line_and_the_shells_exit_status(monkeypatch, capsys):
    """kill -9 of torchrun made `recurvit train --nproc 2` exit 247 (256 - 9) with no message."""
    import subprocess

    from recurvit.run import distributed

    monkeypatch.setattr(subprocess, "call", lambda *a, **k: -9)
    assert distributed.launch(2, ["train"]) == 137
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torchrun was ended by SIGKILL" in err[0] and "--resume" in err[0]
