"""recurvit study --launcher submitit: runs as submitit jobs (here submitit's LocalExecutor: real
subprocess jobs, no Slurm), a preempted job requeued and resumed to the uninterrupted result."""
import json
import os
import signal
import threading
import time

import pytest

pytest.importorskip("submitit")

import recurvit.tasks  # noqa: E402,F401  (registers the tasks study files name: study/ imports none)
from recurvit.cli import main  # noqa: E402
from recurvit.errors import UserError  # noqa: E402
from recurvit.study import load_study  # noqa: E402
from recurvit.run.checkpoint import load_checkpoint  # noqa: E402
from recurvit.study.launch import ClusterOptions, StudyJob, _last_error, _row, run_study_submitit  # noqa: E402

# two runs with the same settings: a is preempted, b is not
STUDY = """
name: launch
base: base.yaml
grid:
  regime:
    a: {}
    b: {}
eval:
  max_steps_factor: 1
results: out_results
"""
BASE = """
model: {name: bvit_tiny, patch_size: 4, embed_dim: 24, num_heads: 2, steps: 2, global_pool: avg, class_token: false}
data: {name: digits}
train: {epochs: 4, batch_size: 128, progress: false}
"""
TIMING = ("seconds", "img_per_s", "train_seconds", "train_cpu_seconds")


@pytest.fixture
def study_file(tmp_path):
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "s.yaml").write_text(STUDY)
    return tmp_path / "s.yaml"


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_preempted_job_is_requeued_and_resumes_to_the_uninterrupted_result(study_file, tmp_path, capsys):
    """Job a gets USR2 (what Slurm sends to preempt a job or before its time limit) once its first
    checkpoint is on disk: submitit calls StudyJob.checkpoint, requeues it, and the new process resumes
    the run directory. Its metrics equal those of job b (same settings, never interrupted)."""
    out = tmp_path / "study"
    run_a = out / "runs" / "a"
    seen = {}

    def preempt():
        deadline = time.time() + 120
        while not (run_a / "last.pt").is_file():
            if time.time() > deadline:
                return
            time.sleep(0.02)
        seen["pid"] = pid = int((run_a / ".lock").read_text())  # the process that owns the run: the job's task
        os.kill(pid, signal.SIGSTOP)  # frozen, so what it has done when the signal arrives is known
        try:
            seen["epoch_1"] = (run_a / "metrics.jsonl").read_text().splitlines()[0]  # written before last.pt
            seen["checkpoint_epoch"] = load_checkpoint(run_a / "last.pt")["epoch"]
        finally:
            os.kill(pid, signal.SIGUSR2)
            os.kill(pid, signal.SIGCONT)

    watcher = threading.Thread(target=preempt, daemon=True)
    watcher.start()
    rc = main(["study", str(study_file), "--out", str(out), "--launcher", "submitit", "--cluster", "local",
               "--cpus-per-run", "1", "--timeout-min", "10", "--poll", "0.2", "--json"])
    watcher.join(timeout=5)
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    rows = {r["run_id"]: r for r in res["rows"]}
    assert set(rows) == {"a", "b"} and not any("error" in r for r in rows.values())

    assert "pid" in seen, "the first checkpoint of run a never appeared"
    assert 1 <= seen["checkpoint_epoch"] < 4  # preempted in the middle of training
    a, b = _rows(run_a), _rows(out / "runs" / "b")
    assert [r["epoch"] for r in a] == [r["epoch"] for r in b] == [1, 2, 3, 4]
    assert (run_a / "metrics.jsonl").read_text().splitlines()[0] == seen["epoch_1"]  # epoch 1 not trained again
    assert int((run_a / ".lock").read_text()) != seen["pid"]  # another process finished the run
    for ra, rb in zip(a, b):
        for key in set(ra) | set(rb):
            if key not in TIMING:
                assert ra[key] == pytest.approx(rb[key], rel=1e-6, abs=1e-7), (ra["epoch"], key)
    for key in ("acc_T", "test_acc_final", "params_stored"):
        assert rows["a"][key] == pytest.approx(rows["b"][key], rel=1e-6), key
    logs = "".join(p.read_text() for p in (out / "slurm").glob("*_log.*"))
    assert "run a interrupted (preempted or out of time); requeued" in logs
    assert (out / "results" / "report.md").is_file()  # --out moves the results too

    # the study is complete: the same command submits nothing
    lines = []
    again = run_study_submitit(load_study(study_file), out, ClusterOptions(cluster="local", poll_s=0.2),
                               progress=False, log=lines.append)
    assert "2 runs, 2 finished, 0 to run" in lines[0] and len(lines) == 1
    assert again == [rows["a"], rows["b"]]


class _DeadJob:
    job_id = "4242_1"

    class paths:
        stderr = "/logs/4242_1_0_log.err"

    def __init__(self, exc):
        self.exc = exc

    def result(self):
        raise self.exc


def test_a_failed_or_killed_job_is_a_failed_run(tmp_path):
    from submitit.core.utils import FailedJobError, UncompletedJobError

    (tmp_path / "r").mkdir()
    kw = {"out": str(tmp_path / "r"), "labels": {"regime": "x"}}
    trace = ("Job (task=0) failed during processing with trace:\n----\nTraceback (most recent call last):\n"
             "  File \"x.py\", line 1\ntorch.OutOfMemoryError: CUDA out of memory.\n----\nYou can check full logs")
    row = _row(_DeadJob(FailedJobError(trace)), kw)
    assert row["run_id"] == "r" and row["regime"] == "x"
    assert row["error"] == "job 4242_1 failed: torch.OutOfMemoryError: CUDA out of memory. (log: /logs/4242_1_0_log.err)"
    assert (tmp_path / "r" / "error.txt").read_text().startswith("job 4242_1 failed")
    row = _row(_DeadJob(UncompletedJobError("Job 4242_1 (task: 0) with path x\nhas not produced any output")), kw)
    assert row["error"].startswith("job 4242_1 was killed or timed out too often: Job 4242_1")
    assert _last_error("") == "no message"


def test_checkpoint_hook_requeues_the_same_run():
    job = StudyJob({"out": "/runs/a", "labels": {}})
    delayed = job.checkpoint()
    assert isinstance(delayed.function, StudyJob) and delayed.function.kw == job.kw
    assert delayed.args == () and delayed.kwargs == {}


def test_cli_flag_errors(study_file, tmp_path, capsys):
    base = ["study", str(study_file), "--out", str(tmp_path / "o")]
    assert main(base + ["--partition", "gpu"]) == 2
    assert "--partition: only with --launcher submitit" in capsys.readouterr().err
    assert main(base + ["--launcher", "submitit", "--workers", "2"]) == 2
    assert "--workers is for --launcher local" in capsys.readouterr().err
    assert main(base + ["--launcher", "submitit", "--cluster", "local", "--cpus-per-run", "0"]) == 2
    assert "--cpus-per-run must be >= 1" in capsys.readouterr().err
    assert main(base + ["--launcher", "submitit", "--cluster", "local", "--slurm-arg", "qos"]) == 2
    assert "not of the form key=value" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_without_slurm_or_submitit_one_line(study_file, tmp_path, monkeypatch):
    import sys

    import recurvit.study.launch as launch

    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="sbatch is not found here.*--cluster local"):
        run_study_submitit(load_study(study_file), tmp_path / "o", ClusterOptions(), progress=False)
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(UserError, match=r'pip install -e "\.\[cluster\]"'):
        run_study_submitit(load_study(study_file), tmp_path / "o", ClusterOptions(cluster="local"), progress=False)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_run_with_several_gpus_trains_in_torchrun_processes(study_file, tmp_path):
    """--gpus-per-run N > 1 makes the job call run_one(nproc=N): training in N processes under torchrun
    (DDP, as `recurvit train --nproc N`), evaluation in the job. Here on CPU (gloo), resuming a run
    that one process stopped after epoch 1."""
    import torch.distributed as dist

    from recurvit.config import load_config
    from recurvit.study.runner import run_one
    from recurvit.tasks.classify.task import train

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    base, run = str(study_file.parent / "base.yaml"), tmp_path / "run"
    overrides = ["train.device=cpu", "train.epochs=2"]
    train(load_config(base, overrides), run, log=lambda *a: None, stop_after=1)
    first = (run / "metrics.jsonl").read_text().splitlines()[0]
    res = run_one("classify", base, overrides, str(run), {"horizon": {"max_steps_factor": 1}}, {"regime": "a"},
                  threads=2, nproc=2)
    assert res["epochs"] == 2 and "acc_T" in res and (run / "result.json").is_file()
    assert [r["epoch"] for r in _rows(run)] == [1, 2]
    assert (run / "metrics.jsonl").read_text().splitlines()[0] == first
    assert load_checkpoint(run / "last.pt")["world_size"] == 2  # epoch 2 ran in two processes


def test_slurm_job_settings_become_sbatch_options(tmp_path, monkeypatch):
    import recurvit.study.launch as launch

    monkeypatch.setattr(launch.shutil, "which", lambda name: "/usr/bin/" + name)  # as on a login node
    opts = ClusterOptions(partition="gpu", gpus_per_run=2, cpus_per_run=8, timeout_min=60, mem_gb=32.0,
                          slurm_args={"account": "proj"})
    text = launch.make_executor(opts, tmp_path, "recurvit-x")._executor._make_submission_file_text("CMD", "uid")
    for line in ("--partition=gpu", "--gpus-per-node=2", "--cpus-per-task=8", "--time=60", "--mem=32GB",
                 "--account=proj", "--ntasks-per-node=1", "--job-name=recurvit-x", "--signal=USR2@"):
        assert f"#SBATCH {line}" in text, line
    assert ClusterOptions().gpus == 1 and ClusterOptions(cluster="local").gpus == 0


def test_a_second_command_reattaches_to_queued_or_running_jobs(tmp_path, monkeypatch):
    """jobs.json keeps the ids of submitted jobs; a job Slurm still runs is waited for, not resubmitted."""
    import submitit

    from recurvit.study.launch import JOBS_FILE, _attach, _record

    class FakeSlurmJob:
        running = {"11_0"}

        def __init__(self, folder, job_id):
            self.job_id = job_id

        def done(self):
            return self.job_id not in self.running

    monkeypatch.setattr(submitit, "SlurmJob", FakeSlurmJob)
    _record(tmp_path, {"a": "11_0"})
    _record(tmp_path, {"b": "11_1"})
    assert json.loads((tmp_path / JOBS_FILE).read_text()) == {"a": "11_0", "b": "11_1"}
    todo = [{"out": str(tmp_path / "runs" / r)} for r in ("a", "b", "c")]
    found = _attach(tmp_path, "slurm", todo)
    assert list(found) == [todo[0]["out"]] and found[todo[0]["out"]].job_id == "11_0"
    assert _attach(tmp_path, "local", todo) == {}
