"""A study's worker processes stop with the study: an interrupt of the study process alone (kill -INT PID,
a scheduler's signal) stops its running workers too, instead of leaving it waiting for their runs."""
import json
import os
import signal
import time
from pathlib import Path

import pytest

from recurvit.study.workers import in_processes


def sleeper(kw):  # module level: a spawned worker imports it
    Path(kw["pidfile"]).write_text(str(os.getpid()))
    time.sleep(120)
    return {"run_id": "x"}


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in status.lower()


def test_an_interrupted_study_stops_its_running_workers(tmp_path):
    pidfile = tmp_path / "pid"

    def ring(signum, frame):
        if not pidfile.exists():  # the worker is still starting (spawn imports torch: slow on a loaded machine)
            signal.alarm(1)
            return
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, ring)
    try:
        signal.alarm(2)  # the interrupt arrives while the worker runs
        with pytest.raises(KeyboardInterrupt):
            list(in_processes(sleeper, [{"pidfile": str(pidfile), "labels": {}, "out": str(tmp_path / "r")}], 1, 1))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    pid = int(pidfile.read_text())
    deadline = time.time() + 30  # generous: slow to die on a loaded machine
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _study(tmp_path):
    (tmp_path / "base.yaml").write_text("model: {name: bvit_tiny, patch_size: 4, embed_dim: 24, num_heads: 2, steps: 2}\n"
                                        "data: {name: digits}\ntrain: {epochs: 1, batch_size: 256}\n")
    (tmp_path / "s.yaml").write_text("name: k\nbase: base.yaml\ngrid:\n  train.seed: [0, 1]\n"
                                     "eval: {max_steps_factor: 1}\nresults: res\n")
    return tmp_path / "s.yaml"


def _study_cli(*args, capsys):
    from recurvit.cli import main

    capsys.readouterr()
    code = main(["study", *map(str, args)])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if "--json" in args and out.out.strip() else out.out), out.err


def test_workers_share_a_study_through_claims_and_the_last_one_writes_the_report(tmp_path, capsys):
    from recurvit.commands.study import study_lock
    from recurvit.run import lock
    from recurvit.study import load_study, runner
    from recurvit.study.registry import registrants

    spec, out = _study(tmp_path), tmp_path / "o"
    runner.claim_path(out / "runs" / "seed=1").parent.mkdir(parents=True)
    claim = lock.acquire(runner.claim_path(out / "runs" / "seed=1"))  # as another worker training seed=1
    try:
        code, res, err = _study_cli(spec, "--out", out, "--json", capsys=capsys)
    finally:
        lock.release(claim)
    assert code == 0, err
    assert [r["run_id"] for r in res["rows"]] == ["seed=0"] and "error" not in res["rows"][0]
    assert [p.name for p in (out / "runs").iterdir()] == ["seed=0"]  # seed=1 left to its holder: not failed,
    # no error.txt, nothing made
    report = out / "results" / "report.md"
    assert "1 of its 2 runs are in" in report.read_text()

    with study_lock(out):  # a worker joins while the study's writer still holds the folder
        code, res, err = _study_cli(spec, "--out", out, "--join", "--json", capsys=capsys)
    assert code == 0 and "writes the report when it ends" in err, err
    assert res["report"] is None and sorted(r["run_id"] for r in res["rows"]) == ["seed=0", "seed=1"]
    assert "1 of its 2 runs are in" in report.read_text()  # the report is the writer's, not rewritten

    code, res, err = _study_cli(spec, "--out", out, "--join", "--json", capsys=capsys)  # no writer: it is one
    assert code == 0 and res["report"] and "1 of its 2 runs" not in report.read_text(), err

    # a run another worker finished after this one listed it is read, not trained or evaluated again
    study = load_study(spec)
    run = study.runs[0]
    rd = out / "runs" / run.run_id
    before = (rd / "last.pt").stat().st_mtime_ns, (rd / "result.json").read_text()
    got = runner.run_one_safe(dict(task=study.task, base=str(run.base), overrides=run.overrides, out=str(rd),
                                   eval_spec=study.eval_for(run.labels), labels=run.labels, previous=None,
                                   imports=registrants()))
    assert got["acc_T"] == json.loads(before[1])["acc_T"]
    assert ((rd / "last.pt").stat().st_mtime_ns, (rd / "result.json").read_text()) == before
