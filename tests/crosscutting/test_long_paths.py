"""A path the file system cannot take, or a message with control characters, is one clean line (issue 57, items
9 and 14): errno 36 (a 300-character folder name) was a traceback in train, export, predict and eval; an ANSI
escape in a path was printed raw to the terminal."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _recurvit(cwd, *args):
    return subprocess.run([sys.executable, "-m", "recurvit", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_an_over_long_path_is_one_line_in_every_command(tmp_path):
    long = str(tmp_path / ("a" * 300))
    for args in (["train", "train.epochs=1", "--out", long], ["eval", long], ["predict", long, long + ".png"],
                 ["train", "train.epochs=1", "data.name=imagefolder", f"data.root={long}"]):
        r = _recurvit(tmp_path, *args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr[-800:])
        assert r.stderr.startswith("error: "), r.stderr


def test_control_characters_in_a_message_are_escaped(tmp_path):
    r = _recurvit(tmp_path, "eval", "x\x1b[31mred")
    assert r.returncode == 2 and "\x1b" not in r.stderr and "\\x1b[31mred" in r.stderr, r.stderr
