"""The test suite stops on Ctrl-C even when the code under test turns KeyboardInterrupt into an exit code
(as `recurvit.cli.main` does), and leaves no process it started behind."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

INNER = '''
import subprocess, sys, time
from pathlib import Path


def swallowing_command():  # what recurvit.cli.main does with Ctrl-C: a message and exit code 130
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        return 130


def test_long_command(tmp_path_factory):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(OUT, "child").write_text(str(child.pid))
    assert swallowing_command() in (0, 130)


def test_after():
    Path(OUT, "after").write_text("ran")
'''


def test_ctrl_c_stops_the_suite_and_ends_its_children(tmp_path):
    shutil.copy(Path(__file__).parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(f"OUT = {str(tmp_path)!r}\n" + INNER)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 60
    while not (tmp_path / "child").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # inside the sleep that swallows the interrupt
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    child = int((tmp_path / "child").read_text())
    time.sleep(0.2)
    assert proc.returncode != 0 and "interrupted" in out, out
    assert not (tmp_path / "after").exists()  # the suite stopped: the next test never ran
    assert not os.path.exists(f"/proc/{child}") or "zombie" in Path(f"/proc/{child}/status").read_text().lower()
