"""The command line: every error a user can cause ends with ONE line and exit code 2."""
import json
import subprocess
import sys

import pytest

from recurvit.cli import main

FAST = ["model.embed_dim=24", "model.steps=2", "train.epochs=1", "train.progress=false"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", *FAST, "--out", str(out)]) == 0
    return out


def _fails(capsys, argv, needle):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert needle in err, err


@pytest.mark.parametrize("argv,needle", [
    (["train", "model.name=vit_giant"], "unknown model"),
    (["train", "model.steps=0"], "steps must be >= 1"),
    (["train", "model.patch_size=3"], "does not divide"),
    (["train", "data.name=fashion_mnist", "data.root=/nonexistent"], "train-images-idx3-ubyte"),
    (["train", "data.name=cifar100", "data.root=/nonexistent"], "cifar-100-python"),
    (["train", "train.epochs=many"], "bad config"),
    (["train", "train.nope=1"], "bad config"),
    (["train", "train.lr=nan"], "train.lr must be a positive number"),
    (["train", "train.batch_size=0"], "train.batch_size must be >= 1"),
    (["train", "missing.yaml"], "config file not found"),
    (["train", "epochs5"], "config file not found"),
    (["train", "train.supervision.weights=cubic", "train.epochs=1"], "weights must be"),
    (["eval", "/nonexistent/run"], "checkpoint not found"),
    (["flops", "bvit_tiny", "patch_size=5"], "does not divide"),
    (["match", "nope"], "unknown model"),
    (["train", "model.core=ode", "model.adjoint=true", "train.activation_checkpointing=true"], "adjoint already"),
    (["train", "model.name=vit_tiny", "model.step_cond=embed"], "does not apply to the stack core"),
    (["train", "model.depth=3"], "ONE shared block"),
    (["train", "model.name=vit_tiny", "model.core=ode"], "ONE shared block"),
    (["horizon", "/nonexistent/run", "--steps", "0"], "--steps must be >= 1"),
])
def test_bad_input_one_line_exit_2(capsys, argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, argv, needle)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing left behind


@pytest.mark.slow
def test_train_eval_horizon_and_corrupt_checkpoint(run_dir, tmp_path, capsys):
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert {"accuracy", "loss", "steps"} <= set(res) and res["steps"] == 2
    assert main(["eval", str(run_dir), "--steps", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 5
    _fails(capsys, ["eval", str(run_dir), "--steps", "0"], "--steps must be >= 1")
    assert main(["horizon", str(run_dir), "--steps", "6", "--json"]) == 0
    h = json.loads(capsys.readouterr().out)
    assert h["acc_T"] is not None and len(h["sweep"]["accuracy"]) == 6
    assert (run_dir / "horizon.csv").read_text().splitlines()[0] == "step,accuracy,loss,rel_change"
    assert (run_dir / "horizon.png").stat().st_size > 1000
    bad = tmp_path / "bad.pt"
    bad.write_bytes((run_dir / "last.pt").read_bytes()[:2000])
    _fails(capsys, ["eval", str(bad)], "corrupt, truncated")


def test_existing_run_dir_is_kept(run_dir, capsys):
    before = sorted(p.name for p in run_dir.iterdir())
    _fails(capsys, ["train", *FAST, "--out", str(run_dir)], "already exists")
    assert sorted(p.name for p in run_dir.iterdir()) == before
    _fails(capsys, ["train", "--resume", str(run_dir / "nope")], "is not a run directory")


@pytest.mark.slow
def test_console_entry_point_exit_code(tmp_path):
    r = subprocess.run([sys.executable, "-m", "recurvit", "train", "model.name=nope"], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_flops_runs_on_the_default_device_and_counts_the_router(capsys):
    assert main(["flops", "srvit_tiny", "img_size=32", "patch_size=4", "recursions=2", "router=query",
                 "--no-memory", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["params_core"] == 12 * (192 * 192 + 2) and res["flops_core"] > 0
    assert res["flops_analytic"] == res["flops_forward"]  # the closed form includes the router's matmuls


def test_help_imports_no_torch_and_the_exit_criteria_match_the_models():
    import subprocess
    import sys

    from recurvit.commands.exit import CRITERIA
    from recurvit.models.adaptive import CRITERIA as MODEL_CRITERIA

    assert CRITERIA == MODEL_CRITERIA
    code = "import sys; from recurvit.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n" \
           "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_print_config_shows_the_resolved_model_sizes(capsys):
    import yaml

    assert main(["train", "--print-config"]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert (model["img_size"], model["in_chans"], model["num_classes"]) == (8, 1, 10)  # digits, not null


def test_data_root_on_a_digits_run_is_an_error_not_ignored(run_dir, capsys):
    assert main(["eval", str(run_dir), "--data-root", "/somewhere"]) == 2
    err = capsys.readouterr().err
    assert "--data-root does not apply" in err and "digits" in err and len(err.strip().splitlines()) == 1


def test_every_subcommand_help_shows_its_defaults(capsys):
    import pytest as _pytest

    from recurvit.cli import COMMANDS

    for name in COMMANDS:
        with _pytest.raises(SystemExit):
            main([name, "--help"])
        text = capsys.readouterr().out
        assert "usage: recurvit " + name in text
    with _pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "(default: auto)" in capsys.readouterr().out


def test_eval_with_a_data_or_train_key_names_the_real_reason(tmp_path, capsys):
    from recurvit.cli import main

    run = tmp_path / "r"
    assert main(["train", "model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.epochs=1",
                 "train.progress=false", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "data.name=fashion_mnist"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "eval takes core options" in err and "core" in err, err


def test_every_command_help_ends_with_examples_of_real_options(capsys):
    """Each example parses: its options and subcommands exist (RUN and file names are placeholders)."""
    import shlex

    from recurvit.cli import COMMANDS, EXAMPLES, build_parser

    assert set(EXAMPLES) == set(COMMANDS)
    parser = build_parser()
    for name, examples in EXAMPLES.items():
        for e in examples:
            args = parser.parse_args(shlex.split(e)[1:])  # argparse exits on an unknown option
            assert args.command == name, e
