"""A study's worker processes stop with the study: an interrupt of the study process alone (kill -INT PID,
a scheduler's signal) stops its running workers too, instead of leaving it waiting for their runs."""
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
    deadline = time.time() + 10
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
