"""The README's commands as a user runs them (issue 56): each in a fresh process, through the installed
``recurvit`` script, from a folder outside the repository, in the order a user would (train, eval, predict,
every export including the step programs and int8 from a run directory, horizon, exit, analyze, fine-tune,
a tiny study, mazes, the tokenizer), each asserting what it prints or writes, not only its exit code. A
command that works only after another import fails here. The README's Python blocks run the same way, each
in a fresh interpreter. A last test checks that every command the README names is run here."""
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SCRIPT = Path(sys.executable).parent / "recurvit"  # the console script pip installed beside this interpreter
RUN_SUBCOMMANDS = set()  # the subcommands this module ran (the coverage test reads it)

pytestmark = pytest.mark.slow


def recurvit(home: Path, *args, ok: bool = True) -> subprocess.CompletedProcess:
    """``recurvit ARGS`` as typed in a shell in ``home``: a fresh process, one thread."""
    cmd = [str(SCRIPT)] if SCRIPT.is_file() else [sys.executable, "-m", "recurvit"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    r = subprocess.run([*cmd, *map(str, args)], cwd=home, capture_output=True, text=True, timeout=900, env=env,
                       preexec_fn=lambda: os.umask(0o022))  # a shell's usual umask
    RUN_SUBCOMMANDS.add(args[0] if args[0] != "vae" else f"vae {args[1]}")
    if ok:
        assert r.returncode == 0, f"recurvit {' '.join(map(str, args))}: {r.stderr[-2000:]}"
    return r


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("readme_home")
    assert REPO not in home.parents and not (home / "configs").exists()
    return home


@pytest.fixture(scope="module")
def run(home):
    """The README's first command, ``recurvit train`` (the default bViT on digits), at 2 epochs."""
    r = recurvit(home, "train", "train.epochs=2", "train.progress=false")
    last = r.stdout.strip().splitlines()[-1]
    m = re.match(r"run (runs/digits-bvit_tiny-\S+)  test_acc (\S+)  train_seconds", last)
    assert m, r.stdout[-500:]
    assert 0.1 < float(m.group(2)) <= 1.0  # 2 epochs learn something
    assert r.stdout.startswith("model bvit_tiny (recurrent core, 115,018 params, steps=6) on digits")
    return home / m.group(1)


def test_eval_and_horizon_report_the_run(home, run):
    r = recurvit(home, "eval", run, "--steps", "12")
    assert re.search(r"bvit_tiny \(recurrent\) steps 12  nfe 12  accuracy 0\.\d+", r.stdout), r.stdout
    r = recurvit(home, "horizon", run, "--steps", "24", "--out", "horizon")
    assert "trained T=6, swept K=24" in r.stdout and "acc@4T" in r.stdout
    rows = (home / "horizon" / "horizon.csv").read_text().splitlines()
    assert rows[0] == "step,accuracy,loss,rel_change" and len(rows) == 25


def test_predict_names_classes_of_images_in_a_folder(home, run):
    from PIL import Image
    import numpy as np

    folder = home / "images"
    folder.mkdir()
    for i in range(3):
        Image.fromarray((np.arange(64).reshape(8, 8) * 4 * (i + 1) % 256).astype("uint8"), mode="L").save(folder / f"{i}.png")
    out = json.loads(recurvit(home, "predict", run, folder, "--topk", "3", "--json").stdout)
    assert len(out["predictions"]) == 3 and all(len(p["top"]) == 3 for p in out["predictions"])


@pytest.mark.parametrize("args, wrote", [
    (["--format", "hf", "--out", "hf"], "wrote hf/config.json, hf/model.safetensors"),
    (["--format", "timm", "--rgb", "--out", "tf"], "wrote tf/config.json, tf/model.safetensors"),
    (["--format", "safetensors", "--out", "m.safetensors"], "wrote m.safetensors"),
    (["--format", "torch-export", "--out", "m.pt2"], "wrote m.pt2"),
    (["--format", "onnx", "--out", "m.onnx"], "wrote m.onnx"),
    (["--format", "onnx", "--int8", "--out", "q.onnx"], "wrote q.onnx (int8 MatMul weights)"),
    # the README's deployment commands, from a run directory (issue 56: they once worked only from an export)
    (["--format", "onnx", "--steps-program", "--fused", "--out", "bvit-steps"],
     "wrote bvit-steps: embed.onnx, fused.onnx, manifest.json, readout.onnx, step.onnx"),
    (["--format", "onnx", "--steps-program", "--int8", "--out", "bvit-int8"],
     "wrote bvit-int8/embed.onnx, bvit-int8/manifest.json, bvit-int8/readout.onnx, bvit-int8/step.onnx "
     "(int8 MatMul weights)"),
    (["--format", "torch-export", "--steps-program", "--out", "bvit-pt2"],
     "wrote bvit-pt2: embed.pt2, manifest.json, readout.pt2, step.pt2"),
], ids=["hf", "timm", "safetensors", "torch-export", "onnx", "onnx-int8", "steps-fused", "steps-int8", "steps-pt2"])
def test_every_export_from_a_run_directory(home, run, args, wrote):
    r = recurvit(home, "export", run, *args)
    assert wrote in r.stdout.strip().splitlines(), r.stdout
    out = home / args[args.index("--out") + 1]
    for p in [out, *(out.rglob("*") if out.is_dir() else [])]:  # as a plain write under umask 022 (issue 57)
        assert stat.S_IMODE(p.stat().st_mode) == (0o755 if p.is_dir() else 0o644), p


def test_the_step_programs_run_in_a_fresh_interpreter(home, run):
    recurvit(home, "export", run, "--format", "onnx", "--steps-program", "--out", "steps-py")
    code = ("import torch\nfrom recurvit.export.deploy import StepProgram\n"
            "prog = StepProgram('steps-py')\nlogits, steps = prog.adaptive(torch.randn(4, 1, 8, 8), None)\n"
            "print(tuple(logits.shape), sorted(set(steps.tolist())))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=home, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.strip() == "(4, 10) [6]"


def test_flops_match_and_configs(home):
    r = recurvit(home, "flops", "bvit_tiny", "steps=12")
    assert re.search(r"nfe\s+12", r.stdout)
    r = recurvit(home, "match", "bvit_tiny", "--by", "params")
    assert re.search(r"^matched params: params x1\.0\d+", r.stdout, re.M), r.stdout
    r = recurvit(home, "configs")
    assert "digits/bvit" in r.stdout and "mazes/dt_recall_deepthinking" in r.stdout


def test_exit_analyze_and_finetune(home, run):
    r = recurvit(home, "exit", run, "--out", "exit")
    assert (home / "exit" / "exit.json").is_file(), r.stdout
    r = recurvit(home, "analyze", run, "--out", "analysis")
    assert any((home / "analysis").iterdir()), r.stdout
    r = recurvit(home, "finetune", run, "--data", "digits", "--method", "head", "train.epochs=1",
                 "train.progress=false", "--out", "ft")
    assert (home / "ft" / "finetune.json").is_file() and "test_acc" in r.stdout


def test_a_tiny_study_runs_and_reports(home):
    (home / "base.yaml").write_text("model: {name: bvit_tiny, patch_size: 4, embed_dim: 24, num_heads: 2}\n"
                                    "data: {name: digits}\ntrain: {epochs: 1, batch_size: 256, progress: false}\n")
    (home / "tiny.yaml").write_text("name: tiny\nbase: base.yaml\ngrid:\n  model.steps: [1, 2]\n"
                                    "eval:\n  max_steps_factor: 2\nresults: tiny_results\n")
    recurvit(home, "study", "tiny.yaml", "--workers", "1")
    rows = (home / "tiny_results" / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and (home / "tiny_results" / "report.md").is_file()


def test_an_srvit_run_and_its_mixture(home):
    recurvit(home, "train", "digits/softmor/srvit_r2", "train.epochs=1", "train.progress=false", "--out", "srvit")
    r = recurvit(home, "mixture", "srvit", "--out", "mixture")
    assert any((home / "mixture").iterdir()), r.stdout


def test_a_maze_run_and_its_horizon(home):
    r = recurvit(home, "train", "mazes/dt_recall_deepthinking", "model.width=4", "model.steps=3", "data.maze_train=100",
                 "data.maze_val=20", "data.maze_test=10", "data.maze_test_sizes=[9,13]", "train.epochs=1",
                 "train.progress=false", "--out", "maze")
    assert "val_solved_open" in r.stdout
    r = recurvit(home, "horizon", "maze", "--mazes", "10", "--sizes", "9", "13", "--out", "maze_horizon")
    header = (home / "maze_horizon" / "horizon.csv").read_text().splitlines()[0]
    assert header.split(",")[:3] == ["size", "step", "solved"] and "solved_open" in header


def test_the_tokenizer_trains_and_evaluates(home):
    recurvit(home, "vae", "train", "vae/digits", "train.epochs=1",
             "train.progress=false", "--out", "vae")
    r = recurvit(home, "vae", "eval", "vae", "--json")
    assert "psnr" in r.stdout.lower()


PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


@pytest.mark.parametrize("code", PYTHON_BLOCKS, ids=[f"block{i}" for i in range(len(PYTHON_BLOCKS))])
def test_each_python_block_runs_in_a_fresh_interpreter(home, code):
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO if "configs/" in code else home, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]


def test_every_command_the_readme_names_is_run_here():
    """Runs last (pytest keeps a module's order): every ``recurvit X`` of the README's code and tables ran above."""
    named = set(re.findall(r"recurvit (train|eval|predict|export|horizon|flops|match|study|analyze|finetune|exit|"
                           r"mixture|configs|vae (?:train|eval))\b", README))
    missing = sorted(named - RUN_SUBCOMMANDS)
    assert named and not missing, f"README commands no test here runs: {missing}"
