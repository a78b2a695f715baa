"""Run safety through the real CLI: one writer per run directory, resume that says what it
changes, one line and exit 2 for a user's mistake, output that fits a pipe. Real subprocesses where
processes are the point (locks, kill -9, pipes); the CLI's own ``main`` in-process elsewhere."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import yaml

from recurvit.run.rundir import RunDir

TINY = ["model.embed_dim=24", "model.num_heads=2", "model.steps=2", "train.batch_size=256"]


def _env(**extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    env.pop("TQDM_DISABLE", None) if "TQDM_DISABLE" not in extra else None
    return env


def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "recurvit.cli", *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "recurvit.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def run_main(*args, capsys):
    """``recurvit ARGS`` in this process: (returncode, stdout, stderr) like a subprocess."""
    from recurvit.cli import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished 2-epoch tiny run; tests copy it (training it per test would cost seconds each)."""
    from recurvit.cli import main

    run = tmp_path_factory.mktemp("shared") / "r"
    assert main(["train", *TINY, "train.epochs=2", "train.progress=false", "--out", str(run), "--json"]) == 0
    return run


def copy_run(trained, tmp_path):
    dst = tmp_path / "r"
    shutil.copytree(trained, dst)
    return dst


def one_line_exit_2(res, needle):
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err


def epochs(run):
    return [json.loads(ln)["epoch"] for ln in (run / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------- one writer
@pytest.mark.slow
def test_two_trainers_started_at_once_one_writes_the_other_exits_2(tmp_path):
    run = tmp_path / "same"
    procs = [start("train", *TINY, "train.epochs=2", f"train.seed={s}", "--out", run) for s in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    loser = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 2).strip()
    assert len(loser.splitlines()) == 1 and ("in use" in loser or "already exists" in loser), loser
    assert epochs(run) == [1, 2]  # every epoch once, from one writer
    winner_seed = next(s for s, p in zip((0, 1), procs) if p.returncode == 0)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["seed"] == winner_seed


@pytest.mark.slow
def test_resume_of_a_running_run_is_refused_and_a_killed_run_resumes(tmp_path):
    run = tmp_path / "r"
    p = start("train", *TINY, "train.epochs=8", "--out", run)
    t0 = time.time()
    while not (run / "last.pt").is_file():
        assert p.poll() is None and time.time() - t0 < 240
        time.sleep(0.2)
    p.send_signal(signal.SIGSTOP)  # frozen mid-run: it still holds the lock, and cannot finish first
    try:
        one_line_exit_2(cli("train", "--resume", run), "in use")
    finally:
        p.send_signal(signal.SIGKILL)  # the OS releases the lock of a killed process
        p.wait()
    res = cli("train", "--resume", run)
    assert res.returncode == 0, res.stderr
    assert epochs(run) == list(range(1, 9))


@pytest.mark.slow
def test_a_killed_study_takes_its_workers_with_it_and_resumes(tmp_path):
    """kill -9 of `recurvit study` ends its worker processes (no orphan keeps a run's lock); run again,
    the study finishes every run."""
    (tmp_path / "base.yaml").write_text("model: {name: bvit_tiny, patch_size: 4, embed_dim: 24, num_heads: 2, "
                                        "steps: 2}\ndata: {name: digits}\ntrain: {epochs: 10, batch_size: 256}\n")
    (tmp_path / "s.yaml").write_text("name: k\nbase: base.yaml\ngrid:\n  train.seed: [0, 1]\n"
                                     "eval: {max_steps_factor: 1}\nresults: res\n")
    out = tmp_path / "study"
    p = start("study", tmp_path / "s.yaml", "--workers", "2", "--out", out)
    locks = [out / "runs" / f"seed={s}" / ".lock" for s in (0, 1)]
    t0 = time.time()
    while not all(lock.is_file() and lock.read_text().strip() for lock in locks):
        assert p.poll() is None and time.time() - t0 < 240, p.communicate()
        time.sleep(0.2)
    workers = [int(lock.read_text()) for lock in locks]
    p.send_signal(signal.SIGKILL)
    p.wait()
    t0 = time.time()
    while any(_alive(pid) for pid in workers):
        assert time.time() - t0 < 30, f"workers {workers} outlived their study"
        time.sleep(0.2)
    res = cli("study", tmp_path / "s.yaml", "--workers", "2", "--out", out, "--json",
              env=_env(TQDM_DISABLE="1"))
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) == 2 and not any("error" in r for r in rows), rows
    assert all(r["epochs"] == 10 for r in rows)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has exited (its parent, killed, cannot reap it)
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_the_lock_protects_finetune_and_vae_train(trained, tmp_path):
    held = tmp_path / "held"
    with RunDir.create(held):  # another process's lock: the commands below run in their own processes
        one_line_exit_2(cli("finetune", trained, "--data", "digits", "--method", "head", "train.epochs=1", "--out",
                            held), "in use")
        one_line_exit_2(cli("vae", "train", "data.img_size=16", "train.epochs=1", "--out", held), "in use")
        one_line_exit_2(cli("train", "--resume", held), "in use")
    assert sorted(p.name for p in held.iterdir()) == [".lock"]  # nothing touched


# ----------------------------------------------------------------------------------- resume
@pytest.mark.slow
def test_resume_applies_train_overrides_and_says_so(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    res = run_main("train", "--resume", run, "train.epochs=3", "train.lr=0.002", capsys=capsys)
    assert res.returncode == 0, res.stderr
    assert f"resuming {run} at epoch 2: train.epochs 2 -> 3, train.lr 0.001 -> 0.002" in res.stdout
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["train"]["epochs"] == 3 and cfg["train"]["lr"] == 0.002  # what the run actually used
    assert epochs(run) == [1, 2, 3]
    last = torch.load(run / "last.pt", weights_only=True)
    assert last["config"]["train"]["lr"] == 0.002
    assert last["optimizer"]["param_groups"][0]["initial_lr"] == 0.002  # the optimizer follows


@pytest.mark.parametrize("overrides,keys", [
    (["model.embed_dim=32", "train.seed=3"], "model.embed_dim, train.seed"),
    (["train.supervision.per_stage_heads=true"], "train.supervision.per_stage_heads"),  # adds modules
])
def test_resume_refuses_what_would_change_the_model(trained, tmp_path, capsys, overrides, keys):
    run = copy_run(trained, tmp_path)
    before = (run / "config.yaml").read_text()
    one_line_exit_2(run_main("train", "--resume", run, *overrides, capsys=capsys), f"cannot change {keys}")
    assert (run / "config.yaml").read_text() == before


@pytest.mark.slow
def test_finetune_resume_takes_overrides_after_the_run(trained, tmp_path, capsys):
    """``finetune --resume FT train.epochs=2`` (the form its usage gives): the override was read as RUN_DIR
    and refused with 'drop RUN_DIR, --data and --out', none of which was given."""
    ft = tmp_path / "ft"
    assert run_main("finetune", trained, "--data", "digits", "--method", "head", "train.epochs=1", "--out", ft,
                    capsys=capsys).returncode == 0
    res = run_main("finetune", "--resume", ft, "train.epochs=2", capsys=capsys)
    assert res.returncode == 0, res.stderr
    assert epochs(ft) == [1, 2]
    one_line_exit_2(run_main("finetune", "--resume", ft, trained, capsys=capsys), "drop RUN_DIR")  # a real RUN_DIR


def test_resume_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    one_line_exit_2(run_main("train", "--resume", tmp_path, capsys=capsys), "not a run directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no lock, config or checkpoint written


def test_out_over_a_foreign_directory_leaves_no_lock_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    one_line_exit_2(run_main("train", *TINY, "--out", tmp_path, capsys=capsys), "already exists and is not empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_follow_config_keeps_an_unchanged_schedule_and_moves_a_changed_one():
    from recurvit.config import TrainConfig
    from recurvit.train.optim import build_optimizer, build_scheduler, follow_config

    model = torch.nn.Linear(4, 2)
    tc = TrainConfig(epochs=4, lr=1e-3, warmup_epochs=1)
    opt = build_optimizer(model, tc, torch.device("cpu"))
    sched = build_scheduler(opt, tc, 10)
    for _ in range(17):
        opt.step()
        sched.step()
    lr = [g["lr"] for g in opt.param_groups]
    follow_config(opt, sched, tc, 10)
    assert [g["lr"] for g in opt.param_groups] == lr  # same config: bit-identical
    new = TrainConfig(epochs=8, lr=5e-3, warmup_epochs=1, min_lr=1e-5, weight_decay=0.1)
    follow_config(opt, sched, new, 10)
    factor = build_scheduler(torch.optim.SGD(model.parameters(), lr=1.0), new, 10).lr_lambdas[0](17)
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-3 * factor)
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0


@pytest.mark.slow
def test_resume_without_a_checkpoint_starts_from_the_beginning_and_cleans_temp_files(tmp_path, capsys):
    run = tmp_path / "r"
    run.mkdir()
    config = run_main("train", *TINY, "train.epochs=1", "--print-config", capsys=capsys)
    (run / "config.yaml").write_text(config.stdout)  # written at the start of the killed run
    (run / "metrics.jsonl").write_text("")
    (run / ".last.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    res = run_main("train", "--resume", run, capsys=capsys)
    assert res.returncode == 0, res.stderr
    assert "starting it from the beginning" in res.stdout
    assert not list(run.glob(".*.tmp")) and epochs(run) == [1]


def test_resume_of_a_finished_run_whose_metrics_were_deleted(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    (run / "metrics.jsonl").unlink()
    res = run_main("train", "--resume", run, "--json", capsys=capsys)
    assert res.returncode == 0, res.stderr
    last = torch.load(run / "last.pt", weights_only=True)["metrics"]
    got = json.loads(res.stdout)
    assert last["epoch"] == 2 and got["epoch"] == 2 and got["test_acc"] == last["test_acc"]  # from last.pt


# -------------------------------------------------------------------- one line and exit 2
@pytest.mark.parametrize("args,needle", [
    (["--out", "/proc/recurvit-x"], "cannot create run directory"),
    (["train.batch_size=1e20"], "train.batch_size"),  # not an integer
    (["train.batch_size=10000000000"], "must be <= 1,000,000,000"),
    (["model.steps=1000000000"], "1,000,000,000 steps"),  # activations no machine holds
    (["model.embed_dim=1000000", "model.num_heads=1"], "parameters"),  # counted on the meta device
    (["--nproc", "0"], "--nproc must be >= 1"),  # trained in one process before, silently
])
def test_user_mistakes_are_one_line(tmp_path, capsys, args, needle):
    out = [] if "--out" in args else ["--out", tmp_path / "r"]
    one_line_exit_2(run_main("train", "model.embed_dim=24", *args, *out, capsys=capsys), needle)
    assert not (tmp_path / "r").exists()  # no run directory left behind


def test_out_pointing_at_a_file(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("mine")
    one_line_exit_2(run_main("train", *TINY, "--out", f, capsys=capsys), "is a file")
    assert f.read_text() == "mine"


def test_divergence_advises_clipping(tmp_path, capsys):
    res = run_main("train", *TINY, "train.epochs=1", "train.lr=1e30", "train.grad_clip=0", "--out", tmp_path / "r",
                   capsys=capsys)
    one_line_exit_2(res, "diverged")
    assert "set train.grad_clip" in res.stderr  # clipping was off: the advice is to turn it on
    assert not (tmp_path / "r").exists()  # failed inside its first epoch: nothing written, no directory left


def test_eval_refuses_a_step_count_far_beyond_the_machine(trained, capsys):
    one_line_exit_2(run_main("eval", trained, "--steps", 10 ** 12, capsys=capsys), "would take about")
    one_line_exit_2(run_main("horizon", trained, "--steps", 10 ** 9, capsys=capsys), "would take about")
    one_line_exit_2(run_main("analyze", trained, "--steps", 10 ** 6, capsys=capsys), "would take about")


# ---------------------------------------------------------------------------------- output
@pytest.mark.slow
def test_piped_output_is_one_line_per_epoch_and_no_progress_bar(tmp_path):
    res = cli("train", *TINY, "train.epochs=3", "--out", tmp_path / "r")  # pipes, TQDM_DISABLE unset
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stdout + res.stderr and "it/s" not in res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("model ") and lines[-1].startswith("run ")
    assert [ln.split()[1] for ln in lines[1:-1]] == ["1/3", "2/3", "3/3"]


def test_long_work_in_a_pipe_prints_a_progress_line_at_a_steady_interval(monkeypatch, capsys):
    from tqdm.auto import tqdm

    from recurvit.run import progress

    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(progress, "PIPE_INTERVAL", 0.05)
    for _ in tqdm(range(8), desc="sweeping", leave=False, **progress.bar_options(True)):
        progress.time.sleep(0.03)
    lines = capsys.readouterr().err.splitlines()
    assert 1 <= len(lines) <= 8 and all(ln.startswith("sweeping") and "\r" not in ln for ln in lines), lines
    monkeypatch.setattr(progress, "PIPE_INTERVAL", 60.0)  # short work in a pipe: silent
    for _ in tqdm(range(8), desc="short", leave=False, **progress.bar_options(True)):
        pass
    assert capsys.readouterr().err == ""
    assert progress.bar_options(False) == {"disable": True}


def test_train_log_every_writes_timm_style_lines(tmp_path, capsys):
    res = run_main("train", *TINY, "train.epochs=1", "train.batch_size=64", "train.log_every=10", "--out",
                   tmp_path / "r", capsys=capsys)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("Train: 1 [")]
    assert len(lines) == 2 and "[10/23 (43%)]" in lines[0] and "loss" in lines[0] and "lr" in lines[0], lines


def test_tqdm_disable_is_honoured_even_on_a_terminal(monkeypatch):
    from recurvit.run import progress

    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert progress.show_progress(True) and not progress.show_progress(False)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert not progress.show_progress(True)


def test_every_progress_bar_asks_whether_someone_watches(monkeypatch):
    """Each tqdm in the package is gated by run.progress.show_progress or bar_options (a terminal, no --json,
    no TQDM_DISABLE); analyze's and vae intervene's bars once were not."""
    import re
    from pathlib import Path

    import recurvit
    from recurvit.analysis import per_step
    from recurvit.run import progress

    src = Path(recurvit.__file__).parent
    for f in src.rglob("*.py"):
        text = f.read_text()
        for m in re.finditer(r"\btqdm\(", text):
            body = text[max(0, text.rfind("\ndef ", 0, m.start())):m.start() + 300]
            assert "show_progress(" in body or "bar_options(" in body, \
                f"{f.relative_to(src)}: a progress bar not gated by show_progress / bar_options"
    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: False, raising=False)
    items = [1, 2, 3]
    assert per_step._progress(items, True, "x") is items  # piped: the plain iterable, no bar


# ------------------------------------------------------------------- studies nothing can corrupt
def _study(tmp_path, grid: str, extra: str = "", epochs: int = 1):
    (tmp_path / "base.yaml").write_text("model: {name: bvit_tiny, patch_size: 4, embed_dim: 24, num_heads: 2, "
                                        f"steps: 2}}\ndata: {{name: digits}}\ntrain: {{epochs: {epochs}, batch_size: 256}}\n")
    (tmp_path / "s.yaml").write_text(f"name: k\nbase: base.yaml\ngrid:\n{grid}\neval: {{max_steps_factor: 1}}\n"
                                     f"results: res\n{extra}")
    return tmp_path / "s.yaml"


@pytest.mark.parametrize("grid,needle", [
    ("  regime:\n    ../../x: {}\n", "grid label '../../x'"),
    ("  regime:\n    /abs: {}\n", "grid label '/abs'"),
    ("  regime:\n    '..': {}\n", "grid label '..'"),
    ("  train.seed: [0, 0]\n", "lists 0 more than once"),
])
def test_a_label_that_would_leave_the_runs_folder_or_count_twice_is_refused(tmp_path, capsys, grid, needle):
    res = run_main("study", _study(tmp_path, grid), "--out", tmp_path / "o", capsys=capsys)
    assert res.returncode == 2 and needle in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("extra,needle", [
    ("wokers: 2\n", "unknown key 'wokers'"),
    ("eval2: {}\n", "did you mean 'eval'"),
    ("report: {frontir: true}\n", "did you mean 'report.frontier'"),
])
def test_a_misspelt_study_key_names_the_nearest_valid_one(tmp_path, capsys, extra, needle):
    res = run_main("study", _study(tmp_path, "  train.seed: [0]\n", extra), capsys=capsys)
    assert res.returncode == 2 and needle in res.stderr, res.stderr


def test_a_huge_grid_is_refused_before_it_is_expanded(tmp_path, capsys):
    axes = "".join(f"  a{i}: [{', '.join(map(str, range(10)))}]\n" for i in range(7))  # 10^7 runs
    res = run_main("study", _study(tmp_path, axes), capsys=capsys)
    assert res.returncode == 2 and "10,000,000 runs" in res.stderr, res.stderr


def test_a_study_folder_has_one_writer(tmp_path, capsys):
    from recurvit.commands.study import study_lock

    spec = _study(tmp_path, "  train.seed: [0]\n")
    with study_lock(tmp_path / "o"):  # as another `recurvit study` holds it
        res = run_main("study", spec, "--out", tmp_path / "o", capsys=capsys)
    assert res.returncode == 2 and "another `recurvit study` is writing" in res.stderr, res.stderr
    assert f"(pid {os.getpid()})" in res.stderr  # the run directories' lock (run/lock.py): it names its holder
    assert not (tmp_path / "o" / "runs").exists()


@pytest.mark.slow
def test_a_corrupt_result_is_evaluated_again_and_a_failed_study_exits_1(tmp_path, capsys):
    spec = _study(tmp_path, "  train.seed: [0, 1]\n")
    out = tmp_path / "o"
    assert run_main("study", spec, "--out", out, "--json", capsys=capsys).returncode == 0
    (out / "runs" / "seed=0" / "result.json").write_text('{"run_id": "seed=0", "acc_T": ')  # torn
    (out / "results" / "runs" / "seed=0" / "result.json").unlink()
    res = run_main("study", spec, "--out", out, "--report-only", "--json", capsys=capsys)
    assert res.returncode == 1 and "1 of 2 runs failed" in res.stderr  # reported, not a traceback
    res = run_main("study", spec, "--out", out, "--json", capsys=capsys)  # evaluated again from last.pt
    assert res.returncode == 0, res.stderr
    assert all("error" not in r for r in json.loads(res.stdout)["rows"])
    assert json.loads((out / "runs" / "seed=0" / "result.json").read_text())["acc_T"] > 0


@pytest.mark.slow
def test_a_killed_worker_fails_its_run_only(tmp_path):
    spec = _study(tmp_path, "  train.seed: [0, 1]\n", epochs=30)
    out = tmp_path / "o"
    p = start("study", spec, "--workers", "2", "--out", out, "--json")
    locks = [out / "runs" / f"seed={s}" / ".lock" for s in (0, 1)]
    t0 = time.time()
    while not all(lock.is_file() and lock.read_text().strip() for lock in locks):
        assert p.poll() is None and time.time() - t0 < 240, p.communicate()
        time.sleep(0.2)
    os.kill(int(locks[0].read_text()), signal.SIGKILL)  # the OOM killer takes one worker
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 1, stderr
    rows = {r["run_id"]: r for r in json.loads(stdout)["rows"]}
    assert "worker process died" in rows["seed=0"]["error"] and "error" not in rows["seed=1"]
    assert rows["seed=1"]["epochs"] == 30


@pytest.mark.slow
def test_a_bare_resume_never_trains_the_default_config(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "killed_early"
    empty.mkdir()
    (empty / ".lock").write_text("12345\n")  # killed before it wrote anything
    res = run_main("train", "--resume", empty, capsys=capsys)
    assert res.returncode == 2 and "stopped before it wrote its config.yaml" in res.stderr, res.stderr
    assert sorted(p.name for p in empty.iterdir()) == [".lock"]
    # the config is on disk while epoch 1 trains, so a run killed there resumes as itself
    import recurvit.train.fit as loop

    seen = {}
    real = loop.train_epoch

    def spy(*a, **kw):
        seen.setdefault("config", (tmp_path / "r" / "config.yaml").read_text())
        return real(*a, **kw)

    monkeypatch.setattr(loop, "train_epoch", spy)
    assert run_main("train", "model.name=vit_tiny", "model.depth=2", *TINY[:2], "train.epochs=1",
                    "--out", tmp_path / "r", capsys=capsys).returncode == 0
    assert yaml.safe_load(seen["config"])["model"]["name"] == "vit_tiny"


@pytest.mark.slow
def test_killing_a_multi_process_train_takes_torchrun_and_its_ranks_with_it(tmp_path):
    run = tmp_path / "ddp"
    p = start("train", *TINY, "train.epochs=5000", "train.device=cpu", "--nproc", "2", "--out", run)
    lock = run / ".lock"
    t0 = time.time()
    while not (lock.is_file() and lock.read_text().strip()):
        assert p.poll() is None and time.time() - t0 < 240, p.communicate()
        time.sleep(0.2)
    rank0 = int(lock.read_text())
    with open(f"/proc/{rank0}/stat") as f:  # rank 0's parent is torchrun's agent
        torchrun = int(f.read().rsplit(")", 1)[1].split()[1])
    p.send_signal(signal.SIGKILL)
    p.wait()
    t0 = time.time()
    while _alive(rank0) or _alive(torchrun):
        assert time.time() - t0 < 30, f"torchrun {torchrun} / rank 0 {rank0} outlived `recurvit train --nproc 2`"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_torn_metrics_line_past_the_checkpoint_is_dropped_and_one_within_it_is_named(trained, tmp_path, capsys):
    run = copy_run(trained, tmp_path)
    good = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(good + '{"epoch": 3, "train_lo')  # torn by a kill after epoch 2's checkpoint
    res = run_main("train", "--resume", run, "train.epochs=3", capsys=capsys)
    assert res.returncode == 0, res.stderr
    assert epochs(run) == [1, 2, 3]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    res = run_main("train", "--resume", run, "train.epochs=4", capsys=capsys)
    assert res.returncode == 2 and "metrics.jsonl, line 2: not a metrics line" in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1
